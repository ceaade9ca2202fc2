"""casebook.run.distributed: a multi-device task on its ranks (two over gloo here), the slowest rank reported,
a hanging or dying rank contained."""

from __future__ import annotations

import math
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from casebook.result import Ceilings, Interference, Point
from casebook.roofline import Roofs
from casebook.run.bench import Protocol
from casebook.run.child import Task, work
from casebook.run.distributed import lockstep, merge
from casebook.run.isolate import run_isolated

FIXTURES = Path(__file__).parents[1] / "fixtures" / "kernels"
FAST = Protocol(warmup_ms=1.0, min_reps=5, max_reps=20, time_cap_s=0.05, cache="warm")
ROOFS = Roofs(compute_tflops=1000.0, bandwidth_gbps=1000.0, launch_us=1e-3, graph_launch_us=1e-3)


def task(fn: str, **kw) -> Task:
    fields = dict(module="ranked", variant=fn, fn=fn, shape={"n": 1000}, dtype="fp32", level="kernel",
                  device="cpu", timed=True, seed=7, protocol=FAST, roofs=ROOFS, devices=2,
                  inputs="make_inputs")
    return Task(**{**fields, **kw})


def test_lockstep_fixes_the_number_of_calls():
    p = lockstep(FAST, "cpu")
    assert p.min_reps == p.max_reps == 20 and p.warmup_ms == 0 and p.target_ci == 0
    assert math.isinf(p.time_cap_s) and p.rank_barrier and p.cache == FAST.cache


def test_merge_reports_the_slowest_rank_and_every_rank():
    ranks = [{"status": "ran", "times_us": [9.0, 10.0, 11.0]}, {"status": "ran", "times_us": [12.0, 12.0, 30.0]}]
    out = merge(task("honest"), ranks)
    assert out["times_us"] == [12.0, 12.0, 30.0] and out["slowest_rank"] == 1 and out["rank_median_us"] == [10.0, 12.0]


def test_merge_sends_every_ranks_repetitions_and_reading():
    ranks = [{"status": "ran", "times_us": [9.0, 10.0], "interference": {"window_s": 1.0, "other_cpu_s": 0.0}},
             {"status": "ran", "times_us": [12.0, 13.0], "interference": {"window_s": 1.0, "other_cpu_s": 0.9}}]
    out = merge(task("honest"), ranks)
    assert out["rank_times_us"] == [[9.0, 10.0], [12.0, 13.0]]
    assert [r["other_cpu_s"] for r in out["rank_interference"]] == [0.0, 0.9]


def test_the_parent_takes_the_slowest_rank_again_from_the_repetitions():
    from casebook.result import Interference
    from casebook.run.judge import ranks_problem, slowest_rank
    from casebook.run.messages import PointRun, read

    run = read(PointRun, {"status": "ran", "times_us": [1.0], "slowest_rank": 0,  # what a child may claim
                          "rank_median_us": [1.0, 1.0], "rank_times_us": [[9.0, 10.0, 11.0], [20.0, 30.0, 40.0]],
                          "rank_interference": [{"cpus": 1}, {"cpus": 2}]})
    times, ranked = slowest_rank(run)
    assert times == [20.0, 30.0, 40.0] and ranked["slowest_rank"] == 1 and ranked["ranks"] == 2
    assert ranked["rank_median_us"] == [10.0, 30.0] and ranked["interference"] == Interference(cpus=2)
    assert ranks_problem([[1.0], [-1.0]]) == "rank 1: a repetition's time is not a finite positive number"
    assert ranks_problem([]) == "no rank's repetitions"


def test_a_stored_median_that_is_not_the_slowest_ranks_is_refused():
    from casebook.evidence import point_problems

    p = Point(variant="v", shape={"n": 1}, dtype="fp32", status="ok", median_us=10.0, p10_us=9.0, p90_us=11.0,
              flops=1.0, bytes=1.0, rank_median_us=[10.0, 14.0])
    measured = Ceilings(copy_gbps=10.0, matmul_tflops={"fp32": 1.0}, launch_us=1e-3, graph_launch_us=1e-3)
    assert "is not the slowest of its ranks' medians" in point_problems(p, measured)[0]
    assert point_problems(p.model_copy(update={"rank_median_us": [10.0, 7.0]}), measured) == []


def test_every_ranks_reading_is_judged():
    from casebook.stability import reasons

    quiet = Interference(window_s=1.0, other_cpu_s=0.0, cpus=2)
    busy = Interference(window_s=1.0, other_cpu_s=0.9, cpus=2)
    point = Point(variant="v", shape={"n": 1}, dtype="fp32", status="ok", interference=quiet,
                  rank_interference=[quiet, busy])
    assert reasons(point, "cpu") == ["rank 1: other processes used 0.88 cores over the 1.00 s timing (at most 0.5)"]
    assert reasons(point.model_copy(update={"rank_interference": [quiet, quiet]}), "cpu") == []


def test_merge_lets_a_failing_rank_decide():
    ranks = [{"status": "ran", "times_us": [10.0]}, {"status": "failed", "error": "relative error 1"}]
    out = merge(task("honest"), ranks)
    assert out["status"] == "failed" and out["error"] == "rank 1: relative error 1"


def _run(tasks, rank_timeout_s: str = "60"):
    env = {"CASEBOOK_KERNELS_PATH": str(FIXTURES), "CASEBOOK_RANK_TIMEOUT_S": rank_timeout_s}
    return run_isolated(work, tasks, timeout_s=240, env=env)


def _ranked_here(monkeypatch) -> None:
    """The fixture kernel importable in this process too (the reference's side, `_judged`), which makes both
    ranks' inputs."""
    import casebook.kernels

    monkeypatch.setenv("CASEBOOK_KERNELS_PATH", str(FIXTURES))
    monkeypatch.setenv("CASEBOOK_DEVICES", "2")
    monkeypatch.setattr(casebook.kernels, "__path__", [*casebook.kernels.__path__, str(FIXTURES)])


def _judged(t: Task, raw: dict) -> Point:
    from casebook.run import judge
    from casebook.run.messages import Answer, PointRun, read
    from casebook.run.oracle import OracleTask
    from casebook.run.oracle import work as oracle_work

    seeds = sorted({c["seed"] for calls in raw["rank_calls"] for c in calls})
    answers = oracle_work(OracleTask(module="ranked", shape=t.shape, dtype=t.dtype, device="cpu", seeds=tuple(seeds),
                                     inputs="make_inputs", traffic="traffic"))
    return judge.point(t, read(PointRun, raw), read(Answer, answers))


@pytest.mark.slow
def test_two_ranks_over_gloo_run_alike_and_the_slowest_is_judged(monkeypatch):
    _ranked_here(monkeypatch)
    t = task("honest")
    (raw,) = _run([t])
    assert raw["status"] == "ran", raw
    assert raw["ranks"] == 2 and len(raw["rank_median_us"]) == 2
    assert len(raw["times_us"]) == 20  # every rank called the collective alike
    point = _judged(t, raw)
    assert point.status == "ok" and point.correct, point.error
    assert point.ranks == 2 and point.median_us == max(point.rank_median_us)  # the slowest rank's
    assert point.rank_median_us[point.slowest_rank] == point.median_us
    assert len(point.rank_interference) == 2


@pytest.mark.slow
def test_every_ranks_outputs_are_checked_not_the_slowest_alone(monkeypatch):
    _ranked_here(monkeypatch)
    t = task("wrong_on_rank1")
    (raw,) = _run([t])
    assert raw["status"] == "ran" and raw["slowest_rank"] == 0, raw.get("rank_median_us")  # the right one
    point = _judged(t, raw)
    assert point.status == "failed" and point.error.startswith("rank 1: seed"), point


@pytest.mark.slow
def test_a_sibling_ranks_cpu_is_the_runs_not_a_busy_machine(monkeypatch):
    """Rank 1 computes while rank 0 waits in the collective: rank 0's reading sees rank 1's CPU and counts it
    as the run's own (the ranks are told the run's process ids)."""
    monkeypatch.setenv("CASEBOOK_DEVICES", "2")
    t = task("busy_on_rank1")
    (raw,) = _run([t])
    assert raw["status"] == "ran", raw
    rank0 = raw["rank_interference"][0]
    assert rank0["run_cpu_s"] / rank0["window_s"] > 0.3, rank0  # the sibling's 20 ms a call, seen as the run's
    # (that what is counted as the run's is left out of other_cpu_s: tests/run/test_interference.py)


@pytest.mark.slow
def test_a_foreign_burner_beside_two_ranks_is_a_busy_machine(monkeypatch):
    from casebook.stability import reasons

    _ranked_here(monkeypatch)
    burners = [subprocess.Popen([sys.executable, "-c", "while True: pass"], start_new_session=True)
               for _ in range(2 * len(os.sched_getaffinity(0)))]  # two a CPU the ranks may use: most of it theirs
    try:
        t = task("honest", shape={"n": 1_000_000})  # 4 MB a rank: a window of tenths of a second, judged
        (raw,) = _run([t])
    finally:
        for b in burners:
            b.kill()
            b.wait()
    assert raw["status"] == "ran", raw
    point = _judged(t, raw)
    assert any("other processes used" in r for r in reasons(point, "cpu")), point.rank_interference


@pytest.mark.slow
def test_the_link_is_measured():
    from casebook.run.rank import measure_topology

    topo = measure_topology(2, "cpu", timeout_s=120)
    assert topo.devices == 2 and topo.backend == "gloo" and topo.link == "loopback"
    assert topo.bus_gbps > 0 and topo.error is None


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
    from casebook.result import Hardware

    hw = Hardware.model_validate(
        {"slug": "gpu-x2", "name": "GPU", "kind": "gpu",
         "measured": {"copy_gbps": 4000.0, "matmul_tflops": {}, "launch_us": 5.0, "graph_launch_us": 2.0},
         "datasheet": {"name": "GPU", "match": ["GPU"], "link_gbps": 450},
         "topology": {"devices": 2, "link": "nvlink", "bus_gbps": 380.0}})
    row = next(r for r in _ceiling_rows(hw, [hw]) if r["what"].startswith("interconnect"))
    assert "nvlink, 2 devices" in row["what"] and row["unit"] == "GB/s" and row["ratio"] == "84%"


def test_two_devices_are_another_machine():
    from casebook.run import hardware

    assert hardware.identify(devices=2).slug == hardware.identify().slug + "-x2"


def test_kernel_devices_and_topology_devices_agree(tmp_path):
    from casebook.load import load_case

    text = (Path(__file__).parents[2] / "cases" / "allreduce_norm.yaml").read_text()
    bad = tmp_path / "allreduce_norm.yaml"
    bad.write_text(text.replace("topology:\n  devices: 2", "topology:\n  devices: 4"))
    with pytest.raises(Exception, match="topology.devices says the kernel spans 4"):
        load_case(bad)


def test_the_traffic_model_names_its_link_bytes(monkeypatch):
    import torch

    from casebook.kernels.allreduce_norm import traffic

    monkeypatch.setenv("CASEBOOK_DEVICES", "2")  # outside a process group, the case's ranks
    t = traffic({"tokens": 4, "hidden": 1024}, torch.bfloat16).as_dict()
    message = 4 * 1024 * 2
    assert t["link_bytes"] == pytest.approx(message)  # 2(n-1)/n of the message at n = 2
    assert [term["name"] for term in t["terms"] if term.get("link")] == [
        "all-reduce bus bytes, 2(n-1)/n of the message (over the link)"]


def test_a_ranked_point_is_placed_against_the_link_and_placed_again_on_load():
    from casebook.evidence import point_problems
    from casebook.run import judge
    from casebook.run.messages import PointRun, TrafficModel

    roofs = replace(ROOFS, bandwidth_gbps=1e6, link_gbps=1.0)  # memory far faster than the link
    t = task("honest", roofs=roofs)
    traffic = TrafficModel(flops=1e3, bytes=4e3 + 1e3, link_bytes=1e3, terms=[])
    run = PointRun(status="ran", times_us=[2.0, 2.0, 2.0], rank_times_us=[[2.0, 2.0, 2.0], [1.5, 1.5, 1.5]])
    times, ranked = judge.slowest_rank(run)
    p = judge.place_point(t, run, times, ranked, traffic, {"variant": "honest", "shape": t.shape, "dtype": "fp32"})
    assert p.status == "ok" and p.link_floor_us == pytest.approx(1.0) == p.floor_us
    assert p.link_roof_gbps == 1.0 and p.bus_gbps == pytest.approx(0.5) and p.roof_fraction == 0.5
    measured = Ceilings(copy_gbps=1e6, matmul_tflops={"fp32": 1000.0}, launch_us=1e-3, graph_launch_us=1e-3)
    assert point_problems(p, measured, link_gbps=1.0) == []
    assert "link_roof_gbps 1 is not the result's measured link" in point_problems(p, measured, 2.0)[0]
    fast = p.model_copy(update={"median_us": 0.5, "p10_us": 0.5, "p90_us": 0.5, "rank_median_us": [0.5, 0.4]})
    assert "faster than physics" in point_problems(fast, measured, link_gbps=1.0)[0]


def test_the_roofline_of_a_multi_device_result_is_drawn_against_the_link():
    from types import SimpleNamespace

    from casebook.render import figures, plots
    from casebook.result import Hardware, Point

    point = Point(variant="allreduce_separate", shape={"tokens": 4, "hidden": 1024}, dtype="bf16", status="ok",
                  flops=8e4, bytes=1.3e5, link_bytes=8e3, arithmetic_intensity=8e4 / 1.3e5, tflops=1e-5,
                  attainable_tflops=1e-4, roof_fraction=0.1)
    hw = Hardware.model_validate(
        {"slug": "cpu-x2", "name": "cpu", "kind": "cpu",
         "measured": {"copy_gbps": 17.0, "matmul_tflops": {"bf16": 0.08}, "launch_us": 5.0, "graph_launch_us": 5.0},
         "topology": {"devices": 2, "link": "loopback", "bus_gbps": 0.9}, "datasheet": None})
    stored = SimpleNamespace(result=SimpleNamespace(kernel_level=[point], hardware=hw), hardware_name="cpu x2")
    entry = SimpleNamespace(case=SimpleNamespace(kernel=SimpleNamespace(
        variants=[SimpleNamespace(name="allreduce_separate")], baseline="allreduce_separate")))
    data = figures.roofline(entry, stored)
    assert data["against"] == "link" and data["measured"]["bandwidth_gbps"] == 0.9
    assert data["points"][0]["ai"] == pytest.approx(10.0)  # FLOPs per bus byte, not per memory byte
    assert "FLOP / byte over the link" in plots.render("roofline", data).decode()
    one = SimpleNamespace(result=SimpleNamespace(kernel_level=[point.model_copy(update={"link_bytes": None})],
                                                 hardware=hw.model_copy(update={"topology": None})),
                          hardware_name="cpu")
    assert figures.roofline(entry, one)["against"] == "memory"
