"""What the attention family's interpreter tests share: a case's CPU-checkable rungs, the rung x shape x dtype
matrix, and one rung checked through casebook.run.inprocess as `casebook run` checks it."""

from __future__ import annotations

import zlib
from pathlib import Path

import yaml

from casebook.run.inprocess import check
from casebook.tolerance import TOLERANCE

REPO = Path(__file__).resolve().parents[2]


def load(case_id: str) -> dict:
    """The case file as plain data."""
    return yaml.safe_load((REPO / "cases" / f"{case_id}.yaml").read_text())


def cpu_rungs(case: dict) -> list[str]:
    """The functions of the rungs a CPU checks (on the CPU, or through the interpreter)."""
    return [v["fn"] for v in case["kernel"]["variants"] if {"cpu", "interpreter"} & set(v["backends"])]


def matrix(rungs: list[str], shapes: list[tuple], dtypes: list[str]) -> tuple[list[tuple], list[str]]:
    """(fn, shape, dtype) for every rung, shape and dtype, and their test ids."""
    cases = [(fn, s, d) for fn in rungs for s in shapes for d in dtypes]
    return cases, [f"{f}-{'x'.join(map(str, s))}-{d}" for f, s, d in cases]


def check_rung(mod, fn: str, shape: dict, dtype: str) -> None:
    """One rung against the module's float64 reference at a seed of its own, within its dtype's bound."""
    seed = zlib.crc32(repr((fn, tuple(shape.values()), dtype)).encode())
    c = check(getattr(mod, fn), mod.reference, mod.make_inputs, shape, dtype, "cpu", [seed])
    assert c.correct, c.error
    assert c.max_rel_err <= TOLERANCE[dtype]


def rel(out, ref) -> float:
    """Normwise relative error of `out` against a float64 `ref`."""
    return ((out.double() - ref).norm() / ref.norm()).item()
