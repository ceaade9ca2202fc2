"""`casebook validate` and `casebook check`: one `file:line: field: message` line per problem, then a summary."""

from __future__ import annotations

from pathlib import Path

from rich.console import Console
from rich.text import Text

from casebook.load import CaseError


def main(paths: list[Path], strict: bool = False) -> int:
    """Print every problem in the cases under `paths`; 0 when there is no error, 2 otherwise."""
    from casebook.validate import validate

    out = Console(highlight=False, soft_wrap=True)
    try:
        report = validate(paths, strict=strict)
    except Exception as e:  # a bug in casebook: one line, never a traceback
        out.print(Text(f"casebook: internal error ({type(e).__name__}: {e}); please report it", style="red"))
        return 2
    print_problems(report.problems, out)
    bad = {p.path for p in report.errors}
    n = len(report.files)
    summary = f"{n} case file{'s' * (n != 1)} checked{' (strict)' if strict else ''}: "
    if report.errors:
        summary += f"{_count(len(report.errors), 'error')} in {_count(len(bad), 'file')}"
    else:
        summary += "all valid"
    if report.warnings:
        summary += f", {_count(len(report.warnings), 'warning')}"
    out.print(Text(summary, style="bold red" if report.errors else "bold green"))
    return 2 if report.errors else 0


def print_problems(problems: list[CaseError], out: Console) -> None:
    """Each problem on one line, errors in red, warnings in yellow (text, never markup)."""
    for p in problems:
        out.print(Text(str(p), style="yellow" if p.warning else "red"))


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}{'s' * (n != 1)}"
