"""The attention forward on FlashAttention-3's recipe for Hopper, in Gluon: a producer warp, two consumer
warpgroups in ping-pong.

The Triton flash kernels (attention_common) stop at 447-490 TFLOP/s on an H200 where cuDNN's reaches
608-677: one warpgroup per tile does everything in series, so while it runs the softmax (exp2, row max and
sum: the SFU and ALU, not the tensor cores) its wgmma units idle, and its loads are whatever the pipeliner
made of them. FA3's answer, written out here:
- **Producer.** One warp loads the program's two 64-row Q tiles once, then K and V tiles by TMA into rings
  of STAGES slots, K and V on barriers of their own: a K slot is free once both consumers' S = Q K^T is done,
  a V slot only once their P V is, one tile later.
- **Consumers.** Two 4-warp groups, each with 64 of the program's 128 query rows, reading the same K and V
  tiles. Each tile's turn on the tensor cores: wait for the turn, issue S_j = Q K_j^T and O += P_(j-1)
  V_(j-1) (asynchronous wgmma, P from registers), hand the turn over, then run the softmax of S_j while the
  other group's GEMMs run: the two groups' softmaxes hide under each other's GEMMs (ping-pong, CUTLASS's
  order barrier).
- **OVERLAP** (FA3's intra-warpgroup overlap): the softmax of S_j waits only for S_j, while this group's own
  P_(j-1) V_(j-1) is still running; the accumulator's rescale waits for it.
The online softmax is the Triton kernels' (base 2, finite running max, so a masked row never makes NaN). The
output leaves through the consumer's own Q buffer by TMA.

Shapes: q [B, H, S_q, d], k and v [B, H_kv, S_kv, d], contiguous; d 64 or 128; S_q and S_kv multiples of 128
(the tiles are 2-D TMA boxes over [rows, d] views, so a box must not cross into the next head); causal with
the queries at the end of the keys. Gluon has no interpreter: the kernel runs on sm_90 alone, and is checked
here by lowering it for sm_90a (`compile_for_sm90`). Written for Triton 3.6 (the H200 image's), lowering with
3.9 as well, through gluon_hopper's aliases.
"""

from __future__ import annotations

import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    tma,
    warpgroup_mma,
    warpgroup_mma_wait,
)

from casebook.kernels.gluon_hopper import tma_load as _tma_load
from casebook.kernels.gluon_hopper import tma_store as _tma_store

ROWS = 64  # query rows a consumer warpgroup owns: wgmma's M for 4 warps
BLOCK_M = 2 * ROWS  # a program's query rows
BLOCK_N = 128  # keys a tile
STAGES = 2  # K and V tiles in flight each (the exploration times 3 as well)
NUM_WARPS, MAXNREG, CONSUMER_REGS, PRODUCER_REGS = 4, 168, 232, 40
LOG2E = 1.4426950408889634
HEAD_DIMS = (64, 128)


@gluon.jit
def _program(SQ, SKV, H, HKV, CAUSAL: gl.constexpr, BM: gl.constexpr, BN: gl.constexpr):
    """This program's query block, its Q and K/V rows in the 2-D views, and how many K/V tiles it reads."""
    num_m = SQ // BM
    start_m = num_m - 1 - gl.program_id(0) if CAUSAL else gl.program_id(0)  # causal: the longest first
    bh = gl.program_id(1)
    b = bh // H
    h = bh % H
    hk = h // (H // HKV)
    q_row = bh * SQ + start_m * BM
    kv_row = (b * HKV + hk) * SKV
    if CAUSAL:
        hi = gl.minimum(SKV, SKV - SQ + (start_m + 1) * BM)
    else:
        hi = SKV
    return start_m, q_row, kv_row, hi // BN


@gluon.jit
def _producer(q_desc, k_desc, v_desc, q_bufs, k_bufs, v_bufs, q_ready, k_ready, v_ready, k_empty, v_empty,
              SQ, SKV, H, HKV, CAUSAL: gl.constexpr):
    RM: gl.constexpr = q_desc.block_type.shape[0]
    BN: gl.constexpr = k_desc.block_type.shape[0]
    NS: gl.constexpr = k_bufs.type.shape[0]
    start_m, q_row, kv_row, n_tiles = _program(SQ, SKV, H, HKV, CAUSAL, 2 * RM, BN)
    mbarrier.expect(q_ready, 2 * q_desc.block_type.nbytes)
    _tma_load(q_desc, [q_row, 0], q_ready, q_bufs.index(0))
    _tma_load(q_desc, [q_row + RM, 0], q_ready, q_bufs.index(1))
    for j in range(n_tiles):
        s = j % NS
        free = ((j // NS) & 1) ^ 1  # a slot starts empty: the first pass waits on the phase before the first
        mbarrier.wait(k_empty.index(s), free)
        mbarrier.expect(k_ready.index(s), k_desc.block_type.nbytes)
        _tma_load(k_desc, [kv_row + j * BN, 0], k_ready.index(s), k_bufs.index(s))
        mbarrier.wait(v_empty.index(s), free)
        mbarrier.expect(v_ready.index(s), v_desc.block_type.nbytes)
        _tma_load(v_desc, [kv_row + j * BN, 0], v_ready.index(s), v_bufs.index(s))


@gluon.jit
def _softmax(s, m_i, l_i, qk_scale, q0, n0, off, CAUSAL: gl.constexpr, s_layout: gl.constexpr):
    """One tile of the online softmax, base 2: the scores masked where a key is past the row's position; the
    running max (of the scaled scores) and sum updated; p (fp32) and the accumulator's factor. The max is taken
    of the raw scores (the scale is positive), so each p is one FFMA and an ex2: s * scale - m."""
    RM: gl.constexpr = s.type.shape[0]
    BN: gl.constexpr = s.type.shape[1]
    if CAUSAL:
        if n0 + BN - 1 > q0 + off:  # the tile reaches past this group's first row: the diagonal
            rows = q0 + off + gl.arange(0, RM, layout=gl.SliceLayout(1, s_layout))
            cols = n0 + gl.arange(0, BN, layout=gl.SliceLayout(0, s_layout))
            s = gl.where(gl.expand_dims(cols, 0) <= gl.expand_dims(rows, 1), s, -float("inf"))
    m_new = gl.maximum(m_i, gl.max(s, axis=1) * qk_scale)
    p = gl.exp2(s * qk_scale - gl.expand_dims(m_new, 1))
    alpha = gl.exp2(m_i - m_new)
    l_i = l_i * alpha + gl.sum(p, axis=1)
    return p, alpha, m_new, l_i


@gluon.jit
def _consumer(o_desc, q_bufs, k_bufs, v_bufs, q_ready, k_ready, v_ready, k_empty, v_empty, turn, qk_scale,
              SQ, SKV, H, HKV, WHICH: gl.constexpr, CAUSAL: gl.constexpr, OVERLAP: gl.constexpr):
    RM: gl.constexpr = o_desc.block_type.shape[0]
    D: gl.constexpr = o_desc.block_type.shape[1]
    BN: gl.constexpr = k_bufs.type.shape[1]
    NS: gl.constexpr = k_bufs.type.shape[0]
    dtype: gl.constexpr = o_desc.dtype
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                       instr_shape=[16, BN, 16])
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                       instr_shape=[16, D, 16])
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
    row_s: gl.constexpr = gl.SliceLayout(1, s_layout)
    row_o: gl.constexpr = gl.SliceLayout(1, o_layout)
    start_m, q_row, kv_row, n_tiles = _program(SQ, SKV, H, HKV, CAUSAL, 2 * RM, BN)
    q0 = start_m * 2 * RM + WHICH * RM  # this group's first query row
    off = SKV - SQ  # query i sits at key position off + i
    q_smem = q_bufs.index(WHICH)
    m_i = gl.full([RM], -1.0e30, gl.float32, row_s)
    l_i = gl.zeros([RM], gl.float32, row_s)
    acc = gl.zeros([RM, D], gl.float32, o_layout)
    s = gl.zeros([RM, BN], gl.float32, s_layout)
    mbarrier.wait(q_ready, 0)

    # Tile 0: S alone (there is no P V before it).
    mbarrier.wait(turn.index(WHICH), WHICH ^ 1)  # group 0's first turn is free; group 1 waits for it
    mbarrier.wait(k_ready.index(0), 0)
    s = warpgroup_mma(q_smem, k_bufs.index(0).permute((1, 0)), s, use_acc=False, is_async=True)
    mbarrier.arrive(turn.index(1 - WHICH), count=1)
    s = warpgroup_mma_wait(num_outstanding=0, deps=(s, ))
    mbarrier.arrive(k_empty.index(0), count=1)
    p, alpha, m_i, l_i = _softmax(s, m_i, l_i, qk_scale, q0, 0, off, CAUSAL, s_layout)
    p_op = gl.convert_layout(p.to(dtype), p_layout)

    for j in range(1, n_tiles):
        sj = j % NS
        sp = (j - 1) % NS
        mbarrier.wait(turn.index(WHICH), (j & 1) ^ (1 - WHICH))
        mbarrier.wait(k_ready.index(sj), (j // NS) & 1)
        s = warpgroup_mma(q_smem, k_bufs.index(sj).permute((1, 0)), s, use_acc=False, is_async=True)
        mbarrier.wait(v_ready.index(sp), ((j - 1) // NS) & 1)
        acc = warpgroup_mma(p_op, v_bufs.index(sp), acc, is_async=True)
        mbarrier.arrive(turn.index(1 - WHICH), count=1)  # both GEMMs issued: the other group's turn
        if OVERLAP:  # S_j is done when one wgmma (this P V) is left in flight
            s = warpgroup_mma_wait(num_outstanding=1, deps=(s, ))
            mbarrier.arrive(k_empty.index(sj), count=1)
            p, alpha, m_i, l_i = _softmax(s, m_i, l_i, qk_scale, q0, j * BN, off, CAUSAL, s_layout)
            acc, p_op = warpgroup_mma_wait(num_outstanding=0, deps=(acc, p_op))
        else:
            s, acc, p_op = warpgroup_mma_wait(num_outstanding=0, deps=(s, acc, p_op))
            mbarrier.arrive(k_empty.index(sj), count=1)
            p, alpha, m_i, l_i = _softmax(s, m_i, l_i, qk_scale, q0, j * BN, off, CAUSAL, s_layout)
        mbarrier.arrive(v_empty.index(sp), count=1)
        acc = acc * gl.expand_dims(gl.convert_layout(alpha, row_o), 1)
        p_op = gl.convert_layout(p.to(dtype), p_layout)

    # The last tile's P V, then the output through this group's Q buffer (its last wgmma read is done).
    last = n_tiles - 1
    mbarrier.wait(turn.index(WHICH), (n_tiles & 1) ^ (1 - WHICH))
    mbarrier.wait(v_ready.index(last % NS), (last // NS) & 1)
    acc = warpgroup_mma(p_op, v_bufs.index(last % NS), acc, is_async=True)
    mbarrier.arrive(turn.index(1 - WHICH), count=1)
    acc, p_op = warpgroup_mma_wait(num_outstanding=0, deps=(acc, p_op))
    mbarrier.arrive(v_empty.index(last % NS), count=1)
    o = acc * gl.expand_dims(gl.convert_layout(1.0 / l_i, row_o), 1)  # a division a row, not an element
    q_smem.store(o.to(dtype))
    fence_async_shared()
    _tma_store(o_desc, [q_row + WHICH * RM, 0], q_smem)
    tma.store_wait(pendings=0)


@gluon.jit
def fa3_kernel(q_desc, k_desc, v_desc, o_desc, qk_scale, SQ, SKV, H, HKV, CAUSAL: gl.constexpr,
               OVERLAP: gl.constexpr, STAGES_: gl.constexpr, CONSUMER_REGS_: gl.constexpr,
               PRODUCER_REGS_: gl.constexpr):
    q_bufs = gl.allocate_shared_memory(q_desc.dtype, [2] + q_desc.block_type.shape, q_desc.layout)
    k_bufs = gl.allocate_shared_memory(k_desc.dtype, [STAGES_] + k_desc.block_type.shape, k_desc.layout)
    v_bufs = gl.allocate_shared_memory(v_desc.dtype, [STAGES_] + v_desc.block_type.shape, v_desc.layout)
    q_ready = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    k_ready = gl.allocate_shared_memory(gl.int64, [STAGES_, 1], mbarrier.MBarrierLayout())
    v_ready = gl.allocate_shared_memory(gl.int64, [STAGES_, 1], mbarrier.MBarrierLayout())
    k_empty = gl.allocate_shared_memory(gl.int64, [STAGES_, 1], mbarrier.MBarrierLayout())
    v_empty = gl.allocate_shared_memory(gl.int64, [STAGES_, 1], mbarrier.MBarrierLayout())
    turn = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    mbarrier.init(q_ready, count=1)
    for i in gl.static_range(STAGES_):
        mbarrier.init(k_ready.index(i), count=1)
        mbarrier.init(v_ready.index(i), count=1)
        mbarrier.init(k_empty.index(i), count=2)  # both groups read every tile
        mbarrier.init(v_empty.index(i), count=2)
    for i in gl.static_range(2):
        mbarrier.init(turn.index(i), count=1)
    gl.warp_specialize([
        (_consumer, (o_desc, q_bufs, k_bufs, v_bufs, q_ready, k_ready, v_ready, k_empty, v_empty, turn, qk_scale,
                     SQ, SKV, H, HKV, 0, CAUSAL, OVERLAP)),
        (_consumer, (o_desc, q_bufs, k_bufs, v_bufs, q_ready, k_ready, v_ready, k_empty, v_empty, turn, qk_scale,
                     SQ, SKV, H, HKV, 1, CAUSAL, OVERLAP)),
        (_producer, (q_desc, k_desc, v_desc, q_bufs, k_bufs, v_bufs, q_ready, k_ready, v_ready, k_empty, v_empty,
                     SQ, SKV, H, HKV, CAUSAL)),
    ], [4, 1], [CONSUMER_REGS_, PRODUCER_REGS_])


def layouts(dtype, head_dim: int) -> tuple:
    """Shared-memory layouts of the Q (and O) tile and the K and V tiles, for a gl dtype."""
    return (gl.NVMMASharedLayout.get_default_for([ROWS, head_dim], dtype),
            gl.NVMMASharedLayout.get_default_for([BLOCK_N, head_dim], dtype))


def unsupported(q, k, v, causal: bool) -> str | None:
    """Why this kernel cannot run on these operands, or None."""
    import torch

    if not q.is_cuda or torch.cuda.get_device_capability(q.device) != (9, 0):
        return "the FA3-style kernel needs a Hopper (sm_90) GPU: wgmma and setmaxnreg exist only there"
    if q.dtype not in (torch.float16, torch.bfloat16) or k.dtype != q.dtype or v.dtype != q.dtype:
        return f"the FA3-style kernel takes fp16 or bf16, got {q.dtype}"
    from casebook.kernels.attention_common import dims

    try:
        _, _, _, sq, skv, d = dims(q, k)
    except ValueError as e:
        return str(e)
    if v.shape != k.shape:
        return f"k {tuple(k.shape)} and v {tuple(v.shape)}: one shape"
    if d not in HEAD_DIMS:
        return f"the FA3-style kernel takes head_dim {HEAD_DIMS}, got {d}"
    if sq % BLOCK_M or skv % BLOCK_N:
        return (f"the FA3-style kernel takes sequences in whole tiles ({BLOCK_M} queries, {BLOCK_N} keys), got "
                f"{sq} x {skv}")
    if causal and sq > skv:
        return f"causal with seq_q {sq} > seq_kv {skv}: the first queries would see no key"
    if not all(t.is_contiguous() for t in (q, k, v)):
        return "the FA3-style kernel takes contiguous q, k and v"
    return None


def forward(q, k, v, causal: bool, overlap: bool = True, stages: int = STAGES):
    """o = softmax(q k^T / sqrt(d) [causal]) v, [B, H, S_q, d] in q's dtype. `stages`: K and V tiles in flight
    (3 at head_dim 128 is 224 KB of shared memory, of the 227 a block may have)."""
    import torch
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    if (why := unsupported(q, k, v, causal)) is not None:
        raise NotImplementedError(why)
    (b, h, sq, d), (_, hkv, skv, _) = q.shape, k.shape
    o = torch.empty_like(q)
    lq, lkv = layouts(gl.float16 if q.dtype == torch.float16 else gl.bfloat16, d)
    q_desc = TensorDescriptor.from_tensor(q.view(b * h * sq, d), [ROWS, d], lq)
    k_desc = TensorDescriptor.from_tensor(k.view(b * hkv * skv, d), [BLOCK_N, d], lkv)
    v_desc = TensorDescriptor.from_tensor(v.view(b * hkv * skv, d), [BLOCK_N, d], lkv)
    o_desc = TensorDescriptor.from_tensor(o.view(b * h * sq, d), [ROWS, d], lq)
    fa3_kernel[(sq // BLOCK_M, b * h)](q_desc, k_desc, v_desc, o_desc, d**-0.5 * LOG2E, sq, skv, h, hkv, causal,
                                       overlap, stages, CONSUMER_REGS, PRODUCER_REGS, num_warps=NUM_WARPS,
                                       maxnreg=MAXNREG)
    return o


def compile_for_sm90(causal: bool = True, head_dim: int = 128, dtype: str = "bf16", overlap: bool = True,
                     stages: int = STAGES):
    """Lower the kernel ahead of time for sm_90a, on any machine (no GPU needed): the compiled kernel, whose
    `asm` (TTGIR, PTX, cubin) and `metadata.shared` can be inspected."""
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource

    lq, lkv = layouts(getattr(gl, {"bf16": "bfloat16", "fp16": "float16"}[dtype]), head_dim)
    signature = {"q_desc": f"tensordesc<{dtype}[{ROWS}, {head_dim}],{lq!r}>",
                 "k_desc": f"tensordesc<{dtype}[{BLOCK_N}, {head_dim}],{lkv!r}>",
                 "v_desc": f"tensordesc<{dtype}[{BLOCK_N}, {head_dim}],{lkv!r}>",
                 "o_desc": f"tensordesc<{dtype}[{ROWS}, {head_dim}],{lq!r}>",
                 "qk_scale": "fp32", "SQ": "i32", "SKV": "i32", "H": "i32", "HKV": "i32"}
    constexprs = {"CAUSAL": causal, "OVERLAP": overlap, "STAGES_": stages, "CONSUMER_REGS_": CONSUMER_REGS,
                  "PRODUCER_REGS_": PRODUCER_REGS}
    names = list(signature) + list(constexprs)
    signature.update(dict.fromkeys(constexprs, "constexpr"))
    src = GluonASTSource(fa3_kernel, signature, {(names.index(k), ): v for k, v in constexprs.items()})
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": NUM_WARPS,
                                                                           "maxnreg": MAXNREG})
