"""What holds the TMA transpose at 3.2 TB/s where the tuned register-tile kernel reaches 4.0 (16384 x 16384 bf16)?

Not a casebook run. On the H200 the case's `tma` rung (one 64 x 64 box a program, 4 warps, loaded, turned on chip,
stored) ran 334 us, 3.21 TB/s, against `tiled_tuned`'s 269 us, 3.99, and the copy's 260 us, 4.13, every rung moving
the model's 1,074 MB (Nsight Compute, notes/transpose.md). In fp32 the gap was 5%, in bf16 24%: the bf16 box is half
the bytes. Each program waits for its one load before it turns and stores, so a program keeps one box in flight, and
the SM's shared memory (228 KB) caps how many programs it holds. Hypotheses, each with its prediction, written
before the run:

A. Too few bytes in flight a program: a larger box moves more a wait. Prediction: 128 x 64 and 64 x 128 bf16 boxes
   (16 KB each way) reach 3.6-3.9 TB/s, 128 x 128 (32 KB) about tiled_tuned's 4.0; in fp32 (the 64 x 64 box is
   already 16 KB) the boxes change little.
B. No overlap inside a program: a persistent kernel (a program an SM slot, looping over tiles) whose loop Triton
   pipelines (`tl.range(..., num_stages=2)`) loads the next box while it turns and stores this one. Prediction:
   at 64 x 64 it gains as much as A's larger box; with A's best box it reaches the copy's 4.1.
C. Neither: the turn itself (registers through shared memory to the store's layout) or the TMA store's own path
   is the limit. Prediction then: every box and the pipelined loop stay within 10% of 3.2 TB/s; next, ncu's
   shared-memory bank conflicts and the store's wait.

Times: `triton.testing.do_bench` (L2 flushed, median); TB/s over the model's bytes (each element read once and
written once). Each kernel's output is checked against torch's transpose first.

    python3 benchmarks/explore/transpose/tma_boxes.py [ROWS COLS]          (GPU)
    TRITON_INTERPRET=1 python3 benchmarks/explore/transpose/tma_boxes.py --check   (CPU: correctness only)
    ncu --clock-control none --metrics l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_st.sum,\\
smsp__inst_executed_op_shared_st.sum,dram__bytes_read.sum,dram__bytes_write.sum \\
        python3 benchmarks/explore/transpose/tma_boxes.py --once                    (each kernel once, its counters)
"""

from __future__ import annotations

import sys

import torch
import triton
import triton.language as tl

from casebook.kernels import transpose as m

BOXES = ((64, 64), (128, 64), (64, 128), (128, 128), (32, 128))
WARPS = (4, 8)


@triton.jit
def _tma_persistent(x_desc, y_desc, R, C, BM: tl.constexpr, BN: tl.constexpr, STAGES: tl.constexpr):
    # The case's kernel, one program an SM slot looping over the tiles: the loop Triton pipelines (STAGES boxes
    # loading while the current one is turned and stored).
    n_c = tl.cdiv(C, BN)
    tiles = tl.cdiv(R, BM) * n_c
    b = tl.program_id(1)
    for t in tl.range(tl.program_id(0), tiles, tl.num_programs(0), num_stages=STAGES):
        r0 = (t // n_c) * BM
        c0 = (t % n_c) * BN
        tile = tl.reshape(x_desc.load([b, r0, c0]), [BM, BN])
        y_desc.store([b, c0, r0], tl.reshape(tl.trans(tile), [1, BN, BM]))


def _descs(x, y, bm, bn):
    b, r, c, _ = x.shape
    return (m.TensorDescriptor.from_tensor(x.view(b, r, c), [1, bm, bn]),
            m.TensorDescriptor.from_tensor(y.view(b, c, r), [1, bn, bm]))


def one_box(x, bm, bn, warps):
    b, r, c, _ = x.shape
    y = torch.empty(b, c, r, 1, dtype=x.dtype, device=x.device)
    xd, yd = _descs(x, y, bm, bn)
    m._tma_kernel[(triton.cdiv(r, bm) * triton.cdiv(c, bn), b)](xd, yd, r, c, BM=bm, BN=bn, num_warps=warps)
    return y


def persistent(x, bm, bn, warps, programs, stages=2):
    b, r, c, _ = x.shape
    y = torch.empty(b, c, r, 1, dtype=x.dtype, device=x.device)
    xd, yd = _descs(x, y, bm, bn)
    _tma_persistent[(programs, b)](xd, yd, r, c, BM=bm, BN=bn, STAGES=stages, num_warps=warps)
    return y


def check() -> None:
    """Every kernel's output against torch's transpose, at an uneven shape (edges clipped), under the interpreter."""
    x = torch.randn(1, 80, 96, 1)
    want = x.transpose(1, 2).contiguous()
    for bm, bn in ((16, 32), (32, 16)):
        assert torch.equal(one_box(x, bm, bn, 4), want)
        for programs in (1, 3, 7):
            assert torch.equal(persistent(x, bm, bn, 4, programs), want), (bm, bn, programs)
    print("tma_boxes: every kernel transposes exactly")


def sweep(kernels, width: int = 34) -> None:
    """Each dtype's matrix (ROWS COLS from the command line, 16384 x 16384 by default) transposed by each of
    `kernels(x)`'s (label, fn): the output checked against torch's, then timed (`do_bench`: L2 flushed, median), or
    with --once run once for ncu's counters. The copy comes first, the roof, not a transpose."""
    from triton.testing import do_bench

    once = "--once" in sys.argv
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    rows, cols = (int(args[0]), int(args[1])) if len(args) == 2 else (16384, 16384)
    for dtype in (torch.bfloat16, torch.float32):
        x = torch.randn(1, rows, cols, 1, device="cuda", dtype=dtype)
        want = x.transpose(1, 2).contiguous()
        moved = 2 * x.numel() * x.element_size()
        print(f"\n{rows} x {cols} {str(dtype).removeprefix('torch.')}")
        for n, (label, fn) in enumerate([("copy", x.clone), *kernels(x)]):
            try:
                if n and not torch.equal(fn(), want):
                    print(f"  {label:{width}s} WRONG")
                    continue
                if once:  # under ncu: each kernel's counters (the turn's shared-memory bank conflicts), not times
                    continue
                us = do_bench(fn, return_mode="median") * 1e3
                print(f"  {label:{width}s} {us:8.1f} us  {moved / us / 1e6:5.2f} TB/s", flush=True)
            except Exception as e:  # noqa: BLE001 (an exploration: a box the hardware refuses is a finding too)
                print(f"  {label:{width}s} {type(e).__name__}: {str(e)[:160]}")


def _kernels(x) -> list:
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    out = [("tiled_tuned", lambda: m.tiled_tuned(x))]
    for bm, bn in BOXES:
        for w in WARPS:
            out.append((f"one box {bm}x{bn} warps={w}", lambda bm=bm, bn=bn, w=w: one_box(x, bm, bn, w)))
    for bm, bn in BOXES[:4]:
        for per_sm in (2, 4, 8):
            out.append((f"persistent {bm}x{bn} {per_sm}/SM stages=2",
                        lambda bm=bm, bn=bn, per_sm=per_sm: persistent(x, bm, bn, 4, per_sm * sms)))
    return out


def main() -> None:
    if "--check" in sys.argv:
        return check()
    sweep(_kernels)


if __name__ == "__main__":
    main()
