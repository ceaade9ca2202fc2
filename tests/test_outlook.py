"""The projections and history pages: what they show from a book and a repository."""

import shutil
from pathlib import Path
from types import SimpleNamespace

from casebook.render import outlook, text
from casebook.render.book import Book, Entry, load_book
from tests.test_history import repo  # noqa: F401  (the throw-away repository fixture)


def _results(tmp_path, *machines: str) -> Path:
    """A results folder of the book's stored softmax results on `machines` alone: what the pages show follows from
    it, not from whichever machines the book has results for today."""
    for slug in machines:
        (tmp_path / slug).mkdir()
        shutil.copy(Path("results") / slug / "softmax_fusion.json", tmp_path / slug)
    return tmp_path


def test_projections_page_marks_every_band_as_projected(tmp_path):
    page = outlook.projections_page(load_book(Path("cases"), _results(tmp_path, "nvidia-h200")))
    assert "NVIDIA B200 (projected from NVIDIA H200)" in page
    assert "never measurements: no claim is judged on them" in page
    assert "No case has results on two GPUs yet" in page  # nothing to check projections against


def test_results_on_two_gpus_check_the_projection_both_ways_and_each_target_takes_the_nearest(tmp_path):
    book = load_book(Path("cases"), _results(tmp_path, "nvidia-h200", "nvidia-h100-sxm"))
    pairs = {(row["from"], row["to"]): row for row in outlook.accuracy(book)}
    assert set(pairs) == {("NVIDIA H200", "NVIDIA H100 80GB HBM3"), ("NVIDIA H100 80GB HBM3", "NVIDIA H200")}
    assert all(row["points"] > 100 for row in pairs.values())  # every timed level-1 point of both ladders
    page = outlook.projections_page(book)
    assert "No case has results on two GPUs yet" not in page and "| softmax&#95;fusion | NVIDIA H200 |" in page
    targets = {t["slug"]: t["source"] for t in outlook.case_projections(book.get("softmax_fusion"), book)}
    assert targets == {"nvidia-b200": "NVIDIA H200", "nvidia-a100-sxm": "NVIDIA H100 80GB HBM3"}


def test_history_page_lists_the_slower_step(repo):  # noqa: F811
    path, first, slower, noisy = repo
    entry = Entry(SimpleNamespace(id="toy", title="Toy"), path / "toy.yaml")
    found, judged = outlook.case_history(entry, path)
    assert len(found) == 3
    page = outlook.history_page(Book([entry]), path, {})
    assert f"`{slower[:9]}`" in page and "fast" in page  # the slower step, named by its commit
    assert f"`{noisy[:9]}`" not in page  # the noisy rerun is not a slowdown
    assert page.count("| toy |") == 1
    assert outlook.history_plot(entry, found)["machines"]["gpu-a"][0]["commit"] == first[:7]


def test_history_outside_git_is_empty(tmp_path):
    entry = Entry(SimpleNamespace(id="toy", title="Toy"), tmp_path / "toy.yaml")
    assert outlook.case_history(entry, tmp_path) == ([], [])


def test_a_case_page_has_a_projected_tab_per_registry_gpu_without_a_result(tmp_path):
    from casebook.render.pages import case_page

    book = load_book(Path("cases"), _results(tmp_path, "nvidia-h200"))
    entry = book.get("softmax_fusion")
    page = case_page(entry, book, {})
    section = page[page.index("## Projected on other GPUs"):]
    assert "Projected, not measured" in section and "No claim is judged on a projection" in section
    assert '=== "NVIDIA B200 (projected)"' in section and '=== "NVIDIA H100 SXM (projected)"' in section
    assert "(projected)" not in page[:page.index("## Projected on other GPUs")]
    assert '=== "NVIDIA H200 SXM (projected)"' not in section  # measured there: no projection
    [b200] = [t for t in outlook.case_projections(entry, book) if t["slug"] == "nvidia-b200"]
    [h200] = [r for r in entry.results if r.slug == "nvidia-h200"]
    timed = [p for p in h200.result.kernel_level if p.status == "ok" and p.regime]
    assert len(b200["points"]) == len(timed)
    assert all(r["optimistic"] != "–" and r["pessimistic"] != "–" for r in b200["points"])


def test_a_projected_tab_shows_both_edges_and_names_the_cap_once(tmp_path):
    from casebook.projection import BOUNDS
    from casebook.render.pages import case_page

    book = load_book(Path("cases"), _results(tmp_path, "nvidia-h200"))
    entry = book.get("softmax_fusion")
    section = case_page(entry, book, {}).split("## Projected on other GPUs", 1)[1]
    tabs = section.split('=== "')[1:]
    for target in outlook.case_projections(entry, book):
        [tab] = [t for t in tabs if t.startswith(f"{target['name']} (projected)")]
        assert "| Projected: optimistic | Pessimistic |" in tab
        for regime in target["bounds"]:
            assert tab.count(text.esc(BOUNDS[regime])) == 1  # once above the table, never on each row
        rows = [r for r in tab.splitlines() if r.strip().startswith("| ") and "µs" in r]
        assert len(rows) == len(target["points"]) and all(r.count("µs") == 3 for r in rows)  # source, both edges
        assert ("the two edges meet at every point" in tab) == target["edges_meet"]
    assert any(t["edges_meet"] for t in outlook.case_projections(entry, book))  # a slower GPU: one time, said so
