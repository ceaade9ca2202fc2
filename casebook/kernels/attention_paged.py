"""Paged decode attention: the KV cache behind a block table.

What you will learn: serving engines do not give a sequence one contiguous cache. They cut a pool into
fixed-size pages (vLLM's default: 16 tokens) and keep, per sequence, a block table naming its pages in
order; pages are allocated as sequences grow and freed when they end, so after a while a sequence's pages
lie anywhere in the pool. The decode maths is attention_decode's (one query token per sequence, about 4
FLOPs per byte at 32 query and 8 KV heads, bandwidth-bound by ~47x), and the floor is the same cache read
once plus the block table (4 bytes per page, 0.02% at 16-token pages). What the pages change is the
layout: each K/V tile's rows come from pages whose addresses must first be loaded from the table (a
dependent load ahead of every page), and a page is one contiguous run of page_size x head_dim elements per
KV head, so small pages cut the stream into short runs. The ladder measures what that indirection costs
against the same decode over a contiguous cache, by page size and by how scattered the pages are.

The ladder (baseline: contiguous, attention_decode's split-KV kernel over a contiguous copy of the cache):
  contiguous           attention_decode's triton_split_fused on the contiguous cache: the target
  gather_sdpa          the naive path: the pages gathered into a contiguous copy (read, written, read again:
                       3x the cache's bytes), then SDPA with a mask for the last page's padding
  triton_paged         one program per (batch, KV head) following the block table tile by tile: each key's
                       page looked up (page size a runtime integer: a division and a table load per key)
  triton_paged_split   the same tile loop split over the context (split-KV over pages), the partials merged
                       by the last split to arrive (attention_decode's fused combine)
  triton_paged_static  page-size specialisation: the page size a compile-time constant, the tile aligned to
                       pages, one table load per page (per tile when a page holds a whole tile), shifts for
                       the divisions; the split-KV and fused combine as above

The pool: k_cache, v_cache [pages, page_size, kv_heads, head_dim] (vLLM's and FlashInfer's NHD layout: a
page holds every KV head of page_size tokens); block_table [batch, pages_per_seq] int32; seq_lens [batch]
int32. A sequence's last page may be partly filled. q [batch, heads, 1, head_dim]; o like q.
The shape's `order`: 1 a sequence's pages consecutive in the pool, 2 interleaved (allocated one page per
sequence in turn, as a batch decoding in lockstep grows), 3 shuffled (a random permutation of the pool:
the free list after churn).

No serving library's paged kernel is a rung: vLLM and sglang need large compiled wheels, FlashInfer compiles
CUDA at run time (nvcc); none installs as a pure-Python or Triton package (the notes say more).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from casebook.kernels import attention_common as ac
from casebook.kernels import attention_decode
from casebook.kernels.attention_common import LOG2E, _attend, _combine_rows
from casebook.kernels.device import INTERPRET, autotune, num_sms, on_device
from casebook.traffic import Term, Traffic

ORDERS = {1: "in order", 2: "interleaved", 3: "shuffled"}
"""The shape's `order`: how a batch's pages lie in the pool (shape values are positive integers)."""

# --- the pool, reference, inputs, traffic ----------------------------------------------------------


def _pages(x: torch.Tensor, page: int) -> torch.Tensor:
    """[n, kv_heads, L, d] -> [n, ceil(L / page), page, kv_heads, d]: the tokens cut into pages, the last one
    zero-padded (a pool's unused slots hold whatever was there; zeros here)."""
    n, hkv, length, d = x.shape
    per = math.ceil(length / page)
    x = F.pad(x, (0, 0, 0, per * page - length))
    return x.view(n, hkv, per, page, d).permute(0, 2, 3, 1, 4)


def page_ids(b: int, per: int, shared: int, order: int, generator: torch.Generator) -> tuple:
    """Pool slots for `shared` pages stored once and `per` pages of each of `b` sequences: (shared ids [shared],
    own ids [b, per]), laid out by `order` (1 consecutive, 2 interleaved, 3 shuffled)."""
    n = shared + b * per
    if order == 1:
        ids = torch.arange(n)
        return ids[:shared], ids[shared:].view(b, per)
    if order == 2:
        return torch.arange(shared), shared + torch.arange(b * per).view(per, b).T
    if order == 3:
        ids = torch.randperm(n, generator=generator)
        return ids[:shared], ids[shared:].view(b, per)
    raise ValueError(f"order {order}: 1 (in order), 2 (interleaved) or 3 (shuffled)")


def paged(k: torch.Tensor, v: torch.Tensor, page: int, order: int, generator: torch.Generator,
          shared_k: torch.Tensor | None = None, shared_v: torch.Tensor | None = None) -> dict:
    """k, v [batch, kv_heads, L, d] into a pool of pages and a block table. `shared_k`, `shared_v` [1, kv_heads,
    S, d] (S a multiple of the page size): a prefix stored once, its pages first in every sequence's table."""
    b, hkv, length, d = k.shape
    per = math.ceil(length / page)
    shared = 0 if shared_k is None else shared_k.shape[2] // page
    sid, own = page_ids(b, per, shared, order, generator)
    table = torch.cat([sid.expand(b, shared), own], 1).to(torch.int32)
    pools = []
    for x, s in ((k, shared_k), (v, shared_v)):
        pool = x.new_empty(shared + b * per, page, hkv, d)
        pool[own.flatten()] = _pages(x, page).reshape(b * per, page, hkv, d)
        if shared:
            pool[sid] = _pages(s, page)[0]
        pools.append(pool)
    return {"k_cache": pools[0], "v_cache": pools[1], "block_table": table.to(k.device)}


def gather(cache: torch.Tensor, block_table: torch.Tensor) -> torch.Tensor:
    """The pages of every sequence copied into one contiguous [batch, pages x page, kv_heads, d] tensor (one copy:
    the cache read and written once), returned as its [batch, kv_heads, pages x page, d] view."""
    b, per = block_table.shape
    _, page, hkv, d = cache.shape
    return cache[block_table.long()].view(b, per * page, hkv, d).transpose(1, 2)


def reference(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_table: torch.Tensor,
              seq_lens: torch.Tensor) -> torch.Tensor:
    """softmax(q k^T / sqrt(d)) v in float64 over each sequence's first seq_lens tokens, read through the block
    table. It does not name the contiguous copy the `contiguous` rung reads, so it is never given one, nor is
    one upcast for it (`check.reference_inputs`)."""
    out = torch.empty(q.shape, dtype=torch.float64, device=q.device)
    for i, n in enumerate(seq_lens.tolist()):  # one sequence at a time: float64 copies of one context, not all
        row = block_table[i:i + 1]
        out[i:i + 1] = ac.reference(q[i:i + 1], gather(k_cache, row)[:, :, :n], gather(v_cache, row)[:, :, :n])
    return out


def _geometry(shape: dict) -> tuple:
    return (shape["batch"], shape["heads"], shape["kv_heads"], shape["seq_kv"], shape["head_dim"],
            shape["page_size"], shape["order"])


def make_inputs(shape: dict, dtype: torch.dtype, device: str, generator: torch.Generator) -> dict:
    """q, k, v of unit spread; the cache cut into pages laid out by `order`, the block table and the lengths;
    the contiguous k, v kept beside them for the `contiguous` rung (the same values)."""
    b, h, hkv, length, d, page, order = _geometry(shape)
    x = ac.make_qkv(b, h, hkv, 1, length, d, dtype, device, generator)
    lens = torch.full((b,), length, dtype=torch.int32, device=device)
    return {"q": x["q"], **paged(x["k"], x["v"], page, order, generator), "seq_lens": lens, "k": x["k"], "v": x["v"]}


def contiguous_copies(inputs: dict) -> dict:
    """The contiguous k, v again from the pool, through the block table (`make_inputs.derived`): a blend moves the
    pool's elements and the copy's apart, and the rungs that read the copy would be judged against a reference that
    reads the pool. Nothing where the set has no copy."""
    if "k" not in inputs:
        return {}
    length = inputs["k"].shape[2]
    return {n: gather(inputs[f"{n}_cache"], inputs["block_table"])[:, :, :length] for n in ("k", "v")}


make_inputs.derived = contiguous_copies


def table_term(b: int, per: int) -> Term:
    return Term("read block_table (batch x pages a sequence x 4 B)", bytes=b * per * 4)


def traffic(shape: dict, dtype: torch.dtype) -> Traffic:
    """The floor: the K and V pages read once (attention_decode's cache bytes), the block table once, Q read and
    O written; FLOPs 4 B H d L. The gather rung's copy (the cache written and read again) and the split rungs'
    fp32 partials are beyond the floor: their notes count them."""
    b, h, hkv, length, d, page, _ = _geometry(shape)
    e = torch.empty((), dtype=dtype).element_size()
    return Traffic(ac.terms(b, h, hkv, 1, length, d, False, e) + [table_term(b, math.ceil(length / page))])


# --- variant 1: the contiguous cache (the target) ------------------------------------------------


def contiguous(q, k_cache, v_cache, block_table, seq_lens, k, v) -> torch.Tensor:
    """attention_decode's split-KV kernel with the fused combine, over the contiguous copy."""
    return attention_decode.triton_split_fused(q, k, v)


# --- variant 2: gather, then decode --------------------------------------------------------------


def gather_sdpa(q, k_cache, v_cache, block_table, seq_lens, k=None, v=None) -> torch.Tensor:
    """The pages copied into contiguous K and V (bytes: the cache read, written and read again by SDPA), the last
    page's padding masked by each sequence's length (computed on the device: no host sync)."""
    kg, vg = gather(k_cache, block_table), gather(v_cache, block_table)
    keep = torch.arange(kg.shape[2], device=q.device)[None, :] < seq_lens[:, None]  # [batch, pages x page]
    h, hkv = q.shape[1], kg.shape[1]
    return F.scaled_dot_product_attention(q, kg, vg, attn_mask=keep[:, None, None, :], enable_gqa=h != hkv)


# --- the Triton paged kernels ----------------------------------------------------------------------


@triton.jit
def _load_group(q_ptr, b, hk, sqb, sqh, GROUP, ROWS: tl.constexpr, HEAD_DIM: tl.constexpr):
    # The tile's rows: the query heads of KV head hk (rows past the group are padding, zero, never stored).
    offs_r = tl.arange(0, ROWS)
    offs_d = tl.arange(0, HEAD_DIM)
    r_ok = offs_r < GROUP
    head = hk * GROUP + offs_r
    q = tl.load(q_ptr + b.to(tl.int64) * sqb + head[:, None] * sqh + offs_d[None, :], mask=r_ok[:, None], other=0.0)
    return q, head, r_ok


@triton.jit
def paged_tiles(acc, m_i, l_i, q, kc_ptr, vc_ptr, table, lo, hi, hk, PAGE, skp, skt, skh, svp, svt, svh, qk_scale,
                HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr, UPCAST: tl.constexpr):
    """Keys [lo, hi) of one sequence through its block table `table`, any page size (a runtime integer): each
    key's page loaded from the table, its row at page x page_stride + (key mod PAGE) x token_stride."""
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    for n0 in range(lo, hi, BLOCK_N):
        n = n0 + offs_n
        ok = n < hi
        page = tl.load(table + n // PAGE, mask=ok, other=0).to(tl.int64)
        slot = n % PAGE
        k = tl.load(kc_ptr + (page * skp + slot * skt + hk * skh)[None, :] + offs_d[:, None], mask=ok[None, :],
                    other=0.0)
        v = tl.load(vc_ptr + (page * svp + slot * svt + hk * svh)[:, None] + offs_d[None, :], mask=ok[:, None],
                    other=0.0)
        # attention_common's online-softmax step, masked at hi (keys n0 + offs_n past it score -inf), no causal mask
        acc, m_i, l_i = _attend(acc, m_i, l_i, q, k, v, qk_scale, 0, offs_n, n0, 0, hi, True, False, UPCAST)
    return acc, m_i, l_i


@triton.jit
def paged_tiles_static(acc, m_i, l_i, q, kc_ptr, vc_ptr, table, lo, hi, hk, skp, skt, skh, svp, svt, svh, qk_scale,
                       PAGE: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr, UPCAST: tl.constexpr):
    """The same keys with the page size a compile-time constant and every tile starting on a page (lo a multiple of
    PAGE, and of BLOCK_N where PAGE >= BLOCK_N): one table load per tile when a page holds whole tiles, else one
    per key (PAGE keys reading one word) loaded a tile ahead, the divisions shifts."""
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    if PAGE < BLOCK_N:  # the first tile's page words; each iteration loads the next tile's
        ahead = tl.load(table + (lo + offs_n) // PAGE, mask=(lo + offs_n) < hi, other=0)
    for n0 in range(lo, hi, BLOCK_N):
        ok = (n0 + offs_n) < hi
        if PAGE >= BLOCK_N:  # the tile inside one page: one scalar table load, rows consecutive
            page = tl.load(table + n0 // PAGE).to(tl.int64)
            rows = page * skp + (n0 % PAGE + offs_n) * skt
            rows_v = page * svp + (n0 % PAGE + offs_n) * svt
        else:  # BLOCK_N // PAGE whole pages: each key's page word (PAGE keys share one, an L1 broadcast), loaded
            # an iteration ahead: K and V then depend on no load of their own iteration, and the pipeliner keeps
            # num_stages - 1 of their tiles in flight, as for contiguous keys (lowered for sm_90, a table load in
            # the same iteration left one K and one V tile in flight at any num_stages). The addresses stay a plain
            # per-key vector (a [pages, slots] reshape of them ran 0.35x of contiguous on the H200).
            n = n0 + offs_n
            page = ahead.to(tl.int64)
            ahead = tl.load(table + (n + BLOCK_N) // PAGE, mask=(n + BLOCK_N) < hi, other=0)
            rows = page * skp + (n % PAGE) * skt
            rows_v = page * svp + (n % PAGE) * svt
        k = tl.load(kc_ptr + (rows + hk * skh)[None, :] + offs_d[:, None], mask=ok[None, :], other=0.0)
        v = tl.load(vc_ptr + (rows_v + hk * svh)[:, None] + offs_d[None, :], mask=ok[:, None], other=0.0)
        acc, m_i, l_i = _attend(acc, m_i, l_i, q, k, v, qk_scale, 0, offs_n, n0, 0, hi, True, False, UPCAST)
    return acc, m_i, l_i


@triton.jit
def _finish(acc, m_i, l_i, o_ptr, lse_ptr, part_ptr, count_ptr, bk, split, SPLITS, o_off, r_ok,
            ROWS: tl.constexpr, HEAD_DIM: tl.constexpr, DIRECT: tl.constexpr):
    # One split: o normalised (DIRECT: the only split), else its partial (lse, o) stored and the last split to
    # arrive merges them (attention_decode's fused combine: barrier, release-acquire arrival, counter reset).
    offs_r = tl.arange(0, ROWS)
    offs_d = tl.arange(0, HEAD_DIM)
    o = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]  # l = 0: a split past a shorter sequence's end
    if DIRECT:
        tl.store(o_ptr + o_off, o.to(o_ptr.dtype.element_ty), mask=r_ok[:, None])
    else:
        slot = bk.to(tl.int64) * SPLITS + split
        tl.store(lse_ptr + slot * ROWS + offs_r,
                 tl.where(l_i > 0, m_i + tl.math.log2(tl.where(l_i > 0, l_i, 1.0)), float("-inf")))
        tl.store(part_ptr + (slot * ROWS + offs_r[:, None]) * HEAD_DIM + offs_d[None, :], o)
        tl.debug_barrier()
        arrived = tl.atomic_add(count_ptr + bk, 1, sem="acq_rel")
        if arrived == SPLITS - 1:
            _combine_rows(lse_ptr, part_ptr, o_ptr, bk, o_off, r_ok, SPLITS, ROWS, HEAD_DIM)
            tl.atomic_xchg(count_ptr + bk, 0)


@triton.jit
def _paged_decode(q_ptr, kc_ptr, vc_ptr, bt_ptr, len_ptr, o_ptr, lse_ptr, part_ptr, count_ptr, qk_scale,
                  HKV, GROUP, PAGE, CHUNK, SPLITS,
                  sqb, sqh, skp, skt, skh, svp, svt, svh, sbt, sob, soh,
                  ROWS: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr, UPCAST: tl.constexpr,
                  STATIC_PAGE: tl.constexpr, DIRECT: tl.constexpr):
    # Grid (batch x kv_heads, splits): the group's query heads as the rows of one tile, keys [split x CHUNK,
    # +CHUNK) of the sequence, read through its block table. STATIC_PAGE: 0, the page size PAGE a runtime
    # integer (paged_tiles); else the page size compiled in (paged_tiles_static).
    bk = tl.program_id(0)
    split = tl.program_id(1)
    b = bk // HKV
    hk = bk % HKV
    q, head, r_ok = _load_group(q_ptr, b, hk, sqb, sqh, GROUP, ROWS, HEAD_DIM)
    seq = tl.load(len_ptr + b)
    lo = split * CHUNK
    hi = tl.minimum(lo + CHUNK, seq)
    table = bt_ptr + b.to(tl.int64) * sbt
    m_i = tl.full([ROWS], -1.0e30, dtype=tl.float32)  # finite: a row with no key yet rescales by 2^0, not NaN
    l_i = tl.zeros([ROWS], dtype=tl.float32)
    acc = tl.zeros([ROWS, HEAD_DIM], dtype=tl.float32)
    if STATIC_PAGE:
        acc, m_i, l_i = paged_tiles_static(acc, m_i, l_i, q, kc_ptr, vc_ptr, table, lo, hi, hk, skp, skt, skh,
                                           svp, svt, svh, qk_scale, STATIC_PAGE, HEAD_DIM, BLOCK_N, UPCAST)
    else:
        acc, m_i, l_i = paged_tiles(acc, m_i, l_i, q, kc_ptr, vc_ptr, table, lo, hi, hk, PAGE, skp, skt, skh,
                                    svp, svt, svh, qk_scale, HEAD_DIM, BLOCK_N, UPCAST)
    o_off = b.to(tl.int64) * sob + head[:, None] * soh + tl.arange(0, HEAD_DIM)[None, :]
    _finish(acc, m_i, l_i, o_ptr, lse_ptr, part_ptr, count_ptr, bk, split, SPLITS, o_off, r_ok, ROWS, HEAD_DIM,
            DIRECT)


def _configs() -> list:
    if INTERPRET:  # one 16-key tile: the tests' pages of 4 and 8 span several pages a tile, of 16 and 32 one
        return [triton.Config({"BLOCK_N": 16}, num_warps=4, num_stages=1)]
    # attention_decode's tiles: 64-128 keys x d, 3-4 stages of K and V in flight per program.
    return [triton.Config({"BLOCK_N": bn}, num_warps=w, num_stages=st)
            for bn, w, st in ((64, 4, 3), (64, 4, 4), (128, 4, 3))]


_paged_decode_tuned = autotune(configs=_configs(),
                                      key=["CHUNK", "SPLITS", "ROWS", "HEAD_DIM", "PAGE", "STATIC_PAGE", "DIRECT"])(
    _paged_decode)


def rows_for(group: int) -> int:
    """Rows of the decode tile: the group's query heads, at least 16 (tl.dot's least)."""
    if group > 128:
        raise NotImplementedError(f"paged decode holds at most 128 query heads per KV head a tile; got {group}")
    return max(16, triton.next_power_of_2(group))


def pool_strides(k_cache: torch.Tensor, v_cache: torch.Tensor) -> tuple:
    """(page, token, KV head) strides of the K and V pools; the head dim must be unit-stride."""
    if k_cache.stride(-1) != 1 or v_cache.stride(-1) != 1:
        raise NotImplementedError("the pools' head dim must be unit-stride")
    return (*k_cache.stride()[:3], *v_cache.stride()[:3])


def paged_decode(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_table: torch.Tensor,
                 seq_lens: torch.Tensor, splits: int | None = 1, static: bool = False) -> torch.Tensor:
    """Decode attention over a paged cache. `splits`: 1 (each (batch, KV head) one program over its whole
    sequence), or None (split-KV: the count from batch, KV heads and SM count, as attention_decode's, the chunks
    whole pages); `static`: the page-size-specialised tile loop. Sequences may differ in length: the split count
    is set by the table's capacity (pages x page size), splits past a shorter sequence's end merge to nothing."""
    b, h, sq, d = q.shape
    _, page, hkv, dk = k_cache.shape
    if sq != 1 or dk != d or h % hkv:
        raise ValueError(f"q {tuple(q.shape)} against pool {tuple(k_cache.shape)}: one query token a sequence, "
                         "head_dim equal, heads a multiple of kv_heads")
    ac._check_head_dim(d)
    if static and page & (page - 1):
        raise NotImplementedError(f"the static tile loop takes power-of-two pages; got {page}")
    group = h // hkv
    rows = rows_for(group)
    capacity = block_table.shape[1] * page
    unit = max(ac.MIN_CHUNK, page)  # split chunks of whole pages (and of whole tiles)
    if splits is None:
        splits, chunk = ac.split_count(b, hkv, capacity, num_sms(q))
    else:
        chunk = math.ceil(capacity / splits)
    chunk = math.ceil(chunk / unit) * unit
    splits = math.ceil(capacity / chunk)
    o = torch.empty_like(q, memory_format=torch.contiguous_format)
    direct = splits == 1
    if direct:
        lse = part = count = o  # unused
    else:
        lse = torch.empty(b * hkv * splits * rows, device=q.device, dtype=torch.float32)
        part = torch.empty(b * hkv * splits * rows * d, device=q.device, dtype=torch.float32)
        count = ac._counters(b * hkv, q.device)
    strides = (*q.stride()[:2], *pool_strides(k_cache, v_cache), block_table.stride(0), *o.stride()[:2])
    _paged_decode_tuned[(b * hkv, splits)](q, k_cache, v_cache, block_table, seq_lens, o, lse, part, count,
                                           d**-0.5 * LOG2E, hkv, group, page, chunk, splits, *strides,
                                           ROWS=rows, HEAD_DIM=d, UPCAST=not q.is_cuda,
                                           STATIC_PAGE=page if static else 0, DIRECT=direct)
    return o


# --- variants 3-5 ----------------------------------------------------------------------------------


def triton_paged(q, k_cache, v_cache, block_table, seq_lens, k=None, v=None) -> torch.Tensor:
    """One program per (batch, KV head), the block table followed key by key: batch x KV heads programs."""
    return paged_decode(q, k_cache, v_cache, block_table, seq_lens, splits=1)


def triton_paged_split(q, k_cache, v_cache, block_table, seq_lens, k=None, v=None) -> torch.Tensor:
    """Split-KV over pages (whole pages a split), the fused combine: one launch."""
    return paged_decode(q, k_cache, v_cache, block_table, seq_lens, splits=None)


def triton_paged_static(q, k_cache, v_cache, block_table, seq_lens, k=None, v=None) -> torch.Tensor:
    """Split-KV over pages with the page size compiled in: one table load per page, tiles aligned to pages."""
    return paged_decode(q, k_cache, v_cache, block_table, seq_lens, splits=None, static=True)


# --- level 3: one decode step of a layer over the paged cache ---------------------------------------


def step_weights(b: int, h: int, hkv: int, d: int, dtype: torch.dtype, device: str,
                 generator: torch.Generator) -> dict:
    """One new token per sequence x [batch, 1, hidden] and the fused QKV and output weights (fan-in scaled)."""
    g = on_device(generator, device)
    hidden = h * d
    x = torch.randn(b, 1, hidden, generator=g, device=device)
    w_qkv = torch.randn(hidden, (h + 2 * hkv) * d, generator=g, device=device) * hidden**-0.5
    w_o = torch.randn(h * d, hidden, generator=g, device=device) * (h * d) ** -0.5
    return {"x": x.to(dtype), "w_qkv": w_qkv.to(dtype), "w_o": w_o.to(dtype), "heads": h}


def make_step_inputs(shape: dict, dtype: torch.dtype, device: str, generator: torch.Generator) -> dict:
    """The step's weights and new tokens, and a paged cache (pages shuffled) of seq_kv positions a sequence, the
    last of which the step fills."""
    b, h, hkv, length, d, page = (shape[k] for k in ("batch", "heads", "kv_heads", "seq_kv", "head_dim", "page_size"))
    cache = ac.make_qkv(b, 1, hkv, 1, length, d, dtype, device, generator)
    lens = torch.full((b,), length, dtype=torch.int32, device=device)
    return {**step_weights(b, h, hkv, d, dtype, device, generator), **paged(cache["k"], cache["v"], page, 3, generator),
            "seq_lens": lens}


def write_token(k_cache: torch.Tensor, v_cache: torch.Tensor, block_table: torch.Tensor, seq_lens: torch.Tensor,
                k: torch.Tensor, v: torch.Tensor) -> None:
    """Each sequence's new k, v [batch, kv_heads, d] into its last position's slot: the page from the block table,
    the slot within it (vLLM's reshape_and_cache), indices computed on the device."""
    page = k_cache.shape[1]
    pos = (seq_lens - 1).long()
    pages = block_table.gather(1, (pos // page)[:, None]).squeeze(1).long()
    k_cache[pages, pos % page] = k
    v_cache[pages, pos % page] = v


def paged_step(kernel, x: torch.Tensor, w_qkv: torch.Tensor, w_o: torch.Tensor, k_cache: torch.Tensor,
               v_cache: torch.Tensor, block_table: torch.Tensor, seq_lens: torch.Tensor, heads: int,
               **extra) -> torch.Tensor:
    """A layer's attention in one decode step over a paged cache: the QKV projection of the new token, its k and v
    written into their page slot, attention by `kernel` (`extra` passed on), the output projection (RoPE left
    out)."""
    b, _, hidden = x.shape
    hkv, d = k_cache.shape[2], k_cache.shape[3]
    q, k, v = (x @ w_qkv).split([heads * d, hkv * d, hkv * d], dim=-1)
    write_token(k_cache, v_cache, block_table, seq_lens, k.view(b, hkv, d), v.view(b, hkv, d))
    o = kernel(q=q.view(b, 1, heads, d).transpose(1, 2), k_cache=k_cache, v_cache=v_cache, block_table=block_table,
               seq_lens=seq_lens, **extra)  # [b, heads, 1, d]
    return o.transpose(1, 2).reshape(b, 1, heads * d) @ w_o
