"""Stored results are evidence, not trusted input: what a result file says is derived again before it is shown.

A result under results/ is a file anyone can edit in a pull request. `casebook check` and `casebook build`
read it through the result model (`results.load`), then re-derive what they would show: every number
finite and every time positive; the hardware name one a slug can be; the file under a size cap; its
measured ceilings within reach of the machine's datasheet; every timed point placed on the roofline again,
from its own traffic and the result's ceilings (a median forged under the floor fails the gate again, and
a stored rate or roof fraction that its median does not give is caught); every claim judged again from
the stored points and compared with the stored verdict, and the claims those of the case, in its order.
"""

from __future__ import annotations

import math
import re
from pathlib import Path

from pydantic import ValidationError

from casebook import stability
from casebook.claims import evaluate, pair_key
from casebook.result import Result
from casebook.results import ResultError, load
from casebook.roofline import FasterThanPhysics, Roofs, compute_roof, launch_count, place

MAX_BYTES = 32 * 2**20
"""The largest result file read (the stored ones are a few hundred KB)."""

DATASHEET_MARGIN = 1.15
"""A measured ceiling may exceed its datasheet peak by this factor (boost clocks), no more."""

AGREE = 1e-3
"""Relative difference at which a stored derived number (a rate, a roof fraction) disagrees with its median."""

SLUG = re.compile(r"[a-z0-9][a-z0-9-]{0,80}")

TIMES = ("median_us", "p10_us", "p90_us")
RATES = ("gbps", "tflops", "floor_us", "roof_fraction", "bytes", "flops")


def _finite(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def _label(p: dict) -> str:
    shape = "x".join(str(v) for v in (p.get("shape") or {}).values())
    return f"{p.get('variant')} {shape} {p.get('dtype')}"


def ceilings_problems(hardware: dict) -> list[str]:
    """The measured ceilings against the datasheet, where the machine has one: none above its peak (with
    `DATASHEET_MARGIN`), none missing, none under a hundredth of it."""
    measured, sheet = hardware.get("measured") or {}, hardware.get("datasheet") or {}
    out = []
    pairs = [("copy bandwidth", measured.get("copy_gbps"), sheet.get("bandwidth_gbps"), "GB/s")]
    for dtype, peak in (sheet.get("peak_tflops") or {}).items():
        pairs.append((f"{dtype} matmul", (measured.get("matmul_tflops") or {}).get(dtype), peak, "TFLOP/s"))
    for what, value, peak, unit in pairs:
        if value is None or not _finite(peak):
            continue
        if not _finite(value) or value <= 0:
            out.append(f"its measured {what} is not a positive number")
        elif value > peak * DATASHEET_MARGIN:
            out.append(f"its measured {what} {value:.4g} {unit} is above the datasheet's {peak:g} {unit}")
        elif value < peak / 100:
            out.append(f"its measured {what} {value:.4g} {unit} is under a hundredth of the datasheet's {peak:g}")
    if "launch_us" in measured and (not _finite(measured["launch_us"]) or measured["launch_us"] <= 0):
        out.append("its measured launch_us is not a positive number")
    graph = measured.get("graph_launch_us")
    if graph is not None and (not _finite(graph) or graph < 0):
        out.append("its measured graph_launch_us is negative or not a number")
    return out


def point_problems(p: dict, measured: dict, link_gbps: float | None = None) -> list[str]:
    """One stored point: its numbers finite, its times positive, placed again on the roofline (its link
    bytes on the result's measured link, `hardware.topology.bus_gbps`, where it has one)."""
    out = []
    for key in (*TIMES, *RATES, "max_rel_err", "cv"):
        if key in p and p[key] is not None and not _finite(p[key]):
            return [f"{_label(p)}: {key} is not a finite number"]
    if p.get("status") != "ok":
        return out
    for key in TIMES:
        if not _finite(p.get(key)) or p[key] <= 0:
            return [f"{_label(p)}: {key} is not a positive time"]
    if not p["p10_us"] <= p["median_us"] <= p["p90_us"]:
        return [f"{_label(p)}: p10 {p['p10_us']:g}, median {p['median_us']:g} and p90 {p['p90_us']:g} us are out "
                "of order"]
    ranks = p.get("rank_median_us")
    if ranks is not None and (not ranks or not all(_finite(m) and m > 0 for m in ranks)
                              or abs(max(ranks) / p["median_us"] - 1) > AGREE):
        return [f"{_label(p)}: its median {p['median_us']:g} us is not the slowest of its ranks' medians "
                f"({ranks})"]
    if not (_finite(p.get("flops")) and _finite(p.get("bytes")) and p["flops"] >= 0 and p["bytes"] >= 0):
        return [f"{_label(p)}: no traffic (FLOPs and bytes) to place it by"]
    compute = compute_roof(measured.get("matmul_tflops") or {}, p.get("dtype"))
    roofs = {"compute_tflops": compute, "bandwidth_gbps": measured.get("copy_gbps"),
             "launch_us": measured.get("launch_us"), "graph_launch_us": measured.get("graph_launch_us") or 0.0}
    if not all(_finite(v) and (v > 0 or k == "graph_launch_us") for k, v in roofs.items()):
        return [f"{_label(p)}: the result's measured ceilings are incomplete"]
    for key, roof in (("compute_roof_tflops", "compute_tflops"), ("bandwidth_roof_gbps", "bandwidth_gbps")):
        if _finite(p.get(key)) and abs(p[key] / roofs[roof] - 1) > AGREE:
            out.append(f"{_label(p)}: stored {key} {p[key]:g} is not the result's measured {roofs[roof]:g}")
    link_bytes = p.get("link_bytes") or 0.0
    stored_link = p.get("link_roof_gbps")
    link_ok = _finite(link_gbps) and link_gbps > 0
    if _finite(stored_link) and not (link_ok and abs(stored_link / link_gbps - 1) <= AGREE):
        out.append(f"{_label(p)}: stored link_roof_gbps {p['link_roof_gbps']:g} is not the result's measured link "
                   f"({link_gbps})")
    if link_bytes and not (_finite(link_bytes) and 0 <= link_bytes <= p["bytes"]):
        return [f"{_label(p)}: its link bytes are not part of its bytes"]
    launches = p.get("launches") or {"direct": 1, "graph": 0}
    try:
        n = launch_count({"direct": int(launches.get("direct", 1)), "graph": int(launches.get("graph", 0))}, roofs)
        spread = (p["median_us"] - p["p10_us"]) / p["median_us"]
        gate = Roofs(roofs["compute_tflops"], roofs["bandwidth_gbps"], roofs["launch_us"],
                     link_gbps=link_gbps if _finite(link_gbps) and link_gbps > 0 else None)
        placed = place(p["flops"], p["bytes"], n, p["median_us"], gate, spread=spread,
                       host_us=p.get("host_issue_us") or 0.0, link_bytes=link_bytes)
    except FasterThanPhysics as e:
        return [f"{_label(p)}: {e}"]
    except (TypeError, ValueError) as e:
        return [f"{_label(p)}: cannot be placed again ({e})"]
    for key in ("gbps", "tflops"):  # bytes and FLOPs over the median: nothing else goes into them
        mine = getattr(placed, key)
        if _finite(p.get(key)) and abs(p[key] - mine) > AGREE * max(abs(mine), 1e-30):
            out.append(f"{_label(p)}: stored {key} {p[key]:.6g} is not what its median gives ({mine:.6g})")
    # The floor: at least the compute and bandwidth floors of its traffic, at most those or every kernel at a
    # whole launch (how launches count has changed between versions of the harness; these bounds have not);
    # the roof fraction is the floor over the median.
    floor, kernels = p.get("floor_us"), int(launches.get("direct", 1)) + int(launches.get("graph", 0))
    if _finite(floor) and p.get("launches"):  # without its launches recorded, no bound from above
        low = max(placed.compute_floor_us, placed.bandwidth_floor_us, placed.link_floor_us)
        high = max(low, max(kernels, 1) * roofs["launch_us"])
        if not low * (1 - AGREE) <= floor <= high * (1 + AGREE):
            out.append(f"{_label(p)}: stored floor {floor:.6g} us is outside what its traffic and launches allow "
                       f"({low:.6g}-{high:.6g} us)")
        elif _finite(p.get("roof_fraction")) and abs(p["roof_fraction"] - floor / p["median_us"]) > AGREE * (
                floor / p["median_us"]):
            out.append(f"{_label(p)}: stored roof_fraction {p['roof_fraction']:.6g} is not its floor over its "
                       f"median ({floor / p['median_us']:.6g})")
    return out


def stability_problems(p: dict, device: str) -> list[str]:
    """A timed point whose own readings (its spread, what else the machine did) make it unstable by
    `casebook.stability`'s bounds must say so: its `unstable` list judged again, not believed absent."""
    if p.get("status") != "ok" or p.get("unstable"):
        return []
    why = stability.reasons(p, device)
    return [f"{_label(p)}: its readings make it unstable ({'; '.join(why)}), but it is not marked so"] if why else []


def _paired(claims: list[dict]) -> dict:
    """The stored paired timings, their speedups taken again from their rounds."""
    import statistics

    out = {}
    for c in claims:
        for run in c.get("paired") or []:
            rounds = run.get("rounds_us") or []
            ratios = sorted(b / a for a, b in rounds if _finite(a) and _finite(b) and a > 0 and b > 0)
            if not ratios or len(ratios) != len(rounds):
                continue
            again = {**run, "speedup": statistics.median(ratios), "speedup_min": ratios[0],
                     "speedup_max": ratios[-1], "status": "ok"}
            out[pair_key(c.get("variant"), run.get("over") or _over(c), run["shape"], run["dtype"])] = again
    return out


def _over(claim: dict) -> str | None:
    return claim.get("over")


def judged(case, doc: dict) -> list[dict]:
    """The case's claims judged from the stored points (and the stored paired timings' rounds): what the
    page shows, whatever the file says of them."""
    stored = [c for c in doc.get("claims") or [] if isinstance(c, dict)]
    by_text = {c.text: c for c in case.claims}
    for c in stored:
        claim = by_text.get(c.get("text"))
        if claim is not None and claim.kind == "speedup":
            c.setdefault("over", claim.over)
    slug = (doc.get("hardware") or {}).get("slug", "")
    points = [p for p in doc.get("kernel_level") or [] if isinstance(p, dict)]
    return evaluate(case, slug, points, doc.get("workload_level") or {}, doc.get("end_to_end") or {},
                    _paired(stored))


def claims_problems(case, doc: dict) -> list[str]:
    """Every claim judged again from the stored points, against the stored verdict."""
    stored = [c for c in doc.get("claims") or [] if isinstance(c, dict)]
    if not stored:  # nothing claimed is shown; the page judges the case's claims from the points
        return []
    texts = [c.text for c in case.claims]
    if [c.get("text") for c in stored] != texts:
        return ["its claims are not the case's claims (text and order)"]
    again = judged(case, doc)
    out = []
    for mine, theirs in zip(again, stored):
        if mine["held"] != theirs.get("held"):
            word = {True: "held", False: "failed", None: "not applicable"}
            out.append(f"claim {mine['text']!r} is stored as {word.get(theirs.get('held'), '?')}, but its points "
                       f"say {word[mine['held']]} ({mine['detail']})")
    return out


def read(path: Path) -> tuple[Result | None, str | None]:
    """The result file at `path` read once, for every check of it (`problems`) and whatever shows it: (the result,
    None), or (None, why it is no result: too large, unreadable, invalid)."""
    path = Path(path)
    try:
        size = path.stat().st_size
    except OSError as e:
        return None, f"cannot be read ({e.strerror})"
    if size > MAX_BYTES:
        return None, f"is {size / 2**20:.0f} MiB, over the {MAX_BYTES // 2**20} MiB a result may be"
    try:
        return load(path), None
    except ValidationError as e:  # the first field at fault, by its place in the document
        first = e.errors()[0]
        return None, f"is not a valid result: {'.'.join(map(str, first['loc']))}: {first['msg']}"
    except (ResultError, ValueError) as e:
        return None, f"is not a valid result: {str(e).splitlines()[0]}"


def problems(path: Path, case=None, result: Result | None = None) -> list[str]:
    """Why the result file at `path` is not evidence for `case` (empty: every check passed). `result`: the file
    as `read` gave it, where the caller has read it already."""
    path = Path(path)
    if result is None:
        result, why = read(path)
        if result is None:
            return [why]
    doc = result.model_dump()
    hw = doc.get("hardware") or {}
    slug = hw.get("slug")
    if not isinstance(slug, str) or not SLUG.fullmatch(slug):
        return [f"its hardware name {slug!r} is not a hardware slug"]
    if slug != path.parent.name:
        return [f"its hardware name {slug!r} is not the folder it is stored in ({path.parent.name})"]
    out = ceilings_problems(hw)
    measured = hw.get("measured") or {}
    points = list(doc.get("kernel_level") or []) + list((doc.get("workload_level") or {}).get("points") or [])
    link = (hw.get("topology") or {}).get("bus_gbps")
    device = "cuda" if hw.get("kind") == "gpu" else "cpu"
    for p in points:
        out += point_problems(p, measured, link) + stability_problems(p, device)
    if case is not None and not out:
        out += claims_problems(case, doc)
    return out
