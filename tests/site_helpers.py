"""Helpers for the site tests: fixture results made fresh for the current files, and a strict build."""

from __future__ import annotations

import json
import os
import shutil
from contextlib import contextmanager
from pathlib import Path

from casebook.commands import build
from casebook.load import load_case
from casebook.provenance import case_sha256, kernel_sha256

REPO = Path(__file__).resolve().parents[1]
FIXTURE_RESULTS = REPO / "tests" / "fixtures" / "results"


def copy_results(dest: Path, cases_dir: Path, case_id: str = "softmax_fusion", fresh: bool = True,
                 as_id: str | None = None) -> Path:
    """Copy the fixture results of `case_id` under dest/<hw>/<as_id>.json, hashed to the current files."""
    as_id = as_id or case_id
    case_path = cases_dir / f"{as_id}.yaml"
    case = load_case(case_path)
    for src in FIXTURE_RESULTS.glob(f"*/{case_id}.json"):
        doc = json.loads(src.read_text())
        doc["case_id"] = as_id
        doc["command"] = f"casebook run cases/{as_id}.yaml"
        if fresh:
            doc["case_sha256"] = case_sha256(case_path)
            doc["kernel_sha256"] = kernel_sha256(case.kernel.module)
        out = dest / src.parent.name / f"{as_id}.json"
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(doc))
    return dest


def copy_cases(dest: Path) -> Path:
    dest.mkdir(parents=True, exist_ok=True)
    for path in (REPO / "cases").glob("*.yaml"):
        shutil.copy(path, dest / path.name)
    return dest


def unnamed_transfer(case_text: str, operator: str) -> str:
    """A case's YAML with its transfer to `operator` naming no case: the site then shows the transfer by
    every case of that operator."""
    named = f"  - operator: {operator}\n    case: {operator}\n"
    assert named in case_text, f"no transfer to {operator} naming its case"
    return case_text.replace(named, f"  - operator: {operator}\n")


@contextmanager
def env(**values: str):
    old = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def build_site(cases: Path, results: Path, out: Path, cache: Path | None = None) -> int:
    """`casebook build --strict` over these cases and results; the exit code."""
    extra = {"CASEBOOK_PLOT_CACHE": str(cache)} if cache else {"CASEBOOK_NO_CACHE": "1"}
    with env(CASEBOOK_CASES=str(cases), CASEBOOK_RESULTS=str(results), **extra):
        return build.main(out, strict=True)
