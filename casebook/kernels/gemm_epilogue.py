"""GEMM + bias + GELU: fuse the elementwise tail into the GEMM's epilogue so C is written once.

What you will learn: a GEMM is compute-bound, its elementwise tail is bandwidth-bound, and which one
dominates the chain depends on K. Each extra pass over C (read and write, e bytes per element) costs
2 m n e / BW, while the GEMM costs 2 m n k / P; their ratio is e (P / BW) / k = 2 x 165 / k in bf16
on an H200. At K = 4096 one pass adds 8% to the GEMM; at K = 1024 it adds 32%. Fusing the bias add
and GELU into the epilogue (on the fp32 accumulator, before the single store) removes those passes
entirely, so the gain is small at large K and large at small K, exactly the MLP shapes of encoders
(BERT, ViT) whose hidden size is 1-1.3K.

The reference is the exact erf GELU, torch.nn.functional.gelu's default (BERT, ViT, Pythia/GPT-NeoX).
Once the passes are gone the epilogue's arithmetic is what is left. libdevice's erf branches per
element, and at K = 1024 it cost ~90 us beside a ~200 us GEMM (measured); the fused kernels now compute
GELU through a fitted erfc (gemm_common._gelu_erf, gelu_fit: 10 FP32 instructions per element in bf16,
two on the special-function unit). The tanh form (GPT-2's GELU, and what cuBLASLt's GELU
epilogue computes) needs a few FMAs and one tanh on the special-function unit; it is within 4.7e-4 of
the exact GELU everywhere (at x = 2.7, where a bf16 ulp is 0.016), so the variants that use it are
checked against the same exact reference. Each form is compared with the unfused chain of the same form.

The ladder (baseline: eager):
  eager               a @ b, + bias, gelu: three kernels, C crosses memory 1 + 2 x 2 times
  addmm_gelu          torch.addmm (cuBLASLt adds the bias in its epilogue), then gelu: two kernels
  addmm_gelu_tanh     the same with the tanh form of GELU
  torch_compile       Inductor on the eager code: cuBLAS mm plus one fused bias+GELU kernel
  addmm_activation    the library's own fusion: cuBLASLt's GELU_BIAS epilogue (tanh form), one kernel
  triton_fused_tiled  the tiled Triton GEMM with bias + GELU in its epilogue: one kernel
  triton_fused        the persistent TMA Triton GEMM with the same epilogue: one kernel, whose next
                      tile's loads overlap this tile's epilogue (matters at short K)
  triton_fused_tanh   triton_fused with the tanh form: the epilogue's arithmetic cut to a few FMAs
  gluon_pingpong      a ping-pong kernel (Gluon, Hopper only): two consumer warpgroups alternate, so
                      one's epilogue runs while the other's main loop computes
  gluon_pingpong_tanh the same with the tanh form
  gluon_pingpong_plain a control, not a rung: the same kernel with the bias and no GELU, checked against
                      A @ B + bias; the GELU's cost is what the two fused kernels take over it

`triton_plain` below is the same persistent GEMM without the epilogue. It is not a variant (it computes
a different function), but timing it beside `triton_fused` isolates the epilogue's own cost.
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F

from casebook.kernels import gemm_common
from casebook.traffic import Term, Traffic

GELU_FLOPS = 10
"""FLOPs counted per GELU element: x / sqrt 2, erf (a short polynomial, counted as 6), + 1, x 0.5, x x.
A convention: next to the GEMM's 2 k FLOPs per element it is noise either way."""

# --- reference, inputs, traffic ----------------------------------------------------------------


def reference(a: torch.Tensor, b: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """gelu(A @ B + bias) in float64, erf form (on a GPU when there is one)."""
    return F.gelu(_affine64(a, b, bias)).to(a.device)


def reference_bias(a: torch.Tensor, b: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """A @ B + bias in float64, no GELU: what the control `gluon_pingpong_plain` is checked against."""
    return _affine64(a, b, bias).to(a.device)


def _affine64(a: torch.Tensor, b: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    dev = gemm_common.reference_device()
    return a.to(dev, torch.float64) @ b.to(dev, torch.float64) + bias.to(dev, torch.float64)


def make_inputs(shape: dict, dtype: torch.dtype, device: str, generator: torch.Generator) -> dict:
    """A ~ N(0, 1), B ~ N(0, 1/k), bias ~ N(0, 0.25): pre-activations ~ N(0, 1.25), GELU's curved range."""
    m, n, k = shape["m"], shape["n"], shape["k"]
    g = gemm_common.device_generator(generator, device)
    a = torch.randn(m, k, generator=g, device=device)
    b = torch.randn(k, n, generator=g, device=device) * k**-0.5
    bias = torch.randn(n, generator=g, device=device) * 0.5
    return {name: v.to(dtype) for name, v in {"a": a, "b": b, "bias": bias}.items()}


def traffic(shape: dict, dtype: torch.dtype) -> Traffic:
    """The floor of the fused kernel: operands read once, C written once, no intermediate."""
    m, n, k = shape["m"], shape["n"], shape["k"]
    e = torch.empty((), dtype=dtype).element_size()
    return Traffic([
        Term("read a", bytes=m * k * e),
        Term("read b", bytes=k * n * e),
        Term("read bias", bytes=n * e),
        Term("write c", bytes=m * n * e),
        Term("multiply-add (2 per m n k)", flops=2 * m * n * k),
        Term("bias add (1 per element of c)", flops=m * n),
        Term(f"GELU ({GELU_FLOPS} per element of c, erf form)", flops=GELU_FLOPS * m * n),
    ])


# --- variants 1-3: unfused ------------------------------------------------------------------------


def eager(a: torch.Tensor, b: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """Three kernels; C makes two extra round trips through device memory."""
    c = a @ b  # read a, b; write c
    c = c + bias  # read c, bias; write c
    return F.gelu(c)  # read c; write c


def addmm_gelu(a: torch.Tensor, b: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """The bias rides in cuBLASLt's epilogue; GELU is one more pass."""
    return F.gelu(torch.addmm(bias, a, b))


def addmm_gelu_tanh(a: torch.Tensor, b: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """addmm_gelu with the tanh form: the unfused chain to hold the tanh-form fused kernels against."""
    return F.gelu(torch.addmm(bias, a, b), approximate="tanh")


def addmm_activation(a: torch.Tensor, b: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """The library's fused rung: bias and GELU (tanh form) in cuBLASLt's epilogue, one kernel."""
    return torch._addmm_activation(bias, a, b, use_gelu=True)


@functools.cache
def _compiled():
    import torch._dynamo as dynamo

    for knob in ("recompile_limit", "cache_size_limit"):  # one graph per (shape, dtype)
        if hasattr(dynamo.config, knob):
            setattr(dynamo.config, knob, 256)
    return torch.compile(eager, dynamic=False)


def torch_compile(a: torch.Tensor, b: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """Inductor's default mode keeps the mm in cuBLAS and fuses bias + GELU into one Triton kernel."""
    return _compiled()(a, b, bias)


# --- variants 4-5: the epilogue fused ---------------------------------------------------------------


def triton_fused_tiled(a: torch.Tensor, b: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """One program per tile; bias + GELU on the fp32 accumulator before the only store."""
    return gemm_common.matmul(a, b, bias=bias, gelu="erf", schedule="tiled")


def triton_fused(a: torch.Tensor, b: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """Persistent TMA schedule (pointer loads where TMA is not valid) with the same epilogue."""
    return gemm_common.matmul(a, b, bias=bias, gelu="erf", schedule="tma_persistent")


def triton_fused_tanh(a: torch.Tensor, b: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """triton_fused with the tanh form of GELU: one special-function-unit tanh per element, not an erf."""
    return gemm_common.matmul(a, b, bias=bias, gelu="tanh", schedule="tma_persistent")


def _pingpong(a: torch.Tensor, b: torch.Tensor, bias: torch.Tensor, gelu: str) -> torch.Tensor:
    """Imported here, so a Triton without Gluon fails the ping-pong variants alone."""
    from casebook.kernels import gemm_pingpong

    return gemm_pingpong.matmul(a, b, bias, gelu=gelu)


def gluon_pingpong(a: torch.Tensor, b: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """Hopper only: two consumer warpgroups alternate tiles, so one's bias + GELU runs under the other's
    main loop (gemm_pingpong; the same fitted erfc as the Triton kernels)."""
    return _pingpong(a, b, bias, "erf")


def gluon_pingpong_tanh(a: torch.Tensor, b: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """gluon_pingpong with the tanh form."""
    return _pingpong(a, b, bias, "tanh")


def gluon_pingpong_plain(a: torch.Tensor, b: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """A control: gluon_pingpong with the bias and no GELU, timed beside it to price the GELU."""
    return _pingpong(a, b, bias, "none")


def triton_plain(a: torch.Tensor, b: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """Not a variant: `triton_fused`'s GEMM without the epilogue (bias ignored), to price the epilogue."""
    return gemm_common.matmul(a, b, schedule="tma_persistent")


# --- level 3: a transformer MLP ------------------------------------------------------------------------


def make_mlp_inputs(shape: dict, dtype: torch.dtype, device: str, generator: torch.Generator) -> dict:
    """x [tokens, hidden]; w1 [hidden, inter], b1 [inter]; w2 [inter, hidden], b2 [hidden]."""
    t, h, i = shape["tokens"], shape["hidden"], shape["inter"]
    g = gemm_common.device_generator(generator, device)
    x = torch.randn(t, h, generator=g, device=device)
    w1 = torch.randn(h, i, generator=g, device=device) * h**-0.5
    b1 = torch.randn(i, generator=g, device=device) * 0.5
    w2 = torch.randn(i, h, generator=g, device=device) * i**-0.5
    b2 = torch.randn(h, generator=g, device=device) * 0.5
    return {name: v.to(dtype)
            for name, v in {"x": x, "w1": w1, "b1": b1, "w2": w2, "b2": b2}.items()}


def transformer_mlp(kernel, x: torch.Tensor, w1: torch.Tensor, b1: torch.Tensor, w2: torch.Tensor,
                    b2: torch.Tensor) -> torch.Tensor:
    """BERT's feed-forward block: gelu(x W1 + b1) W2 + b2; `kernel` does the up projection and GELU."""
    h = kernel(a=x, b=w1, bias=b1)  # [tokens, inter]: written once, read once by the down GEMM
    return torch.addmm(b2, h, w2)  # [tokens, hidden], bias in cuBLASLt's epilogue
