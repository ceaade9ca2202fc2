"""What a page shows, as plain records: tables and answers picked out of a case and its results.

Numbers are formatted here; escaping happens in the templates (every value goes through `esc`).
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field

from casebook import levels
from casebook.render import links, text
from casebook.render.book import Book, Entry, StoredResult
from casebook.render.figures import best_variant, link_gbps, measured_roofs
from casebook.result import CounterRow, EndToEndResult, Point, Result
from casebook.roofline import host_bound, ridge_point


@dataclass
class Ridge:
    """The ridge-point reasoning on one machine: where the case's intensity sits against the ridge."""

    hardware: str
    dtype: str
    compute_tflops: float
    bandwidth_gbps: float
    ridge: float
    intensity: float
    side: str  # "bandwidth" or "compute"
    factor: float  # how far from the ridge, as a ratio >= 1
    source: str  # "measured" or "datasheet"


@dataclass
class Machine:
    """One stored result as the case page shows it."""

    stored: StoredResult
    name: str
    slug: str
    images: dict[str, str] = field(default_factory=dict)  # kind -> image src path
    level1: dict[str, list[dict]] = field(default_factory=dict)  # dtype -> rows
    level2_summary: list[dict] = field(default_factory=list)
    level2_points: list[dict] = field(default_factory=list)
    e2e: dict = field(default_factory=dict)
    claims: list[dict] = field(default_factory=list)
    counters: list[dict] = field(default_factory=list)
    environment: list[tuple[str, str]] = field(default_factory=list)
    protocol: list[tuple[str, str]] = field(default_factory=list)
    first_calls: list[tuple[str, str]] = field(default_factory=list)
    level2_variants: list[str] = field(default_factory=list)
    claims_held: str = "–"
    hardware_url: str = ""
    command: str = ""
    result_file: str = ""
    best: str | None = None
    best_roof: float | None = None
    shapes_measured: str = ""
    dtypes_measured: str = ""
    link: str = ""
    """A multi-device result's roofline is drawn against the link: which one and its measured ceiling, in words."""
    memory: bool = False
    """Whether any level-1 point has its peak memory measured: the table then shows it beside the time."""
    unstable: str = ""
    """How many timed points are unstable, and the first one's reasons, in words (empty: none is)."""


def ridge(entry: Entry, stored: StoredResult) -> Ridge | None:
    """The case's arithmetic intensity against this machine's measured ridge point, at its first dtype."""
    points = [p for p in stored.result.kernel_level if p.status == "ok"]
    roofs = measured_roofs(stored.result.hardware, points)
    dtypes = entry.case.levels.kernel.dtypes
    dtype = next((d for d in dtypes if d in roofs["compute_tflops"]), None)
    if dtype is None and roofs["compute_tflops"]:
        dtype = next(iter(roofs["compute_tflops"]))
    bw = roofs["bandwidth_gbps"]
    ai = entry.case.bottleneck.arithmetic_intensity
    if ai is None:
        ais = [p.arithmetic_intensity for p in points if p.dtype == dtype and _ok(p.arithmetic_intensity)]
        ai = statistics.median(ais) if ais else None
    if not dtype or not _ok(bw) or not _ok(ai) or ai <= 0:
        return None
    compute = roofs["compute_tflops"][dtype]
    r = ridge_point(compute, bw)
    return Ridge(stored.hardware_name, dtype, compute, bw, r, ai, "bandwidth" if ai < r else "compute",
                 max(r / ai, ai / r), "measured")


def machine(entry: Entry, stored: StoredResult, images: dict[str, str]) -> Machine:
    r = stored.result
    m = Machine(stored, stored.hardware_name, stored.slug, images)
    m.best = best_variant(entry, stored)
    fracs = [p.roof_fraction for p in r.kernel_level if p.variant == m.best and _ok(p.roof_fraction)]
    m.best_roof = statistics.median(fracs) if fracs else None
    order = {v.name: i for i, v in enumerate(entry.case.kernel.variants)}
    shapes = _shape_order(r.kernel_level)
    for p in sorted(r.kernel_level, key=lambda p: (shapes[text.shape_short(p.shape)], order.get(p.variant, 99))):
        m.level1.setdefault(p.dtype, []).append(_level1_row(p, entry.case.kernel.baseline))
    m.memory = any(p.peak_memory_bytes is not None for p in r.kernel_level)
    wl = r.workload_level
    m.level2_summary = [{"variant": s.variant, "geomean": text.times(s.geomean_speedup),
                         "worst": text.times(s.worst_speedup),
                         "worst_shape": text.shape(s.worst_shape or {}),
                         "regressions": levels.regressions(s, wl.points, text.shape_short),
                         "unstable": _unstable_shapes(wl.points, s.variant, entry.case.kernel.baseline),
                         "good": _ok(s.worst_speedup) and s.worst_speedup >= 1}
                        for s in wl.summary]
    m.unstable = unstable_words(r)
    measured = [p for p in r.kernel_level if p.status in ("ok", "checked")]
    m.shapes_measured = "; ".join(dict.fromkeys(text.shape(p.shape) for p in measured))
    m.dtypes_measured = ", ".join(dict.fromkeys(p.dtype for p in measured))
    bus = link_gbps(r.hardware, [p for p in r.kernel_level if p.status == "ok"])
    if bus:
        topo = r.hardware.topology
        m.link = (f"{topo.link or 'the link'} between {topo.devices} devices, "
                  f"{text.num(bus)} GB/s of all-reduce bus bandwidth")
    m.level2_points = _level2_table(entry, wl.points)
    m.level2_variants = [v.name for v in entry.case.kernel.variants
                         if any(v.name in row["speedups"] for row in m.level2_points)]
    applicable = [c for c in r.claims if c.held is not None]
    m.claims_held = f"{sum(c.held is True for c in applicable)} of {len(applicable)} held" if applicable else "n/a here"
    m.command = r.command
    m.result_file = f"results/{stored.path.parent.name}/{stored.path.name}"
    m.e2e = _e2e(r.end_to_end)
    m.claims = [{"text": c.text, "held": c.held, "detail": c.detail} for c in r.claims]
    m.counters = [{"variant": c.variant, "shape": text.shape_short(c.shape),
                   "dtype": c.dtype, "modelled": text.nbytes(c.modelled_bytes),
                   "measured": text.nbytes(c.measured_bytes), "gap": _gap(c)} for c in r.counters]
    m.environment = _items(r.environment.model_dump(exclude_unset=True))
    m.protocol = _items(r.protocol.model_dump(exclude_unset=True))
    m.first_calls = [(v.name, f"{text.num(v.first_call_s, 3)} s "
                              f"(slowest shape {text.num(v.first_call_s_max, 3)} s)")
                     for v in r.variants if isinstance(v.first_call_s, (int, float))]
    return m


def _level1_row(p: Point, baseline: str) -> dict:
    spread = f"{text.num(p.p10_us)}–{text.num(p.p90_us)}" if _ok(p.p10_us) and _ok(p.p90_us) else "–"
    ci = p.median_ci_us or []
    median_ci = f"{text.num(ci[0], 4)}–{text.num(ci[1], 4)}" if len(ci) == 2 and all(map(_ok, ci)) else ""
    if p.status == "ok":
        check = f"✓ {p.max_rel_err:.1e}" if _ok(p.max_rel_err) else "✓"
    elif p.status == "checked":
        check = "✓ checked, not timed here"
    elif p.status == "failed" and p.correct:  # a right answer whose time was refused (the physics gate)
        check = f"✗ {p.error or 'refused'}"
    elif p.status == "failed" and p.error:  # the reason (input modified, wrong dtype, NaN), not an error of 0
        check = f"✗ {p.error}"
    elif p.status == "failed":
        check = f"✗ wrong: {p.max_rel_err:.1e}" if _ok(p.max_rel_err) and p.max_rel_err > 0 else "✗ wrong answer"
    else:
        check = f"{p.status}: {p.error or ''}".rstrip(": ")
    full = check
    if len(check) > 36:
        check = check[:34].rstrip() + "…"
    return {"variant": p.variant, "baseline": p.variant == baseline, "shape": text.shape_short(p.shape),
            "median": text.num(p.median_us), "median_ci": median_ci, "reps": p.repetitions, "spread": spread,
            "gbps": text.rate(p.gbps, "B/s", 1e9), "tflops": text.rate(p.tflops), "roof": text.pct(p.roof_fraction),
            "regime": _regime(p),
            "floors": f"{text.num(p.bandwidth_floor_us)} · {text.num(p.launch_floor_us)}"
                      if _ok(p.bandwidth_floor_us) and _ok(p.launch_floor_us) else "–",
            "speedup": text.times(p.speedup) if p.variant != baseline else "baseline", "check": check,
            "memory": _memory(p),
            "check_full": full, "autotuned": "; ".join(f"{k} {v}" for k, v in (p.autotuned or {}).items()),
            "unstable": "; ".join(p.unstable or []), "ok": p.status in ("ok", "checked")}


def _memory(p: Point) -> str:
    """Peak memory above the inputs, and as a multiple of the inputs' bytes."""
    if p.peak_memory_bytes is None:
        return "–"
    ratio = f" ({p.peak_memory_bytes / p.input_bytes:.2g}x inputs)" if p.input_bytes else ""
    return f"{text.nbytes(p.peak_memory_bytes)}{ratio}"


def unstable_words(r: Result) -> str:
    """How many of a result's timed points are unstable (`casebook check` publishes none of them), the first
    one's reasons, and ceilings measured on a busy machine; empty where the run was steady."""
    timed = [p for p in [*r.kernel_level, *r.workload_level.points] if p.status == "ok"]
    unstable = [p for p in timed if p.unstable]
    words = []
    if unstable:
        first = unstable[0]
        words.append(f"{len(unstable)} of {len(timed)} timed points are unstable (first: {first.variant} "
                     f"{text.shape_short(first.shape)} {first.dtype}: {'; '.join(first.unstable)})")
    if r.hardware.measured.unstable:
        words.append(f"the ceilings were measured on a busy machine ({'; '.join(r.hardware.measured.unstable)})")
    return "; ".join(words)


def caveat(stored: StoredResult) -> str:
    """What a stored result's numbers must be read with, in a word or two: stale, unstable, both, or nothing."""
    return ", ".join(w for w, on in (("stale", stored.stale), ("unstable", unstable_words(stored.result))) if on)


def _unstable_shapes(points: list[Point], variant: str, baseline: str) -> str:
    """The workload shapes whose speedup for `variant` rests on an unstable time (its own or the baseline's): only
    where it was timed (a variant only checked there has no speedup to rest on anything)."""
    shaky = {text.shape_short(p.shape) for p in points if p.unstable and p.variant in (variant, baseline)}
    shapes = {text.shape_short(p.shape) for p in points if p.variant == variant and p.status == "ok"}
    return f"unstable at {len(shaky & shapes)} of {len(shapes)} shapes" if shaky & shapes else ""


def _regime(p: Point) -> str:
    """The regime; a point filed under launch by its host issue time says so, with the time."""
    if not p.regime:
        return "–"
    regime = p.regime
    if p.regime == "launch" and host_bound(p.host_issue_us, p.floor_us):
        regime = f"launch (host {text.num(p.host_issue_us)} µs)"
    if _ok(p.roof_fraction) and 0 < p.roof_fraction < 0.5:  # which roof binds, and how far below it the point is
        return f"{regime}, {text.num(1 / p.roof_fraction, 2)}× below"
    return regime


def _level2_table(entry: Entry, points: list[Point]) -> list[dict]:
    """One row per workload shape: weight, source, and each variant's speedup."""
    rows: dict[str, dict] = {}
    baseline = entry.case.kernel.baseline
    shaky_baseline = {text.shape_short(p.shape) for p in points if p.unstable and p.variant == baseline}
    for p in points:
        label = text.shape_short(p.shape)
        row = rows.setdefault(label, {"shape": label, "weight": p.weight, "source": p.source or "",
                                      "speedups": {}})
        if p.variant != baseline:
            shown = text.times(p.speedup) if p.status == "ok" else (p.status or "–")
            row["speedups"][p.variant] = f"{shown} (unstable)" if p.unstable or label in shaky_baseline else shown
    total = sum(r["weight"] or 0 for r in rows.values()) or 1
    for r in rows.values():
        r["weight"] = text.pct((r["weight"] or 0) / total)
    return list(rows.values())


def _e2e(e: EndToEndResult) -> dict:
    if e.status != "ok":
        out = {"status": e.status, "reason": e.error or ""}
        if _ok(e.kernel_share):  # the baseline was timed: its kernel share is a measurement, shown
            out.update(share=text.pct(e.kernel_share), baseline=e.baseline,
                       baseline_us=text.us(e.baseline_us),
                       baseline_kernel_us=text.us(e.baseline_kernel_us),
                       shape=text.shape(e.shape), dtype=e.dtype)
        return out
    return {"status": "ok", "shape": text.shape(e.shape), "dtype": e.dtype,
            "baseline": e.baseline, "variant": e.variant,
            "baseline_us": text.us(e.baseline_us), "variant_us": text.us(e.variant_us),
            "share": text.pct(e.kernel_share), "kernel": text.times(e.kernel_speedup),
            "amdahl": text.times(e.amdahl_speedup), "measured": text.times(e.measured_speedup)}


def _gap(c: CounterRow) -> str:
    g = c.gap
    if _ok(g):
        return f"{g:+.1%}"
    if c.not_applicable:
        return f"not applicable: {c.not_applicable}"
    return "no counters" if c.error else "–"


def _items(d: dict) -> list[tuple[str, str]]:
    out = []
    for k, v in (d or {}).items():
        if isinstance(v, dict):
            v = ", ".join(f"{a} {b}" for a, b in v.items())
        elif isinstance(v, float):
            v = text.num(v, 4)
        out.append((str(k), "–" if v is None or v == "" else str(v)))
    return out


def _shape_order(points: list[Point]) -> dict[str, int]:
    order: dict[str, int] = {}
    for p in points:
        order.setdefault(text.shape_short(p.shape), len(order))
    return order


def _ok(x: object) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


# --- indices ---------------------------------------------------------------------------------


def case_row(entry: Entry, page: str) -> dict:
    """One line of an index table: link, operator, bottleneck, patterns, machines, and the outcome on the
    machine the case is about (GPUs first), so that cases compare without a click."""
    c = entry.case
    return {"title": c.title, "url": links.rel(page, links.case_page(c.id)), "id": c.id, "operator": c.operator,
            "bottleneck": c.bottleneck.kind, "patterns": ", ".join(c.patterns),
            "ai": text.num(c.bottleneck.arithmetic_intensity),
            "machines": ", ".join(r.slug + (f" ({caveat(r)})" if caveat(r) else "") for r in entry.results)
                        or "no results yet",
            **outcome(entry)}


def outcome(entry: Entry, stored: StoredResult | None = None) -> dict:
    """The headline of a case's result (its leading one unless given): best variant, its median % of roof, its
    speedup over the baseline (level-2 weighted geomean, else the median level-1 speedup), and where that was
    measured."""
    none = {"best": "–", "roof": "–", "speedup": "–", "on": "", "headline": None}
    stored = stored or (entry.results[0] if entry.results else None)
    if stored is None:
        return none
    best = best_variant(entry, stored)
    if best is None:
        return {**none, "on": stored.slug}
    r = stored.result
    fracs = [p.roof_fraction for p in r.kernel_level if p.variant == best and _ok(p.roof_fraction)]
    geo = next((s.geomean_speedup for s in r.workload_level.summary
                if s.variant == best and _ok(s.geomean_speedup)), None)
    if geo is None:
        ups = [p.speedup for p in r.kernel_level if p.variant == best and _ok(p.speedup)]
        geo = statistics.median(ups) if ups else None
    roof = text.pct(statistics.median(fracs)) if fracs else "–"
    speedup = "baseline" if best == entry.case.kernel.baseline else text.times(geo)
    return {"best": best, "roof": roof, "speedup": speedup, "on": stored.slug,
            "headline": f"{roof} of roof, {speedup} over {entry.case.kernel.baseline}"}


def card(entry: Entry, page: str) -> dict:
    """A home-page card: what the case claims (its claims' states, the hardware they name) and where it stands
    there: the headline of its result on that hardware, never a rung measured elsewhere (a CPU's). Where that
    hardware has no current result, another GPU's headline (`near`), said to be a machine the claims do not
    name."""
    named = sorted({slug for c in entry.case.claims for slug in c.hardware or []})
    home = next((r for r in entry.results if (r.slug in named if named else True) and not r.stale), None)
    near = None if home is not None else next(
        (r for r in entry.results if r.result.hardware.kind == "gpu" and not r.stale), None)
    states = [c["state"] for c in claim_states(entry)]
    return {**case_row(entry, page), **outcome(entry, home), "baseline": entry.case.kernel.baseline,
            "near": outcome(entry, near) if near is not None else None,
            "named": ", ".join(named) or "any machine", "measured": home is not None,
            "unstable": bool(home and unstable_words(home.result)),
            "elsewhere": ", ".join(r.slug for r in entry.results if r is not home),
            "claims_total": len(states), "claims_tally": _tally(states)}


def _tally(states: list[str]) -> list[tuple[str, str]]:
    """(css class, words) for each claim state present: `✓ 2 held`, `✗ 1 missed`, `3 not yet measured`."""
    words = {"held": ("cb-held", "✓ {} held"), "missed": ("cb-failed", "✗ {} missed"),
             "unmeasured": ("cb-na", "{} not yet measured")}
    return [(words[s][0], words[s][1].format(states.count(s))) for s in ("held", "missed", "unmeasured")
            if s in states]


CLAIM_STATES = ("missed", "held", "unmeasured")


def claim_states(entry: Entry) -> list[dict]:
    """Each of the case's claims with every stored verdict on it (matched by its text; `n/a` ones left out) and
    its state over them: missed on some machine, else held, else not yet measured (on the hardware it names)."""
    out = []
    for claim in entry.case.claims:
        judged = [(stored, o) for stored in entry.results for o in stored.result.claims
                  if o.text == claim.text and o.held is not None]
        state = "missed" if any(o.held is False for _, o in judged) else "held" if judged else "unmeasured"
        out.append({"text": claim.text, "hardware": claim.hardware, "judged": judged, "state": state})
    return out


def machine_titles(book: Book) -> dict[str, str]:
    """Each machine's heading, by its key in `Book.hardware()`: its name, times its devices where a run spans
    several, and its key where two machines would still share one (two hosts of one CPU model)."""
    titles = {}
    for key, results in book.hardware().items():
        topo = results[0].result.hardware.topology
        devices = f" × {topo.devices}" if topo is not None and (topo.devices or 1) > 1 else ""
        titles[key] = results[0].hardware_name + devices
    shared = {t for t in titles.values() if list(titles.values()).count(t) > 1}
    return {key: f"{t} ({key})" if t in shared else t for key, t in titles.items()}


def operators(book: Book) -> dict[str, dict]:
    """Every operator with a case, or that a case's method transfers to: its cases and incoming transfers."""
    out: dict[str, dict] = {}
    for e in book.entries:
        out.setdefault(e.case.operator, {"cases": [], "incoming": []})["cases"].append(e)
    for e in book.entries:
        for t in e.case.transfers:
            out.setdefault(t.operator, {"cases": [], "incoming": []})["incoming"].append((e, t))
    return dict(sorted(out.items()))
