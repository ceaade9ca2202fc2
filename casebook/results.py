"""Stored results: versioned JSON at results/<hardware-slug>/<case-id>.json, written atomically.

`save` / `save_as` (a `Result` in) and `load` (a `Result` out) are the ways between a result and its file (the
`.json.partial` checkpoint included); `document` is the JSON a result is stored as, and what crosses a process
boundary (a pool's worker, a Ray task). Every reader (check, compare, record, render) goes through `load`.
"""

from __future__ import annotations

import copy
import json
import os
import tempfile
from pathlib import Path

from casebook import paths
from casebook.result import RESULT_SCHEMA_VERSION, Result


def _points(doc: dict) -> list:
    workload = doc.get("workload_level")
    points = [*(doc.get("kernel_level") or []), *((workload.get("points") or []) if isinstance(workload, dict) else [])]
    return [p for p in points if isinstance(p, dict)]


def _v1_to_v2(doc: dict) -> dict:
    """1 -> 2: every field declared, none undeclared allowed. Two keys of older writers that no field holds are
    dropped: `rank` in a multi-device point (a rank's payload key that leaked into it) and the protocol's
    `target_rse` (the normal-theory stopping rule that `target_ci` replaced)."""
    doc = copy.deepcopy(doc)
    for p in _points(doc):
        p.pop("rank", None)
    if isinstance(doc.get("protocol"), dict):
        doc["protocol"].pop("target_rse", None)
    return {**doc, "schema_version": 2}


MIGRATIONS: dict[int, callable] = {1: _v1_to_v2}
"""Result format migrations: version N -> a function that turns a version-N document into N+1."""


class ResultError(ValueError):
    pass


PARTIAL = ".partial"
"""Suffix of a run's checkpoint (`<case-id>.json.partial`): what a run cut short had measured; never published."""


def result_path(results_dir: Path, hardware_slug: str, case_id: str) -> Path:
    return Path(results_dir) / hardware_slug / f"{case_id}.json"


def runs_dir() -> Path:
    """Where `casebook run` keeps every run: `$CASEBOOK_CACHE/runs` (default ~/.cache/casebook/runs), outside
    the repository, so that running a case leaves the work tree as it was. `results/` is written only on
    request (`run --save`, `casebook record`)."""
    return paths.CACHE_DIR / "runs"


def run_path(runs: Path, result: Result) -> Path:
    """`<runs>/<hardware-slug>/<case-id>/<UTC start, 20261202T070430.123456Z>.json`: one file per run (its start
    to the microsecond; older runs' to the second)."""
    stamp = result.started_at.replace("-", "").replace(":", "").replace("+0000", "Z")
    return Path(runs) / result.hardware.slug / result.case_id / f"{stamp}.json"


def document(result: Result) -> dict:
    """The result as stored: plain JSON data, the fields it was given (no defaults added), by their aliases."""
    return result.model_dump(mode="json", by_alias=True, exclude_unset=True)


def _a_result(result: Result) -> None:
    if not isinstance(result, Result):  # a document becomes a result through Result.model_validate, not here
        raise TypeError(f"results.save and save_as take a Result, not a {type(result).__name__}")


def save(result: Result, results_dir: Path) -> Path:
    """Write to `results_dir/<hardware-slug>/<case-id>.json` (`save_as`)."""
    _a_result(result)
    return save_as(result, result_path(results_dir, result.hardware.slug, result.case_id))


def save_as(result: Result, path: Path) -> Path:
    """Write `document(result)` atomically (temp file in the same folder, then rename): never a half-written
    result, and only what `load` reads back (a `Result` is valid from its construction, every field set since
    validated as it was set; strict JSON refuses a number that is not finite).

    A complete result replaces the checkpoint beside it; an incomplete one is written as the checkpoint
    (`<path>.partial`).
    """
    _a_result(result)
    doc = document(result)
    path = Path(path)
    checkpoint = path.with_name(path.name + PARTIAL)
    if result.complete is False:
        path = checkpoint
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.stem}.", suffix=".tmp")
    try:
        os.fchmod(fd, 0o644)  # a result is the book's to read, as a checkout's files are (mkstemp's are 0600)
        with os.fdopen(fd, "w") as f:
            json.dump(doc, f, indent=1, sort_keys=False, allow_nan=False)
            f.write("\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    if path != checkpoint:
        checkpoint.unlink(missing_ok=True)
    return path


def load(path: Path) -> Result:
    """Read a result, migrating older versions in memory; refuse newer ones."""
    try:
        doc = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise ResultError(f"{path}: unreadable result: {e}") from e
    version = written = doc.get("schema_version")
    if not isinstance(version, int):
        raise ResultError(f"{path}: schema_version: missing")
    if version > RESULT_SCHEMA_VERSION:
        raise ResultError(f"{path}: schema_version: {version} is newer than this casebook "
                          f"({RESULT_SCHEMA_VERSION}); upgrade casebook")
    while version < RESULT_SCHEMA_VERSION:
        doc = MIGRATIONS[version](doc)
        version = doc["schema_version"]
    result = Result.model_validate(doc)
    if written != version:  # migrated: what it was written in kept beside it (unset, it compares as before)
        result._written_in = written
    return result


def all_results(results_dir: Path) -> list[tuple[Path, Result]]:
    return [(p, load(p)) for p in sorted(Path(results_dir).glob("*/*.json"))]
