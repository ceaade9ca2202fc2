"""Attention's kernel family, shared by the stage cases (attention_prefill, attention_decode, and through
them attention_paged and attention_prefix): the float64 reference, the eager composite, SDPA's backends,
FlexAttention and the Triton kernels, with the traffic model's terms.

Layout, every case: q [batch, heads, seq_q, head_dim]; k, v [batch, kv_heads, seq_kv, head_dim] (GQA: each
KV head serves `heads // kv_heads` query heads, h // group); o like q. The queries are the last seq_q
tokens of the context: query i sits at position seq_kv - seq_q + i, and under the causal mask sees keys
0 .. seq_kv - seq_q + i (a prefill chunk after a cached prefix, a decode step with speculative drafts).
torch's `is_causal` aligns the mask top-left instead; it equals this one only where seq_q == seq_kv, so
the SDPA rungs pass `causal_lower_right` elsewhere.

The Triton kernels:
  flash_forward   prefill: one program per (query tile, batch x head), K/V tiles streamed with an online
                  softmax (running max and sum, the accumulator rescaled), so the [seq_q, seq_kv] scores
                  never leave the chip; under the causal mask the tiles past the diagonal are skipped and
                  only the diagonal ones are masked. `tma=True` loads every tile by TMA (device-side 4-D
                  descriptors: zero-filled edges, no address arithmetic); `warp_specialize=True` also
                  asks Triton to split the K/V loop into producer and consumer warps (its automatic WS),
                  and runs only where the compiler does so for the GPU (`ws_refusal`).
  decode_forward  decode: one program per (batch, KV head) covering the group's query heads (and draft
                  tokens) as the rows of one tile, so K/V are read once for the group; split over the
                  context into `splits` programs per (batch, KV head), each writing a partial (lse, o),
                  merged by a combine kernel or, fused, by the last split to arrive.
"""

from __future__ import annotations

import functools
import math

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from casebook.kernels.device import INTERPRET, autotune, compiled, num_sms, on_device, reference_device
from casebook.traffic import Term

LOG2E = 1.4426950408889634

REFERENCE_ELEMENTS = 2**28
"""Float64 scores the reference holds at once (2 GB): it walks the queries in chunks of that many."""

# --- shapes, reference, inputs ----------------------------------------------------------------------


def dims(q: torch.Tensor, k: torch.Tensor) -> tuple[int, int, int, int, int, int]:
    """(batch, heads, kv_heads, seq_q, seq_kv, head_dim), checked: the heads a whole multiple of the KV heads."""
    b, h, sq, d = q.shape
    bk, hkv, skv, dk = k.shape
    if bk != b or dk != d or h % hkv:
        raise ValueError(f"q {tuple(q.shape)} and k {tuple(k.shape)}: batch and head_dim must agree and "
                         "heads be a multiple of kv_heads")
    return b, h, hkv, sq, skv, d


def visible(seq_q: int, seq_kv: int, device) -> torch.Tensor:
    """[seq_q, seq_kv] bool: query i (at position seq_kv - seq_q + i) sees key j <= its position."""
    i = torch.arange(seq_q, device=device)[:, None]
    j = torch.arange(seq_kv, device=device)[None, :]
    return j <= i + (seq_kv - seq_q)


def reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False) -> torch.Tensor:
    """softmax(q k^T / sqrt(d) [+ causal mask]) v in float64, over chunks of queries so the float64 scores stay
    under ~2 GB at any shape. The query heads of one KV head are one block of rows against that head's K and V,
    which are never repeated to every head: repeated in float64 they were 17 GB of a decode batch's 24 (8 x 32K
    keys, 32 query heads on 8), and the reference, not the kernels, set the memory a test or a run needed."""
    b, h, hkv, sq, skv, d = dims(q, k)
    g = h // hkv
    dev, home = reference_device(), q.device
    q, k, v = (t.to(dev, torch.float64) for t in (q, k, v))
    q = q.reshape(b, hkv, g * sq, d)  # row r: query head (KV head) * g + r // sq, query r % sq
    out = torch.empty_like(q)
    rows = max(1, REFERENCE_ELEMENTS // (b * hkv * skv))
    for r0 in range(0, g * sq, rows):
        r1 = min(r0 + rows, g * sq)
        s = q[:, :, r0:r1] @ k.transpose(-1, -2) * d**-0.5
        if causal:  # each row's query i at position skv - sq + i sees the keys up to it
            i = torch.arange(r0, r1, device=dev)[:, None] % sq
            s = s.masked_fill(torch.arange(skv, device=dev)[None, :] > i + (skv - sq), float("-inf"))
        out[:, :, r0:r1] = s.softmax(-1) @ v
    return out.reshape(b, h, sq, d).to(home)


def make_qkv(b: int, h: int, hkv: int, sq: int, skv: int, d: int, dtype: torch.dtype, device: str,
             generator: torch.Generator) -> dict:
    """q, k, v ~ N(0, 1): with the 1/sqrt(d) scale the scores have unit spread, as trained layers' roughly do
    (softmax neither flat nor one-hot)."""
    g = on_device(generator, device)
    q = torch.randn(b, h, sq, d, generator=g, device=device)
    k = torch.randn(b, hkv, skv, d, generator=g, device=device)
    v = torch.randn(b, hkv, skv, d, generator=g, device=device)
    return {"q": q.to(dtype), "k": k.to(dtype), "v": v.to(dtype)}


def visible_pairs(sq: int, skv: int, causal: bool) -> int:
    """(query, key) pairs the mask keeps: seq_q x seq_kv, or under the causal mask
    seq_q x seq_kv - seq_q (seq_q - 1) / 2 (S (S + 1) / 2 at seq_q == seq_kv: the published 'halved' count
    to within 1/S)."""
    return sq * skv - (sq * (sq - 1) // 2 if causal else 0)


def terms(b: int, h: int, hkv: int, sq: int, skv: int, d: int, causal: bool, e: int) -> list[Term]:
    """The floor, term by term: Q, K, V read once, O written once; two GEMMs' FLOPs over the visible pairs."""
    pairs = visible_pairs(sq, skv, causal)
    mask = "causal: the visible pairs only" if causal else "no mask"
    return [
        Term("read q (batch x heads x seq_q x head_dim)", bytes=b * h * sq * d * e),
        Term("read k (batch x kv_heads x seq_kv x head_dim)", bytes=b * hkv * skv * d * e),
        Term("read v (batch x kv_heads x seq_kv x head_dim)", bytes=b * hkv * skv * d * e),
        Term("write o (batch x heads x seq_q x head_dim)", bytes=b * h * sq * d * e),
        Term(f"QK^T multiply-add (2 per head_dim x pair; {mask})", flops=2 * b * h * pairs * d),
        Term(f"PV multiply-add (2 per head_dim x pair; {mask})", flops=2 * b * h * pairs * d),
    ]


# --- the eager composite: scores and probabilities materialised -----------------------------------


def eager(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False) -> torch.Tensor:
    """Hugging Face's eager_attention_forward: K/V repeated to every head, scores = q k^T * scale written,
    the mask added, softmax in fp32 written and cast back, then P V. Per score element (N of them, bf16):
    the GEMM writes 2N bytes; the scale reads 2N and writes 2N; the mask add the same; the fp32 softmax
    reads 2N and writes 4N; the cast reads 4N and writes 2N; P V reads 2N: ~26N bytes beside the floor's."""
    b, h, hkv, sq, skv, d = dims(q, k)
    k = k.repeat_interleave(h // hkv, dim=1)  # [b, h, skv, d]: written and read again
    v = v.repeat_interleave(h // hkv, dim=1)
    s = torch.matmul(q, k.transpose(-1, -2)) * d**-0.5  # [b, h, sq, skv]
    if causal:
        bias = torch.zeros(sq, skv, device=q.device, dtype=q.dtype)
        s = s + bias.masked_fill(~visible(sq, skv, q.device), float("-inf"))
    p = torch.softmax(s, dim=-1, dtype=torch.float32).to(q.dtype)
    return torch.matmul(p, v)


# --- SDPA, one backend a rung -----------------------------------------------------------------------

_EXPAND: dict = {}
"""(backend, device type) -> True where the backend refused enable_gqa and K/V are expanded for it."""


def sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, backend: str | None) -> torch.Tensor:
    """F.scaled_dot_product_attention under one backend (`math`, `efficient`, `flash`, `cudnn`; None: its
    own dispatch). GQA through enable_gqa; a backend without it gets K/V expanded to every head (the copy is
    part of its time, as it is a caller's). A backend that cannot run the shape says why (the point is
    skipped with the reason)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.nn.attention.bias import causal_lower_right

    b, h, hkv, sq, skv, d = dims(q, k)
    kwargs: dict = {}
    if causal and sq == skv:
        kwargs["is_causal"] = True
    elif causal and sq > 1:  # one query at the end of the context sees every key: no mask at all
        kwargs["attn_mask"] = causal_lower_right(sq, skv)
    backends = {"math": SDPBackend.MATH, "efficient": SDPBackend.EFFICIENT_ATTENTION,
                "flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION}
    chosen = [backends[backend]] if backend else list(backends.values())
    key = (backend, q.device.type)
    try:
        with sdpa_kernel(chosen):
            if h != hkv and _EXPAND.get(key):
                g = h // hkv
                return F.scaled_dot_product_attention(q, k.repeat_interleave(g, 1), v.repeat_interleave(g, 1),
                                                      **kwargs)
            try:
                return F.scaled_dot_product_attention(q, k, v, enable_gqa=h != hkv, **kwargs)
            except RuntimeError:
                if h == hkv or key in _EXPAND:
                    raise
                _EXPAND[key] = True
                return sdpa(q, k, v, causal, backend)
    except RuntimeError as e:
        raise NotImplementedError(f"SDPA's {backend or 'default'} backend cannot run {tuple(q.shape)} x "
                                  f"{tuple(k.shape)} {q.dtype} causal={causal} here: "
                                  f"{str(e).splitlines()[0][:300]}") from None


# --- FlexAttention ------------------------------------------------------------------------------------

_BLOCK_MASKS: dict = {}


def _flex(q, k, v, block_mask, enable_gqa):
    from torch.nn.attention.flex_attention import flex_attention

    return flex_attention(q, k, v, block_mask=block_mask, enable_gqa=enable_gqa)


_flex_compiled = compiled(_flex)


def flex(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool) -> torch.Tensor:
    """FlexAttention compiled by Inductor into a Triton flash kernel; the causal mask as a block mask (built once
    a shape, as a model builds it once a batch), whose empty blocks are skipped. CUDA only: compiled on a CPU it
    is Inductor's C++ and minutes of compiles, and eager FlexAttention materialises the scores."""
    if not q.is_cuda:
        raise NotImplementedError("FlexAttention is timed compiled, on a GPU (Inductor's CPU path compiles C++ "
                                  "per shape)")
    from torch.nn.attention.flex_attention import create_block_mask

    b, h, hkv, sq, skv, d = dims(q, k)
    mask = None
    if causal:
        key = (sq, skv, q.device)
        mask = _BLOCK_MASKS.get(key)
        if mask is None:
            off = skv - sq

            def lower_right(b_, h_, i, j):
                return j <= i + off

            mask = _BLOCK_MASKS[key] = create_block_mask(lower_right, None, None, sq, skv, device=q.device)
    return _flex_compiled(q, k, v, mask, h != hkv)


# --- Triton: the prefill flash forward ---------------------------------------------------------------


@triton.jit
def _mma(a, b, acc, UPCAST: tl.constexpr):
    if UPCAST:  # the interpreter's dot on CPU tensors: fp32 operands
        return tl.dot(a.to(tl.float32), b.to(tl.float32), acc)
    return tl.dot(a, b, acc)


@triton.jit
def _attend(acc, m_i, l_i, q, k, v, qk_scale, offs_m, offs_n, n0, off, SKV,
            MASK: tl.constexpr, CAUSAL: tl.constexpr, UPCAST: tl.constexpr):
    # One K/V tile of the online softmax, in the log2 domain: s = q k^T * scale * log2(e); the running max
    # m_i and sum l_i, the accumulator rescaled by 2^(m_old - m_new). k is [HEAD_DIM, BLOCK_N], v
    # [BLOCK_N, HEAD_DIM]. MASK: the tile crosses the diagonal or the end of the keys.
    s = _mma(q, k, tl.zeros([q.shape[0], k.shape[1]], dtype=tl.float32), UPCAST) * qk_scale
    if MASK:
        keep = (n0 + offs_n)[None, :] < SKV
        if CAUSAL:
            keep = keep & ((n0 + offs_n)[None, :] <= offs_m[:, None] + off)
        s = tl.where(keep, s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, 1))
    p = tl.math.exp2(s - m_new[:, None])
    alpha = tl.math.exp2(m_i - m_new)
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = _mma(p.to(v.dtype), v, acc * alpha[:, None], UPCAST)
    return acc, m_new, l_i


@triton.jit
def _kv_bounds(start_m, SQ, SKV, CAUSAL: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    # Keys [0, full) are visible to every row of the tile (no mask); [full, hi) need one. Under the causal
    # mask, tiles past hi (the tile's last row's position + 1) are skipped.
    off = SKV - SQ
    if CAUSAL:
        hi = tl.minimum(SKV, off + (start_m + 1) * BLOCK_M)
        full = tl.minimum(off + start_m * BLOCK_M + 1, SKV)
    else:
        hi = SKV
        full = SKV
    full = (tl.maximum(full, 0) // BLOCK_N) * BLOCK_N
    return off, full, hi


@triton.jit
def _flash_fwd_kernel(q_ptr, k_ptr, v_ptr, o_ptr, qk_scale, H, GROUP, SQ, SKV,
                      sqb, sqh, sqm, skb, skh, skn, svb, svh, svn, sob, soh, som,
                      CAUSAL: tl.constexpr, HEAD_DIM: tl.constexpr, UPCAST: tl.constexpr,
                      BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    # Grid (query tiles, batch x heads). Causal: the tiles with the most keys start first (pid reversed), so
    # the short ones fill the tail of the launch.
    num_m = tl.cdiv(SQ, BLOCK_M)
    start_m = num_m - 1 - tl.program_id(0) if CAUSAL else tl.program_id(0)
    bh = tl.program_id(1)
    b = bh // H
    h = bh % H
    hk = h // GROUP
    offs_m = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    q_ptrs = q_ptr + b.to(tl.int64) * sqb + h * sqh + offs_m[:, None] * sqm + offs_d[None, :]
    q = tl.load(q_ptrs, mask=offs_m[:, None] < SQ, other=0.0)
    k_base = k_ptr + b.to(tl.int64) * skb + hk * skh + offs_d[:, None] + offs_n[None, :] * skn  # [HEAD_DIM, BLOCK_N]
    v_base = v_ptr + b.to(tl.int64) * svb + hk * svh + offs_n[:, None] * svn + offs_d[None, :]  # [BLOCK_N, HEAD_DIM]
    m_i = tl.full([BLOCK_M], -1.0e30, dtype=tl.float32)  # finite: a row masked so far rescales by 2^0, not NaN
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
    off, full, hi = _kv_bounds(start_m, SQ, SKV, CAUSAL, BLOCK_M, BLOCK_N)
    for n0 in range(0, full, BLOCK_N):  # tiles every row sees: no mask, no bounds
        k = tl.load(k_base + n0 * skn)
        v = tl.load(v_base + n0 * svn)
        acc, m_i, l_i = _attend(acc, m_i, l_i, q, k, v, qk_scale, offs_m, offs_n, n0, off, SKV,
                                False, CAUSAL, UPCAST)
    for n0 in range(full, hi, BLOCK_N):  # the diagonal tiles and the ragged end
        n_ok = (n0 + offs_n) < SKV
        k = tl.load(k_base + n0 * skn, mask=n_ok[None, :], other=0.0)
        v = tl.load(v_base + n0 * svn, mask=n_ok[:, None], other=0.0)
        acc, m_i, l_i = _attend(acc, m_i, l_i, q, k, v, qk_scale, offs_m, offs_n, n0, off, SKV,
                                True, CAUSAL, UPCAST)
    o = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]  # l = 0 only on padding rows past SQ, never stored
    o_ptrs = o_ptr + b.to(tl.int64) * sob + h * soh + offs_m[:, None] * som + offs_d[None, :]
    tl.store(o_ptrs, o.to(o_ptr.dtype.element_ty), mask=offs_m[:, None] < SQ)


@triton.jit
def _flash_fwd_tma_kernel(q_ptr, k_ptr, v_ptr, o_ptr, qk_scale, B, H, HKV, GROUP, SQ, SKV,
                          sqb, sqh, sqm, skb, skh, skn, svb, svh, svn, sob, soh, som,
                          CAUSAL: tl.constexpr, HEAD_DIM: tl.constexpr, UPCAST: tl.constexpr,
                          WARP_SPECIALIZE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    # The same tile loop with every tile moved by TMA: 4-D descriptors over [batch, heads, seq, head_dim]
    # (any strides with a unit last one), so the kernel computes no addresses and has no load masks: reads
    # past seq are zero-filled, the store clips. The keys past SKV still need the score mask (a zero key is
    # a score of 0, not -inf), which the diagonal loop applies.
    num_m = tl.cdiv(SQ, BLOCK_M)
    start_m = num_m - 1 - tl.program_id(0) if CAUSAL else tl.program_id(0)
    bh = tl.program_id(1)
    b = bh // H
    h = bh % H
    hk = h // GROUP
    q_desc = tl.make_tensor_descriptor(q_ptr, shape=[B, H, SQ, HEAD_DIM], strides=[sqb, sqh, sqm, 1],
                                       block_shape=[1, 1, BLOCK_M, HEAD_DIM])
    k_desc = tl.make_tensor_descriptor(k_ptr, shape=[B, HKV, SKV, HEAD_DIM], strides=[skb, skh, skn, 1],
                                       block_shape=[1, 1, BLOCK_N, HEAD_DIM])
    v_desc = tl.make_tensor_descriptor(v_ptr, shape=[B, HKV, SKV, HEAD_DIM], strides=[svb, svh, svn, 1],
                                       block_shape=[1, 1, BLOCK_N, HEAD_DIM])
    o_desc = tl.make_tensor_descriptor(o_ptr, shape=[B, H, SQ, HEAD_DIM], strides=[sob, soh, som, 1],
                                       block_shape=[1, 1, BLOCK_M, HEAD_DIM])
    offs_m = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    q = q_desc.load([b, h, start_m * BLOCK_M, 0]).reshape(BLOCK_M, HEAD_DIM)
    m_i = tl.full([BLOCK_M], -1.0e30, dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
    off, full, hi = _kv_bounds(start_m, SQ, SKV, CAUSAL, BLOCK_M, BLOCK_N)
    for n0 in tl.range(0, full, BLOCK_N, warp_specialize=WARP_SPECIALIZE):
        k = k_desc.load([b, hk, n0, 0]).reshape(BLOCK_N, HEAD_DIM)
        v = v_desc.load([b, hk, n0, 0]).reshape(BLOCK_N, HEAD_DIM)
        acc, m_i, l_i = _attend(acc, m_i, l_i, q, tl.trans(k), v, qk_scale, offs_m, offs_n, n0, off, SKV,
                                False, CAUSAL, UPCAST)
    for n0 in tl.range(full, hi, BLOCK_N, warp_specialize=WARP_SPECIALIZE):
        k = k_desc.load([b, hk, n0, 0]).reshape(BLOCK_N, HEAD_DIM)
        v = v_desc.load([b, hk, n0, 0]).reshape(BLOCK_N, HEAD_DIM)
        acc, m_i, l_i = _attend(acc, m_i, l_i, q, tl.trans(k), v, qk_scale, offs_m, offs_n, n0, off, SKV,
                                True, CAUSAL, UPCAST)
    o = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
    o_desc.store([b, h, start_m * BLOCK_M, 0], o.to(o_ptr.dtype.element_ty).reshape(1, 1, BLOCK_M, HEAD_DIM))


def _prefill_configs() -> list:
    if INTERPRET:  # the interpreter pays per tile: small tiles, so the tests' ragged shapes cross several
        return [triton.Config({"BLOCK_M": 16, "BLOCK_N": 16}, num_warps=4, num_stages=1)]
    # Hopper, head_dim 64-128: FA2's and Triton's tutorial tiles (128 query rows, 64-128 keys, 8 warps), and a
    # small one for short prompts. Three only: every config is compiled per head dim, mask and dtype.
    return [triton.Config({"BLOCK_M": bm, "BLOCK_N": bn}, num_warps=w, num_stages=s)
            for bm, bn, w, s in ((128, 64, 8, 3), (128, 128, 8, 2), (64, 64, 4, 3))]


def _prune_prefill(configs, named_args, **kwargs):
    # A config that does not fit in shared memory is dropped by the autotuner itself; trim only what is
    # pointless: tiles taller than the queries, and, warp-specialised, one warpgroup (a producer and a consumer
    # need two: Triton 3.6's pass failed outright at 4 warps, lowered for sm_90).
    sq = named_args["SQ"]
    kept = [c for c in configs if c.kwargs["BLOCK_M"] <= max(16, triton.next_power_of_2(sq))
            and (c.num_warps >= 8 or not kwargs.get("WARP_SPECIALIZE"))]
    return kept or configs[:1]


PREFILL_KEY = ["SQ", "SKV", "HEAD_DIM", "CAUSAL", "GROUP"]
_flash_fwd = autotune(configs=_prefill_configs(), key=PREFILL_KEY,
                             prune_configs_by={"early_config_prune": _prune_prefill})(_flash_fwd_kernel)
_flash_fwd_tma = autotune(configs=_prefill_configs(), key=PREFILL_KEY + ["WARP_SPECIALIZE"],
                                 prune_configs_by={"early_config_prune": _prune_prefill})(_flash_fwd_tma_kernel)


def _check_head_dim(d: int) -> None:
    if d not in (16, 32, 64, 128, 256):
        raise NotImplementedError(f"the Triton kernels take head_dim 16, 32, 64, 128 or 256 (a power of two, "
                                  f"one tile wide); got {d}")


def _tma_alloc(size: int, alignment: int, stream):
    return torch.empty(size, device="cpu" if INTERPRET else "cuda", dtype=torch.int8)


def tma_supported(*tensors: torch.Tensor) -> bool:
    """TMA is valid: sm90+ (or the interpreter), unit last stride, 16-byte-aligned base and strides."""
    for t in tensors:
        if t.is_cuda and torch.cuda.get_device_capability(t.device)[0] < 9:
            return False
        if t.stride(-1) != 1 or t.data_ptr() % 16 or any((s * t.element_size()) % 16 for s in t.stride()[:-1]):
            return False
    return True


WS_PROBE = {"BLOCK_M": 128, "BLOCK_N": 64, "num_warps": 8, "num_stages": 3}
"""The tile the compiler is asked to warp-specialise (`ws_refusal`): the first prefill config."""

TRITON_TYPES = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32"}


def ws_refusal(q: torch.Tensor) -> str | None:
    """Why the installed Triton does not warp-specialise the TMA kernel's K/V loop for q's GPU; None where it
    does, and on a CPU (the interpreter runs the loop as written). `tl.range(warp_specialize=True)` is a
    request the compiler may ignore: lowered for sm_90 with Triton 3.6 and 3.9, the loop came out with no
    warp_specialize region, the TMA kernel under another name, and at 4 warps the pass failed. The rung times
    only a loop the compiler split."""
    if not q.is_cuda:
        return None
    return _ws_lowering(torch.cuda.get_device_capability(q.device), q.shape[-1], TRITON_TYPES[q.dtype])


@functools.cache
def _ws_lowering(capability: tuple[int, int], head_dim: int, dtype: str) -> str | None:
    """`ws_refusal` for a GPU of this compute capability, asked once: the kernel lowered ahead of time at
    `WS_PROBE`'s tile, its TTGIR searched for the warp_specialize op."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    names = _flash_fwd_tma_kernel.arg_names
    consts = {"CAUSAL": False, "HEAD_DIM": head_dim, "UPCAST": False, "WARP_SPECIALIZE": True,
              "BLOCK_M": WS_PROBE["BLOCK_M"], "BLOCK_N": WS_PROBE["BLOCK_N"]}
    signature = {n: "constexpr" if n in consts else "fp32" if n == "qk_scale" else f"*{dtype}" if n.endswith("_ptr")
                 else "i32" for n in names}
    arch = capability[0] * 10 + capability[1]
    src = ASTSource(_flash_fwd_tma_kernel, signature, {(names.index(n), ): v for n, v in consts.items()})
    try:
        lowered = triton.compile(src, target=GPUTarget("cuda", arch, 32),
                                 options={"num_warps": WS_PROBE["num_warps"], "num_stages": WS_PROBE["num_stages"]})
    except Exception as e:  # the pass pipeline failed: the compiler's reason
        why = str(e).splitlines()[-1][:200]
        return f"Triton {triton.__version__} cannot warp-specialise the K/V loop for sm_{arch}: {why}"
    if "ttg.warp_specialize" in lowered.asm["ttgir"]:
        return None
    return (f"Triton {triton.__version__} does not warp-specialise the K/V loop for sm_{arch}: lowered, it has no "
            f"warp_specialize region (the TMA kernel under another name)")


COMPILE_FAILED = "PassManager::run failed"
"""How Triton's compiler says a pass pipeline failed (a RuntimeError, not a CompilationError)."""


def flash_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, tma: bool = False,
                  warp_specialize: bool = False) -> torch.Tensor:
    """The Triton flash forward: o [batch, heads, seq_q, head_dim] in q's dtype; any strides with a unit last
    one. `tma` (and `warp_specialize`) where TMA is valid, else the pointer kernel."""
    b, h, hkv, sq, skv, d = dims(q, k)
    _check_head_dim(d)
    if causal and sq > skv:
        raise NotImplementedError(f"causal with seq_q {sq} > seq_kv {skv}: the first queries would see no key")
    o = torch.empty_like(q, memory_format=torch.contiguous_format)
    qk_scale = d**-0.5 * LOG2E
    strides = (*q.stride()[:3], *k.stride()[:3], *v.stride()[:3], *o.stride()[:3])
    if tma and tma_supported(q, k, v, o):
        if warp_specialize and (why := ws_refusal(q)):
            raise NotImplementedError(why)
        triton.set_allocator(_tma_alloc)
        grid = lambda meta: (triton.cdiv(sq, meta["BLOCK_M"]), b * h)  # noqa: E731
        try:
            _flash_fwd_tma[grid](q, k, v, o, qk_scale, b, h, hkv, h // hkv, sq, skv, *strides,
                                 CAUSAL=causal, HEAD_DIM=d, UPCAST=not q.is_cuda, WARP_SPECIALIZE=warp_specialize)
        except (triton.CompilationError, RuntimeError) as e:
            if not warp_specialize or (not isinstance(e, triton.CompilationError) and COMPILE_FAILED not in str(e)):
                raise
            # Triton's automatic warp specialisation is not built for every GPU and release (Triton 3.6 on an H200:
            # "PassManager::run failed" in NVGPUWarpSpecialization, a RuntimeError out of the autotuner): say so (the
            # point is skipped with the compiler's reason) rather than time the TMA kernel under this rung's name.
            raise NotImplementedError(f"this Triton ({triton.__version__}) cannot warp-specialise the K/V loop "
                                      f"here: {str(e).splitlines()[-1][:300]}") from None
    else:
        grid = lambda meta: (triton.cdiv(sq, meta["BLOCK_M"]), b * h)  # noqa: E731
        _flash_fwd[grid](q, k, v, o, qk_scale, h, h // hkv, sq, skv, *strides,
                         CAUSAL=causal, HEAD_DIM=d, UPCAST=not q.is_cuda)
    return o


# --- Triton: decode, one program per (batch, KV head), split over the context ------------------------


@triton.jit
def _decode_split(q_ptr, k_ptr, v_ptr, o_ptr, lse_ptr, part_ptr, count_ptr, qk_scale, HKV, GROUP, SQ, SKV, CHUNK,
                  SPLITS,
                  sqb, sqh, sqm, skb, skh, skn, svb, svh, svn, sob, soh, som,
                  ROWS: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr, UPCAST: tl.constexpr,
                  DIRECT: tl.constexpr, FUSED: tl.constexpr):
    # Grid (batch x kv_heads, splits). The tile's rows are the group's query heads x the draft tokens,
    # r = (head in group) x SQ + token, so K/V tiles are read once for all of them. Keys [split x CHUNK,
    # +CHUNK). DIRECT (one split): o written normalised. Else the partial (lse, o) goes to LSE / PART
    # [batch x kv_heads, splits, ROWS(, HEAD_DIM)]; FUSED: the last split to arrive merges them.
    bk = tl.program_id(0)
    split = tl.program_id(1)
    b = bk // HKV
    hk = bk % HKV
    offs_r = tl.arange(0, ROWS)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    r_ok = offs_r < GROUP * SQ
    head = hk * GROUP + offs_r // SQ
    tok = offs_r % SQ
    q_off = b.to(tl.int64) * sqb + head[:, None] * sqh + tok[:, None] * sqm + offs_d[None, :]
    q = tl.load(q_ptr + q_off, mask=r_ok[:, None], other=0.0)
    limit = SKV - SQ + tok  # the causal mask: draft token t sees keys up to its position
    k_base = k_ptr + b.to(tl.int64) * skb + hk * skh + offs_d[:, None] + offs_n[None, :] * skn
    v_base = v_ptr + b.to(tl.int64) * svb + hk * svh + offs_n[:, None] * svn + offs_d[None, :]
    m_i = tl.full([ROWS], -1.0e30, dtype=tl.float32)
    l_i = tl.zeros([ROWS], dtype=tl.float32)
    acc = tl.zeros([ROWS, HEAD_DIM], dtype=tl.float32)
    lo = split * CHUNK
    hi = tl.minimum(lo + CHUNK, SKV)
    for n0 in range(lo, hi, BLOCK_N):
        n = n0 + offs_n
        k = tl.load(k_base + n0 * skn, mask=(n < hi)[None, :], other=0.0)
        v = tl.load(v_base + n0 * svn, mask=(n < hi)[:, None], other=0.0)
        s = _mma(q, k, tl.zeros([ROWS, BLOCK_N], dtype=tl.float32), UPCAST) * qk_scale
        s = tl.where((n[None, :] < hi) & (n[None, :] <= limit[:, None]), s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        p = tl.math.exp2(s - m_new[:, None])
        alpha = tl.math.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = _mma(p.to(v.dtype), v, acc * alpha[:, None], UPCAST)
        m_i = m_new
    o = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]  # l = 0: a split whose keys a draft token cannot see
    o_off = b.to(tl.int64) * sob + head[:, None] * soh + tok[:, None] * som + offs_d[None, :]
    if DIRECT:
        tl.store(o_ptr + o_off, o.to(o_ptr.dtype.element_ty), mask=r_ok[:, None])
    else:
        slot = bk.to(tl.int64) * SPLITS + split
        tl.store(lse_ptr + slot * ROWS + offs_r,
                 tl.where(l_i > 0, m_i + tl.math.log2(tl.where(l_i > 0, l_i, 1.0)), float("-inf")))
        tl.store(part_ptr + (slot * ROWS + offs_r[:, None]) * HEAD_DIM + offs_d[None, :], o)
        if FUSED:
            # The split-K semaphore: every thread's partial stored (the barrier), one release-acquire
            # arrival; the split that arrives last merges, reading the others' partials from L2 (.cg), and
            # resets the counter for the next launch on the stream.
            tl.debug_barrier()
            arrived = tl.atomic_add(count_ptr + bk, 1, sem="acq_rel")
            if arrived == SPLITS - 1:
                _combine_rows(lse_ptr, part_ptr, o_ptr, bk, o_off, r_ok, SPLITS, ROWS, HEAD_DIM)
                tl.atomic_xchg(count_ptr + bk, 0)


@triton.jit
def _combine_rows(lse_ptr, part_ptr, o_ptr, bk, o_off, r_ok, SPLITS, ROWS: tl.constexpr, HEAD_DIM: tl.constexpr):
    # o = sum_s 2^(lse_s - M) o_s / sum_s 2^(lse_s - M), M the running max of the splits' lse.
    offs_r = tl.arange(0, ROWS)
    offs_d = tl.arange(0, HEAD_DIM)
    m = tl.full([ROWS], -1.0e30, dtype=tl.float32)
    w_sum = tl.zeros([ROWS], dtype=tl.float32)
    acc = tl.zeros([ROWS, HEAD_DIM], dtype=tl.float32)
    for s in range(SPLITS):
        slot = bk.to(tl.int64) * SPLITS + s
        lse = tl.load(lse_ptr + slot * ROWS + offs_r, cache_modifier=".cg")
        part = tl.load(part_ptr + (slot * ROWS + offs_r[:, None]) * HEAD_DIM + offs_d[None, :], cache_modifier=".cg")
        m_new = tl.maximum(m, lse)
        alpha = tl.math.exp2(m - m_new)
        w = tl.math.exp2(lse - m_new)
        w_sum = w_sum * alpha + w
        acc = acc * alpha[:, None] + w[:, None] * part
        m = m_new
    o = acc / w_sum[:, None]
    tl.store(o_ptr + o_off, o.to(o_ptr.dtype.element_ty), mask=r_ok[:, None])


@triton.jit
def _decode_combine(lse_ptr, part_ptr, o_ptr, HKV, GROUP, SQ, SPLITS, sob, soh, som,
                    ROWS: tl.constexpr, HEAD_DIM: tl.constexpr):
    # The second launch of split-KV: one program per (batch, KV head) merges its splits' partials.
    bk = tl.program_id(0)
    b = bk // HKV
    hk = bk % HKV
    offs_r = tl.arange(0, ROWS)
    offs_d = tl.arange(0, HEAD_DIM)
    head = hk * GROUP + offs_r // SQ
    tok = offs_r % SQ
    o_off = b.to(tl.int64) * sob + head[:, None] * soh + tok[:, None] * som + offs_d[None, :]
    _combine_rows(lse_ptr, part_ptr, o_ptr, bk, o_off, offs_r < GROUP * SQ, SPLITS, ROWS, HEAD_DIM)


def _decode_configs() -> list:
    if INTERPRET:
        return [triton.Config({"BLOCK_N": 16}, num_warps=4, num_stages=1)]
    # Bytes in flight per SM are what stream the cache: K and V tiles of 64-128 keys x d, 2-4 stages deep.
    return [triton.Config({"BLOCK_N": bn}, num_warps=w, num_stages=st)
            for bn, w, st in ((64, 4, 3), (64, 4, 4), (128, 4, 3))]


DECODE_KEY = ["SKV", "CHUNK", "SPLITS", "ROWS", "HEAD_DIM", "DIRECT", "FUSED"]
_decode_split_tuned = autotune(configs=_decode_configs(), key=DECODE_KEY)(_decode_split)


MIN_CHUNK = 16 if INTERPRET else 256
"""Fewest keys a split reads (at head_dim 128, 128 KB of K and V): below it a program's ramp and its partial's
write cost more than the parallelism buys. Also the unit splits are rounded to, a multiple of every BLOCK_N.
(Under the interpreter one tile, so the tests' short contexts still split.)"""

PROGRAMS_PER_SM = 2
"""Decode programs the split count aims at per SM: two resident per SM keep enough loads in flight to stream
the cache at the copy rate (a single wave; more splits only add partials)."""

FILLED = 0.9
"""Share of the SMs that (batch, KV head) pairs alone must reach for no split at all: there each program's stream
already keeps the cache moving, and a split adds its partials and combine for no parallelism it needs (an H100,
16 x 8 pairs on 132 SMs: 2-3 splits cost 3-17% against the unsplit rung, which was level with SDPA)."""


def split_count(b: int, hkv: int, skv: int, sms: int) -> tuple[int, int]:
    """(splits, keys per split): enough (batch, KV head, split) programs for PROGRAMS_PER_SM per SM, no split
    under MIN_CHUNK keys or once the pairs alone fill FILLED of the SMs, none empty."""
    pairs = b * hkv
    want = 1 if pairs >= FILLED * sms else math.ceil(PROGRAMS_PER_SM * sms / pairs)
    splits = max(1, min(want, skv // MIN_CHUNK))
    chunk = math.ceil(math.ceil(skv / splits) / MIN_CHUNK) * MIN_CHUNK
    return math.ceil(skv / chunk), chunk


_COUNTERS: dict = {}
"""Per device: the fused combine's arrival counters, one per (batch, KV head), left at zero by each launch."""


def _counters(n: int, device) -> torch.Tensor:
    c = _COUNTERS.get(device)
    if c is None or c.numel() < n:
        c = _COUNTERS[device] = torch.zeros(max(n, 1024), dtype=torch.int32, device=device)
    return c


def decode_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, splits: int | None = 1,
                   fused: bool = False) -> torch.Tensor:
    """Decode attention by (batch, KV head) programs over the group's rows. `splits`: 1 (the whole context in
    one program), a number, or None (from batch, KV heads and SM count: `split_count`); `fused`: the combine
    done by the last split to arrive instead of a second launch."""
    b, h, hkv, sq, skv, d = dims(q, k)
    _check_head_dim(d)
    group = h // hkv
    rows = max(16, triton.next_power_of_2(group * sq))  # tl.dot takes at least 16 rows
    if rows > 128:
        raise NotImplementedError(f"decode holds at most 128 rows (query heads per KV head x draft tokens) a "
                                  f"tile; got {group} x {sq}")
    if causal and sq > skv:
        raise NotImplementedError(f"causal with seq_q {sq} > seq_kv {skv}: the first queries would see no key")
    if not causal and sq > 1:
        raise NotImplementedError("decode with several query tokens is causal (speculative drafts)")
    if splits is None:
        splits, chunk = split_count(b, hkv, skv, num_sms(q))
    else:
        chunk = math.ceil(math.ceil(skv / splits) / MIN_CHUNK) * MIN_CHUNK
        splits = math.ceil(skv / chunk)
    o = torch.empty_like(q, memory_format=torch.contiguous_format)
    direct = splits == 1
    if direct:
        lse = part = count = o  # unused
    else:
        lse = torch.empty(b * hkv * splits * rows, device=q.device, dtype=torch.float32)
        part = torch.empty(b * hkv * splits * rows * d, device=q.device, dtype=torch.float32)
        count = _counters(b * hkv, q.device) if fused else lse
    strides = (*q.stride()[:3], *k.stride()[:3], *v.stride()[:3], *o.stride()[:3])
    _decode_split_tuned[(b * hkv, splits)](q, k, v, o, lse, part, count, d**-0.5 * LOG2E, hkv, group, sq, skv, chunk,
                                           splits, *strides, ROWS=rows, HEAD_DIM=d, UPCAST=not q.is_cuda,
                                           DIRECT=direct, FUSED=fused and not direct)
    if not direct and not fused:
        _decode_combine[(b * hkv,)](lse, part, o, hkv, group, sq, splits, *o.stride()[:3],
                                    ROWS=rows, HEAD_DIM=d, num_warps=4)
    return o
