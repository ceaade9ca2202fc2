"""gemm_epilogue: every CPU-checkable variant against the float64 gelu(a @ b + bias) at small awkward
shapes (Triton through the interpreter), the traffic model and the transformer-MLP scenario."""

from __future__ import annotations

import os

os.environ["TRITON_INTERPRET"] = "1"  # before any kernel module is imported: @triton.jit reads it then

import zlib
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
import triton
import triton.language as tl
import yaml

from casebook.kernels import gemm_common
from casebook.kernels import gemm_epilogue as mod
from casebook.run.check import TORCH_DTYPES
from casebook.tolerance import TOLERANCE

REPO = Path(__file__).resolve().parents[2]
CASE = yaml.safe_load((REPO / "cases" / "gemm_epilogue.yaml").read_text())
# The harness's own per-dtype bounds, so the tests hold the kernels to what `casebook run` checks.
TOL = {TORCH_DTYPES[d]: TOLERANCE[d] for d in ("fp16", "bf16")}
DTYPES = [torch.float16, torch.bfloat16]
ON_CPU = [v["fn"] for v in CASE["kernel"]["variants"] if {"cpu", "interpreter"} & set(v["backends"])]
ON_GPU_ONLY = [v["fn"] for v in CASE["kernel"]["variants"] if not {"cpu", "interpreter"} & set(v["backends"])]
SHAPES = CASE["levels"]["kernel"]["cpu_shapes"] + [{"m": 1, "n": 40, "k": 24}, {"m": 70, "n": 40, "k": 48}]


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    return (torch.linalg.vector_norm(out.double() - ref) / torch.linalg.vector_norm(ref)).item()


def inputs(shape: dict, dtype: torch.dtype, seed: int = 0) -> dict:
    return mod.make_inputs(shape, dtype, "cpu", torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s.values())))
@pytest.mark.parametrize("fn", ON_CPU)
def test_variant_matches_reference(fn, shape, dtype):
    x = inputs(shape, dtype, seed=zlib.crc32(f"{fn}{shape}{dtype}".encode()))
    out = getattr(mod, fn)(**x)
    assert out.shape == (shape["m"], shape["n"]) and out.dtype == dtype
    assert rel_err(out, mod.reference(**{k: v.double() for k, v in x.items()})) < TOL[dtype]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="torch.compile variant is timed on CUDA only")
@pytest.mark.parametrize("fn", ON_GPU_ONLY)
def test_gpu_only_variant_matches_reference(fn):
    x = mod.make_inputs({"m": 256, "n": 192, "k": 128}, torch.bfloat16, "cuda", torch.Generator().manual_seed(0))
    out = getattr(mod, fn)(**x)
    assert rel_err(out.cpu(), mod.reference(**{k: v.cpu().double() for k, v in x.items()})) < TOL[torch.bfloat16]


def test_fused_epilogue_is_the_exact_erf_gelu():
    """A pre-activation range where tanh-GELU and erf-GELU differ by more than the fp16 tolerance."""
    k, n = 16, 64
    a = torch.eye(k, dtype=torch.float16)[:, :k]
    b = torch.linspace(-6, 6, k * n).reshape(k, n).to(torch.float16)
    bias = torch.zeros(n, dtype=torch.float16)
    pre = (a.double() @ b.double())
    exact, tanh = F.gelu(pre), F.gelu(pre, approximate="tanh")
    assert rel_err(tanh.half(), exact) > 1e-4
    out = mod.triton_fused(a=a, b=b, bias=bias)
    assert rel_err(out, exact) < rel_err(tanh.half(), exact)


def test_erf_epilogue_is_accurate_element_by_element():
    """The fitted erfc GELU (gemm_common._gelu_erf) in fp32, through the kernel: I @ X + 0 = X, so
    each output is GELU of one input. Relative error, element by element, against float64 over [-12, 12],
    the negative tail included, where GELU is tiny and a plain 1 + erf would cancel."""
    k, n = 32, 512
    x = torch.linspace(-12, 12, k * n, dtype=torch.float64).reshape(k, n)
    out = gemm_common.matmul(torch.eye(k), x.float(), torch.zeros(n), gelu="erf", schedule="tiled").double()
    exact = 0.5 * x * torch.erfc(-x / 2**0.5)  # F.gelu's 1 + erf cancels to 0 below x = -8, even in float64
    rel = (out - exact).abs() / exact.abs()
    assert rel.max() < 6e-5


@triton.jit
def _gelu_erf_of(x_ptr, y_ptr, n, BF16: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(y_ptr + offs, gemm_common._gelu_erf(tl.load(x_ptr + offs, mask=offs < n), BF16), mask=offs < n)


def test_bf16_erf_is_exact_to_a_twentieth_of_its_ulp():
    """The shorter fit the kernels take when they round to bf16, in fp32 before that rounding."""
    x = torch.linspace(-12, 12, 20_001, dtype=torch.float64)
    y = torch.empty(x.numel())
    _gelu_erf_of[(triton.cdiv(x.numel(), 1024), )](x.float(), y, x.numel(), True, 1024)
    exact = 0.5 * x * torch.erfc(-x / 2**0.5)
    assert ((y.double() - exact).abs() / exact.abs()).max() < 2e-4


def test_triton_plain_is_the_bare_gemm():
    x = inputs({"m": 37, "n": 53, "k": 29}, torch.float16)
    out = mod.triton_plain(**x)
    assert rel_err(out, x["a"].double() @ x["b"].double()) < TOL[torch.float16]


def test_inputs_are_seeded_random():
    s = {"m": 16, "n": 24, "k": 8}
    a, b = inputs(s, torch.float32, 3), inputs(s, torch.float32, 3)
    assert set(a) == {"a", "b", "bias"} and all(torch.equal(a[k], b[k]) for k in a)
    assert a["bias"].shape == (24,) and a["bias"].std() > 0.1


def test_traffic_terms():
    t = mod.traffic({"m": 8192, "n": 8192, "k": 1024}, torch.bfloat16)
    names = [term.name for term in t.terms]
    assert names[:4] == ["read a", "read b", "read bias", "write c"]
    assert t.bytes == (8192 * 1024 * 2 + 8192 * 8192) * 2 + 8192 * 2
    assert 2 * 8192 * 8192 * 1024 < t.flops < 1.01 * 2 * 8192 * 8192 * 1024
    assert 800 < t.flops / t.bytes < 850  # the arithmetic intensity the YAML states


def test_transformer_mlp_scenario_with_fused_kernel_matches_eager():
    e2e = CASE["levels"]["end_to_end"]
    x = mod.make_mlp_inputs(e2e["cpu_shape"], torch.float16, "cpu", torch.Generator().manual_seed(0))
    want = mod.transformer_mlp(getattr(mod, e2e["baseline"]), **x)
    got = mod.transformer_mlp(getattr(mod, e2e["variant"]), **x)
    assert got.shape == (e2e["cpu_shape"]["tokens"], e2e["cpu_shape"]["hidden"])
    assert rel_err(got, want.double()) < 1e-2
