"""cross_entropy: every CPU-checkable variant against the float64 gradient at awkward vocabularies (Triton
and Liger through the interpreter), through casebook.run.inprocess as `casebook run` checks them; the Triton
launchers' loss against the float64 loss; rows that are ignored, rows whose target is the row's maximum,
rows of -inf but one; label smoothing; the level-3 scenario; the traffic model.

Vocabularies 1, 1000, 2049 (one past a power of two), 4099 (a prime) and 32001 (one past Llama-2's
32000, and past a power of two's worth of chunks); rows 1 and 37; bf16 and fp32, the case's dtypes.
The interpreter runs one Python step per program and chunk, so the Triton variants get a covering
subset at 32001 (one row, then a few).
"""

from __future__ import annotations

import os

os.environ["TRITON_INTERPRET"] = "1"  # before any kernel module is imported: @triton.jit reads it then

import functools
import sys
import zlib
from pathlib import Path

import pytest
import torch
import yaml

from casebook.kernels import cross_entropy as mod
from casebook.run.check import TORCH_DTYPES, upcast
from casebook.run.inprocess import check
from casebook.tolerance import TOLERANCE

REPO = Path(__file__).resolve().parents[2]
CASE = yaml.safe_load((REPO / "cases" / "cross_entropy.yaml").read_text())
ON_CPU = [v["fn"] for v in CASE["kernel"]["variants"] if {"cpu", "interpreter"} & set(v["backends"])]
DTYPES = CASE["levels"]["kernel"]["dtypes"]
TRITON = ["triton_two_sweep", "triton_split"]
LAUNCHERS = {"triton_two_sweep": mod.two_sweep_triton, "triton_split": mod.split_triton}

# The interpreter computes -inf - -inf in masked lanes (the kernels mask the result): numpy warns.
pytestmark = pytest.mark.filterwarnings("ignore:invalid value encountered in subtract:RuntimeWarning")

CHUNK = 1024
"""Chunk of a split row, and step of a sweep, in these tests: 2049 columns are three chunks (the last
one column), 32001 are 32 (the last 257)."""


@pytest.fixture(autouse=True)
def _interpreter_chunk(monkeypatch):
    monkeypatch.setattr(mod, "INTERPRETER_BLOCK", CHUNK)


VOCABS = (1, 1000, 2049, 4099, 32001)
ROWS = (1, 37)
SHAPES = {
    "eager": [(r, v) for r in ROWS for v in VOCABS],
    "torch_cross_entropy": [(r, v) for r in ROWS for v in VOCABS],
    "liger": [(1, 1), (37, 1000), (1, 2049), (37, 4099), (3, 32001)],
    "triton_two_sweep": [(1, 1), (37, 1000), (1, 2049), (37, 4099), (3, 32001)],
    "triton_split": [(37, 1), (1, 1000), (37, 2049), (1, 4099), (3, 32001)],
}
CASES = [(fn, r, v, d, eps) for fn in SHAPES for (r, v) in SHAPES[fn] for d in DTYPES for eps in (0.0, 0.1)]


def seeds(*key) -> list[int]:
    """Two fresh seeds per test, different for every test."""
    s = zlib.crc32(repr(key).encode())
    return [s, s + 1]


def test_every_cpu_variant_is_covered():
    assert sorted(ON_CPU) == sorted(SHAPES)
    for fn, shapes in SHAPES.items():
        assert {v for _, v in shapes} == set(VOCABS), fn
        assert 1 in {r for r, _ in shapes}, fn


@pytest.mark.parametrize("fn, rows, vocab, dtype, eps", CASES,
                         ids=[f"{f}-{r}x{v}-{d}-ls{e}" for f, r, v, d, e in CASES])
def test_variant_matches_reference(fn, rows, vocab, dtype, eps):
    if fn == "liger":
        pytest.importorskip("liger_kernel", reason="liger-kernel is the `peers` extra")
    inputs = functools.partial(mod.make_inputs, label_smoothing=eps)
    c = check(getattr(mod, fn), mod.reference, inputs, {"tokens": rows, "vocab": vocab}, dtype, "cpu",
              seeds(fn, rows, vocab, dtype, eps))
    assert c.correct, c.error
    assert c.max_rel_err <= TOLERANCE[dtype]


def _inputs(rows: int, vocab: int, dtype: str, eps: float = 0.0, seed: int = 0) -> dict:
    return mod.make_inputs({"tokens": rows, "vocab": vocab}, TORCH_DTYPES[dtype], "cpu",
                           torch.Generator().manual_seed(seed), eps)


def _rel(out: torch.Tensor, ref: torch.Tensor) -> float:
    return float(torch.linalg.vector_norm(out.double() - ref) / torch.linalg.vector_norm(ref))


@pytest.mark.parametrize("fn", TRITON)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows, vocab, eps", [(1, 1000, 0.0), (37, 2049, 0.1), (3, 32001, 0.0), (5, 4099, 0.1)])
def test_launcher_loss_matches_reference(fn, dtype, rows, vocab, eps):
    inputs = _inputs(rows, vocab, dtype, eps, seed=rows * vocab)
    inputs["target"][0] = vocab // 2  # at least one row counts: no row counted is the NaN test below
    want = mod.reference_loss(**upcast(inputs))
    loss, grad = LAUNCHERS[fn](**inputs)
    assert loss.dtype == torch.float32 and loss.ndim == 0
    assert abs(float(loss) - float(want)) <= TOLERANCE[dtype] * abs(float(want))
    assert _rel(grad, mod.reference(**upcast(inputs))) <= TOLERANCE[dtype]


ALL_ON_CPU = ["eager", "torch_cross_entropy", *TRITON]


@pytest.mark.parametrize("fn", ALL_ON_CPU)
@pytest.mark.parametrize("dtype", DTYPES)
def test_ignored_rows_get_zero_gradient_and_do_not_count(fn, dtype):
    inputs = _inputs(6, 2049, dtype, seed=3)
    inputs["target"][[0, 2, 5]] = mod.IGNORE_INDEX
    out = getattr(mod, fn)(**inputs)
    assert torch.count_nonzero(out[[0, 2, 5]]) == 0
    assert _rel(out, mod.reference(**upcast(inputs))) <= TOLERANCE[dtype]
    if fn in LAUNCHERS:  # the mean is over the three counted rows
        assert float(LAUNCHERS[fn](**inputs)[0]) == pytest.approx(float(mod.reference_loss(**upcast(inputs))),
                                                                  rel=TOLERANCE[dtype])


@pytest.mark.parametrize("fn", TRITON)
def test_every_row_ignored_gives_zero_gradient_and_torchs_nan_loss(fn):
    inputs = _inputs(4, 1000, "fp32", seed=4)
    inputs["target"][:] = mod.IGNORE_INDEX
    loss, grad = LAUNCHERS[fn](**inputs)
    assert torch.count_nonzero(grad) == 0
    assert torch.isnan(loss) and torch.isnan(mod.reference_loss(**upcast(inputs)))


@pytest.mark.parametrize("fn", ALL_ON_CPU)
@pytest.mark.parametrize("dtype", DTYPES)
def test_target_at_the_row_maximum(fn, dtype):
    inputs = _inputs(9, 4099, dtype, eps=0.1, seed=5)
    inputs["target"] = inputs["logits"].float().argmax(dim=-1)
    out = getattr(mod, fn)(**inputs)
    assert _rel(out, mod.reference(**upcast(inputs))) <= TOLERANCE[dtype]
    if fn in LAUNCHERS:
        assert float(LAUNCHERS[fn](**inputs)[0]) == pytest.approx(float(mod.reference_loss(**upcast(inputs))),
                                                                  rel=TOLERANCE[dtype])


@pytest.mark.parametrize("fn", ALL_ON_CPU)
@pytest.mark.parametrize("dtype", DTYPES)
def test_rows_of_minus_inf_but_one(fn, dtype):
    # Whole chunks of -inf (the online max starts there): no NaN from exp(-inf - -inf). The finite
    # logit is the target, so the loss is 0 and the gradient of those rows is 0; other rows are normal.
    inputs = _inputs(4, 2049, dtype, seed=6)
    x, t = inputs["logits"], inputs["target"]
    for row, col in ((0, 2048), (2, 5)):
        x[row] = float("-inf")
        x[row, col] = 1.5
        t[row] = col
    t[1] = 7
    out = getattr(mod, fn)(**inputs)
    assert torch.isfinite(out).all()
    assert torch.count_nonzero(out[[0, 2]]) == 0
    assert _rel(out, mod.reference(**upcast(inputs))) <= TOLERANCE[dtype]
    if fn in LAUNCHERS:
        assert float(LAUNCHERS[fn](**inputs)[0]) == pytest.approx(float(mod.reference_loss(**upcast(inputs))),
                                                                  rel=TOLERANCE[dtype])


@pytest.mark.parametrize("eps", [0.0, 0.1])
def test_the_written_out_gradient_is_autograds(eps):
    """`reference` (softmax less the smoothed one-hot, over the counted tokens) against autograd through torch's
    F.cross_entropy: ignored tokens, a target at its row's maximum, a row of -inf but its target, one not."""
    inputs = upcast(_inputs(37, 1031, "fp32", eps=eps, seed=8))
    x, t = inputs["logits"], inputs["target"]
    t[[3, 9]] = mod.IGNORE_INDEX
    t[4] = int(x[4].argmax())
    x[5] = float("-inf")
    x[5, 7], t[5] = 1.5, 7
    x[6] = float("-inf")
    x[6, 2], x[6, 8], t[6] = 0.5, 1.0, 8
    want = mod.autograd_reference(**inputs)
    torch.testing.assert_close(mod.reference(**inputs), want, rtol=1e-12, atol=1e-15)
    assert torch.count_nonzero(mod.reference(**inputs)[[3, 9]]) == 0
    t[:] = mod.IGNORE_INDEX  # none counts: autograd's gradient is zero, not 0 / 0
    torch.testing.assert_close(mod.reference(**inputs), mod.autograd_reference(**inputs), rtol=0, atol=0)


def test_gradient_of_each_row_sums_to_zero():
    # softmax sums to 1 and the smoothed one-hot to 1: each counted row of the gradient sums to 0.
    inputs = _inputs(5, 4099, "fp32", eps=0.1, seed=7)
    grad = mod.triton_split(**inputs)
    assert grad.sum(dim=-1).abs().max() < 1e-6


def test_liger_rung_says_why_without_the_peer(monkeypatch):
    monkeypatch.setitem(sys.modules, "liger_kernel.ops.cross_entropy", None)  # import fails, as when absent
    with pytest.raises(NotImplementedError, match="peers"):
        mod.liger(**_inputs(2, 100, "fp32"))


def test_launchers_refuse_mismatched_targets():
    with pytest.raises(ValueError, match=r"target \[tokens\]"):
        mod.split_triton(torch.zeros(4, 10), torch.zeros(3, dtype=torch.long))


def test_lm_head_step_agrees_between_baseline_and_variant():
    e2e = CASE["levels"]["end_to_end"]
    shape = e2e["cpu_shape"]
    inputs = mod.make_head_inputs(shape, torch.bfloat16, "cpu", torch.Generator().manual_seed(8))
    calls = []

    def counted(kernel):
        def call(*args):
            calls.append(args[0].shape)
            return kernel(*args)
        return call

    base = mod.lm_head_step(counted(getattr(mod, e2e["baseline"])), **inputs)
    fused = mod.lm_head_step(counted(getattr(mod, e2e["variant"])), **inputs)
    assert calls == [(shape["tokens"], shape["vocab"])] * 2  # the kernel once per step, on the logits
    assert base.shape == inputs["hidden"].shape and base.dtype == torch.bfloat16
    assert _rel(fused, base.double()) <= 2 * TOLERANCE["bf16"]


def test_traffic_counts_one_read_and_one_write_of_the_logits():
    t = mod.traffic({"tokens": 4096, "vocab": 128256}, torch.bfloat16)
    n = 4096 * 128256
    assert t.bytes == 2 * n * 2 + 4096 * (8 + 4)
    assert t.flops == 5 * n
    assert t.flops / t.bytes == pytest.approx(CASE["bottleneck"]["arithmetic_intensity"], rel=1e-3)
    assert mod.traffic({"tokens": 2, "vocab": 3}, torch.float32).bytes == 2 * 6 * 4 + 2 * 12


def test_cluster_source_compiles_for_hopper_without_a_gpu():
    """cluster_bulk's CUDA kernel (softmax_cluster's helpers and cross_entropy_cluster's kernel) compiles for
    sm_90a with NVRTC, its three dtypes' kernels in the cubin; it runs in test_cross_entropy_gpu.py."""
    pytest.importorskip("cuda.core", reason="cuda-core (the test extra) compiles the CUDA source")
    from casebook.kernels import cross_entropy_cluster

    code = cross_entropy_cluster.compile_source("sm_90a").code
    assert code[:4] == b"\x7fELF"
    assert all(f"ce_rowsILi{k}EE".encode() in code for k in range(3))


def test_cluster_bulk_gives_rows_it_cannot_split_to_triton_split_and_fails_the_rest_off_hopper():
    """A row that is not a whole number of 16-byte vectors takes triton_split (same answer); a splittable row
    on a machine without clusters fails with why, rather than quietly timing another kernel."""
    inputs = mod.make_inputs({"tokens": 5, "vocab": 4099}, torch.float32, "cpu", torch.Generator().manual_seed(3))
    torch.testing.assert_close(mod.cluster_bulk(**inputs), mod.triton_split(**inputs))
    inputs = mod.make_inputs({"tokens": 5, "vocab": 4096}, torch.float32, "cpu", torch.Generator().manual_seed(3))
    with pytest.raises(ValueError, match="needs a CUDA device"):
        mod.cluster_bulk(**inputs)
