"""Beyond one machine and one moment: projections onto the registry's other GPUs, and each case's
history over the repository's commits. Projections are marked as such and never judge a claim."""

from __future__ import annotations

import math
import subprocess
from pathlib import Path

from casebook import history as history_mod
from casebook.datasheets import datasheets
from casebook.projection import Projection, ProjectionError, nearest_source, project
from casebook.render import links, text
from casebook.render.book import Book, Entry
from casebook.render.figures import best_variant
from casebook.render.templates import front_matter, render
from casebook.result import Ceilings

PROJECTIONS = "projections.md"
HISTORY = "history.md"
RECENT_SLOWER = 20
"""The history page lists this many of the most recent `slower` verdicts."""


def _geomean(xs: list[float]) -> float:
    return math.exp(sum(map(math.log, xs)) / len(xs))


def measured_ceilings(book: Book) -> dict[str, Ceilings]:
    """{GPU slug: the measured ceilings of its latest stored result}."""
    out = {}
    for slug, stored in book.hardware().items():
        latest = max(stored, key=lambda r: r.result.started_at).result.hardware
        if latest.kind == "gpu" and latest.measured.copy_gbps:
            out[slug] = latest.measured
    return out


def case_projections(entry: Entry, book: Book) -> list[dict]:
    """For each registry GPU without a result of this case: the band of every variant, from the case's GPU result
    nearest that GPU (`projection.nearest_source`). Empty when the case has no GPU result."""
    gpu = {r.slug: r for r in entry.results if r.result.hardware.kind == "gpu" and not r.stale}
    if not gpu:
        return []
    have = {r.slug for r in entry.results}
    ceilings, out = measured_ceilings(book), []
    for target, spec in datasheets().items():
        if target in have:
            continue
        source = gpu[nearest_source(list(gpu), target, datasheets())]
        try:
            roofs, points = project(source.result, target, datasheets(), ceilings)
        except ProjectionError:
            continue
        out.append({"slug": target, "name": spec["name"], "basis": roofs.basis, "source": source.hardware_name,
                    "rows": _variant_rows(points, best_variant(entry, source)), "points": _point_rows(points),
                    "bounds": {p.regime: p.bound for p in points},
                    "edges_meet": all(_edges_meet(p) for p in points)})
    return out


def _edges_meet(p: Projection) -> bool:
    """Whether the band is one time: the target's roofs bind before the per-SM cap does."""
    return math.isclose(p.optimistic_us, p.pessimistic_us, rel_tol=5e-3)


def _point_rows(points: list[Projection]) -> list[dict]:
    """Every projected level-1 point, as the case page's projected tab lists it: both edges of its band."""
    return [{"shape": text.shape_short(p.shape), "variant": p.variant, "dtype": p.dtype, "source": text.us(p.source_us),
             "optimistic": text.us(p.optimistic_us), "pessimistic": text.us(p.pessimistic_us), "regime": p.regime}
            for p in points]


def _variant_rows(points: list[Projection], best: str | None) -> list[dict]:
    rows = []
    for variant in dict.fromkeys(p.variant for p in points):
        mine = [p for p in points if p.variant == variant]
        rows.append({"variant": variant, "best": variant == best, "points": len(mine),
                     "fast": text.times(_geomean([p.source_us / p.optimistic_us for p in mine])),
                     "slow": text.times(_geomean([p.source_us / p.pessimistic_us for p in mine])),
                     "bounds": ", ".join(sorted({p.regime for p in mine}))})
    return rows


def accuracy(book: Book) -> list[dict]:
    """Where a case has results on two GPUs: how well one projects onto the other, per variant."""
    ceilings, out = measured_ceilings(book), []
    for entry in book.entries:
        gpu = [r for r in entry.results if r.result.hardware.kind == "gpu"]
        for src in gpu:
            for dst in gpu:
                if src is dst:
                    continue
                try:
                    _, points = project(src.result, dst.slug, datasheets(), ceilings, actual=dst.result)
                except ProjectionError:  # a result that records no SM count (stored before results did)
                    continue
                judged = [p for p in points if p.measured_us is not None]
                if judged:
                    out.append({"case": entry.id, "from": src.hardware_name, "to": dst.hardware_name,
                                "points": len(judged),
                                "in_band": text.pct(sum(bool(p.in_band) for p in judged) / len(judged)),
                                "error": text.pct(sorted(abs(p.error) for p in judged)[len(judged) // 2])})
    return out


def projections_page(book: Book) -> str:
    cases = []
    for entry in book.entries:
        targets = case_projections(entry, book)
        if targets:
            cases.append({"title": entry.case.title, "url": links.rel(PROJECTIONS, links.case_page(entry.id)),
                          "targets": targets})
    return render("projections", front_matter=front_matter("Projections"), cases=cases, accuracy=accuracy(book))


# --- history -------------------------------------------------------------------------------------


def case_history(entry: Entry, repo: Path) -> tuple[list[history_mod.Entry], list[history_mod.Verdict]]:
    """The case's committed results and the verdicts between them; empty outside a git checkout."""
    try:
        found = history_mod.entries(repo, entry.id)
        return found, history_mod.verdicts(repo, found)
    except (subprocess.CalledProcessError, OSError):
        return [], []


def history_plot(entry: Entry, found: list[history_mod.Entry]) -> dict | None:
    """The history figure's data: per machine, each variant's headline over the commits."""
    machines = {}
    for e in found:
        machines.setdefault(e.machine, []).append({"commit": e.commit[:7], "date": e.date[:10],
                                                   "headline": e.headline})
    if not any(len(series) > 1 for series in machines.values()):
        return None
    return {"case": entry.id, "machines": machines}


def history_page(book: Book, repo: Path, images: dict[str, str]) -> str:
    cases, slower = [], []
    for entry in book.entries:
        found, judged = case_history(entry, repo)
        if not found:
            continue
        cases.append({"title": entry.case.title, "url": links.rel(HISTORY, links.case_page(entry.id)),
                      "results": len(found), "machines": len({e.machine for e in found}),
                      "image": links.rel(HISTORY, images[entry.id]) if entry.id in images else None})
        slower += [_verdict_row(entry, v) for v in judged if v.verdict == "slower"]
    slower.sort(key=lambda row: row["date"], reverse=True)
    return render("history", front_matter=front_matter("History"), cases=cases, slower=slower[:RECENT_SLOWER])


def _verdict_row(entry: Entry, v: history_mod.Verdict) -> dict:
    worst = max(v.points, key=lambda p: p[2])
    return {"case": entry.id, "machine": v.machine, "variant": v.variant, "before": v.before.commit[:9],
            "after": v.after.commit[:9], "date": v.after.date[:10],
            "worst": f"{worst[0]} {worst[1]} {worst[2]:.2f}x",
            "commits": " ".join(c[:9] for c in v.kernel_commits) or "kernel unchanged"}
