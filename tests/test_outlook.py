"""The projections and history pages: what they show from a book and a repository."""

from pathlib import Path
from types import SimpleNamespace

from casebook.render import outlook, text
from casebook.render.book import Book, Entry, load_book
from tests.test_history import repo  # noqa: F401  (the throw-away repository fixture)


def test_projections_page_marks_every_band_as_projected():
    page = outlook.projections_page(load_book(Path("cases"), Path("results")))
    assert "NVIDIA B200 (projected from NVIDIA H200)" in page
    assert "never measurements: no claim is judged on them" in page
    assert "No case has results on two GPUs yet" in page  # nothing to check projections against, yet


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


def test_a_case_page_has_a_projected_tab_per_registry_gpu_without_a_result():
    from casebook.render.pages import case_page

    book = load_book(Path("cases"), Path("results"))
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


def test_a_projected_tab_shows_both_edges_and_names_the_cap_once():
    from casebook.projection import BOUNDS
    from casebook.render.pages import case_page

    book = load_book(Path("cases"), Path("results"))
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
