"""The arithmetic of levels 2 and 3, pure: speedups over the baseline at each point, the workload's weighted
geomean and worst shape, and the end-to-end scenario's share, Amdahl bound and measured speedup. No I/O, no
timing: numbers in, numbers out (docs/method.md, "Three levels")."""

from __future__ import annotations

import math
from collections import Counter
from typing import Callable

from casebook.case import EndToEndLevel
from casebook.result import EndToEndResult, HarnessCost, Point, Record, WorkloadSummary, shape_label
from casebook.stats import weighted_geomean
from casebook.tolerance import TOLERANCE

REGRESSION = 0.98
"""A workload speedup under this counts as a regression (2% allows for run-to-run noise)."""

SHARE_MAX = 1.05
"""The kernel's share of its scenario past which the timings are disturbed: the kernel alone cannot take
longer than the computation it is part of."""


class Scenario(Record):
    """One variant's scenario (level 3) as the judge summarised it (`run.judge.end_to_end`), before level 3 sets
    the baseline's beside the variant's: not stored."""

    status: str
    error: str | None = None
    variant: str | None = None
    scenario_us: float | None = None
    scenario_p10_us: float | None = None
    scenario_p90_us: float | None = None
    kernel_us: float | None = None
    kernel_p10_us: float | None = None
    kernel_p90_us: float | None = None
    fingerprint: list[float] | None = None
    after_fingerprint: list[float] | None = None
    timed_outputs_checked: int | None = None
    harness: HarnessCost | None = None


def speedups(points: list[Point], baseline: str) -> list[float | None]:
    """Each point's speedup: the baseline's median at the same shape and dtype over its own; None where either
    is untimed."""
    base = {(shape_label(p.shape), p.dtype): p.median_us for p in points if p.variant == baseline}
    out = []
    for p in points:
        b = base.get((shape_label(p.shape), p.dtype))
        out.append(b / p.median_us if b and p.median_us else None)
    return out


def workload_summary(points: list[Point], baseline: str) -> list[WorkloadSummary]:
    """Per variant over the workload's points (each with `speedup` and `weight`): shapes, how many timed, and
    where every shape is timed, the weighted geomean, the worst shape and the regressions (left unset otherwise,
    as the stored summary leaves them out)."""
    out = []
    for name in dict.fromkeys(p.variant for p in points):
        mine = [p for p in points if p.variant == name]
        timed = [p for p in mine if p.speedup]
        if not timed or len(timed) < len(mine):
            out.append(WorkloadSummary(variant=name, shapes=len(mine), timed=len(timed)))
            continue
        worst = min(timed, key=lambda p: p.speedup)
        out.append(WorkloadSummary(
            variant=name, shapes=len(mine), timed=len(timed),
            geomean_speedup=weighted_geomean([p.speedup for p in timed], [p.weight for p in timed]),
            worst_speedup=worst.speedup, worst_shape=worst.shape,
            regressions=[p.shape for p in timed if p.speedup < REGRESSION and name != baseline]))
    return out


def regressions(row: WorkloadSummary, points: list[Point], label: Callable[[dict], str] = shape_label) -> str:
    """A workload summary's regressions in words, for the run's table and the site alike: the shapes slower than
    the baseline, and the shapes with no speedup (the variant only checked, failed, crashed or skipped there, or
    its baseline untimed), with the first reason given. 'none' only where every shape was timed and none is
    slower: a variant never timed has no clean bill."""
    slower = ", ".join(label(s) for s in row.regressions or [])
    mine = [p for p in points if p.variant == row.variant]
    untimed = [p for p in mine if p.status != "ok" or p.speedup is None]
    if not untimed:
        return slower or "none"
    whys = Counter(_untimed_why(p) for p in untimed)
    counts = ", ".join(f"{why} at {n} of {len(mine)} shapes" for why, n in whys.items())
    first = next((p.error for p in untimed if p.error), None)
    head = "never timed" if len(untimed) == len(mine) else "not timed"
    return (f"{head}: {counts}" + (f" (first: {first})" if first else "")
            + (f"; slower at {slower}" if slower else ""))


def _untimed_why(p: Point) -> str:
    if p.status == "checked":
        return "checked only"
    return "its baseline untimed" if p.status == "ok" else str(p.status)


def amdahl(share: float, kernel_speedup: float) -> float:
    """The scenario's speedup when a kernel that takes `share` of it gets `kernel_speedup` faster."""
    return 1 / ((1 - share) + share / kernel_speedup)


def rel_diff(a: list[float], b: list[float]) -> float:
    """||a - b|| / ||a||: how far two scenario fingerprints differ."""
    num = math.sqrt(sum((x - y) ** 2 for x, y in zip(a, b)))
    return num / (math.sqrt(sum(x * x for x in a)) or 1.0)


def end_to_end(spec: EndToEndLevel, runs: dict[str, Scenario], on_gpu: bool) -> EndToEndResult:
    """Level 3 from the scenario's timings of the baseline and the variant (`runs`, by variant name): the
    kernel's share of the baseline, the kernel speedup, Amdahl's bound and the measured speedup, and whether
    the two scenarios' outputs agree. A number is set only where it was measured, as the stored level leaves the
    others out."""
    head = dict(description=spec.description, shape=spec.shape if on_gpu else spec.cpu_shape, dtype=spec.dtype,
                baseline=spec.baseline, variant=spec.variant)
    base, var = runs.get(spec.baseline), runs.get(spec.variant)
    if base is None or base.status != "ok":
        return EndToEndResult(**head, status="skipped" if base is None else "failed",
                              error=_why(base, f"baseline {spec.baseline} cannot be timed here"))
    share = base.kernel_us / base.scenario_us
    head.update(baseline_us=base.scenario_us, baseline_kernel_us=base.kernel_us, kernel_share=share)
    if share > SHARE_MAX:
        return EndToEndResult(**head, status="failed", error=f"kernel share {share:.0%} of the scenario: timings "
                                                             "disturbed (a loaded machine?); run again")
    if var is None or var.status != "ok":
        return EndToEndResult(**head, status="partial",
                              error=_why(var, f"variant {spec.variant} cannot be timed here"))
    if (mine := var.kernel_us / var.scenario_us) > SHARE_MAX:
        return EndToEndResult(**head, status="failed", error=f"the variant's kernel share {mine:.0%} of its "
                                                             "scenario: its kernel timed alone took longer than the "
                                                             "whole; run again")
    kernel_speedup = base.kernel_us / var.kernel_us
    bound = amdahl(share, kernel_speedup)
    measured = base.scenario_us / var.scenario_us
    # the first outputs, and those after timing on new values in the same tensors (an answer kept by the inputs'
    # memory is stale there)
    diff = max(rel_diff(base.fingerprint, var.fingerprint), rel_diff(base.after_fingerprint, var.after_fingerprint))
    agree = diff <= 2 * TOLERANCE[spec.dtype]
    head.update(variant_us=var.scenario_us, variant_kernel_us=var.kernel_us, kernel_speedup=kernel_speedup,
                amdahl_speedup=bound, measured_speedup=measured, gap=measured / bound - 1, outputs_rel_diff=diff)
    if not agree:
        return EndToEndResult(**head, status="failed", error=f"scenario outputs differ between {spec.baseline} and "
                                                             f"{spec.variant} by {diff:.3g}")
    return EndToEndResult(**head, status="ok")


def _why(run: Scenario | None, otherwise: str) -> str:
    """Why a scenario was not timed: its own error, else `otherwise` (no run, or one that gave no reason)."""
    return run.error if run is not None and run.error is not None else otherwise
