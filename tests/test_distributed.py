"""casebook.distributed: a multi-device task on its ranks (two over gloo here), the slowest rank reported,
a hanging or dying rank contained."""

from __future__ import annotations

import math
from dataclasses import asdict
from pathlib import Path

import pytest

from casebook.bench import Protocol
from casebook.distributed import lockstep, merge
from casebook.isolate import run_isolated
from casebook.measure import Task, work

FIXTURES = Path(__file__).parent / "fixtures" / "kernels"
FAST = asdict(Protocol(warmup_ms=1.0, min_reps=5, max_reps=20, time_cap_s=0.05, cache="warm"))
ROOFS = {"compute_tflops": 1000.0, "bandwidth_gbps": 1000.0, "launch_us": 1e-3, "graph_launch_us": 1e-3}


def task(fn: str, kind: str = "point", **kw) -> Task:
    fields = dict(kind=kind, module="ranked", variant=fn, fn=fn, shape={"n": 1000}, dtype="fp32", level="kernel",
                  device="cpu", timed=True, seed=7, protocol=FAST, roofs=ROOFS, devices=2,
                  inputs="make_inputs")
    return Task(**{**fields, **kw})


def test_lockstep_fixes_the_number_of_calls():
    p = lockstep(FAST, "cpu")
    assert p["min_reps"] == p["max_reps"] == 20 and p["warmup_ms"] == 0 and p["target_ci"] == 0
    assert math.isinf(p["time_cap_s"])


def test_merge_reports_the_slowest_rank_and_every_rank():
    ranks = [{"status": "ran", "times_us": [9.0, 10.0, 11.0]}, {"status": "ran", "times_us": [12.0, 12.0, 30.0]}]
    out = merge(task("honest"), ranks)
    assert out["times_us"] == [12.0, 12.0, 30.0] and out["slowest_rank"] == 1 and out["rank_median_us"] == [10.0, 12.0]


def test_merge_lets_a_failing_rank_decide():
    ranks = [{"status": "ran", "times_us": [10.0]}, {"status": "failed", "error": "relative error 1"}]
    out = merge(task("honest"), ranks)
    assert out["status"] == "failed" and out["error"] == "rank 1: relative error 1"


def _run(tasks, rank_timeout_s: str = "60"):
    env = {"CASEBOOK_KERNELS_PATH": str(FIXTURES), "CASEBOOK_RANK_TIMEOUT_S": rank_timeout_s}
    return run_isolated(work, tasks, timeout_s=240, env=env)


def _judged(t: Task, raw: dict) -> dict:
    from casebook import judge
    from casebook.oracle import OracleTask
    from casebook.oracle import work as oracle_work

    seeds = sorted({c["seed"] for c in raw["calls"]})
    answers = oracle_work(OracleTask(module="ranked", shape=t.shape, dtype=t.dtype, device="cpu", seeds=tuple(seeds),
                                     inputs="make_inputs", traffic="traffic"))
    return judge.point(t, raw, answers)


@pytest.mark.slow
def test_two_ranks_over_gloo_run_alike_and_the_slowest_is_judged(monkeypatch):
    monkeypatch.setenv("CASEBOOK_KERNELS_PATH", str(FIXTURES))
    monkeypatch.setenv("CASEBOOK_DEVICES", "2")  # the reference's side makes both ranks' inputs
    import casebook.kernels

    casebook.kernels.__path__.append(str(FIXTURES))
    t = task("honest")
    (raw,) = _run([t])
    assert raw["status"] == "ran", raw
    assert raw["ranks"] == 2 and len(raw["rank_median_us"]) == 2
    assert len(raw["times_us"]) == 20  # every rank called the collective alike
    point = _judged(t, raw)
    assert point["status"] == "ok" and point["correct"], point


@pytest.mark.slow
def test_the_link_is_measured():
    from casebook.distributed import measure_topology

    topo = measure_topology(2, "cpu", timeout_s=120)
    assert topo["devices"] == 2 and topo["backend"] == "gloo" and topo["link"] == "loopback"
    assert topo["bus_gbps"] > 0


@pytest.mark.slow
def test_a_hanging_rank_is_ended_and_the_next_task_runs():
    hung, after = _run([task("hangs_on_rank1"), task("honest")], rank_timeout_s="20")
    assert hung["status"] == "timeout" and "gave no answer" in hung["error"], hung  # rank 0 waits in the collective
    assert after["status"] == "ran", after  # fresh ranks took the next task


@pytest.mark.slow
def test_a_dying_rank_is_recorded_and_the_others_ended():
    died, after = _run([task("dies_on_rank1"), task("honest")])
    assert died["status"] == "crashed" and "rank 1 died (exit code 3)" in died["error"], died
    assert after["status"] == "ran", after



def test_the_hardware_page_gains_the_interconnect_ceiling():
    from casebook.render.pages import _ceiling_rows

    hw = {"measured": {"copy_gbps": 4000.0}, "datasheet": {"link_gbps": 450},
          "topology": {"devices": 2, "link": "nvlink", "bus_gbps": 380.0}}
    row = next(r for r in _ceiling_rows(hw, [hw]) if r["what"].startswith("interconnect"))
    assert "nvlink, 2 devices" in row["what"] and row["unit"] == "GB/s" and row["ratio"] == "84%"


def test_two_devices_are_another_machine():
    from casebook import hardware

    assert hardware.identify(devices=2)["slug"] == hardware.identify()["slug"] + "-x2"


def test_kernel_devices_and_topology_devices_agree(tmp_path):
    from casebook.load import load_case

    text = (Path(__file__).parent.parent / "cases" / "allreduce_norm.yaml").read_text()
    bad = tmp_path / "allreduce_norm.yaml"
    bad.write_text(text.replace("topology:\n  devices: 2", "topology:\n  devices: 4"))
    with pytest.raises(Exception, match="topology.devices says the kernel spans 4"):
        load_case(bad)
