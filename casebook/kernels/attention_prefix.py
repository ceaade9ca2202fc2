"""Prefix reuse: many decode requests sharing one long prefix, its KV read once.

What you will learn: requests that share a prefix (a system prompt, few-shot examples, the samples of one
prompt) share its K/V pages in a paged cache (attention_paged's block table names the same pages first in
every request's row), which saves memory but not bytes: a per-request decode kernel still streams the
prefix once per request, so 64 requests on a 32K prefix read 64 x 134 MB. A cascade kernel splits the
attention at the prefix's end. The prefix pass puts every request's query heads that share a KV head into
the rows of one tile (64 requests x 4 heads = 256 rows) against one read of the prefix's K/V: a GEMM-shaped
pass of B x group FLOPs per K/V element pair, no longer a GEMV. Each request's suffix pass is an ordinary
paged decode over its own few pages. The two partial softmaxes merge exactly by their log-sum-exps:
o = (2^lse_p o_p + 2^lse_s o_s) / (2^lse_p + 2^lse_s) (split-KV's combine, with the prefix as the splits).

The regime moves with the requests: the prefix pass does 4 B H d FLOPs per prefix token on 4 H_kv d bytes,
B x group FLOPs per byte, so it is bandwidth-bound at few requests and crosses the H200's ridge (~190) near
48 requests at group 4; the suffixes stay bandwidth-bound (4 FLOP/byte).

The ladder (baseline: per_request):
  sdpa           per request over its own contiguous cache (the prefix copied into each): the library's decode
  per_request    attention_decode's split-KV kernel (fused combine) over each request's own contiguous cache
                 (the prefix copied into each)
  gather_sdpa    the library's call on the shared pool: the pages gathered into a contiguous copy per request,
                 then SDPA (attention_paged's naive path: memory saved in the pool, the prefix copied per call)
  paged_shared   the prefix's pages shared in the pool (memory saved), attention_paged's best kernel: each
                 request's programs still read them (bytes not saved; L2 catches what it can)
  triton_cascade the prefix pass (all requests' queries against one read of the prefix), the suffix pass
                 (each request's own pages), then a merge kernel: the log-sum-exp merge of the partials
  triton_cascade_fused  the merge fused into the suffix pass: each (request, KV head) program folds the prefix's
                 partials into its running softmax before it writes o (two launches, no suffix partials)

Only whole pages are shared: a prefix's tail shorter than a page lives in each request's own first page, as a
serving engine's prefix cache keeps it (`shared` below is the shared tokens, a multiple of the page). Pages of
PAGE tokens, shuffled in the pool. q [requests, heads, 1, head_dim]; the pool as attention_paged's.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from casebook.kernels import attention_common as ac
from casebook.kernels import attention_decode
from casebook.kernels import attention_paged as ap
from casebook.kernels.attention_common import LOG2E
from casebook.kernels.attention_paged import _load_group, paged_tiles_static
from casebook.kernels.device import INTERPRET, autotune, num_sms
from casebook.traffic import Term, Traffic

PAGE = 16
"""Tokens a page: vLLM's default block size, the claims' page."""

# --- reference, inputs, traffic ----------------------------------------------------------------------


def reference(q, k_cache, v_cache, block_table, seq_lens) -> torch.Tensor:
    """softmax(q k^T / sqrt(d)) v in float64 over each request's whole context, read through its block table:
    never from the per-request rungs' contiguous copies, which it does not name and so is not given in float64
    (17 GB each at the claim shape, `check.reference_inputs`)."""
    return ap.reference(q, k_cache, v_cache, block_table, seq_lens)


def _geometry(shape: dict) -> tuple:
    return (shape["batch"], shape["heads"], shape["kv_heads"], shape["prefix"], shape["suffix"], shape["head_dim"])


def shared_tokens(prefix: int, page: int = PAGE) -> int:
    """The prefix's tokens in whole pages: what the requests share."""
    return prefix // page * page


def make_inputs(shape: dict, dtype: torch.dtype, device: str, generator: torch.Generator, page: int = PAGE,
                contiguous: bool = True) -> dict:
    """One prefix's K/V and each request's suffix K/V and query, of unit spread; the pool (the prefix's whole pages
    once, each request's tail and suffix in its own pages, shuffled), the block tables and lengths; with
    `contiguous`, each request's whole context also as its own contiguous copy (the per-request rungs')."""
    b, h, hkv, prefix, suffix, d = _geometry(shape)
    pre = ac.make_qkv(1, 1, hkv, 1, prefix, d, dtype, device, generator)
    own = ac.make_qkv(b, h, hkv, 1, suffix, d, dtype, device, generator)
    shared = shared_tokens(prefix, page)
    k, v = (torch.cat([pre[n].expand(b, -1, -1, -1), own[n]], 2) for n in ("k", "v"))  # [b, hkv, P + S, d]
    pool = ap.paged(k[:, :, shared:], v[:, :, shared:], page, 3, generator, pre["k"][:, :, :shared],
                    pre["v"][:, :, :shared])
    lens = torch.full((b,), prefix + suffix, dtype=torch.int32, device=device)
    extra = {"k": k, "v": v} if contiguous else {}
    return {"q": own["q"], **pool, "seq_lens": lens, "shared": shared, **extra}


make_inputs.derived = ap.contiguous_copies  # the per-request rungs' copies, again from the blended pool


def traffic(shape: dict, dtype: torch.dtype) -> Traffic:
    """Each byte once: the shared pages' K/V once, each request's own tokens (the prefix's tail past its last whole
    page, the suffix), the block tables, Q read and O written; FLOPs 4 B H d over every request's whole context.
    The per-request rungs read the prefix B times, the cascade's partials are beyond the floor (the notes)."""
    b, h, hkv, prefix, suffix, d = _geometry(shape)
    e = torch.empty((), dtype=dtype).element_size()
    shared = shared_tokens(prefix)
    own = prefix + suffix - shared
    kv = 2 * hkv * d * e
    return Traffic([
        Term("read q (batch x heads x head_dim)", bytes=b * h * d * e),
        Term("read the shared prefix's k and v once (2 x kv_heads x shared tokens x head_dim)", bytes=kv * shared),
        Term("read each request's own k and v (2 x batch x kv_heads x (prefix tail + suffix) x head_dim)",
             bytes=b * kv * own),
        ap.table_term(b, shared // PAGE + math.ceil(own / PAGE)),
        Term("write o (batch x heads x head_dim)", bytes=b * h * d * e),
        Term("QK^T multiply-add (2 per head_dim x key, every request's whole context)",
             flops=2 * b * h * d * (prefix + suffix)),
        Term("PV multiply-add (2 per head_dim x key)", flops=2 * b * h * d * (prefix + suffix)),
    ])


# --- variants 1-4: per request ---------------------------------------------------------------------


def sdpa(q, k_cache, v_cache, block_table, seq_lens, shared, k, v) -> torch.Tensor:
    """SDPA's own dispatch per request over its contiguous cache: the prefix read once per request."""
    return attention_decode.sdpa(q, k, v)


def per_request(q, k_cache, v_cache, block_table, seq_lens, shared, k, v) -> torch.Tensor:
    """attention_decode's split-KV kernel over each request's contiguous cache (the prefix copied into each)."""
    return attention_decode.triton_split_fused(q, k, v)


def gather_sdpa(q, k_cache, v_cache, block_table, seq_lens, shared, k=None, v=None) -> torch.Tensor:
    """attention_paged's gather and SDPA over the pool whose prefix pages every request's table names."""
    return ap.gather_sdpa(q, k_cache, v_cache, block_table, seq_lens)


def paged_shared(q, k_cache, v_cache, block_table, seq_lens, shared, k=None, v=None) -> torch.Tensor:
    """attention_paged's best kernel over the pool whose prefix pages every request's table names."""
    return ap.triton_paged_static(q, k_cache, v_cache, block_table, seq_lens)


# --- the cascade: the prefix pass, the suffix pass, the merge -----------------------------------------


@triton.jit
def _merge_in(m_i, l_i, acc, lse, part):
    # Fold a partial softmax (lse: log2 of its sum of 2^score; part: its normalised output) into a running one
    # (m_i its max, l_i its sum of 2^(score - m_i), acc its unnormalised output): the log-sum-exp merge. A
    # partial over no key (lse -inf) weighs 2^-inf = 0; m_i starts finite, so no -inf - -inf.
    m_new = tl.maximum(m_i, lse)
    alpha = tl.math.exp2(m_i - m_new)
    w = tl.math.exp2(lse - m_new)
    return m_new, l_i * alpha + w, acc * alpha[:, None] + w[:, None] * part


@triton.jit
def _prefix_pass(q_ptr, kc_ptr, vc_ptr, bt_ptr, lse_ptr, part_ptr, qk_scale, B, H, HKV, GROUP, CHUNK, SHARED,
                 TILES, sqb, sqh, skp, skt, skh, svp, svt, svh,
                 PAGE: tl.constexpr, BLOCK_M: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr,
                 UPCAST: tl.constexpr):
    # Grid (kv_heads x row tiles, splits): rows r = request x GROUP + head in group, every request's queries of
    # KV head hk against keys [split x CHUNK, +CHUNK) of the shared pages (request 0's table row names them).
    # The row tiles of one (KV head, split) are neighbours in the launch, so the chunk is read from DRAM once.
    # Each row's partial (lse, o) goes to LSE / PART [split, request x heads + head(, HEAD_DIM)].
    hk = tl.program_id(0) // TILES
    tile = tl.program_id(0) % TILES
    split = tl.program_id(1)
    offs_m = tile * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    m_ok = offs_m < B * GROUP
    req = offs_m // GROUP
    head = hk * GROUP + offs_m % GROUP
    q = tl.load(q_ptr + req[:, None].to(tl.int64) * sqb + head[:, None] * sqh + offs_d[None, :], mask=m_ok[:, None],
                other=0.0)
    lo = split * CHUNK
    hi = tl.minimum(lo + CHUNK, SHARED)
    m_i = tl.full([BLOCK_M], -1.0e30, dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
    acc, m_i, l_i = paged_tiles_static(acc, m_i, l_i, q, kc_ptr, vc_ptr, bt_ptr, lo, hi, hk, skp, skt, skh,
                                       svp, svt, svh, qk_scale, PAGE, HEAD_DIM, BLOCK_N, UPCAST)
    row = split.to(tl.int64) * B * H + req * H + head
    tl.store(lse_ptr + row, m_i + tl.math.log2(l_i), mask=m_ok)  # every split holds keys: l > 0
    tl.store(part_ptr + row[:, None] * HEAD_DIM + offs_d[None, :], acc / l_i[:, None], mask=m_ok[:, None])


@triton.jit
def _suffix_pass(q_ptr, kc_ptr, vc_ptr, bt_ptr, len_ptr, o_ptr, lse_ptr, part_ptr, qk_scale, B, H, HKV, GROUP,
                 SHARED, SPLITS, sqb, sqh, skp, skt, skh, svp, svt, svh, sbt,
                 PAGE: tl.constexpr, ROWS: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr,
                 UPCAST: tl.constexpr, FUSED: tl.constexpr):
    # Grid (requests x kv_heads): the group's heads against the request's own keys [SHARED, its length).
    # FUSED: the prefix's SPLITS partials folded in, o written; else this pass's partial stored as slot SPLITS.
    bk = tl.program_id(0)
    b = bk // HKV
    hk = bk % HKV
    q, head, r_ok = _load_group(q_ptr, b, hk, sqb, sqh, GROUP, ROWS, HEAD_DIM)
    offs_d = tl.arange(0, HEAD_DIM)
    m_i = tl.full([ROWS], -1.0e30, dtype=tl.float32)
    l_i = tl.zeros([ROWS], dtype=tl.float32)
    acc = tl.zeros([ROWS, HEAD_DIM], dtype=tl.float32)
    acc, m_i, l_i = paged_tiles_static(acc, m_i, l_i, q, kc_ptr, vc_ptr, bt_ptr + b.to(tl.int64) * sbt, SHARED,
                                       tl.load(len_ptr + b), hk, skp, skt, skh, svp, svt, svh, qk_scale, PAGE,
                                       HEAD_DIM, BLOCK_N, UPCAST)
    row = b.to(tl.int64) * H + head
    if FUSED:
        for s in range(SPLITS):
            lse = tl.load(lse_ptr + s * B * H + row, mask=r_ok, other=float("-inf"))
            part = tl.load(part_ptr + (s * B * H + row)[:, None] * HEAD_DIM + offs_d[None, :], mask=r_ok[:, None],
                           other=0.0)
            m_i, l_i, acc = _merge_in(m_i, l_i, acc, lse, part)
        o = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
        tl.store(o_ptr + row[:, None] * HEAD_DIM + offs_d[None, :], o.to(o_ptr.dtype.element_ty), mask=r_ok[:, None])
    else:
        slot = SPLITS * B * H + row
        tl.store(lse_ptr + slot, tl.where(l_i > 0, m_i + tl.math.log2(tl.where(l_i > 0, l_i, 1.0)), float("-inf")),
                 mask=r_ok)
        tl.store(part_ptr + slot[:, None] * HEAD_DIM + offs_d[None, :], acc / tl.where(l_i > 0, l_i, 1.0)[:, None],
                 mask=r_ok[:, None])


@triton.jit
def _merge(lse_ptr, part_ptr, o_ptr, N, SLOTS, BLOCK_R: tl.constexpr, HEAD_DIM: tl.constexpr):
    # The unfused cascade's third launch: each of N rows (request x heads + head) merges its SLOTS partials.
    offs_r = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    offs_d = tl.arange(0, HEAD_DIM)
    ok = offs_r < N
    m = tl.full([BLOCK_R], -1.0e30, dtype=tl.float32)
    w_sum = tl.zeros([BLOCK_R], dtype=tl.float32)
    acc = tl.zeros([BLOCK_R, HEAD_DIM], dtype=tl.float32)
    for s in range(SLOTS):
        row = offs_r.to(tl.int64) + s * N
        lse = tl.load(lse_ptr + row, mask=ok, other=float("-inf"))
        part = tl.load(part_ptr + row[:, None] * HEAD_DIM + offs_d[None, :], mask=ok[:, None], other=0.0)
        m, w_sum, acc = _merge_in(m, w_sum, acc, lse, part)
    o = acc / tl.where(w_sum > 0, w_sum, 1.0)[:, None]
    tl.store(o_ptr + offs_r[:, None] * HEAD_DIM + offs_d[None, :], o.to(o_ptr.dtype.element_ty), mask=ok[:, None])


def _configs(prefix_pass: bool) -> list:
    if INTERPRET:
        return [triton.Config({"BLOCK_N": 16}, num_warps=4, num_stages=1)]
    if prefix_pass:  # a 64-row Q tile against 64-128-key tiles: flash prefill's tiles, shorter
        return [triton.Config({"BLOCK_N": bn}, num_warps=w, num_stages=st)
                for bn, w, st in ((64, 4, 3), (64, 8, 3), (128, 8, 2))]
    return [triton.Config({"BLOCK_N": bn}, num_warps=4, num_stages=st) for bn, st in ((64, 3), (128, 3))]


_prefix_pass_tuned = autotune(configs=_configs(True), key=["CHUNK", "TILES", "HEAD_DIM", "PAGE"])(_prefix_pass)
_suffix_pass_tuned = autotune(configs=_configs(False), key=["SHARED", "SPLITS", "ROWS", "HEAD_DIM", "FUSED"])(
    _suffix_pass)

BLOCK_M = 16 if INTERPRET else 64
"""Query rows (requests x heads of one group) a prefix-pass tile: 64 keeps its partials few (one split per
chunk) and its fp32 accumulator in registers; the interpreter's 16 makes the tests' batches span tiles."""

MERGE_ROWS = 16


def prefix_splits(b: int, group: int, hkv: int, shared: int, sms: int) -> tuple[int, int, int]:
    """(row tiles, splits, keys per split) of the prefix pass: row tiles x KV heads x splits near
    attention_common.PROGRAMS_PER_SM programs an SM, chunks of whole pages and at least MIN_CHUNK keys."""
    tiles = math.ceil(b * group / BLOCK_M)
    unit = max(ac.MIN_CHUNK, PAGE)
    want = max(1, math.ceil(ac.PROGRAMS_PER_SM * sms / (tiles * hkv)))
    splits = max(1, min(want, shared // unit))
    chunk = math.ceil(math.ceil(shared / splits) / unit) * unit
    return tiles, math.ceil(shared / chunk), chunk


def merge(lse: torch.Tensor, part: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """The log-sum-exp merge kernel: lse [slots, N] (log2 domain), part [slots, N, head_dim] fp32, into out
    (N x head_dim elements, contiguous)."""
    slots, n, d = part.shape
    _merge[(triton.cdiv(n, MERGE_ROWS),)](lse, part, out, n, slots, BLOCK_R=MERGE_ROWS, HEAD_DIM=d, num_warps=4)
    return out


def cascade(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_table: torch.Tensor,
            seq_lens: torch.Tensor, shared: int, fused: bool) -> torch.Tensor:
    """The cascade: the prefix pass over the `shared` tokens (whole pages, the first of every table row), the
    suffix pass over each request's own, and their partials merged (by a third kernel, or `fused` into the
    suffix pass). No shared page: the prefix's partial is empty (lse -inf), and the merge weighs it zero."""
    b, h, _, d = q.shape
    _, page, hkv, _ = k_cache.shape
    ac._check_head_dim(d)
    if page != PAGE or shared % page:
        raise NotImplementedError(f"the cascade's kernels take {PAGE}-token pages and whole shared pages; got "
                                  f"{page}-token pages, {shared} shared tokens")
    group = h // hkv
    n = b * h
    q_strides = q.stride()[:2]
    pool = ap.pool_strides(k_cache, v_cache)
    scale = d**-0.5 * LOG2E
    if shared:
        tiles, splits, chunk = prefix_splits(b, group, hkv, shared, num_sms(q))
    else:
        tiles, splits, chunk = 0, 1, 0
    lse = torch.empty((splits + 1) * n, device=q.device, dtype=torch.float32)
    part = torch.empty((splits + 1) * n * d, device=q.device, dtype=torch.float32)
    if shared:
        _prefix_pass_tuned[(tiles * hkv, splits)](q, k_cache, v_cache, block_table, lse, part, scale, b, h, hkv, group,
                                                  chunk, shared, tiles, *q_strides, *pool, PAGE=page, BLOCK_M=BLOCK_M,
                                                  HEAD_DIM=d, UPCAST=not q.is_cuda)
    else:
        lse[:n].fill_(float("-inf"))
        part[:n * d].zero_()
    o = torch.empty(b, h, 1, d, device=q.device, dtype=q.dtype)
    _suffix_pass_tuned[(b * hkv,)](q, k_cache, v_cache, block_table, seq_lens, o, lse, part, scale, b, h, hkv, group,
                                   shared, splits, *q_strides, *pool, block_table.stride(0), PAGE=page,
                                   ROWS=ap.rows_for(group), HEAD_DIM=d, UPCAST=not q.is_cuda, FUSED=fused)
    if not fused:
        merge(lse.view(splits + 1, n), part.view(splits + 1, n, d), o)
    return o


# --- variants 5-6 -------------------------------------------------------------------------------------


def triton_cascade(q, k_cache, v_cache, block_table, seq_lens, shared, k=None, v=None) -> torch.Tensor:
    """The prefix pass, the suffix pass, the merge kernel: three launches."""
    return cascade(q, k_cache, v_cache, block_table, seq_lens, shared, fused=False)


def triton_cascade_fused(q, k_cache, v_cache, block_table, seq_lens, shared, k=None, v=None) -> torch.Tensor:
    """The prefix pass, then the suffix pass folding the prefix's partials in: two launches."""
    return cascade(q, k_cache, v_cache, block_table, seq_lens, shared, fused=True)


# --- level 3: one decode step of many requests on a shared prefix -----------------------------------


def make_step_inputs(shape: dict, dtype: torch.dtype, device: str, generator: torch.Generator) -> dict:
    """attention_paged's step weights and new tokens, and the paged cache of make_inputs (no contiguous copies),
    the last position of each request the step fills."""
    b, h, hkv, _, _, d = _geometry(shape)
    cache = make_inputs(shape, dtype, device, generator, contiguous=False)
    del cache["q"]
    return {**ap.step_weights(b, h, hkv, d, dtype, device, generator), **cache}


def prefix_step(kernel, x, w_qkv, w_o, k_cache, v_cache, block_table, seq_lens, shared: int, heads: int):
    """attention_paged's decode step (QKV projection, the new token into its page slot, attention, output
    projection) with the shared tokens passed to the kernel."""
    return ap.paged_step(kernel, x, w_qkv, w_o, k_cache, v_cache, block_table, seq_lens, heads, shared=shared)
