"""The site renderer: escaping, stale marking, indices, pages without results, offline, strict build."""

from __future__ import annotations

import json
import re
from dataclasses import replace
from html import unescape
from html.parser import HTMLParser
from pathlib import Path
from typing import Callable

import pytest

from casebook.render import hooks, site, text
from casebook.render.book import BookError, load_book
from casebook.render.figures import best_variant
from casebook.result import slug

from site_helpers import REPO, build_site, copy_cases, copy_results

EVIL = '<script>alert(1)</script> <img src=x onerror=alert(2)>'


@pytest.fixture(scope="module")
def plot_cache(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("plots")


@pytest.fixture(scope="module")
def built(tmp_path_factory, plot_cache) -> Path:
    """The book's cases with fresh fixture results for softmax, built strictly once for this module."""
    tmp = tmp_path_factory.mktemp("book")
    cases = copy_cases(tmp / "cases")
    results = copy_results(tmp / "results", cases)
    assert build_site(cases, results, tmp / "site", plot_cache) == 0
    return tmp / "site"


def page(site_dir: Path, case_id: str) -> str:
    return (site_dir / "cases" / case_id / "index.html").read_text()


def words(html: str) -> str:
    """What a reader sees: tags dropped, entities decoded."""
    return unescape(re.sub(r"<[^>]+>", "", html))


# --- strict build, with and without results ---------------------------------------------------


def test_strict_build_with_results_shows_every_section(built: Path):
    html = words(page(built, "softmax_fusion"))
    for phrase in ("What limits it?", "Which patterns does it reuse?", "Where does it hold", "Where does it transfer?",
                  "Level 1", "Level 2", "Level 3", "Claims", "DRAM bytes", "Reproduce", "Kernel source",
                  "casebook run cases/softmax_fusion.yaml", "def triton_online"):
        assert phrase in html, phrase
    assert "Stale result" not in html
    for hw in ("nvidia-h200", "cpu-x86-64-2c"):
        svg = built / "img" / "softmax_fusion" / f"{hw}-roofline.svg"
        assert svg.is_file() and svg.read_bytes().startswith(b"<?xml")
    assert (built / "img" / "softmax_fusion" / "nvidia-h200-amdahl.svg").is_file()
    assert "Ridge on NVIDIA H200 SXM" in html and "FLOP/byte" in html


def test_case_without_results_says_so_and_how_to_produce_one(tmp_path: Path, plot_cache: Path):
    cases = copy_cases(tmp_path / "cases")
    assert build_site(cases, tmp_path / "no-results", tmp_path / "site", plot_cache) == 0
    html = words(page(tmp_path / "site", "softmax_fusion"))
    assert "No results yet" in html
    assert "casebook run cases/softmax_fusion.yaml" in html
    assert not (tmp_path / "site" / "img" / "softmax_fusion").exists()
    assert "No results yet" in (tmp_path / "site" / "atlas" / "index.html").read_text()


def test_invalid_case_fails_the_build_with_its_error(tmp_path: Path, capsys):
    cases = copy_cases(tmp_path / "cases")
    bad = cases / "softmax_fusion.yaml"
    bad.write_text(bad.read_text().replace("patterns: [fusion, online_reduction, specialization]",
                                           "patterns: [fusion, magic]"))
    assert build_site(cases, tmp_path / "results", tmp_path / "site") == 1
    assert "softmax_fusion.yaml" in capsys.readouterr().err


# --- stale results ---------------------------------------------------------------------------


def test_stale_result_is_marked_with_a_warning(tmp_path: Path):
    cases = copy_cases(tmp_path / "cases")
    results = copy_results(tmp_path / "results", cases, fresh=False)
    book = load_book(cases, results)
    stored = book.get("softmax_fusion").results
    assert stored and all(r.stale for r in stored)
    assert any("case file" in reason for reason in stored[0].stale)
    md = site.plan(book).pages["cases/softmax_fusion.md"]
    assert '!!! warning "Stale result on NVIDIA H200 SXM"' in md
    assert "stale" in site.plan(book).pages["browse/hardware.md"]


def test_fresh_result_becomes_stale_when_the_case_changes(tmp_path: Path):
    cases = copy_cases(tmp_path / "cases")
    results = copy_results(tmp_path / "results", cases)
    assert not any(r.stale for r in load_book(cases, results).get("softmax_fusion").results)
    path = cases / "softmax_fusion.yaml"
    path.write_text(path.read_text() + "\n# an edit\n")
    assert all(r.stale for r in load_book(cases, results).get("softmax_fusion").results)


def test_a_stale_result_shows_the_claims_its_points_give_not_the_verdicts_it_carries(tmp_path: Path):
    """A stale result is not checked against its case (`check` warns of it), so a verdict forged into one would
    reach the claims page as it is: the site judges every result's claims from its points, stale or not."""
    cases = copy_cases(tmp_path / "cases")
    results = copy_results(tmp_path / "results", cases, fresh=False)
    path = results / "nvidia-h200" / "softmax_fusion.json"
    doc = json.loads(path.read_text())
    honest = {c.text: c.held for c in load_book(cases, results).get("softmax_fusion").results[0].result.claims}
    assert False in honest.values(), "the fixture has a claim its points miss: the forgery flips it"
    doc["claims"] = [{**c, "held": True, "detail": "forged"} for c in doc["claims"]]
    path.write_text(json.dumps(doc))
    stored = load_book(cases, results).get("softmax_fusion").results[0]
    assert stored.stale
    assert {c.text: c.held for c in stored.result.claims} == honest
    assert not any(c.detail == "forged" for c in stored.result.claims)


def test_a_cpu_result_says_its_variants_were_never_checked_at_the_gpu_shapes(tmp_path: Path):
    """A variant wrong only at the large shapes passes a CPU run: the page says what a CPU result did not check."""
    cases = copy_cases(tmp_path / "cases")
    book = load_book(cases, copy_results(tmp_path / "results", cases))
    md = site.plan(book).pages["cases/softmax_fusion.md"]
    said = "A CPU runs the case's small CPU shapes: no variant was run, nor checked, at the level-1 shapes above there."
    assert md.count(said) == sum(r.result.hardware.kind == "cpu" for r in book.get("softmax_fusion").results) >= 1


def test_a_machine_without_a_datasheet_says_nothing_bounds_its_ceilings(tmp_path: Path):
    """A CPU's ceilings have no datasheet to be held to: ceilings invented with the points they place would pass
    `check`, and the hardware page says that they are as good as the run that stored them."""
    cases = copy_cases(tmp_path / "cases")
    book = load_book(cases, copy_results(tmp_path / "results", cases))
    md = site.plan(book).pages["hardware.md"]
    unbound = sum(1 for key, results in book.hardware().items() if not results[0].result.hardware.datasheet)
    assert unbound >= 1 and md.count("nothing outside its own results bounds these ceilings") == unbound


def test_result_for_an_unknown_case_is_a_warning_and_a_broken_result_an_error(tmp_path: Path):
    cases = copy_cases(tmp_path / "cases")
    results = copy_results(tmp_path / "results", cases)
    orphan = results / "nvidia-h200" / "gone.json"
    orphan.write_text((results / "nvidia-h200" / "softmax_fusion.json").read_text())
    assert load_book(cases, results).warnings
    orphan.write_text("{}")
    with pytest.raises(BookError, match="gone.json"):
        load_book(cases, results)


# --- indices ---------------------------------------------------------------------------------


def sections(markdown: str) -> dict[str, str]:
    """`## Title { #anchor }` sections of a generated page, by anchor."""
    out = {}
    for part in re.split(r"\n## ", markdown)[1:]:
        m = re.search(r"\{ #([a-z0-9-]+) \}", part.splitlines()[0])
        out[m.group(1)] = part
    return out


def test_indices_list_the_right_cases(tmp_path: Path):
    cases = copy_cases(tmp_path / "cases")
    book = load_book(cases, tmp_path / "none")
    pages = site.plan(book).pages
    by_pattern = sections(pages["browse/pattern.md"])
    by_bottleneck = sections(pages["browse/bottleneck.md"])
    by_operator = sections(pages["browse/operator.md"])
    for entry in book.entries:
        link = f"(../cases/{entry.id}.md)"
        for pattern in ("tiling", "fusion", "online-reduction", "persistent", "specialization"):
            uses = pattern.replace("-", "_") in entry.case.patterns
            assert (link in by_pattern[pattern]) == uses, (entry.id, pattern)
        for kind, body in by_bottleneck.items():
            assert (link in body) == (entry.case.bottleneck.kind == kind), (entry.id, kind)
        assert link in by_operator[slug(entry.case.operator)]
        for t in entry.case.transfers:  # every transfer target gets a section that names the source case
            assert link in by_operator[slug(t.operator)]
        assert f"(../{entry.id}.md)" not in pages["browse/transfers.md"]
        assert f"c_{entry.id}" in pages["browse/transfers.md"]


def test_mermaid_labels_cannot_break_the_graph(make_case, tmp_path: Path):
    make_case({"  - operator: layernorm\n": '  - operator: "layer\\"norm]) --> x; click"\n'})
    book = load_book(tmp_path / "cases", tmp_path / "none")
    graph = site.plan(book).pages["browse/transfers.md"]
    assert '["layer norm   --  x  click"]' in graph
    assert '"]) -->' not in graph.replace('"]):::', "")


def test_a_control_is_never_the_best_variant(tmp_path: Path):
    cases = copy_cases(tmp_path / "cases")
    entry = load_book(cases, copy_results(tmp_path / "results", cases)).get("softmax_fusion")
    stored = entry.results[0]
    best = best_variant(entry, stored)
    kernel = entry.case.kernel
    variants = [v.model_copy(update={"reference": "reference"}) if v.name == best else v for v in kernel.variants]
    case = entry.case.model_copy(update={"kernel": kernel.model_copy(update={"variants": variants})})
    assert best_variant(replace(entry, case=case), stored) not in (None, best)


# --- escaping --------------------------------------------------------------------------------


class Live(HTMLParser):
    """Collects what would run in a browser: script bodies, on* attributes, javascript: links, foreign images."""

    def __init__(self):
        super().__init__()
        self.found: list[str] = []
        self._in_script = False

    def handle_starttag(self, tag, attrs):
        self._in_script = tag == "script"
        for name, value in attrs:
            if name.startswith("on"):
                self.found.append(f"<{tag} {name}={value!r}>")
            if name in ("href", "src") and (value or "").strip().lower().startswith(("javascript:", "data:text")):
                self.found.append(f"<{tag} {name}={value!r}>")
        if tag == "img" and dict(attrs).get("src") == "x":
            self.found.append("<img src=x>")

    def handle_endtag(self, tag):
        self._in_script = False

    def handle_data(self, data):
        if self._in_script and "alert(" in data:
            self.found.append(f"<script>{data[:60]}")


def test_markup_in_a_case_is_shown_as_text_never_run(make_case, tmp_path: Path, plot_cache: Path):
    make_case({
        'title: "Fused softmax: one read, one write, at every row length"':
            f"title: '{EVIL}'",
        "  - operator: layernorm\n": "  - operator: '<b onmouseover=alert(3)>layernorm</b>'\n",
        "    why: \"One reduction per row;": "    why: \"[click](javascript:alert(4)) {: onclick=alert(5) } One "
                                             "reduction per row;",
        "  notes: |\n": "  notes: |\n    <script>alert(6)</script> [x](javascript:alert(7)) ![p](https://evil.example/p.png)\n",
    }, name="xss_case")
    cases = tmp_path / "cases"
    results = copy_results(tmp_path / "results", cases, case_id="softmax_fusion", as_id="xss_case")
    assert build_site(cases, results, tmp_path / "site", plot_cache) == 0
    html_files = list((tmp_path / "site").rglob("*.html"))
    case_html = page(tmp_path / "site", "xss_case")
    assert "&lt;script&gt;alert" in case_html or "&#60;script&#62;alert" in case_html  # shown as text
    for path in html_files:
        parser = Live()
        parser.feed(path.read_text())
        assert not parser.found, f"{path}: {parser.found}"
    index = (tmp_path / "site" / "search" / "search_index.json").read_text()
    assert "<script>alert" not in index


def test_esc_neutralises_html_and_markdown_syntax():
    out = text.esc("<b>x</b> [a](javascript:x) {: onclick=y } `a<b` | *em*")
    assert "<b>" not in out and "[a]" not in out and "{:" not in out and "|" not in out and "*em*" not in out
    assert "<code>a&#60;b</code>" in out
    notes = text.markdown_html("<i>x</i> [l](javascript:alert(1)) [ok](https://example.org) ![i](http://e/x.png)")
    assert "<i>" not in notes and 'href="#"' in notes and 'href="https://example.org"' in notes and "<img" not in notes


# --- offline ---------------------------------------------------------------------------------

LOADS = re.compile(r"<(script|link|img|iframe|source|video|audio)\b[^>]*?\b(?:src|href)\s*=\s*[\"']?(https?:)?//", re.I)
CSS_LOADS = re.compile(r"(?:url\(\s*[\"']?|@import\s+[\"']?)(?:https?:)?//", re.I)
JS_LOADS = re.compile(r"""\.src\s*=\s*["'](?:https?:)?//|<script[^>]+src=["']?(?:https?:)?//""", re.I)
# mkdocs-material's bundle names two CDN URLs it loads only when the page lacks them: Mermaid (we
# define `mermaid` first, from assets/) and a ResizeObserver polyfill (every current browser has one).
# The browser test blocks every off-host request and fails on any attempt.
KNOWN_FALLBACKS = ("unpkg.com/mermaid@", "unpkg.com/resize-observer-polyfill")


def test_nothing_is_loaded_off_the_host(built: Path):
    bad = []
    for path in built.rglob("*"):
        if path.suffix in (".html", ".css"):
            body = path.read_text(errors="replace")
            bad += [f"{path}: {m.group(0)}" for m in LOADS.finditer(body)]
            bad += [f"{path}: {m.group(0)}" for m in CSS_LOADS.finditer(body)] if path.suffix == ".css" else []
        elif path.suffix == ".js":
            body = path.read_text(errors="replace")
            bad += [f"{path}: {m.group(0)}" for m in JS_LOADS.finditer(body)]
            for url in re.findall(r"""["'](https?://[^"'\s]+)["']""", body):
                if "unpkg.com" in url or "cdn" in url.split("/")[2]:
                    if not url.split("://", 1)[1].startswith(KNOWN_FALLBACKS):
                        bad.append(f"{path}: {url}")
    assert not bad, "\n".join(bad[:20])
    home = (built / "index.html").read_text()
    assert "fonts.googleapis.com" not in home and "fonts.gstatic.com" not in home
    mermaid = built / "assets" / "javascripts" / "mermaid"
    assert (mermaid / "mermaid.min.js").is_file() and "MIT" in (mermaid / "LICENSE.txt").read_text()
    transfers = (built / "browse" / "transfers" / "index.html").read_text()
    assert 'src="../../assets/javascripts/mermaid/mermaid.min.js"' in transfers


def test_search_indexes_prose_not_the_tables_of_numbers_or_the_source(built: Path):
    """Kernel source, level-1 tables, projections and the environment tables are left out of the search index:
    half its size, and a query loads and answers at once."""
    index = json.loads((built / "search" / "search_index.json").read_text())
    sections = {d["location"].split("#")[-1] for d in index["docs"] if d["location"].startswith("cases/")}
    for left_out in ("kernel-source", "reproduce", "level-1-the-single-kernel-limit", "projected-on-other-gpus",
                     "dram-bytes-modelled-vs-measured"):
        assert left_out not in sections, left_out
    assert {"discussion", "claims", "roofline"} <= sections
    assert not any("def triton_online" in d["text"] for d in index["docs"])
    [worker] = (built / "assets" / "javascripts" / "workers").glob("search.*.js")
    assert worker.read_text().count(hooks.LUNR_TOKENSET_FIX) == 1  # numbers' prefixes searchable (browser test)


def test_generated_pages_are_not_written_into_docs():
    assert not (REPO / "docs" / "cases").exists() and not (REPO / "docs" / "browse").exists()


def test_the_books_own_cases_and_stored_results_build_strictly(tmp_path: Path, plot_cache: Path):
    """Every committed result renders, including ones where only the baseline could be timed."""
    assert build_site(REPO / "cases", REPO / "results", tmp_path / "site", plot_cache) == 0
    for case in (REPO / "cases").glob("*.yaml"):
        assert (tmp_path / "site" / "cases" / case.stem / "index.html").exists()
    html = words(page(tmp_path / "site", "gemm_grouped"))  # timed on the CPU too: first calls on every machine
    assert "First call (JIT / autotune / compile, outside every median)" in html
    assert re.search(r"torch_grouped_mm\s+[0-9.,]+ s \(slowest shape [0-9.,]+ s\)", html)
    # The per-expert loop on the H200 is launch-bound by its host issue time, and its row says so.
    assert re.search(r"64×8192×1408×4096\s+loop\s+(?:\S+\s+){5,12}?launch \(host [0-9.,]+ µs\)", html)
    for notebook in (REPO / "notes").glob("*.md"):  # every notebook a page of the site, under Notebooks
        assert (tmp_path / "site" / "notebooks" / notebook.stem / "index.html").exists()


# --- notebooks -----------------------------------------------------------------------------------

NOTEBOOK = """# softmax on the H200: the floors, then the run

Written before the run.

## The floors

The copy's roof.

```
## a fenced line, not a heading
```

### Predictions

Fast.
"""


def test_a_notebook_is_a_page_with_its_headings_linked_from_the_cases_that_name_it(tmp_path, plot_cache):
    cases = copy_cases(tmp_path / "cases")
    notes = tmp_path / "notes"
    notes.mkdir()
    (notes / "softmax_fusion.md").write_text(NOTEBOOK)  # a case's own: notes/<id>.md
    (notes / "rmsnorm.md").write_text("# The norms\n\nShared.\n")  # named by the three RMSNorm cases' files
    assert build_site(cases, tmp_path / "results", tmp_path / "site", plot_cache) == 0
    site_dir = tmp_path / "site"
    notebook = (site_dir / "notebooks" / "softmax_fusion" / "index.html").read_text()
    assert re.search(r'<h2 id="the-floors">The floors', notebook)
    assert re.search(r'<h3 id="predictions">Predictions', notebook)
    assert "a fenced line, not a heading" in words(notebook) and "a-fenced-line" not in notebook
    assert 'href="#the-floors"' in notebook  # in the page's table of contents
    assert 'href="../../cases/softmax_fusion/"' in notebook
    assert 'href="../../notebooks/softmax_fusion/"' in page(site_dir, "softmax_fusion")
    for case in ("rmsnorm", "rmsnorm_backward", "rmsnorm_residual"):
        assert 'href="../../notebooks/rmsnorm/"' in page(site_dir, case)
    assert "Notebook:" not in words(page(site_dir, "gemm_tiled"))  # no notebook, no line
    index = words((site_dir / "notebooks" / "index.html").read_text())
    assert "The norms: rmsnorm, rmsnorm_backward, rmsnorm_residual" in " ".join(index.split())


def test_neighbouring_ceiling_ticks_share_one_label():
    from casebook.render.plots import _tick_labels

    ticks = {(780.0, 791.0): {"a"}, (823.0, 791.0): {"b"}, (1365.0, 791.0): {"c"}, (9000.0, 791.0): {"d"},
             (1.2, 4.0): {"e"}}
    labels = _tick_labels(ticks)
    assert [(ai, shapes) for ai, _, shapes in labels] == [(1.2, {"e"}), (1365.0, {"a", "b", "c"}), (9000.0, {"d"})]


def test_each_measured_ceiling_has_its_own_line_and_label():
    from casebook.render.plots import _ceiling_groups, _ceiling_labels

    groups = _ceiling_groups({"bf16": 809.6, "fp16": 782.9, "fp32": 50.6, "fp8_e4m3": 1492.2, "fp8_e5m2": 1492.2})
    assert groups == {50.6: "fp32", 782.9: "fp16", 809.6: "bf16", 1492.2: "fp8_e4m3/fp8_e5m2"}
    assert _ceiling_labels({809.6: "bf16", 782.9: "fp16", 50.6: "fp32"}) == [
        (809.6, "bf16", 0), (782.9, "fp16", 1), (50.6, "fp32", 0)]  # close ones stacked, each with its number


def test_the_roofline_labels_bf16_and_fp16_with_their_own_measured_numbers(tmp_path: Path):
    from casebook.render import figures, plots
    from casebook.render.book import load_book

    cases = copy_cases(tmp_path / "cases")
    results = copy_results(tmp_path / "results", cases)
    entry = load_book(cases, results).get("softmax_fusion")
    stored = next(r for r in entry.results if r.slug == "nvidia-h200")
    data = figures.roofline(entry, stored)
    roofs = data["measured"]["compute_tflops"]
    assert {"bf16", "fp16"} <= roofs.keys() and roofs["bf16"] != roofs["fp16"]
    svg = plots.render("roofline", data).decode()
    labels = re.findall(r">([^<>]+)</text>", svg)
    for dtype in ("bf16", "fp16"):
        assert f"{dtype} {roofs[dtype]:,.0f}" in labels  # its own label, its own number
    datasheet = data["datasheet"]["compute_tflops"]
    merged = [t for t in labels if t.startswith(("bf16/fp16", "fp16/bf16"))]
    assert merged == ([f"bf16/fp16 {datasheet['bf16']:,.0f}"] if datasheet["bf16"] == datasheet["fp16"] else [])
    assert "measured roof" in labels and "datasheet roof" in labels  # the legend tells the line styles apart


def overprinted(ax, labels: list) -> list[tuple[str, str]]:
    """Pairs of a label and another text of the axes whose boxes overlap on the drawn figure."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    renderer = FigureCanvasAgg(ax.figure).get_renderer()
    boxes = {t: t.get_window_extent(renderer) for t in ax.texts if t.get_visible() and t.get_text()}
    return [(a.get_text(), b.get_text()) for a in labels for b in boxes
            if a is not b and boxes[a].overlaps(boxes[b])]


def test_labels_on_the_atlas_never_overprint():
    from casebook.render import plots

    crowd = [("gemm_tiled", 960.0, 700.0), ("gemm_epilogue", 900.0, 690.0), ("gemm_grouped", 800.0, 680.0),
             ("attention_decode", 8.0, 32.0), ("softmax_fusion", 1.2, 4.8), ("rmsnorm", 1.1, 4.5)]
    data = {"hardware": "GPU", "measured": {"bandwidth_gbps": 4270.0, "compute_tflops": {"bf16": 810.0}},
            "datasheet": {"bandwidth_gbps": 4800.0, "compute_tflops": {"bf16": 989.0}},
            "points": [{"case": c, "variant": "v", "ai": ai, "tflops": tf} for c, ai, tf in crowd]}
    ax = plots.atlas_figure(data).axes[0]
    names = [t for t in ax.texts if t.get_text() in {c for c, _, _ in crowd}]
    assert len(names) == len(crowd) and not overprinted(ax, names)


def test_the_shapes_labels_on_a_roofline_never_overprint():
    """Two shapes at two dtypes: four ceiling ticks close together (rmsnorm on a CPU), each label legible."""
    from casebook.render import plots

    ticks = [("64×4096", "bf16", 0.992, 0.0314), ("64×4096", "fp32", 0.496, 0.0157),
             ("2×40000", "bf16", 0.800, 0.0253), ("2×40000", "fp32", 0.400, 0.0127)]
    data = {"hardware": "CPU", "variants": ["eager", "torch_rms_norm"], "baseline": "torch_rms_norm",
            "measured": {"bandwidth_gbps": 31.6, "compute_tflops": {"bf16": 0.389, "fp32": 0.389}},
            "datasheet": None, "shapes": ["64×4096", "2×40000"],
            "points": [{"variant": v, "dtype": d, "shape": s, "ai": ai, "tflops": ceil / 30, "ceiling_tflops": ceil,
                        "roof_fraction": 1 / 30} for s, d, ai, ceil in ticks for v in ("eager", "torch_rms_norm")]}
    left = plots.roofline_figure(data).axes[0]
    shapes = [t for t in left.texts if t.get_text() in {"64×4096", "2×40000"}]
    assert len(shapes) == 4 and not overprinted(left, shapes)


def test_a_measured_read_stream_is_named_beside_the_copys_roof():
    """A decode kernel's point over the copy's slope sits under the read stream's, which the slope's label names
    (8% apart on an H200: two lines that close would not read apart on log axes)."""
    from casebook.render import plots
    from casebook.render.figures import measured_roofs
    from casebook.result import Ceilings, Hardware

    streams = Ceilings(copy_gbps=4270.0, read_gbps=4600.0, write_gbps=4400.0, matmul_tflops={"bf16": 800.0},
                       launch_us=5.0, graph_launch_us=0.8)
    hw = Hardware(slug="gpu", name="GPU", kind="gpu", measured=streams)
    assert measured_roofs(hw)["read_gbps"] == 4600.0
    assert "read_gbps" not in measured_roofs(hw.model_copy(update={"measured": streams.model_copy(
        update={"read_gbps": 4000.0})}))  # one slower than the copy is not a roof above it
    data = {"hardware": "GPU", "variants": ["a"], "baseline": "a", "measured": measured_roofs(hw), "datasheet": None,
            "shapes": ["8x32768"], "points": [{"variant": "a", "dtype": "bf16", "shape": "8x32768", "ai": 1.0,
                                               "tflops": 4.5, "ceiling_tflops": 4.6, "roof_fraction": 0.98}]}
    texts = [t.get_text() for t in plots.roofline_figure(data).axes[0].texts]
    assert "4.27 TB/s measured (reads alone 4.6)" in texts


def test_the_level3_legend_names_every_fill_its_bars_use():
    from matplotlib.colors import to_hex

    from casebook.render import plots

    data = {"hardware": "H", "baseline": "torch_softmax", "variant": "triton_online", "baseline_us": 354.9,
            "variant_us": 300.0, "kernel_share": 0.2753, "kernel_speedup": 1.8, "color_base": plots.BASELINE_GREY,
            "color_variant": plots.PALETTE[0]}
    ax = plots.amdahl_figure(data).axes[0]

    def fills(patches) -> set:
        return {(to_hex(p.get_facecolor()), to_hex(p.get_edgecolor()) if p.get_hatch() else None,
                 str(p.get_hatch()) if p.get_hatch() else None) for p in patches}

    assert fills(ax.patches) == fills(ax.get_legend().legend_handles)
    assert len(fills(ax.patches)) == 4  # the baseline's kernel, the variant's, everything else, the measurement


def test_the_claims_page_lists_open_claims_first_with_their_numbers(tmp_path: Path, plot_cache: Path):
    def forge_one_claim(doc: dict) -> None:
        """The stored result has no point of the claim's variant (cluster_bulk came after it); its verdict is
        edited to held. The page judges the claim from the points: open, whatever the file says."""
        forged = next(c for c in doc["claims"] if c["text"].startswith("At least 3.8 TB/s"))
        forged.update(held=True, detail="forged: held at every shape")

    built = site_with(tmp_path, plot_cache, forge_one_claim)
    html = words((built / "browse" / "claims" / "index.html").read_text())
    open_part, held_part = html.split("Open: failed on a machine¶", 1)[1].split("Held¶", 1)
    held_part, unmeasured_part = held_part.split("Not yet measured¶", 1)
    # The claim no point backs, with the reason; one that held, below.
    assert "At least 3.8 TB/s at every bf16 shape from 1K to 64K columns." in open_part
    assert "forged" not in html and "point matches this claim" in open_part
    assert "At least 4.0 TB/s at 32768 x 4096 bf16." in held_part
    assert "At least 4.0 TB/s at 32768 x 4096 bf16." not in open_part


def test_the_claims_page_lists_every_claim_with_its_state(built: Path):
    """Claims aimed at a GPU with no result of their case are on the page too: not yet measured, with the
    hardware they name."""
    from casebook.load import load_case

    claims = {c.id: c.claims for c in map(load_case, (REPO / "cases").glob("*.yaml"))}
    html = words((built / "browse" / "claims" / "index.html").read_text())
    counts = re.search(r"The book makes\s+(\d+) claims: (\d+) missed on a machine, (\d+) held, and\s+(\d+) not yet "
                       r"measured on the hardware they name", html)
    total, missed, held, unmeasured = map(int, counts.groups())
    assert total == sum(map(len, claims.values())) == missed + held + unmeasured
    rows = html.split("Not yet measured¶", 1)[1]
    for claim in claims["transpose"]:  # no result in this book
        assert f"· {' '.join(claim.text.split())} {', '.join(claim.hardware)} none" in " ".join(rows.split())
    assert unmeasured >= len(claims["transpose"]) and held >= 1


def site_with(tmp_path: Path, plot_cache: Path, edit: Callable[[dict], None]) -> Path:
    """The site built after `edit` changed a copy of the stored H200 softmax result."""
    cases = copy_cases(tmp_path / "cases")
    results = copy_results(tmp_path / "results", cases)
    stored = next(results.glob("nvidia-*/softmax_fusion.json"))
    doc = json.loads(stored.read_text())
    edit(doc)
    stored.write_text(json.dumps(doc))
    assert build_site(cases, results, tmp_path / "site", plot_cache) == 0
    return tmp_path / "site"


def softmax_page_with(tmp_path: Path, plot_cache: Path, **changes) -> str:
    """The softmax case's page (raw HTML) built after `changes` to one timed triton_online point of its
    stored H200 result."""
    def change_point(doc: dict) -> None:
        point = next(p for p in doc["kernel_level"] if p["variant"] == "triton_online" and p["status"] == "ok")
        point.update(changes)
        if "median_us" in changes:  # what a stored result derives from its median, derived again (casebook.evidence)
            m = point["median_us"]
            point.update(p10_us=0.98 * m, p90_us=1.02 * m, gbps=point["bytes"] / m / 1e3,
                         tflops=point["flops"] / m / 1e6, roof_fraction=point["floor_us"] / m)

    return page(site_with(tmp_path, plot_cache, change_point), "softmax_fusion")


def test_an_autotuned_point_names_its_configuration_on_hover_escaped(tmp_path: Path, plot_cache: Path):
    html = softmax_page_with(tmp_path, plot_cache,
                             autotuned={"softmax_fusion._split_row_tuned": f"CHUNK=8192 warps=8 stages=3 {EVIL}"})
    assert '<abbr title="autotuned: softmax_fusion._split_row_tuned CHUNK=8192 warps=8 stages=3' in unescape(html)
    assert "<script>alert(1)" not in html and "onerror=alert(2)>" not in html


def test_a_median_shows_its_confidence_interval_on_hover(tmp_path: Path, plot_cache: Path):
    assert build_site(REPO / "cases", REPO / "results", tmp_path / "site", plot_cache) == 0
    html = unescape(page(tmp_path / "site", "softmax_fusion"))
    hovers = re.findall(r"<abbr title=\"the median's 95% confidence interval: ([0-9.,]+)–([0-9.,]+) µs over (\d+) "
                        r"repetitions\">([0-9.,]+)</abbr>", html)
    assert hovers, "the H200 result records each median's interval"
    for lo, hi, reps, median in hovers:
        lo, hi, median = (float(x.replace(",", "")) for x in (lo, hi, median))
        assert lo <= median * 1.005 and median <= hi * 1.005 and int(reps) >= 5  # the median shows 3 figures


def test_a_time_refused_by_the_gate_is_not_shown_as_a_wrong_answer(tmp_path: Path, plot_cache: Path):
    html = unescape(softmax_page_with(tmp_path, plot_cache, status="failed",
                                      error="faster than physics: 1.00 us is under the bandwidth floor of 2.00 us"))
    assert 'title="✗ faster than physics: 1.00 us is under the bandwidth floor of 2.00 us"' in html
    assert "✗ wrong" not in html


def test_the_hardware_page_gives_each_ceilings_range_over_the_stored_results():
    from casebook.render.pages import _ceiling_rows
    from casebook.result import Hardware

    def hw(bf16: float, copy: float) -> Hardware:
        return Hardware.model_validate(
            {"slug": "gpu", "name": "GPU", "kind": "gpu",
             "measured": {"copy_gbps": copy, "matmul_tflops": {"bf16": bf16}, "launch_us": 5.0, "graph_launch_us": 2.0},
             "datasheet": {"name": "GPU", "match": ["GPU"], "bandwidth_gbps": 4800, "peak_tflops": {"bf16": 989.4}}})

    rows = {r["what"]: r for r in _ceiling_rows(hw(782.0, 4270.0), [hw(683.0, 4265.0), hw(782.0, 4270.0)])}
    assert rows["bf16 matmul"]["measured"] == "782" and rows["bf16 matmul"]["spread"] == "683–782 over 2"
    assert rows["copy bandwidth"]["spread"] == "–", "within 0.5%: one ceiling, not a range"
    assert rows["kernel launch"]["spread"] == "–", "the same in every result"
    assert _ceiling_rows(hw(782.0, 4270.0), [hw(782.0, 4270.0)])[1]["spread"] == "–", "one result: no range"


def test_a_counters_row_says_why_it_has_no_gap():
    from casebook.render.views import _gap
    from casebook.result import CounterRow

    def row(**fields) -> CounterRow:
        return CounterRow(variant="fused", shape={"rows": 4, "cols": 65536}, dtype="fp32", **fields)

    assert _gap(row(gap=0.052)) == "+5.2%"
    assert _gap(row(not_applicable="holds at most 32768 columns")) == "not applicable: holds at most 32768 columns"
    assert _gap(row(error="ncu timed out")) == "no counters"


def test_a_point_shows_its_bandwidth_and_launch_floors_beside_its_median(tmp_path: Path, plot_cache: Path):
    html = unescape(softmax_page_with(tmp_path, plot_cache, median_us=250.0, bandwidth_floor_us=125.5,
                                      launch_floor_us=78.75))
    assert "Floors µs: bytes · launches" in html
    row = next(r for r in re.findall(r"<tr>.*?</tr>", html, re.S) if "126 · 78.8" in r)  # three figures
    assert "triton_online" in row and ">250<" in row


def test_peak_memory_is_shown_beside_the_time_where_it_was_measured(tmp_path: Path, plot_cache: Path):
    html = unescape(softmax_page_with(tmp_path, plot_cache, peak_memory_bytes=268_435_456, input_bytes=134_217_728))
    assert ">Peak memory</abbr>" in html
    row = next(r for r in re.findall(r"<tr>.*?</tr>", html, re.S) if "268 MB (2x inputs)" in r)
    assert "triton_online" in row


def test_no_peak_memory_column_where_none_was_measured(tmp_path: Path, plot_cache: Path):
    def unmeasured(doc: dict) -> None:  # as a CPU's results, or a GPU's stored before peak memory was read
        for p in doc["kernel_level"] + doc["workload_level"]["points"]:
            p.pop("peak_memory_bytes", None)

    assert "Peak memory" not in page(site_with(tmp_path, plot_cache, unmeasured), "softmax_fusion")


def test_results_under_one_name_with_ceilings_apart_are_drawn_as_two_machines():
    """One name, copy ceilings 45.9 and 19.3 GB/s (two machines): the atlas and hardware pages take them
    apart, each against its own run's roofs; a third result within 20% of the first joins it."""
    from types import SimpleNamespace

    from casebook.render.book import Book, StoredResult
    from casebook.result import Hardware

    fixture_path = REPO / "tests" / "fixtures" / "results" / "cpu-x86-64-2c" / "softmax_fusion.json"
    fixture = json.loads(fixture_path.read_text())

    def stored(case_id: str, copy_gbps: float) -> StoredResult:
        hw = {**fixture["hardware"], "measured": {**fixture["hardware"]["measured"], "copy_gbps": copy_gbps}}
        result = SimpleNamespace(case_id=case_id, hardware=Hardware.model_validate(hw))
        return StoredResult(result, Path(f"results/{hw['slug']}/{case_id}.json"))

    a, b, c = stored("a", 45.9), stored("b", 19.3), stored("c", 44.0)
    entries = [SimpleNamespace(results=[r]) for r in (a, b, c)]
    machines = Book(entries).hardware()  # type: ignore[arg-type]
    name = fixture["hardware"]["slug"]
    assert machines == {name: [a, c], f"{name}-2": [b]}


def test_two_machines_of_one_name_get_headings_of_their_own():
    """One CPU model as one device and as two (a multi-device run), and again on a second host: no two
    headings of the atlas, hardware and browse pages read the same."""
    from types import SimpleNamespace

    from casebook.render.book import Book, StoredResult
    from casebook.render.views import machine_titles
    from casebook.result import Hardware

    fixture = json.loads((REPO / "tests/fixtures/results/cpu-x86-64-2c/softmax_fusion.json").read_text())

    def stored(slug: str, copy_gbps: float, devices: int = 1) -> StoredResult:
        topology = {"devices": devices, "backend": "gloo", "link": "loopback"} if devices > 1 else None
        hw = {**fixture["hardware"], "slug": slug, "name": "AMD EPYC", "topology": topology,
              "measured": {**fixture["hardware"]["measured"], "copy_gbps": copy_gbps}}
        return StoredResult(SimpleNamespace(case_id="a", hardware=Hardware.model_validate(hw)),
                            Path(f"results/{slug}/a.json"))

    results = [stored("cpu-amd", 45.9), stored("cpu-amd-x2", 45.0, devices=2), stored("cpu-amd", 19.3)]
    titles = machine_titles(Book([SimpleNamespace(results=[r]) for r in results]))  # type: ignore[arg-type]
    assert titles == {"cpu-amd": "AMD EPYC (cpu-amd)", "cpu-amd-x2": "AMD EPYC × 2",
                      "cpu-amd-2": "AMD EPYC (cpu-amd-2)"}


def test_a_case_left_off_the_atlas_is_named_there_with_the_reason(tmp_path: Path):
    """A copy that does no FLOPs (transpose) has no place on a log FLOP/byte axis: the atlas says so."""
    from casebook.render import figures, pages
    from casebook.render.book import Book, load_book

    cases = copy_cases(tmp_path / "cases")
    entry = load_book(cases, copy_results(tmp_path / "results", cases)).get("softmax_fusion")
    stored = next(r for r in entry.results if r.slug == "nvidia-h200")
    assert figures.off_atlas(entry, stored) is None
    copy = [p.model_copy(update={"flops": 0.0, "tflops": 0.0, "arithmetic_intensity": 0.0})
            for p in stored.result.kernel_level]
    stored.result = stored.result.model_copy(update={"kernel_level": copy})
    assert "does no FLOPs" in figures.off_atlas(entry, stored)
    page = words(pages.atlas(Book([entry]), {}))
    assert re.search(r"Not on the chart, though measured here:\s+\[Fused softmax[^\]]*\]\([^)]*\): it does no FLOPs",
                     page)


def test_a_variant_only_checked_is_not_called_unstable_for_its_baselines_times():
    """Its level-2 row has no speedup: the baseline's unstable time there is nothing it rests on."""
    from casebook.render.views import _unstable_shapes
    from casebook.result import Point

    shape = {"rows": 64, "cols": 4096}
    base = Point(variant="eager", shape=shape, dtype="bf16", status="ok", median_us=300.0, unstable=["spread"])
    checked = Point(variant="triton", shape=shape, dtype="bf16", status="checked")
    timed = Point(variant="fused", shape=shape, dtype="bf16", status="ok", median_us=100.0)
    assert _unstable_shapes([base, checked, timed], "triton", "eager") == ""
    assert _unstable_shapes([base, checked, timed], "fused", "eager") == "unstable at 1 of 1 shapes"
