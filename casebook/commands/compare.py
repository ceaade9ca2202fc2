"""`casebook compare A.json B.json`: do two results of one case agree, point by point?

Every point timed in both results (levels 1 and 2) above a floor in microseconds is compared by median;
the points that moved more than the tolerance are listed, largest first, with what differs between the
two environments (device, library versions, casebook's sources), so that a reader can tell the
machine's noise from a change. Two columns help with that: the p10's change (a median that moved while
the p10 stayed put is a run of slow repetitions, not a slower kernel) and each run's host issue time,
starred where the host decides more than the kernel: above the device time (host-bound; the timer hides
the host unless the call itself waits on the device, as a loop that copies sizes to the host does),
or, in older results timed behind a fixed delay (their protocol records `host_slack_us`), above that
delay, where the host's jitter reached the timing. A third says whether the two medians' 95% confidence
intervals overlap: where they are apart, the move is beyond either run's own sampling noise, a shift
between the runs (the machine, its clocks, the code), not too few repetitions.
"""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console
from rich.table import Table
from rich.text import Text

from casebook import results
from casebook.result import Point, Result, shape_label

ENVIRONMENT_KEYS = ("device_name", "driver_version", "torch", "triton", "cuda", "casebook_sha256")


def timed_points(result: Result) -> dict[tuple[str, str, str, str], Point]:
    """(level, variant, shape, dtype) -> point, for every timed point of levels 1 and 2."""
    points = [("kernel", p) for p in result.kernel_level]
    points += [("workload", p) for p in result.workload_level.points]
    return {(level, p.variant, shape_label(p.shape), p.dtype): p
            for level, p in points if p.median_us}


def _host_reached(point: Point, fixed_slack_us: float | None) -> bool:
    us = point.host_issue_us or 0.0
    return us > (point.median_us if fixed_slack_us is None else fixed_slack_us)


def _host(point: Point, fixed_slack_us: float | None) -> str:
    us = point.host_issue_us
    return "-" if us is None else f"{us:.0f}" + ("*" if _host_reached(point, fixed_slack_us) else "")


def _intervals(a: Point, b: Point) -> str:
    """'apart' where the two medians' 95% confidence intervals do not overlap, 'overlap' where they do."""
    ca, cb = a.median_ci_us, b.median_ci_us
    if not ca or not cb:
        return "-"
    return "overlap" if ca[0] <= cb[1] and cb[0] <= ca[1] else "apart"


@dataclass
class Agreement:
    """Two results of one case, point by point: what `casebook compare` prints, as data."""

    points_a: dict[tuple[str, str, str, str], Point]
    points_b: dict[tuple[str, str, str, str], Point]
    rows: list[tuple[float, tuple]]
    """(relative change of the median, point key) for every point timed in both above `min_us`, largest first."""
    moved: list[tuple[float, tuple]]
    """The rows that moved more than `within`."""
    only: int
    """Points timed in only one of the two."""
    environment: list[tuple[str, object, object]]
    """(key, A's value, B's value) where the two environments differ."""

    @property
    def geomean_ratio(self) -> float | None:
        """B's medians over A's, geometric mean over the rows (above 1: B is slower)."""
        if not self.rows:
            return None
        return math.exp(sum(math.log1p(change) for change, _ in self.rows) / len(self.rows))


def agreement(first: Result, second: Result, min_us: float = 20.0, within: float = 0.02) -> Agreement:
    """Compare two results of one case: every point timed in both above `min_us`, median against median."""
    env = [(key, x, y) for key in ENVIRONMENT_KEYS
           for x, y in [tuple(getattr(r.environment, key) for r in (first, second))] if x != y]
    pa, pb = timed_points(first), timed_points(second)
    ma, mb = ({k: p.median_us for k, p in points.items()} for points in (pa, pb))
    rows = sorted(((mb[k] / ma[k] - 1, k) for k in ma.keys() & mb.keys() if min(ma[k], mb[k]) > min_us),
                  key=lambda r: -abs(r[0]))
    return Agreement(pa, pb, rows, [r for r in rows if abs(r[0]) > within], len(ma.keys() ^ mb.keys()), env)


def show(out: Console, first: Result, second: Result, names: tuple[str, str], min_us: float = 20.0,
         within: float = 0.02) -> Agreement:
    """Print how `second` agrees with `first`: differing environment, the points that moved, a summary line."""
    ag = agreement(first, second, min_us, within)
    for key, x, y in ag.environment:
        out.print(f"environment differs: {key} {x} vs {y}")
    pa, pb = ag.points_a, ag.points_b
    fa, fb = (r.protocol.host_slack_us for r in (first, second))
    if ag.moved:
        table = Table(header_style="bold", title_justify="left",
                      title=f"points that moved more than {within:.1%} ({names[0]} -> {names[1]})")
        numeric = ("change", "p10 change", "A us", "B us", "host us A / B")
        for col in ("change", "p10 change", "level", "variant", "shape", "dtype", "A us", "B us", "host us A / B",
                    "95% CIs"):
            table.add_column(col, justify="right" if col in numeric else "left")
        for change, key in ag.moved:
            level, variant, shape, dtype = key
            a10, b10 = pa[key].p10_us, pb[key].p10_us
            table.add_row(f"{change:+.2%}", f"{b10 / a10 - 1:+.2%}" if a10 and b10 else "-", level, variant, shape,
                          dtype, f"{pa[key].median_us:.1f}", f"{pb[key].median_us:.1f}",
                          f"{_host(pa[key], fa)} / {_host(pb[key], fb)}", _intervals(pa[key], pb[key]))
        out.print(table)
        if any(_host_reached(p, f) for _, k in ag.moved for p, f in ((pa[k], fa), (pb[k], fb))):
            out.print("* host-bound: issuing the call took longer than the device ran it (hidden from the timing "
                      "unless the call waits on the device), or, in an older result, longer than the fixed delay "
                      "it was timed behind (host jitter reached the timing)")
    ratio = ag.geomean_ratio
    out.print(f"{len(ag.rows)} points above {min_us:g} us in both; {len(ag.rows) - len(ag.moved)} within {within:.0%}"
              + (f"; B's medians {ratio:.3f}x A's (geometric mean)" if ratio is not None else "")
              + (f"; {ag.only} timed in only one of the two" if ag.only else ""))
    return ag


def machine_line(label: str, path: Path, r: Result) -> str:
    """`A: results/x.json: NVIDIA H200 (nvidia-h200), 2026-12-01T10:00:00+00:00; ceilings: copy 4,246 GB/s, ...`."""
    hw = r.hardware
    m = hw.measured
    roofs = [f"copy {m.copy_gbps:,.0f} GB/s"] if isinstance(m.copy_gbps, (int, float)) else []
    roofs += [f"{d} {v:,.0f} TFLOP/s" if v >= 100 else f"{d} {v:.3g} TFLOP/s"
              for d, v in m.matmul_tflops.items() if isinstance(v, (int, float))]
    roofs += [f"launch {m.launch_us:.3g} us"] if isinstance(m.launch_us, (int, float)) else []
    return (f"{label}: {path}: {hw.name or '?'} ({hw.slug or '?'}), {r.started_at}; "
            f"ceilings: {', '.join(roofs) or 'none stored'}")


def main(a: Path, b: Path, min_us: float = 20.0, within: float = 0.02, across_machines: bool = False) -> int:
    """0 when every shared point above `min_us` agrees within `within`, 1 when one does not, 2 on bad input
    (and when the two results come from different machines, unless `across_machines`)."""
    out = Console(highlight=False, width=None if sys.stdout.isatty() else 150)
    try:
        first, second = results.load(a), results.load(b)
    except ValueError as e:  # unreadable, newer than this casebook, or not a result
        out.print(Text(f"cannot compare: {e}", style="red"))
        return 2
    if first.case_id != second.case_id:
        out.print(Text(f"{a} is case {first.case_id!r}, {b} is {second.case_id!r}: nothing to compare", style="red"))
        return 2
    out.print(machine_line("A", a, first))
    out.print(machine_line("B", b, second))
    slugs = [r.hardware.slug for r in (first, second)]
    if slugs[0] != slugs[1]:
        if not across_machines:
            out.print(Text(f"the two results come from different machines ({slugs[0]} and {slugs[1]}): their times "
                           "differ by the machine, not by run-to-run noise; pass --across-machines to compare "
                           "them anyway", style="red"))
            return 2
        out.print(Text(f"different machines ({slugs[0]} and {slugs[1]}): a move below is the machine's",
                       style="yellow"))
    return 1 if show(out, first, second, (a.name, b.name), min_us, within).moved else 0
