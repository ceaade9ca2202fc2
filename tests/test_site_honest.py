"""The site and the CLI say exactly what was measured (issue 22): each defect a new user found, as a test.

Pages are built from copies of the fixture results, edited in the test where a case needs a state the
stored runs do not have (a failed point, a variant that failed everywhere, an argv).
"""

from __future__ import annotations

import json
import re
from html import unescape
from pathlib import Path

import pytest

from casebook.render import text
from casebook.result import Machine

from site_helpers import REPO, build_site, copy_cases, copy_results, unnamed_transfer

FIXTURE_CPU = "cpu-x86-64-2c"


@pytest.fixture(scope="module")
def plot_cache(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("plots")


def words(html: str) -> str:
    return " ".join(unescape(re.sub(r"<[^>]+>", " ", html)).split())


def built_with(tmp_path: Path, plot_cache: Path, edit=None, hardware: str = "nvidia-h200",
               extra_cases: dict[str, str] | None = None) -> Path:
    """The book's cases (plus `extra_cases`: id -> YAML) with the fixture softmax results, `edit` applied to
    the stored result of `hardware`; the built site."""
    cases = copy_cases(tmp_path / "cases")
    for case_id, yaml_text in (extra_cases or {}).items():
        (cases / f"{case_id}.yaml").write_text(yaml_text)
    results = copy_results(tmp_path / "results", cases)
    if edit:
        stored = results / hardware / "softmax_fusion.json"
        doc = json.loads(stored.read_text())
        edit(doc)
        stored.write_text(json.dumps(doc))
    assert build_site(cases, results, tmp_path / "site", plot_cache) == 0
    return tmp_path / "site"


def case_html(site: Path, case_id: str = "softmax_fusion") -> str:
    return (site / "cases" / case_id / "index.html").read_text()


# --- wrong ---------------------------------------------------------------------------------------


def test_each_machines_caption_lists_the_shapes_measured_there(tmp_path, plot_cache):
    html = case_html(built_with(tmp_path, plot_cache))
    captions = {unescape(m.group(1)): words(m.group(2)) for m in
                re.finditer(r'class="cb-caption cb-measured-shapes">Measured on <b>([^<]+)</b>:(.*?)</p>', html, re.S)}
    cpu = json.loads((REPO / "tests/fixtures/results" / FIXTURE_CPU / "softmax_fusion.json").read_text())
    cpu_name = cpu["hardware"]["name"]
    measured = {text.shape(p["shape"]) for p in cpu["kernel_level"] if p["status"] in ("ok", "checked")}
    assert measured and all(s in captions[unescape(cpu_name)] for s in measured)
    assert "rows 32768 × cols 4096" not in captions[unescape(cpu_name)]  # a GPU shape, never run on the CPU
    assert "rows 32768 × cols 4096" in captions["NVIDIA H200 SXM"]


def test_the_reproduce_command_keeps_every_flag(tmp_path, plot_cache):
    argv = ["casebook", "run", "cases/softmax_fusion.yaml", "--counters", "--timeout", "900.0"]

    def stored_with_argv(doc):
        doc["argv"], doc["command"] = argv, " ".join(argv)

    html = unescape(re.sub(r"<[^>]+>", "", case_html(built_with(tmp_path, plot_cache, stored_with_argv))))
    assert "casebook run cases/softmax_fusion.yaml --counters --timeout 900.0" in html


def test_the_stored_argv_is_the_parsed_command_line():
    import typer.main

    from casebook.cli import app, argv_of

    run = typer.main.get_command(app).commands["run"]
    args = ["cases/x.yaml", "--counters", "--variant", "a", "--variant", "b", "--quick", "--results", "/tmp/r"]
    assert argv_of(run.make_context("run", list(args))) == [
        "casebook", "run", "cases/x.yaml", "--variant", "a", "--variant", "b", "--quick", "--counters",
        "--results", "/tmp/r"]
    assert argv_of(run.make_context("run", ["cases/x.yaml"])) == ["casebook", "run", "cases/x.yaml"]


def test_a_result_without_argv_still_shows_its_command(tmp_path, plot_cache):
    def old(doc):
        doc.pop("argv", None)

    assert "casebook run cases/softmax_fusion.yaml" in words(case_html(built_with(tmp_path, plot_cache, old)))


def test_a_failed_point_shows_its_reason_not_an_error_of_zero(tmp_path, plot_cache):
    def fail(doc):
        p = next(p for p in doc["kernel_level"] if p["variant"] == "triton_online" and p["status"] == "ok")
        p.update(status="failed", correct=False, max_rel_err=0.0, error="input x was modified in place")

    html = case_html(built_with(tmp_path, plot_cache, fail))
    assert "✗ input x was modified in place" in unescape(html)
    assert "0.0e+00" not in html


def test_a_variant_that_failed_everywhere_has_no_clean_regressions(tmp_path, plot_cache):
    def crash(doc):
        for p in doc["workload_level"]["points"]:
            if p["variant"] == "triton_online":
                p.update(status="crashed", error="illegal memory access", speedup=None, median_us=None)
        for s in doc["workload_level"]["summary"]:
            if s["variant"] == "triton_online":
                s.update(timed=0, geomean_speedup=None, worst_speedup=None, regressions=[])

    html = words(case_html(built_with(tmp_path, plot_cache, crash)))
    assert re.search(r"triton_online – – [^|]*? never timed: crashed at (\d+) of \1 shapes "
                     r"\(first: illegal memory access\)", html)


def test_a_variant_only_checked_has_no_clean_regressions(tmp_path):
    """The site's level-2 table says what the run's table says (one rule, `levels.regressions`)."""
    from casebook.render import views
    from casebook.render.book import load_book

    cases = copy_cases(tmp_path / "cases")
    results = copy_results(tmp_path / "results", cases)
    stored = results / "nvidia-h200" / "softmax_fusion.json"
    doc = json.loads(stored.read_text())
    for p in doc["workload_level"]["points"]:
        if p["variant"] == "triton_online":
            p.update(status="checked", speedup=None, median_us=None, p10_us=None, p90_us=None, median_ci_us=None,
                     gbps=None, tflops=None, roof_fraction=None)
    for row in doc["workload_level"]["summary"]:
        if row["variant"] == "triton_online":
            row.update(timed=0, geomean_speedup=None, worst_speedup=None, worst_shape=None, regressions=None)
    stored.write_text(json.dumps(doc))
    entry = load_book(cases, results).get("softmax_fusion")
    machine = views.machine(entry, next(r for r in entry.results if r.slug == "nvidia-h200"), {})
    row = next(s for s in machine.level2_summary if s["variant"] == "triton_online")
    assert re.fullmatch(r"never timed: checked only at (\d+) of \1 shapes", row["regressions"]), row["regressions"]


def test_unstable_points_are_marked_wherever_their_numbers_are_shown(tmp_path, plot_cache):
    why = "spread p90/p10 1.31 over 1.10"

    def shaky(doc):
        timed = [p for p in doc["kernel_level"] if p["status"] == "ok"]
        for p in timed[:3]:
            p["unstable"] = [why]
        for p in doc["workload_level"]["points"]:
            if p["variant"] == "triton_online":
                p["unstable"] = [why]

    site = built_with(tmp_path, plot_cache, shaky)
    html = case_html(site)
    seen = words(html)
    timed = sum(1 for doc in [json.loads((REPO / "tests/fixtures/results/nvidia-h200/softmax_fusion.json").read_text())]
                for p in doc["kernel_level"] + doc["workload_level"]["points"] if p["status"] == "ok")
    assert re.search(rf"Unstable points on NVIDIA H200 SXM \d+ of {timed} timed points are unstable \(first: ", seen)
    assert "NVIDIA H200 SXM · unstable" in seen  # the machine's chip
    assert len(re.findall(rf'<abbr class="cb-unstable" title="unstable: {re.escape(why)}">unstable</abbr>', html)) == 3
    level2 = words(html[html.index('id="level-2-the-real-shape-distribution"'):html.index('id="level-3-end-to-end"')])
    assert re.search(r"triton_online \d+\.\d\d× unstable at (\d+) of \1 shapes", level2)
    glance = words(html[html.index('id="at-a-glance"'):html.index('id="roofline"')])
    assert re.search(r"NVIDIA H200 SXM unstable .*triton_online \d+\.\d\d× \(unstable at \d+ of \d+ shapes\)", glance)
    row = next(r for r in re.findall(r"<tr>.*?</tr>", (site / "cases" / "index.html").read_text(), re.S)
               if "softmax_fusion/" in r)
    assert "nvidia-h200 (unstable)" in words(row)  # the index's Results column
    row = next(r for r in re.findall(r"<tr>.*?</tr>", (site / "browse" / "hardware" / "index.html").read_text(), re.S)
               if "softmax_fusion/" in r and "<strong>unstable</strong>" in r)
    assert row


def test_the_hardware_page_shows_the_recorded_driver_and_l2(tmp_path, plot_cache):
    def record(doc):
        doc["environment"].update(driver_version="580.159.04", l2_mb=60.0)
        doc["environment"].pop("driver", None)

    html = words((built_with(tmp_path, plot_cache, record) / "hardware" / "index.html").read_text())
    assert "driver 580.159.04" in html
    assert re.search(r"L2 cache \(size the device reports\) MB 60(\.0)? ", html)


def test_contributing_does_not_credit_the_scaffold_with_an_interpreter_switch():
    doc = (REPO / "docs" / "contributing.md").read_text()
    scaffold = (REPO / "casebook" / "templates" / "kernel.py.tmpl").read_text()
    if "TRITON_INTERPRET" not in scaffold:
        assert not re.search(r"scaffold[^.]*switch on `os\.environ", doc)
    assert "casebook.kernels.device.INTERPRET" in doc
    assert "INTERPRET = " in (REPO / "casebook" / "kernels" / "device.py").read_text()


# --- confusing / missing: the command line ------------------------------------------------------


def test_version(cli):
    from casebook import __version__

    result = cli("--version")
    assert result.exit_code == 0 and result.output.strip() == f"casebook {__version__}"


def test_hardware_json(cli, monkeypatch):
    from casebook.run import hardware

    monkeypatch.setattr(hardware, "identify", lambda: Machine(slug="cpu-test", name="Test CPU", kind="cpu",
                                                               datasheet=None))
    ceilings = {"copy_gbps": 12.5, "matmul_tflops": {"fp32": 0.2}, "launch_us": 2.0, "graph_launch_us": None}
    monkeypatch.setattr(hardware, "ceilings", lambda remeasure=False: ceilings)
    result = cli("hardware", "--json")
    assert result.exit_code == 0
    doc = json.loads(result.output)
    assert doc["slug"] == "cpu-test" and doc["measured"]["copy_gbps"] == 12.5


def test_hardware_lists_the_streams_beside_the_copy(cli, monkeypatch):
    from casebook.run import hardware

    monkeypatch.setattr(hardware, "identify", lambda: Machine(slug="cpu-test", name="Test CPU", kind="cpu",
                                                               datasheet=None))
    ceilings = {"copy_gbps": 12.5, "read_gbps": 19.0, "write_gbps": 14.0, "matmul_tflops": {"fp32": 0.2},
                "launch_us": 2.0, "graph_launch_us": 2.0}
    monkeypatch.setattr(hardware, "ceilings", lambda remeasure=False: ceilings)
    monkeypatch.setenv("COLUMNS", "200")
    result = cli("hardware")
    assert result.exit_code == 0
    assert "memory bandwidth (reads only)" in result.output and "19 GB/s" in result.output
    assert "memory bandwidth (writes only)" in result.output and "14 GB/s" in result.output


def test_serve_prints_its_url(monkeypatch, capsys):
    import mkdocs.commands.serve

    from casebook.commands import build

    seen = {}
    monkeypatch.setattr(mkdocs.commands.serve, "serve", lambda **kw: seen.update(kw))
    assert build.serve(8123) == 0
    assert "http://127.0.0.1:8123/" in capsys.readouterr().out
    assert seen["dev_addr"] == "127.0.0.1:8123"


def test_compare_of_two_machines_says_so_and_exits_2(tmp_path, capsys):
    from casebook.commands import compare

    gpu = REPO / "tests/fixtures/results/nvidia-h200/softmax_fusion.json"
    cpu = REPO / f"tests/fixtures/results/{FIXTURE_CPU}/softmax_fusion.json"
    assert compare.main(gpu, cpu) == 2
    out = capsys.readouterr().out
    assert "different machines (nvidia-h200 and" in out and "--across-machines" in out
    assert out.startswith("A: ") and "\nB: " in out and "ceilings: copy" in out
    assert compare.main(gpu, cpu, across_machines=True) in (0, 1)
    assert compare.main(gpu, gpu) == 0
    first = capsys.readouterr().out.splitlines()
    assert first[-2].startswith("B: ") or any(line.startswith("B: ") for line in first)


# --- missing: the site -------------------------------------------------------------------------


def fixture_case(softmax_text: str, case_id: str, operator: str) -> str:
    """A copy of the softmax case as another operator's case (the book's new cases land this way)."""
    return (softmax_text.replace("\nid: softmax_fusion\n", f"\nid: {case_id}\n")
            .replace("\noperator: softmax\n", f"\noperator: {operator}\n"))


def test_the_transfer_graph_links_an_operator_to_its_cases(tmp_path, plot_cache, softmax_text):
    # The book's softmax case with its rmsnorm transfer naming no case: every rmsnorm case shows it.
    softmax = unnamed_transfer((REPO / "cases" / "softmax_fusion.yaml").read_text(), "rmsnorm")
    fixture = fixture_case(softmax_text, "rms_fixture", "rmsnorm")
    site = built_with(tmp_path, plot_cache, extra_cases={"softmax_fusion": softmax, "rms_fixture": fixture})
    html = (site / "browse" / "transfers" / "index.html").read_text()
    row = next(r for r in re.findall(r"<tr>.*?</tr>", html, re.S) if ">rmsnorm<" in r and "Fused softmax" in r)
    assert 'href="../../cases/rms_fixture/"' in row  # "Shown by" the rmsnorm case, not "–"
    assert re.search(r"o\d+ -\. shown by \.-&gt; c_rms_fixture", html)
    index = json.loads((site / "search" / "search_index.json").read_text())
    graph_docs = [d for d in index["docs"] if d["location"].startswith("browse/transfers")]
    assert graph_docs and not any("flowchart" in d["text"] or "classDef" in d["text"] for d in graph_docs)


def test_browse_tables_show_each_cases_outcome(tmp_path, plot_cache):
    site = built_with(tmp_path, plot_cache)
    for page in ("pattern", "bottleneck", "operator"):
        html = (site / "browse" / page / "index.html").read_text()
        assert "Best variant" in html and "Median % of roof" in html and "Speedup over baseline" in html, page
        row = next(r for r in re.findall(r"<tr>.*?</tr>", html, re.S) if "cases/softmax_fusion/" in r)
        cells = [words(c) for c in re.findall(r"<td[^>]*>(.*?)</td>", row, re.S)]
        assert re.fullmatch(r"\d+%", cells[6]) and re.fullmatch(r"\d+\.\d\d×", cells[7]), cells


def test_the_home_page_shows_the_book(tmp_path, plot_cache):
    site = built_with(tmp_path, plot_cache)
    html = (site / "index.html").read_text()
    n = len(list((REPO / "cases").glob("*.yaml")))
    assert f"The book: {n} cases" in words(html)
    cards = re.findall(r'<li>\s*<p><strong><a href="cases/([a-z0-9_]+)/">', html)
    assert sorted(cards) == sorted(p.stem for p in (REPO / "cases").glob("*.yaml"))
    assert re.search(r"\w+: \d+% of roof, \d+\.\d\d× over torch_softmax on nvidia-h200", words(html))
    assert "Not yet measured on nvidia-h200." in words(html)  # the cases the fixture book has not run
    assert 'src="img/atlas/nvidia-h200.svg"' in html
    block = words(html[html.index('id="contributing-a-case"'):])
    steps = re.findall(r"casebook (new|validate|run|check|build)\b", block)
    assert steps[:5] == ["new", "validate", "run", "check", "build"]  # check needs the stored result


def test_a_home_card_shows_what_the_case_claims_and_never_a_rung_measured_elsewhere(tmp_path, plot_cache):
    """A case with a CPU result only is not yet measured on the GPU its claims name: its card says so, with its
    claims' tally, and shows no CPU number."""
    cases = copy_cases(tmp_path / "cases")
    results = copy_results(tmp_path / "results", cases)
    (results / "nvidia-h200" / "softmax_fusion.json").unlink()
    assert build_site(cases, results, tmp_path / "site", plot_cache) == 0
    html = (tmp_path / "site" / "index.html").read_text()
    card = words(re.search(r'<li>\s*<p><strong><a href="cases/softmax_fusion/">.*?</li>', html, re.S).group(0))
    from casebook.load import load_case

    n = len(load_case(cases / "softmax_fusion.yaml").claims)
    assert f"Not yet measured on nvidia-h200 (checked on {FIXTURE_CPU})." in card, card
    assert f"{n} claims: {n} not yet measured" in card, card
    assert "% of roof" not in card and "×" not in card


def with_an_h100_result(tmp_path: Path) -> tuple[Path, Path]:
    """The fixture book (cases, results) beside a real H100 run of the softmax case (the book's own), made fresh
    for the current files as the fixtures are."""
    from casebook.load import load_case
    from casebook.provenance import case_sha256, kernel_sha256

    cases = copy_cases(tmp_path / "cases")
    results = copy_results(tmp_path / "results", cases)
    doc = json.loads((REPO / "results" / "nvidia-h100-sxm" / "softmax_fusion.json").read_text())
    doc.update(case_sha256=case_sha256(cases / "softmax_fusion.yaml"),
               kernel_sha256=kernel_sha256(load_case(cases / "softmax_fusion.yaml").kernel.module, None,
                                           doc.get("kernel_modules") or ()))
    (results / "nvidia-h100-sxm").mkdir()
    (results / "nvidia-h100-sxm" / "softmax_fusion.json").write_text(json.dumps(doc))
    return cases, results


def test_a_home_card_shows_another_gpus_headline_as_that_gpus(tmp_path, plot_cache):
    """Where the GPU the claims name has no result and another GPU has one, the card shows that GPU's headline,
    naming it as a machine the claims do not name; a CPU's result is never shown so."""
    cases, results = with_an_h100_result(tmp_path)
    (results / "nvidia-h200" / "softmax_fusion.json").unlink()
    assert build_site(cases, results, tmp_path / "site", plot_cache) == 0
    html = (tmp_path / "site" / "index.html").read_text()
    card = words(re.search(r'<li>\s*<p><strong><a href="cases/softmax_fusion/">.*?</li>', html, re.S).group(0))
    assert "Not yet measured on nvidia-h200" in card, card
    assert re.search(r"On nvidia-h100-sxm, which its claims do not name: \w+, \d+% of roof, \d+\.\d\d× over "
                     r"torch_softmax\.", card), card
    assert FIXTURE_CPU not in card.split("which its claims do not name")[1]


def test_the_home_atlas_is_the_machine_the_claims_name_where_another_gpu_has_as_many_cases(tmp_path, plot_cache):
    """An H100 with as many cases as the H200 the claims are written for (and first by name) does not take the
    home page's atlas from it."""
    cases, results = with_an_h100_result(tmp_path)
    assert build_site(cases, results, tmp_path / "site", plot_cache) == 0
    html = (tmp_path / "site" / "index.html").read_text()
    assert 'src="img/atlas/nvidia-h200.svg"' in html and "img/atlas/nvidia-h100-sxm.svg" not in html


# --- cosmetic ----------------------------------------------------------------------------------


def test_a_list_folded_by_yaml_renders_as_a_list(make_case, softmax_text, tmp_path, plot_cache):
    head, rest = softmax_text.split("  notes: |\n", 1)
    folded = "  notes: >\n    The ladder:\n    - eager, five passes\n    - fused, one pass\n    - online, any row\n"
    path = make_case(text=head.replace("\nid: softmax_fusion\n", "\nid: folded\n") + folded
                     + rest[rest.index("  references:"):], name="folded")
    from casebook.load import load_case

    assert "The ladder: - eager, five passes - fused" in load_case(path).writeup.notes  # what YAML folding made
    results = copy_results(tmp_path / "results", path.parent, as_id="folded")
    assert build_site(path.parent, results, tmp_path / "site", plot_cache) == 0
    html = case_html(tmp_path / "site", "folded")
    assert re.search(r"<ul>\s*<li>eager, five passes</li>\s*<li>fused, one pass</li>\s*<li>online, any row</li>", html)


def test_a_dash_in_prose_stays_prose():
    assert "<ul>" not in text.markdown_html("exp(x - max) over the row, then a - b")


def test_a_dash_inside_brackets_never_splits_a_list_item():
    html = text.markdown_html("Measured:\n\n- one exponential (keeping exp(x - max) in the slot) changed\n"
                              "  nothing at 32K\n- a deeper ring [slots - 1] helped\n")
    items = re.findall(r"<li>(.*?)</li>", html, re.S)
    assert [" ".join(i.split()) for i in items] == [
        "one exponential (keeping exp(x - max) in the slot) changed nothing at 32K", "a deeper ring [slots - 1] helped"]


def test_a_list_right_under_a_paragraph_is_a_list_and_the_paragraph_after_it_is_not_an_item():
    html = text.markdown_html("What the run says:\n- cuBLAS ran faster\n  under casebook's timer\n- 1024^3 is "
                              "launch-bound\nSo the next step is a graph.\n\n```\n- a fenced dash\n```\n")
    assert re.search(r"<p>What the run says:</p>\s*<ul>\s*<li>cuBLAS ran faster\s+under casebook's timer</li>\s*"
                     r"<li>1024\^3 is launch-bound</li>\s*</ul>\s*<p>So the next step is a graph.</p>", html), html
    assert "- a fenced dash" in html  # a code block is left as it is


def test_the_baselines_grey_is_not_the_dtype_markers_colour():
    from casebook.render import plots

    svg = plots.roofline({"hardware": "h", "variants": ["eager", "fast"], "baseline": "eager",
                          "measured": {"bandwidth_gbps": 1000.0, "compute_tflops": {"bf16": 100.0}},
                          "datasheet": None, "shapes": ["1x2"],
                          "points": [{"variant": v, "dtype": "bf16", "shape": "1x2", "ai": 1.0, "tflops": 0.5,
                                      "ceiling_tflops": 1.0, "roof_fraction": 0.5}
                                     for v in ("eager", "fast")]}).decode()
    legend = svg[svg.index('id="legend_1"'):]
    baseline_marker = legend[:legend.index(">eager<")].rsplit("<use ", 1)[1]
    dtype_marker = legend[:legend.index(">bf16<")].rsplit("<use ", 1)[1]
    assert plots.BASELINE_GREY in baseline_marker  # the baseline: a filled grey dot
    assert "fill-opacity: 0" in dtype_marker and plots.INK in dtype_marker  # a dtype: a hollow ink outline


# --- confusing: the run table and the CPU page ----------------------------------------------------


def test_the_run_table_says_why_a_point_was_skipped_which_roof_binds_and_uses_cpu_units(capsys, monkeypatch):
    from casebook.commands import run
    from casebook.results import load

    monkeypatch.setattr(run.out, "width", 250)
    result = load(REPO / "tests/fixtures/results" / FIXTURE_CPU / "softmax_fusion.json")
    skipped = next(p for p in result.kernel_level if p.status == "skipped")
    timed = next(p for p in result.kernel_level if p.status == "ok" and 0 < p.roof_fraction < 0.5)
    run.report(result)
    out = capsys.readouterr().out
    assert f"skipped: {skipped.error}"[:50] in out
    assert f"{timed.regime} roof, {1 / timed.roof_fraction:.0f}x below" in out
    assert re.search(r"\d GFLOP/s|\d MFLOP/s", out) and not re.search(r"0\.0000\d+", out)


def test_the_cpu_page_uses_units_that_fit_and_says_how_far_below_the_roof(tmp_path, plot_cache):
    html = words(case_html(built_with(tmp_path, plot_cache)))
    cpu = html[html.index("x86-64 CPU, 2 cores", html.index("Level 1 · the single-kernel limit")):]
    assert re.search(r"\d (GFLOP/s|MFLOP/s)", cpu) and re.search(r"\d GB/s", cpu)
    assert re.search(r"bandwidth, \d+(\.\d)?× below", cpu)


def test_a_partial_end_to_end_still_shows_the_measured_kernel_share(tmp_path, plot_cache):
    def partial(doc):
        doc["end_to_end"] = {"description": "The attention block's softmax.",
                             "shape": {"batch": 1, "heads": 4, "seq": 256, "head_dim": 64}, "dtype": "bf16",
                             "baseline": "torch_softmax", "variant": "triton_online", "baseline_us": 354.9,
                             "baseline_kernel_us": 97.7, "kernel_share": 0.2753, "status": "partial",
                             "error": "variant triton_online cannot be timed here"}

    html = words(case_html(built_with(tmp_path, plot_cache, partial, hardware=FIXTURE_CPU)))
    assert "partial : variant triton_online cannot be timed here" in html or \
        "partial: variant triton_online cannot be timed here" in html
    assert re.search(r"torch_softmax 355 µs 97.7 µs 28%", html)
