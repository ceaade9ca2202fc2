"""The built site in a real browser: headless Chromium (Debian's package) driven by Playwright.

Searching finds the softmax case; its page shows the card and a loaded roofline; the pattern index
lists every fusion case; the transfer graph renders; no console error, no request off the host, no
script from a case runs. Screenshots go to $CASEBOOK_SCREENS (default /tmp/screens).
"""

from __future__ import annotations

import contextlib
import functools
import http.server
import os
import re
import threading
from pathlib import Path

import pytest

from casebook.render.book import load_book

from site_helpers import build_site, copy_cases, copy_results, unnamed_transfer

pytestmark = pytest.mark.slow  # site builds and child-process runs

CHROMIUM = "/usr/bin/chromium"
SCREENS = Path(os.environ.get("CASEBOOK_SCREENS", "/tmp/screens"))

sync_api = pytest.importorskip(
    "playwright.sync_api", reason="playwright is not installed (pip install playwright; .ci/run installs it)")
if not Path(CHROMIUM).exists():
    pytest.skip(f"{CHROMIUM} is missing (apt-get install -y chromium; .ci/run installs it)", allow_module_level=True)


class Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args) -> None:
        pass


def serve(root: Path) -> tuple[http.server.ThreadingHTTPServer, str]:
    """The built site on 127.0.0.1, a free port, in a thread."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Quiet, directory=str(root)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}"


class Watch:
    """Everything a page does that a test must see: console errors, off-host requests, dialogs."""

    def __init__(self, base: str):
        self.base = base
        self.errors: list[str] = []
        self.offhost: list[str] = []
        self.dialogs: list[str] = []

    def attach(self, context) -> None:
        def route(r):
            if r.request.url.startswith(self.base) or r.request.url.startswith(("data:", "blob:")):
                r.continue_()
            else:
                self.offhost.append(r.request.url)
                r.abort()

        context.route("**/*", route)

    def page(self, context):
        page = context.new_page()
        page.on("console", lambda m: self.errors.append(f"{page.url}: {m.text}") if m.type == "error" else None)
        page.on("pageerror", lambda e: self.errors.append(f"{page.url}: {e}"))
        page.on("dialog", lambda d: (self.dialogs.append(d.message), d.dismiss()))
        return page


@pytest.fixture(scope="module")
def book_site(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("browser")
    cases = copy_cases(tmp / "cases")
    # A case of an operator the softmax case transfers to: the transfer graph must link the two.
    # The softmax case's rmsnorm transfer names no case here, so every rmsnorm case shows it.
    softmax = unnamed_transfer((cases / "softmax_fusion.yaml").read_text(), "rmsnorm")
    (cases / "softmax_fusion.yaml").write_text(softmax)
    (cases / "rms_fixture.yaml").write_text(softmax.replace("\nid: softmax_fusion\n", "\nid: rms_fixture\n")
                                            .replace("\noperator: softmax\n", "\noperator: rmsnorm\n"))
    results = copy_results(tmp / "results", cases)
    assert build_site(cases, results, tmp / "site", tmp / "plots") == 0
    server, base = serve(tmp / "site")
    yield base, load_book(cases, results)
    server.shutdown()


@pytest.fixture(scope="module")
def browser():
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        yield b
        b.close()


@pytest.fixture
def watched(browser, book_site):
    base, book = book_site
    context = browser.new_context(viewport={"width": 1400, "height": 1000}, device_scale_factor=2)
    watch = Watch(base)
    watch.attach(context)
    yield context, watch, base, book
    context.close()
    assert not watch.offhost, f"requests off the host: {watch.offhost}"
    assert not watch.errors, f"console errors: {watch.errors}"
    assert not watch.dialogs, f"dialogs opened: {watch.dialogs}"


def test_search_finds_the_softmax_case(watched):
    context, watch, base, _ = watched
    page = watch.page(context)
    page.goto(f"{base}/")
    page.locator(".md-search__input").click()
    page.keyboard.type("online softmax")
    item = page.locator(".md-search-result__item", has_text="Fused softmax")
    item.first.wait_for(timeout=15_000)
    assert "cases/softmax_fusion/" in item.first.locator("a").first.get_attribute("href")



def test_a_shape_typed_right_after_load_finds_its_cases_without_a_worker_error(watched):
    """The home page's own example, 32768x4096, typed as soon as the page loads (the index built meanwhile): it
    finds the cases measured at 32768 × 4096, and no keystroke's prefix ("3", "32", ...) fails in the worker."""
    context, watch, base, _ = watched
    page = watch.page(context)
    warnings: list[str] = []
    page.on("console", lambda m: warnings.append(m.text) if m.type == "warning" else None)
    page.goto(f"{base}/")
    page.locator(".md-search__input").click()
    page.keyboard.type("32768x4096")
    for case in ("rmsnorm", "rmsnorm_residual", "softmax_fusion"):
        page.locator(f'.md-search-result__item a[href*="cases/{case}/"]').first.wait_for(timeout=15_000)
    for digits in ("3", "4", "1", "40", "131072"):
        page.locator(".md-search__input").fill("")
        page.keyboard.type(digits)
        page.locator(".md-search-result__meta", has_text="matching").first.wait_for(timeout=15_000)
    page.wait_for_timeout(300)
    assert not [w for w in warnings if "Invalid query" in w or "TypeError" in w], warnings


def test_case_page_shows_the_card_and_the_roofline(watched):
    context, watch, base, _ = watched
    page = watch.page(context)
    page.goto(f"{base}/cases/softmax_fusion/")
    answers = page.locator(".cb-answer")
    assert answers.count() == 4
    card = page.locator(".cb-card").inner_text()
    for phrase in ("WHAT LIMITS IT?", "Bandwidth-bound", "Fusion", "Online reduction", "HOLDS", "BREAKS",
                   "layernorm", "attention"):
        assert phrase.lower() in card.lower(), phrase
    roofline = page.locator('img[src*="nvidia-h200-roofline"]')
    roofline.scroll_into_view_if_needed()
    page.wait_for_function("img => img.complete && img.naturalWidth > 0", arg=roofline.element_handle(),
                           timeout=10_000)
    assert roofline.evaluate("img => img.naturalWidth") > 0
    SCREENS.mkdir(parents=True, exist_ok=True)
    page.evaluate("window.scrollTo(0, 0)")
    page.wait_for_timeout(400)  # the header tabs fade in
    page.screenshot(path=str(SCREENS / "softmax-card.png"))
    roofline.screenshot(path=str(SCREENS / "softmax-roofline.png"))
    page.locator("h2#level-2-the-real-shape-distribution").evaluate("h => h.scrollIntoView({block: 'start'})")
    page.wait_for_timeout(300)
    page.screenshot(path=str(SCREENS / "softmax-level2.png"))


def test_pattern_index_lists_every_fusion_case(watched):
    context, watch, base, book = watched
    page = watch.page(context)
    page.goto(f"{base}/browse/pattern/")
    hrefs = page.evaluate("""() => {
        const out = []; let el = document.getElementById('fusion').nextElementSibling;
        while (el && el.tagName !== 'H2') {
            el.querySelectorAll('a').forEach(a => out.push(a.getAttribute('href'))); el = el.nextElementSibling; }
        return out; }""")
    expected = {e.id for e in book.entries if "fusion" in e.case.patterns}
    assert expected and all(any(f"cases/{cid}/" in h for h in hrefs) for cid in expected), (expected, hrefs)
    others = {e.id for e in book.entries} - expected
    assert not any(f"cases/{cid}/" in h for cid in others for h in hrefs)


def test_transfer_graph_renders(watched):
    context, watch, base, _ = watched
    page = watch.page(context)
    # mkdocs-material puts the diagram in a *closed* shadow root; open it for the test to see inside.
    page.add_init_script("""const attach = Element.prototype.attachShadow;
        Element.prototype.attachShadow = function (init) { return attach.call(this, {...init, mode: 'open'}); };""")
    page.goto(f"{base}/browse/transfers/")
    page.locator(".mermaid svg").first.wait_for(timeout=20_000)
    assert page.locator(".mermaid svg .node").count() >= 2
    page.screenshot(path=str(SCREENS / "transfer-graph.png"))


def test_a_script_in_a_case_never_runs(browser, make_case, tmp_path):
    make_case({'title: "Fused softmax: one read, one write, at every row length"':
               "title: '<script>alert(1)</script> <img src=x onerror=alert(2)>'"}, name="xss_case")
    cases = tmp_path / "cases"
    assert build_site(cases, tmp_path / "results", tmp_path / "site", tmp_path / "plots") == 0
    server, base = serve(tmp_path / "site")
    try:
        context = browser.new_context()
        watch = Watch(base)
        watch.attach(context)
        page = watch.page(context)
        page.goto(f"{base}/cases/xss_case/")
        assert "<script>alert(1)</script>" in page.locator("article h1").inner_text()  # shown as text
        assert "<script>alert(1)</script>" in page.title()
        for url in (f"{base}/cases/", f"{base}/browse/pattern/"):
            page = watch.page(context)
            page.goto(url)
            page.wait_for_timeout(300)
        page.locator(".md-search__input").click()
        page.keyboard.type("alert")
        page.locator(".md-search-result__item").first.wait_for(timeout=15_000)
        page.wait_for_timeout(500)
        context.close()
    finally:
        server.shutdown()
    assert not watch.dialogs, watch.dialogs
    assert not watch.offhost, watch.offhost


def test_the_home_page_shows_a_card_per_case_and_the_atlas(watched):
    context, watch, base, book = watched
    page = watch.page(context)
    page.goto(f"{base}/")
    cards = page.locator(".cb-home-cards li")
    assert cards.count() == len(book.entries)
    assert f"The book: {len(book.entries)} cases" in page.locator("article").inner_text()
    softmax = page.locator(".cb-home-cards li:has(a[href='cases/softmax_fusion/'])").inner_text()
    assert re.search(r"\d+% of roof, \d+\.\d\d× over torch_softmax on nvidia-h200", softmax), softmax
    assert re.search(r"\d+ claims: ✓ \d+ held", softmax), softmax
    atlas = page.locator('article img[src*="img/atlas/"]').first
    atlas.scroll_into_view_if_needed()
    page.wait_for_function("img => img.complete && img.naturalWidth > 0", arg=atlas.element_handle(), timeout=10_000)
    page.evaluate("window.scrollTo(0, 0)")
    page.wait_for_timeout(400)
    page.screenshot(path=str(SCREENS / "home.png"), full_page=True)


def test_each_roofline_has_its_machines_caption_and_its_own_roof_labels(watched):
    context, watch, base, _ = watched
    page = watch.page(context)
    page.goto(f"{base}/cases/softmax_fusion/")
    captions = page.locator(".cb-measured-shapes").all_inner_texts()
    gpu = next(c for c in captions if "NVIDIA H200" in c)
    cpu = next(c for c in captions if "NVIDIA" not in c)
    assert "rows 32768 × cols 4096" in gpu and "rows 32768 × cols 4096" not in cpu
    svg = page.request.get(page.locator('img[src*="nvidia-h200-roofline"]').get_attribute("src", timeout=5_000)
                           .replace("../../", f"{base}/")).text()
    labels = re.findall(r">([^<>]+)</text>", svg)
    # bf16 and fp16 measured different ceilings: each has its own label with its own number
    for dtype in ("bf16", "fp16"):
        assert any(re.fullmatch(rf"{dtype} [\d,.]+", t) for t in labels), dtype


def test_the_transfer_graph_links_an_operator_to_the_cases_of_it(watched):
    context, watch, base, _ = watched
    page = watch.page(context)
    page.add_init_script("""const attach = Element.prototype.attachShadow;
        Element.prototype.attachShadow = function (init) { return attach.call(this, {...init, mode: 'open'}); };""")
    page.goto(f"{base}/browse/transfers/")
    row = (page.locator("tr", has_text="Fused softmax")  # the softmax case's transfer to rmsnorm
           .filter(has=page.get_by_role("link", name="rmsnorm", exact=True)).first)
    assert row.locator('a[href*="cases/rms_fixture/"]').count() == 1  # "Shown by" the rmsnorm case
    page.locator(".mermaid svg").first.wait_for(timeout=20_000)
    labels = page.locator(".mermaid svg").first.text_content()
    assert "shown by" in labels and "rms_fixture" in labels


# --- layout at a laptop's and a phone's width (issue 49) ------------------------------------------

LAYOUT_PAGES = ["", "cases/", "cases/softmax_fusion/", "browse/claims/", "browse/pattern/", "atlas/", "hardware/",
                "browse/transfers/", "projections/"]


@contextlib.contextmanager
def at_width(browser, base: str, width: int):
    """A browser context of this viewport width, watched: no console error, no request off the host."""
    context = browser.new_context(viewport={"width": width, "height": 900})
    watch = Watch(base)
    watch.attach(context)
    yield context, watch, base, width
    context.close()
    assert not watch.offhost and not watch.errors, (watch.offhost, watch.errors)


@pytest.fixture(params=[1280, 390], ids=["1280px", "390px"])
def sized(request, browser, book_site):
    with at_width(browser, book_site[0], request.param) as watched_at:
        yield watched_at


@pytest.fixture
def laptop(browser, book_site):
    with at_width(browser, book_site[0], 1280) as watched_at:
        yield watched_at


TABLES = """() => [...document.querySelectorAll('article table')].filter(t => t.offsetParent).map(t => {
    let box = t.parentElement;
    while (box && !['auto', 'scroll'].includes(getComputedStyle(box).overflowX)) box = box.parentElement;
    return {head: t.rows[0].innerText.replace(/\\s+/g, ' ').slice(0, 40), width: t.offsetWidth,
            box: box ? box.clientWidth : null}; })"""


def test_no_page_is_wider_than_the_screen_and_a_wide_table_scrolls_in_its_own_box(sized):
    context, watch, base, width = sized
    page = watch.page(context)
    for url in LAYOUT_PAGES:
        page.goto(f"{base}/{url}")
        assert page.evaluate("document.documentElement.scrollWidth") <= width, url
        for t in page.evaluate(TABLES):
            assert t["box"] is not None and t["box"] <= width, (url, t)  # wider than its box: it scrolls there


def test_the_level1_and_all_cases_tables_fit_a_1280px_screen(laptop):
    context, watch, base, _ = laptop
    page = watch.page(context)
    page.goto(f"{base}/cases/softmax_fusion/")
    level1 = [t for t in page.evaluate(TABLES) if t["head"].startswith("Shape Variant Median")]
    page.goto(f"{base}/cases/")
    every = [t for t in page.evaluate(TABLES) if t["head"].startswith("Case Operator")]
    assert level1 and every
    for t in level1 + every:
        assert t["width"] <= t["box"], t  # the Check column and the Results column in view, no scrolling


def test_a_chart_keeps_its_own_size_on_a_phone(sized):
    context, watch, base, width = sized
    page = watch.page(context)
    page.goto(f"{base}/cases/softmax_fusion/")
    plot = page.locator("img.cb-plot").first
    plot.scroll_into_view_if_needed()
    page.wait_for_function("img => img.complete && img.naturalWidth > 0", arg=plot.element_handle(), timeout=10_000)
    drawn, natural, box = plot.evaluate("img => [img.offsetWidth, img.naturalWidth, img.parentElement.clientWidth]")
    assert drawn >= min(natural, box) * 0.99  # never shrunk below its size when the screen is narrower
    if width == 390:
        assert drawn > box and plot.evaluate("img => getComputedStyle(img.parentElement).overflowX") == "auto"
        page.screenshot(path=str(SCREENS / "softmax-390.png"))


def test_the_transfer_graphs_labels_are_legible(sized):
    context, watch, base, width = sized
    page = watch.page(context)
    page.add_init_script("""const attach = Element.prototype.attachShadow;
        Element.prototype.attachShadow = function (init) { return attach.call(this, {...init, mode: 'open'}); };""")
    page.goto(f"{base}/browse/transfers/")
    page.locator(".mermaid svg").first.wait_for(timeout=20_000)
    heights = page.evaluate("""() => [...document.querySelector('.mermaid').shadowRoot.querySelectorAll('.nodeLabel')]
        .map(e => e.getBoundingClientRect().height).filter(h => h > 0)""")
    assert heights and min(heights) >= 12, heights  # a line of 12 px type, at least
    assert page.evaluate("document.documentElement.scrollWidth") <= width
