"""Large regular GEMM: the compute-bound case, where the only way up is the tensor cores' own roof.

What you will learn: C = A @ B with M = N = K = 4096 in bf16 does 2 M N K = 137 GFLOP on 100 MB of
operands, an arithmetic intensity of about 1365 FLOP/byte against an H200 ridge point near 165: data
movement from device memory is not the limit. What is: feeding the tensor cores from shared memory fast
enough (tile size, pipeline depth), keeping every SM busy to the last tile, and keeping the operand
panels that neighbouring tiles share in L2. The ladder below changes one of those at a time; the
library (cuBLAS) is the baseline to match, not to beat.

The ladder (the Triton kernels live in `gemm_common`, shared with `gemm_epilogue`):
  torch_matmul           cuBLAS through torch.matmul: hand-tuned kernels picked by heuristics
  triton_tiled           one program per 128x256-ish tile, grouped (GROUP_M) launch order for L2
                         reuse, cp.async software pipeline of 3-4 stages, autotuned over a few configs
  triton_persistent      one program per SM looping over tiles in the same order: no tail of
                         short-lived programs, and the next tile's loads overlap this tile's store
  triton_tma_persistent  the persistent loop with tiles moved by TMA (Hopper's bulk tensor copies):
                         fewer address instructions, hardware edge handling; falls back to the
                         pointer kernel where TMA is not valid (pre-sm90, old Triton, unaligned strides)

Layout: A [m, k] and B [k, n] row-major (B is the transpose of an nn.Linear weight [n, k]); C [m, n].
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from casebook.kernels import gemm_common
from casebook.traffic import Term, Traffic

# --- reference, inputs, traffic ----------------------------------------------------------------


def reference(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """A @ B in float64 (on a GPU when there is one: see gemm_common.reference_device)."""
    dev = gemm_common.reference_device()
    return (a.to(dev, torch.float64) @ b.to(dev, torch.float64)).to(a.device)


def make_inputs(shape: dict, dtype: torch.dtype, device: str, generator: torch.Generator) -> dict:
    """A ~ N(0, 1) activations, B ~ N(0, 1/k) weights (fan-in scaling), so C ~ N(0, 1) at any k."""
    m, n, k = shape["m"], shape["n"], shape["k"]
    g = gemm_common.device_generator(generator, device)
    a = torch.randn(m, k, generator=g, device=device)
    b = torch.randn(k, n, generator=g, device=device) * k**-0.5
    return {"a": a.to(dtype), "b": b.to(dtype)}


def traffic(shape: dict, dtype: torch.dtype) -> Traffic:
    """The floor: each operand crosses device memory once (perfect on-chip reuse), C written once."""
    m, n, k = shape["m"], shape["n"], shape["k"]
    e = torch.empty((), dtype=dtype).element_size()
    return Traffic([
        Term("read a", bytes=m * k * e),
        Term("read b", bytes=k * n * e),
        Term("write c", bytes=m * n * e),
        Term("multiply-add (2 per m n k)", flops=2 * m * n * k),
    ])


# --- variant 1: the library ------------------------------------------------------------------------


def torch_matmul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return torch.matmul(a, b)


# --- variants 2-4: the Triton schedules ------------------------------------------------------------


def triton_tiled(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """One program per tile, grouped launch order, autotuned tile shape and pipeline depth."""
    return gemm_common.matmul(a, b, schedule="tiled")


def triton_persistent(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """One or two programs per SM (autotuned), each looping over tiles in the grouped order."""
    return gemm_common.matmul(a, b, schedule="persistent")


def triton_tma_persistent(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """The persistent loop with TMA tile loads and stores (pointer loads where TMA is not valid)."""
    return gemm_common.matmul(a, b, schedule="tma_persistent")


# --- level 3: a SwiGLU MLP block --------------------------------------------------------------------


def make_mlp_inputs(shape: dict, dtype: torch.dtype, device: str, generator: torch.Generator) -> dict:
    """x [tokens, hidden]; w_gate, w_up [hidden, inter]; w_down [inter, hidden] (fan-in scaled)."""
    t, h, i = shape["tokens"], shape["hidden"], shape["inter"]
    g = gemm_common.device_generator(generator, device)
    x = torch.randn(t, h, generator=g, device=device)
    w_gate = torch.randn(h, i, generator=g, device=device) * h**-0.5
    w_up = torch.randn(h, i, generator=g, device=device) * h**-0.5
    w_down = torch.randn(i, h, generator=g, device=device) * i**-0.5
    return {name: v.to(dtype)
            for name, v in {"x": x, "w_gate": w_gate, "w_up": w_up, "w_down": w_down}.items()}


def swiglu_mlp(kernel, x: torch.Tensor, w_gate: torch.Tensor, w_up: torch.Tensor, w_down: torch.Tensor) -> torch.Tensor:
    """Llama's MLP, down(silu(gate(x)) * up(x)): three GEMMs by `kernel`, one elementwise pass between."""
    g = kernel(a=x, b=w_gate)  # [tokens, inter]
    u = kernel(a=x, b=w_up)  # [tokens, inter]
    return kernel(a=F.silu(g) * u, b=w_down)  # [tokens, hidden]
