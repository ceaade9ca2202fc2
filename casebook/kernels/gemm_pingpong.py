"""A ping-pong GEMM whose bias + GELU epilogue runs under the other tile's main loop (Hopper, Gluon).

The Triton TMA GEMM (gemm_common) pays its epilogue in series: after a tile's main loop, the same warps
add the bias, apply GELU and store, while the tensor cores wait. CUTLASS's answer on Hopper is
"ping-pong": two consumer warpgroups take a program's tiles in turn, fed by one producer warp.
- **Producer.** One warp issues TMA loads of A and B into a ring of STAGES shared-memory slots, in tile
  order.
- **Consumers.** Two 4-warp groups, each with its own 128 x 128 fp32 accumulator. Consumer 0 takes the
  program's tiles 0, 2, 4, ..., consumer 1 tiles 1, 3, 5, ...
- **Turns.** The two main loops alternate (the `turn` barriers, CUTLASS's order barrier). When one
  consumer's main loop ends, the other's starts, and the first adds the bias, applies GELU and stores
  its tile (TMA, from its own staging buffer) while the second computes.
Without the turns, a consumer would wait on a slot that the other's loads are still cycling through,
and an mbarrier's phase parity cannot tell a slot's 5th use from its 1st (the first H200 run crashed
that way: benchmarks/explore/pingpong_epilogue.py).

Triton's own tl.dot cannot express this: its automatic warp specialisation was measured slower on this
GEMM. Gluon, Triton's explicit-layout dialect, exposes the warps, barriers and wgmma directly. It is
experimental and renames things between releases; this module is written for Triton 3.6 (the H200
image's) and also lowers with 3.9 (the CPU machines'), through the aliases below.

Each program is persistent (one per SM) and walks its tiles in grouped order. 197 KB of shared memory:
4 stages of A and B (128 KB), two 32 KB staging buffers for C. Registers: 232 per consumer thread
(its accumulator alone is 128), 40 per producer thread.
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

from casebook.kernels import gelu_fit

# Triton 3.6 names these async_copy_global_to_shared / async_copy_shared_to_global; later releases
# async_load / async_store, and the old store name raises.
_tma_load = getattr(tma, "async_load", None) or tma.async_copy_global_to_shared
_tma_store = getattr(tma, "async_store", None) or tma.async_copy_shared_to_global

BLOCK_M, BLOCK_N, BLOCK_K, STAGES, GROUP_M = 128, 128, 64, 4, 8
NUM_WARPS, MAXNREG, CONSUMER_REGS, PRODUCER_REGS = 4, 168, 232, 40
GELU_FORMS = {"none": 0, "tanh": 1, "erf": 2}


@gluon.jit
def _tile_offsets(tile, M, N, BM: gl.constexpr, BN: gl.constexpr, GROUP: gl.constexpr):
    """Grouped order: GROUP row-blocks sweep the columns together, so B's tiles are reused from L2."""
    num_m = gl.cdiv(M, BM)
    num_n = gl.cdiv(N, BN)
    in_group = GROUP * num_n
    first_m = (tile // in_group) * GROUP
    size_m = gl.minimum(num_m - first_m, GROUP)
    pid_m = first_m + (tile % in_group) % size_m
    pid_n = (tile % in_group) // size_m
    return pid_m * BM, pid_n * BN


@gluon.jit
def _tanh(x):
    return gl.inline_asm_elementwise("tanh.approx.f32 $0, $1;", "=r,r", [x], dtype=gl.float32, is_pure=True,
                                     pack=1)


# The exact GELU's erfc fit, shared with the Triton kernels (gelu_fit says why it is short).
_P0, _P1, _P2, _P3, _P4 = (gl.constexpr(c) for c in gelu_fit.EXP2_FIT)
_HALF_LOG2E = gl.constexpr(gelu_fit.HALF_LOG2E)
_T_RSQRT2 = gl.constexpr(gelu_fit.T_RSQRT2)
_Q0, _Q1, _Q2, _Q3 = (gl.constexpr(c) for c in gelu_fit.EXP2_FIT_BF16)
_T_RSQRT2_BF16 = gl.constexpr(gelu_fit.T_RSQRT2_BF16)


@gluon.jit
def _ex2(x):
    return gl.inline_asm_elementwise("ex2.approx.ftz.f32 $0, $1;", "=r,r", [x], dtype=gl.float32, is_pure=True,
                                     pack=1)


@gluon.jit
def _rcp(x):
    return gl.inline_asm_elementwise("rcp.approx.ftz.f32 $0, $1;", "=r,r", [x], dtype=gl.float32, is_pure=True,
                                     pack=1)


@gluon.jit
def _gelu_erf(x, BF16: gl.constexpr):
    """x Phi(x) = max(x, 0) - |x| erfc(|x| / sqrt 2) / 2, straight-line: no cancellation on either side.
    BF16: the output rounds to bf16, and the degree-3 fit is exact enough for it."""
    a = gl.abs(x)
    if BF16:
        t = _rcp(1.0 + _T_RSQRT2_BF16 * a)  # z = |x| / sqrt 2, t = 1 / (1 + T_SCALE_BF16 z)
        p = t * _Q3 + _Q2
        p = p * t + _Q1
        p = p * t + _Q0  # log2(e) P(t) - 1
    else:
        t = _rcp(1.0 + _T_RSQRT2 * a)  # t = 1 / (1 + T_SCALE z)
        p = t * _P4 + _P3
        p = p * t + _P2
        p = p * t + _P1
        p = p * t + _P0
    e = _ex2(p - _HALF_LOG2E * x * x)  # erfc(z) / 2t = exp(P(t) - z^2) / 2, z^2 = x^2 / 2
    return gl.maximum(x, 0.0) - (a * t) * e


@gluon.jit
def _producer(a_desc, b_desc, a_bufs, b_bufs, ready, empty, M, N, K, GROUP: gl.constexpr):
    BM: gl.constexpr = a_desc.block_type.shape[0]
    BK: gl.constexpr = a_desc.block_type.shape[1]
    BN: gl.constexpr = b_desc.block_type.shape[1]
    NS: gl.constexpr = a_bufs.type.shape[0]
    num_tiles = gl.cdiv(M, BM) * gl.cdiv(N, BN)
    k_tiles = gl.cdiv(K, BK)
    it = 0
    for tile in range(gl.program_id(0), num_tiles, gl.num_programs(0)):
        off_m, off_n = _tile_offsets(tile, M, N, BM, BN, GROUP)
        for kk in range(k_tiles):
            s = it % NS
            # A slot starts empty: the first pass waits on the phase before the first.
            mbarrier.wait(empty.index(s), ((it // NS) & 1) ^ 1)
            mbarrier.expect(ready.index(s), a_desc.block_type.nbytes + b_desc.block_type.nbytes)
            _tma_load(a_desc, [off_m, kk * BK], ready.index(s), a_bufs.index(s))
            _tma_load(b_desc, [kk * BK, off_n], ready.index(s), b_bufs.index(s))
            it += 1


@gluon.jit
def _consumer(a_desc, b_desc, c_desc, a_bufs, b_bufs, c_bufs, ready, empty, turn, bias_ptr, M, N, K,
              WHICH: gl.constexpr, GELU_FORM: gl.constexpr, HAS_BIAS: gl.constexpr, GROUP: gl.constexpr):
    """This program's tiles WHICH, WHICH + 2, ...: the main loop in turn with the other consumer, then
    bias + GELU on the fp32 accumulator and a TMA store."""
    BM: gl.constexpr = c_desc.block_type.shape[0]
    BN: gl.constexpr = c_desc.block_type.shape[1]
    BK: gl.constexpr = a_desc.block_type.shape[1]
    NS: gl.constexpr = a_bufs.type.shape[0]
    mma_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                         instr_shape=[16, BN, 16])
    c_smem = c_bufs.index(WHICH)
    num_tiles = gl.cdiv(M, BM) * gl.cdiv(N, BN)
    k_tiles = gl.cdiv(K, BK)
    step = gl.num_programs(0)
    # Zeroed once: each tile's first wgmma overwrites it (use_acc=False), so no tile spends an
    # instruction per element clearing it.
    acc = gl.zeros((BM, BN), gl.float32, mma_layout)
    j = 0
    for tile in range(gl.program_id(0) + WHICH * step, num_tiles, 2 * step):
        off_m, off_n = _tile_offsets(tile, M, N, BM, BN, GROUP)
        base = (2 * j + WHICH) * k_tiles  # this tile's first slot use in the ring
        # Consumer 0's first turn is free (the phase before the first); after that each waits for the other.
        mbarrier.wait(turn.index(WHICH), (j & 1) ^ (1 - WHICH))
        for kk in range(k_tiles):
            it = base + kk
            s = it % NS
            mbarrier.wait(ready.index(s), (it // NS) & 1)
            acc = warpgroup_mma(a_bufs.index(s), b_bufs.index(s), acc, use_acc=kk > 0, is_async=True)
            # One wgmma stays in flight; the one before it is done, so its slot goes back.
            acc = warpgroup_mma_wait(num_outstanding=1, deps=(acc, ))
            mbarrier.arrive(empty.index((it + NS - 1) % NS), count=1, pred=kk > 0)
        mbarrier.arrive(turn.index(1 - WHICH), count=1)  # every load of this tile is consumed: the other's turn
        acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc, ))
        mbarrier.arrive(empty.index((base + k_tiles - 1) % NS), count=1)

        x = acc
        if HAS_BIAS:
            offs_n = off_n + gl.arange(0, BN, layout=gl.SliceLayout(0, mma_layout))
            bias = gl.load(bias_ptr + offs_n, mask=offs_n < N, other=0.0).to(gl.float32)
            x = x + gl.expand_dims(bias, 0)
        if GELU_FORM == 1:  # x/2 (1 + tanh(u)), u = x (c1 + c2 x^2): three FMUL, two FFMA and a tanh
            half = 0.5 * x
            x = half + half * _tanh(x * (0.7978845608028654 + 0.035677408136300125 * x * x))
        elif GELU_FORM == 2:
            x = _gelu_erf(x, c_desc.dtype == gl.bfloat16)
        out = x.to(c_desc.dtype)
        tma.store_wait(pendings=0)  # this consumer's previous tile has left its staging buffer
        c_smem.store(out)
        fence_async_shared()
        _tma_store(c_desc, [off_m, off_n], c_smem)
        j += 1
    tma.store_wait(pendings=0)


@gluon.jit
def pingpong_kernel(a_desc, b_desc, c_desc, bias_ptr, M, N, K, GELU_FORM: gl.constexpr, HAS_BIAS: gl.constexpr,
                    STAGES_: gl.constexpr, GROUP: gl.constexpr, CONSUMER_REGS_: gl.constexpr,
                    PRODUCER_REGS_: gl.constexpr):
    a_bufs = gl.allocate_shared_memory(a_desc.dtype, [STAGES_] + a_desc.block_type.shape, a_desc.layout)
    b_bufs = gl.allocate_shared_memory(b_desc.dtype, [STAGES_] + b_desc.block_type.shape, b_desc.layout)
    c_bufs = gl.allocate_shared_memory(c_desc.dtype, [2] + c_desc.block_type.shape, c_desc.layout)
    ready = gl.allocate_shared_memory(gl.int64, [STAGES_, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES_, 1], mbarrier.MBarrierLayout())
    turn = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(STAGES_):
        mbarrier.init(ready.index(i), count=1)
        mbarrier.init(empty.index(i), count=1)
    for i in gl.static_range(2):
        mbarrier.init(turn.index(i), count=1)
    gl.warp_specialize([
        (_consumer, (a_desc, b_desc, c_desc, a_bufs, b_bufs, c_bufs, ready, empty, turn, bias_ptr, M, N, K, 0,
                     GELU_FORM, HAS_BIAS, GROUP)),
        (_consumer, (a_desc, b_desc, c_desc, a_bufs, b_bufs, c_bufs, ready, empty, turn, bias_ptr, M, N, K, 1,
                     GELU_FORM, HAS_BIAS, GROUP)),
        (_producer, (a_desc, b_desc, a_bufs, b_bufs, ready, empty, M, N, K, GROUP)),
    ], [4, 1], [CONSUMER_REGS_, PRODUCER_REGS_])


def layouts(dtype) -> tuple:
    """Shared-memory layouts of the A, B and C blocks (128-byte swizzle), for a gl dtype."""
    return (gl.NVMMASharedLayout.get_default_for([BLOCK_M, BLOCK_K], dtype),
            gl.NVMMASharedLayout.get_default_for([BLOCK_K, BLOCK_N], dtype),
            gl.NVMMASharedLayout.get_default_for([BLOCK_M, BLOCK_N], dtype))


def unsupported(a, b) -> str | None:
    """Why this kernel cannot run on these operands, or None: it needs sm_90 (wgmma exists only there),
    fp16 or bf16, row-major operands and 16-byte-aligned rows (TMA)."""
    import torch

    if not (a.is_cuda and b.is_cuda) or torch.cuda.get_device_capability(a.device) != (9, 0):
        return "the ping-pong kernel needs a Hopper (sm_90) GPU: wgmma exists only there"
    if a.dtype not in (torch.float16, torch.bfloat16) or b.dtype != a.dtype:
        return f"the ping-pong kernel takes fp16 or bf16 operands, got {a.dtype} and {b.dtype}"
    if a.stride(-1) != 1 or b.stride(-1) != 1 or (a.shape[1] * a.element_size()) % 16 \
            or (b.shape[1] * b.element_size()) % 16:
        return "TMA needs row-major operands whose rows are a multiple of 16 bytes"
    return None


def matmul(a, b, bias=None, gelu: str = "none"):
    """C = [gelu](A @ B [+ bias]) with A [M, K], B [K, N] row-major, bias [N]; C has A's dtype.
    gelu: "none", "tanh" (the tanh form) or "erf" (exact to 16-bit precision, through a fitted erfc)."""
    import torch
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    if gelu not in GELU_FORMS:
        raise ValueError(f"gelu must be one of {sorted(GELU_FORMS)}, got {gelu!r}")
    if (why := unsupported(a, b)) is not None:
        raise RuntimeError(why)
    (m, k), n = a.shape, b.shape[1]
    c = torch.empty(m, n, device=a.device, dtype=a.dtype)
    la, lb, lc = layouts(gl.float16 if a.dtype == torch.float16 else gl.bfloat16)
    a_desc = TensorDescriptor.from_tensor(a, [BLOCK_M, BLOCK_K], la)
    b_desc = TensorDescriptor.from_tensor(b, [BLOCK_K, BLOCK_N], lb)
    c_desc = TensorDescriptor.from_tensor(c, [BLOCK_M, BLOCK_N], lc)
    tiles = triton.cdiv(m, BLOCK_M) * triton.cdiv(n, BLOCK_N)
    grid = (min(torch.cuda.get_device_properties(a.device).multi_processor_count, tiles), )
    pingpong_kernel[grid](a_desc, b_desc, c_desc, c if bias is None else bias, m, n, k, GELU_FORMS[gelu],
                          bias is not None, STAGES, GROUP_M, CONSUMER_REGS, PRODUCER_REGS, num_warps=NUM_WARPS,
                          maxnreg=MAXNREG)
    return c


def compile_for_sm90(gelu: str = "none", has_bias: bool = True, dtype: str = "bf16"):
    """Lower the kernel ahead of time for sm_90a, on any machine (no GPU needed): the compiled kernel,
    whose `asm["ptx"]` and `metadata.shared` can be inspected."""
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource

    la, lb, lc = layouts(getattr(gl, {"bf16": "bfloat16", "fp16": "float16"}[dtype]))
    signature = {"a_desc": f"tensordesc<{dtype}[{BLOCK_M}, {BLOCK_K}],{la!r}>",
                 "b_desc": f"tensordesc<{dtype}[{BLOCK_K}, {BLOCK_N}],{lb!r}>",
                 "c_desc": f"tensordesc<{dtype}[{BLOCK_M}, {BLOCK_N}],{lc!r}>",
                 "bias_ptr": f"*{dtype}", "M": "i32", "N": "i32", "K": "i32"}
    constexprs = {"GELU_FORM": GELU_FORMS[gelu], "HAS_BIAS": has_bias, "STAGES_": STAGES, "GROUP": GROUP_M,
                  "CONSUMER_REGS_": CONSUMER_REGS, "PRODUCER_REGS_": PRODUCER_REGS}
    names = list(signature) + list(constexprs)
    signature.update(dict.fromkeys(constexprs, "constexpr"))
    src = GluonASTSource(pingpong_kernel, signature, {(names.index(k), ): v for k, v in constexprs.items()})
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": NUM_WARPS,
                                                                           "maxnreg": MAXNREG})
