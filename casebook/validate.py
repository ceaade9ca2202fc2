"""Checks across a book of cases: ids, links, kernel names and, in strict mode, CPU check paths and results.

Kernel modules are read with `ast`, never imported: validating an untrusted pull request runs none of
its code. A case file's book is the folder above its `cases/` folder: kernels are looked up in
`<book>/casebook/kernels/` when that exists (else in the installed package), results in `<book>/results/`.
"""

from __future__ import annotations

import ast
import difflib
import functools
from dataclasses import dataclass, field
from pathlib import Path

from casebook import evidence, provenance, results
from casebook.case import Case, consistency_problems
from casebook.load import CaseError, Lines, _located, read_case
from casebook.paths import refusal
from casebook.result import RESULT_SCHEMA_VERSION, Ceilings, Result, shape_label
from casebook.roofline import CEILINGS_APART, ceilings_apart
from casebook.tolerance import OVERRIDE_FLAG, TOLERANCE, overridden
from casebook.traffic import INTENSITY_TOLERANCE


@dataclass
class Report:
    """What validating some paths found: the files read, the cases that loaded, every problem."""

    files: list[Path] = field(default_factory=list)
    cases: list[tuple[Path, Case, Lines]] = field(default_factory=list)
    problems: list[CaseError] = field(default_factory=list)

    @property
    def errors(self) -> list[CaseError]:
        return [p for p in self.problems if not p.warning]

    @property
    def warnings(self) -> list[CaseError]:
        return [p for p in self.problems if p.warning]


def validate(paths: list[Path], strict: bool = False) -> Report:
    """Load every case under `paths` and check it against the book; never raises CaseError."""
    report = Report()
    report.files, report.problems = case_files(paths)
    partial: list[tuple[Path, Raw, Lines]] = []
    for path in report.files:
        try:
            case, lines = read_case(path)
        except CaseError as e:
            report.problems += e.errors
            if e.source is not None:  # it parsed: shapes, links and kernel names are still checked, in this pass
                partial.append((path, Raw(e.source[0]), e.source[1]))
            continue
        except Exception as e:  # a bug in casebook: still a located line, never a traceback
            report.problems.append(CaseError(path, 1, "file",
                                             f"internal error ({type(e).__name__}: {e}); please report it"))
            continue
        report.cases.append((path, case, lines))
    report.problems += check_ids(report.cases)
    ids = book_ids(report.cases, report.files)
    for path, case, lines in report.cases:
        report.problems += check_links(case, lines, ids)
        report.problems += check_kernel(path, case, lines)
        report.problems += check_signatures(path, case, lines)
        if strict:
            report.problems += check_cpu_path(case, lines, path)
            report.problems += check_results(path, case, lines)
            report.problems += check_claims(path, case, lines)
            report.problems += check_tolerances(case, lines)
            report.problems += check_scaffold(path, case)
    for path, raw, lines in partial:
        seen = {(p.path, p.line, p.field) for p in report.problems}
        found: list[CaseError] = []
        for check in (lambda: [_located_problem(m, lines) for m in consistency_problems(raw)],
                      lambda: check_links(raw, lines, ids), lambda: check_kernel(path, raw, lines),
                      lambda: check_signatures(path, raw, lines)):
            try:
                found += check()
            except (TypeError, AttributeError, ValueError, KeyError):  # too broken for this check: the rest stand
                continue
        report.problems += [p for p in found if (p.path, p.line, p.field) not in seen]
    # Each file's problems together (stable: the order of the checks otherwise); a file read in part, whose
    # problems came from two passes over it, in line order.
    order = {str(f): i for i, f in enumerate(report.files)}
    again = {str(path) for path, _, _ in partial}
    report.problems.sort(key=lambda p: (order.get(p.path, -1), p.line if p.path in again else 0))
    return report


class Raw(dict):
    """A case file's plain data read like a Case (attributes too), for the checks that run on a file whose
    schema errors keep it from loading: a missing field reads as None, or empty where a Case has a default."""

    _EMPTY = {"variants": [], "transfers": [], "claims": [], "shapes": [], "cpu_shapes": [], "tensors": {}}

    def __init__(self, data: object):
        super().__init__(data if isinstance(data, dict) else {})

    def __getattr__(self, key: str) -> object:
        value = self.get(key)
        if value is None:
            value = self._EMPTY.get(key)
        if isinstance(value, dict):
            return Raw(value)
        if isinstance(value, list):
            return [Raw(x) if isinstance(x, dict) else x for x in value]
        return value


def _located_problem(message: str, lines: Lines) -> CaseError:
    """A cross-field `field: message` line as a located problem, as the loader locates the schema's own."""
    return _located({"type": "value_error", "loc": (), "msg": f"Value error, {message}", "input": None}, lines)


def case_files(paths: list[Path]) -> tuple[list[Path], list[CaseError]]:
    """The case files named by `paths` (a folder means its `*.yaml`), each once, in order."""
    files: dict[Path, Path] = {}
    errors = []
    for p in map(Path, paths):
        if p.is_dir():
            found = sorted(f for f in p.glob("*.yaml") if not f.name.startswith("."))
            if not found:
                errors.append(CaseError(p, 1, "file", f"folder {p.resolve()} holds no case files (*.yaml)"))
            for f in found:
                files.setdefault(f.resolve(), f)
        elif p.exists() or p.is_symlink():
            files.setdefault(p.resolve(), p)
        else:
            errors.append(CaseError(p, 1, "file", _missing(p)))
    kept = []
    for f in files.values():
        why = refusal(f, Path(f).absolute().parent.parent)
        if why:
            errors.append(CaseError(f, 1, "file", why))
        else:
            kept.append(f)
    return kept, errors


def _missing(p: Path) -> str:
    """Where a missing path was looked for, and what belongs there."""
    where = p.absolute()
    hint = ("run casebook in the book's root (the folder holding cases/ and casebook/kernels/), or name the "
            "case files" if p == Path("cases") else "name a case file (cases/<id>.yaml) or a folder of them")
    return f"no such file or folder (looked for {where}); {hint}"


def book_root(path: Path) -> Path:
    """The book a case file belongs to: the folder above its `cases/` folder."""
    return Path(path).resolve().parent.parent


# --- ids and links ---------------------------------------------------------------------------------


def check_ids(cases: list[tuple[Path, Case, Lines]]) -> list[CaseError]:
    """Every id names one case file (the loader has already made each id equal to its file stem)."""
    first: dict[str, Path] = {}
    errors = []
    for path, case, lines in cases:
        if case.id in first:
            errors.append(lines.error(("id",), f"id {case.id!r} is also the id of {first[case.id]}"))
        else:
            first[case.id] = path
    return errors


def book_ids(cases: list[tuple[Path, Case, Lines]], files: list[Path] = ()) -> frozenset[str]:
    """Ids a link may name: the cases read, and every case file beside them or beside the files given (one that
    did not load still has its book around it)."""
    folders = {path.resolve().parent for path, _, _ in cases} | {Path(f).resolve().parent for f in files}
    return frozenset({case.id for _, case, _ in cases} | {f.stem for d in folders for f in d.glob("*.yaml")})


def check_links(case: Case, lines: Lines, ids: frozenset[str]) -> list[CaseError]:
    """Every transfer's `case:` names a case in the book."""
    errors = []
    for i, t in enumerate(case.transfers):
        if t.case is not None and t.case not in ids:
            close = difflib.get_close_matches(t.case, sorted(ids), n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            errors.append(lines.error(("transfers", i, "case"), f"no case {t.case!r} in the book{hint}"))
    return errors


# --- kernel names, from the source ---------------------------------------------------------------


def check_kernel(path: Path, case: Case, lines: Lines) -> list[CaseError]:
    """The kernel module exists and defines, at top level, every function the case names."""
    module = case.kernel.module
    if not isinstance(module, str):
        return []
    source = provenance.kernel_file(module, path)
    shown = f"casebook/kernels/{module}.py"
    why = refusal(source, source.parent) if source.exists() or source.is_symlink() else None
    if why:
        return [lines.error(("kernel", "module"), f"{shown} {why}")]
    if not source.is_file():
        return [lines.error(("kernel", "module"), f"no kernel module {shown}")]
    names = top_level_names(source)
    if isinstance(names, str):
        return [lines.error(("kernel", "module"), f"{shown} does not parse: {names}")]
    k, e2e = case.kernel, case.levels.end_to_end
    wanted = [(("kernel", "reference"), k.reference), (("kernel", "inputs"), k.inputs),
              (("kernel", "traffic"), k.traffic)]
    wanted += [(("kernel", "variants", i, "fn"), v.fn) for i, v in enumerate(k.variants)]
    wanted += [(("kernel", "variants", i, "reference"), v.reference) for i, v in enumerate(k.variants) if v.reference]
    wanted += [(("levels", "end_to_end", "scenario"), e2e.scenario), (("levels", "end_to_end", "inputs"), e2e.inputs)]
    errors = []
    for loc, name in wanted:
        if isinstance(name, str) and name not in names:
            close = difflib.get_close_matches(name, sorted(names), n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            errors.append(lines.error(loc, f"{name!r} is not defined at the top level of {shown}{hint}"))
    return errors


def top_level_names(source: Path) -> frozenset[str] | str:
    """Names a module binds at top level (functions, classes, assignments, imports), or why it does not parse."""
    st = source.stat()
    return _names(str(source), st.st_mtime_ns, st.st_size)


@functools.lru_cache(maxsize=256)
def _names(source: str, mtime_ns: int, size: int) -> frozenset[str] | str:
    # Keyed on mtime and size so an edited module is read again; each module is parsed once per run.
    try:
        raw = Path(source).read_bytes()
        raw.decode("utf-8")  # what the run and the site read it as (a coding cookie does not change that)
        tree = ast.parse(raw, filename=source)
    except UnicodeDecodeError as e:
        return f"not UTF-8 text (byte {e.start}); save it as UTF-8"
    except SyntaxError as e:
        return f"line {e.lineno}: {e.msg}"
    except (ValueError, RecursionError, MemoryError, OSError) as e:
        return f"{type(e).__name__}: {e}"
    return frozenset(_bound(tree.body))


def _bound(body: list[ast.stmt]) -> set[str]:
    names: set[str] = set()
    for node in body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names |= {n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)}
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names |= {(a.asname or a.name).split(".")[0] for a in node.names}
        elif isinstance(node, (ast.If, ast.Try, ast.With)):  # `if HAS_X: def f(): ...` still binds f
            for block in ("body", "orelse", "finalbody"):
                names |= _bound(getattr(node, block, []))
            for handler in getattr(node, "handlers", []):
                names |= _bound(handler.body)
    return names


def check_signatures(path: Path, case: Case, lines: Lines) -> list[CaseError]:
    """Every variant takes the arguments the reference requires: the input maker's dict is passed by name, whole
    to each variant and to the reference as far as it names them (`run.check.reference_inputs`: an input only the
    variants read is not copied to float64), so a variant may take more than the reference, never less.

    Read from the source; functions defined other than by a plain `def` (a lambda, a partial, `*args`)
    are not judged.
    """
    source = provenance.kernel_file(case.kernel.module, path)
    if not source.is_file() or refusal(source, source.parent):  # check_kernel reports it
        return []
    st = source.stat()
    sigs = _signatures(str(source), st.st_mtime_ns, st.st_size)
    reference = case.kernel.reference or "reference"  # a file that did not load (`Raw`) leaves the defaults unset
    ref = sigs.get(reference)
    if ref is None:
        return []
    errors = []
    for i, v in enumerate(case.kernel.variants):
        fn = v.fn or v.name
        mine = sigs.get(fn)
        if mine is None or mine == ref:
            continue
        (ref_all, ref_required), (all_, _) = ref, mine
        if set(ref_required) <= set(all_):
            continue
        errors.append(lines.error(("kernel", "variants", i, "fn"),
                                  f"{fn}({', '.join(all_)}) does not take the arguments of "
                                  f"{reference}({', '.join(ref_all)}): the input maker's tensors are "
                                  "passed by name, to each variant and to the reference"))
    return errors


@functools.lru_cache(maxsize=256)
def _signatures(source: str, mtime_ns: int, size: int) -> dict[str, tuple[tuple[str, ...], tuple[str, ...]]]:
    """{name: (every parameter, the required ones)} for each plain top-level `def` bound once, without * or **."""
    try:
        tree = ast.parse(Path(source).read_bytes(), filename=source)
    except (SyntaxError, ValueError, RecursionError, MemoryError, OSError):
        return {}
    defs: dict[str, list] = {}

    def walk(body: list[ast.stmt]) -> None:
        for node in body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                defs.setdefault(node.name, []).append(node)
            elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.ClassDef, ast.Import, ast.ImportFrom)):
                for name in _bound([node]):
                    defs.setdefault(name, []).append(None)
            elif isinstance(node, (ast.If, ast.Try, ast.With)):
                for block in ("body", "orelse", "finalbody"):
                    walk(getattr(node, block, []))
                for handler in getattr(node, "handlers", []):
                    walk(handler.body)

    walk(tree.body)
    out = {}
    for name, nodes in defs.items():
        if len(nodes) != 1 or nodes[0] is None:
            continue
        a = nodes[0].args
        if a.vararg or a.kwarg:
            continue
        positional = a.posonlyargs + a.args
        params = [x.arg for x in positional + a.kwonlyargs]
        defaulted = {x.arg for x in positional[len(positional) - len(a.defaults):]} if a.defaults else set()
        defaulted |= {x.arg for x, d in zip(a.kwonlyargs, a.kw_defaults) if d is not None}
        out[name] = (tuple(params), tuple(p for p in params if p not in defaulted))
    return out


# --- strict: what a reviewer would reject ------------------------------------------------------------


SCAFFOLD_CASE = ("Scaffold written by `casebook new", ": a scaled add in one pass",
                 "Two or three sentences: the problem and the method", "placeholder weight, replace with a trace")
"""Text of `casebook new`'s case template that a finished case no longer holds."""

SCAFFOLD_KERNEL = "This is the scaffold `casebook new` writes"
"""Text of `casebook new`'s kernel template that a finished kernel module no longer holds."""


def check_scaffold(path: Path, case: Case) -> list[CaseError]:
    """The scaffold's placeholder text is gone from the case file and its kernel module."""
    errors = []
    rows = Path(path).read_text(encoding="utf-8", errors="replace").splitlines()
    for mark in SCAFFOLD_CASE:
        for i, row in enumerate(rows, 1):
            if mark in row:
                errors.append(CaseError(path, i, "scaffold", f"still holds the scaffold's placeholder ({mark!r}); "
                                                             "write your case's own"))
    source = provenance.kernel_file(case.kernel.module, path)
    readable = source.is_file() and not refusal(source, source.parent)  # check_kernel reports a refused one
    text = source.read_text(encoding="utf-8", errors="replace") if readable else ""
    if SCAFFOLD_KERNEL in text:
        line = text[: text.index(SCAFFOLD_KERNEL)].count("\n") + 1
        errors.append(CaseError(path, 1, "scaffold", f"casebook/kernels/{case.kernel.module}.py:{line} still is the "
                                                     "scaffold's scaled add; write your kernel"))
    return errors


def check_tolerances(case: Case, lines: Lines) -> list[CaseError]:
    """Warn where a variant's own `tolerance` is far above the bound of a dtype it is checked in
    (`check.OVERRIDE_FLAG`): its check then says little, and the page says so."""
    dtypes = {*case.levels.kernel.dtypes, case.levels.workload.dtype}
    out = []
    for i, v in enumerate(case.kernel.variants):
        loose = sorted(d for d in dtypes if d in TOLERANCE and overridden(d, v.tolerance))
        if loose:
            out.append(lines.error(("kernel", "variants", i, "tolerance"),
                                   f"variant {v.name!r} is checked to {v.tolerance:g}, more than {OVERRIDE_FLAG:g} "
                                   f"times the bound of {', '.join(f'{d} ({TOLERANCE[d]:g})' for d in loose)}: "
                                   "its check says little; the page shows the override", warning=True))
    return out


def check_cpu_path(case: Case, lines: Lines, path: Path | None = None) -> list[CaseError]:
    """Warn when a variant runs only on CUDA: nobody without a GPU can check it. A torch.compile variant is
    told that Inductor compiles for a CPU too, so `cpu` is the fix, not a reason."""
    source = provenance.kernel_file(case.kernel.module, path) if path else None
    text = source.read_text(encoding="utf-8", errors="replace") if source and source.is_file() and not refusal(
        source, source.parent) else ""
    out = []
    for i, v in enumerate(case.kernel.variants):
        if "cuda" not in v.backends or {"cpu", "interpreter"} & set(v.backends):
            continue
        message = (f"variant {v.name!r} runs only on cuda; add `cpu` or `interpreter` so it is checked on CPU-only "
                   "machines")
        if "torch.compile" in text and "compile" in f"{v.name} {v.fn}":
            message = (f"variant {v.name!r} runs only on cuda, but torch.compile's Inductor also compiles for a CPU "
                       "(C++/OpenMP): add `cpu` to its backends so that it is checked and timed there")
        out.append(lines.error(("kernel", "variants", i, "backends"), message, warning=True))
    return out


def check_results(path: Path, case: Case, lines: Lines) -> list[CaseError]:
    """Results exist for the case and were measured from the current case file and kernel module."""
    root = book_root(path)
    stored = sorted((root / "results").glob(f"*/{case.id}.json"))
    if not stored:
        return [CaseError(path, 1, "results", f"no results/<hardware>/{case.id}.json: run `casebook run {path} "
                                              "--save` and commit the result")]
    errors = []
    for result in stored:
        shown = result.relative_to(root).as_posix()
        why = refusal(result, root / "results") or refusal(result.parent, root / "results")
        if why:
            errors.append(CaseError(path, 1, "results", f"{shown} {why}"))
            continue
        doc, unread = evidence.read(result)
        if doc is None:
            errors.append(CaseError(path, 1, "results", f"{shown} is unreadable ({unread})"))
            continue
        reasons = provenance.stale_reasons(doc, path, case)
        errors += [CaseError(path, lines.line(("kernel", "module")) if "kernel module" in why else 1, "results",
                             f"{shown} is stale: {why}; run it again") for why in reasons]
        errors += [CaseError(path, 1, "results", f"{shown} is not evidence: {why}")
                   for why in evidence.problems(result, None if reasons else case, doc)]
        errors += [CaseError(path, 1, "results", f"{shown} {why}") for why in unpublishable(case, doc)]
        errors += [CaseError(path, 1, "results", f"{shown} {why}", warning=True) for why in missed_claims(doc)]
        if why := older_format(doc):
            errors.append(CaseError(path, 1, "results", f"{shown} {why}", warning=True))
        errors += [CaseError(path, 1, "results", why, warning=True) for why in ceilings_disagree(result, doc, root)]
        if why := intensity_mismatch(case, doc):
            errors.append(lines.error(("bottleneck", "arithmetic_intensity"), f"{why} (from {shown})"))
    return errors


def older_format(doc: Result) -> str | None:
    """Where a stored result is written in an older result format than this casebook's (`Result.written_in`): it
    reads through its migration, without what the format gained since; `casebook run --all --save --resume`
    measures it again."""
    if doc.written_in == RESULT_SCHEMA_VERSION:
        return None
    return (f"is written in result format {doc.written_in}, not {RESULT_SCHEMA_VERSION}: it lacks what the format "
            "gained since; the book's refresh (`casebook run --all --save --resume`) measures it again")


def intensity_mismatch(case: Case, doc: Result) -> str | None:
    """The case's declared arithmetic intensity against the traffic model's that its run recorded at the first
    level-1 shape, when they differ by more than `traffic.INTENSITY_TOLERANCE` (None: they agree, or the run
    recorded none). The declared figure is read from the case as it is now (it is not part of the hash)."""
    record = doc.arithmetic_intensity
    declared = case.bottleneck.arithmetic_intensity
    if declared is None or record is None or record.modelled is None or record.modelled <= 0:
        return None
    difference = declared / record.modelled - 1
    if abs(difference) <= INTENSITY_TOLERANCE:
        return None
    return (f"declared {declared:g} FLOP/byte, but the traffic model gives {record.modelled:.4g} at "
            f"{shape_label(record.shape or {})} {record.dtype} (the first level-1 shape and dtype): {difference:+.0%}, "
            f"more than {INTENSITY_TOLERANCE:.0%}; state the model's figure at that shape")


def ceilings_disagree(result: Path, doc: Result, root: Path) -> list[str]:
    """Results under the same hardware name as `result` whose measured ceilings differ from its own by more
    than `hardware.CEILINGS_APART`: one name standing for two machines (two hosts of one CPU model are), a
    warning on the results, not an error on the case being checked: its author cannot run the others' cases on
    their machine, and the site places each result on its own ceilings (`render.book`)."""
    mine = doc.hardware.measured
    out = []
    for other in sorted(result.parent.glob("*.json")):
        if other == result:
            continue
        theirs = _ceilings_of(other, other.stat().st_mtime_ns)
        if theirs is None:
            continue  # reported when its own case is checked
        apart = ceilings_apart(mine, theirs)
        if apart:
            out.append(f"{result.relative_to(root).as_posix()} and {other.relative_to(root).as_posix()} share the "
                       f"hardware name {result.parent.name!r} but their measured ceilings differ by more than "
                       f"{CEILINGS_APART:.0%} ({'; '.join(apart)}): two hosts of one model, or a disturbed run; the "
                       "site shows each on its own ceilings, as two machines")
    return out


@functools.cache
def _ceilings_of(path: Path, mtime_ns: int) -> Ceilings | None:
    """A stored result's measured ceilings, read once a check (each case's check compares its results with every
    other of their machine); None where it does not load."""
    try:
        return results.load(path).hardware.measured
    except (OSError, ValueError):
        return None


def unpublishable(case: Case, doc: Result) -> list[str]:
    """Why a stored result is not one to publish: a smoke or partial run, or one that records a failure."""
    why = []
    if " --quick" in doc.command:
        why.append("is a --quick smoke run, not a result to publish; run without --quick")
    ran = {v.name for v in doc.variants}
    missing = [v.name for v in case.kernel.variants if ran and v.name not in ran]
    if missing:
        why.append(f"lacks variant(s) {', '.join(missing)} (a --variant run); run the whole ladder")
    points = [*doc.kernel_level, *doc.workload_level.points]
    bad = [p for p in points if p.status in ("failed", "crashed", "timeout")]
    if bad:
        p = bad[0]
        why.append(f"records {len(bad)} failed point(s), first {p.variant} {shape_label(p.shape)} {p.dtype}: "
                   f"{p.status}: {p.error}; fix the variant (or its traffic model) and run again")
    unstable = [p for p in points if p.unstable]
    if unstable:
        p = unstable[0]
        why.append(f"records {len(unstable)} unstable point(s) (timed on a busy machine, or too scattered), first "
                   f"{p.variant} {shape_label(p.shape)} {p.dtype}: {'; '.join(p.unstable)}; run it again on a quiet "
                   "machine")
    if doc.hardware.measured.unstable:
        why.append(f"was placed on ceilings measured on a busy machine ({'; '.join(doc.hardware.measured.unstable)}); "
                   "run it again on a quiet machine")
    if doc.end_to_end.status == "failed":
        why.append(f"records a failed end-to-end scenario: {doc.end_to_end.error}")
    return why


def missed_claims(doc: Result) -> list[str]:
    """Claims the run measured as failed: a missed target is published with its number, so a warning."""
    return [f"records a failed claim: {c.text!r} ({c.detail}); the page shows it as failed; "
            "fix the kernel, or restate the claim as what was measured"
            for c in doc.claims if c.held is False]


def check_claims(path: Path, case: Case, lines: Lines) -> list[CaseError]:
    """A case claims something (review requires at least one claim); warn when a claim is scoped to machines
    with no stored result."""
    ran = {p.parent.name for p in (book_root(path) / "results").glob(f"*/{case.id}.json")}
    if not case.claims:
        return [lines.error(("claims",), "no claims: the run checks nothing against its measurements; review "
                                         "requires at least one (kinds: regime, roof_fraction, throughput, speedup)")]
    return [lines.error(("claims", i, "hardware"),
                        f"claim is scoped to {', '.join(c.hardware)}, which has no results/<hardware>/{case.id}.json: "
                        "it is never checked until the case runs there", warning=True)
            for i, c in enumerate(case.claims) if c.hardware and not ran & set(c.hardware)]
