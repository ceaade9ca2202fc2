"""`casebook history CASE`: each variant's headline over the commits that stored the case's results,
and a verdict for every change (faster, slower, same, undecided), judged from the runs' own noise."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from rich.console import Console
from rich.table import Table

from casebook import history
from casebook.commands import console as terminal

STYLE = {"slower": "bold red", "faster": "green", "same": "dim", "undecided": "yellow"}


def main(case: str, repo: Path = Path("."), machine: str | None = None) -> int:
    """0 when shown, 2 on bad input (not a git checkout, no stored results)."""
    err = terminal(stderr=True, highlight=False)
    out = Console(highlight=False, width=None if sys.stdout.isatty() else 160)
    case_id = Path(case).stem
    try:
        found = history.entries(repo, case_id)
    except (subprocess.CalledProcessError, OSError) as e:
        err.print(f"{repo}: history reads git, and git failed here: {getattr(e, 'stderr', '') or e}".strip())
        return 2
    found = [e for e in found if machine is None or e.machine == machine]
    if not found:
        err.print(f"{case_id}: no committed results{' on ' + machine if machine else ''} in {repo.resolve()}")
        return 2
    for slug in dict.fromkeys(e.machine for e in found):
        series = [e for e in found if e.machine == slug]
        variants = list(dict.fromkeys(v for e in series for v in e.headline))
        table = Table("commit", "date", "kernel", *variants,
                      title=f"{case_id} on {slug}: geomean fraction of the roof at level 1")
        for e in series:
            table.add_row(e.commit[:9], e.date[:10], e.result.kernel_sha256[:8],
                          *(f"{e.headline[v]:.0%}" if v in e.headline else "-" for v in variants))
        out.print(table)
    changes = Table("machine", "variant", "from", "to", "verdict", "points (after/before)", "kernel changed in",
                    title="Changes between consecutive results")
    for v in history.verdicts(repo, found):
        moved = ", ".join(f"{s} {d} {r:.2f}x" for s, d, r, w in v.points if w != "same") or "all within 2%"
        changes.add_row(v.machine, v.variant, v.before.commit[:9], v.after.commit[:9],
                        f"[{STYLE[v.verdict]}]{v.verdict}[/]", moved,
                        " ".join(c[:9] for c in v.kernel_commits) or "-")
    out.print(changes)
    return 0
