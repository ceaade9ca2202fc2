"""`casebook compare A.json B.json`: do two results of one case agree, point by point?

Every point timed in both results (levels 1 and 2) above a floor in microseconds is compared by median;
the points that moved more than the tolerance are listed, largest first, with what differs between the
two environments (device, library versions, casebook's sources), so that a reader can tell the
machine's noise from a change.
"""

from __future__ import annotations

from pathlib import Path

from rich.console import Console
from rich.table import Table
from rich.text import Text

from casebook import results
from casebook.schema import Result, shape_label

ENVIRONMENT_KEYS = ("device_name", "driver_version", "torch", "triton", "cuda", "casebook_sha256")


def medians(result: Result) -> dict[tuple[str, str, str, str], float]:
    """(level, variant, shape, dtype) -> median, for every timed point of levels 1 and 2."""
    points = [("kernel", p.model_dump()) for p in result.kernel_level]
    points += [("workload", p) for p in result.workload_level.get("points") or []]
    return {(level, p["variant"], shape_label(p["shape"]), p["dtype"]): p["median_us"]
            for level, p in points if p.get("median_us")}


def main(a: Path, b: Path, min_us: float = 20.0, within: float = 0.02) -> int:
    """0 when every shared point above `min_us` agrees within `within`, 1 when one does not, 2 on bad input."""
    out = Console(highlight=False, soft_wrap=True)
    try:
        first, second = results.load(a), results.load(b)
    except ValueError as e:  # unreadable, newer than this casebook, or not a result
        out.print(Text(f"cannot compare: {e}", style="red"))
        return 2
    if first.case_id != second.case_id:
        out.print(Text(f"{a} is case {first.case_id!r}, {b} is {second.case_id!r}: nothing to compare", style="red"))
        return 2
    for key in ENVIRONMENT_KEYS:
        x, y = (r.environment.get(key) for r in (first, second))
        if x != y:
            out.print(f"environment differs: {key} {x} vs {y}")
    ma, mb = medians(first), medians(second)
    rows = sorted(((mb[k] / ma[k] - 1, k) for k in ma.keys() & mb.keys() if min(ma[k], mb[k]) > min_us),
                  key=lambda r: -abs(r[0]))
    moved = [r for r in rows if abs(r[0]) > within]
    if moved:
        table = Table(header_style="bold", title_justify="left",
                      title=f"points that moved more than {within:.1%} ({a.name} -> {b.name})")
        for col in ("change", "level", "variant", "shape", "dtype", "A us", "B us"):
            table.add_column(col, justify="right" if col in ("change", "A us", "B us") else "left")
        for change, key in moved:
            level, variant, shape, dtype = key
            table.add_row(f"{change:+.2%}", level, variant, shape, dtype, f"{ma[key]:.1f}", f"{mb[key]:.1f}")
        out.print(table)
    only = len(ma.keys() ^ mb.keys())
    out.print(f"{len(rows)} points above {min_us:g} us in both; {len(rows) - len(moved)} within {within:.0%}"
              + (f"; {only} timed in only one of the two" if only else ""))
    return 1 if moved else 0
