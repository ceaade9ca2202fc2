"""`casebook compare A.json B.json`: do two results of one case agree, point by point?

Every point timed in both results (levels 1 and 2) above a floor in microseconds is compared by median;
the points that moved more than the tolerance are listed, largest first, with what differs between the
two environments (device, library versions, casebook's sources), so that a reader can tell the
machine's noise from a change.
"""

from __future__ import annotations

import json
from pathlib import Path

from rich.console import Console
from rich.table import Table
from rich.text import Text

from casebook.schema import shape_label

ENVIRONMENT_KEYS = ("device_name", "driver_version", "torch", "triton", "cuda", "casebook_sha256")


def medians(doc: dict) -> dict[tuple[str, str, str, str], float]:
    """(level, variant, shape, dtype) -> median, for every timed point of levels 1 and 2."""
    levels = (("kernel", doc.get("kernel_level") or []), ("workload", (doc.get("workload_level") or {}).get("points") or []))
    return {(level, p["variant"], shape_label(p["shape"]), p["dtype"]): p["median_us"]
            for level, points in levels for p in points if p.get("median_us")}


def main(a: Path, b: Path, min_us: float = 20.0, within: float = 0.02) -> int:
    """0 when every shared point above `min_us` agrees within `within`, 1 when one does not, 2 on bad input."""
    out = Console(highlight=False, soft_wrap=True)
    docs = []
    for path in (a, b):
        try:
            docs.append(json.loads(path.read_text()))
        except (OSError, ValueError) as e:
            out.print(Text(f"{path}: cannot read a result: {e}", style="red"))
            return 2
    first, second = docs
    if first.get("case_id") != second.get("case_id"):
        out.print(Text(f"{a} is case {first.get('case_id')!r}, {b} is {second.get('case_id')!r}: nothing to compare",
                       style="red"))
        return 2
    for key in ENVIRONMENT_KEYS:
        x, y = ((d.get("environment") or {}).get(key) for d in docs)
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
