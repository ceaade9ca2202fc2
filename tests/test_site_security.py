"""The site renders text, never markup; the book reads its own files only.

Hostile fixture cases are built in tmp_path and go through the real path (`casebook build`,
`casebook validate`, `casebook check`): a quote in a summary, fences in a kernel module and in a
write-up, links whose scheme hides behind entities or percent-escapes, and symlinked case files,
kernel modules and results.
"""

from __future__ import annotations

import json
import re
from html import unescape
from html.parser import HTMLParser
from pathlib import Path

import pytest

from casebook import provenance
from casebook.render import text
from casebook.render.book import BookError, load_book

from site_helpers import REPO, build_site, copy_results

SECRET = "TOP-SECRET first line of a file outside the book"


class Parsed(HTMLParser):
    """Live markup of a page: scripts with code, event-handler attributes, link targets, meta tags."""

    def __init__(self):
        super().__init__()
        self.scripts: list[str] = []
        self.handlers: list[str] = []
        self.hrefs: list[str] = []
        self.meta: dict[str, str] = {}
        self.headings: list[str] = []
        self._tag = None

    def handle_starttag(self, tag, attrs):
        self._tag = tag
        for name, value in attrs:
            if name.startswith("on"):
                self.handlers.append(f"<{tag} {name}={value}>")
            if name in ("href", "src") and value is not None:
                self.hrefs.append(value)
        if tag == "meta":
            d = dict(attrs)
            if d.get("name"):
                self.meta[d["name"]] = d.get("content") or ""

    def handle_data(self, data):
        if self._tag == "script" and "alert(" in data:
            self.scripts.append(data[:80])
        if self._tag in ("h1", "h2", "h3") and data.strip():
            self.headings.append(data.strip())

    def handle_endtag(self, tag):
        self._tag = None


def parsed(path: Path) -> Parsed:
    p = Parsed()
    p.feed(path.read_text())
    return p


@pytest.fixture(scope="module")
def plot_cache(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("plots")


def build_case(make_case, tmp_path: Path, plot_cache: Path, edits: dict[str, str], name: str = "hostile") -> Path:
    """Build a book of one case (the softmax case with `edits`) with results; the case page's HTML file."""
    make_case(edits, name=name)
    cases = tmp_path / "cases"
    results = copy_results(tmp_path / "results", cases, case_id="softmax_fusion", as_id=name)
    assert build_site(cases, results, tmp_path / "site", plot_cache) == 0
    return tmp_path / "site" / "cases" / name / "index.html"


# --- attributes ------------------------------------------------------------------------------


def test_a_quote_in_the_summary_stays_inside_the_page_description(make_case, tmp_path, plot_cache):
    hostile = 'Fast. "><script>alert(1)</script><meta name="x'
    page = build_case(make_case, tmp_path, plot_cache, {"summary: >-\n": f"summary: >-\n  {hostile}\n"})
    p = parsed(page)
    assert p.scripts == [] and p.handlers == []
    assert p.meta["description"].startswith(hostile)  # the whole text, as text, in the one attribute
    assert "x" not in p.meta


# --- code listings -----------------------------------------------------------------------------


HOSTILE_MODULE = '''

# The lines below are text in a kernel module; on the page they must stay code.
SNIPPET = """
```
</code></pre></details>

# Injected heading

<script>alert(1)</script>
<img src=x onerror=alert(2)>
~~~
````
"""
'''


def test_a_kernel_module_with_fences_is_shown_as_code(make_case, tmp_path, plot_cache, monkeypatch):
    kernels = tmp_path / "kernels"
    kernels.mkdir()
    (kernels / "hostile_kernel.py").write_text((REPO / "casebook/kernels/softmax_fusion.py").read_text()
                                               + HOSTILE_MODULE)
    monkeypatch.setattr(provenance, "KERNELS_DIR", kernels)
    page = build_case(make_case, tmp_path, plot_cache, {"  module: softmax_fusion\n": "  module: hostile_kernel\n"})
    p = parsed(page)
    assert p.scripts == [] and p.handlers == []
    assert "Injected heading" not in p.headings
    html = page.read_text()
    listing = html[html.index('class="abstract cb-source"'):]
    assert "Injected heading" in unescape(re.sub(r"<[^>]+>", "", listing))  # shown, as code
    assert listing.count("</details>") == 1 and "def triton_online" in unescape(re.sub(r"<[^>]+>", "", listing))


def test_code_in_a_writeup_cannot_open_or_close_the_pages_fences(make_case, tmp_path, plot_cache):
    notes = ("  notes: |\n    Before.\n\n        x = 1\n        ```\n        <script>alert(3)</script>\n\n    ~~~\n"
             "    # Injected heading\n    ~~~\n\n    After.\n")
    page = build_case(make_case, tmp_path, plot_cache, {"  notes: |\n": notes})
    p = parsed(page)
    assert p.scripts == [] and p.handlers == []
    assert "Injected heading" not in p.headings
    assert "Reproduce" in p.headings and "Kernel source" in p.headings  # the sections after it still render


# --- links -------------------------------------------------------------------------------------


@pytest.mark.parametrize("url", ["javascript&colon;alert(1)", "javascript&#58;alert(1)", "java%73cript:alert(1)",
                                 "&#x6A;avascript:alert(1)", "java\tscript:alert(1)", " JAVASCRIPT:alert(1)",
                                 "data:text/html,x", "vbscript:x", "//evil.example/x", "/\\evil.example",
                                 "mailto:a@b.c", "javascript%253Aalert(1)"])
def test_a_link_whose_scheme_is_not_http_is_refused(url):
    assert not text.safe_url(url)


@pytest.mark.parametrize("url", ["https://arxiv.org/abs/1805.02867", "http://example.org", "#level-1",
                                 "../browse/pattern.md", "notes.md?x=a:b"])
def test_http_in_page_and_relative_links_are_kept(url):
    assert text.safe_url(url)


def test_encoded_javascript_links_in_a_writeup_are_dropped(make_case, tmp_path, plot_cache):
    notes = ("  notes: |\n    [a](javascript&colon;alert(1)) [b](java%73cript:alert(2)) "
             "[c](&#x6A;avascript:alert(3)) [ok](https://example.org/ok)\n\n")
    page = build_case(make_case, tmp_path, plot_cache, {"  notes: |\n": notes})
    hrefs = [unescape(h).lower() for h in parsed(page).hrefs]
    assert not [h for h in hrefs if "alert" in h]
    assert "https://example.org/ok" in hrefs


# --- symlinks ----------------------------------------------------------------------------------


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    secret = tmp_path / "elsewhere" / "secret.txt"
    secret.parent.mkdir()
    secret.write_text(SECRET + "\nmore\n")
    return secret


def test_a_symlinked_case_file_is_refused_without_reading_it(make_case, tmp_path, outside, cli):
    book = make_case().parent
    (book / "linked.yaml").symlink_to(outside)
    result = cli("validate", book)
    assert result.exit_code == 2
    assert f"{book / 'linked.yaml'}:1: file: is a symbolic link" in result.output
    assert SECRET not in result.output
    with pytest.raises(BookError, match="linked.yaml: is a symbolic link"):
        load_book(book, tmp_path / "no-results")


def test_markup_in_a_notebook_is_shown_as_text_never_run(make_case, tmp_path, plot_cache):
    notes = tmp_path / "notes"
    notes.mkdir()
    (notes / "hostile.md").write_text(
        "# Notes <script>alert(1)</script>\n\n<img src=x onerror=alert(2)>\n\n"
        "## Floors <img src=x onerror=alert(3)>{: onclick=\"alert(4)\" }\n\n"
        "[a](javascript:alert(5)) [b](java%73cript:alert(6)) [ok](https://example.org/ok)\n\n"
        "```\n</code></pre>\n<script>alert(7)</script>\n```\n")
    build_case(make_case, tmp_path, plot_cache, {}, name="hostile")
    notebook = tmp_path / "site" / "notebooks" / "hostile" / "index.html"
    p = parsed(notebook)
    assert p.scripts == [] and p.handlers == []
    hrefs = [unescape(h).lower() for h in p.hrefs]
    assert not [h for h in hrefs if "alert(" in h] and "https://example.org/ok" in hrefs  # in-page anchors slugged
    assert "<script>alert(1)</script>" in unescape(re.sub(r"<[^>]+>", "", notebook.read_text()))  # as text


def test_a_notebook_that_is_a_link_or_too_large_or_not_text_is_refused(make_case, tmp_path, outside):
    book = make_case().parent
    notes = tmp_path / "notes"
    notes.mkdir()
    (notes / "linked.md").symlink_to(outside)
    with pytest.raises(BookError, match="linked.md: is a symbolic link") as err:
        load_book(book, tmp_path / "no-results")
    assert SECRET not in str(err.value)
    (notes / "linked.md").unlink()
    (notes / "binary.md").write_bytes(b"# x\n\xff\xfe\n")
    with pytest.raises(BookError, match="binary.md: not UTF-8"):
        load_book(book, tmp_path / "no-results")
    (notes / "binary.md").write_text("# x\n" + "y" * (1 << 20))
    with pytest.raises(BookError, match="binary.md: is [0-9]+ bytes, over the"):
        load_book(book, tmp_path / "no-results")
    (notes / "binary.md").unlink()
    (notes / "a name.md").write_text("# x\n")
    with pytest.raises(BookError, match="a name.md: has a name other than"):
        load_book(book, tmp_path / "no-results")


def test_a_symlinked_kernel_module_is_refused(make_case, tmp_path, outside, cli, monkeypatch):
    path = make_case()
    kernels = tmp_path / "casebook" / "kernels"
    kernels.mkdir(parents=True)
    (kernels / "softmax_fusion.py").symlink_to(outside)
    result = cli("validate", path)
    assert result.exit_code == 2
    assert "kernel.module: casebook/kernels/softmax_fusion.py is a symbolic link" in result.output
    assert SECRET not in result.output
    monkeypatch.setattr(provenance, "KERNELS_DIR", kernels)
    with pytest.raises(BookError, match="kernel module casebook/kernels/softmax_fusion.py is a symbolic link"):
        load_book(path.parent, tmp_path / "no-results")


def test_a_symlinked_result_is_refused_by_check_and_build(make_case, tmp_path, outside, cli):
    path = make_case()
    results = copy_results(tmp_path / "results", path.parent)
    stored = results / "nvidia-h200" / "softmax_fusion.json"
    real = tmp_path / "elsewhere" / "result.json"
    real.write_text(stored.read_text())
    stored.unlink()
    stored.symlink_to(real)
    result = cli("check", path)
    assert result.exit_code == 2
    assert "results/nvidia-h200/softmax_fusion.json is a symbolic link" in result.output
    with pytest.raises(BookError, match="softmax_fusion.json: is a symbolic link"):
        load_book(path.parent, results)
    assert json.loads(real.read_text())["case_id"] == "softmax_fusion"  # untouched


def test_a_result_folder_linked_outside_the_book_is_refused(make_case, tmp_path):
    path = make_case()
    elsewhere = copy_results(tmp_path / "elsewhere-results", path.parent) / "nvidia-h200"
    (tmp_path / "results").mkdir()
    (tmp_path / "results" / "nvidia-h200").symlink_to(elsewhere)
    with pytest.raises(BookError, match="is a symbolic link|resolves outside the book"):
        load_book(path.parent, tmp_path / "results")
