"""Prefill attention: compute-bound once the scores stay on chip.

What you will learn: a prompt's attention does 4 B H S_q S_kv d FLOPs (two GEMMs, QK^T and PV; half of
them under the causal mask) on Q, K, V and O, a few hundred MB: at S = 4K, d = 128 about 1,600 FLOP per
byte, ten times the H200's ridge point. But written as three ops it writes the [S_q, S_kv] score matrix
and its probabilities to memory and reads them back, ~26 bytes per score element in bf16: at batch 4,
S = 4K that is 56 GB against the 0.34 GB of Q, K, V and O, and the composite is bandwidth-bound on bytes
the maths never needed. The flash forward tiles Q and streams K/V tiles past each Q tile with an online softmax
(the running max and sum of softmax_fusion's long rows), so the scores live in registers; under the
causal mask the tiles past the diagonal are not visited at all, and only the diagonal tiles are masked.
Then the work is the tensor cores' (tile shapes, pipelining, TMA, warp specialisation), as in gemm_tiled.

The ladder (baseline: sdpa_flash, the library's flash kernel):
  eager            Hugging Face's eager attention: K/V repeated, scores and probabilities materialised
  sdpa_math        SDPA's math backend: the same composite inside the library (fp32 softmax)
  sdpa_efficient   SDPA's memory-efficient backend (xFormers' cutlass kernel), CUDA only
  sdpa_flash       SDPA's FlashAttention-2 backend (on a CPU, its C++ flash kernel)
  sdpa_cudnn       SDPA's cuDNN backend (cuDNN's fused flash attention), CUDA only
  flex             FlexAttention, compiled by Inductor into a Triton flash kernel, the mask as a block mask
  triton_flash     casebook's Triton flash forward: online softmax, causal tiles skipped, diagonal masked
  triton_flash_tma the same tile loop with every tile moved by TMA (Hopper)
  triton_flash_ws  TMA plus Triton's automatic warp specialisation of the K/V loop (producer and consumer
                   warps), where the compiler splits the loop for the GPU: not on sm_90 with Triton 3.6-3.9

Shape: q [batch, heads, seq_q, head_dim]; k, v [batch, kv_heads, seq_kv, head_dim]; `mask` 1 = none,
2 = causal (the queries the last seq_q tokens of the context: see attention_common).
"""

from __future__ import annotations

import torch

from casebook.kernels import attention_common as ac
from casebook.kernels.device import on_device
from casebook.traffic import Traffic

MASKS = {1: False, 2: True}
"""The shape's `mask`: 1 no mask, 2 causal (shape values are positive integers)."""

# --- reference, inputs, traffic ----------------------------------------------------------------------


def reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool) -> torch.Tensor:
    """softmax(q k^T / sqrt(d) [+ the causal mask]) v in float64."""
    return ac.reference(q, k, v, causal)


def _geometry(shape: dict) -> tuple:
    return (shape["batch"], shape["heads"], shape["kv_heads"], shape["seq_q"], shape["seq_kv"], shape["head_dim"],
            MASKS[shape["mask"]])


def make_inputs(shape: dict, dtype: torch.dtype, device: str, generator: torch.Generator) -> dict:
    """q, k, v of unit spread, and the mask flag."""
    b, h, hkv, sq, skv, d, causal = _geometry(shape)
    return {**ac.make_qkv(b, h, hkv, sq, skv, d, dtype, device, generator), "causal": causal}


def traffic(shape: dict, dtype: torch.dtype) -> Traffic:
    """The floor: Q, K, V read once, O written once; FLOPs 4 B H d over the visible (query, key) pairs
    (under the causal mask S (S + 1) / 2 of S^2 at seq_q == seq_kv: the published halved count). The eager
    rung's scores and probabilities (~26 bytes a score element, bf16) are beside the floor: eager's note."""
    b, h, hkv, sq, skv, d, causal = _geometry(shape)
    return Traffic(ac.terms(b, h, hkv, sq, skv, d, causal, torch.empty((), dtype=dtype).element_size()))


# --- variant 1: the eager composite ----------------------------------------------------------------


def eager(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool) -> torch.Tensor:
    return ac.eager(q, k, v, causal)


# --- variants 2-5: SDPA, one backend a rung --------------------------------------------------------


def sdpa_math(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool) -> torch.Tensor:
    return ac.sdpa(q, k, v, causal, "math")


def sdpa_efficient(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool) -> torch.Tensor:
    return ac.sdpa(q, k, v, causal, "efficient")


def sdpa_flash(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool) -> torch.Tensor:
    return ac.sdpa(q, k, v, causal, "flash")


def sdpa_cudnn(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool) -> torch.Tensor:
    return ac.sdpa(q, k, v, causal, "cudnn")


# --- variant 6: FlexAttention ------------------------------------------------------------------------


def flex(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool) -> torch.Tensor:
    return ac.flex(q, k, v, causal)


# --- variants 7-9: the Triton flash forward, then its Hopper steps ----------------------------------


def triton_flash(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool) -> torch.Tensor:
    """Q tiles against streamed K/V tiles, online softmax; causal: tiles past the diagonal skipped."""
    return ac.flash_forward(q, k, v, causal)


def triton_flash_tma(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool) -> torch.Tensor:
    """Every tile moved by TMA (4-D device-side descriptors); the pointer kernel where TMA is not valid."""
    return ac.flash_forward(q, k, v, causal, tma=True)


def triton_flash_ws(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool) -> torch.Tensor:
    """TMA, and the K/V loop warp-specialised (producer warps issue the loads, consumer warps the MMAs) where
    the installed Triton splits it for this GPU; NotImplementedError, with the compiler's answer, elsewhere."""
    return ac.flash_forward(q, k, v, causal, tma=True, warp_specialize=True)


# --- level 3: a transformer layer's attention block -------------------------------------------------


def make_block_inputs(shape: dict, dtype: torch.dtype, device: str, generator: torch.Generator) -> dict:
    """x [batch, seq, hidden] of unit normals; the fused QKV weight [hidden, (heads + 2 kv_heads) head_dim]
    and the output weight [heads head_dim, hidden], fan-in scaled (hidden = heads x head_dim)."""
    b, s, h, hkv, d = shape["batch"], shape["seq"], shape["heads"], shape["kv_heads"], shape["head_dim"]
    hidden = h * d
    g = on_device(generator, device)
    x = torch.randn(b, s, hidden, generator=g, device=device)
    w_qkv = torch.randn(hidden, (h + 2 * hkv) * d, generator=g, device=device) * hidden**-0.5
    w_o = torch.randn(h * d, hidden, generator=g, device=device) * (h * d) ** -0.5
    return {"x": x.to(dtype), "w_qkv": w_qkv.to(dtype), "w_o": w_o.to(dtype), "heads": h, "kv_heads": hkv}


def attention_block(kernel, x: torch.Tensor, w_qkv: torch.Tensor, w_o: torch.Tensor, heads: int,
                    kv_heads: int) -> torch.Tensor:
    """A Llama layer's attention block on a prompt, causal: x @ W_qkv split into q, k, v heads (views, strided:
    [batch, heads, seq, head_dim] over the projection's [batch, seq, heads, head_dim]), attention by
    `kernel`, then the output projection. (RoPE left out: one elementwise pass on q and k.)"""
    b, s, hidden = x.shape
    d = w_o.shape[0] // heads
    qkv = x @ w_qkv  # [b, s, (heads + 2 kv_heads) d]
    q, k, v = qkv.split([heads * d, kv_heads * d, kv_heads * d], dim=-1)
    q = q.view(b, s, heads, d).transpose(1, 2)
    k = k.view(b, s, kv_heads, d).transpose(1, 2)
    v = v.view(b, s, kv_heads, d).transpose(1, 2)
    o = kernel(q=q, k=k, v=v, causal=True)  # [b, heads, s, d]
    return o.transpose(1, 2).reshape(b, s, heads * d) @ w_o
