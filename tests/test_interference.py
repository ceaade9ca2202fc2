"""casebook.interference: readings around a timing, and the GPU's state through nvidia-smi."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from casebook import interference


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
        probe = ("from casebook import interference; interference._nvml_state = lambda index: None; "
                 "print(interference.gpu_state()['other_processes'])")
        seen = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=60)
    finally:
        sibling.kill()
        sibling.wait()
    assert seen.stdout.strip() == "[4242]", seen.stderr


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
