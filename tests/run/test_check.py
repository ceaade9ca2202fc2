"""casebook.run.check and casebook.run.inprocess: every way a kernel can be wrong or cheat is caught, in process,
before any timing.

The broken kernels live in tests/fixtures/kernels/cheats.py; each test loads a fresh copy (the caching
cheats keep state). The same kernels go through a child process in test_child.py and through the whole
`casebook run` in test_orchestrate.py.
"""

from __future__ import annotations

import importlib.util
import typing
from pathlib import Path

import pytest
import torch

from casebook import case
from casebook.run.check import TORCH_DTYPES, CheckFailed, upcast
from casebook.run.inprocess import check
from casebook.tolerance import TOLERANCE

CHEATS = Path(__file__).parents[1] / "fixtures" / "kernels" / "cheats.py"
SHAPE = {"rows": 64, "cols": 1000}


@pytest.fixture
def cheats():
    """A fresh copy of the cheats module."""
    spec = importlib.util.spec_from_file_location("cheats_under_test", CHEATS)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def run_check(mod, fn: str, dtype: str = "fp32", shape: dict = SHAPE, seeds=(11, 12), **kw):
    return check(getattr(mod, fn), mod.reference, mod.make_inputs, shape, dtype, "cpu", list(seeds), **kw)


def test_every_schema_dtype_has_a_tolerance():
    dtypes = set(typing.get_args(case.Dtype))
    assert set(TOLERANCE) == dtypes
    assert dtypes - set(TORCH_DTYPES) <= {"fp8_e4m3", "fp8_e5m2"}  # only where this torch lacks fp8


def test_upcast_touches_only_float_tensors():
    x, i = torch.ones(2, dtype=torch.bfloat16), torch.ones(2, dtype=torch.int32)
    up = upcast({"x": x, "i": i, "n": 3})
    assert up["x"].dtype == torch.float64 and up["i"] is i and up["n"] == 3


@pytest.mark.parametrize("dtype", ["fp32", "bf16", "fp16"])
def test_honest_kernel_passes(cheats, dtype):
    c = run_check(cheats, "honest", dtype)
    assert c.correct and c.error is None and c.seeds == [11, 12]
    assert 0 < c.max_rel_err <= TOLERANCE[dtype]


# (cheat, dtype, what the error must say)
CAUGHT = [
    ("writes_nothing", "fp32", "NaN or Inf"),
    ("writes_nothing", "bf16", "NaN or Inf"),
    ("writes_part", "fp32", "1 of 64000 output elements are NaN or Inf"),
    ("writes_part", "bf16", "1 of 64000 output elements are NaN or Inf"),
    ("mutates_input", "fp32", "input 'x' was modified"),
    ("in_place", "bf16", "input 'x' was modified"),
    ("returns_input", "fp32", "output aliases input 'x'"),
    ("returns_nan", "fp16", "1 of 64000 output elements are NaN or Inf"),
    ("returns_subclass", "fp32", "returned Lazy, not a plain torch.Tensor"),
    ("returns_list", "fp32", "returned list, not a plain torch.Tensor"),
    ("wrong_dtype", "bf16", "output dtype torch.float32, expected torch.bfloat16"),
    ("wrong_dtype", "fp16", "output dtype torch.float32, expected torch.float16"),
    ("wrong_shape", "fp32", "output shape (64, 1), expected (64, 1000)"),
    ("low_precision", "fp32", "relative error"),
    ("cached", "fp32", "seed 12: relative error"),
    ("cached", "bf16", "seed 12: relative error"),
]


@pytest.mark.parametrize("fn, dtype, words", CAUGHT, ids=[f"{f}-{d}" for f, d, _ in CAUGHT])
def test_cheat_is_caught(cheats, fn, dtype, words):
    c = run_check(cheats, fn, dtype)
    assert not c.correct
    assert words in c.error, c.error


def test_first_failing_seed_is_named(cheats):
    c = run_check(cheats, "cached", seeds=(5, 6, 7))
    assert c.error.startswith("seed 6: ") and c.seeds == [5, 6, 7]
    assert c.max_rel_err > TOLERANCE["fp32"], "max_rel_err is the worst error seen, the failing one included"


def test_cache_filled_during_the_check_is_invisible_to_one_check(cheats):
    """Why measure re-checks after timing: this cheat passes the first check's two calls."""
    assert run_check(cheats, "cached_after_check").correct
    later = run_check(cheats, "cached_after_check", seeds=(13,))
    assert not later.correct and "seed 13: relative error" in later.error


@pytest.mark.slow
def test_partial_write_is_caught_when_the_output_is_large(cheats):
    """Over 32 MiB the C allocator gives freshly mapped (zeroed) pages, never the freed poison block; one
    unwritten element of 17M is then far under the bf16 tolerance. Unwritten memory must show anyway."""
    c = run_check(cheats, "writes_part", "bf16", shape={"rows": 4096, "cols": 4100}, seeds=(1,))
    assert not c.correct and "1 of 16793600 output elements are NaN or Inf" in c.error, c.error


def test_checking_leaves_torch_as_it_was(cheats):
    """The NaN fill is for the checked call only: never while timing, never after."""
    run_check(cheats, "writes_part", seeds=(1,))
    assert not torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True, warn_only=True)
    try:
        assert not run_check(cheats, "writes_part", seeds=(1,)).correct
        assert torch.are_deterministic_algorithms_enabled(), "a caller's own setting is kept"
    finally:
        torch.use_deterministic_algorithms(False)


def test_nan_fails_whatever_the_tolerance(cheats):
    c = run_check(cheats, "returns_nan", tolerance=0.99)
    assert not c.correct and "NaN or Inf" in c.error


def test_tolerance_override(cheats):
    assert run_check(cheats, "low_precision", "fp32", tolerance=3e-2).correct
    assert not run_check(cheats, "honest", "bf16", tolerance=1e-9).correct


def test_unsupported_shape_propagates(cheats):
    with pytest.raises(NotImplementedError):
        run_check(cheats, "unsupported")


def test_a_raising_kernel_raises(cheats):
    """Exceptions other than CheckFailed propagate: the child records them as crashed."""
    with pytest.raises(RuntimeError, match="illegal memory access"):
        run_check(cheats, "raises")
    assert issubclass(CheckFailed, AssertionError)


def test_inputs_are_fresh_per_seed(cheats):
    seen = []

    def make_inputs(shape, dtype, device, generator):
        x = cheats.make_inputs(shape, dtype, device, generator)
        seen.append(x["x"].clone())
        return x

    assert check(cheats.honest, cheats.reference, make_inputs, SHAPE, "fp32", "cpu", [1, 2, 1]).correct
    assert not torch.equal(seen[0], seen[1]) and torch.equal(seen[0], seen[2])


# --- kernels that write two tensors (a fused add and norm: the sum and the normalised sum) -------------


def _pair_inputs(shape, dtype, device, generator):
    return {"x": torch.randn(shape["rows"], shape["cols"], generator=generator).to(dtype)}


def _pair_reference(x):
    return x * 2, x.sum(0)


@pytest.mark.parametrize("fn, words", [
    (lambda x: (x * 2, x.sum(0)), None),
    (lambda x: x * 2, "not a tuple of 2 tensors"),
    (lambda x: (x * 2,), "not a tuple of 2 tensors"),
    (lambda x: (x * 2, x.sum(1)), "output 1: output shape"),
    (lambda x: (x * 2, x.sum(0) + 1), "relative error"),
    (lambda x: (x * 2, torch.full((x.shape[1],), float("nan"))), "output 1: 48 of 48"),
    (lambda x: (lambda t: (t, t[0]))(x * 2), "outputs 0 and 1 alias"),
])
def test_a_tuple_of_outputs_is_checked_output_by_output(fn, words):
    c = check(fn, _pair_reference, _pair_inputs, {"rows": 64, "cols": 48}, "fp32", "cpu", [1, 2])
    assert c.correct == (words is None), c.error
    if words:
        assert words in c.error


def _scaled(x: torch.Tensor) -> torch.Tensor:
    return (torch.softmax(x.float(), dim=-1) * 1.015).to(x.dtype)


def _zero_row(x: torch.Tensor) -> torch.Tensor:
    y = torch.softmax(x, dim=-1)
    y[0] = 0
    return y


@pytest.mark.parametrize("fn", [_scaled, _zero_row], ids=["scaled-1.015", "one-zero-row"])
def test_what_spreads_thin_fails_the_row_bound(cheats, fn):
    """Under bf16's normwise bound (2%), over its row bound: every output 1.5% high, one row of 16384 zeroed."""
    c = run_check(cheats, "honest", "bf16", {"rows": 16384, "cols": 32}, seeds=(5,))
    assert c.correct
    c = check(fn, cheats.reference, cheats.make_inputs, {"rows": 16384, "cols": 32}, "bf16", "cpu", [5])
    assert not c.correct and "worst row off by" in c.error, c.error
    assert c.max_rel_err < TOLERANCE["bf16"], "normwise alone would have passed it"


def test_a_far_looser_own_tolerance_is_flagged():
    from casebook.tolerance import OVERRIDE_FLAG, bounds, overridden

    assert not overridden("bf16", None) and not overridden("bf16", 0.05)
    assert overridden("bf16", TOLERANCE["bf16"] * OVERRIDE_FLAG * 1.01)
    assert bounds("bf16", 0.04)[1] == pytest.approx(2 * bounds("bf16")[1])  # the row bound scales alike


@pytest.mark.parametrize("shape", [(1000, 96), (3, 50, 64), (4000,), ()])
def test_the_judgement_in_slices_is_the_judgement_whole(monkeypatch, shape):
    """A large output is compared a slice of rows at a time (the judge's memory beside the children's on a
    full GPU): the same errors as in one piece, and a NaN in the last slice is still found."""
    from casebook.run import check as check_mod

    g = torch.Generator().manual_seed(3)
    expected = torch.randn(shape, generator=g, dtype=torch.float64)
    out = (expected * (1 + 1e-3 * torch.randn(shape, generator=g, dtype=torch.float64))).to(torch.float32)
    whole = check_mod.compare_output(out, expected, "fp32", tolerance=1e-2)
    monkeypatch.setattr(check_mod, "CHUNK_ELEMENTS", 200)
    assert check_mod.compare_output(out, expected, "fp32", tolerance=1e-2) == pytest.approx(whole, rel=1e-12)
    if out.numel() > 1:
        out.view(-1)[-1] = float("nan")
        with pytest.raises(CheckFailed, match="1 of .* NaN or Inf"):
            check_mod.compare_output(out, expected, "fp32", tolerance=1e-2)


def test_one_bad_row_in_a_late_slice_fails_the_row_bound(monkeypatch):
    from casebook.run import check as check_mod

    monkeypatch.setattr(check_mod, "CHUNK_ELEMENTS", 64 * 10)
    expected = torch.randn(5000, 64, generator=torch.Generator().manual_seed(4), dtype=torch.float64)
    out = expected.to(torch.bfloat16)
    out[4997] = 0.0  # 1.4% of the whole output's norm: under bf16's normwise 2%
    with pytest.raises(CheckFailed, match="worst row off by 1 "):
        check_mod.compare_output(out, expected, "bf16")


def test_the_reference_is_given_only_the_inputs_it_names_upcast():
    """`check.reference_inputs`: an input the reference does not name (a copy only the variants read) is neither
    passed nor copied to float64; a reference taking **kwargs gets every input; what it gets is float64."""
    from casebook.run.check import reference_inputs

    x = {"q": torch.ones(2, dtype=torch.bfloat16), "k": torch.ones(3, dtype=torch.bfloat16), "n": 4}

    def names(q, n):
        return q

    def takes_all(q, **rest):
        return q

    assert set(reference_inputs(names, x)) == {"q", "n"} and reference_inputs(names, x)["q"].dtype == torch.float64
    every = reference_inputs(takes_all, x)
    assert set(every) == {"q", "k", "n"} and every["k"].dtype == torch.float64
    assert set(reference_inputs(max, x)) == {"q", "k", "n"}  # no signature to read: every input
