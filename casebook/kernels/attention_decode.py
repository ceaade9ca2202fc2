"""Decode attention: bandwidth-bound, the KV cache read once.

What you will learn: a decode step has one query token per sequence (a few, with speculative drafts)
against a long cached context. Each K/V element is used by the `group` query heads that share its KV head
(GQA) and nothing else, so the FLOPs per byte are about the group size: 4 FLOP/byte at 32 query and 8 KV
heads, against an H200 ridge near 190. The floor is the cache's bytes at the copy rate; the Q and O bytes
are a rounding error (0.01% at batch 8, 32K). Two things keep a kernel off that floor: reading K/V once per
query head instead of once per KV head (eager repeats the cache to every head), and too few programs to
stream it (batch x KV heads = 8 programs at batch 1 on 132 SMs). The first is fixed by giving one program
all the group's heads as rows of one tile; the second by splitting the context over programs
(flash-decoding), each writing a partial (log-sum-exp, output) that a combine step merges.

The ladder (baseline: sdpa):
  eager              Hugging Face's eager attention: K/V repeated to every head, scores materialised
  sdpa               F.scaled_dot_product_attention, the library's own dispatch (enable_gqa)
  triton_gqa         one program per (batch, KV head), the group's heads the rows of one tile: K/V read once
  triton_split       the context split over programs (split count from batch, KV heads and SM count);
                     partial (lse, o) per split, merged by a second, combine kernel
  triton_split_fused the same, the combine done by the last split to arrive (an arrival counter): no
                     second launch

Shape: q [batch, heads, seq_q, head_dim]; k, v (the cache) [batch, kv_heads, seq_kv, head_dim]. The
queries are the last seq_q positions, causal among themselves (seq_q = 1: no mask).
"""

from __future__ import annotations

import torch

from casebook.kernels import attention_common as ac
from casebook.kernels.device import on_device
from casebook.traffic import Traffic

# --- reference, inputs, traffic ----------------------------------------------------------------------


def reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """softmax(q k^T / sqrt(d) + the causal mask of the draft tokens) v in float64."""
    return ac.reference(q, k, v, causal=True)


def _geometry(shape: dict) -> tuple:
    return shape["batch"], shape["heads"], shape["kv_heads"], shape["seq_q"], shape["seq_kv"], shape["head_dim"]


def make_inputs(shape: dict, dtype: torch.dtype, device: str, generator: torch.Generator) -> dict:
    """q, k, v of unit spread (the cache as random as a trained model's keys look to the kernel)."""
    return ac.make_qkv(*_geometry(shape), dtype, device, generator)


def traffic(shape: dict, dtype: torch.dtype) -> Traffic:
    """The floor: the K and V cache read once (the number to quote), Q read and O written once; FLOPs 4 B H d
    over the visible pairs (the drafts' causal mask drops seq_q (seq_q - 1) / 2 pairs). The split rungs' partials
    (fp32 lse and o per split and row, written and read once) are beyond the floor: the notes count them."""
    b, h, hkv, sq, skv, d = _geometry(shape)
    return Traffic(ac.terms(b, h, hkv, sq, skv, d, True, torch.empty((), dtype=dtype).element_size()))


# --- variants -----------------------------------------------------------------------------------------


def eager(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """K/V repeated to every head (the cache read and written `group` times over), scores materialised."""
    return ac.eager(q, k, v, causal=True)


def sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """The library's dispatch (flash, memory-efficient, cuDNN or math, whichever takes the shape first)."""
    return ac.sdpa(q, k, v, True, None)


def triton_gqa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """One program per (batch, KV head), the whole context: K/V read once per group, batch x KV heads programs."""
    return ac.decode_forward(q, k, v, True, splits=1)


def triton_split(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Split-KV (flash-decoding): the context over `split_count` programs, a combine kernel after."""
    return ac.decode_forward(q, k, v, True, splits=None)


def triton_split_fused(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Split-KV with the combine done by the last split to arrive: one launch."""
    return ac.decode_forward(q, k, v, True, splits=None, fused=True)


# --- level 3: one decode step of a layer ----------------------------------------------------------


def make_step_inputs(shape: dict, dtype: torch.dtype, device: str, generator: torch.Generator) -> dict:
    """One new token per sequence x [batch, 1, hidden], the fused QKV and output weights (fan-in scaled), and
    a KV cache of seq_kv positions, the last of which the step fills with the new token's k and v."""
    b, skv, h, hkv, d = shape["batch"], shape["seq_kv"], shape["heads"], shape["kv_heads"], shape["head_dim"]
    hidden = h * d
    g = on_device(generator, device)
    x = torch.randn(b, 1, hidden, generator=g, device=device)
    w_qkv = torch.randn(hidden, (h + 2 * hkv) * d, generator=g, device=device) * hidden**-0.5
    w_o = torch.randn(h * d, hidden, generator=g, device=device) * (h * d) ** -0.5
    cache = ac.make_qkv(b, 1, hkv, 1, skv, d, dtype, device, generator)
    return {"x": x.to(dtype), "w_qkv": w_qkv.to(dtype), "w_o": w_o.to(dtype), "k_cache": cache["k"],
            "v_cache": cache["v"], "heads": h}


def decode_layer(kernel, x: torch.Tensor, w_qkv: torch.Tensor, w_o: torch.Tensor, k_cache: torch.Tensor,
                 v_cache: torch.Tensor, heads: int) -> torch.Tensor:
    """A layer's attention in one decode step: QKV projection of the new token, its k and v written into the
    cache's last slot, attention over the cache by `kernel`, output projection. (RoPE left out.)"""
    b, _, hidden = x.shape
    hkv, d = k_cache.shape[1], k_cache.shape[3]
    qkv = x @ w_qkv  # [b, 1, (heads + 2 kv_heads) d]
    q, k, v = qkv.split([heads * d, hkv * d, hkv * d], dim=-1)
    k_cache[:, :, -1] = k.view(b, hkv, d)
    v_cache[:, :, -1] = v.view(b, hkv, d)
    o = kernel(q=q.view(b, 1, heads, d).transpose(1, 2), k=k_cache, v=v_cache)  # [b, heads, 1, d]
    return o.transpose(1, 2).reshape(b, 1, heads * d) @ w_o
