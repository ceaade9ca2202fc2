"""`casebook list`: a table of the cases, filtered by pattern, bottleneck or operator."""

from __future__ import annotations

import difflib
import typing
from pathlib import Path

from rich.console import Console
from rich.table import Table
from rich.text import Text


def main(cases_dir: Path, pattern: str | None = None, bottleneck: str | None = None,
         operator: str | None = None) -> int:
    """Print the matching cases; 2 when a filter is unknown or any case is invalid."""
    from casebook.case import Bottleneck, Pattern
    from casebook.commands.validate import print_problems
    from casebook.validate import validate

    out = Console(highlight=False, soft_wrap=True)
    if not out.is_terminal:  # piped or captured: never squeeze the table to 80 columns
        out = Console(highlight=False, soft_wrap=True, width=200)
    for option, value, allowed in (("--pattern", pattern, typing.get_args(Pattern)),
                                   ("--bottleneck", bottleneck, typing.get_args(Bottleneck) + ("mixed",))):
        if value is not None and value not in allowed:
            close = difflib.get_close_matches(value, allowed, n=1)
            hint = f"did you mean {close[0]!r}? " if close else ""
            out.print(Text(f"{option}: unknown value {value!r}; {hint}(one of: {', '.join(allowed)})", style="red"))
            return 2
    report = validate([cases_dir])
    print_problems(report.errors, out)
    table = Table(header_style="bold", title_justify="left")
    for name in ("id", "operator", "bottleneck", "patterns", "title"):
        table.add_column(name, no_wrap=name in ("id", "operator", "bottleneck"))
    shown = 0
    for _, case, _ in sorted(report.cases, key=lambda c: c[1].id):
        kinds = {case.bottleneck.kind} | {s.kind for s in case.bottleneck.stages}
        if (pattern and pattern not in case.patterns) or (bottleneck and bottleneck not in kinds) \
                or (operator and operator != case.operator):
            continue
        table.add_row(case.id, case.operator, case.bottleneck.kind, ", ".join(case.patterns), case.title)
        shown += 1
    if shown:
        out.print(table)
    out.print(Text(f"{shown} of {len(report.cases)} case{'s' * (len(report.cases) != 1)}"
                   + (f"; {len(report.errors)} problem(s) above" if report.errors else "")))
    return 2 if report.errors else 0
