"""Whether the norms' one-pass forward reaches the copy at 32K columns with the next row in flight.

On the H200 the stored runs put the one-pass kernel (`triton_onepass` = `triton_long` to 32K) at 3.58 TB/s at
2048 x 32768 bf16 for rmsnorm and 2.96-2.99 for layernorm (claims: 3.9 and 3.7), where torch.compile reads 3.85
for rmsnorm; at 8192 x 16384 rmsnorm reads 3.88 (notes/rmsnorm.md, notes/layernorm.md). The autotuner picks one row
a program at 16 warps there: 64 values of a 32K row a thread, one program an SM by registers. Each SM then loads a
row (64 KB of bf16), reduces it, and stores it with no load in flight: for the reduction and the store it reads
nothing. The fused add + RMSNorm (`rmsnorm_residual`) with the same program shape reaches 4.02 TB/s at the same
shape, with twice the bytes a row: bytes in flight, not the arithmetic, hold the forward.

`_stream_kernel` is the one-pass kernel made persistent (`tl.range(..., num_stages=STAGES)` over the rows of a
program, PER_SM programs an SM), so Triton copies the next rows' x into shared memory while this one reduces and
stores, the change `norm_backward.rows` made to the backward (+7-26% there). CENTERED adds layernorm's mean and
bias (the centred variance from the same registers, as `layernorm._rows_kernel`). Lowered for sm_90a (`--compile`),
the stream at 32K columns holds one row's copies ahead (x and w: 128 KB of shared memory for rmsnorm, 192 KB for
layernorm), 121-128 registers at 16 warps, no spill for rmsnorm (layernorm: 4 spilled words a thread at 16 warps,
none at 32).

Predicted (written before the run; H200, bf16): at 2048 x 32768 rmsnorm from 3.58 to 3.9-4.0 TB/s (the residual
kernel's 4.02 is the bound a row's bytes in flight give), layernorm from 2.96 to 3.6-3.8; at 8192 x 16384 rmsnorm
from 3.88 to 3.95-4.05 and at 4096 x 32768 from 3.74 to 3.9-4.0. On an H100 (copy ~3.0) the same in proportion: the
one-pass kernel's share of the copy at 32K from ~84% to ~93%. If the stream does not move the 32K rows, the one
program an SM is not what holds them, and Nsight Compute's stall reasons on both are the next reading.

    python3 benchmarks/explore/rmsnorm/rows_stream.py                      # GPU: times, every output checked
    python3 benchmarks/explore/rmsnorm/rows_stream.py --compile            # no GPU: registers, shared, copies
    TRITON_INTERPRET=1 python3 benchmarks/explore/rmsnorm/rows_stream.py --check   # against float64
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
import triton
import triton.language as tl

from casebook.kernels import layernorm, rmsnorm
from casebook.kernels.device import num_sms

SHAPES = ((2048, 32768), (4096, 32768), (8192, 16384), (16384, 8192))
"""The level-1 shapes where the one-pass forward is furthest from the copy (rows x cols, bf16)."""

STREAMS = ((2, 1, 16), (2, 1, 32), (3, 1, 16), (3, 1, 32), (2, 2, 16))
"""(stages, programs an SM, warps): one row's copies ahead (two where a stage's shared memory allows: to 16K
columns), one program an SM (two to 16K)."""


@triton.jit
def _stream_kernel(x_ptr, w_ptr, b_ptr, y_ptr, n_rows, n_cols, eps, CENTERED: tl.constexpr, STAGES: tl.constexpr,
                   BLOCK: tl.constexpr):
    # The one-pass forward (a whole row in registers: x read once, y written once), one row an iteration of a
    # persistent loop whose next rows' loads Triton copies into shared memory ahead (STAGES).
    # w (and b) are loaded again each row, after the reduction, as the committed kernel loads them: held across
    # the loop they took 32-64 more registers a thread at 32K columns and 16 warps, and the loop spilled where the
    # committed kernel sits at 127 registers (lowered for sm_90a). In the loop the pipeliner copies them ahead
    # with x (L2 hits), so a stage holds a row of x and one of w (and b): 128 KB a stage at 32K bf16 for rmsnorm,
    # 192 KB for layernorm, two stages at most (`--compile`).
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    for row in tl.range(tl.program_id(0), n_rows, tl.num_programs(0), num_stages=STAGES):
        offs = tl.cast(row, tl.int64) * n_cols + cols
        h = tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.float32)
        if CENTERED:
            c = tl.where(mask, h - tl.sum(h, axis=0) / n_cols, 0.0)
        else:
            c = h
        rstd = tl.rsqrt(tl.sum(c * c, axis=0) / n_cols + eps)
        y = c * rstd * tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
        if CENTERED:
            y += tl.load(b_ptr + cols, mask=mask, other=0.0).to(tl.float32)
        tl.store(y_ptr + offs, y.to(y_ptr.dtype.element_ty), mask=mask)


def stream(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None = None, stages: int = 2, per_sm: int = 1,
           warps: int = 16) -> torch.Tensor:
    """rmsnorm(x) w, or layernorm(x) w + b where `b` is given, by `_stream_kernel`."""
    n_rows, n_cols = x.shape
    y = torch.empty_like(x)
    programs = max(1, min(n_rows, per_sm * num_sms(x)))
    _stream_kernel[(programs,)](x, w, w if b is None else b, y, n_rows, n_cols, rmsnorm.EPS, CENTERED=b is not None,
                                STAGES=stages, BLOCK=triton.next_power_of_2(n_cols), num_warps=warps)
    return y


def inputs(norm: str, rows: int, cols: int, device: str) -> dict:
    """The case's own inputs at one bf16 shape (x, w and, for layernorm, b)."""
    module = layernorm if norm == "layernorm" else rmsnorm
    return module.make_inputs({"rows": rows, "cols": cols}, torch.bfloat16, device, torch.Generator().manual_seed(0))


def reference(norm: str, t: dict) -> torch.Tensor:
    """The case's float64 answer at these inputs, computed once a shape."""
    return (layernorm if norm == "layernorm" else rmsnorm).reference(**t)


def error(y: torch.Tensor, want: torch.Tensor) -> float:
    return float(((y.double() - want).norm() / want.norm()).item())


def check() -> None:
    """Ragged rows and columns, more rows than programs, under the interpreter, against float64."""
    for norm in ("rmsnorm", "layernorm"):
        for rows, cols in ((7, 1000), (5, 4097), (37, 300)):
            t = inputs(norm, rows, cols, "cpu")
            y = stream(t["x"], t["w"], t.get("b"), stages=2)
            err = error(y, reference(norm, t))
            print(f"{norm:9s} {rows:3d} x {cols:5d}: normwise error {err:.1e} {'ok' if err < 1e-2 else 'WRONG'}")


def compile_report() -> None:
    """Each stream lowered for sm_90a at 32K and 16K columns: registers, stack, shared memory, pipelined copies."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from aot import jit_report, lower

    for cols in (32768, 16384):
        for centered in (False, True):
            for stages, _, warps in STREAMS:
                consts = {"CENTERED": centered, "STAGES": stages, "BLOCK": cols}
                ir = lower(_stream_kernel, {"eps": "fp32"}, consts, num_warps=warps).asm["ttgir"]
                copies = ir.count("ttg.async_copy_global_to_local")
                print(f"{cols:5d} {'layernorm' if centered else 'rmsnorm  '} {stages} stages, {warps:2d} warps: "
                      f"{jit_report(_stream_kernel, {'eps': 'fp32'}, consts, num_warps=warps)}; "
                      f"async copies {copies}", flush=True)


def gpu() -> None:
    from triton.testing import do_bench

    for norm in ("rmsnorm", "layernorm"):
        module = layernorm if norm == "layernorm" else rmsnorm
        for rows, cols in SHAPES:
            t = inputs(norm, rows, cols, "cuda")
            floor = 2 * t["x"].numel() * t["x"].element_size()
            want = reference(norm, t)
            runs = {"committed triton_onepass": lambda t=t, m=module: m.triton_onepass(**t),
                    "liger": lambda t=t, m=module: m.liger(**t),
                    "torch.compile": lambda t=t, m=module: m.torch_compile(**t)}
            for stages, per_sm, warps in STREAMS:
                runs[f"stream, {stages} stages, {per_sm} a SM, {warps} warps"] = (
                    lambda t=t, s=stages, p=per_sm, w=warps: stream(t["x"], t["w"], t.get("b"), s, p, w))
            for name, fn in runs.items():
                try:
                    err = error(fn(), want)
                    us = do_bench(fn, warmup=25, rep=200, return_mode="median") * 1e3
                except Exception as e:  # a peer not installed, a config the GPU cannot hold
                    print(f"{norm:9s} {rows:5d} x {cols:5d} {name:34s} skipped: {type(e).__name__}: {str(e)[:80]}")
                    continue
                print(f"{norm:9s} {rows:5d} x {cols:5d} {name:34s} {us:8.1f} us {floor / us / 1e6:5.2f} TB/s "
                      f"(error {err:.1e})", flush=True)
            torch.cuda.empty_cache()


if __name__ == "__main__":
    if "--check" in sys.argv:
        check()
    elif "--compile" in sys.argv:
        compile_report()
    else:
        gpu()
