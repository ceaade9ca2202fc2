"""Is the TMA transpose held by its turn: one 2-byte shared store a thread per element?

Not a casebook run. tma_boxes.py (run on an H100) refuted its hypotheses A (a larger box) and B (a pipelined
persistent loop) and left C: the turn. Lowered for sm_90a, the case's `tma` kernel reads its box from shared memory
in 16-byte vectors (`ld.shared.v4.b32`, 4 a thread) but, once `tl.trans` has turned the registers, writes the box
for the TMA store one element at a time (`st.shared.b16`, 32 a thread): each thread holds 8 consecutive columns of
one row, which after the turn are 8 rows of one column. Nsight Compute on the H100 counted 8.4 M shared-store
instructions and bank conflicts under 8% of them: the instructions, not the conflicts. Against C: tma_boxes.py's
persistent kernels store 16 bytes a thread (1 M instructions) and were slower still, so C is tested here with
nothing else changed: one box a program, as the case's kernel.

Plain Triton chooses its register layouts itself and keeps that one (reshapes into 8 x 8 blocks lower the same).
Gluon, Triton's explicit-layout dialect, lets a thread hold an 8 x 8 block: read as eight 16-byte rows, turned in
registers, written as eight 16-byte rows (`st.shared.v4.b32`, 8 a thread, lowered here without a GPU: a quarter
of the shared-store instructions per element, with 128-byte swizzling a warp's store touching four 128-byte rows,
the fewest its 512 bytes can).

Hypothesis C, its prediction written before the run: the turn's shared stores are the limit. Then the Gluon turn,
with everything else as the case's kernel (one box a program, loaded, turned, stored by the TMA), reaches the
tuned register-tile kernel: on an H200 3.9-4.1 TB/s in bf16 (the case's kernel 3.21, tiled_tuned 3.98), on an
H100 within 5% of its copy (the case's kernel 94% of tiled_tuned there). In fp32 (a thread's 8 x 8 block of
4-byte elements is read and written in 16-byte halves) it moves less, from 3.83 to 3.9-4.0 on an H200. If the bf16
rate stays within 10% of the case's kernel, C is refuted too, and the TMA store's own path (a box a program, its
wait) is next.

    python3 benchmarks/explore/transpose/tma_turn.py [ROWS COLS]   (GPU: each output checked, then timed)
    python3 benchmarks/explore/transpose/tma_turn.py --lower       (no GPU: each kernel lowered for sm_90a, its
                                                                    shared loads and stores counted)
    ncu --clock-control none --metrics smsp__inst_executed_op_shared_st.sum,\\
l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_st.sum,dram__bytes_read.sum,dram__bytes_write.sum \\
        python3 benchmarks/explore/transpose/tma_turn.py --once
"""

from __future__ import annotations

import re
import sys
from collections import Counter

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, mbarrier, tma

from casebook.kernels import transpose as m

# Triton 3.6 (the GPU image's) names these async_copy_global_to_shared / async_copy_shared_to_global (gemm_pingpong)
_tma_load = getattr(tma, "async_load", None) or tma.async_copy_global_to_shared
_tma_store = getattr(tma, "async_store", None) or tma.async_copy_shared_to_global

# (box rows, box cols, warps, a thread's block, threads of a warp, warps): each thread an 8 x 8 block (64 and 128
# rows), and two halves of it for comparison: 4 x 8 (16-byte reads, 8-byte writes) and 8 x 4 (the reverse)
TURNS = ((64, 64, 2, [8, 8], [4, 8], [2, 1]),
         (128, 64, 4, [8, 8], [4, 8], [4, 1]),
         (64, 64, 4, [4, 8], [8, 4], [2, 2]),
         (64, 64, 4, [8, 4], [4, 8], [2, 2]))


@gluon.jit
def _turn(x_desc, y_desc, R, C, BM: gl.constexpr, BN: gl.constexpr, TILE: gl.constexpr):
    # The case's kernel with its turn made explicit: the box in by the TMA, read into TILE (each thread a block of
    # rows x columns), turned in registers (a permute is a relabelling: the block's columns become rows), written
    # to a second buffer as TILE turned, and out by the TMA.
    n_c = gl.cdiv(C, BN)
    r0 = (gl.program_id(0) // n_c) * BM
    c0 = (gl.program_id(0) % n_c) * BN
    src = gl.allocate_shared_memory(x_desc.dtype, x_desc.block_type.shape, x_desc.layout)
    dst = gl.allocate_shared_memory(y_desc.dtype, y_desc.block_type.shape, y_desc.layout)
    bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    mbarrier.init(bar, count=1)
    mbarrier.expect(bar, x_desc.block_type.nbytes)
    _tma_load(x_desc, [r0, c0], bar, src)
    mbarrier.wait(bar, 0)
    tile = src.load(TILE)
    dst.store(gl.permute(tile, [1, 0]))
    fence_async_shared()
    _tma_store(y_desc, [c0, r0], dst)
    tma.store_wait(pendings=0)
    mbarrier.invalidate(bar)


def _layouts(bm, bn, dtype, spt, tpw, wpc):
    shared = gl.NVMMASharedLayout.get_default_for
    return shared([bm, bn], dtype), shared([bn, bm], dtype), gl.BlockedLayout(spt, tpw, wpc, [1, 0])


def turn(x, bm, bn, warps, spt, tpw, wpc):
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    b, r, c, _ = x.shape  # one matrix (b == 1): 2-D boxes, as the exploration's shapes are
    y = torch.empty(b, c, r, 1, dtype=x.dtype, device=x.device)
    gdtype = {torch.bfloat16: gl.bfloat16, torch.float32: gl.float32}[x.dtype]
    lx, ly, tile = _layouts(bm, bn, gdtype, spt, tpw, wpc)
    xd = TensorDescriptor.from_tensor(x.view(r, c), [bm, bn], lx)
    yd = TensorDescriptor.from_tensor(y.view(c, r), [bn, bm], ly)
    _turn[(triton.cdiv(r, bm) * triton.cdiv(c, bn), )](xd, yd, r, c, BM=bm, BN=bn, TILE=tile, num_warps=warps)
    return y


def lower() -> None:
    """Each turn lowered for sm_90a without a GPU: its registers and its shared loads and stores by width."""
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource

    sys.path.insert(0, "benchmarks/explore")
    from aot import report

    for bm, bn, warps, spt, tpw, wpc in TURNS:
        for name, dtype in (("bf16", gl.bfloat16), ("fp32", gl.float32)):
            lx, ly, tile = _layouts(bm, bn, dtype, spt, tpw, wpc)
            sig = {"x_desc": f"tensordesc<{name}[{bm},{bn}],{lx!r}>", "y_desc": f"tensordesc<{name}[{bn},{bm}],{ly!r}>",
                   "R": "i32", "C": "i32", "BM": "constexpr", "BN": "constexpr", "TILE": "constexpr"}
            names = list(sig)
            src = GluonASTSource(_turn, sig, {(names.index("BM"),): bm, (names.index("BN"),): bn,
                                              (names.index("TILE"),): tile})
            k = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": warps})
            ops = Counter(re.findall(r"(?:st|ld)\.shared[.\w]*", k.asm["ptx"]))
            print(f"{bm}x{bn} {name} warps={warps} block={spt}: {report(k)}; {dict(ops)}")


def _kernels(x) -> list:
    out = [("tiled_tuned", lambda: m.tiled_tuned(x)), ("tma (the case's, 64x64, 4 warps)", lambda: m.tma(x))]
    for t in TURNS:
        bm, bn, warps, spt = t[:4]
        out.append((f"gluon turn {bm}x{bn} warps={warps} block={spt[0]}x{spt[1]}", lambda t=t: turn(x, *t)))
    # the case kernel's edges: boxes clipped at both (a quarter of the matrix, less a few rows and columns)
    odd = x[:, : x.shape[1] // 4 + 24, : x.shape[2] // 4 + 40].contiguous()
    ok = all(torch.equal(turn(odd, *t), odd.transpose(1, 2).contiguous()) for t in TURNS)
    print(f"  clipped boxes ({odd.shape[1]} x {odd.shape[2]}): {'exact' if ok else 'WRONG'}")
    return out


def main() -> None:
    if "--lower" in sys.argv:
        return lower()
    from tma_boxes import sweep  # this folder's: run as a script, it is on the path

    sweep(_kernels, width=40)


if __name__ == "__main__":
    main()
