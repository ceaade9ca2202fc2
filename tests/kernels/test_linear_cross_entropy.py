"""linear_cross_entropy: every CPU-checkable rung against the float64 (loss, d hidden, dW) through
casebook.run.inprocess as `casebook run` checks them (Triton and Liger through the interpreter), at awkward
vocabularies (1, 1000, a prime), one token and odd token counts, bf16 and fp32, with and without label
smoothing; ignored rows; chunk sizes that do not divide the tokens; the in-place loss kernel with
targets at the chunks' edges; the chunk rule; the traffic model; the level-3 scenario.

bf16 is checked with the case's own tolerance (the logits rounded to bf16 between the GEMM and the loss
move a rare token's dW row by up to 3-4%: see the case's notes), and the normwise error is held to the
dtype's own bound besides.
"""

from __future__ import annotations

import os

os.environ["TRITON_INTERPRET"] = "1"  # before any kernel module is imported: @triton.jit reads it then

import functools
import zlib
from pathlib import Path

import pytest
import torch
import yaml

from casebook.kernels import cross_entropy as ce
from casebook.kernels import linear_cross_entropy as mod
from casebook.run.check import TORCH_DTYPES, upcast
from casebook.run.inprocess import check
from casebook.tolerance import TOLERANCE

REPO = Path(__file__).resolve().parents[2]
CASE = yaml.safe_load((REPO / "cases" / "linear_cross_entropy.yaml").read_text())
VARIANTS = {v["fn"]: v for v in CASE["kernel"]["variants"]}
ON_CPU = [fn for fn, v in VARIANTS.items() if {"cpu", "interpreter"} & set(v["backends"])]

pytestmark = pytest.mark.filterwarnings("ignore:invalid value encountered in subtract:RuntimeWarning")

CHUNK = 1024
"""Chunk of a split row under the interpreter: 4099 columns are five chunks, the last three columns."""


@pytest.fixture(autouse=True)
def _interpreter_chunk(monkeypatch):
    monkeypatch.setattr(ce, "INTERPRETER_BLOCK", CHUNK)
    monkeypatch.setattr(mod, "INTERPRETER_BLOCK", CHUNK)


# (tokens, hidden, vocab): vocabularies 1, 1000 and the prime 4099; one token and odd token counts.
# Each shape once in bf16 and once in fp32, label smoothing in one of the two, alternating.
SHAPES = [(1, 16, 1000), (37, 32, 1), (13, 16, 4099)]
CASES = [(fn, s, d, (0.0, 0.1)[(i + j) % 2]) for fn in ON_CPU for i, s in enumerate(SHAPES)
         for j, d in enumerate(("bf16", "fp32"))]


def seeds(*key) -> list[int]:
    s = zlib.crc32(repr(key).encode())
    return [s, s + 1]


def shape(t: int, h: int, v: int) -> dict:
    return {"tokens": t, "hidden": h, "vocab": v}


def _tolerance(fn: str, dtype: str) -> float | None:
    return VARIANTS[fn].get("tolerance") if dtype == "bf16" else None


def test_every_cpu_variant_is_covered():
    assert sorted(ON_CPU) == sorted(["torch_autograd", "split", "liger", "chunked"])
    assert {v for _, _, v in SHAPES} >= {1, 1000, 4099} and 1 in {t for t, _, _ in SHAPES}


@pytest.mark.parametrize("fn, s, dtype, eps", CASES, ids=[f"{f}-{'x'.join(map(str, s))}-{d}-ls{e}"
                                                          for f, s, d, e in CASES])
def test_variant_matches_reference(fn, s, dtype, eps):
    if fn == "liger":
        pytest.importorskip("liger_kernel", reason="liger-kernel is the `peers` extra")
    inputs = functools.partial(mod.make_inputs, label_smoothing=eps)
    c = check(getattr(mod, fn), mod.reference, inputs, shape(*s), dtype, "cpu", seeds(fn, s, dtype, eps),
              tolerance=_tolerance(fn, dtype))
    assert c.correct, c.error
    assert c.max_rel_err <= TOLERANCE[dtype]  # normwise, the dtype's own bound


def _inputs(t: int, h: int, v: int, dtype: str = "fp32", eps: float = 0.0, seed: int = 0) -> dict:
    return mod.make_inputs(shape(t, h, v), TORCH_DTYPES[dtype], "cpu", torch.Generator().manual_seed(seed), eps)


def _rel(out: torch.Tensor, ref: torch.Tensor) -> float:
    n = torch.linalg.vector_norm(ref)
    d = torch.linalg.vector_norm(out.double() - ref)
    return float(d / n) if n else float(d)


def _close(out, ref, bound: float) -> None:
    for i, (o, r) in enumerate(zip(out, ref)):
        assert _rel(o, r) <= bound, (i, _rel(o, r))


def test_first_token_always_counts():
    for seed in range(20):
        assert _inputs(1, 8, 50, seed=seed)["target"][0] != mod.IGNORE_INDEX


@pytest.mark.parametrize("fn", ON_CPU)
def test_ignored_rows_get_zero_d_hidden_and_do_not_count(fn):
    if fn == "liger":
        pytest.importorskip("liger_kernel", reason="liger-kernel is the `peers` extra")
    inputs = _inputs(11, 16, 1000, eps=0.1, seed=3)
    inputs["target"][[1, 4, 10]] = mod.IGNORE_INDEX
    out = getattr(mod, fn)(**inputs)
    assert torch.count_nonzero(out[1][[1, 4, 10]]) == 0
    _close(out, mod.reference(**upcast(inputs)), TOLERANCE["fp32"])


@pytest.mark.parametrize("chunk", [1, 5, 8, 36, 37, 64])
def test_chunk_sizes_that_do_not_divide_the_tokens(chunk):
    inputs = _inputs(37, 16, 1000, eps=0.1, seed=chunk)
    inputs["target"][[0, 36]] = torch.tensor([0, 999])  # the first and last vocabulary entries
    out = mod.chunked_triton(**inputs, chunk=chunk)
    _close(out, mod.reference(**upcast(inputs)), TOLERANCE["fp32"])


@pytest.mark.parametrize("eps", [0.0, 0.1])
def test_inplace_split_targets_at_chunk_edges(eps):
    """The target's logit is kept by the program whose chunk holds it: targets on each side of every chunk
    boundary (1023 | 1024, 2047 | 2048), in the last chunk's three columns and in the first column."""
    v = 4099
    logits = torch.randn(9, v, generator=torch.Generator().manual_seed(7)) * 2
    target = torch.tensor([0, 1023, 1024, 2047, 2048, 4096, 4098, mod.IGNORE_INDEX, 3000])
    n_valid = ce._n_valid(target)
    grad = logits.clone()
    losses = torch.empty(9)
    mod.split_inplace(grad, target, eps, n_valid, losses)
    want_loss, want_grad = ce.split_triton(logits, target, eps)
    assert abs(float(losses.sum() / n_valid) - float(want_loss)) <= 1e-5 * abs(float(want_loss))
    assert _rel(grad, ce.reference(logits.double(), target, eps)) <= TOLERANCE["fp32"]
    assert _rel(grad, want_grad.double()) <= 1e-6
    assert losses[7] == 0


def test_chunk_rule(monkeypatch):
    monkeypatch.setattr(mod.device, "INTERPRET", False)
    t, h, v = 8192, 4096, 128256
    c = mod.chunk_tokens(t, h, v)
    assert c == 384 and c % mod.CHUNK_ROUND == 0
    inputs = (t + v) * h * 2
    assert (inputs + c * v * 2) / inputs < 1.1  # outputs as large as the inputs, plus one chunk: the claim
    assert mod.chunk_tokens(4096, 4096, 32000) == 384  # the ridge's floor wins over the budget
    assert mod.chunk_tokens(100, 4096, 128256) == 100  # never more than the tokens
    monkeypatch.setattr(mod.device, "INTERPRET", True)
    assert mod.chunk_tokens(37, 16, 1000) == 8 and mod.chunk_tokens(3, 16, 1000) == 3


def test_traffic_model():
    t, h, v = 8192, 4096, 128256
    tr = mod.traffic(shape(t, h, v), torch.bfloat16)
    gemm = sum(x.flops for x in tr.terms if "@" in x.name)
    assert gemm == 3 * 2 * t * h * v
    assert tr.bytes == 2 * (t * h + v * h) * 2 + t * 8 + 2
    assert abs(tr.flops / tr.bytes - CASE["bottleneck"]["arithmetic_intensity"]) < 1


def test_lm_head_step_agrees_between_baseline_and_chunked():
    s = CASE["levels"]["end_to_end"]["cpu_shape"]
    inputs = mod.make_head_inputs(s, torch.float32, "cpu", torch.Generator().manual_seed(5))
    base = mod.lm_head_step(mod.torch_autograd, **inputs)
    assert base.shape == (s["tokens"], s["hidden"])
    assert _rel(mod.lm_head_step(mod.chunked, **inputs), base.double()) <= 1e-5
