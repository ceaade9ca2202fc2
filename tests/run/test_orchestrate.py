"""casebook.run: planning, the level-2 and level-3 arithmetic, `failed`, and whole runs on a CPU.

Two whole runs: a tiny case whose variants cheat or break (tests/fixtures/kernels/cheats.py, through
CASEBOOK_KERNELS_PATH), every one of which must be caught while the rest of the run goes on; and the real
softmax case through the command line, as CI runs it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

import casebook.kernels
from casebook import paths, results
from casebook.case import Variant
from casebook.levels import Scenario
from casebook.load import load_case
from casebook.provenance import kernel_sha256, measurement_sha256
from casebook.result import Ceilings, IntensityCheck, Point, Result
from casebook.roofline import Roofs
from casebook.run import assemble, orchestrate, plan
from casebook.run.bench import QUICK

from conftest import REPO, SOFTMAX, empty_result

CHEATS_DIR = Path(__file__).parents[1] / "fixtures" / "kernels"
CEILINGS = {"copy_gbps": 1e3, "matmul_tflops": {"fp32": 1e3}, "launch_us": 1e-3, "graph_launch_us": 1e-3}
"""Synthetic ceilings (1 TB/s, 1 PFLOP/s): the tiny case's kernels sit far under every roof."""


# --- planning ---------------------------------------------------------------------------------------


def variant(*backends: str) -> Variant:
    return Variant(name="v", fn="v", note="n", backends=list(backends))


@pytest.mark.parametrize("backends, on_gpu, where", [
    (("cuda", "cpu"), True, ("cuda", True)),
    (("cuda", "cpu"), False, ("cpu", True)),
    (("cuda", "interpreter"), True, ("cuda", True)),
    (("cuda", "interpreter"), False, ("cpu", False)),
    (("cpu", "interpreter"), False, ("cpu", True)),
    (("cuda",), False, None),
    (("interpreter",), True, ("cpu", False)),
])
def test_placement(backends, on_gpu, where):
    assert plan.placement(variant(*backends), on_gpu) == where


def test_plan_on_a_cpu():
    case = load_case(SOFTMAX)
    groups = plan.plan(case, on_gpu=False, protocol=QUICK, ceilings=Ceilings(**CEILINGS))
    assert list(groups) == [v.name for v in case.kernel.variants]
    kernel = len(case.levels.kernel.cpu_shapes) * len(case.levels.kernel.dtypes)
    workload = len(case.levels.workload.cpu_shapes)
    assert groups["torch_compile"].device is None and groups["torch_compile"].tasks == []
    base = groups["torch_softmax"]  # the end-to-end baseline: timed here, so it runs the scenario too
    assert (base.device, base.timed) == ("cpu", True)
    assert [t.level for t in base.tasks] == ["kernel"] * kernel + ["workload"] * workload + ["end_to_end"]
    assert base.tasks[-1].shape == case.levels.end_to_end.cpu_shape
    online = groups["triton_online"]  # the end-to-end variant, but only checked here: no scenario
    assert (online.device, online.timed) == ("cpu", False) and len(online.tasks) == kernel + workload
    shapes = [t.shape for t in online.tasks if t.level == "kernel"]
    assert shapes == [s for s in case.levels.kernel.cpu_shapes for _ in case.levels.kernel.dtypes]
    seeds = [t.seed for g in groups.values() for t in g.tasks if t.level == "kernel"]
    assert len(set(seeds)) == kernel, "a point has the same seed in every variant, and its own"
    t = base.tasks[0]
    assert t.protocol.cache == case.levels.kernel.cache and t.protocol.time_cap_s == QUICK.time_cap_s
    assert t.roofs == Roofs(compute_tflops=1e3, bandwidth_gbps=1e3, launch_us=1e-3, graph_launch_us=1e-3)


def test_plan_on_a_gpu_uses_the_gpu_shapes():
    case = load_case(SOFTMAX)
    groups = plan.plan(case, on_gpu=True, protocol=QUICK, ceilings=Ceilings(**CEILINGS))
    assert all(g.device == "cuda" and g.timed for g in groups.values())
    kernel = [t for t in groups["triton_online"].tasks if t.level == "kernel"]
    assert len(kernel) == len(case.levels.kernel.shapes) * len(case.levels.kernel.dtypes)
    assert groups["triton_online"].tasks[-1].kind == "end_to_end"


def test_plan_only_keeps_the_baseline():
    groups = plan.plan(load_case(SOFTMAX), on_gpu=False, protocol=QUICK, ceilings=Ceilings(**CEILINGS), only=["eager"])
    assert list(groups) == ["eager", "torch_softmax"]


def test_plan_checks_a_control_against_its_own_reference():
    case = load_case(REPO / "cases" / "gemm_epilogue.yaml")
    groups = plan.plan(case, on_gpu=True, protocol=QUICK, ceilings=Ceilings(**CEILINGS))
    assert {t.reference for t in groups["gluon_pingpong_plain"].tasks} == {"reference_bias"}
    assert {t.reference for t in groups["gluon_pingpong"].tasks} == {"reference"}


def test_pair_tasks_for_each_point_of_each_speedup_claim_that_names_shapes():
    case = load_case(REPO / "cases" / "gemm_epilogue.yaml")
    groups = plan.plan(case, on_gpu=True, protocol=QUICK, ceilings=Ceilings(**CEILINGS))
    def ran(g, status: str) -> list:
        return [(t, Point(variant=t.variant, shape=t.shape, dtype=t.dtype, status=status)) for t in g.tasks]

    for g in groups.values():
        g.outcomes = ran(g, "ok")
    pairs = plan.pair_tasks(case, "nvidia-h200", groups, QUICK)
    assert {(t.variant, t.over, t.shape["k"]) for t in pairs} == {
        ("gluon_pingpong", "addmm_gelu", 1024), ("triton_fused", "addmm_gelu", 4096),
        ("gluon_pingpong_tanh", "addmm_gelu_tanh", 1024), ("gluon_pingpong_tanh", "addmm_activation", 1024),
        ("gluon_pingpong", "gluon_pingpong_plain", 1024), ("gluon_pingpong_tanh", "gluon_pingpong_plain", 1024)}
    assert all(t.kind == "pair" and t.level == "kernel" and t.dtype == "bf16" for t in pairs)
    plain = next(t for t in pairs if t.over == "gluon_pingpong_plain")
    assert plain.over_fn == "gluon_pingpong_plain" and plain.protocol.time_cap_s <= plan.PAIR_TIME_CAP_S
    assert plan.pair_tasks(case, "cpu-some-thing", groups, QUICK) == [], "the claims name the H200"
    groups["addmm_gelu"].outcomes = ran(groups["addmm_gelu"], "crashed")
    assert len(plan.pair_tasks(case, "nvidia-h200", groups, QUICK)) == 4, "no pair without both ladder points"


def test_variant_env_keeps_the_compilers_choices_in_casebooks_cache(monkeypatch, tmp_path):
    for var in (*plan.COMPILE_CACHES, "TRITON_CACHE_AUTOTUNING", "TORCHINDUCTOR_COMPILE_THREADS", "GLIBC_TUNABLES"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setattr(paths, "CACHE_DIR", tmp_path)
    caches = {"TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor"), "TRITON_CACHE_DIR": str(tmp_path / "triton"),
              "TRITON_CACHE_AUTOTUNING": "1", "TORCHINDUCTOR_COMPILE_THREADS": "1"}
    assert plan.variant_env(interpreted=True) == {"TRITON_INTERPRET": "1", **caches}
    assert plan.variant_env(interpreted=False) == caches
    assert plan.variant_env(interpreted=False, cpu=True) == {**caches, "GLIBC_TUNABLES": plan.CPU_MALLOC}
    for var in (*caches, "GLIBC_TUNABLES"):  # the caller's choice wins
        monkeypatch.setenv(var, "/elsewhere" if var.endswith("_DIR") or var == "GLIBC_TUNABLES" else "2")
    assert plan.variant_env(interpreted=False, cpu=True) == {}


# --- levels 2 and 3, and what counts as failed --------------------------------------------------------


def result_with(kernel=(), workload=(), e2e_status="ok", held=(True,)) -> Result:
    def point(status: str) -> dict:
        return {"variant": "v", "shape": {"n": 1}, "dtype": "fp32", "status": status}

    doc = empty_result(kernel_level=[point(s) for s in kernel],
                       claims=[{"text": "c", "kind": "regime", "held": h, "detail": "-"} for h in held])
    doc["workload_level"]["points"] = [point(s) for s in workload]
    doc["end_to_end"]["status"] = e2e_status
    return Result.model_validate(doc)


@pytest.mark.parametrize("result, bad", [
    (result_with(["ok", "checked", "skipped"], ["ok"], "partial", (True, None)), False),
    (result_with(["ok", "failed"]), True),
    (result_with(["ok"], ["crashed"]), True),
    (result_with(["timeout"]), True),
    (result_with(["ok"], e2e_status="failed"), True),
    (result_with(["ok"], held=(True, False)), True),
])
def test_failed(result, bad):
    assert assemble.failed(result) is bad


# --- a whole run of cheating kernels ------------------------------------------------------------------

CHEATS_CASE = """\
schema_version: 1
id: cheats
title: "Kernels that cheat"
operator: softmax
summary: "Row softmax done wrong on purpose: the harness must catch every variant but one."
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
    - {name: writes_nothing, fn: writes_nothing, note: "Returns torch.empty_like.", backends: [cpu]}
    - {name: cached_after_check, fn: cached_after_check, note: "Caches after the check.", backends: [cpu]}
    - {name: crashes_at_large, fn: crashes_at_large, note: "Aborts at the level-1 shape.", backends: [cpu]}
    - {name: hangs_at_large, fn: hangs_at_large, note: "Hangs at the level-1 shape.", backends: [cpu]}
    - {name: gpu_only, fn: honest, note: "Nowhere to run on a CPU.", backends: [cuda]}
    - {name: slower, fn: slower, note: "Honest after a 1 ms sleep: correct and slower.", backends: [cpu]}
levels:
  kernel:
    shapes: [{rows: 16, cols: 32}]
    cpu_shapes: [{rows: 16, cols: 32}]
    dtypes: [fp32]
  workload:
    description: "One small shape."
    dtype: fp32
    shapes: [{shape: {rows: 4, cols: 32}, weight: 1.0, source: "test"}]
    cpu_shapes: [{shape: {rows: 4, cols: 32}, weight: 1.0, source: "test"}]
  end_to_end:
    description: "Softmax then a cumulative sum."
    scenario: scenario
    inputs: scenario_inputs
    shape: {rows: 4, cols: 16}
    cpu_shape: {rows: 4, cols: 16}
    dtype: fp32
    baseline: honest
    variant: honest
claims:
  - {kind: throughput, text: "The honest kernel moves some bytes.", variant: honest, at_least_gbps: 1.0e-6}
  - {kind: speedup, text: "Crashing is not faster.", variant: crashes_at_large, over: honest, at_least: 1.0,
     level: kernel}
  - {kind: regime, text: "Only on an H200.", variant: honest, regime: compute, hardware: [nvidia-h200]}
  - {kind: speedup, text: "Honest is faster than honest after a sleep.", variant: honest, over: slower, at_least: 1.5,
     level: kernel, where: {shapes: [{rows: 16, cols: 32}]}}
writeup: {gap: "None.", remaining_bottleneck: "None."}
"""
TIMEOUT_S = 10.0
"""Per task, the child's torch import included (2-3 s): the hang costs this much of the test's time."""


@pytest.fixture(scope="module")
def cheats_run(tmp_path_factory):
    """`run_case` on the cheats case, once for the module: (result, progress events, seconds)."""
    path = tmp_path_factory.mktemp("book") / "cases" / "cheats.yaml"
    path.parent.mkdir()
    path.write_text(CHEATS_CASE)
    events: list[tuple[str, dict]] = []
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("CASEBOOK_KERNELS_PATH", str(CHEATS_DIR))  # for the children
        mp.setattr(casebook.kernels, "__path__", [*casebook.kernels.__path__, str(CHEATS_DIR)])  # for this process
        start = time.monotonic()
        result = orchestrate.run_case(path, quick=True, timeout_s=TIMEOUT_S, ceilings=CEILINGS,
                              progress=lambda event, info: events.append((event, info)))
        return result, events, time.monotonic() - start


def points_of(result: Result, name: str) -> tuple[Point, Point | None]:
    [k] = [p for p in result.kernel_level if p.variant == name]
    w = [p for p in result.workload_level.points if p.variant == name]
    return k, (w[0] if w else None)


def test_cheats_run_is_failed_and_stores(cheats_run, tmp_path):
    result, _, seconds = cheats_run
    assert isinstance(result, Result) and assemble.failed(result)
    assert seconds < 90, f"the cheats run took {seconds:.0f} s"
    stored = results.load(results.save(result, tmp_path))
    assert stored == result and stored.case_id == "cheats"
    assert result.kernel_sha256 == kernel_sha256("cheats", CHEATS_DIR), "the module the children ran, out of tree"
    assert result.kernel_file == "cheats.py" and result.command.endswith("cheats.yaml --quick")
    assert result.argv is None, "no command line given: the command is spelled from the options"


def test_honest_variant_is_ok(cheats_run):
    k, w = points_of(cheats_run[0], "honest")
    assert (k.status, w.status) == ("ok", "ok")
    assert k.correct and k.median_us > 0 and k.regime in ("bandwidth", "launch", "compute")
    assert w.speedup == 1.0 and w.weight == 1.0 and w.source == "test"


def test_a_variants_first_point_records_the_wait_for_its_child_to_start(cheats_run):
    """A CPU run starts each variant's child as the variant begins: its first point waits for the child's greeting
    (`HarnessCost.start_s`), which its later points do not."""
    k, w = points_of(cheats_run[0], "honest")
    assert k.harness.start_s is not None and k.harness.start_s > 0
    assert w.harness.start_s is None
    assert k.harness.start_s < k.harness.wall_s


def test_wrong_output_is_failed(cheats_run):
    k, w = points_of(cheats_run[0], "writes_nothing")
    for p in (k, w):
        assert p.status == "failed" and p.correct is False, p
        assert "NaN or Inf" in p.error or "relative error" in p.error or "worst row" in p.error
        assert p.median_us is None, "a wrong answer is never timed"


def test_cache_after_the_check_is_caught_by_the_recheck(cheats_run):
    k, w = points_of(cheats_run[0], "cached_after_check")
    assert k.status == "failed" and "relative error" in k.error
    assert k.error.startswith("timed call ") or k.error.startswith("after timing: seed "), k.error
    assert k.correct is False and k.gbps is None
    assert w.status == "failed" and "output shape (16, 32), expected (4, 32)" in w.error


def test_crash_is_contained_and_the_next_task_runs(cheats_run):
    k, w = points_of(cheats_run[0], "crashes_at_large")
    assert k.status == "crashed" and k.error == "child process died (exit code -6)"
    assert w.status == "ok" and w.correct, "a fresh child took the next task"


def test_hang_times_out_and_the_next_task_runs(cheats_run):
    k, w = points_of(cheats_run[0], "hangs_at_large")
    assert k.status == "timeout" and k.error == f"no answer within {TIMEOUT_S:.0f} s: killed"
    assert w.status == "ok"


def test_variant_without_a_backend_here_is_skipped(cheats_run):
    result = cheats_run[0]
    k, w = points_of(result, "gpu_only")
    assert k.status == "skipped" and "no backend of ['cuda']" in k.error and w is None
    assert {v.name: v.mode for v in result.variants} == {
        "honest": "timed", "writes_nothing": "timed", "cached_after_check": "timed", "crashes_at_large": "timed",
        "hangs_at_large": "timed", "gpu_only": "skipped", "slower": "timed"}


def test_cheats_claims(cheats_run):
    held = {c.text: (c.held, c.detail) for c in cheats_run[0].claims}
    assert held["The honest kernel moves some bytes."][0] is True
    assert held["Crashing is not faster."] == (False, "not measured at 16x32 fp32")
    assert held["Only on an H200."][0] is None
    paired = next(c for c in cheats_run[0].claims if c.text == "Honest is faster than honest after a sleep.")
    assert "timed in alternation with slower (6 rounds" in paired.detail, paired.detail
    assert [(p.shape, len(p.rounds_us)) for p in paired.paired] == [({"rows": 16, "cols": 32}, 6)]
    # The verdict is the paired timing's: on a quiet machine 1 ms of sleep is a 20x margin; on a loaded one the
    # scheduler's slices (measured: 20 ms calls of a 16 x 32 softmax under three busy loops on two cores) can
    # drown it, and the claim then honestly misses. Either way it is judged on the worst paired point.
    assert paired.held is (min(p.speedup for p in paired.paired) >= 1.5), paired.detail


def test_cheats_end_to_end_and_summary(cheats_run):
    result = cheats_run[0]
    e = result.end_to_end
    if e.status == "failed":  # a loaded machine: the harness refuses the disturbed kernel share, saying why
        assert "timings disturbed" in e.error, e.error
    else:
        assert e.status == "ok" and e.measured_speedup == pytest.approx(1.0)
    rows = {r.variant: r for r in result.workload_level.summary}
    assert rows["honest"].geomean_speedup == pytest.approx(1.0)


def test_progress_reports_every_task(cheats_run):
    _, events, _ = cheats_run
    kinds = [e for e, _ in events if e != "note"]
    assert kinds[:2] == ["ceilings", "plan"]
    total = events[[e for e, _ in events].index("plan")][1]["total"]
    assert [k for k in kinds[2:] if k != "variant"] == ["task"] * total + ["pairs", "task"]  # then the paired timing
    assert total == 6 * 2 + 1  # six variants run here, a kernel and a workload point each; one scenario
    variants = [info for e, info in events if e == "variant"]
    assert sorted(v["points"] for v in variants if v["points"]) == [2] * 5 + [3]  # after each variant, its cost
    assert all(0 <= v["timed_s"] <= v["wall_s"] for v in variants)
    notes = [info["message"] for e, info in events if e == "note"]
    assert any(n.startswith("crossing: host") for n in notes), "the run says how its outputs crossed"
    ready = [n for n in notes if n.startswith("the reference's child ready in")]
    assert len(ready) == 1, "the reference's child's start is waited for once, before the first point"


# --- the real case, as CI runs it ----------------------------------------------------------------------

REQUIRED = ("variant", "shape", "dtype", "median_us", "p10_us", "p90_us", "gbps", "tflops", "arithmetic_intensity",
            "roof_fraction", "regime", "correct", "max_rel_err")


@pytest.mark.slow
def test_softmax_case_runs_on_a_cpu(tmp_path):
    """`casebook run cases/softmax_fusion.yaml`: exit 0, a valid stored result, Triton checked through the
    interpreter. About 35-60 s on a 2-core machine (ceilings measured afresh included)."""
    env = {**os.environ, "CASEBOOK_CACHE": str(tmp_path / "cache"), "TRITON_INTERPRET": "1"}
    start = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "casebook.cli", "run", "cases/softmax_fusion.yaml",
                           "--save", "--results", str(tmp_path / "results")], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=300)
    seconds = time.monotonic() - start
    stored = list((tmp_path / "results").glob("*/softmax_fusion.json"))
    assert stored, proc.stdout[-3000:] + proc.stderr[-3000:]
    [path] = stored
    doc = json.loads(path.read_text())
    bad = [f"{p['variant']} {p['shape']} {p['dtype']}: {p['status']}: {p.get('error')}"
           for p in doc["kernel_level"] + doc["workload_level"]["points"]
           if p["status"] not in ("ok", "checked", "skipped")]
    assert proc.returncode == 0, "\n".join(bad) + f"\nceilings: {doc['hardware']['measured']}\n" + proc.stderr[-2000:]
    result = Result.model_validate(doc)
    assert results.load(path) == result and not assemble.failed(result)
    case = load_case(SOFTMAX)
    modes = {v.name: plan.placement(v, on_gpu=False) for v in case.kernel.variants}
    modes = {name: "skipped" if m is None else ("timed" if m[1] else "checked") for name, m in modes.items()}
    assert {v["name"]: v["mode"] for v in doc["variants"]} == modes
    points = doc["kernel_level"]
    timed = [p for p in points if p["status"] == "ok"]
    assert {p["variant"] for p in timed} == {n for n, m in modes.items() if m == "timed"} == {"eager", "torch_softmax"}
    assert len(timed) == 2 * len(case.levels.kernel.cpu_shapes) * len(case.levels.kernel.dtypes)
    for p in timed:
        missing = [f for f in REQUIRED if p.get(f) is None]
        assert not missing, f"{p['variant']} {p['shape']} {p['dtype']}: missing {missing}"
        assert p["correct"] is True and p["p10_us"] <= p["median_us"] <= p["p90_us"]
        assert p["regime"] == "bandwidth" and p["roof_fraction"] == pytest.approx(p["floor_us"] / p["median_us"])
    for name in ("triton_onepass", "triton_online"):
        assert modes[name] == "checked"
        mine = [p for p in points if p["variant"] == name]
        assert {p["status"] for p in mine} <= {"checked", "skipped"} and "checked" in {p["status"] for p in mine}
        assert all(p["correct"] and "median_us" not in p for p in mine if p["status"] == "checked")
        assert all(p["error"].startswith("unsupported: ") for p in mine if p["status"] == "skipped")  # rows too long
    assert doc["protocol"]["cache"] == "cold" and doc["protocol"]["timer"] == "time.perf_counter_ns"
    assert doc["end_to_end"]["status"] == "partial" and doc["end_to_end"]["kernel_share"] > 0
    assert all(c["held"] is None for c in doc["claims"]), "every claim is for an H200"
    print(f"casebook run cases/softmax_fusion.yaml: {seconds:.1f} s")  # about 40 s on a quiet 2-core machine


class InProcessOracle:
    """Stands for the reference's child: answers in this process (the tests' own kernels only)."""

    def __init__(self, *args, **kwargs):
        pass

    def start(self):
        pass

    def greet(self):
        return None

    def request(self, task, timeout_s, room=0, grow=False):
        from casebook.run.oracle import work

        return work(task)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        pass


def checked(task):
    """The judge's record of a task checked and not timed: a point's, or the scenario's."""
    if task.kind == "end_to_end":
        return Scenario(status="checked")
    return Point(variant=task.variant, shape=task.shape, dtype=task.dtype, status="checked")


def _checked(tasks, on_done=None, **kw):
    """Every task answered `checked`, each handed to `on_done` as it is, like `orchestrate.execute`."""
    out = []
    for i, task in enumerate(tasks):
        out.append(checked(task))
        if on_done is not None:
            on_done(i, out[-1])
    return out


def stub_children(monkeypatch, execute=None):
    """No child processes: every task answered `checked`, the reference's child in this process."""

    monkeypatch.setattr(orchestrate, "Worker", InProcessOracle)
    monkeypatch.setattr(orchestrate, "execute", execute or _checked)


def test_a_checkpoint_after_each_point(tmp_path, monkeypatch):
    """A run cut short keeps everything it measured: run_case hands over the result as it stands after each
    point, which `results.save_as` writes as the checkpoint beside the run."""
    from casebook.run import orchestrate

    seen: list[Result] = []
    planned: list[int] = []
    stub_children(monkeypatch)
    result = orchestrate.run_case(SOFTMAX, checkpoint=seen.append,
                              progress=lambda event, info: planned.append(info["total"]) if event == "plan" else None)
    assert result.complete is True
    assert len(seen) == planned[0], "a checkpoint after every task"
    checked = [sum(p.status == "checked" for p in r.kernel_level + r.workload_level.points) for r in seen]
    assert checked == sorted(checked) and checked[-1] == sum(
        p.status == "checked" for p in result.kernel_level + result.workload_level.points)
    assert all(isinstance(r, Result) and r.complete is False for r in seen)
    written = results.save_as(seen[-1], tmp_path / "run.json")
    assert written == tmp_path / "run.json.partial" and results.load(written) == seen[-1]


def test_the_command_line_is_the_run_s_own_from_its_first_checkpoint(monkeypatch):
    """`argv`, the command line as parsed, goes into the run (and `command`, as one shell line): the result
    and every checkpoint carry it; no caller edits a result afterwards."""
    from casebook.run import orchestrate

    seen: list[Result] = []
    stub_children(monkeypatch)
    argv = ["casebook", "run", "my cases/softmax_fusion.yaml", "--timeout", "30"]
    result = orchestrate.run_case(SOFTMAX, checkpoint=seen.append, argv=argv)
    assert result.argv == argv and result.command == "casebook run 'my cases/softmax_fusion.yaml' --timeout 30"
    assert seen and all(r.argv == argv and r.command == result.command for r in seen)
    assert "argv" not in results.document(orchestrate.run_case(SOFTMAX)), "none given: none stored"


def test_a_counters_stage_cut_short_leaves_the_measured_run_complete(monkeypatch):
    """The profiler comes after the measurement, and the complete run is handed to `checkpoint` before it: a
    time limit that ends the run under ncu (a chain of 88 kernels a call, a compile under the profiler) still
    leaves the run, complete, to `record`."""
    from casebook.run import counters, orchestrate

    def killed(*a, **k):
        raise KeyboardInterrupt  # the SIGTERM of a time limit, as the run sees it

    seen: list[Result] = []
    stub_children(monkeypatch)
    monkeypatch.setattr(counters, "read", killed)
    with pytest.raises(KeyboardInterrupt):
        orchestrate.run_case(SOFTMAX, checkpoint=seen.append, counters=True)
    assert seen[-1].complete is True and seen[-1].command.endswith(" --counters")
    assert len(seen[-1].variants) == len(load_case(SOFTMAX).kernel.variants)


def test_the_counters_time_is_recorded_beside_the_runs_span(monkeypatch):
    from casebook.run import counters, orchestrate

    stub_children(monkeypatch)
    monkeypatch.setattr(counters, "read", lambda case, result, progress: time.sleep(0.2) or [])
    assert orchestrate.run_case(SOFTMAX, counters=True).counters_s >= 0.2
    assert orchestrate.run_case(SOFTMAX).counters_s is None  # none asked: none taken


def test_hashes_are_taken_when_the_run_starts(tmp_path, monkeypatch):
    """A case edited while its run goes on: the result names the file that started the run, so
    `casebook check` calls it stale instead of current."""
    from casebook.provenance import case_sha256
    from casebook.run import orchestrate

    path = tmp_path / "cases" / "softmax_fusion.yaml"
    path.parent.mkdir()
    path.write_text(SOFTMAX.read_text())
    before = case_sha256(path)

    def edit_then_stub(tasks, **kw):
        path.write_text(path.read_text() + "\n# edited during the run\n")
        return [checked(t) for t in tasks]

    stub_children(monkeypatch, edit_then_stub)
    result = orchestrate.run_case(path)
    assert result.case_sha256 == before != case_sha256(path)


@pytest.mark.slow
def test_a_case_relying_on_the_conventional_names_runs(tmp_path):
    """The fixture case names no `fn`, `reference`, `inputs` or `traffic`: the run finds them by convention."""
    from conftest import SMALL_CASE

    path = tmp_path / "cases" / "scaled_add.yaml"
    path.parent.mkdir()
    path.write_text(SMALL_CASE.read_text())
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("CASEBOOK_KERNELS_PATH", str(CHEATS_DIR))  # the fixture kernels, for the children
        mp.setattr(casebook.kernels, "__path__", [*casebook.kernels.__path__, str(CHEATS_DIR)])
        result = orchestrate.run_case(path, quick=True, timeout_s=120, ceilings=CEILINGS)
    status = {(p.variant, p.dtype): p.status for p in result.kernel_level}
    assert status[("eager", "fp32")] == "ok" and status[("eager", "bf16")] == "ok", status
    assert all(p.correct for p in result.kernel_level if p.status in ("ok", "checked")), result.kernel_level
    assert result.measurement_sha256 == measurement_sha256(load_case(path))


def test_the_declared_intensity_is_checked_against_the_traffic_model(make_case, monkeypatch, line_of):
    """A case declaring 10 FLOP/byte where its model gives 1.25 (softmax, at its first level-1 shape): the run
    records both, and `check` flags the declared figure at its line."""
    from casebook.run import orchestrate
    from casebook.validate import validate

    path = make_case({"  arithmetic_intensity: 1.25\n": "  arithmetic_intensity: 10\n"})
    stub_children(monkeypatch)
    result = orchestrate.run_case(path)
    rec = result.arithmetic_intensity
    assert rec.shape == load_case(path).levels.kernel.shapes[0] and rec.dtype == "bf16"
    assert rec.modelled == pytest.approx(1.25) and rec.declared == 10 and rec.flagged is True
    stored = results.save(result, path.parent.parent / "results")
    [error] = [str(e) for e in validate([path], strict=True).errors if "FLOP/byte" in str(e)]
    assert error == (f"{path}:{line_of(path, 'arithmetic_intensity: 10')}: bottleneck.arithmetic_intensity: declared "
                     "10 FLOP/byte, but the traffic model gives 1.25 at 131072x1024 bf16 (the first level-1 shape and "
                     "dtype): +700%, more than 10%; state the model's figure at that shape "
                     f"(from results/{stored.parent.name}/softmax_fusion.json)")
    path.write_text(path.read_text().replace("arithmetic_intensity: 10\n", "arithmetic_intensity: 1.3\n"))
    assert not [e for e in validate([path], strict=True).errors if "FLOP/byte" in str(e)], "4% apart: within 10%"


def test_the_report_of_a_model_without_flops_states_the_declared_intensity(capsys):
    """A transpose's model moves bytes and does no FLOPs: 0 FLOP/byte modelled and declared, no ratio to
    take (the H200's transpose run crashed here, after its timings, before storing them)."""
    from casebook.commands import run as command

    command._intensity(IntensityCheck(shape={"n": 1024}, dtype="bf16", modelled=0.0, declared=0.0, tolerance=0.1))
    assert "gives 0 FLOP/byte, the case declares 0" in capsys.readouterr().out


@pytest.mark.parametrize("payload, why", [
    ({"status": "ok", "median_us": float("inf")}, "finite number"),  # a stored result is strict JSON
    ({"status": "ok", "interference": {"window_s": "long"}}, "valid number"),  # not the record's shape
    ({"status": "ok", "first_call_s": [1]}, "valid number"),
])
def test_an_answer_that_makes_no_record_crashes_its_task_and_replaces_its_child(payload, why):
    """`orchestrate._sound`: a judged answer with a number that is not finite, or a field not of the record's type,
    fails its own task (the child closed, so a true answer that follows cannot answer the next task)."""
    from casebook.run import orchestrate
    from casebook.run.child import Task

    closed = []

    class Child:
        def close(self):
            closed.append(True)

    task = Task(module="m", variant="v", fn="v", shape={"rows": 1}, dtype="fp32", level="kernel",
                device="cpu", timed=True, seed=1)
    at = {"variant": "v", "shape": task.shape, "dtype": "fp32"}
    out = orchestrate._sound(task, lambda: Point(**at, **payload), Child())
    assert out.status == "crashed" and "ValidationError" in out.error and why in out.error and closed == [True]
    assert out.model_dump(exclude_unset=True).keys() == {*at, "status", "error"}
    ok = Point(**at, status="checked", correct=True, max_rel_err=0.0)
    assert orchestrate._sound(task, lambda: ok, Child()) is ok and closed == [True]


def test_a_gpu_run_starts_the_reference_and_the_first_variant_before_the_ceilings(monkeypatch):
    """On a GPU the two children import the case's module and open the device beside the ceilings' measurement;
    the first variant takes the child started for it, and every child of a GPU variant is told to warm up."""
    from test_resume import CEILINGS, InProcessWorker

    from casebook.claims import Unpaired
    from casebook.run import hardware
    from casebook.run.oracle import work as oracle_work

    events: list[tuple] = []

    def execute(tasks, *, on_done=None, **kw):  # no child runs anything: every task crashed
        out = [Point(variant=t.variant, shape=t.shape, dtype=t.dtype, status="crashed", error="stub")
               if t.kind == "point" else Unpaired("crashed", "stub") if t.kind == "pair"
               else Scenario(status="crashed", error="stub") for t in tasks]
        for i, record in enumerate(out):
            if on_done is not None:
                on_done(i, record)
        return out

    class Recording(InProcessWorker):
        def __init__(self, worker, env=None, startup_s=120.0, arena=None, spill=True, warm=None):
            super().__init__(worker, env, startup_s, arena, spill, warm)
            self.env, self.warm, self.started = dict(env or {}), warm, False

        def start(self):
            if not self.started:
                events.append(("start", "reference" if self.worker is oracle_work else "variant", self.warm))
            self.started = True

        def greet(self):
            events.append(("greet", "reference" if self.worker is oracle_work else "variant"))

        def release(self):
            pass

    gpu = hardware.identify().model_copy(update={"kind": "gpu", "slug": "nvidia-h200", "name": "NVIDIA H200"})
    monkeypatch.setattr(orchestrate.hardware, "identify", lambda devices=1: gpu)
    monkeypatch.setattr(orchestrate, "_ceilings", lambda resumed, given: (
        events.append(("ceilings",)), (Ceilings.model_validate(CEILINGS), "given"))[1])
    monkeypatch.setattr(orchestrate, "Worker", Recording)
    monkeypatch.setattr(orchestrate, "execute", execute)
    orchestrate.run_case(SOFTMAX, quick=True, ceilings=CEILINGS)
    warm = ("softmax_fusion", "cuda")
    assert events[:3] == [("start", "reference", warm), ("start", "variant", warm), ("ceilings",)]
    assert events.count(("greet", "reference")) == 1  # its start waited for once, before the first point
    variants = [e for e in events if e[:2] == ("start", "variant")]
    groups = plan.plan(load_case(SOFTMAX), True, QUICK, Ceilings.model_validate(CEILINGS), None, None)
    assert len(variants) == sum(1 for g in groups.values() if g.tasks)  # the first child served the first variant
    assert all(e[2] == warm for e in variants)


def test_a_device_out_of_memory_error_names_the_runs_processes():
    from casebook.run.orchestrate import with_roles

    torch_says = ("crashed: OutOfMemoryError: CUDA out of memory. Tried to allocate 8.00 GiB. Process 1737 has "
                  "81.60 GiB memory in use. Process 1755 has 624.00 MiB memory in use.")
    named = with_roles(torch_says, {1700: "the parent", 1737: "the reference's child", None: "this variant's child"})
    assert named == torch_says + " (this run's processes: 1700 the parent, 1737 the reference's child)"
    assert with_roles("crashed: ZeroDivisionError", {1700: "the parent"}) == "crashed: ZeroDivisionError"
    assert with_roles(None, {1700: "the parent"}) is None


def test_a_gate_is_passed_once_before_the_ceilings_and_the_plan(monkeypatch):
    """A pool's prestarted case waits at its gate until the device is its own: nothing that touches the device
    (the ceilings, the plan's work) comes before it."""
    from casebook.run import hardware, orchestrate

    said: list[str] = []
    stub_children(monkeypatch)
    monkeypatch.setattr(hardware, "ceilings", lambda: said.append("ceilings") or CEILINGS)
    result = orchestrate.run_case(SOFTMAX, gate=lambda: said.append("gate"),
                                  progress=lambda event, info: said.append(event))
    assert result.complete is True
    assert said.count("gate") == 1 and said.index("gate") < said.index("ceilings") < said.index("plan")
