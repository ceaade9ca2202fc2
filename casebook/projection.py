"""What a stored result would do on another GPU: each point carried over as the fraction of its binding
roof that it reached, not as its time, and reported as a band.

Optimistic: the point reaches the same fraction of the target's roof (datasheet peaks scaled by the
measured-to-datasheet ratio: the target's own where it has a stored result, else the source's), with
the launch floor kept. Pessimistic: also capped by a per-SM resource the roofline does not scale: a
bandwidth-bound kernel keeps the bytes per SM it kept in flight on the source (Little's law: its tiles
and pipeline depth were sized there), a compute-bound one keeps the matrix throughput per SM that its
instructions reached (a kernel built for one generation's tensor-core instructions gains no per-SM
rate on the next without a rewrite). Launch-bound points keep their time: the host issues them.
Claims are never judged on a projection.

Checked both ways on the softmax ladder (117 level-1 points measured on an H200 and on an H100, each GPU's own
measured ceilings): from the H100 the H200 fell inside the band at 115 points; from the H200 the H100 ran faster
than the optimistic edge at 115 (median 0.92x of it; eager and torch.compile 0.78-0.80x, the Triton rungs
0.95-0.97x). A kernel's fraction of the bandwidth roof is not the same on both: a slower memory needs fewer bytes
in flight a SM to be kept busy, so the same kernel runs nearer the H100's roof. Projected from a faster GPU onto
a slower one, the optimistic edge is not a bound.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from casebook.result import Ceilings, Point, Result

BOUNDS = {
    "bandwidth": "per-SM bandwidth: the source's bytes per SM per second on each of the target's SMs",
    "compute": "per-SM throughput: the source's FLOP per SM per second on each of the target's SMs",
    "launch": "the host and launch path: unchanged, so the time is kept",
}
"""Which resource caps the pessimistic edge, by the regime of the point on the source."""


class ProjectionError(ValueError):
    """A projection that cannot be made: an unknown target, a source without measured ceilings."""


@dataclass(frozen=True)
class MachineRoofs:
    """One machine's roofs for projection, and where they come from."""

    slug: str
    name: str
    compute_tflops: dict[str, float]
    bandwidth_gbps: float
    sm_count: int
    basis: str


@dataclass(frozen=True)
class Projection:
    """One point of a result on another machine: a band of times."""

    variant: str
    shape: dict
    dtype: str
    source_us: float
    regime: str
    roof_fraction: float
    optimistic_us: float
    pessimistic_us: float
    bound: str
    measured_us: float | None = None

    @property
    def in_band(self) -> bool | None:
        """Whether the target's measured time fell inside the band (None without a measurement)."""
        if self.measured_us is None:
            return None
        return self.optimistic_us * 0.98 <= self.measured_us <= self.pessimistic_us * 1.02

    @property
    def error(self) -> float | None:
        """The band's geometric middle against the measured time, relative (+ = projected too slow)."""
        if self.measured_us is None:
            return None
        return math.sqrt(self.optimistic_us * self.pessimistic_us) / self.measured_us - 1


def source_roofs(result: Result) -> MachineRoofs:
    """The roofs a stored result was measured against."""
    hw = result.hardware
    measured, sheet = hw.measured, hw.datasheet
    if not measured.copy_gbps or sheet is None or not sheet.sm_count:
        raise ProjectionError(f"{hw.slug}: a projection needs measured ceilings and a datasheet "
                              "with an SM count (GPU results only)")
    return MachineRoofs(hw.slug, sheet.name, dict(measured.matmul_tflops), measured.copy_gbps, sheet.sm_count,
                        "measured")


def target_roofs(target: str, registry: dict[str, dict], source: Result,
                 measured: dict[str, Ceilings] | None = None) -> MachineRoofs:
    """The target's roofs: its measured ceilings where it has a stored result, else its datasheet
    scaled by the source's measured-to-datasheet ratio of the same roof."""
    if target not in registry:
        raise ProjectionError(f"--to {target}: not in the hardware registry; known: {', '.join(sorted(registry))}")
    spec = registry[target]
    own = (measured or {}).get(target)
    if own is not None:
        return MachineRoofs(target, spec["name"], dict(own.matmul_tflops), own.copy_gbps, spec["sm_count"],
                            "measured on the target")
    src_sheet = source.hardware.datasheet
    src = source_roofs(source)
    bw_ratio = src.bandwidth_gbps / src_sheet.bandwidth_gbps
    compute = {}
    for dtype, peak in spec["peak_tflops"].items():
        src_peak = src_sheet.peak_tflops.get(dtype)
        if src_peak and dtype in src.compute_tflops:
            compute[dtype] = peak * src.compute_tflops[dtype] / src_peak
    return MachineRoofs(target, spec["name"], compute, spec["bandwidth_gbps"] * bw_ratio, spec["sm_count"],
                        f"datasheet x the {source.hardware.slug} measured-to-datasheet ratio")


def project_point(point: Point, source: MachineRoofs, target: MachineRoofs) -> Projection | None:
    """The band for one timed point, or None where the point was not placed on the roofline."""
    if point.status != "ok" or not point.median_us or point.regime is None or not point.roof_fraction:
        return None
    flops, moved = point.flops or 0.0, point.bytes or 0.0
    launch_floor_us = point.launch_floor_us or 0.0
    common = dict(variant=point.variant, shape=point.shape, dtype=point.dtype, source_us=point.median_us,
                  regime=point.regime, roof_fraction=point.roof_fraction, bound=BOUNDS[point.regime])
    if point.regime == "launch":
        return Projection(optimistic_us=point.median_us, pessimistic_us=point.median_us, **common)
    compute = target.compute_tflops.get(point.dtype) or target.compute_tflops.get("fp32")
    if not compute:
        return None
    floor = max(flops / (compute * 1e6), moved / (target.bandwidth_gbps * 1e3), launch_floor_us)
    optimistic = floor / point.roof_fraction
    if point.regime == "bandwidth":
        per_sm = moved / point.median_us / source.sm_count  # bytes per us per SM on the source
        capped = moved / (per_sm * target.sm_count) if per_sm else 0.0
    else:
        per_sm = flops / point.median_us / source.sm_count
        capped = flops / (per_sm * target.sm_count) if per_sm else 0.0
    return Projection(optimistic_us=optimistic, pessimistic_us=max(optimistic, capped), **common)


def nearest_source(sources: list[str], target: str, registry: dict[str, dict]) -> str | None:
    """Of the GPUs with a stored result (`sources`, slugs), the one to project onto `target` from: the nearest by
    its datasheet's memory bandwidth and bf16 peak (the sum of the two ratios' logs, either way), so that each roof
    is scaled the least; one the registry lacks comes last, then the order given. None where only `target` is
    there."""
    def figures(slug: str) -> tuple:
        spec = registry.get(slug) or {}
        return spec.get("bandwidth_gbps"), (spec.get("peak_tflops") or {}).get("bf16")

    def distance(slug: str) -> float:
        try:
            return sum(abs(math.log(a / b)) for a, b in zip(figures(slug), figures(target), strict=True))
        except (TypeError, ValueError, ZeroDivisionError):
            return math.inf

    return min((s for s in sources if s != target), key=distance, default=None)


def project(result: Result, target: str, registry: dict[str, dict], measured: dict[str, Ceilings] | None = None,
            actual: Result | None = None) -> tuple[MachineRoofs, list[Projection]]:
    """Every level-1 point of `result` projected onto `target`; beside each, `actual`'s measured median."""
    src = source_roofs(result)
    if target == src.slug:
        raise ProjectionError(f"--to {target}: the result was measured there; nothing to project")
    roofs = target_roofs(target, registry, result, measured)
    there = {}
    if actual is not None:
        there = {(p.variant, tuple(sorted(p.shape.items())), p.dtype): p.median_us
                 for p in actual.kernel_level if p.status == "ok" and p.median_us}
    out = []
    for p in result.kernel_level:
        proj = project_point(p, src, roofs)
        if proj is not None:
            key = (p.variant, tuple(sorted(p.shape.items())), p.dtype)
            out.append(proj if key not in there else replace(proj, measured_us=there[key]))
    return roofs, out

