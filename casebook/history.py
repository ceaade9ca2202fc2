"""A case's stored results over the repository's commits: git is the database.

Each commit that changed `results/<machine>/<case>.json` is one entry. Between two consecutive
entries of one machine, each variant gets a verdict judged from the two runs' medians and their 95%
confidence intervals: `faster` or `slower` only where the medians moved more than `MOVE` and their
intervals are apart, `same` where they moved less, `undecided` where they moved but the runs' own
noise covers it. A step points at the commits between the two that changed the kernel module.
"""

from __future__ import annotations

import math
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from casebook import results
from casebook.result import Result, shape_label

MOVE = 0.02
"""A median that moved less than this (relative) is the same: run-to-run agreement of the harness."""


@dataclass(frozen=True)
class Entry:
    """One stored result of the case on one machine, as a commit left it."""

    commit: str
    date: str
    machine: str
    result: Result

    @property
    def headline(self) -> dict[str, float]:
        """Each variant's geometric-mean fraction of the roof over its level-1 points."""
        by_variant: dict[str, list[float]] = {}
        for p in self.result.kernel_level:
            if p.status == "ok" and p.roof_fraction:
                by_variant.setdefault(p.variant, []).append(p.roof_fraction)
        return {v: math.exp(sum(map(math.log, fs)) / len(fs)) for v, fs in by_variant.items()}


@dataclass(frozen=True)
class Verdict:
    """How a variant changed between two entries of one machine."""

    variant: str
    machine: str
    before: Entry
    after: Entry
    verdict: str
    points: list[tuple[str, str, float, str]] = field(default_factory=list)
    """(shape, dtype, after/before median ratio, the point's verdict)."""
    kernel_commits: list[str] = field(default_factory=list)
    """Commits between the two that changed the kernels package, where the kernel's hash changed."""


def point_verdict(a, b) -> tuple[float, str]:
    """(b/a median ratio, verdict) of one point timed in both runs."""
    ratio = b.median_us / a.median_us
    if abs(ratio - 1) <= MOVE:
        return ratio, "same"
    ca, cb = a.median_ci_us, b.median_ci_us
    if not ca or not cb or (ca[0] <= cb[1] and cb[0] <= ca[1]):
        return ratio, "undecided"
    return ratio, "slower" if ratio > 1 else "faster"


def variant_verdict(verdicts: list[str]) -> str:
    """One word for a variant from its points' words: a direction only where no point says the other."""
    words = set(verdicts)
    if not words:
        return "undecided"
    if words == {"same"}:
        return "same"
    for direction, other in (("slower", "faster"), ("faster", "slower")):
        if direction in words and other not in words:
            return direction
    return "undecided"


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=repo, capture_output=True, text=True, check=True).stdout


def entries(repo: Path, case_id: str, results_dir: str = "results") -> list[Entry]:
    """Every committed version of the case's results, oldest first."""
    log = _git(repo, "log", "--reverse", "--format=%H %cI", "--name-only", "--",
               f"{results_dir}/*/{case_id}.json")
    out, commit, date = [], None, None
    for line in log.splitlines():
        if not line.strip():
            continue
        head = line.split()
        if len(head) == 2 and len(head[0]) == 40 and "/" not in head[0]:
            commit, date = head
            continue
        try:
            text = _git(repo, "show", f"{commit}:{line}")
        except subprocess.CalledProcessError:  # the file was deleted in this commit
            continue
        with tempfile.NamedTemporaryFile("w", suffix=".json") as f:
            f.write(text)
            f.flush()
            try:
                result = results.load(Path(f.name))
            except results.ResultError:
                continue
        out.append(Entry(commit, date, Path(line).parent.name, result))
    return out


def verdicts(repo: Path, history: list[Entry], kernels_dir: str = "casebook/kernels") -> list[Verdict]:
    """Each variant's verdict between consecutive entries of each machine."""
    out = []
    by_machine: dict[str, list[Entry]] = {}
    for e in history:
        by_machine.setdefault(e.machine, []).append(e)
    for machine, series in by_machine.items():
        for a, b in zip(series, series[1:]):
            commits = []
            if a.result.kernel_sha256 != b.result.kernel_sha256:
                # the hash covers the modules the kernel imports: any file of the kernels package
                commits = _git(repo, "log", "--format=%H", f"{a.commit}..{b.commit}", "--", kernels_dir).split()
            before = {(p.variant, shape_label(p.shape), p.dtype): p for p in a.result.kernel_level
                      if p.status == "ok" and p.median_us}
            per_variant: dict[str, list] = {}
            for p in b.result.kernel_level:
                old = before.get((p.variant, shape_label(p.shape), p.dtype))
                if old is None or p.status != "ok" or not p.median_us:
                    continue
                ratio, word = point_verdict(old, p)
                per_variant.setdefault(p.variant, []).append((shape_label(p.shape), p.dtype, ratio, word))
            for variant, pts in per_variant.items():
                out.append(Verdict(variant, machine, a, b, variant_verdict([w for *_, w in pts]), pts, commits))
    return out
