"""A run cut short and resumed: `resume.resumable` (what a kept run gives a new one), `run_case(..., resume=)`,
`casebook run` under SIGTERM and `--resume`, and `last_cut_short`.

The case is the tests' own (written to a scratch book): a row softmax whose `gated` variant, at its larger
level-1 shape, waits until a file named `gate` exists beside the module. With the gate open it is honest; closed,
the run stands still at a known point, so that a SIGTERM cuts it there whatever the machine's speed.
"""

from __future__ import annotations

import copy
import io
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from rich.console import Console

import casebook.kernels
from casebook import paths, results
from casebook.commands import run as command
from casebook.levels import Scenario
from casebook.load import load_case
from casebook.result import Ceilings, Point, Result, shape_label
from casebook.run import assemble, hardware, isolate, orchestrate, plan, resume
from casebook.run.bench import CPU, QUICK
from casebook.run.child import Task
from casebook.run.oracle import work as oracle_work

from conftest import SOFTMAX, empty_result

MODULE = "resume_gated"
KERNEL = '''\
"""Row softmax; `gated` waits at more than 8 rows until the file `gate` beside this module exists."""

import os
import time
from pathlib import Path

import torch

from casebook.traffic import Term, Traffic

GATE = Path(__file__).with_name("gate")


def reference(x):
    return torch.softmax(x.to(torch.float64), dim=-1)


def make_inputs(shape, dtype, device, generator):
    x = torch.randn(shape["rows"], shape["cols"], generator=generator, dtype=torch.float32) * 2.0
    return {"x": x.to(device=device, dtype=dtype)}


def traffic(shape, dtype):
    n = shape["rows"] * shape["cols"]
    b = torch.empty((), dtype=dtype).element_size()
    return Traffic([Term("read x", bytes=n * b), Term("write y", bytes=n * b), Term("softmax", flops=5 * n)])


def scenario_inputs(shape, dtype, device, generator):
    return make_inputs(shape, dtype, device, generator)


def scenario(kernel, x):
    return kernel(x).cumsum(dim=-1)


def honest(x):
    return torch.softmax(x, dim=-1)


def gated(x):
    if x.shape[0] > 8 and not GATE.exists():
        GATE.with_name(f"waiting-{os.getpid()}").touch()
        deadline = time.monotonic() + 300
        while not GATE.exists() and time.monotonic() < deadline:
            time.sleep(0.01)
    return torch.softmax(x, dim=-1)
'''

CASE = """\
schema_version: 1
id: {id}
title: "A softmax run to cut short"
operator: softmax
summary: "Row softmax, honest, with a variant that can be held at one point: a run to cut short and resume."
bottleneck: {{kind: bandwidth, reasoning: "A few FLOPs per byte."}}
patterns: [fusion]
boundaries: [{{axis: shape, holds: "Tiny shapes.", breaks: "Never run on a GPU."}}]
transfers: [{{operator: layernorm, why: "Same row reduction."}}]
kernel:
  module: resume_gated
  tensors: {{x: [rows, cols], y: [rows, cols]}}
  baseline: honest
  variants:
    - {{name: gated, note: "Honest once the gate is open.", backends: [cpu]}}
    - {{name: honest, note: "torch.softmax.", backends: [cpu]}}
{more}levels:
  kernel:
    shapes: [{{rows: 4, cols: 32}}, {{rows: 16, cols: 32}}]
    cpu_shapes: [{{rows: 4, cols: 32}}, {{rows: 16, cols: 32}}]
    dtypes: [fp32]
  workload:
    description: "One small shape."
    dtype: fp32
    shapes: [{{shape: {{rows: 2, cols: 64}}, weight: 1.0, source: "test"}}]
    cpu_shapes: [{{shape: {{rows: 2, cols: 64}}, weight: 1.0, source: "test"}}]
  end_to_end:
    description: "Softmax then a cumulative sum."
    scenario: scenario
    inputs: scenario_inputs
    shape: {{rows: 4, cols: 16}}
    cpu_shape: {{rows: 4, cols: 16}}
    dtype: fp32
    baseline: honest
    variant: honest
claims:
  - {{kind: throughput, text: "The honest kernel moves some bytes.", variant: honest, at_least_gbps: 1.0e-6}}
writeup: {{gap: "None.", remaining_bottleneck: "None."}}
"""
MORE_VARIANTS = """\
    - {name: interpreted, fn: honest, note: "Checked in the interpreter.", backends: [interpreter]}
    - {name: gpu_only, fn: honest, note: "Nowhere to run on a CPU.", backends: [cuda]}
"""
CEILINGS = {"copy_gbps": 1e3, "matmul_tflops": {"fp32": 1e3}, "launch_us": 1e-3, "graph_launch_us": 1e-3}
"""Synthetic ceilings (as tests/run/test_orchestrate.py's): the tiny case's kernels sit far under every roof."""
TIMEOUT_S = 120.0


def write_book(root: Path, gate_open: bool) -> Path:
    """`<root>/kernels/resume_gated.py` (the gate open or closed), `<root>/cases/gated.yaml` (four variants) and
    `<root>/cases/cut.yaml` (gated and honest alone); the kernels' folder."""
    kernels = root / "kernels"
    kernels.mkdir(parents=True)
    (kernels / f"{MODULE}.py").write_text(KERNEL)
    if gate_open:
        (kernels / "gate").touch()
    (root / "cases").mkdir()
    (root / "cases" / "gated.yaml").write_text(CASE.format(id="gated", more=MORE_VARIANTS))
    (root / "cases" / "cut.yaml").write_text(CASE.format(id="cut", more=""))
    return kernels


@pytest.fixture(scope="module")
def book(tmp_path_factory):
    """The scratch book, its kernel importable here and in the children (the gate open)."""
    root = tmp_path_factory.mktemp("resume_book")
    kernels = write_book(root, gate_open=True)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("CASEBOOK_KERNELS_PATH", str(kernels))
        mp.setattr(casebook.kernels, "__path__", [*casebook.kernels.__path__, str(kernels)])
        yield root
    sys.modules.pop(f"casebook.kernels.{MODULE}", None)


def points(result: Result) -> list:
    return [("kernel", p) for p in result.kernel_level] + [("workload", p) for p in result.workload_level.points]


def key_of(level: str, p) -> tuple:
    return resume.point_key(level, p.variant, p.shape, p.dtype)


# --- stand-ins for the children ---------------------------------------------------------------------------

STATUS = {("gated", "kernel", 4): "ok", ("gated", "kernel", 16): "crashed", ("gated", "workload", 2): "failed",
          ("honest", "kernel", 4): "ok", ("honest", "kernel", 16): "timeout", ("honest", "workload", 2): "ok",
          ("interpreted", "kernel", 4): "checked", ("interpreted", "kernel", 16): "skipped",
          ("interpreted", "workload", 2): "checked"}
"""What the stubbed children answer at each point of gated.yaml: every status a point can have (gpu_only's
points are skipped by the run itself: no backend here)."""


def stub_payload(task: Task, timed_s: float = 0.125) -> Point | Scenario:
    """A record as `orchestrate.execute` hands it over, for `STATUS`'s status at the task's point."""
    if task.kind == "end_to_end":
        return Scenario(status="checked")
    status = STATUS[(task.variant, task.level, task.shape["rows"])]
    out = {"status": status, "harness": {"wall_s": 0.5, "timed_s": timed_s, "oracle_s": 0.01, "transport_s": 0.0,
                                         "judge_s": 0.01}}
    median = 10.0 if task.variant == "honest" else 20.0
    if status == "ok":
        out.update(correct=True, max_rel_err=1e-7, max_row_err=2e-7, median_us=median, p10_us=0.95 * median,
                   p90_us=1.05 * median, repetitions=50, timer="time.perf_counter_ns", first_call_s=0.01,
                   bytes=1024.0, flops=640.0, arithmetic_intensity=0.625, gbps=1024.0 / (median * 1e3),
                   tflops=640.0 / (median * 1e6), floor_us=1e-3, roof_fraction=1e-3 / median, regime="bandwidth")
    elif status == "checked":
        out.update(correct=True, max_rel_err=1e-7)
    elif status == "failed":
        out.update(correct=False, error="relative error 0.5 over 1e-05")
    elif status == "skipped":
        out.update(error="unsupported: more than 8 rows")
    else:
        out.update(error=f"stub: {status}")
    return Point(variant=task.variant, shape=task.shape, dtype=task.dtype, **out)


class StubExecute:
    """Stands for `orchestrate.execute`: each task answered with `stub_payload`, handed to `on_done` as it is; keeps
    what it was given (the tasks, the points to keep)."""

    def __init__(self, timed_s: float = 0.125):
        self.tasks: list[Task] = []
        self.reuse: list[dict[tuple, Point] | None] = []
        self.timed_s = timed_s

    def __call__(self, tasks, *, timeout_s, env, answers=None, on_done=None, loaded=None, reuse=None, worker=None):
        self.tasks += tasks
        self.reuse.append(reuse)
        out = []
        for i, t in enumerate(tasks):
            key = resume.point_key(t.level, t.variant, t.shape, t.dtype)
            if t.kind == "point" and reuse and key in reuse:  # kept, as `execute` keeps it
                kept = reuse[key]
                out.append(kept.model_copy(update={"harness": kept.harness.model_copy(update={"kept": True})}))
            else:
                out.append(stub_payload(t, self.timed_s))
            if on_done is not None:
                on_done(i, out[-1])
        return out


class InProcessWorker:
    """Stands for `isolate.Worker`: the reference's child answers in this process; a variant's child is never
    started (every request of one is kept, and answered as a crash)."""

    def __init__(self, worker, env=None, startup_s: float = 120.0, arena=None, spill=True, warm=None):
        self.worker = worker
        self.asked: list = []
        self.receive_s, self.start_wait_s, self.arena, self.crossing_error = 0.0, 0.0, None, None
        WORKERS.append(self)

    def start(self):
        pass

    def greet(self):
        return None

    def request(self, task, timeout_s, room=0, grow=False):
        if self.worker is oracle_work:
            return oracle_work(task)
        self.asked.append(task)
        return {"status": "crashed", "error": "stub: no child here"}

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        pass


WORKERS: list[InProcessWorker] = []


REAL_EXECUTE = orchestrate.execute


def stubbed_run(monkeypatch, path: Path, execute, **kw) -> tuple[Result, list[Result], list]:
    """`run_case` with no child process (`execute`: a stand-in, or `REAL_EXECUTE` with `InProcessWorker`'s
    children): (result, checkpoints, progress events)."""
    monkeypatch.setattr(orchestrate, "Worker", InProcessWorker)
    monkeypatch.setattr(orchestrate, "execute", execute)
    seen: list[Result] = []
    events: list = []
    kw.setdefault("ceilings", CEILINGS)
    result = orchestrate.run_case(path, quick=True, checkpoint=seen.append,
                                  progress=lambda e, i: events.append((e, i)), **kw)
    return result, seen, events


@pytest.fixture
def kept_run(book, monkeypatch):
    """gated.yaml run with stubbed children: every status there is, in a complete result."""
    result, _, _ = stubbed_run(monkeypatch, book / "cases" / "gated.yaml", StubExecute())
    return result


def here(path: Path) -> tuple:
    """What `resumable` compares a kept run against, for a run of `path` here with the quick protocol."""
    case = load_case(path)
    return case, hardware.identify(devices=case.kernel.devices), QUICK, assemble.sources_of(path, case)


# --- resume.resumable --------------------------------------------------------------------------------------------


def test_a_kept_run_gives_its_measured_points_by_point_key(book, kept_run):
    reuse, why = resume.resumable(kept_run, *here(book / "cases" / "gated.yaml"))
    assert why is None
    statuses = {key_of(level, p): p.status for level, p in points(kept_run)}
    assert set(statuses.values()) == {"ok", "checked", "failed", "skipped", "crashed", "timeout"}, "every status"
    assert set(reuse) == {k for k, s in statuses.items() if s in ("ok", "checked", "failed", "skipped")}
    assert ("kernel", "gated", "16x32", "fp32") not in reuse, "a crash is tried again"
    assert ("kernel", "honest", "16x32", "fp32") not in reuse, "a timeout is tried again"
    assert ("kernel", "gpu_only", "4x32", "fp32") in reuse, "skipped: no backend here, and told why"
    assert ("kernel", "interpreted", "16x32", "fp32") in reuse, "skipped by the variant: unsupported"
    for level, p in points(kept_run):
        key = key_of(level, p)
        if key not in reuse:
            continue
        doc = p.model_dump(mode="json", by_alias=True, exclude_unset=True)
        dropped = {"speedup", "weight", "source"}  # the run's levels set them again
        mine = reuse[key].model_dump(mode="json", by_alias=True, exclude_unset=True)
        assert mine == {k: v for k, v in doc.items() if k not in dropped}
        assert not dropped & set(mine) and reuse[key].status == p.status
    ok = reuse[("kernel", "gated", "4x32", "fp32")]
    assert ok.median_us == 20.0 and ok.harness.timed_s == 0.125 and ok.speedup is None
    assert next(p for _, p in points(kept_run) if p.variant == "gated" and p.status == "ok").speedup == 0.5
    assert reuse[("workload", "honest", "2x64", "fp32")].weight is None


def test_a_kept_run_of_the_same_point_keys_as_the_plan(book, kept_run):
    """The keys `resumable` gives are those `execute` looks the planned tasks up by."""
    path = book / "cases" / "gated.yaml"
    reuse, _ = resume.resumable(kept_run, *here(path))
    groups = plan.plan(load_case(path), False, QUICK, Ceilings(**CEILINGS))
    planned = {resume.point_key(t.level, t.variant, t.shape, t.dtype) for g in groups.values() for t in g.tasks
               if t.kind == "point"}
    assert planned - set(reuse) == {("kernel", "gated", "16x32", "fp32"), ("kernel", "honest", "16x32", "fp32")}


def _with(result: Result, **fields) -> Result:
    return result.model_copy(update=fields)


@pytest.mark.parametrize("change, words", [
    (lambda r: _with(r, kernel_sha256="f" * 64), "another kernel code (kernel_sha256)"),
    (lambda r: _with(r, measurement_sha256="f" * 64),
     "another case's kernel, levels or claims (measurement_sha256)"),
    (lambda r: _with(r, environment=r.environment.model_copy(update={"casebook_sha256": "f" * 64})),
     "another harness (casebook_sha256)"),
    (lambda r: _with(r, hardware=r.hardware.model_copy(update={"slug": "nvidia-h200"})), "another machine"),
    (lambda r: _with(r, protocol=r.protocol.model_copy(update={"time_cap_s": r.protocol.time_cap_s * 2})),
     "another timing protocol"),
    (lambda r: _with(r, protocol=r.protocol.model_copy(update={"min_reps": r.protocol.min_reps + 1})),
     "another timing protocol"),
    (lambda r: _with(r, case_id="softmax_fusion"), "another case"),
])
def test_a_kept_run_that_differs_gives_nothing_and_says_why(book, kept_run, change, words):
    changed = change(kept_run)
    reuse, why = resume.resumable(changed, *here(book / "cases" / "gated.yaml"))
    assert reuse == {} and why == words


def test_a_kept_run_read_back_from_its_document_is_resumable(book, kept_run):
    """The checkpoint as `--resume` finds it: written, and read back through `results.load`."""
    doc = results.document(kept_run)
    reuse, why = resume.resumable(Result.model_validate(doc), *here(book / "cases" / "gated.yaml"))
    assert why is None and len(reuse) == 9  # 11 points, less a crash and a timeout
    other = Result.model_validate({**doc, "kernel_sha256": "0" * 64, "hardware": {**doc["hardware"], "slug": "x"}})
    assert resume.resumable(other, *here(book / "cases" / "gated.yaml")) == (
        {}, "another kernel code (kernel_sha256), machine")


def test_another_protocol_is_refused(book, kept_run):
    case, ident, _, sources = here(book / "cases" / "gated.yaml")
    assert resume.resumable(kept_run, case, ident, CPU, sources) == ({}, "another timing protocol")


def test_an_edited_case_is_refused(book, kept_run, tmp_path):
    """A claim edited since the kept run: the measured part of the case changed."""
    path = tmp_path / "cases" / "gated.yaml"
    path.parent.mkdir()
    path.write_text((book / "cases" / "gated.yaml").read_text().replace("at_least_gbps: 1.0e-6", "at_least_gbps: 2"))
    reuse, why = resume.resumable(kept_run, *here(path))
    assert reuse == {} and "measurement_sha256" in why


# --- run_case(resume=...) with stubbed children ------------------------------------------------------------------


def test_run_case_resumes_under_the_kept_runs_start_and_ceilings(book, monkeypatch):
    path = book / "cases" / "gated.yaml"
    _, seen, _ = stubbed_run(monkeypatch, path, StubExecute())
    partial = seen[3]
    assert partial.complete is False
    stub = StubExecute()
    other = {**CEILINGS, "copy_gbps": 2e3}
    result, later, events = stubbed_run(monkeypatch, path, stub, resume=partial, ceilings=other)
    reuse, _ = resume.resumable(partial, *here(path))
    assert len(reuse) == 3, "gated's three points (one crashed) and honest's first"
    assert stub.reuse and all(r == reuse for r in stub.reuse), "every variant's execute is given the kept points"
    assert result.complete is True and result.started_at == partial.started_at
    [part] = result.resumed
    assert (part.finished_at, part.points) == (partial.finished_at, 3)
    assert all(r.started_at == partial.started_at and r.resumed == result.resumed for r in later)
    assert result.hardware.measured == partial.hardware.measured, "the kept run's ceilings, not those given"
    assert result.hardware.measured.copy_gbps == CEILINGS["copy_gbps"]
    notes = [i["message"] for e, i in events if e == "note"]
    assert f"resuming {partial.started_at}: 3 points kept" in notes
    assert results.run_path(Path("runs"), result) == results.run_path(Path("runs"), partial), "the same file"

    again, _, _ = stubbed_run(monkeypatch, path, StubExecute(), resume=_with(result, complete=False))
    assert again.started_at == partial.started_at and len(again.resumed) == 2
    assert again.resumed[0] == part and again.resumed[1].finished_at == result.finished_at


def test_run_case_measures_afresh_where_the_kept_run_differs(book, monkeypatch):
    path = book / "cases" / "gated.yaml"
    _, seen, _ = stubbed_run(monkeypatch, path, StubExecute())
    stub = StubExecute()
    other = {**CEILINGS, "copy_gbps": 2e3}
    changed = _with(seen[-1], kernel_sha256="f" * 64)
    result, _, events = stubbed_run(monkeypatch, path, stub, resume=changed, ceilings=other)
    assert all(r == {} for r in stub.reuse) and result.resumed is None
    assert result.hardware.measured.copy_gbps == 2e3
    notes = [i["message"] for e, i in events if e == "note"]
    assert (f"not resuming {changed.started_at}: another kernel code (kernel_sha256); measuring afresh") in notes


# --- orchestrate.execute with kept points ----------------------------------------------------------------------------


def _tasks(path: Path, variant: str) -> list[Task]:
    return plan.plan(load_case(path), False, QUICK, Ceilings(**CEILINGS))[variant].tasks


def test_execute_asks_no_child_for_a_kept_point(book, monkeypatch):
    path = book / "cases" / "gated.yaml"
    tasks = _tasks(path, "honest")
    reuse = {resume.point_key(t.level, t.variant, t.shape, t.dtype): stub_payload(t)
             for t in tasks if t.kind == "point"}
    reuse[("kernel", "honest", "16x32", "fp32")] = Point(  # no harness of its own
        variant="honest", shape={"rows": 16, "cols": 32}, dtype="fp32", status="ok", median_us=3.0)
    reuse[resume.point_key("end_to_end", "honest", tasks[-1].shape, tasks[-1].dtype)] = Point(
        variant="honest", shape=tasks[-1].shape, dtype=tasks[-1].dtype, status="ok")
    before = copy.deepcopy(reuse)
    WORKERS.clear()
    monkeypatch.setattr(orchestrate, "Worker", InProcessWorker)
    done: list[int] = []
    out = orchestrate.execute(tasks, timeout_s=1.0, env={}, answers=object(), reuse=reuse,
                      on_done=lambda i, p: done.append(i))
    [variant] = WORKERS
    assert [t.kind for t in variant.asked] == ["end_to_end"], "the scenario is measured again; no point is"
    assert done == list(range(len(tasks)))
    for t, p in zip(tasks[:-1], out[:-1]):
        kept = reuse[resume.point_key(t.level, t.variant, t.shape, t.dtype)]
        assert p.harness.kept is True and p.model_copy(update={"harness": kept.harness}) == kept
        assert p.harness.model_dump(exclude_unset=True) == {
            **(kept.harness.model_dump(exclude_unset=True) if kept.harness else {}), "kept": True}
    assert out[-1].status == "crashed" and out[-1].harness.kept is None
    assert reuse == before, "the kept payloads are not changed"


def test_a_variant_whose_points_were_all_kept_says_so(book, monkeypatch):
    path = book / "cases" / "gated.yaml"
    kept, _, _ = stubbed_run(monkeypatch, path, StubExecute())
    WORKERS.clear()
    result, _, events = stubbed_run(monkeypatch, path, REAL_EXECUTE, resume=kept)
    variants = {i["name"]: i for e, i in events if e == "variant"}
    assert variants["gated"]["kept"] == 2 and variants["gated"]["points"] == 3, "its crash is measured again"
    assert variants["interpreted"]["kept"] == 3
    assert "3 kept from the run resumed" in command.harness_line(variants["interpreted"])
    assert "kept" not in command.harness_line({**variants["interpreted"], "kept": 0})
    asked = {(t.variant, t.level, shape_label(t.shape)) for w in WORKERS for t in w.asked}
    assert asked == {("gated", "kernel", "16x32"), ("honest", "kernel", "16x32"), ("honest", "end_to_end", "4x16")}
    by_key = {key_of(level, p): p for level, p in points(result)}
    assert by_key[("kernel", "gated", "4x32", "fp32")].harness.kept is True
    assert by_key[("kernel", "gated", "16x32", "fp32")].harness.kept is None
    assert by_key[("kernel", "gated", "4x32", "fp32")].speedup == 0.5, "speedups taken again over the kept points"


def test_a_resumed_variants_timed_share_is_of_this_sessions_wall_time(book, monkeypatch):
    """`Variant.timed_s`: "Of that [wall_s], the sum of its timed repetitions: the rest is what the harness cost"."""
    path = book / "cases" / "gated.yaml"
    kept, _, _ = stubbed_run(monkeypatch, path, StubExecute(timed_s=1000.0))
    result, _, events = stubbed_run(monkeypatch, path, REAL_EXECUTE, resume=kept)  # interpreted: all kept
    [info] = [i for e, i in events if e == "variant" and i["name"] == "interpreted"]
    assert info["kept"] == 3
    assert "harness -" not in command.harness_line(info)
    v = next(v for v in result.variants if v.name == "interpreted")
    assert 0 <= v.timed_s <= v.wall_s


# --- the real children: cut short by an exception from the checkpoint, then resumed ------------------------------


class Cut(BaseException):
    """Stands for SIGTERM's `Terminated`: raised from the checkpoint after the Kth point."""


K = 4
"""Of cut.yaml's 7 tasks (gated: 2 kernel points and a workload point; honest: the same and its scenario): the
run is cut after gated's three points and honest's first."""


@pytest.fixture(scope="module")
def real_runs(book):
    """cut.yaml through `run_case` with its children: whole, cut after K points, and resumed from the cut; with
    the tasks each asked its variants' children for (points and scenarios) and its progress events."""
    path = book / "cases" / "cut.yaml"
    asked: list[Task] = []

    class Counting(isolate.Worker):
        def request(self, task, timeout_s, room=0, grow=False):
            if isinstance(task, Task):
                asked.append(task)
            return super().request(task, timeout_s, room=room, grow=grow)

    def once(**kw):
        asked.clear()
        events: list = []
        out = orchestrate.run_case(path, quick=True, timeout_s=TIMEOUT_S, ceilings=CEILINGS,
                           progress=lambda e, i: events.append((e, i)), **kw)
        return out, events, list(asked)

    seen: list[Result] = []

    def cut(partial: Result) -> None:
        seen.append(partial)
        if len(seen) == K:
            raise Cut()

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(orchestrate, "Worker", Counting)
        whole = once()
        with pytest.raises(Cut):
            once(checkpoint=cut)
        cut_asked = list(asked)
        resumed = once(resume=seen[-1])
    return {"whole": whole, "checkpoints": seen, "cut_asked": cut_asked, "resumed": resumed}


def _rows(result: Result) -> set:
    return {(level, p.variant, shape_label(p.shape), p.dtype, p.status) for level, p in points(result)}


@pytest.mark.slow
def test_the_cut_run_leaves_k_points_in_its_last_checkpoint(real_runs):
    partial = real_runs["checkpoints"][-1]
    assert len(real_runs["checkpoints"]) == K
    assert isinstance(partial, Result) and partial.complete is False and len(points(partial)) == K
    assert {(p.variant, shape_label(p.shape)) for _, p in points(partial)} == {
        ("gated", "4x32"), ("gated", "16x32"), ("gated", "2x64"), ("honest", "4x32")}
    assert [t.variant for t in real_runs["cut_asked"]] == ["gated"] * 3 + ["honest"]


@pytest.mark.slow
def test_the_resumed_run_is_complete_and_like_an_uninterrupted_one(real_runs):
    whole, _, whole_asked = real_runs["whole"]
    result, events, _ = real_runs["resumed"]
    partial = real_runs["checkpoints"][-1]
    assert whole.complete is True and result.complete is True
    assert _rows(result) == _rows(whole)
    assert {s for *_, s in _rows(whole)} == {"ok"}
    assert [c.held for c in result.claims] == [c.held for c in whole.claims] == [True]
    assert result.started_at == partial.started_at
    [part] = result.resumed
    assert part.points == K and part.finished_at == partial.finished_at
    assert results.run_path(Path("runs"), result) == results.run_path(Path("runs"), partial)
    assert whole.resumed is None and len(whole_asked) == 7
    assert any(e == "note" and i["message"] == f"resuming {partial.started_at}: {K} points kept" for e, i in events)


@pytest.mark.slow
def test_the_kept_points_are_the_cut_runs_own(real_runs):
    result, _, _ = real_runs["resumed"]
    partial = real_runs["checkpoints"][-1]
    before = {key_of(level, p): p for level, p in points(partial)}
    for level, p in points(result):
        key = key_of(level, p)
        if key in before:
            assert p.harness.kept is True
            assert (p.median_us, p.max_rel_err, p.status) == (before[key].median_us, before[key].max_rel_err,
                                                               before[key].status), "not measured again"
        else:
            assert not p.harness.kept and p.harness.wall_s > 0
    assert sum(1 for _, p in points(result) if p.harness.kept) == K


@pytest.mark.slow
def test_the_resumed_run_asks_its_children_only_for_what_was_not_kept(real_runs):
    result, events, asked = real_runs["resumed"]
    tasks = [i for e, i in events if e == "task"]
    kept = [i["task"] for i in tasks if i["record"].harness.kept]
    measured = [i["task"] for i in tasks if not i["record"].harness.kept]
    assert len(kept) == K and len(kept) + len(measured) == 7
    assert {(t.variant, t.level, shape_label(t.shape)) for t in measured} == {
        ("honest", "kernel", "16x32"), ("honest", "workload", "2x64"), ("honest", "end_to_end", "4x16")}
    assert sorted((t.variant, t.level, shape_label(t.shape)) for t in asked) == sorted(
        (t.variant, t.level, shape_label(t.shape)) for t in measured), "no child asked for a kept point"
    variants = {i["name"]: i for e, i in events if e == "variant"}
    assert (variants["gated"]["points"], variants["gated"]["kept"]) == (3, 3)
    assert (variants["honest"]["points"], variants["honest"]["kept"]) == (4, 1)


# --- casebook run: SIGTERM, then --resume --------------------------------------------------------------------------


def cli_env(root: Path, kernels: Path) -> dict:
    """A cache holding synthetic ceilings for this CPU (as conftest's small_book), the book's kernels."""
    cache = root / "cache"
    cache.mkdir()
    ident = hardware.identify()
    (cache / f"ceilings-{hardware.ceilings_key(ident)}.json").write_text(json.dumps(
        {**CEILINGS, "version": hardware.CEILINGS_VERSION, "torch": torch.__version__, "slug": ident.slug}))
    env = {**os.environ, "CASEBOOK_CACHE": str(cache), "CASEBOOK_KERNELS_PATH": str(kernels), "NO_COLOR": "1",
           "COLUMNS": "1000", "TERM": "dumb"}
    env.pop("CUDA_VISIBLE_DEVICES", None)
    return env


def casebook_run(args: list[str], cwd: Path, env: dict, **kw) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "casebook.cli", "run", *args], cwd=cwd, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kw)


def wait_for(found, what: str, proc: subprocess.Popen | None = None, limit_s: float = 300.0):
    """Poll `found()` until it gives something; fail (with the run's output) where the run ends first. The limit
    is a hang's, not a speed's."""
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        got = found()
        if got:
            return got
        if proc is not None and proc.poll() is not None:
            out, err = proc.communicate()
            pytest.fail(f"the run ended ({proc.returncode}) before {what}:\n{out[-3000:]}\n{err[-3000:]}")
        time.sleep(0.02)
    if proc is not None:
        proc.kill()
    pytest.fail(f"no {what} within {limit_s:.0f} s")


def gone(pid: int) -> bool:
    """No such process, or one that has exited and waits to be reaped."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except (OSError, IndexError):
        return True


@pytest.mark.slow
def test_sigterm_keeps_the_checkpoint_and_resume_completes_it(tmp_path):
    kernels = write_book(tmp_path, gate_open=False)
    env = cli_env(tmp_path, kernels)
    slug = hardware.identify().slug
    folder = tmp_path / "cache" / "runs" / slug / "cut"
    proc = casebook_run(["cases/cut.yaml"], tmp_path, env)
    try:
        [waiting] = wait_for(lambda: list(kernels.glob("waiting-*")), "the gated child waiting at its gate", proc)
        [partial] = wait_for(lambda: list(folder.glob("*.json.partial")), "a checkpoint", proc)
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 143, out[-3000:] + err[-3000:]
    assert "casebook run: terminated (SIGTERM); every child process ended; " in err
    assert f"what it measured is kept in {partial} (nothing stored in results/)" in err
    assert "`casebook run cases/cut.yaml --resume` goes on from it" in err
    assert "Traceback" not in err
    child = int(waiting.name.split("-")[1])
    wait_for(lambda: gone(child), "the gated child's end")
    cut = results.load(partial)
    assert cut.complete is False and [(p.variant, shape_label(p.shape)) for p in cut.kernel_level] == [
        ("gated", "4x32")], "held at gated's second point: one measured"
    assert not list(folder.glob(".*.tmp")) and not list(folder.glob("*.json"))

    (kernels / "gate").touch()
    resumed = casebook_run(["cases/cut.yaml", "--resume"], tmp_path, env)
    out, err = resumed.communicate(timeout=600)
    assert resumed.returncode in (0, 1), out[-3000:] + err[-3000:]
    assert f"resuming {partial}" in err and f"resuming {cut.started_at}: 1 points kept" in err
    done = partial.with_name(partial.name.removesuffix(results.PARTIAL))
    assert f"this run: {done}" in err
    assert done.exists() and not partial.exists() and sorted(p.name for p in folder.iterdir()) == [done.name]
    result = results.load(done)
    assert result.complete is True and result.started_at == cut.started_at
    assert [(r.points, r.finished_at) for r in result.resumed] == [(1, cut.finished_at)]
    assert [p.harness.kept for p in result.kernel_level] == [True, None, None, None]
    assert {p.status for p in result.kernel_level + result.workload_level.points} == {"ok"}
    # 1 only where the level-3 timing was disturbed (a loaded machine): what the result says, not the resume
    assert resumed.returncode == (1 if assemble.failed(result) else 0), result.end_to_end


def test_the_printed_resume_command_keeps_the_runs_flags(tmp_path, monkeypatch):
    """The printed command goes on from the run cut short: a --quick run's checkpoint is refused by a run of the
    default protocol (`resumable`: another timing protocol), so the command must keep --quick."""
    partial = tmp_path / "cut.json.partial"

    def cut_short(case, *, kept, **kw):
        kept.append(partial)
        raise command.Terminated()

    err = io.StringIO()
    monkeypatch.setattr(command, "console", Console(file=err, width=1000))
    monkeypatch.setattr(command, "_run", cut_short)
    argv = ["casebook", "run", str(SOFTMAX), "--quick"]
    code = command.main(SOFTMAX, variants=None, quick=True, counters=False, json_out=False,
                        results_dir=tmp_path / "results", timeout=600.0, argv=argv)
    assert code == 143 and str(partial) in err.getvalue()
    [printed] = re.findall(r"`(casebook run [^`]*)` goes on from it", err.getvalue())
    assert printed.split()[2:] == [str(SOFTMAX), "--quick", "--resume"], printed


def test_a_run_cut_short_before_its_first_point_says_nothing_was_kept(tmp_path, monkeypatch):
    def cut_short(case, *, kept, **kw):
        raise command.Terminated()

    err = io.StringIO()
    monkeypatch.setattr(command, "console", Console(file=err, width=1000))
    monkeypatch.setattr(command, "_run", cut_short)
    previous = signal.getsignal(signal.SIGTERM)
    code = command.main(SOFTMAX, variants=None, quick=False, counters=False, json_out=False,
                        results_dir=tmp_path / "results", timeout=600.0)
    assert code == 143
    assert "terminated (SIGTERM); every child process ended; nothing was measured yet, nothing stored" in err.getvalue()
    assert signal.getsignal(signal.SIGTERM) is previous, "the handler is put back"


def test_sigterm_is_raised_as_terminated_where_the_run_stands(tmp_path, monkeypatch):
    """The handler main installs turns SIGTERM into `Terminated`, a BaseException: no `except Exception` in the
    run swallows it on the way out."""
    def signalled(case, *, kept, **kw):
        kept.append(tmp_path / "x.json.partial")
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)
        raise AssertionError("SIGTERM did not interrupt the run")

    err = io.StringIO()
    monkeypatch.setattr(command, "console", Console(file=err, width=1000))
    monkeypatch.setattr(command, "_run", signalled)
    assert issubclass(command.Terminated, BaseException) and not issubclass(command.Terminated, Exception)
    code = command.main(SOFTMAX, variants=None, quick=False, counters=False, json_out=False,
                        results_dir=tmp_path / "results", timeout=600.0)
    assert code == 143 and "x.json.partial" in err.getvalue()


# --- last_cut_short --------------------------------------------------------------------------------------------------


def _partial(case_id: str, started: str, slug: str | None = None, complete: bool = False) -> Result:
    return Result.model_validate(empty_result(slug=slug or hardware.identify().slug, case_id=case_id,
                                              started_at=started, complete=complete))


def test_last_cut_short_finds_the_newest_checkpoint_of_the_case_here(tmp_path, monkeypatch):
    monkeypatch.setattr(paths, "CACHE_DIR", tmp_path)
    case = load_case(SOFTMAX)
    assert command.last_cut_short(case) is None, "no runs folder at all"
    runs = results.runs_dir()
    assert runs == tmp_path / "runs"

    def write(result: Result, mtime: float) -> Path:
        path = results.save_as(result, results.run_path(runs, result))
        os.utime(path, (mtime, mtime))
        return path

    old = write(_partial(case.id, "2026-12-01T00:00:00+00:00"), 1_000_000)
    new = write(_partial(case.id, "2026-11-30T00:00:00+00:00"), 2_000_000)  # started earlier, cut later
    write(_partial(case.id, "2026-12-02T00:00:00+00:00", complete=True), 3_000_000)  # complete: not cut short
    write(_partial("another_case", "2026-12-03T00:00:00+00:00"), 4_000_000)
    write(_partial(case.id, "2026-12-04T00:00:00+00:00", slug="another-machine"), 5_000_000)
    assert old.name.endswith(".json.partial") and new.parent == old.parent
    path, result = command.last_cut_short(case)
    assert path == new and result == results.load(new) and result.started_at == "2026-11-30T00:00:00+00:00"

    broken = old.with_name("20261205T000000Z.json.partial")
    broken.write_text("{ not json")
    os.utime(broken, (6_000_000, 6_000_000))
    newer_format = old.with_name("20261206T000000Z.json.partial")
    newer_format.write_text(json.dumps({**results.document(result), "schema_version": 10**6}))
    os.utime(newer_format, (7_000_000, 7_000_000))
    invalid = old.with_name("20261207T000000Z.json.partial")
    invalid.write_text(json.dumps({"schema_version": 2, "case_id": case.id}))
    os.utime(invalid, (8_000_000, 8_000_000))
    assert command.last_cut_short(case)[0] == new, "the unreadable ones are passed over"

    for p in (old, new):
        p.unlink()
    assert command.last_cut_short(case) is None, "only unreadable ones left"
