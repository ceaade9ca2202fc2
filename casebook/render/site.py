"""From the book to files: every generated page and image, keyed by its path in the docs tree.

Images are the slow part (matplotlib): each is cached by the hash of its input data and of plots.py,
and the misses are drawn by a pool of worker processes.
"""

from __future__ import annotations

import hashlib
import json
import os
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from casebook.render import figures, links, outlook, pages, plots, views
from casebook.render.book import Book

PLOTS_SOURCE = Path(plots.__file__)


@dataclass
class Generated:
    pages: dict[str, str]  # docs path -> Markdown
    images: dict[str, tuple[str, dict]]  # docs path -> (plot kind, data)
    home: str = ""  # the book's part of the home page (docs/index.md's HOME_MARKER)


HOME_MARKER = "<!-- casebook:book -->"


def plan(book: Book, repo: Path | None = None) -> Generated:
    """Every page's Markdown and every image's input (images are drawn later, by `draw`). `repo`, the git
    checkout whose commits hold the results, feeds the history page."""
    images: dict[str, tuple[str, dict]] = {}
    for entry in book.entries:
        case_images: dict[tuple[str, str], str] = {}
        colors = plots.variant_colors([v.name for v in entry.case.kernel.variants], entry.case.kernel.baseline)
        for stored in entry.results:
            for kind, data in (("roofline", figures.roofline(entry, stored)),
                               ("speedups", figures.speedups(entry, stored)),
                               ("amdahl", figures.amdahl(entry, stored, colors))):
                if data is not None:
                    path = links.image(f"{entry.id}/{stored.slug}-{kind}")
                    images[path] = (kind, data)
                    case_images[(stored.slug, kind)] = path
        entry.images = case_images  # type: ignore[attr-defined]
    atlas_images, hardware_images = {}, {}
    titles = views.machine_titles(book)
    for slug, results in book.hardware().items():
        pairs = [(book.get(r.result.case_id), r) for r in results]
        data = figures.atlas(titles[slug], pairs)
        if data:
            atlas_images[slug] = images_path = links.image(f"atlas/{slug}")
            images[images_path] = ("atlas", data)
        latest = max(results, key=lambda r: r.result.started_at)
        hardware_images[slug] = path = links.image(f"hardware/{slug}")
        images[path] = ("ceilings", figures.ceilings(titles[slug], latest.result.hardware))

    out = {links.case_page(e.id): pages.case_page(e, book, e.images) for e in book.entries}  # type: ignore[attr-defined]
    out[links.CASE_INDEX] = pages.case_index(book)
    out[links.NOTEBOOK_INDEX] = pages.notebooks_index(book)
    for notebook in book.notebooks.values():
        out[links.notebook_page(notebook.name)] = pages.notebook_page(notebook, book)
    out[links.BY_BOTTLENECK] = pages.by_bottleneck(book)
    out[links.BY_PATTERN] = pages.by_pattern(book)
    out[links.BY_OPERATOR] = pages.by_operator(book)
    out[links.BY_HARDWARE] = pages.by_hardware(book)
    out[links.TRANSFERS] = pages.transfers(book)
    out[links.CLAIMS] = pages.claims(book)
    out[links.TAGS] = pages.tags_page()
    out[links.ATLAS] = pages.atlas(book, atlas_images)
    out[links.HARDWARE] = pages.hardware(book, hardware_images)
    out[outlook.PROJECTIONS] = outlook.projections_page(book)
    history_images = {}
    for entry in book.entries if repo is not None else []:
        data = outlook.history_plot(entry, outlook.case_history(entry, repo)[0])
        if data is not None:
            history_images[entry.id] = path = links.image(f"history/{entry.id}")
            images[path] = ("history", data)
    out[outlook.HISTORY] = outlook.history_page(book, repo, history_images) if repo is not None else \
        outlook.history_page(book, Path("/nonexistent"), {})
    return Generated(out, images, pages.home(book, atlas_images))


def draw(images: dict[str, tuple[str, dict]], cache_dir: Path | None, workers: int | None = None) -> dict[str, bytes]:
    """SVG bytes for every image: from the cache where the input is unchanged, else drawn (in parallel)."""
    salt = hashlib.sha256(PLOTS_SOURCE.read_bytes()).hexdigest()
    keys = {path: _key(salt, kind, data) for path, (kind, data) in images.items()}
    out: dict[str, bytes] = {}
    todo = []
    for path, key in keys.items():
        hit = cache_dir / f"{key}.svg" if cache_dir else None
        if hit and hit.is_file():
            out[path] = hit.read_bytes()
        else:
            todo.append(path)
    workers = workers if workers is not None else min(2, os.cpu_count() or 1)
    if len(todo) > 4 and workers > 1:
        with ProcessPoolExecutor(max_workers=workers) as pool:
            drawn = pool.map(plots.render, *zip(*(images[p] for p in todo)), chunksize=4)
            out.update(zip(todo, drawn))
    else:
        out.update((p, plots.render(*images[p])) for p in todo)
    if cache_dir:
        cache_dir.mkdir(parents=True, exist_ok=True)
        for path in todo:
            (cache_dir / f"{keys[path]}.svg").write_bytes(out[path])
    return out


def _key(salt: str, kind: str, data: dict) -> str:
    blob = json.dumps([salt, kind, data], sort_keys=True, default=str).encode()
    return hashlib.sha256(blob).hexdigest()[:32]
