"""Whether rmsnorm's backward at 16K columns trails Liger by its spills: the committed kernel with w loaded each row.

rmsnorm_backward's one miss no candidate has closed is 8192 x 16384 bf16: the committed kernel (`triton_partial`, the
`triton_pipelined` rung's path from 8K to 16K columns) reads 0.92x Liger on the H200 and 0.93x on an H100 (1.88
against 2.03 TB/s), and `wide_rows.py`'s barrier split ties it (1.84). Lowered for sm_90a (Triton 3.9), both spill at
16K columns: the committed kernel 136 B of stack a thread at its 32 warps (208 at 16), Liger's 112 B at its 16.
Liger's loop differs in where w lives and in its casts, not in its reduction.

`_lean_kernel` is the committed kernel (`rmsnorm._backward_kernel`, partials) with w loaded again each row, an L1 or
L2 hit, instead of held in registers across the loop: 64 B of stack at 16 warps, 96 at 32 (`--compile`).

Predicted (written before the run): at 8192 x 16384 level with Liger or ahead (H100: 1.95-2.1 TB/s against the
committed 1.87 and Liger's 2.03); at 16384 x 8192, where nothing spills, within 2% of the committed kernel. If the
lean kernel reads the committed kernel's rate at 16K, the spills are not Liger's 8%, and the next reading is both
kernels under Nsight Compute (their stall reasons and L1 traffic).

    python3 benchmarks/explore/norm_backward/lean_rows.py                      # GPU: times, outputs checked
    python3 benchmarks/explore/norm_backward/lean_rows.py --compile            # no GPU: registers and stack
    TRITON_INTERPRET=1 python3 benchmarks/explore/norm_backward/lean_rows.py --check   # against float64
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
import triton
import triton.language as tl

from casebook.kernels import rmsnorm
from casebook.kernels.device import num_sms

SHAPES = ((8192, 16384), (16384, 8192))
"""rmsnorm_backward's level-1 shapes at 8K-16K columns, bf16."""

RUNGS = ((16, 1), (16, 2), (32, 1))
"""(warps, programs an SM) of the lean kernel."""


@triton.jit
def _lean_kernel(x_ptr, w_ptr, dy_ptr, rstd_ptr, dx_ptr, dw_ptr, n_rows, n_cols, BLOCK: tl.constexpr):
    # `rmsnorm._backward_kernel` (partials) with w loaded each row after x and dy, not held across the loop.
    pid = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    dw = tl.zeros([BLOCK], dtype=tl.float32)
    for row in range(pid, n_rows, tl.num_programs(0)):
        offs = tl.cast(row, tl.int64) * n_cols + cols
        x = tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.float32)
        dy = tl.load(dy_ptr + offs, mask=mask, other=0.0).to(tl.float32)
        rstd = tl.load(rstd_ptr + row)
        xhat = x * rstd
        wdy = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32) * dy
        c = tl.sum(xhat * wdy, axis=0) / n_cols
        tl.store(dx_ptr + offs, ((wdy - xhat * c) * rstd).to(dx_ptr.dtype.element_ty), mask=mask)
        dw += dy * xhat
    tl.store(dw_ptr + pid * n_cols + cols, dw, mask=mask)


def lean(x, w, dy, rstd, warps: int = 16, per_sm: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    """(dx, dw) by `_lean_kernel`, its fp32 partials summed by the committed second pass."""
    n_rows, n_cols = x.shape
    programs = max(1, min(n_rows, per_sm * num_sms(x)))
    dx = torch.empty_like(x)
    partials = torch.empty(programs, n_cols, device=x.device, dtype=torch.float32)
    _lean_kernel[(programs,)](x, w, dy, rstd, dx, partials, n_rows, n_cols, BLOCK=triton.next_power_of_2(n_cols),
                              num_warps=warps)
    dw = torch.empty(n_cols, device=x.device, dtype=w.dtype)
    block_c = 256
    rmsnorm._sum_partials_kernel[(triton.cdiv(n_cols, block_c),)](partials, dw, programs, n_cols, BLOCK_P=32,
                                                                  BLOCK_C=block_c)
    return dx, dw


def inputs(rows: int, cols: int, device: str) -> dict:
    """The case's own inputs (x, w, dy and the saved rstd) at one bf16 shape."""
    return rmsnorm.make_backward_inputs({"rows": rows, "cols": cols}, torch.bfloat16, device,
                                        torch.Generator().manual_seed(0))


def reference(t: dict) -> tuple:
    """The case's float64 (dx, dw) at these inputs, computed once a shape."""
    return rmsnorm.reference_backward(*(v.double() for v in t.values()))


def worst_error(got: tuple, ref: tuple) -> float:
    return max(((g.double() - r).norm() / r.norm()).item() for g, r in zip(got, ref))


def check() -> None:
    for rows, cols in ((37, 1000), (9, 4096), (5, 12000)):
        t = inputs(rows, cols, "cpu")
        err = worst_error(lean(*t.values(), warps=4), reference(t))
        print(f"rmsnorm {rows:3d} x {cols:5d} lean: worst relative error {err:.2e} {'ok' if err < 2e-2 else 'WRONG'}")


def compile_report() -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # aot.py, shared by the explorations
    from aot import jit_report

    f32 = {"rstd_ptr": "*fp32", "dw_ptr": "*fp32"}
    for warps in (16, 32):
        print(f"16384 committed, {warps} warps:",
              jit_report(rmsnorm._backward_kernel, f32, {"ATOMIC": False, "BLOCK": 16384}, num_warps=warps))
        print(f"16384 lean, {warps} warps:", jit_report(_lean_kernel, f32, {"BLOCK": 16384}, num_warps=warps))


def gpu() -> None:
    from triton.testing import do_bench

    for rows, cols in SHAPES:
        t = inputs(rows, cols, "cuda")
        model = rmsnorm.traffic_backward({"rows": rows, "cols": cols}, torch.bfloat16).bytes
        ref = reference(t)
        runs = {"committed triton_partial": lambda t=t: rmsnorm.triton_partial(**t),
                "liger": lambda t=t: rmsnorm.liger_backward(**t)}
        runs.update({f"lean, {w} warps, {n}/SM": (lambda t=t, w=w, n=n: lean(*t.values(), warps=w, per_sm=n))
                     for w, n in RUNGS})
        for name, fn in runs.items():
            try:
                err = worst_error(fn(), ref)
            except NotImplementedError as e:  # a peer not installed
                print(f"rmsnorm {rows} x {cols} {name:26s} skipped: {e}")
                continue
            us = do_bench(fn, warmup=25, rep=200, return_mode="median") * 1e3
            print(f"rmsnorm {rows} x {cols} {name:26s} {us:8.1f} us {model / us / 1e6:5.2f} TB/s (error {err:.1e})",
                  flush=True)


if __name__ == "__main__":
    if "--check" in sys.argv:
        check()
    elif "--compile" in sys.argv:
        compile_report()
    else:
        gpu()
