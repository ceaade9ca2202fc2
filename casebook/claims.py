"""A case's claims, checked against what the run measured: held, failed, or not applicable here."""

from __future__ import annotations

from dataclasses import dataclass

from casebook.case import Case, LatencyClaim, MemoryClaim, RegimeClaim, RoofClaim, SpeedupClaim, ThroughputClaim, Where
from casebook.result import ClaimOutcome, ClaimPairedTiming, EndToEndResult, Point, WorkloadResult, shape_label
from casebook.stats import weighted_geomean


@dataclass(frozen=True)
class Unpaired:
    """A paired timing that gave no rounds (`run.judge.pair`): its status and why."""

    status: str
    error: str = ""


Paired = dict[tuple, ClaimPairedTiming | Unpaired]
"""The run's paired timings by `pair_key`: the rounds of each that was timed, or why it was not."""


def _selected(points: list[Point], variant: str, where: Where) -> list[Point]:
    return [p for p in points if p.variant == variant
            and (where.dtypes is None or p.dtype in where.dtypes)
            and (where.shapes is None or p.shape in where.shapes)]


def _label(p: Point) -> str:
    return f"{shape_label(p.shape)} {p.dtype}"


def _speedups(points: list[Point], variant: str, over: str, where: Where) -> list[tuple[Point, float | None]]:
    """(point, speedup of variant over `over` at the same shape and dtype) for each selected point."""
    base = {(shape_label(p.shape), p.dtype): p for p in points if p.variant == over}
    out = []
    for p in _selected(points, variant, where):
        b = base.get((shape_label(p.shape), p.dtype))
        ok = p.median_us and b is not None and b.median_us
        out.append((p, b.median_us / p.median_us if ok else None))
    return out


def pair_key(variant: str, over: str, shape: dict, dtype: str) -> tuple:
    """How a paired timing is found: the claim's variant, the one it is measured against, the point."""
    return variant, over, shape_label(shape), dtype


def evaluate(case: Case, hardware_slug: str, kernel_points: list[Point], workload: WorkloadResult,
             end_to_end: EndToEndResult, paired: Paired | None = None) -> list[ClaimOutcome]:
    """Each claim's verdict. `paired`: the run's paired timings (`child._pair`) by `pair_key`; a kernel-level
    speedup claim whose every point has one timed is judged on them."""
    return [_evaluate(c, hardware_slug, kernel_points, workload, end_to_end, paired or {}) for c in case.claims]


def _verdict(claim, held: bool | None, detail: str, paired: list[ClaimPairedTiming] | None = None) -> ClaimOutcome:
    """The claim's outcome; `paired` set only where it was judged on paired timings (the stored verdict has no
    `paired` otherwise)."""
    head = dict(text=claim.text, kind=claim.kind, variant=claim.variant, held=held, detail=detail)
    return ClaimOutcome(**head) if paired is None else ClaimOutcome(**head, paired=paired)


def _evaluate(claim, slug: str, kernel_points: list[Point], workload: WorkloadResult, e2e: EndToEndResult,
              paired: Paired) -> ClaimOutcome:
    if claim.hardware is not None and slug not in claim.hardware:
        return _verdict(claim, None, f"not applicable on {slug} (claimed for {', '.join(claim.hardware)})")
    if isinstance(claim, SpeedupClaim):
        return _speedup(claim, kernel_points, workload, e2e, paired)
    pts = _selected(kernel_points, claim.variant, claim.where)
    if not pts:
        return _verdict(claim, False, "no level-1 point matches this claim")
    if isinstance(claim, MemoryClaim):
        return _memory(claim, pts, kernel_points)
    unmeasured = [p for p in pts if p.status != "ok"]
    if unmeasured:
        return _verdict(claim, False, f"not measured at {_label(unmeasured[0])}: {unmeasured[0].status}")
    if isinstance(claim, RegimeClaim):
        off = [f"{_label(p)} is {p.regime}" for p in pts if p.regime != claim.regime]
        return _verdict(claim, not off, "; ".join(off) if off else f"{claim.regime} at all {len(pts)} points")
    if isinstance(claim, RoofClaim):
        worst = min(pts, key=lambda p: p.roof_fraction)
        return _verdict(claim, worst.roof_fraction >= claim.at_least,
                        f"lowest {worst.roof_fraction:.1%} of roof at {_label(worst)} (need {claim.at_least:.0%})")
    if isinstance(claim, ThroughputClaim):
        if claim.at_least_gbps is not None:
            rate, need, unit = (lambda p: p.gbps), claim.at_least_gbps, "GB/s"
        else:
            rate, need, unit = (lambda p: p.tflops), claim.at_least_tflops, "TFLOP/s"
        worst = min(pts, key=rate)
        return _verdict(claim, rate(worst) >= need,
                        f"lowest {rate(worst):.0f} {unit} at {_label(worst)} (need {need:g})")
    if isinstance(claim, LatencyClaim):
        return _latency(claim, pts)
    raise TypeError(f"unknown claim kind {claim.kind}")


def kernels_per_call(p: Point) -> int | None:
    """Kernels one call of a point ran, launched directly or replayed in a graph; None where not counted."""
    if p.launches is None or p.launches.counted is False:
        return None
    return (p.launches.direct + p.launches.graph) or None


def _latency(claim: LatencyClaim, pts: list[Point]) -> ClaimOutcome:
    if claim.per == "call":
        worst = max(pts, key=lambda p: p.median_us)
        return _verdict(claim, worst.median_us <= claim.at_most_us,
                        f"slowest {worst.median_us:.2f} us at {_label(worst)} (need at most {claim.at_most_us:g})")
    uncounted = [p for p in pts if kernels_per_call(p) is None]
    if uncounted:
        return _verdict(claim, False, f"kernels per call not counted at {_label(uncounted[0])}")
    worst = max(pts, key=lambda p: p.median_us / kernels_per_call(p))
    n = kernels_per_call(worst)
    per = worst.median_us / n
    return _verdict(claim, per <= claim.at_most_us,
                    f"slowest {per:.2f} us a kernel at {_label(worst)} ({worst.median_us:.1f} us over {n} kernels; "
                    f"need at most {claim.at_most_us:g})")


def _memory(claim: MemoryClaim, pts: list[Point], kernel_points: list[Point]) -> ClaimOutcome:
    """The worst ratio of the variant's peak memory to its inputs' bytes (or to `of`'s peak) over the points;
    not applicable where no point has its memory measured (a CPU), failed where only some have."""
    measured = [p for p in pts if p.peak_memory_bytes is not None]
    if not measured:
        return _verdict(claim, None, "peak memory not measured on this machine (a GPU's allocator counts it)")
    if len(measured) < len(pts):
        p = next(p for p in pts if p.peak_memory_bytes is None)
        return _verdict(claim, False, f"peak memory not measured at {_label(p)}: {p.status}")
    other = {(shape_label(p.shape), p.dtype): p.peak_memory_bytes for p in kernel_points if p.variant == claim.of}
    ratios = []
    for p in pts:
        base = p.input_bytes if claim.of == "inputs" else other.get((shape_label(p.shape), p.dtype))
        if not base:
            return _verdict(claim, False, f"no {claim.of} bytes to compare with at {_label(p)}")
        ratios.append((p.peak_memory_bytes / base, p))
    r, p = max(ratios, key=lambda rp: rp[0])
    of = "its inputs' bytes" if claim.of == "inputs" else f"{claim.of}'s peak"
    return _verdict(claim, r <= claim.at_most,
                    f"largest {r:.3g}x {of} at {_label(p)} ({p.peak_memory_bytes / 2**20:.1f} MiB; need at most "
                    f"{claim.at_most:g}x)")


def _x(value: float, need: float) -> str:
    """A speedup printed to as many decimals as its threshold has (at least two), so that a verdict
    never reads "0.95x, need 0.9524x: held"."""
    decimals = max(2, len(f"{need:g}".partition(".")[2]))
    return f"{value:.{decimals}f}x"


def _speedup(claim: SpeedupClaim, kernel_points: list[Point], workload: WorkloadResult, e2e: EndToEndResult,
             paired: Paired) -> ClaimOutcome:
    need = claim.at_least
    if claim.level == "end_to_end":
        if e2e.status != "ok" or not e2e.measured_speedup:
            why = e2e.error if e2e.error is not None else e2e.status
            return _verdict(claim, False, f"end-to-end not measured: {why}")
        if (e2e.variant, e2e.baseline) != (claim.variant, claim.over):
            return _verdict(claim, False, f"the scenario compares {e2e.variant} with {e2e.baseline}")
        s = e2e.measured_speedup
        return _verdict(claim, s >= need, f"{_x(s, need)} end to end (need {need:g}x)")
    points = kernel_points if claim.level == "kernel" else workload.points
    pairs = _speedups(points, claim.variant, claim.over, claim.where)
    if not pairs:
        return _verdict(claim, False, f"no {claim.level} point matches this claim")
    missing = [p for p, s in pairs if s is None]
    if missing:
        return _verdict(claim, False, f"not measured at {_label(missing[0])}")
    if claim.statistic == "geomean":
        weights = [1.0 if p.weight is None else p.weight for p, _ in pairs]
        g = weighted_geomean([s for _, s in pairs], weights)
        return _verdict(claim, g >= need, f"weighted geomean {_x(g, need)} over {len(pairs)} shapes (need {need:g}x)")
    p, s = min(pairs, key=lambda ps: ps[1])
    ladder = f"worst {_x(s, need)} at {_label(p)} over {len(pairs)} points"
    runs = [paired.get(pair_key(claim.variant, claim.over, p.shape, p.dtype)) for p, _ in pairs]
    if claim.level != "kernel" or not all(isinstance(r, ClaimPairedTiming) for r in runs):
        failed = next((r for r in runs if isinstance(r, Unpaired)), None)
        why = f"; the paired timing {failed.status}: {failed.error}" if failed else ""
        return _verdict(claim, s >= need, f"{ladder}{why} (need {need:g}x)")
    (p, _), r = min(zip(pairs, runs), key=lambda pr: pr[1].speedup)
    return _verdict(claim, r.speedup >= need,
                    f"worst {_x(r.speedup, need)} at {_label(p)}, timed in alternation with {claim.over} "
                    f"({len(r.rounds_us)} rounds, {r.speedup_min:.2f}-{r.speedup_max:.2f}x); "
                    f"the ladder's medians: {ladder} (need {need:g}x)", paired=runs)
