"""mkdocs hooks (named in mkdocs.yml): the generated pages and images join the hand-written docs.

Nothing is written into docs/: pages and SVGs are handed to mkdocs as generated files, so that
`mkdocs build`, `mkdocs serve` and `casebook build` all see the same site and git sees nothing.
Where the cases, results and notebooks are read from: CASEBOOK_CASES / CASEBOOK_RESULTS / CASEBOOK_NOTES, else
cases/ and results/ beside mkdocs.yml and notes/ beside the cases.
"""

from __future__ import annotations

import html
import logging
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:  # mkdocs loads hooks by path; casebook may not be installed
    sys.path.insert(0, str(ROOT))

from mkdocs.structure.files import File, Files  # noqa: E402

from casebook.render import links, site  # noqa: E402
from casebook.render.book import Book, BookError, load_book  # noqa: E402

log = logging.getLogger("mkdocs.plugins.casebook")
_state: dict = {}


def _dirs(config) -> tuple[Path, Path, Path, Path]:
    base = Path(config.config_file_path).parent
    cases = Path(os.environ.get("CASEBOOK_CASES") or base / "cases")
    results = Path(os.environ.get("CASEBOOK_RESULTS") or base / "results")
    notes = Path(os.environ.get("CASEBOOK_NOTES") or cases.parent / "notes")
    cache = Path(os.environ.get("CASEBOOK_PLOT_CACHE") or base / ".cache" / "casebook-plots")
    return cases, results, notes, cache


def on_config(config):
    """Load and validate the book (a bad case fails the build), and list every case in the nav."""
    cases, results, notes, _ = _dirs(config)
    try:
        book = load_book(cases, results, notes)
    except BookError as err:
        raise SystemExit(f"casebook: {err}") from None
    for warning in book.warnings:
        log.warning(warning)  # counted by --strict
    _state["book"] = book
    _extend_nav(config.nav, book)
    return config


def _extend_nav(nav: list | None, book: Book) -> None:
    """One entry per case under the nav section that holds cases/index.md, one per notebook under the section
    that holds notebooks/index.md."""
    listed = {links.CASE_INDEX: [(e.case.title, links.case_page(e.id)) for e in book.entries],
              links.NOTEBOOK_INDEX: [(n.name, links.notebook_page(n.name)) for n in book.notebooks.values()]}
    for item in nav or []:
        if isinstance(item, dict):
            for value in item.values():
                if not isinstance(value, list):
                    continue
                index = next((k for k in listed if k in value), None)
                if index is not None:
                    value[:] = [index] + [{html.escape(title): path} for title, path in listed[index]]
                else:
                    _extend_nav(value, book)


def on_files(files: Files, config) -> Files:
    book: Book = _state["book"]
    cache = _dirs(config)[3]
    generated = site.plan(book, repo=ROOT)
    _state["home"] = generated.home
    for path, markdown in generated.pages.items():
        files.append(File.generated(config, path, content=markdown))
    workers = int(os.environ.get("CASEBOOK_WORKERS", "0")) or None
    for path, svg in site.draw(generated.images, cache if not os.environ.get("CASEBOOK_NO_CACHE") else None,
                               workers).items():
        files.append(File.generated(config, path, content=svg))
    return files


def on_page_markdown(markdown: str, page, config, files):
    """The home page shows the book: docs/index.md's marker becomes the generated cards and atlas."""
    if page.file.src_uri == "index.md" and site.HOME_MARKER in markdown:
        return markdown.replace(site.HOME_MARKER, _state.get("home", ""))
    return markdown


LUNR_TOKENSET_FIX = """
/* casebook: lunr keys a token-set node by its edges' labels and its children's ids run together, so where
   labels are digits two nodes can share a key (edges 1->node 2, 3->node 4 and edge 1->node 234 both read
   "01234") and minimisation merges them: a prefix query on a number then expands to tokens the index lacks,
   and lunr throws (olivernn/lunr.js#314). With each id closed by a comma a key is one node's. Appended to the
   theme's search worker by casebook's mkdocs hooks. */
if (self.lunr && self.lunr.TokenSet) {
  self.lunr.TokenSet.prototype.toString = function () {
    if (this._str) return this._str
    var str = this.final ? "1" : "0", labels = Object.keys(this.edges).sort()
    for (var i = 0; i < labels.length; i++) str += labels[i] + this.edges[labels[i]].id + ","
    return str
  }
}
"""


def on_post_build(config):
    """Search works on numbers: the theme's search worker gets lunr's token-set keys made unambiguous."""
    for worker in (Path(config.site_dir) / "assets" / "javascripts" / "workers").glob("search.*.js"):
        code = worker.read_text(encoding="utf-8")
        if LUNR_TOKENSET_FIX not in code:
            worker.write_text(code + LUNR_TOKENSET_FIX, encoding="utf-8")


def on_serve(server, config, builder):
    """Rebuild the preview when a case, a result, a notebook or a kernel module changes."""
    cases, results, notes, _ = _dirs(config)
    for path in (cases, results, notes, ROOT / "casebook" / "kernels"):
        if path.is_dir():
            server.watch(str(path))
    return server
