"""Matplotlib figures as SVG bytes: the case roofline, level-2 speedups, the Amdahl bar, the atlas.

Each function takes plain data (lists and dicts, built by `figures.py`) so that it can run in a
worker process and be cached by the hash of its input. Object-oriented API on the Agg/SVG canvas
only: no pyplot, no global figure state.
"""

from __future__ import annotations

import io
import math

import matplotlib

matplotlib.use("Agg")

from matplotlib.backends.backend_agg import FigureCanvasAgg  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402
from matplotlib.lines import Line2D  # noqa: E402
from matplotlib.patches import Patch  # noqa: E402
from matplotlib.ticker import FuncFormatter, LogLocator, NullLocator, PercentFormatter  # noqa: E402
from matplotlib.transforms import Bbox  # noqa: E402

from casebook.roofline import ridge_point  # noqa: E402

# Okabe-Ito: distinguishable with the common colour-vision deficiencies.
PALETTE = ["#0072B2", "#E69F00", "#009E73", "#CC79A7", "#D55E00", "#56B4E9", "#8C6D1F", "#000000"]
BASELINE_GREY = "#7f7f7f"
MARKERS = {"bf16": "o", "fp16": "s", "fp32": "^", "tf32": "D", "fp8_e4m3": "P", "fp8_e5m2": "X", "fp64": "v"}
INK = "#1f2329"
FAINT = "#9aa3ad"

STYLE = {
    "font.family": "DejaVu Sans",
    "font.size": 9,
    "axes.edgecolor": "#c3c8cf",
    "axes.labelcolor": INK,
    "axes.titlesize": 10,
    "axes.titleweight": "bold",
    "axes.titlelocation": "left",
    "axes.spines.top": False,
    "axes.spines.right": False,
    "axes.grid": True,
    "grid.color": "#e6e9ed",
    "grid.linewidth": 0.6,
    "xtick.color": "#4a5159",
    "ytick.color": "#4a5159",
    "legend.frameon": False,
    "legend.fontsize": 8,
    "svg.fonttype": "none",  # text stays text: crisp at any zoom, and small
    "svg.hashsalt": "casebook",  # stable ids: an unchanged figure is byte-identical
}
matplotlib.rcParams.update(STYLE)


def variant_colors(variants: list[str], baseline: str | None) -> dict[str, str]:
    """One colour per variant, stable across every chart of a case; the baseline is grey."""
    colors, i = {}, 0
    for v in variants:
        if v == baseline:
            colors[v] = BASELINE_GREY
        else:
            colors[v] = PALETTE[i % len(PALETTE)]
            i += 1
    return colors


def _log_axes(ax) -> None:
    """Log-log axes with decade ticks only: minor ticks cost a fifth of the drawing time and add nothing."""
    ax.set_xscale("log")
    ax.set_yscale("log")
    for axis in (ax.xaxis, ax.yaxis):
        axis.set_major_locator(LogLocator(base=10))
        axis.set_minor_locator(NullLocator())
        axis.set_major_formatter(FuncFormatter(_tflops_fmt))


def _tick_labels(ticks: dict[tuple[float, float], set[str]], apart: float = 1.8) -> list[tuple[float, float, set[str]]]:
    """One label per cluster of ceiling ticks: ticks at one ceiling whose intensities lie within `apart`
    of each other share a label (at the rightmost), so that neighbouring shapes' names do not overprint."""
    clusters: list[tuple[float, float, set[str]]] = []
    for ai, ceil in sorted(ticks, key=lambda t: (round(t[1], 3), t[0])):
        if clusters and abs(clusters[-1][1] / ceil - 1) < 0.01 and ai / clusters[-1][0] < apart:
            clusters[-1] = (ai, ceil, clusters[-1][2] | ticks[(ai, ceil)])
        else:
            clusters.append((ai, ceil, set(ticks[(ai, ceil)])))
    return clusters


def _svg(fig: Figure) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="svg", bbox_inches="tight", pad_inches=0.08, metadata={"Date": None})
    return buf.getvalue()


def _tflops_fmt(y: float, _pos: int) -> str:
    if y >= 1:
        return f"{y:g}"
    return f"{y:.2g}" if y >= 0.001 else f"{y:.0e}"


def _roofs(ax, roofs: dict, x_lo: float, x_hi: float, *, faint: bool, label: str, labels: bool = True,
           avoid: list[float] = (), short: bool = True) -> None:
    """Bandwidth slope and one compute ceiling per distinct value, from x_lo to x_hi.

    Measured labels sit under their line and datasheet labels over theirs, so that they never collide
    (a datasheet peak is at or above the measured one); a compute label is short ("bf16 810": the axis gives
    the unit, the legend the line styles), so that it stays clear of the points. Call `_align_slopes` once
    the limits are set."""
    bw = roofs.get("bandwidth_gbps")
    style = dict(color=FAINT, lw=1.0, ls=(0, (4, 3))) if faint else dict(color=INK, lw=1.6)
    text = dict(color=FAINT if faint else INK, fontsize=7.5, textcoords="offset points")
    groups = _ceiling_groups(roofs.get("compute_tflops") or {})
    top = max(groups) if groups else None
    if bw:
        ridge_hi = ridge_point(top, bw) if top else x_hi
        xs = [x_lo, min(ridge_hi, x_hi)]
        ax.plot(xs, [bw * x / 1e3 for x in xs], **style, zorder=2)
        if labels:
            # At the low end of the slope, or at its ridge end when the points crowd the low end (they are
            # `avoid`, their intensities): the label spans about a decade and a half.
            start, end = x_lo * 1.5, xs[1] / 6  # clear of the ceiling labels at the ridge
            crowded = sum(start <= a <= start * 30 for a in avoid) > sum(end / 30 <= a <= end for a in avoid)
            xm, ha = (end, "right") if crowded and end / start > 30 else (start, "left")
            # A read stream measured faster than the copy is read-only traffic's roof (`Roofs.bandwidth_at`): 8%
            # over the copy's on an H200, too close to draw apart on these axes, so the label gives it
            read = roofs.get("read_gbps")
            words = f"{bw / 1e3:.3g} TB/s {label}" + (f" (reads alone {read / 1e3:.3g})" if read and not faint else "")
            ann = ax.annotate(words, (xm, bw * xm / 1e3), xytext=(0, 3) if faint else (3, -3),
                              ha=ha, va="bottom" if faint else "top", rotation_mode="anchor", **text)
            ann.casebook_slope = (xs[0], xs[0] * bw / 1e3, xs[1], xs[1] * bw / 1e3)
    for tf, dtypes in sorted(groups.items()):
        ridge = ridge_point(tf, bw) if bw else x_lo
        ax.plot([max(ridge, x_lo), x_hi], [tf, tf], **style, zorder=2)
    if labels:
        # One label per ceiling, at its own height; ceilings closer than a label's height stack their
        # labels (away from the line: measured under, datasheet over), each with its own number.
        for tf, text_, k in _ceiling_labels(groups):
            dy = (2 + 9 * k) if faint else -(2 + 9 * k)
            words = f"{text_} {_tf(tf)}" if short else f"{text_} {_tf(tf)} TFLOP/s {label}"
            ann = ax.annotate(words, (x_hi, tf), xytext=(-2, dy), ha="right", va="bottom" if faint else "top", **text)
            ann.casebook_ceiling = (tf, faint)


def _align_slopes(ax) -> None:
    """Turn each bandwidth label to the screen angle of its line, and keep the ceilings' labels from
    overprinting (after limits and size are final)."""
    _spread_labels(ax)
    for ann in ax.texts:
        slope = getattr(ann, "casebook_slope", None)
        if slope:
            (x0, y0), (x1, y1) = ax.transData.transform([(slope[0], slope[1]), (slope[2], slope[3])])
            ann.set_rotation(math.degrees(math.atan2(y1 - y0, x1 - x0)))


def _spread_labels(ax, height_pt: float = 9.5) -> None:
    """Ceiling labels at least a line apart on screen: measured ones pushed down from their line, datasheet
    ones pushed up, in order, so that close ceilings (bf16 810, fp16 783) each keep a legible label."""
    to_pt = 72.0 / ax.figure.dpi
    for faint in (False, True):
        anns = [a for a in ax.texts if getattr(a, "casebook_ceiling", (None, None))[1] is faint]
        ys = {id(a): ax.transData.transform((1.0, a.casebook_ceiling[0]))[1] * to_pt for a in anns}
        edge = None  # the far side of the last label placed, in points
        for a in sorted(anns, key=lambda a: -ys[id(a)] if not faint else ys[id(a)]):
            y = ys[id(a)]
            if not faint:
                top = y - 2 if edge is None else min(y - 2, edge - 1)
                a.xyann, edge = (a.xyann[0], top - y), top - height_pt
            else:
                bottom = y + 2 if edge is None else max(y + 2, edge + 1)
                a.xyann, edge = (a.xyann[0], bottom - y), bottom + height_pt


def _declutter(ax, labels: list, line_pt: float = 8.0, lines: int = 8) -> None:
    """Move each label (in order) up or down by whole lines, nearest first, until it lies inside the axes and
    its box overlaps neither a label placed before it nor any other text or the legend of the axes; a label
    that finds no such place within `lines` lines stays where it was. Run once the limits and size are final."""
    renderer = FigureCanvasAgg(ax.figure).get_renderer()
    others = [t for t in ax.texts if t.get_visible() and t not in labels] + [ax.get_legend()]
    taken = [a.get_window_extent(renderer) for a in others if a is not None] + _marker_boxes(ax)
    inside = ax.get_window_extent(renderer)
    for label in labels:
        x, y = label.xyann
        for k in sorted(range(-lines, lines + 1), key=lambda k: (abs(k), -k)):
            label.xyann = (x, y + k * line_pt)
            box = label.get_window_extent(renderer)
            if _within(box, inside) and not any(box.overlaps(t) for t in taken):
                break
        else:
            label.xyann = (x, y)
        taken.append(label.get_window_extent(renderer))


def _marker_boxes(ax) -> list[Bbox]:
    """The display boxes of the axes' scatter markers (a square of each marker's size)."""
    to_px = ax.figure.dpi / 72.0
    out = []
    for c in ax.collections:
        sizes = c.get_sizes()
        for i, (x, y) in enumerate(ax.transData.transform(c.get_offsets())):
            r = math.sqrt(sizes[i % len(sizes)] if len(sizes) else 36.0) / 2 * to_px
            out.append(Bbox.from_extents(x - r, y - r, x + r, y + r))
    return out


def _within(box, outer) -> bool:
    return outer.x0 <= box.x0 and box.x1 <= outer.x1 and outer.y0 <= box.y0 and box.y1 <= outer.y1


def _tf(x: float) -> str:
    return f"{x:,.0f}" if x >= 100 else f"{x:.3g}"


def _ceiling_labels(groups: dict[float, str], apart: float = 1.25) -> list[tuple[float, str, int]]:
    """(height, dtypes, place in its stack) per ceiling: a ceiling within `apart` of the one above it takes
    the next place in that one's stack (on a log axis of several decades their labels would overprint)."""
    out: list[tuple[float, str, int]] = []
    for tf, dtypes in sorted(groups.items(), reverse=True):
        k = out[-1][2] + 1 if out and out[-1][0] / tf < apart else 0
        out.append((tf, dtypes, k))
    return out


def _ceiling_groups(ceilings: dict[str, float]) -> dict[float, str]:
    """One line per measured ceiling; dtypes whose ceilings are the same number (fp8_e4m3 and fp8_e5m2 run
    one matmul rate) share it ("fp8_e4m3/fp8_e5m2"). Ceilings that merely lie close keep a line each."""
    groups: dict[float, list[str]] = {}
    for dtype, tf in sorted(ceilings.items(), key=lambda kv: kv[1]):
        if tf and tf > 0:
            groups.setdefault(round(float(tf), 6), []).append(dtype)
    return {tf: "/".join(d) for tf, d in groups.items()}


def _groups(points: list[dict], keep) -> dict[tuple[str, str], list[dict]]:
    """Points by (variant, dtype): one scatter call per group, not per point (much faster to draw)."""
    out: dict[tuple[str, str], list[dict]] = {}
    for p in points:
        if keep(p):
            out.setdefault((p["variant"], p["dtype"]), []).append(p)
    return out


def roofline(data: dict) -> bytes:
    """Left: the measured roofs (datasheet faint), every level-1 point, each shape's attainable ceiling.
    Right: each point's fraction of its own ceiling, by shape."""
    return _svg(roofline_figure(data))


def roofline_figure(data: dict) -> Figure:
    points = data["points"]
    colors = variant_colors(data["variants"], data.get("baseline"))
    measured, datasheet = data["measured"], data.get("datasheet")
    fig = Figure(figsize=(11, 4.1))
    left, right = fig.subplots(1, 2, gridspec_kw={"width_ratios": [1.25, 1], "wspace": 0.22})

    ais = [p["ai"] for p in points if p.get("ai")]
    ceilings = [c for c in (measured.get("compute_tflops") or {}).values() if c]
    bw = measured.get("bandwidth_gbps") or 1.0
    ridge = ridge_point(max(ceilings), bw) if ceilings else 10.0
    x_lo = min(ais + [ridge]) / 8
    x_hi = max(ais + [ridge]) * 8
    link = data.get("against") == "link"  # a multi-device case: the slope is the interconnect's
    if datasheet:
        _roofs(left, datasheet, x_lo, x_hi, faint=True, label="datasheet link" if link else "datasheet", avoid=ais)
    _roofs(left, measured, x_lo, x_hi, faint=False, label="measured link" if link else "measured", avoid=ais)

    ticks = {}
    for p in points:
        if p.get("ai") and p.get("ceiling_tflops"):
            ticks.setdefault((round(p["ai"], 6), round(p["ceiling_tflops"], 6)), set()).add(p["shape"])
    for ai, ceil in ticks:
        left.plot([ai / 1.22, ai * 1.22], [ceil, ceil], color="#d1495b", lw=2.2, solid_capstyle="butt", zorder=3)
    tick_labels = []
    for ai, ceil, shapes in _tick_labels(ticks):
        label = next(iter(shapes)) if len(shapes) == 1 else f"{len(shapes)} shapes"
        # Above the tick: the region over the roof is empty by construction, so the label hides no point.
        tick_labels.append(left.annotate(
            label, (ai, ceil), xytext=(-3, 5), textcoords="offset points", fontsize=6.5, color="#d1495b", ha="right",
            va="bottom", bbox=dict(boxstyle="square,pad=0.1", fc="white", ec="none", alpha=0.85), zorder=5))
    ys = [p["tflops"] for p in points if p.get("ai") and p.get("tflops")]
    for (variant, dtype), group in _groups(points, lambda p: p.get("ai") and p.get("tflops")).items():
        left.scatter([p["ai"] for p in group], [p["tflops"] for p in group], s=30, color=colors.get(variant, INK),
                     marker=MARKERS.get(dtype, "X"), edgecolors="white", linewidths=0.5, zorder=4)
    _log_axes(left)
    y_top = max(ceilings + ys + [1e-3]) * 3
    # Fitted to the points and their ceiling ticks (the roofs that bind them), at least a decade and a half.
    y_lo = min(min(ys + [t[1] for t in ticks] + [y_top]) / 3, y_top / 30)
    left.set_xlim(x_lo, x_hi)
    left.set_ylim(y_lo, y_top)
    left.set_xlabel("FLOP / byte over the link (the collective's bus bytes)" if link
                    else "arithmetic intensity (FLOP / byte, from the traffic model)")
    left.set_ylabel("TFLOP/s")
    left.set_title(f"Roofline · {data['hardware']}")
    _align_slopes(left)
    _declutter(left, tick_labels)

    shapes = data["shapes"]
    n_var = max(1, len(data["variants"]))
    order = list(MARKERS)
    dtypes = sorted({p["dtype"] for p in points}, key=lambda d: (order.index(d) if d in order else 99, d))
    for (variant, dtype), group in _groups(points, lambda p: p.get("roof_fraction") is not None
                                           and p["shape"] in shapes).items():
        dx = (data["variants"].index(variant) - (n_var - 1) / 2) * 0.75 / n_var
        dx += (dtypes.index(dtype) - (len(dtypes) - 1) / 2) * 0.12 / n_var
        right.scatter([shapes.index(p["shape"]) + dx for p in group], [p["roof_fraction"] for p in group], s=26,
                      color=colors.get(variant, INK), marker=MARKERS.get(dtype, "X"), edgecolors="white",
                      linewidths=0.5, zorder=3)
    right.axhline(1.0, color="#d1495b", lw=1.2, zorder=2)
    right.set_xticks(range(len(shapes)), shapes, rotation=35, ha="right", fontsize=7.5)
    right.set_xlim(-0.6, len(shapes) - 0.4)
    right.set_ylim(0, 1.1)
    right.yaxis.set_major_formatter(PercentFormatter(1.0))
    right.set_ylabel("of the shape's attainable ceiling")
    right.set_title("Distance to the roof, by shape")
    right.grid(axis="x", visible=False)

    handles = [Line2D([], [], ls="", marker="o", color=colors[v], label=v) for v in data["variants"]
               if any(p["variant"] == v for p in points)]
    # Dtype markers hollow and in ink: never mistaken for the baseline's grey.
    handles += [Line2D([], [], ls="", marker=MARKERS.get(d, "X"), color=INK, markerfacecolor="none", label=d)
                for d in dtypes]
    handles += [Line2D([], [], color="#d1495b", lw=2.2, label="attainable ceiling")]
    handles += _roof_handles(datasheet is not None)
    fig.legend(handles=handles, loc="center left", bbox_to_anchor=(0.905, 0.5))
    return fig


def _roof_handles(datasheet: bool) -> list[Line2D]:
    """Legend entries for the roofs' line styles: solid measured, dashed datasheet."""
    out = [Line2D([], [], color=INK, lw=1.6, label="measured roof")]
    if datasheet:
        out.append(Line2D([], [], color=FAINT, lw=1.0, ls=(0, (4, 3)), label="datasheet roof"))
    return out


def speedups(data: dict) -> bytes:
    """Level 2: each variant's speedup over the baseline at every workload shape, and the shape's weight."""
    shapes, weights = data["shapes"], data["weights"]
    series = data["series"]  # {variant: [speedup or None per shape]}
    colors = variant_colors(data["variants"], data.get("baseline"))
    fig = Figure(figsize=(10.5, 3.6))
    top, bottom = fig.subplots(2, 1, sharex=True, gridspec_kw={"height_ratios": [4, 1], "hspace": 0.08})
    n = max(1, len(series))
    width = 0.8 / n
    for k, (variant, values) in enumerate(series.items()):
        xs = [i + (k - (n - 1) / 2) * width for i in range(len(shapes))]
        hs = [v if v is not None else 0 for v in values]
        top.bar(xs, hs, width=width * 0.92, color=colors.get(variant, INK), label=variant, zorder=3)
        g = data.get("geomean", {}).get(variant)
        if g:
            top.axhline(g, color=colors.get(variant, INK), lw=0.9, ls=(0, (3, 2)), zorder=2)
    top.axhline(1.0, color=INK, lw=1.0, zorder=4)
    top.set_ylabel(f"speedup over {data.get('baseline', 'baseline')}")
    top.set_title(f"Level 2 · speedup across the workload · {data['hardware']}  (dashed: weighted geomean)")
    top.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)  # beside the bars, never over them
    top.grid(axis="x", visible=False)
    bottom.bar(range(len(shapes)), weights, color="#c3c8cf", width=0.8, zorder=3)
    for i, w in enumerate(weights):
        bottom.annotate(f"{100 * w:.0f}%", (i, w), xytext=(0, 1), textcoords="offset points", ha="center",
                        va="bottom", fontsize=7, color="#4a5159")
    bottom.set_ylabel("weight")
    bottom.set_ylim(0, max(weights + [0.01]) * 1.6)
    bottom.set_yticks([])
    bottom.grid(visible=False)
    bottom.set_xticks(range(len(shapes)), shapes, rotation=30, ha="right", fontsize=7.5)
    return _svg(fig)


def amdahl(data: dict) -> bytes:
    """Level 3: the baseline split into kernel and rest, the Amdahl prediction, the measurement."""
    return _svg(amdahl_figure(data))


REST_GREY = "#d9dde2"


def amdahl_figure(data: dict) -> Figure:
    """The Amdahl picture; its legend names every fill its bars use (kernel of each variant, the rest, the
    measurement)."""
    base, share, k = data["baseline_us"], data["kernel_share"], data["kernel_speedup"]
    kernel, rest = base * share, base * (1 - share)
    fig = Figure(figsize=(10.5, 2.1))
    ax = fig.subplots()
    rows = [
        (f"baseline ({data['baseline']})", kernel, rest, data["color_base"]),
        ("Amdahl prediction", kernel / k if k else kernel, rest, data["color_variant"]),
    ]
    for y, (label, kpart, rpart, color) in enumerate(rows):
        ax.barh(y, kpart, color=color, height=0.6, zorder=3)
        ax.barh(y, rpart, left=kpart, color=REST_GREY, height=0.6, zorder=3)
        total = kpart + rpart
        note = "" if y == 0 else f"  ({base / total:.2f}×)"
        ax.annotate(f"{total:,.4g} µs{note}", (total, y), xytext=(4, 0), textcoords="offset points",
                    va="center", fontsize=8)
    legend = [Patch(facecolor=data["color_base"], label=f"kernel: {data['baseline']}"),
              Patch(facecolor=data["color_variant"], label=f"kernel: {data['variant']} (Amdahl)"),
              Patch(facecolor=REST_GREY, label="everything else")]
    if data.get("variant_us"):
        v = data["variant_us"]
        measured = dict(facecolor="white", edgecolor=data["color_variant"], hatch="////")
        ax.barh(2, v, height=0.6, zorder=3, **measured)
        ax.annotate(f"{v:,.4g} µs  ({base / v:.2f}×)", (v, 2), xytext=(4, 0), textcoords="offset points",
                    va="center", fontsize=8, fontweight="bold")
        legend.append(Patch(**measured, label=f"measured end to end: {data['variant']}"))
    ax.set_yticks([0, 1, 2], [rows[0][0], rows[1][0], f"measured ({data['variant']})"])
    ax.invert_yaxis()
    ax.set_xlabel("µs per call of the end-to-end scenario")
    ax.grid(axis="y", visible=False)
    ax.set_xlim(0, max(base, data.get("variant_us") or 0) * 1.25)
    ax.legend(handles=legend, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)
    ax.set_title(f"Level 3 · end to end · {data['hardware']}")
    return fig


def atlas(data: dict) -> bytes:
    """Every case's best variant on one machine's roofline."""
    return _svg(atlas_figure(data))


def atlas_figure(data: dict) -> Figure:
    measured, datasheet = data["measured"], data.get("datasheet")
    points = data["points"]  # [{case, ai, tflops}]
    ais = [p["ai"] for p in points] or [1.0]
    ceilings = [c for c in (measured.get("compute_tflops") or {}).values() if c]
    bw = measured.get("bandwidth_gbps") or 1.0
    ridge = ridge_point(max(ceilings), bw) if ceilings else 10.0
    x_lo, x_hi = min(ais + [ridge]) / 8, max(ais + [ridge]) * 8
    fig = Figure(figsize=(10.5, 5.2))
    ax = fig.subplots()
    if datasheet:
        _roofs(ax, datasheet, x_lo, x_hi, faint=True, label="datasheet", avoid=ais)
    _roofs(ax, measured, x_lo, x_hi, faint=False, label="measured", avoid=ais)
    cases = list(dict.fromkeys(p["case"] for p in points))
    many = len(cases) > len(PALETTE)
    names = []
    for i, case in enumerate(cases):
        mine = [p for p in points if p["case"] == case]
        color = PALETTE[i % len(PALETTE)] if not many else matplotlib.colormaps["tab20"](i % 20)
        ax.scatter([p["ai"] for p in mine], [p["tflops"] for p in mine], s=24, color=color, edgecolors="white",
                   linewidths=0.5, zorder=4, label=f"{case} ({mine[0]['variant']})")
        best = max(mine, key=lambda p: p["tflops"])
        names.append(ax.annotate(case, (best["ai"], best["tflops"]), xytext=(4, 3), textcoords="offset points",
                                 fontsize=7, color=color, zorder=5))
    _log_axes(ax)
    ys = [p["tflops"] for p in points]
    ax.set_xlim(x_lo, x_hi)
    ax.set_ylim(min(ys + [max(ceilings + [1.0]) / 1e4]) / 4, max(ceilings + ys + [1e-3]) * 3)
    ax.set_xlabel("arithmetic intensity (FLOP / byte)")
    ax.set_ylabel("TFLOP/s")
    ax.set_title(f"Atlas · {data['hardware']} · best variant of each case run here, every level-1 shape")
    _align_slopes(ax)
    if not many and cases:
        handles, _ = ax.get_legend_handles_labels()
        ax.legend(handles=handles + _roof_handles(datasheet is not None), loc="upper left")
    _declutter(ax, names)
    return fig


def ceilings(data: dict) -> bytes:
    """One machine's measured roofs beside its datasheet roofs, ridge points marked."""
    measured, datasheet = data["measured"], data.get("datasheet")
    all_ceilings = [c for r in (measured, datasheet or {}) for c in (r.get("compute_tflops") or {}).values() if c]
    bws = [r.get("bandwidth_gbps") for r in (measured, datasheet or {}) if r.get("bandwidth_gbps")] or [1.0]
    ridges = [ridge_point(c, b) for c in all_ceilings for b in bws] or [10.0]
    x_lo, x_hi = min(ridges) / 30, max(ridges) * 10
    fig = Figure(figsize=(8, 3.8))
    ax = fig.subplots()
    if datasheet:
        _roofs(ax, datasheet, x_lo, x_hi, faint=True, label="datasheet", labels=False)
    _roofs(ax, measured, x_lo, x_hi, faint=False, label="measured")
    mbw = measured.get("bandwidth_gbps")
    ridges = sorted(((ridge_point(tf, mbw), tf) for tf in _ceiling_groups(measured.get("compute_tflops") or {})),
                    reverse=True) if mbw else []
    labelled: list[float] = []
    for r, tf in ridges:
        ax.scatter([r], [tf], s=18, color="#d1495b", zorder=4)
        if labelled and labelled[-1] / r < 1.3:  # ridges this close (bf16 184, fp16 191) share one label
            continue
        labelled.append(r)
        close = [x for x, _ in ridges if x <= r and r / x < 1.3]
        words = f"ridge {r:.3g}" if len(close) == 1 else "ridges " + " / ".join(f"{x:.3g}" for x in close)
        # Over the slope, left of the point: the region above the roofs is empty.
        ax.annotate(words, (min(close), tf), xytext=(-6, 3), textcoords="offset points", ha="right", va="bottom",
                    fontsize=7, color="#d1495b")
    _log_axes(ax)
    ax.set_xlim(x_lo, x_hi)
    ax.set_ylim(min(bws) * x_lo / 1e3 / 2, max(all_ceilings + [1.0]) * 3)
    ax.set_xlabel("arithmetic intensity (FLOP / byte)")
    ax.set_ylabel("TFLOP/s")
    ax.set_title(f"Ceilings · {data['hardware']}")
    ax.legend(handles=_roof_handles(datasheet is not None), loc="upper left")
    _align_slopes(ax)
    return _svg(fig)


def history(data: dict) -> bytes:
    """Each variant's headline (fraction of the roof) over the commits that stored a result, per machine."""
    machines = data["machines"]
    fig = Figure(figsize=(10.5, 2.8 * len(machines) + 0.6))
    axes = fig.subplots(len(machines), 1, squeeze=False)[:, 0]
    for ax, (machine, series) in zip(axes, machines.items()):
        variants = list(dict.fromkeys(v for e in series for v in e["headline"]))
        for i, variant in enumerate(variants):
            xs = [j for j, e in enumerate(series) if variant in e["headline"]]
            ax.plot(xs, [series[j]["headline"][variant] * 100 for j in xs], marker="o", ms=3.5, lw=1.2,
                    color=PALETTE[i % len(PALETTE)], label=variant)
        ax.set_xticks(range(len(series)), [f"{e['commit']}\n{e['date']}" for e in series], fontsize=7)
        ax.set_ylabel("% of roof (geomean)")
        ax.set_title(f"{data['case']} · {machine}", fontsize=9)
        ax.set_ylim(bottom=0)
        ax.legend(loc="center left", bbox_to_anchor=(1.01, 0.5), fontsize=7, frameon=False)
    fig.subplots_adjust(right=0.8, hspace=0.7)
    return _svg(fig)


RENDERERS = {"roofline": roofline, "speedups": speedups, "amdahl": amdahl, "atlas": atlas, "ceilings": ceilings,
             "history": history}


def render(kind: str, data: dict) -> bytes:
    """Entry point for worker processes."""
    return RENDERERS[kind](data)
