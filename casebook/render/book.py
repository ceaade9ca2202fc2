"""The book as the site sees it: every validated case with its stored results, marked stale or not."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from casebook import evidence, provenance
from casebook.case import Case
from casebook.load import load_case
from casebook.paths import refusal
from casebook.result import Result
from casebook.roofline import ceilings_apart


class BookError(ValueError):
    """A case or result that cannot be rendered; the build fails with this message."""


def kernel_source(module: str) -> str | None:
    """The kernel module as text (never imported), or None when the file is missing or not the book's own
    (a symlink, or outside the kernels folder: `load_book` has refused such a book already)."""
    path = provenance.kernel_path(module)
    if not path.is_file() or refusal(path, provenance.KERNELS_DIR):
        return None
    return path.read_text(encoding="utf-8")


@dataclass
class StoredResult:
    """One results/<hardware>/<case>.json with what makes it stale."""

    result: Result
    path: Path
    stale: list[str] = field(default_factory=list)

    @property
    def slug(self) -> str:
        return str(self.result.hardware.slug or self.path.parent.name)

    @property
    def hardware_name(self) -> str:
        return str(self.result.hardware.name or self.slug)


@dataclass
class Entry:
    """A case, its file, and its results on every machine (sorted by hardware slug)."""

    case: Case
    path: Path
    results: list[StoredResult] = field(default_factory=list)
    notebooks: list[str] = field(default_factory=list)
    """The names of the notebooks that reason about it (`Notebook`)."""

    @property
    def id(self) -> str:
        return self.case.id


@dataclass
class Notebook:
    """notes/<name>.md: the reasoning behind one case or a family of them, in the order it happened (the floors,
    each prediction written before its run, what the run found, the next step). Markdown, shown as text."""

    name: str
    title: str
    body: str
    """The Markdown below the title line."""
    cases: list[str] = field(default_factory=list)


NOTEBOOK_BYTES = 1 << 20
"""The largest notebook the site shows (the book's own are 10-40 KB)."""

_NOTEBOOK_NAME = re.compile(r"[A-Za-z0-9_-]+")
_NAMED = re.compile(r"\bnotes/([A-Za-z0-9_-]+)\.md\b")
"""How a case names a notebook other than its own (notes/<its id>.md): its path, anywhere in the case file."""


@dataclass
class Book:
    entries: list[Entry]
    warnings: list[str] = field(default_factory=list)
    notebooks: dict[str, Notebook] = field(default_factory=dict)

    def get(self, case_id: str) -> Entry | None:
        return next((e for e in self.entries if e.id == case_id), None)

    def hardware(self) -> dict[str, list[StoredResult]]:
        """Results grouped by machine, GPUs first: by slug, and apart (`<slug>-2`, ...) where results under one
        slug measured ceilings more than `roofline.CEILINGS_APART` apart, so that each is drawn against
        ceilings of its own run's machine (`casebook check` reports such a slug)."""
        out: dict[str, list[StoredResult]] = {}
        machines: dict[str, list[str]] = {}  # slug -> its groups' keys
        for e in self.entries:
            for r in e.results:
                keys = machines.setdefault(r.slug, [])
                mine = r.result.hardware.measured
                key = next((k for k in keys if not ceilings_apart(mine, out[k][0].result.hardware.measured)), None)
                if key is None:
                    key = r.slug if not keys else f"{r.slug}-{len(keys) + 1}"
                    keys.append(key)
                out.setdefault(key, []).append(r)
        gpu_first = lambda item: (item[1][0].result.hardware.kind != "gpu", item[0])  # noqa: E731
        return dict(sorted(out.items(), key=gpu_first))


def load_book(cases_dir: Path, results_dir: Path, notes_dir: Path | None = None) -> Book:
    """Every case under cases_dir, every result under results_dir and every notebook under notes_dir (default:
    notes/ beside cases_dir); invalid files raise BookError."""
    entries: list[Entry] = []
    errors: list[str] = []
    for path in sorted(cases_dir.glob("*.yaml")):
        why = refusal(path, cases_dir)
        if why:
            errors.append(f"{path}: {why}")
            continue
        try:
            case = load_case(path)
        except Exception as err:  # the loader's message names the file and line
            errors.append(f"{path}: {err}")
            continue
        if case.id != path.stem:
            errors.append(f"{path}: id {case.id!r} differs from the file stem {path.stem!r}")
            continue
        module = provenance.kernel_path(case.kernel.module)
        why = refusal(module, provenance.KERNELS_DIR) if module.exists() or module.is_symlink() else None
        if why:
            errors.append(f"{path}: kernel module casebook/kernels/{module.name} {why}")
            continue
        entries.append(Entry(case, path))
    if errors:
        raise BookError("invalid case(s):\n" + "\n".join(errors))
    book = Book(entries, notebooks=load_notebooks(notes_dir or cases_dir.parent / "notes"))
    for entry in entries:  # its own notebook, then those its file names
        named = [entry.id, *_NAMED.findall(entry.path.read_text(encoding="utf-8"))]
        entry.notebooks = [n for n in dict.fromkeys(named) if n in book.notebooks]
        for name in entry.notebooks:
            book.notebooks[name].cases.append(entry.id)
    for path in sorted(results_dir.glob("*/*.json")) if results_dir.is_dir() else []:
        why = refusal(path, results_dir) or refusal(path.parent, results_dir)
        if why:
            raise BookError(f"{path}: {why}")
        _attach(book, path)
    for entry in book.entries:  # GPUs first, then by name: the machine the case is about leads
        entry.results.sort(key=lambda r: (r.result.hardware.kind != "gpu", r.slug))
    return book


def load_notebooks(notes_dir: Path) -> dict[str, Notebook]:
    """Every notes/<name>.md, by name; none where the folder is absent. A notebook that is a link, lies outside
    the folder, is not UTF-8, is over NOTEBOOK_BYTES or has a name that is not a plain word raises BookError."""
    out: dict[str, Notebook] = {}
    for path in sorted(notes_dir.glob("*.md")) if notes_dir.is_dir() else []:
        why = refusal(path, notes_dir)
        if why is None and not _NOTEBOOK_NAME.fullmatch(path.stem):
            why = "has a name other than letters, digits, '_' and '-' (it becomes the notebook page's address)"
        if why is None and (size := path.stat().st_size) > NOTEBOOK_BYTES:
            why = f"is {size} bytes, over the {NOTEBOOK_BYTES} a notebook may be"
        if why is not None:
            raise BookError(f"{path}: {why}")
        try:
            source = path.read_text(encoding="utf-8")
        except UnicodeDecodeError as e:
            raise BookError(f"{path}: not UTF-8 text ({e.reason} at byte {e.start})") from None
        first, _, rest = source.lstrip("\n").partition("\n")
        title, body = (first[2:].strip(), rest) if first.startswith("# ") else (path.stem, source)
        out[path.stem] = Notebook(path.stem, title or path.stem, body)
    return out


def _attach(book: Book, path: Path) -> None:
    result, unread = evidence.read(path)  # read once: what is checked is what is shown
    if result is None:
        raise BookError(f"{path}: not a valid result: {unread}")
    entry = book.get(result.case_id)
    if entry is None or result.case_id != path.stem:
        book.warnings.append(f"{path}: result for case {result.case_id!r}, which is not in the book; skipped")
        return
    stale = stale_reasons(entry, result)
    forged = evidence.problems(path, result=result)
    if forged:  # the page would show numbers the file cannot back
        raise BookError(f"{path}: not evidence: {forged[0]}")
    # The case's own claims, judged from the stored points, whatever the file says of them: a stale result's too
    # (its verdicts were never checked against its points, and its page says it is stale).
    result = result.model_copy(update={"claims": evidence.judged(entry.case, result)})
    stored = StoredResult(result, path, stale)
    entry.results.append(stored)


def stale_reasons(entry: Entry, result: Result) -> list[str]:
    """Why a stored result no longer describes the current case and kernel (empty: it does)."""
    return provenance.stale_reasons(result, entry.path, entry.case)
