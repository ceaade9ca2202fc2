"""rmsnorm: every CPU-checkable variant of the three cases (forward, fused residual, backward) against
its float64 reference at awkward shapes, through casebook.run.inprocess as `casebook run` checks them (the
Triton variants through the interpreter); each path of triton_long; the dw reductions; the traffic
models.

Shapes: rows 1, 7 and 37 (one row, odd, prime; 37 rows leave persistent programs an uneven share) and
columns 1, 33, 1000 and 4097 (one element, one past a power of two, a masked tail, a tile just past
4K), in every dtype; the long-row paths at 16K + 1 and 32K + 1 columns with thresholds lowered so that
the interpreter reaches them in seconds. Gradients are checked against float64 autograd.
"""

from __future__ import annotations

import os

os.environ["TRITON_INTERPRET"] = "1"  # before any kernel module is imported: @triton.jit reads it then

import zlib
from pathlib import Path

import pytest
import torch
import yaml

from casebook.kernels import norm_backward, rmsnorm_backward
from casebook.kernels import rmsnorm as mod
from casebook.run.inprocess import check
from casebook.tolerance import TOLERANCE

REPO = Path(__file__).resolve().parents[2]
DTYPES = ["fp32", "bf16", "fp16"]
ROWS, COLS = (1, 7, 37), (1, 33, 1000, 4097)
GRID = [(r, c) for r in ROWS for c in COLS]

CASES = {  # case id -> (reference, input maker)
    "rmsnorm": (mod.reference, mod.make_inputs),
    "rmsnorm_residual": (mod.reference_residual, mod.make_residual_inputs),
    "rmsnorm_backward": (mod.reference_backward, mod.make_backward_inputs),
}
MODULES = {"rmsnorm": mod, "rmsnorm_residual": mod, "rmsnorm_backward": rmsnorm_backward}
"""Each case's module, where its variants' functions are."""


def on_cpu(case: str) -> list[str]:
    doc = yaml.safe_load((REPO / "cases" / f"{case}.yaml").read_text())
    return [v["fn"] for v in doc["kernel"]["variants"] if {"cpu", "interpreter"} & set(v["backends"])]


BACKWARD_GRID = [(r, 3 if c == 1 else c) for r, c in GRID]
"""One column has dx = rstd w dy (1 - x_hat^2) ~ eps / x^2: all cancellation, no relative accuracy to
check (the exact answer is ~1e-5 of its terms); the backward takes three columns there instead. With two, dx
lies on the one direction orthogonal to x_hat and some draws are still mostly cancellation: every rung, eager's
fp32 formula too, came out 1.6e-5 off at one seed."""

POINTS = [(case, fn, r, c, d) for case in CASES for fn in on_cpu(case)
          for (r, c) in (BACKWARD_GRID if case == "rmsnorm_backward" else GRID) for d in DTYPES]


def seeds(*key) -> list[int]:
    s = zlib.crc32(repr(key).encode())
    return [s, s + 1]


def run_check(case: str, fn: str, rows: int, cols: int, dtype: str):
    reference, make_inputs = CASES[case]
    return check(getattr(MODULES[case], fn), reference, make_inputs, {"rows": rows, "cols": cols}, dtype, "cpu",
                 seeds(case, fn, rows, cols, dtype))


def test_every_case_has_cpu_variants_here():
    assert on_cpu("rmsnorm") == ["eager", "torch_rms_norm", "triton_onepass", "triton_long"]
    assert on_cpu("rmsnorm_residual") == ["eager_residual", "torch_residual", "triton_onepass_residual",
                                          "triton_long_residual"]
    assert on_cpu("rmsnorm_backward") == ["eager_backward", "triton_atomic", "triton_partial", "triton_pipelined"]


@pytest.mark.parametrize("case, fn, rows, cols, dtype", POINTS,
                         ids=[f"{f}-{r}x{c}-{d}" for _, f, r, c, d in POINTS])
def test_variant_matches_reference(case, fn, rows, cols, dtype):
    c = run_check(case, fn, rows, cols, dtype)
    assert c.correct, c.error
    assert c.max_rel_err <= TOLERANCE[dtype]


# --- the paths of triton_long ---------------------------------------------------------------------


class Spy:
    """Stands in for a @triton.jit kernel: records `kernel[grid]` launches, then launches the real one."""

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


@pytest.fixture
def short_rows(monkeypatch):
    """Thresholds a sixteenth of the GPU's, so that the interpreter reaches every path in seconds."""
    monkeypatch.setattr(mod, "MAX_ONEPASS", 2048)
    monkeypatch.setattr(mod, "INTERPRETER_CHUNK", 256)


@pytest.mark.parametrize("case, fn", [("rmsnorm", "triton_long"), ("rmsnorm_residual", "triton_long_residual")])
@pytest.mark.parametrize("cols, path", [(1000, "_rows_kernel"), (2048, "_rows_kernel"),
                                        (2049, "_chunked_rows_kernel"), (5000, "_chunked_rows_kernel")])
@pytest.mark.parametrize("dtype", DTYPES)
def test_long_rows_take_each_path(case, fn, cols, path, dtype, launches, short_rows):
    c = run_check(case, fn, 5, cols, dtype)
    assert c.correct, c.error
    assert set(launches) == {path}


def test_the_real_thresholds_at_full_length():
    """A 32K row and one past it at the module's own threshold (a few seconds each)."""
    for cols in (mod.MAX_ONEPASS, mod.MAX_ONEPASS + 1):
        assert run_check("rmsnorm_residual", "triton_long_residual", 2, cols, "bf16").correct, cols


@pytest.mark.parametrize("fn, cols", [("triton_onepass", mod.MAX_ONEPASS + 1), ("triton_atomic", mod.MAX_BACKWARD + 1),
                                      ("triton_partial", mod.MAX_BACKWARD + 1)])
def test_variants_refuse_rows_they_cannot_hold(fn, cols):
    case = "rmsnorm" if fn == "triton_onepass" else "rmsnorm_backward"
    with pytest.raises(NotImplementedError, match=f"at most .* columns on chip; got {cols}"):
        run_check(case, fn, 1, cols, "bf16")


# --- the backward's dw reductions ----------------------------------------------------------------


@pytest.mark.parametrize("rows", [1, 2, 3, 4, 37, 200])
def test_dw_sums_every_row_once_whatever_the_programs(rows):
    """Fewer rows than programs, as many, and many more (the interpreter's persistent grid is 3 programs):
    dw must count each row exactly once, so dy = 1 on one row and 0 elsewhere gives that row's x_hat."""
    g = torch.Generator().manual_seed(rows)
    inputs = mod.make_backward_inputs({"rows": rows, "cols": 40}, torch.float32, "cpu", g)
    for hot in {0, rows // 2, rows - 1}:
        dy = torch.zeros_like(inputs["dy"])
        dy[hot] = 1.0
        want = inputs["x"][hot] * inputs["rstd"][hot]
        for fn in (mod.triton_atomic, mod.triton_partial):
            _, dw = fn(**{**inputs, "dy": dy})
            torch.testing.assert_close(dw, want, rtol=1e-6, atol=1e-6)


def test_liger_rungs_say_why_they_skip_on_a_cpu():
    x = torch.randn(2, 8)
    w = torch.ones(8)
    for call in (lambda: mod.liger(x, w), lambda: mod.liger_residual(x, x, w),
                 lambda: mod.liger_backward(x, w, x, torch.ones(2))):
        with pytest.raises(NotImplementedError, match="GPU only|not installed"):
            call()


def test_torch_backward_says_why_it_skips_on_a_cpu():
    x = torch.randn(2, 8)
    with pytest.raises(NotImplementedError, match="no CPU kernel"):
        mod.torch_backward(x, torch.ones(8), x, torch.ones(2))


# --- the traffic models ----------------------------------------------------------------------------


def test_traffic_counts_each_tensor_pass():
    shape = {"rows": 32768, "cols": 4096}
    n = 32768 * 4096
    for dtype, b in ((torch.bfloat16, 2), (torch.float32, 4)):
        assert mod.traffic(shape, dtype).bytes == 2 * n * b + 4096 * b
        assert mod.traffic_residual(shape, dtype).bytes == 4 * n * b + 4096 * b
        back = mod.traffic_backward(shape, dtype)
        assert back.bytes == 3 * n * b + 32768 * 4 + 4096 * b + 4096 * b  # partials are a variant's cost
    forward = mod.traffic(shape, torch.bfloat16)
    assert forward.flops / forward.bytes == pytest.approx(1.0, rel=0.01)  # the case's arithmetic_intensity


# --- the scenarios ------------------------------------------------------------------------------------


def test_scenarios_call_the_kernel_once_and_agree_across_variants():
    def g():
        return torch.Generator().manual_seed(5)

    shape = {"tokens": 9, "hidden": 64, "out": 96}
    cases = [
        (mod.prenorm_projection, mod.make_layer_inputs, ("torch_rms_norm", "triton_long")),
        (mod.residual_prenorm_projection, mod.make_residual_layer_inputs, ("torch_residual", "triton_long_residual")),
        (mod.prenorm_projection_backward, mod.make_backward_layer_inputs, ("eager_backward", "triton_partial")),
    ]
    for scenario, make, (base, variant) in cases:
        outs = []
        for name in (base, variant):
            calls = []
            kernel = getattr(mod, name)
            inputs = make(shape, torch.float32, "cpu", g())
            outs.append(scenario(lambda calls=calls, kernel=kernel, **kw: calls.append(1) or kernel(**kw), **inputs))
            assert len(calls) == 1, (scenario.__name__, name)
        torch.testing.assert_close(outs[0], outs[1], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("cols, path", [(1000, "rows"), (2049, "triton_partial"), (4097, "split")])
def test_pipelined_rung_takes_its_three_paths(monkeypatch, cols, path):
    """Rows pipelined to ROWS_UP_TO columns, the committed kernel from there to MAX_BACKWARD, the column split past
    it (all three bounds lowered here): each path right, at a ragged width, in bf16."""
    monkeypatch.setattr(norm_backward, "ROWS_UP_TO", 1024)
    monkeypatch.setattr(rmsnorm_backward, "MAX_BACKWARD", 4096)
    monkeypatch.setattr(norm_backward, "SPLIT_SLICE", 1024)
    monkeypatch.setattr(norm_backward, "SPLIT_CHUNK", 512)
    seen = []
    def spy(name, f):
        return lambda *a, **k: seen.append(name) or f(*a, **k)

    for name, owner in (("rows", norm_backward), ("split", norm_backward), ("triton_partial", rmsnorm_backward)):
        monkeypatch.setattr(owner, name, spy(name, getattr(owner, name)))
    c = run_check("rmsnorm_backward", "triton_pipelined", 7, cols, "bf16")
    assert c.correct, c.error
    assert set(seen) == {path}
