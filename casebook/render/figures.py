"""What each chart shows, as plain data for `plots`: picked out of cases and stored results."""

from __future__ import annotations

import math

from casebook.render.book import Entry, StoredResult
from casebook.render.text import plain, shape_short
from casebook.result import Hardware, Point


def measured_roofs(result_hw: Hardware, points: list[Point] | None = None) -> dict:
    """The measured ceilings: copy bandwidth (and a read stream's, where one was measured faster); per dtype, the
    compute roof the run used (else matmul)."""
    m = result_hw.measured
    compute = dict(m.matmul_tflops)
    if points:
        used: dict[str, float] = {}
        for p in points:
            roof = getattr(p, "compute_roof_tflops", None)
            if _ok(roof):
                used[p.dtype] = roof
        compute = used or {d: v for d, v in compute.items() if d in {p.dtype for p in points}} or compute
    roofs = {"bandwidth_gbps": m.copy_gbps, "compute_tflops": _clean(compute), "launch_us": m.launch_us}
    if _ok(m.read_gbps) and m.read_gbps > m.copy_gbps:  # the roof of traffic that only reads, above the copy's
        roofs["read_gbps"] = m.read_gbps
    return roofs


def datasheet_roofs(result_hw: Hardware, dtypes: set[str] | None = None) -> dict | None:
    d = result_hw.datasheet
    if d is None:
        return None
    peaks = _clean(d.peak_tflops or {})
    if dtypes:
        peaks = {k: v for k, v in peaks.items() if k in dtypes} or peaks
    return {"bandwidth_gbps": d.bandwidth_gbps, "compute_tflops": peaks}


def ceiling_tflops(p: Point) -> float | None:
    """The point's own attainable ceiling: min(compute, bandwidth x AI, FLOPs / launch floor)."""
    attainable = getattr(p, "attainable_tflops", None)
    if _ok(attainable) and attainable > 0:
        return attainable
    floor = getattr(p, "floor_us", None)
    if _ok(floor) and floor > 0 and _ok(p.flops):
        return p.flops / floor / 1e6
    return None


def link_gbps(result_hw: Hardware, points: list[Point]) -> float | None:
    """The interconnect's measured ceiling where a multi-device result's points were placed against it (its
    topology's bus bandwidth, and link bytes on every point): its roofline is drawn against the link."""
    bus = _pos(result_hw.topology.bus_gbps if result_hw.topology is not None else None)
    return bus if bus and points and all(_pos(getattr(p, "link_bytes", None)) for p in points) else None


def roofline(entry: Entry, stored: StoredResult) -> dict | None:
    points = [p for p in stored.result.kernel_level if p.status == "ok"]
    if not points:
        return None
    variants = [v.name for v in entry.case.kernel.variants]
    hw = stored.result.hardware
    measured, datasheet = measured_roofs(hw, points), datasheet_roofs(hw, {p.dtype for p in points})
    link = link_gbps(hw, points)
    if link:  # the slope is the link's, the intensity FLOPs per byte over it
        measured = {**measured, "bandwidth_gbps": link}
        sheet = _pos(hw.datasheet.link_gbps if hw.datasheet is not None else None)
        datasheet = {**datasheet, "bandwidth_gbps": sheet} if datasheet and sheet else None
    return {
        "hardware": plain(stored.hardware_name),
        "variants": variants,
        "baseline": entry.case.kernel.baseline,
        "measured": measured,
        "datasheet": datasheet,
        "against": "link" if link else "memory",
        "shapes": list(dict.fromkeys(shape_short(p.shape) for p in stored.result.kernel_level)),
        "points": [{"variant": p.variant, "dtype": p.dtype, "shape": shape_short(p.shape),
                    "ai": _pos(p.flops / p.link_bytes if link else p.arithmetic_intensity), "tflops": _pos(p.tflops),
                    "ceiling_tflops": _pos(ceiling_tflops(p)), "roof_fraction": p.roof_fraction
                    if _ok(p.roof_fraction) else None} for p in points],
    }


def speedups(entry: Entry, stored: StoredResult) -> dict | None:
    wl = stored.result.workload_level
    baseline = entry.case.kernel.baseline
    shapes: list[str] = []
    weights: dict[str, float] = {}
    series: dict[str, dict[str, float]] = {}
    for p in wl.points:
        label = shape_short(p.shape)
        if label not in weights:
            shapes.append(label)
            weights[label] = float(p.weight or 0)
        if p.variant != baseline and _ok(p.speedup):
            series.setdefault(p.variant, {})[label] = p.speedup
    if not series:
        return None
    total = sum(weights.values()) or 1.0
    order = [v.name for v in entry.case.kernel.variants if v.name in series]
    return {
        "hardware": plain(stored.hardware_name),
        "variants": [v.name for v in entry.case.kernel.variants],
        "baseline": baseline,
        "shapes": shapes,
        "weights": [weights[s] / total for s in shapes],
        "series": {v: [series[v].get(s) for s in shapes] for v in order},
        "geomean": {s.variant: s.geomean_speedup for s in wl.summary if _ok(s.geomean_speedup)},
    }


def amdahl(entry: Entry, stored: StoredResult, colors: dict[str, str]) -> dict | None:
    e = stored.result.end_to_end
    if e.status != "ok" or not all(_ok(x) for x in (e.baseline_us, e.kernel_share, e.kernel_speedup)):
        return None
    return {"hardware": plain(stored.hardware_name), "baseline": plain(e.baseline),
            "variant": plain(e.variant), "baseline_us": e.baseline_us,
            "variant_us": e.variant_us if _ok(e.variant_us) else None,
            "kernel_share": e.kernel_share, "kernel_speedup": e.kernel_speedup,
            "color_base": colors.get(e.baseline, "#7f7f7f"),
            "color_variant": colors.get(e.variant, "#0072B2")}


def best_variant(entry: Entry, stored: StoredResult) -> str | None:
    """The variant closest to its roof: timed at the most level-1 points, then the highest median roof fraction.
    Controls (variants with their own reference) compute something else, so they are never the best."""
    controls = {v.name for v in entry.case.kernel.variants if v.reference}
    by: dict[str, list[float]] = {}
    for p in stored.result.kernel_level:
        if p.status == "ok" and _ok(p.roof_fraction) and p.variant not in controls:
            by.setdefault(p.variant, []).append(p.roof_fraction)
    if not by:
        return None
    # Coverage first: a variant that runs every shape beats one that is closer to the roof on a few.
    return max(by, key=lambda v: (len(by[v]), sorted(by[v])[len(by[v]) // 2]))


def atlas_points(entry: Entry, stored: StoredResult) -> list[Point]:
    """The level-1 points the atlas draws for a case: its best variant's timed ones with a positive intensity
    and rate (a log-log chart has no place for zero)."""
    best = best_variant(entry, stored)
    return [p for p in stored.result.kernel_level
            if p.variant == best and p.status == "ok" and _pos(p.arithmetic_intensity) and _pos(p.tflops)]


def off_atlas(entry: Entry, stored: StoredResult) -> str | None:
    """Why a case measured on the machine has no point on its atlas; None where it has some."""
    if atlas_points(entry, stored):
        return None
    best = best_variant(entry, stored)
    timed = [p for p in stored.result.kernel_level if p.variant == best and p.status == "ok"]
    if timed and not any(_pos(p.flops) for p in timed):
        return "it does no FLOPs, it only moves bytes, so it has no place on the FLOP/byte axis"
    return "none of its timed points has a positive intensity and rate"


def atlas(hardware_name: str, pairs: list[tuple[Entry, StoredResult]]) -> dict | None:
    points = []
    used: list[Point] = []
    hw = None
    for entry, stored in pairs:
        mine = atlas_points(entry, stored)
        if mine:
            hw = hw or stored.result.hardware
            points += [{"case": entry.id, "variant": p.variant, "ai": p.arithmetic_intensity, "tflops": p.tflops}
                       for p in mine]
            used += mine
    if not points:
        return None
    # The roofs of the dtypes the points were measured in: a ceiling no point uses is clutter here.
    return {"hardware": plain(hardware_name), "points": points, "measured": measured_roofs(hw, used),
            "datasheet": datasheet_roofs(hw, {p.dtype for p in used})}


def ceilings(hardware_name: str, hw: Hardware) -> dict:
    return {"hardware": plain(hardware_name), "measured": measured_roofs(hw), "datasheet": datasheet_roofs(hw)}


def _ok(x: object) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def _pos(x: object) -> float | None:
    return float(x) if _ok(x) and x > 0 else None


def _clean(d: dict) -> dict[str, float]:
    return {str(k): float(v) for k, v in d.items() if _ok(v) and v > 0}
