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
import statistics
from pathlib import Path

from pydantic import ValidationError

from casebook import stability
from casebook.case import SpeedupClaim
from casebook.claims import Paired, evaluate, pair_key
from casebook.result import Ceilings, ClaimOutcome, Datasheet, Point, Result, first_error, shape_label
from casebook.results import ResultError, load
from casebook.roofline import FasterThanPhysics, Roofs, launch_count, place, write_share

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


def _label(p: Point) -> str:
    return f"{p.variant} {shape_label(p.shape)} {p.dtype}"


def ceilings_problems(measured: Ceilings, sheet: Datasheet | None) -> list[str]:
    """The measured ceilings against the datasheet, where the machine has one: none above its peak (with
    `DATASHEET_MARGIN`), none missing, none under a hundredth of it."""
    out = []
    pairs = [("copy bandwidth", measured.copy_gbps, sheet.bandwidth_gbps if sheet else None, "GB/s")]
    pairs += [(f"{what} stream", value, sheet.bandwidth_gbps if sheet else None, "GB/s")
              for what, value in (("read", measured.read_gbps), ("write", measured.write_gbps)) if value is not None]
    for dtype, peak in ((sheet.peak_tflops if sheet else None) or {}).items():
        pairs.append((f"{dtype} matmul", measured.matmul_tflops.get(dtype), peak, "TFLOP/s"))
    for what, value, peak, unit in pairs:
        if value is None or not _finite(peak):
            continue
        if not _finite(value) or value <= 0:
            out.append(f"its measured {what} is not a positive number")
        elif value > peak * DATASHEET_MARGIN:
            out.append(f"its measured {what} {value:.4g} {unit} is above the datasheet's {peak:g} {unit}")
        elif value < peak / 100:
            out.append(f"its measured {what} {value:.4g} {unit} is under a hundredth of the datasheet's {peak:g}")
    if not _finite(measured.launch_us) or measured.launch_us <= 0:
        out.append("its measured launch_us is not a positive number")
    if not _finite(measured.graph_launch_us) or measured.graph_launch_us < 0:
        out.append("its measured graph_launch_us is negative or not a number")
    return out


def point_problems(p: Point, measured: Ceilings, link_gbps: float | None = None) -> list[str]:
    """One stored point: its numbers finite, its times positive, placed again on the roofline (its link
    bytes on the result's measured link, `hardware.topology.bus_gbps`, where it has one)."""
    out = []
    for key in (*TIMES, *RATES, "max_rel_err", "cv"):
        if getattr(p, key) is not None and not _finite(getattr(p, key)):
            return [f"{_label(p)}: {key} is not a finite number"]
    if p.status != "ok":
        return out
    for key in TIMES:
        if not _finite(getattr(p, key)) or getattr(p, key) <= 0:
            return [f"{_label(p)}: {key} is not a positive time"]
    if not p.p10_us <= p.median_us <= p.p90_us:
        return [f"{_label(p)}: p10 {p.p10_us:g}, median {p.median_us:g} and p90 {p.p90_us:g} us are out of order"]
    ranks = p.rank_median_us
    if ranks is not None and (not ranks or not all(_finite(m) and m > 0 for m in ranks)
                              or abs(max(ranks) / p.median_us - 1) > AGREE):
        return [f"{_label(p)}: its median {p.median_us:g} us is not the slowest of its ranks' medians ({ranks})"]
    if not (_finite(p.flops) and _finite(p.bytes) and p.flops >= 0 and p.bytes >= 0):
        return [f"{_label(p)}: no traffic (FLOPs and bytes) to place it by"]
    link_ok = _finite(link_gbps) and link_gbps > 0
    roofs = Roofs.under(measured, p.dtype, link_gbps if link_ok else None)
    if not (all(_finite(v) and v > 0 for v in (roofs.compute_tflops, roofs.bandwidth_gbps, roofs.launch_us))
            and _finite(roofs.graph_launch_us) and roofs.graph_launch_us >= 0):
        return [f"{_label(p)}: the result's measured ceilings are incomplete"]
    share = write_share(p.traffic_terms)
    for key, roof in (("compute_roof_tflops", roofs.compute_tflops),
                      ("bandwidth_roof_gbps", roofs.bandwidth_at(share))):
        stored = getattr(p, key)
        if _finite(stored) and abs(stored / roof - 1) > AGREE:
            out.append(f"{_label(p)}: stored {key} {stored:g} is not the result's measured {roof:g}")
    link_bytes = p.link_bytes or 0.0
    if _finite(p.link_roof_gbps) and not (link_ok and abs(p.link_roof_gbps / link_gbps - 1) <= AGREE):
        out.append(f"{_label(p)}: stored link_roof_gbps {p.link_roof_gbps:g} is not the result's measured link "
                   f"({link_gbps})")
    if link_bytes and not (_finite(link_bytes) and 0 <= link_bytes <= p.bytes):
        return [f"{_label(p)}: its link bytes are not part of its bytes"]
    direct, graph = (p.launches.direct, p.launches.graph) if p.launches is not None else (1, 0)
    try:
        n = launch_count(direct + graph, roofs)
        spread = (p.median_us - p.p10_us) / p.median_us
        placed = place(p.flops, p.bytes, n, p.median_us, roofs, spread=spread, host_us=p.host_issue_us or 0.0,
                       link_bytes=link_bytes, write_share=share)
    except FasterThanPhysics as e:
        return [f"{_label(p)}: {e}"]
    except (TypeError, ValueError) as e:
        return [f"{_label(p)}: cannot be placed again ({e})"]
    for key in ("gbps", "tflops"):  # bytes and FLOPs over the median: nothing else goes into them
        mine, stored = getattr(placed, key), getattr(p, key)
        if _finite(stored) and abs(stored - mine) > AGREE * max(abs(mine), 1e-30):
            out.append(f"{_label(p)}: stored {key} {stored:.6g} is not what its median gives ({mine:.6g})")
    # The floor: at least the compute and bandwidth floors of its traffic, at most those or every kernel at a
    # whole launch (how launches count has changed between versions of the harness; these bounds have not);
    # the roof fraction is the floor over the median.
    floor = p.floor_us
    if _finite(floor) and p.launches is not None:  # without its launches recorded, no bound from above
        low = max(placed.compute_floor_us, placed.bandwidth_floor_us, placed.link_floor_us)
        high = max(low, max(direct + graph, 1) * roofs.launch_us)
        if not low * (1 - AGREE) <= floor <= high * (1 + AGREE):
            out.append(f"{_label(p)}: stored floor {floor:.6g} us is outside what its traffic and launches allow "
                       f"({low:.6g}-{high:.6g} us)")
        elif _finite(p.roof_fraction) and abs(p.roof_fraction - floor / p.median_us) > AGREE * (floor / p.median_us):
            out.append(f"{_label(p)}: stored roof_fraction {p.roof_fraction:.6g} is not its floor over its "
                       f"median ({floor / p.median_us:.6g})")
    return out


def stability_problems(p: Point, device: str) -> list[str]:
    """A timed point whose own readings (its spread, what else the machine did) make it unstable by
    `casebook.stability`'s bounds must say so: its `unstable` list judged again, not believed absent."""
    if p.status != "ok" or p.unstable:
        return []
    why = stability.reasons(p, device)
    return [f"{_label(p)}: its readings make it unstable ({'; '.join(why)}), but it is not marked so"] if why else []


def _paired(case, stored: list[ClaimOutcome]) -> Paired:
    """The stored paired timings of the case's speedup claims (found by their text), their speedups taken again
    from their rounds; a timing whose rounds are not all two positive times is left out."""
    over = {c.text: c.over for c in case.claims if isinstance(c, SpeedupClaim)}
    out = {}
    for c in stored:
        if c.text not in over:
            continue
        for run in c.paired or []:
            ratios = sorted(b / a for a, b in run.rounds_us if _finite(a) and _finite(b) and a > 0 and b > 0)
            if not ratios or len(ratios) != len(run.rounds_us):
                continue
            again = run.model_copy(update={"status": "ok", "speedup": statistics.median(ratios),
                                           "speedup_min": ratios[0], "speedup_max": ratios[-1]})
            out[pair_key(c.variant, over[c.text], run.shape, run.dtype)] = again
    return out


def judged(case, result: Result) -> list[ClaimOutcome]:
    """The case's claims judged from the stored points (and the stored paired timings' rounds): what the
    page shows, whatever the file says of them."""
    return evaluate(case, result.hardware.slug, result.kernel_level, result.workload_level, result.end_to_end,
                    _paired(case, result.claims))


def claims_problems(case, result: Result) -> list[str]:
    """Every claim judged again from the stored points, against the stored verdict."""
    stored = result.claims
    if not stored:  # nothing claimed is shown; the page judges the case's claims from the points
        return []
    if [c.text for c in stored] != [c.text for c in case.claims]:
        return ["its claims are not the case's claims (text and order)"]
    word = {True: "held", False: "failed", None: "not applicable"}
    return [f"claim {mine.text!r} is stored as {word[theirs.held]}, but its points say {word[mine.held]} "
            f"({mine.detail})" for mine, theirs in zip(judged(case, result), stored) if mine.held != theirs.held]


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
        return None, f"is not a valid result: {first_error(e, 'the result')}"
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
    hw = result.hardware
    if not isinstance(hw.slug, str) or not SLUG.fullmatch(hw.slug):
        return [f"its hardware name {hw.slug!r} is not a hardware slug"]
    if hw.slug != path.parent.name:
        return [f"its hardware name {hw.slug!r} is not the folder it is stored in ({path.parent.name})"]
    out = ceilings_problems(hw.measured, hw.datasheet)
    link = hw.topology.bus_gbps if hw.topology is not None else None
    device = "cuda" if hw.kind == "gpu" else "cpu"
    for p in result.kernel_level + result.workload_level.points:
        out += point_problems(p, hw.measured, link) + stability_problems(p, device)
    if case is not None and not out:
        out += claims_problems(case, result)
    return out
