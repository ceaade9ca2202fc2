"""What holds the decode chain's fused layer at ~1.1-1.35 TB/s of its weight bytes on an H100 (notes/decode_chain.md,
"The stored H100 result"): one layer's kernel (`_fused_layer_kernel`) launched at each tile (BN output columns a
program, BK the K step), stage count and warp count, one axis at a time from the case's (32, 256, 3 stages, 4 warps),
beside cuBLAS's GEMV of the same weight (`torch.nn.functional.linear`, what the torch_compile rung calls).

If some tile reaches cuBLAS's rate, the tile is the lever and the case takes it; if none moves past ~1.5 TB/s while
cuBLAS reads 2.5 or more, the loop's own structure is (its x tiles from L2 each step, a 16-row MMA for one row).
At batch 1 the structure's alternative is timed beside it: the same layer with no MMA (`_gemv_kernel`: the weight
tile times x g summed into a [BN, BK] fp32 tile, one row sum at the end), at a few tiles and warp counts.
The no-MMA layer is also timed with K split over 2-8 programs a column tile (atomics into an fp32 row, then a
small epilogue kernel): an SM then holds 2-8 programs, not one, with the same 16 KB a step each. The SASS of the
case's tile (lowered for sm_90a) shows the loop pipelined as designed, two 16 KB weight steps in flight by cp.async
(`DEPBAR.LE SB0, 0x3` over three commit groups a step), from 4 warps, one program an SM: if the split reaches
cuBLAS's rate where the unsplit kernel stays at ~1.3 TB/s, what binds is the loads one SM's few warps can keep
outstanding, not the bytes the pipeline asks for, and the case's layer takes more programs an SM.
Times: `triton.testing.do_bench` (L2 flushed, median); TB/s on the layer's bytes (the H x H weight, x read twice,
the output written). Every config's output is compared with the case's eager layer (float32 sums, bf16 out).

    python3 benchmarks/explore/decode_chain/gemv_tiles.py [BATCH HIDDEN]   # default: 1 4096, then 1 8192
    TRITON_INTERPRET=1 python3 benchmarks/explore/decode_chain/gemv_tiles.py 1 256   # no GPU: outputs checked only
"""

from __future__ import annotations

import sys

import torch
import torch.nn.functional as F
import triton
import triton.language as tl
from triton.testing import do_bench

from casebook.kernels import decode_chain as m


@triton.jit
def _gemv_sums(x_ptr, w_ptr, g_ptr, cols, col_ok, k_lo, k_hi, H, BN: tl.constexpr, BK: tl.constexpr):
    # Over K in [k_lo, k_hi): the products of w's [BN, BK] tiles and x g (rounded to the weights' dtype, as the
    # eager chain's norm output is) summed into an fp32 tile, one row sum at the end; and x's squares.
    ks = tl.arange(0, BK)
    sumsq = tl.zeros([BK], dtype=tl.float32)
    acc = tl.zeros([BN, BK], dtype=tl.float32)
    for k0 in range(k_lo, k_hi, BK):
        k = k0 + ks
        k_ok = k < H
        xk = tl.load(x_ptr + k, mask=k_ok, other=0.0, cache_modifier=".cg").to(tl.float32)
        sumsq += xk * xk
        xg = xk * tl.load(g_ptr + k, mask=k_ok, other=0.0).to(tl.float32)
        wk = tl.load(w_ptr + cols[:, None] * H + k[None, :], mask=col_ok[:, None] & k_ok[None, :], other=0.0)
        acc += wk.to(tl.float32) * xg.to(wk.dtype).to(tl.float32)[None, :]
    return tl.sum(acc, axis=1), tl.sum(sumsq)


@triton.jit
def _gemv_kernel(x_ptr, out_ptr, w_ptr, g_ptr, H, eps, BN: tl.constexpr, BK: tl.constexpr):
    # Batch 1: out = x + silu(rmsnorm(x) g @ w^T), as `_layer_tile` computes it (1/rms on the GEMV's output, the
    # squares summed in the K loop) but with products and one row sum where it runs a 16-row MMA tile of which
    # one row is x.
    cols = tl.program_id(0) * BN + tl.arange(0, BN)
    col_ok = cols < H
    y, sumsq = _gemv_sums(x_ptr, w_ptr, g_ptr, cols, col_ok, 0, H, H, BN, BK)
    y = y / tl.sqrt(sumsq / H + eps)
    res = tl.load(x_ptr + cols, mask=col_ok, other=0.0, cache_modifier=".cg").to(tl.float32)
    tl.store(out_ptr + cols, (res + y * tl.sigmoid(y)).to(out_ptr.dtype.element_ty), mask=col_ok)


@triton.jit
def _gemv_splitk_kernel(x_ptr, part_ptr, sumsq_ptr, w_ptr, g_ptr, H, KCHUNK, BN: tl.constexpr, BK: tl.constexpr):
    # The no-MMA GEMV with K split over SPLITS programs (grid axis 1): each adds its K range's row sums to `part`
    # (fp32, one word an output column) by atomics; the programs of column tile 0 add their squares to `sumsq`.
    # More programs an SM, so more warps with loads in flight, at the same bytes a step.
    cols = tl.program_id(0) * BN + tl.arange(0, BN)
    col_ok = cols < H
    k_lo = tl.program_id(1) * KCHUNK
    y, sumsq = _gemv_sums(x_ptr, w_ptr, g_ptr, cols, col_ok, k_lo, k_lo + KCHUNK, H, BN, BK)
    tl.atomic_add(part_ptr + cols, y, mask=col_ok, sem="relaxed")
    tl.atomic_add(sumsq_ptr, sumsq, mask=tl.program_id(0) == 0, sem="relaxed")


@triton.jit
def _gemv_epilogue(x_ptr, out_ptr, part_ptr, sumsq_ptr, H, eps, BLOCK: tl.constexpr):
    # out = x + silu(part / rms), one program a BLOCK of columns; `part` is zeroed as it is read, and `sumsq` by
    # the last program once every program has read it (a counter beside it), so the next call starts clean.
    cols = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    ok = cols < H
    inv = 1.0 / tl.sqrt(tl.load(sumsq_ptr) / H + eps)
    y = tl.load(part_ptr + cols, mask=ok, other=0.0) * inv
    tl.store(part_ptr + cols, tl.zeros([BLOCK], dtype=tl.float32), mask=ok)
    res = tl.load(x_ptr + cols, mask=ok, other=0.0).to(tl.float32)
    tl.store(out_ptr + cols, (res + y * tl.sigmoid(y)).to(out_ptr.dtype.element_ty), mask=ok)
    if tl.atomic_add(sumsq_ptr + 1, 1.0, sem="acq_rel") == tl.num_programs(0) - 1:
        tl.store(sumsq_ptr, 0.0)
        tl.store(sumsq_ptr + 1, 0.0)


CASE = {"BN": 32, "BK": 256, "stages": 3, "warps": 4}
AXES = {"BN": (16, 64, 128), "BK": (64, 128, 512), "stages": (2, 4, 5), "warps": (2, 8)}
GEMV = [{"BN": bn, "BK": bk, "stages": st, "warps": w} for bn, bk, st, w in
        ((16, 256, 3, 4), (32, 256, 3, 4), (32, 256, 4, 4), (64, 128, 3, 4), (64, 256, 3, 8), (32, 512, 3, 8),
         (128, 128, 3, 8))]
"""The no-MMA layer's tiles (batch 1): a [BN, BK] fp32 accumulator of 4-64 values a thread."""
SPLITK = [{"BN": bn, "BK": 256, "stages": 3, "warps": 4, "splits": sp} for bn in (32, 64) for sp in (2, 4, 8)]
"""The no-MMA layer with K split: 2-8 programs a column tile, 2-8 programs an SM at hidden 4096."""


def configs() -> list[dict]:
    out = [dict(CASE)]
    for axis, values in AXES.items():
        out += [{**CASE, axis: v} for v in values]
    return out


def sweep(batch: int, hidden: int, device: str) -> None:
    g = torch.Generator(device=device).manual_seed(0)
    x = torch.randn(batch, hidden, device=device, dtype=torch.bfloat16, generator=g)
    w = torch.randn(1, hidden, hidden, device=device, dtype=torch.bfloat16, generator=g) / hidden**0.5
    gamma = 1 + 0.1 * torch.randn(1, hidden, device=device, dtype=torch.bfloat16, generator=g)
    want = m.eager(x, w, gamma).float()
    out = torch.empty_like(x)
    layer_bytes = w.numel() * 2 + 3 * x.numel() * 2
    bb = max(16, triton.next_power_of_2(batch))

    def report(name: str, fn) -> None:
        if device != "cuda":  # the interpreter: correct or not, no time
            print(f"{batch} x {hidden} {name:34s} correct")
            return
        us = do_bench(fn, warmup=25, rep=200, return_mode="median") * 1e3
        print(f"{batch} x {hidden} {name:34s} {us:8.1f} us  {layer_bytes / us / 1e6:5.2f} TB/s", flush=True)

    if device == "cuda":
        report("cuBLAS GEMV (F.linear), alone", lambda: F.linear(x, w[0]))
    runs = [("fused", c) for c in configs()]
    if batch == 1:
        runs += [("no-MMA", c) for c in GEMV] + [("no-MMA split-K", c) for c in SPLITK]
    part = torch.zeros(hidden, device=device, dtype=torch.float32)
    sumsq = torch.zeros(2, device=device, dtype=torch.float32)
    for kind, c in runs:
        name = f"{kind} BN {c['BN']} BK {c['BK']} st {c['stages']} w {c['warps']}" + (
            f" x{c['splits']}" if "splits" in c else "")

        def launch(c=c, kind=kind):
            grid, bk = (triton.cdiv(hidden, c["BN"]),), min(c["BK"], triton.next_power_of_2(hidden))
            if kind == "fused":
                m._fused_layer_kernel[grid](x, out, w[0], gamma[0], batch, hidden, m.EPS, BB=bb, BN=c["BN"], BK=bk,
                                            UPCAST=device != "cuda", num_warps=c["warps"], num_stages=c["stages"])
            elif kind == "no-MMA":
                _gemv_kernel[grid](x, out, w[0], gamma[0], hidden, m.EPS, BN=c["BN"], BK=bk, num_warps=c["warps"],
                                   num_stages=c["stages"])
            else:  # K in SPLITS chunks of whole BK steps, then the epilogue
                kchunk = triton.cdiv(triton.cdiv(hidden, c["splits"]), bk) * bk
                _gemv_splitk_kernel[(grid[0], triton.cdiv(hidden, kchunk))](
                    x, part, sumsq, w[0], gamma[0], hidden, kchunk, BN=c["BN"], BK=bk, num_warps=c["warps"],
                    num_stages=c["stages"])
                _gemv_epilogue[(triton.cdiv(hidden, 1024),)](x, out, part, sumsq, hidden, m.EPS, BLOCK=1024,
                                                             num_warps=4)
        try:
            launch()
            if device == "cuda":
                torch.cuda.synchronize()
        except Exception as e:  # a tile the compiler refuses (shared memory, say): said, and the sweep goes on
            print(f"{batch} x {hidden} {name:34s} refused: {str(e).splitlines()[0][:120]}")
            continue
        err = ((out.float() - want).abs().max() / want.abs().max()).item()
        if err > 2e-2:
            print(f"{batch} x {hidden} {name:34s} WRONG (max error {err:.3g} of the largest output)")
            continue
        report(name, launch)


def main() -> None:
    args = [int(a) for a in sys.argv[1:]]
    shapes = [tuple(args)] if len(args) == 2 else [(1, 4096), (1, 8192)]
    device = "cuda" if torch.cuda.is_available() else "cpu"
    for batch, hidden in shapes:
        sweep(batch, hidden, device)


if __name__ == "__main__":
    main()
