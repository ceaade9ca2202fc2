"""casebook.run.interference: readings around a timing, and the GPU's state through nvidia-smi."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from casebook.run import interference


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_a_window_reads_the_others_cpu_and_this_threads_wait():
    window = interference.Window()
    end = time.perf_counter() + 0.2
    while time.perf_counter() < end:  # this process's own CPU: not counted as the others'
        pass
    r = window.close()
    assert r["window_s"] >= 0.2 and r["cpus"] == (os.cpu_count() or 1)
    assert 0 <= r["other_cpu_s"] <= r["cpus"] * r["window_s"] + 0.05
    assert 0 <= r["run_queue_wait_s"] <= r["window_s"]
    assert len(r["load_average"]) == 3


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_a_burner_beside_the_window_is_counted():
    burner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        time.sleep(0.3)
        window = interference.Window()
        time.sleep(0.5)  # idle here: whatever CPU is busy is the others'
        r = window.close()
    finally:
        burner.kill()
        burner.wait()
    assert r["other_cpu_s"] / r["window_s"] > 0.5, r


FAKE_SMI = """#!/bin/sh
case "$*" in
  *query-gpu*) echo "1980, 3201" ;;
  *query-compute-apps*) echo "{me}"; echo "4242" ;;
esac
"""


def test_gpu_state_from_nvidia_smi_leaves_out_this_process(tmp_path, monkeypatch):
    smi = tmp_path / "nvidia-smi"
    smi.write_text(FAKE_SMI.format(me=os.getpid()))
    smi.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setattr(interference, "_nvml_state", lambda index: None)
    assert interference.gpu_state() == {"sm_clock_mhz": 1980.0, "mem_clock_mhz": 3201.0, "other_processes": [4242]}


def test_gpu_state_leaves_out_the_runs_other_workers_not_a_stranger(tmp_path, monkeypatch):
    import subprocess
    import sys

    sibling = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])  # the reference's child
    try:
        smi = tmp_path / "nvidia-smi"
        smi.write_text(FAKE_SMI.format(me=sibling.pid))
        smi.chmod(0o755)
        env = {**os.environ, "PATH": f"{tmp_path}{os.pathsep}{os.environ['PATH']}"}
        probe = ("from casebook.run import interference; interference._nvml_state = lambda index: None; "
                 "print(interference.gpu_state()['other_processes'])")
        seen = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=60)
    finally:
        sibling.kill()
        sibling.wait()
    assert seen.stdout.strip() == "[4242]", seen.stderr


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_gpu_state_leaves_out_a_prestarted_cases_processes_on_these_devices(tmp_path, monkeypatch):
    """A pool's worker on these devices (`slot_workers`) holds the device's context in its children (the
    reference's child, its first variant's): they are the run's, down its whole tree."""
    worker = _burner(child=True)  # a worker whose child holds the context (and burns; only the tree matters)
    try:
        time.sleep(0.3)
        [grandchild] = interference.tree_pids([worker.pid]) - {worker.pid}
        smi = tmp_path / "nvidia-smi"
        smi.write_text(FAKE_SMI.format(me=grandchild))
        smi.chmod(0o755)
        monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
        monkeypatch.setattr(interference, "_nvml_state", lambda index: None)
        assert interference.gpu_state()["other_processes"] == sorted([grandchild, 4242])  # a stranger's, before
        monkeypatch.setattr(interference, "slot_workers", lambda: [worker.pid])
        assert interference.gpu_state()["other_processes"] == [4242]
    finally:
        _end(worker)


def test_gpu_state_is_none_without_a_gpu(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setattr(interference, "_nvml_state", lambda index: None)
    assert interference.gpu_state() is None


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_busy_time_is_read_on_the_cores_this_process_may_use(monkeypatch):
    """A pool's worker pinned to its share of the cores judges those, not its neighbours'."""
    allowed = sorted(os.sched_getaffinity(0))
    assert interference.busy_ticks()[1] == len(allowed)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {allowed[0]})
    ticks, cpus = interference.busy_ticks()
    line = next(x for x in open("/proc/stat") if x.startswith(f"cpu{allowed[0]} "))
    user, nice, system, _, _, irq, softirq, steal = (int(v) for v in line.split()[1:9])
    assert cpus == 1 and abs(ticks - (user + nice + system + irq + softirq + steal)) <= 5


# --- a run of several processes: the sibling ranks are the run's own, anything else is the others' ---------


def _burner(*, child: bool = False) -> subprocess.Popen:
    """A process burning a core in a session of its own; with `child`, through a child of its own (a rank's
    worker), so that only the grandchild burns."""
    burn = "while True: pass"
    code = f"import subprocess, sys; subprocess.run([sys.executable, '-c', {burn!r}])" if child else burn
    return subprocess.Popen([sys.executable, "-c", code], start_new_session=True)


def _end(p: subprocess.Popen) -> None:
    os.killpg(p.pid, 9)
    p.wait()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_a_process_trees_cpu_includes_its_live_descendants():
    parent = _burner(child=True)
    try:
        time.sleep(0.3)
        start = interference.tree_cpu_s([parent.pid])
        time.sleep(0.5)
        burnt = interference.tree_cpu_s([parent.pid]) - start
    finally:
        _end(parent)
    assert burnt > 0.2, burnt  # the grandchild's CPU, not the idle parent's
    assert interference.tree_cpu_s([os.getpid()]) == 0.0  # this process is `own_cpu_s`'s, never counted twice


def _windows_beside(run: list[subprocess.Popen], others: list[subprocess.Popen] = ()) -> tuple[dict, dict]:
    """Two windows over the same 0.5 s of idling here: one as a single process reads it, one counting `run`'s
    processes as this run's own (what else runs on the machine is in both alike); every process ended."""
    try:
        time.sleep(0.3)
        alone = interference.Window()
        interference.count_as_own([p.pid for p in run] + [os.getpid()])
        assert interference._run_processes == tuple(sorted(p.pid for p in run))  # this process: never twice
        window = interference.Window()
        time.sleep(0.5)
        return alone.close(), window.close()
    finally:
        for p in [*run, *others]:
            _end(p)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_the_runs_own_processes_are_not_the_others(monkeypatch):
    monkeypatch.setattr(interference, "_run_processes", ())
    alone, r = _windows_beside([_burner(child=True)])  # a sibling rank whose worker burns a core
    assert "run_cpu_s" not in alone
    assert r["run_cpu_s"] / r["window_s"] > 0.15, r  # seen, and counted as the run's ...
    # ... not others': the first window opened a moment earlier (longer on a loaded machine), when the burner
    # could burn at most one core's worth more
    gap = max(0.0, alone["window_s"] - r["window_s"])
    assert alone["other_cpu_s"] - r["other_cpu_s"] == pytest.approx(r["run_cpu_s"], abs=0.03 + gap), (alone, r)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_a_foreign_burner_is_counted_beside_the_runs_processes(monkeypatch):
    monkeypatch.setattr(interference, "_run_processes", ())
    idle = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)
    _, r = _windows_beside([idle], [_burner()])
    assert r["other_cpu_s"] / r["window_s"] > 0.5, r
    assert r["run_cpu_s"] < 0.05, r


def _readings(monkeypatch, run: tuple[int, ...]) -> dict:
    """A window on readings given: 1.0 s busy over it, 0.25 s of it this process's, 0.5 s the run's others'."""
    given = {"busy": iter([(1000, 2), (1100, 2)]), "own": iter([10.0, 10.25]), "tree": iter([3.0, 3.5])}
    monkeypatch.setattr(interference, "CLOCK_TICKS", 100)
    monkeypatch.setattr(interference, "busy_ticks", lambda: next(given["busy"]))
    monkeypatch.setattr(interference, "own_cpu_s", lambda: next(given["own"]))
    monkeypatch.setattr(interference, "tree_cpu_s", lambda roots: next(given["tree"]) if run else pytest.fail(
        "no run processes to read"))
    monkeypatch.setattr(interference, "_run_processes", run)
    return interference.Window().close()


def test_other_cpu_is_the_busy_time_less_this_process_and_the_run(monkeypatch):
    r = _readings(monkeypatch, (4242,))
    assert r["run_cpu_s"] == pytest.approx(0.5) and r["other_cpu_s"] == pytest.approx(0.25) and r["cpus"] == 2


def test_a_single_process_window_reads_as_before(monkeypatch):
    r = _readings(monkeypatch, ())
    assert r["other_cpu_s"] == pytest.approx(0.75) and "run_cpu_s" not in r


def test_a_run_says_how_it_reads_the_gpu(monkeypatch):
    """NVML where nvidia-ml-py is installed; else nvidia-smi, with what it costs and the package that avoids it."""
    monkeypatch.setattr(interference, "_nvml", lambda: object())
    assert interference.gpu_reader() == "NVML"
    monkeypatch.setattr(interference, "_nvml", lambda: None)
    assert "nvidia-smi" in interference.gpu_reader() and "nvidia-ml-py" in interference.gpu_reader()
