"""casebook.stability judges each point's spread and interference; a real run beside CPU burners is marked."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

import casebook.kernels
from casebook import stability
from casebook.load import load_case
from casebook.result import GpuState, Interference, Point
from casebook.run import orchestrate
from casebook.validate import unpublishable

CHEATS_DIR = Path(__file__).parent / "fixtures" / "kernels"
CEILINGS = {"copy_gbps": 1e3, "matmul_tflops": {"fp32": 1e3}, "launch_us": 1e-3, "graph_launch_us": 1e-3}

READING = Interference(window_s=0.5, other_cpu_s=0.02, cpus=2, run_queue_wait_s=0.001)
QUIET = Point(variant="v", shape={"n": 1}, dtype="fp32", status="ok", median_us=10.0, p10_us=9.0, p90_us=12.0,
              interference=READING)


def quiet(**change) -> Point:
    return QUIET.model_copy(update=change)


def test_a_quiet_point_is_stable():
    assert stability.reasons(QUIET, "cpu") == []


@pytest.mark.parametrize("change, words", [
    ({"p10_us": 1.0, "p90_us": 31.0}, "spread p90/p10 31.00 over 3"),
    ({"interference": READING.model_copy(update={"other_cpu_s": 0.9})}, "other processes used 1.76 cores"),
    ({"interference": READING.model_copy(update={"run_queue_wait_s": 0.2})}, "waited for a CPU 40% of the timing"),
    ({"interference": READING.model_copy(update={"gpu": GpuState(sm_clock_mhz=1980, mem_clock_mhz=3201,
                                                                 other_processes=[4242])})},
     "on the GPU: pid 4242"),
])
def test_each_bound_marks_a_point(change, words):
    [why] = stability.reasons(quiet(**change), "cpu")
    assert words in why


def test_every_ranks_reading_is_named_by_its_rank():
    """A multi-device point is judged on each rank's reading, its own `interference` aside."""
    busy = READING.model_copy(update={"run_queue_wait_s": 0.2})
    [why] = stability.reasons(quiet(rank_interference=[READING, busy], interference=busy), "cpu")
    assert why.startswith("rank 1: waited for a CPU 40%")


def test_the_gpu_bound_on_spread_is_tighter():
    point = quiet(p10_us=10.0, p90_us=16.0)
    assert stability.reasons(point, "cpu") == [] and "over 1.5" in stability.reasons(point, "cuda")[0]


def test_a_gpu_point_that_timed_its_host_is_judged_by_the_hosts_spread():
    """Most repetitions kept the host's issue time (`late_reps_kept`): the spread is the host's, judged by the
    CPU's bound; the machine's readings still judged as ever."""
    host_timed = READING.model_copy(update={"late_reps_kept": 1280})
    point = quiet(p10_us=268.1, p90_us=425.1)
    assert "over 1.5 (268.1" in stability.reasons(point, "cuda")[0]
    assert stability.reasons(quiet(p10_us=268.1, p90_us=425.1, interference=host_timed), "cuda") == []
    [why] = stability.reasons(quiet(p10_us=100.0, p90_us=400.0, interference=host_timed), "cuda")
    assert "over 3 (the host's bound" in why
    busy = host_timed.model_copy(update={"run_queue_wait_s": 0.2})
    assert "waited for a CPU" in stability.reasons(quiet(interference=busy), "cuda")[0]


def test_a_short_window_is_not_judged_on_ticks():
    reading = Interference(window_s=0.02, other_cpu_s=0.04, cpus=2)
    assert stability.other_cores(reading) is None
    assert stability.reasons(quiet(interference=reading), "cpu") == []


def test_a_reading_without_its_cpus_forgives_one_tick():
    assert stability.other_cores(Interference(window_s=1.0, other_cpu_s=0.5)) == pytest.approx(0.49)


def test_summary_counts_the_unstable():
    points = [QUIET, quiet(unstable=["x"], interference=READING.model_copy(update={"run_queue_wait_s": 0.05})),
              Point(variant="v", shape={"n": 2}, dtype="fp32", status="checked")]
    s = stability.summary(points)
    assert (s.points, s.unstable) == (2, 1) and s.bounds.other_cpu_max_cores == 0.5
    assert s.run_queue_wait_max == pytest.approx(0.1) and s.other_cores_max == pytest.approx(0.0)


TINY_CASE = """\
schema_version: 1
id: cheats
title: "A tiny honest softmax"
operator: softmax
summary: "The honest variant of the cheats fixture, timed beside processes that burn every CPU."
bottleneck: {kind: bandwidth, reasoning: "A few FLOPs per byte."}
patterns: [fusion]
boundaries: [{axis: shape, holds: "Tiny shapes.", breaks: "Never run on a GPU."}]
transfers: [{operator: layernorm, why: "Same row reduction."}]
kernel:
  module: cheats
  reference: reference
  inputs: make_inputs
  traffic: traffic
  tensors: {x: [rows, cols], y: [rows, cols]}
  baseline: honest
  variants:
    - {name: honest, fn: honest, note: "torch.softmax.", backends: [cpu]}
levels:
  kernel:
    shapes: [{rows: 64, cols: 256}]
    cpu_shapes: [{rows: 64, cols: 256}]
    dtypes: [fp32]
  workload:
    description: "One small shape."
    dtype: fp32
    shapes: [{shape: {rows: 32, cols: 256}, weight: 1.0, source: "test"}]
    cpu_shapes: [{shape: {rows: 32, cols: 256}, weight: 1.0, source: "test"}]
  end_to_end:
    description: "Softmax then a cumulative sum."
    scenario: scenario
    inputs: scenario_inputs
    shape: {rows: 4, cols: 16}
    cpu_shape: {rows: 4, cols: 16}
    dtype: fp32
    baseline: honest
    variant: honest
claims: []
writeup: {gap: "None.", remaining_bottleneck: "None."}
"""


@pytest.mark.slow
def test_a_run_beside_cpu_burners_marks_its_points(tmp_path, monkeypatch):
    """One process per CPU spins while a tiny case runs (about 10 s): every timed point is marked
    unstable, the summary counts them, and `check` would not publish the result. Robust to a loaded
    machine: more load only adds to the burners'."""
    path = tmp_path / "cases" / "cheats.yaml"
    path.parent.mkdir()
    path.write_text(TINY_CASE)
    monkeypatch.setenv("CASEBOOK_KERNELS_PATH", str(CHEATS_DIR))
    monkeypatch.setattr(casebook.kernels, "__path__", [*casebook.kernels.__path__, str(CHEATS_DIR)])
    burners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(os.cpu_count() or 1)]
    try:
        time.sleep(0.5)
        result = orchestrate.run_case(path, ceilings=CEILINGS)
    finally:
        for b in burners:
            b.kill()
            b.wait()
    timed = [p for p in result.kernel_level + result.workload_level.points if p.median_us]
    assert len(timed) == 2
    for p in timed:
        assert p.unstable, p
        assert any("other processes used" in why or "waited for a CPU" in why for why in p.unstable), p.unstable
        assert p.threads >= 1 and p.interference.window_s > 0
    assert result.stability.unstable == result.stability.points == 2
    assert result.environment.load_average_start and result.environment.cpu_threads >= 1
    assert any("unstable point(s)" in why for why in unpublishable(load_case(path), result))
