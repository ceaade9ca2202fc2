"""The one-host pool: devices faked on the CPU (each worker pinned with its own CUDA_VISIBLE_DEVICES), a
worker killed mid-case and its case retried on the other device, a case whose worker always dies
recorded as crashed, results landing whole as each case ends; and `casebook run A B` over two devices."""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path

import pytest

from casebook.result import Result
from casebook.run import pool
from casebook.run.pool import Job, cpu_shares, host_devices, run_pool, worker_env

from conftest import FIXTURES, empty_result

WORK = FIXTURES / "pool"


# --- placing -----------------------------------------------------------------------------------


def test_cores_are_shared_out_contiguously():
    assert cpu_shares(2, [0, 1, 2, 3, 4]) == [(0, 1, 2), (3, 4)]
    assert cpu_shares(4, [0, 1, 2, 3, 4, 5, 6, 7]) == [(0, 1), (2, 3), (4, 5), (6, 7)]
    assert cpu_shares(3, [0, 1]) == [(0,), (1,), (0,)]  # more devices than cores: shared in turn


def test_the_devices_of_a_host(monkeypatch):
    monkeypatch.delenv(pool.FAKE_DEVICES_ENV, raising=False)
    assert host_devices(["2", "5"]) == ["2", "5"]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1,3")
    assert host_devices() == ["1", "3"]
    monkeypatch.setenv(pool.FAKE_DEVICES_ENV, "2")
    assert host_devices() == ["0", "1"]


def test_a_worker_is_pinned_by_nvidia_smis_numbering():
    assert worker_env(("0", "3")) == {"CUDA_VISIBLE_DEVICES": "0,3", "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}
    assert worker_env(("cpu",)) == {}


def test_a_retry_avoids_the_device_it_died_on_where_there_is_another():
    assert pool._pick(["0", "1"], ["0", "1"], 1, {"0"}) == ("1",)
    assert pool._pick(["0"], ["0", "1"], 1, {"0"}) is None  # waits for device 1
    assert pool._pick(["0"], ["0"], 1, {"0"}) == ("0",)  # a one-device pool: the same device again
    assert pool._pick(["0", "1", "2"], ["0", "1", "2"], 2, {"0"}) == ("1", "2")


def test_a_case_needing_more_devices_than_the_pool_is_not_placed():
    done = []
    [o] = run_pool([Job(Path("allreduce.yaml"), devices=4)], ["0", "1"], _work("where"), {},
                   on_event=lambda kind, info: done.append(info["outcome"]) if kind == "done" else None)
    assert o.status == "unplaced" and "needs 4 devices together; the pool has 2" in o.error and done == [o]


# --- workers (child processes) -------------------------------------------------------------------


def _work(name: str):
    import sys

    if str(WORK) not in sys.path:
        sys.path.insert(0, str(WORK))  # the spawned workers get this sys.path, and import pool_work by name
    import pool_work

    return getattr(pool_work, name)


@pytest.mark.slow
def test_two_cases_run_side_by_side_each_on_its_own_device_and_cores():
    events = []
    outcomes = run_pool([Job(Path("a.yaml")), Job(Path("b.yaml"))], ["0", "1"], _work("where"),
                        {"sleep_s": {"a.yaml": 0.5, "b.yaml": 0.5}}, on_event=lambda k, i: events.append((k, i)))
    assert [o.status for o in outcomes] == ["ok", "ok"]
    seen = {o.doc["case"]: o.doc for o in outcomes}
    assert {seen["a.yaml"]["cuda_visible_devices"], seen["b.yaml"]["cuda_visible_devices"]} == {"0", "1"}
    assert not set(seen["a.yaml"]["cpus"]) & set(seen["b.yaml"]["cpus"]) or len(os.sched_getaffinity(0)) < 2
    kinds = [k for k, _ in events if k in ("start", "done")]
    assert kinds[:2] == ["start", "start"], kinds  # both started before either ended
    assert any(k == "progress" and i["event"] == "plan" for k, i in events)


@pytest.mark.slow
def test_a_worker_killed_mid_case_loses_only_its_case_which_is_retried_on_the_other_device():
    killed = []

    def on_event(kind, info):
        if kind == "start" and info["case"].name == "b.yaml" and not killed:
            killed.append(info)
        if kind == "progress" and info["case"].name == "b.yaml" and len(killed) == 1:
            os.kill(killed[0]["pid"], signal.SIGKILL)  # mid-case: it has begun, it sleeps
            killed.append("done")

    a, b = run_pool([Job(Path("a.yaml")), Job(Path("b.yaml"))], ["0", "1"], _work("where"),
                    {"sleep_s": {"a.yaml": 3.0, "b.yaml": 1.0}}, on_event=on_event)
    assert a.status == "ok" and a.attempts[0]["status"] == "ok" and len(a.attempts) == 1
    assert b.status == "ok", b
    first, second = b.attempts
    assert first["status"] == "crashed" and "worker died" in first["error"]
    assert second["status"] == "ok" and second["devices"] != first["devices"]
    assert b.doc["cuda_visible_devices"] == second["devices"][0]


@pytest.mark.slow
def test_a_case_whose_worker_always_dies_is_tried_once_more_then_recorded_as_crashed():
    retries = []
    [o] = run_pool([Job(Path("a.yaml"))], ["0", "1"], _work("always_dies"), {},
                   on_event=lambda k, i: retries.append(i) if k == "retry" else None)
    assert o.status == "crashed" and o.doc is None and len(retries) == 1
    assert [a["status"] for a in o.attempts] == ["crashed", "crashed"]
    assert o.attempts[0]["devices"] != o.attempts[1]["devices"]
    assert "exit code 3" in o.error


@pytest.mark.slow
def test_a_run_that_raises_is_recorded_not_retried():
    [o] = run_pool([Job(Path("a.yaml"))], ["0", "1"], _work("raises"), {})
    assert o.status == "error" and len(o.attempts) == 1 and "the case's run raised" in o.error


@pytest.mark.slow
def test_the_next_case_of_a_busy_device_starts_early_and_waits_at_its_gate_until_the_device_is_free():
    events = []
    a, b = run_pool([Job(Path("a.yaml")), Job(Path("b.yaml"))], ["0"], _work("where"),
                    {"sleep_s": {"a.yaml": 2.0}}, on_event=lambda k, i: events.append((k, i)), prestart=True)
    assert a.status == b.status == "ok"
    assert b.doc["began"] < a.doc["ended"]  # its worker started while a ran
    assert b.doc["through_gate"] > a.doc["ended"]  # and measured only once a had ended
    order = [(k, i["case"].name if k == "start" else i["outcome"].job.case.name) for k, i in events
             if k in ("start", "done")]
    assert order == [("start", "a.yaml"), ("done", "a.yaml"), ("start", "b.yaml"), ("done", "b.yaml")]
    assert b.seconds < b.doc["ended"] - b.doc["began"]  # a case's time runs from its start, not its prestart


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
@pytest.mark.slow
def test_a_prestarted_case_is_the_run_s_own_to_the_case_it_waits_for_and_a_stranger_to_other_devices():
    """Its start (imports, the device's context) goes on beside the other case's timings, as the next variant's
    child's does: counted as the run's CPU time, not another tenant's, and its processes are not others on the GPU
    (`interference.run_roots`); the case on the other device is neither."""
    a, b, c = run_pool([Job(Path("a.yaml")), Job(Path("b.yaml")), Job(Path("c.yaml"))], ["0", "1"], _work("where"),
                       {"sleep_s": {"a.yaml": 2.0, "b.yaml": 2.0}}, prestart=True)
    assert c.devices == a.devices != b.devices and c.doc["began"] < a.doc["ended"]
    assert c.doc["pid"] in a.doc["roots"]
    assert not {a.doc["pid"], c.doc["pid"]} & set(b.doc["roots"])


@pytest.mark.slow
def test_without_prestart_the_next_case_starts_once_the_device_is_free():
    a, b = run_pool([Job(Path("a.yaml")), Job(Path("b.yaml"))], ["0"], _work("where"), {"sleep_s": {"a.yaml": 1.0}})
    assert b.doc["began"] > a.doc["ended"]


@pytest.mark.slow
def test_a_prestarted_worker_that_dies_at_its_gate_leaves_the_device_to_the_case_running_there():
    a, b, c = run_pool([Job(Path("a.yaml")), Job(Path("b.yaml")), Job(Path("c.yaml"))], ["0"], _work("where"),
                       {"sleep_s": {"a.yaml": 2.0}, "die_at_gate": ["b.yaml"]}, prestart=True)
    assert a.status == "ok" and c.status == "ok"
    assert b.status == "crashed" and [t["status"] for t in b.attempts] == ["crashed", "crashed"]
    assert c.doc["through_gate"] > a.doc["ended"]  # device 0 was never handed to two cases at once


@pytest.mark.slow
def test_a_case_that_fails_at_its_gate_never_held_the_device_it_waited_for():
    """Its end names no device, so the board does not mark the running case's device idle."""
    a, b = run_pool([Job(Path("a.yaml")), Job(Path("b.yaml"))], ["0"], _work("where"),
                    {"sleep_s": {"a.yaml": 2.0}, "raise_at_gate": ["b.yaml"]}, prestart=True)
    assert a.status == "ok" and a.devices == ("0",)
    assert b.status == "error" and "raised at its gate" in b.error
    assert b.devices == () and b.where == "at its gate, before device 0"


# --- real cases --------------------------------------------------------------------------------


@pytest.mark.slow
def test_cpu_cases_over_two_fake_devices_land_whole_as_each_ends_and_a_killed_one_is_retried(small_book):
    from casebook import results
    from casebook.commands.run_many import measure_case

    landed, killed = [], []
    out = small_book / "results"

    def on_event(kind, info):
        if kind == "start" and info["case"].stem == "scaled_add_b" and not killed:
            killed.append(info["pid"])
        elif (kind == "progress" and info["event"] == "task" and info["case"].stem == "scaled_add_b"
              and len(killed) == 1):
            os.kill(killed[0], signal.SIGKILL)  # mid-case: its first variant has a task done
            killed.append("killed")
        elif kind == "done":
            o = info["outcome"]
            landed.append((o.job.case.stem, sorted(p.name for p in out.rglob("*"))))
            assert json.loads(json.dumps(o.doc)) == o.doc, "the run crosses the pipe as plain JSON data"
            results.save(Result.model_validate(o.doc), out)  # the caller writes, atomically, as each case ends

    args = {"variants": None, "quick": True, "counters": False, "timeout": 300.0, "flags": ["--quick"]}
    jobs = [Job(Path("cases/scaled_add.yaml")), Job(Path("cases/scaled_add_b.yaml"))]
    a, b = run_pool(jobs, ["0", "1"], measure_case, args, on_event=on_event)
    assert killed == [killed[0], "killed"]
    assert a.status == b.status == "ok" and [x["status"] for x in b.attempts] == ["crashed", "ok"]
    assert b.attempts[0]["devices"] != b.attempts[1]["devices"]
    # the first to end was written before the second ended: nothing of it was there when it ended
    assert landed[0][1] == [] and f"{landed[0][0]}.json" in landed[1][1]
    files = sorted(p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file())
    slug = a.doc["hardware"]["slug"]
    assert files == [f"{slug}/scaled_add.json", f"{slug}/scaled_add_b.json"]  # no temp file, no checkpoint
    for o in (a, b):
        stored = results.load(out / slug / f"{o.job.case.stem}.json")
        assert stored.environment.device.cuda_visible_devices == o.devices[0]
        assert stored.argv == ["casebook", "run", o.job.case.as_posix(), "--quick"]
        assert all(p.status in ("ok", "checked") for p in stored.kernel_level), stored.kernel_level


@pytest.mark.slow
def test_run_two_cases_over_two_devices_from_the_command_line(small_book, cli):
    r = cli("run", "cases/scaled_add.yaml", "cases/scaled_add_b.yaml", "--devices", "0,1", "--quick", "--save",
            "--results", small_book / "results", "--json")
    assert r.exit_code in (0, 1), r.output  # 1 only where a claim or point failed; the run itself ran
    rows = json.loads(r.stdout[r.stdout.index("["):r.stdout.rindex("]") + 1])
    assert [row["status"] for row in rows] == ["ok", "ok"] and all(row["stored"] for row in rows), rows
    assert sorted(d for row in rows for d in row["devices"]) == ["0", "1"]
    stored = sorted((small_book / "results").glob("*/*.json"))
    assert [p.name for p in stored] == ["scaled_add.json", "scaled_add_b.json"]


@pytest.mark.slow
def test_the_book_refreshed_over_jobs_measures_only_what_is_not_current(small_book, cli):
    """`casebook run --all --save --resume`, the same command in each job of a time-limited machine: a case whose
    stored result is current here is left alone, said so; a case changed since its result is measured again."""
    args = ("run", "--all", "--devices", "0,1", "--quick", "--save", "--results", small_book / "results", "--resume")
    first = cli(*args)
    assert first.exit_code in (0, 1), first.output
    slug = next((small_book / "results").iterdir()).name
    for case in ("scaled_add", "scaled_add_b"):  # each case's verdicts as it lands, not only at the end
        assert f"{case} on {slug}: claims" in first.stdout, first.stdout
    stored = sorted(p.name for p in (small_book / "results").glob("*/*.json"))
    assert stored == ["scaled_add.json", "scaled_add_b.json"]
    runs = sorted((small_book / "cache" / "runs").rglob("*.json"))
    again = cli(*args)
    assert again.exit_code == 0, again.output
    assert again.output.count("current (") == 2 and "nothing to measure" in again.output
    assert sorted((small_book / "cache" / "runs").rglob("*.json")) == runs, "nothing measured"
    case_b = small_book / "cases" / "scaled_add_b.yaml"
    case_b.write_text(case_b.read_text().replace("dtypes: [bf16, fp32]", "dtypes: [fp32]", 1))  # its levels changed
    third = cli(*args, "--json")
    assert "scaled_add.yaml: current (" in third.output and "scaled_add_b.yaml: current" not in third.output
    rows = json.loads(third.stdout[third.stdout.index("["):third.stdout.rindex("]") + 1])
    assert [Path(row["case"]).stem for row in rows] == ["scaled_add_b"] and rows[0]["stored"], rows


def test_each_case_of_many_goes_on_from_its_run_cut_short_where_resumed(monkeypatch, tmp_path):
    """`measure_case` with `resume`: the case's last run cut short on this host is handed to the run."""
    from casebook.commands import run as run_cmd
    from casebook.commands import run_many

    from conftest import SOFTMAX

    seen = {}
    cut = object()
    monkeypatch.setattr(run_cmd, "last_cut_short", lambda case: (tmp_path / "x.json.partial", cut))
    monkeypatch.setattr(run_cmd, "measure", lambda case, **kw: seen.update(kw) or None)
    monkeypatch.setattr(run_many, "document", lambda result: {}, raising=False)
    args = {"variants": None, "quick": True, "counters": False, "timeout": 1.0, "flags": []}
    for resume, want in ((True, cut), (False, None)):
        seen.clear()
        try:
            run_many.measure_case(SOFTMAX, {**args, "resume": resume}, progress=None)
        except Exception:  # the stubbed run returns no result to document
            pass
        assert seen["resume"] is want


def test_run_refuses_a_case_that_does_not_load_before_running_any(small_book, cli):
    bad = small_book / "cases" / "scaled_add_b.yaml"
    bad.write_text(bad.read_text().replace("kind: bandwidth", "kind: sideways"))
    r = cli("run", "--all", "--devices", "0,1")
    assert r.exit_code == 2
    assert "scaled_add_b.yaml:" in r.output and "bottleneck.kind" in r.output
    assert not (small_book / "cache" / "runs").exists()


def _doc(slug: str, kind: str, uuid: str | None, copy: float) -> Result:
    doc = empty_result(slug, measured={"copy_gbps": copy, "matmul_tflops": {"bf16": 800}, "launch_us": 5.0,
                                       "graph_launch_us": 2.0})
    doc["hardware"]["kind"] = kind
    doc["environment"]["device"] = {"uuid": uuid}
    return Result.model_validate(doc)


def test_two_gpus_are_one_machine_to_the_site_only_where_their_ceilings_agree():
    from casebook.commands.run_many import ceilings_agreement

    agree = ceilings_agreement([_doc("nvidia-h200", "gpu", "GPU-a", 4000), _doc("nvidia-h200", "gpu", "GPU-b", 3900),
                                _doc("nvidia-h200", "gpu", "GPU-a", 4000)])
    assert agree == ["nvidia-h200: the ceilings of its 2 devices agree: one machine to the site"]
    [apart] = ceilings_agreement([_doc("nvidia-h200", "gpu", "GPU-a", 4000), _doc("nvidia-h200", "gpu", "GPU-c", 2500)])
    assert "device GPU-c's ceilings are apart from GPU-a's (copy 4e+03 vs 2.5e+03 GB/s)" in apart
    assert "two machines" in apart
    assert ceilings_agreement([_doc("cpu-x", "cpu", None, 20), _doc("cpu-x", "cpu", None, 9)]) == []

