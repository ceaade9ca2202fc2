"""The result document of a run from what it measured: the points, the three levels, the claims, the
protocol and the sources that tie it to its code."""

from __future__ import annotations

import datetime as dt
import math
import os
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path

from casebook import claims as claims_mod
from casebook import levels, stability
from casebook.case import Case
from casebook.claims import Unpaired
from casebook.provenance import (
    case_sha256,
    imported_closure,
    kernel_file,
    kernel_sha256,
    measurement_sha256,
)
from casebook.result import (
    RESULT_SCHEMA_VERSION,
    Ceilings,
    ClaimPairedTiming,
    Hardware,
    IntensityCheck,
    Machine,
    Point,
    Result,
    ResumedPart,
    TimingProtocol,
    VariantOutcome,
    WorkloadResult,
    shape_label,
)
from casebook.run import hardware, interference
from casebook.run.answers import Answers
from casebook.run.bench import (
    HOST_SLACK_MARGIN,
    HOST_SLACK_US,
    L2_FLUSH_METHOD,
    PIPELINED_CALLS,
    Protocol,
    l2_flush_bytes,
)
from casebook.run.child import Task
from casebook.run.distributed import LOCKSTEP
from casebook.run.messages import Answer, Stopped
from casebook.run.plan import CPU_MALLOC, SEED, Group, traffic_task
from casebook.tolerance import ROW_TOLERANCE, TOLERANCE
from casebook.traffic import INTENSITY_TOLERANCE


def command_line(path: Path, only: list[str] | None, quick: bool, counters: bool,
                 argv: list[str] | None = None) -> str:
    """The command a result names: `argv` as one shell line where the caller gave it, else spelled from the
    run's options."""
    if argv:
        return shlex.join(argv)
    return (f"casebook run {path.as_posix()}" + (" --quick" if quick else "")
            + "".join(f" --variant {v}" for v in only or []) + (" --counters" if counters else ""))


def intensity_check(case: Case, answer: Answer | Stopped) -> IntensityCheck:
    """The declared arithmetic intensity beside the traffic model's at `traffic_task`'s shape and dtype."""
    task = traffic_task(case)
    at = {"shape": task.shape, "dtype": task.dtype, "declared": case.bottleneck.arithmetic_intensity,
          "tolerance": INTENSITY_TOLERANCE}
    traffic = answer.traffic if isinstance(answer, Answer) else None
    if traffic is None or not traffic.bytes:
        return IntensityCheck(**at, error=answer.error if isinstance(answer, Stopped) else
                              "the traffic model gives no bytes")
    if not math.isfinite(traffic.flops / traffic.bytes):
        return IntensityCheck(**at, error="the traffic model gives no finite FLOPs")
    modelled = traffic.flops / traffic.bytes
    if at["declared"] is None or modelled <= 0:
        return IntensityCheck(**at, modelled=modelled)
    difference = at["declared"] / modelled - 1
    return IntensityCheck(**at, modelled=modelled, difference=difference,
                          flagged=abs(difference) > INTENSITY_TOLERANCE)


@dataclass
class Run:
    """What a run holds as it goes, for its result: the case and where it runs, how it was asked for, the sources
    and ceilings it is tied to, and what it has measured beside the variants' points (`plan.Group`)."""

    path: Path
    case: Case
    ident: Machine
    """Which machine (`hardware.identify`); a multi-device case's topology set once measured."""
    command: str
    argv: list[str] | None
    started: str
    sources: dict
    """`sources_of`'s hashes."""
    ceilings: Ceilings
    env: dict
    """`hardware.environment`'s, with the clocks, load and threads at the start."""
    resumed: list[ResumedPart] = field(default_factory=list)
    reuse: dict = field(default_factory=dict)
    """Points of a run cut short that this one keeps, by `resume.point_key`."""
    loaded: set = field(default_factory=set)
    """Kernel modules the children imported."""
    crossing: str | None = None
    answers: Answers | None = None
    intensity: IntensityCheck | None = None
    pairs: list[tuple[Task, ClaimPairedTiming | Unpaired]] = field(default_factory=list)

    @property
    def on_gpu(self) -> bool:
        return self.ident.kind == "gpu"


def assemble(run: Run, protocol: Protocol, groups: dict[str, Group], complete: bool) -> Result:
    """The result from the variants measured so far: points, the three levels, the claims. The points are the
    judge's records, set in place here (their level's speedup, weight and stability); nothing is validated again
    but the run's own parts."""
    case, on_gpu = run.case, run.on_gpu
    kernel_points, workload_points, scenarios, variants = [], [], {}, []
    weights = {shape_label(w.shape): w for w in (case.levels.workload.shapes if on_gpu
                                                 else case.levels.workload.cpu_shapes)}
    for name, g in groups.items():
        v = g.variant
        first_calls = [p.first_call_s for _, p in g.outcomes if isinstance(p, Point) and p.first_call_s is not None]
        variants.append(VariantOutcome(
            name=name, note=v.note, backends=list(v.backends), device=g.device,
            mode="timed" if g.timed else ("checked" if g.device else "skipped"),
            first_call_s=first_calls[0] if first_calls else None,
            first_call_s_max=max(first_calls) if first_calls else None,
            **({"wall_s": g.wall_s, "timed_s": g.timed_s} if g.wall_s is not None else {})))
        if g.device is None:
            shapes = case.levels.kernel.shapes if on_gpu else case.levels.kernel.cpu_shapes
            kernel_points += [Point(variant=name, shape=s, dtype=d, status="skipped",
                                    error=f"no backend of {list(v.backends)} on this machine")
                              for s in shapes for d in case.levels.kernel.dtypes]
            continue
        for task, p in g.outcomes:
            if task.kind == "end_to_end":
                scenarios[name] = p
                continue
            point = p.model_copy()
            if unstable := stability.reasons(point, task.device):
                point.unstable = list(dict.fromkeys((point.unstable or []) + unstable))  # a kept point's once
            if task.level == "kernel":
                kernel_points.append(point)
            else:
                w = weights[shape_label(task.shape)]
                point.weight, point.source = w.weight, w.source
                workload_points.append(point)

    for points in (kernel_points, workload_points):
        for p, s in zip(points, levels.speedups(points, case.kernel.baseline)):
            if s:
                p.speedup = s
    workload = WorkloadResult(dtype=case.levels.workload.dtype, description=case.levels.workload.description,
                              points=workload_points,
                              summary=levels.workload_summary(workload_points, case.kernel.baseline))
    e2e = levels.end_to_end(case.levels.end_to_end, scenarios, on_gpu)
    env = {**run.env, "clocks_end": hardware.clocks(), "load_average_end": interference.load_average()}
    paired = {claims_mod.pair_key(t.variant, t.over, t.shape, t.dtype): p for t, p in run.pairs}
    return Result(
        schema_version=RESULT_SCHEMA_VERSION, case_id=case.id, **run.sources, command=run.command,
        complete=complete, started_at=run.started, finished_at=now(),
        hardware=Hardware(**run.ident.given(), measured=run.ceilings), environment=env,
        protocol=timing_protocol(run, protocol), variants=variants, kernel_level=kernel_points,
        workload_level=workload, end_to_end=e2e, counters=[],
        stability=stability.summary(kernel_points + workload_points), arithmetic_intensity=run.intensity,
        claims=claims_mod.evaluate(case, run.ident.slug, kernel_points, workload, e2e, paired),
        **({"argv": list(run.argv)} if run.argv else {}), **({"resumed": run.resumed} if run.resumed else {}))


def timing_protocol(run: Run, protocol: Protocol) -> TimingProtocol:
    """How the run timed and checked its points, in numbers and in words."""
    case, on_gpu = run.case, run.on_gpu
    dtypes = {*case.levels.kernel.dtypes, case.levels.workload.dtype}
    doc = {**protocol.model_dump(), "cache": case.levels.kernel.cache, "graph": case.levels.kernel.graph,
           "timer": "cuda events" if on_gpu else "time.perf_counter_ns", "seed": SEED,
           "tolerances": {d: TOLERANCE[d] for d in dtypes}, "row_tolerances": {d: ROW_TOLERANCE[d] for d in dtypes},
           "isolation": "one child process per variant, which only runs it; the reference in another, "
                        "which never runs a variant; outputs judged and times summarised in the parent; a "
                        "crash or hang is recorded and the rest goes on" + (
                            "" if on_gpu else "; glibc's allocator kept warm in a child timed on the CPU "
                            f"(GLIBC_TUNABLES={os.environ.get('GLIBC_TUNABLES') or CPU_MALLOC})"),
           "transport": run.crossing,
           "correctness": "2 calls on fresh random inputs before timing, 2 timed repetitions sampled as they "
                          "returned and 1 kept after an input set was blended at random places, 1 call "
                          "after timing on new values in the same tensors; float64 "
                          "reference; normwise and per-row relative error; NaN/Inf fail; the allocator "
                          "poisoned before every call alike; inputs checked unmodified; each output's "
                          "checksum taken as it was copied, checked where it is judged"}
    if case.kernel.devices > 1:
        doc.update(rank_barrier=True, ranks=LOCKSTEP)
    if on_gpu:
        doc["host_slack"] = (f"device-side delay before each repetition: max({HOST_SLACK_US:g} us, "
                             f"{HOST_SLACK_MARGIN:g} x the p90 of the warm-up calls' host times, each from "
                             "a synchronised start)")
        doc["host_issue"] = ("the lesser of the warm-up calls' median host time from a synchronised start "
                             f"and the median per call of up to {PIPELINED_CALLS} calls issued back to back")
        if doc["cache"] == "cold":
            doc["l2_flush"] = L2_FLUSH_METHOD
        try:
            doc["l2_flush_bytes"] = l2_flush_bytes()
        except Exception:  # the flush size is a record, not a requirement
            pass
    return TimingProtocol(**doc)


def sources_of(path: Path, case, start: dict | None = None, loaded: set | None = None) -> dict:
    """The kernel file and the hashes that tie a result to what it ran, taken as the run starts: a case
    or kernel edited while it runs (its variants import the module one by one) leaves the result stale,
    not falsely current. Again at the end with `loaded`, the kernel modules the children imported (a
    module imported at run time, by name, is no static import): the hash then covers them too, and the
    result names them (`kernel_modules`); where the statically imported part changed meanwhile, the start's
    hash is kept, and the result reads stale."""
    module = case.kernel.module
    source = kernel_file(module)  # where the children import it from (CASEBOOK_KERNELS_PATH included)
    now = {"case_sha256": case_sha256(path), "kernel_file": source.name,
           "kernel_sha256": kernel_sha256(module, source.parent), "measurement_sha256": measurement_sha256(case)}
    if start is None:
        return now
    static = imported_closure(module, source.parent)
    extra = sorted(m for m in (loaded or set()) - static if re.fullmatch(r"[a-z][a-z0-9_]*", m))
    if now["kernel_sha256"] != start["kernel_sha256"] or not extra:
        return start
    return {**start, "kernel_sha256": kernel_sha256(module, source.parent, extra=extra), "kernel_modules": extra}


def now(timespec: str = "seconds") -> str:
    """UTC now, ISO 8601. A run's start to the microsecond: it names the run's file (`results.run_path`), and two
    runs of a case started in the same second are two runs."""
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec=timespec)


def failed(result: Result) -> bool:
    """True when any check failed, any variant crashed or timed out, or any claim failed."""
    points = result.kernel_level + result.workload_level.points
    bad = any(p.status in ("failed", "crashed", "timeout") for p in points)
    bad |= result.end_to_end.status == "failed"
    return bad or any(c.held is False for c in result.claims)
