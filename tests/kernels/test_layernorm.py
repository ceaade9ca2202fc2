"""layernorm: every CPU-checkable variant of the forward and backward cases against float64 (autograd for
the gradients) at awkward shapes, through casebook.run.inprocess as `casebook run` checks them (the Triton variants
through the interpreter); each path of triton_long; the variance at large means; the dw, db reductions.

Shapes: rows 1, 7 and 37 and columns 2, 33, 1000 and 4097 (a one-column LayerNorm is identically b, so
two columns is the smallest with something to check; three for the backward, below), in every dtype.
"""

from __future__ import annotations

import os

os.environ["TRITON_INTERPRET"] = "1"  # before any kernel module is imported: @triton.jit reads it then

import zlib
from pathlib import Path

import pytest
import torch
import yaml

from casebook.kernels import layernorm as mod
from casebook.kernels import layernorm_backward, norm_backward
from casebook.run.inprocess import check
from casebook.tolerance import TOLERANCE

REPO = Path(__file__).resolve().parents[2]
DTYPES = ["fp32", "bf16", "fp16"]
GRID = [(r, c) for r in (1, 7, 37) for c in (2, 33, 1000, 4097)]
BACKWARD_GRID = [(r, 3 if c == 2 else c) for r, c in GRID]
"""Two columns leave dx no room: it lies orthogonal to both the ones vector and x_hat, which span R^2, so
the exact dx is ~eps and every computed one is cancellation; the backward takes three columns there."""
CASES = {
    "layernorm": (mod.reference, mod.make_inputs),
    "layernorm_backward": (mod.reference_backward, mod.make_backward_inputs),
}
MODULES = {"layernorm": mod, "layernorm_backward": layernorm_backward}
"""Each case's module, where its variants' functions are."""


def on_cpu(case: str) -> list[str]:
    doc = yaml.safe_load((REPO / "cases" / f"{case}.yaml").read_text())
    return [v["fn"] for v in doc["kernel"]["variants"] if {"cpu", "interpreter"} & set(v["backends"])]


POINTS = [(case, fn, r, c, d) for case in CASES for fn in on_cpu(case)
          for (r, c) in (BACKWARD_GRID if case == "layernorm_backward" else GRID) for d in DTYPES]


def run_check(case: str, fn: str, rows: int, cols: int, dtype: str, make_inputs=None, tolerance=None):
    reference, default_inputs = CASES[case]
    s = zlib.crc32(repr((case, fn, rows, cols, dtype)).encode())
    return check(getattr(MODULES[case], fn), reference, make_inputs or default_inputs, {"rows": rows, "cols": cols},
                 dtype, "cpu", [s, s + 1], tolerance)


def test_every_case_has_cpu_variants_here():
    assert on_cpu("layernorm") == ["eager", "torch_layer_norm", "triton_onepass", "triton_long"]
    assert on_cpu("layernorm_backward") == ["eager_backward", "torch_backward", "triton_atomic", "triton_partial",
                                            "triton_pipelined"]


@pytest.mark.parametrize("case, fn, rows, cols, dtype", POINTS,
                         ids=[f"{case}-{f}-{r}x{c}-{d}" for case, f, r, c, d in POINTS])
def test_variant_matches_reference(case, fn, rows, cols, dtype):
    c = run_check(case, fn, rows, cols, dtype)
    assert c.correct, c.error
    assert c.max_rel_err <= TOLERANCE[dtype]


class Spy:
    def __init__(self, name: str, kernel, launches: list):
        self.name, self.kernel, self.launches = name, kernel, launches

    def __getitem__(self, grid):
        self.launches.append(self.name)
        return self.kernel[grid]


@pytest.fixture
def launches(monkeypatch) -> list:
    seen: list = []
    for name in ("_rows_kernel", "_chunked_rows_kernel"):
        monkeypatch.setattr(mod, name, Spy(name, getattr(mod, name), seen))
    return seen


@pytest.mark.parametrize("cols, path", [(1000, "_rows_kernel"), (2048, "_rows_kernel"),
                                        (2049, "_chunked_rows_kernel"), (5000, "_chunked_rows_kernel")])
@pytest.mark.parametrize("dtype", DTYPES)
def test_long_rows_take_each_path(cols, path, dtype, launches, monkeypatch):
    monkeypatch.setattr(mod, "MAX_ONEPASS", 2048)
    monkeypatch.setattr(mod, "INTERPRETER_CHUNK", 256)
    c = run_check("layernorm", "triton_long", 5, cols, dtype)
    assert c.correct, c.error
    assert set(launches) == {path}


def test_the_real_thresholds_at_full_length():
    for cols in (mod.MAX_ONEPASS, mod.MAX_ONEPASS + 1):
        assert run_check("layernorm", "triton_long", 2, cols, "bf16").correct, cols


# --- the variance at large means ---------------------------------------------------------------------


def test_sum_of_squares_cancels_where_the_merge_does_not():
    small, large = mod.variance_error(0.0), mod.variance_error(1000.0)
    assert max(small.values()) < 1e-6  # centred data: every method is exact to fp32
    assert large["sum_sumsq"] > 0.01  # E[x^2] - E[x]^2 at mean 1000, unit spread: percent-level error
    assert large["chan_merge"] < 1e-4 and large["centred"] < 1e-6


def _offset_inputs(offset: float):
    def make(shape, dtype, device, generator):
        inputs = mod.make_inputs(shape, dtype, device, generator)
        return {**inputs, "x": (inputs["x"].float() + offset).to(dtype)}
    return make


@pytest.mark.parametrize("cols, path", [(1000, "_rows_kernel"), (5000, "_chunked_rows_kernel")])
def test_kernels_stay_accurate_at_a_large_mean(cols, path, launches, monkeypatch):
    """fp32 rows of mean 1000 and unit spread: y within 1e-4 of float64 from the one-pass kernel's centred
    variance and from the chunked kernel's merged statistics alike. (Not fp32's 1e-5: the mean itself,
    summed in fp32, carries ~6e-5 of error relative to the spread; torch.layer_norm reads 1.1e-5 here,
    and a sum of squares would put ~20% into the variance, ~10% into y.)"""
    monkeypatch.setattr(mod, "MAX_ONEPASS", 2048)
    monkeypatch.setattr(mod, "INTERPRETER_CHUNK", 256)
    c = run_check("layernorm", "triton_long", 3, cols, "fp32", make_inputs=_offset_inputs(1000.0), tolerance=1e-4)
    assert c.correct, c.error
    assert set(launches) == {path}


# --- the backward -------------------------------------------------------------------------------------


@pytest.mark.parametrize("rows, cols", [(1, 1000), (37, 4097), (5, 2049)])
@pytest.mark.parametrize("dtype", DTYPES)
def test_pipelined_splits_rows_past_its_bound_by_columns(monkeypatch, rows, cols, dtype):
    """Past ROWS_UP_TO columns (lowered here) each row is split over programs owning a slice of dx, dw and db,
    the last slice ragged; every row's sums still span the whole row, and dw and db count every row once."""
    monkeypatch.setattr(norm_backward, "ROWS_UP_TO", 256)
    monkeypatch.setattr(norm_backward, "SPLIT_SLICE", 512)
    monkeypatch.setattr(norm_backward, "SPLIT_CHUNK", 256)
    seen = []
    monkeypatch.setattr(norm_backward, "split", lambda *a, _split=norm_backward.split: seen.append(1) or _split(*a))
    c = run_check("layernorm_backward", "triton_pipelined", rows, cols, dtype)
    assert c.correct, c.error
    assert c.max_rel_err <= TOLERANCE[dtype] and seen


def test_pipelined_takes_rows_the_committed_kernel_refuses(monkeypatch):
    monkeypatch.setattr(norm_backward, "SPLIT_SLICE", 4096)
    c = run_check("layernorm_backward", "triton_pipelined", 3, mod.MAX_BACKWARD + 1, "bf16")
    assert c.correct, c.error


def test_refuses_rows_it_cannot_hold():
    for fn in ("triton_atomic", "triton_partial"):
        with pytest.raises(NotImplementedError, match=f"got {mod.MAX_BACKWARD + 1}"):
            run_check("layernorm_backward", fn, 1, mod.MAX_BACKWARD + 1, "bf16")


@pytest.mark.parametrize("rows", [1, 3, 4, 37])
def test_dw_and_db_count_every_row_once(rows):
    g = torch.Generator().manual_seed(rows)
    inputs = mod.make_backward_inputs({"rows": rows, "cols": 40}, torch.float32, "cpu", g)
    for hot in {0, rows - 1}:
        dy = torch.zeros_like(inputs["dy"])
        dy[hot] = 1.0
        xhat = (inputs["x"][hot] - inputs["mean"][hot]) * inputs["rstd"][hot]
        for fn in (mod.triton_atomic, mod.triton_partial):
            _, dw, db = fn(**{**inputs, "dy": dy})
            torch.testing.assert_close(dw, xhat, rtol=1e-6, atol=1e-6)
            torch.testing.assert_close(db, torch.ones(40), rtol=0, atol=0)


def test_liger_rungs_say_why_they_skip_on_a_cpu():
    x = torch.randn(2, 8)
    with pytest.raises(NotImplementedError, match="GPU only|not installed"):
        mod.liger(x, torch.ones(8), torch.zeros(8))
    with pytest.raises(NotImplementedError, match="GPU only|not installed"):
        mod.liger_backward(x, torch.ones(8), torch.zeros(8), x, torch.zeros(2), torch.ones(2))


def test_traffic_counts_each_tensor_pass():
    shape = {"rows": 2048, "cols": 32768}
    n = 2048 * 32768
    assert mod.traffic(shape, torch.bfloat16).bytes == 2 * n * 2 + 2 * 32768 * 2
    assert mod.traffic_backward(shape, torch.float32).bytes == 3 * n * 4 + 2 * 2048 * 4 + 32768 * 4 + 2 * 32768 * 4


def test_scenarios_call_the_kernel_once_and_agree_across_variants():
    shape = {"tokens": 9, "hidden": 64, "out": 96}
    for scenario, make, names in ((mod.prenorm_projection, mod.make_layer_inputs, ("torch_layer_norm", "triton_long")),
                                  (mod.prenorm_projection_backward, mod.make_backward_layer_inputs,
                                   ("torch_backward", "triton_partial"))):
        outs = []
        for name in names:
            calls = []
            kernel = getattr(mod, name)
            inputs = make(shape, torch.float32, "cpu", torch.Generator().manual_seed(3))
            outs.append(scenario(lambda calls=calls, kernel=kernel, **kw: calls.append(1) or kernel(**kw), **inputs))
            assert len(calls) == 1
        torch.testing.assert_close(outs[0], outs[1], rtol=1e-4, atol=1e-4)
