"""Why the norms' backward falls behind at wide rows, and two candidates that should not.

The committed `triton_partial` of both backward cases holds a whole row of x, dy, w and the dw (and db)
partials in registers: BLOCK = the row, one row a program iteration, 32 warps from 8K columns. On an H200
(`triton.testing.do_bench`, L2 flushed, bf16) layernorm_backward ran 8192 x 16384 at 0.51 TB/s against Liger's
1.79, rmsnorm_backward at 2.17 against 2.41, and both stayed under the 3.2 TB/s claim at 16384 x 4096 (2.54
and 2.95). Lowered here for sm_90a (`--compile`, `benchmarks/explore/aot.py`), at 16384 columns:

    layernorm  32 warps: 64 registers, a 248-byte stack (62 spill stores in the SASS); 16 warps: 128, 376 B
    rmsnorm    32 warps: 64 registers, 136 B;                                        16 warps: 128, 208 B
    Liger's layernorm kernel, 16 warps: 128 registers, 328 B
    (Triton 3.9; with the device image's 3.6: ours at 32 warps 304 B, Liger 240 B, rmsnorm 128 B)

Both spill, but our 32-warp program parks 248 B x 1024 threads = 248 KB of spills on an SM whose L1 and shared
memory together are 256 KB (32 KB of it the reduction's scratch), so they go to L2; Liger's 328 B x 512 threads
= 164 KB stays in L1. That is the working explanation of 0.51 against 1.79. At 4096 columns nothing spills (16
warps, 60-61 registers, two programs an SM fit), so there the limit is different: each program loads a row,
then reduces it and stores with no load in flight (the load-free phases that softmax_fusion's notebook
measured; its persistent whole-row kernel with `tl.range(num_stages=3)` gained 12% at 32K columns, and its two-
sweep chunk loops were latency-bound by a block-wide reduction a chunk, which the split candidate below avoids
by keeping its sums per lane until the row ends), 2 programs x 16 KB an SM at best, where ~36 KB an SM is what
the copy rate needs in flight (Little's law at ~1 us).

Candidates (one thing changed each, both for rmsnorm and layernorm through CENTERED; the kernels now live in
`casebook/kernels/norm_backward.py`, where the backward cases' `triton_pipelined` rung dispatches between them
by what an H100 measured of this sweep):

  rows     the committed kernel with the loop as `tl.range(num_stages=STAGES)`: Triton copies the next
           rows' x and dy into shared memory while this one reduces. Predicted at 16384 x 4096: the
           load-free phases covered, 3.2-3.5 TB/s (softmax's whole-row prefetch gained 12% at 32K).
  split    for rows past 8K columns: SPLITS programs share each row, each owning a column slice of
           dw, db and dx. Each computes the row's two sums over the whole row in chunks, then its slice;
           the SPLITS programs of a row run side by side, so a row's second to last reads come from L2,
           not DRAM. Registers hold a slice's partials, not a row's: no spills. Predicted at 8192 x 16384:
           DRAM bytes at the model's (ncu), 2.6-3.2 TB/s, and at 2048 x 32768 (where the committed
           variants refuse) the same.
  bsplit   (after the H200's stored run: the split rung at 1.60 TB/s at 8192 x 16384, Liger 1.76, torch.compile
           1.92) the split with one read of the row: each program reads only its slice, stores the slice's two
           sums as the row's partials, meets its siblings at a barrier (softmax_fusion's row barrier, one word a
           group) and writes dx from registers. PREFETCH loads the next row's slice before the wait. Lowered for
           sm_90a: 84-137 registers, no stack. Predicted at 8192 x 16384 (layernorm, H200): without prefetch
           2.0-2.4 TB/s (a barrier of ~1-1.5 us a row beside ~1.5 us of the row's bytes), with it 2.5-3.0,
           ahead of Liger and torch.compile; at 2048 x 32768 likewise. If it stays at the split's 1.6, the
           barrier costs what the second read did, and the exchange belongs in a cluster's shared memory.

    python3 benchmarks/explore/norm_backward/wide_rows.py --compile        # registers and stack, no GPU
    TRITON_INTERPRET=1 python3 benchmarks/explore/norm_backward/wide_rows.py --check   # against float64
    python3 benchmarks/explore/norm_backward/wide_rows.py [ROWS COLS ...]  # times on the GPU
    ncu --clock-control none --metrics dram__bytes_read.sum,dram__bytes_write.sum,\\
lts__t_sectors_op_read.sum,lts__t_sectors_op_write.sum,\\
l1tex__t_sectors_pipe_lsu_mem_local_op_ld.sum,l1tex__t_sectors_pipe_lsu_mem_local_op_st.sum \\
        python3 benchmarks/explore/norm_backward/wide_rows.py 8192 16384 --once
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
import triton
import triton.language as tl

from casebook.kernels import layernorm, rmsnorm
from casebook.kernels.device import INTERPRET, num_sms
from casebook.kernels.norm_backward import _finish, _partials, _rows_kernel, _split_kernel, rows, split
from casebook.kernels.softmax_fusion import _row_barrier, _row_barriers

SHAPES = ((16384, 4096), (32768, 4096), (16384, 8192), (8192, 16384), (2048, 32768))
"""The level-1 shapes of both backward cases past 512 rows (bf16)."""

ROWS_RUNGS = ((1, 2), (2, 2), (3, 1), (3, 2), (4, 1))
"""(stages, programs an SM) of the pipelined row kernel: 1 stage, 2 an SM is the committed kernel's loop."""

SPLIT_RUNGS = ((8192, 16), (8192, 32), (4096, 16))
"""(slice, warps) of the split kernel, where a row holds at least two slices."""


BSPLIT_RUNGS = ((8192, 16, False), (8192, 16, True), (4096, 16, False), (4096, 16, True), (4096, 8, True))
"""(slice, warps, prefetch) of the barrier split, where a row holds at least two slices."""


@triton.jit
def _bsplit_kernel(x_ptr, w_ptr, dy_ptr, mean_ptr, rstd_ptr, dx_ptr, dw_ptr, db_ptr, part_ptr, barrier_ptr, n_rows,
                   n_cols, CENTERED: tl.constexpr, SPLITS: tl.constexpr, SIBLINGS: tl.constexpr, SLICE: tl.constexpr,
                   PREFETCH: tl.constexpr, PHASE: tl.constexpr):
    # Program pid = group * SPLITS + s owns columns [s * SLICE, +SLICE) of rows group, group + groups, ...: it reads
    # its slice of x and dy once, stores its slice's two sums as the row's partials (part[row, s, :2]), meets its
    # siblings at the group's barrier, adds the row's partials and writes dx from registers: one read of the row,
    # where `_split_kernel` reads all of it for the sums and its slice again. PREFETCH: the next row's slice is
    # loaded before the barrier, so the wait overlaps the loads. PHASE 0 (a GPU): all of it; 1 and 2 (the
    # interpreter, whose programs run one after another): the partials of every row, then the rest.
    pid = tl.program_id(0)
    group = pid // SPLITS
    groups = tl.num_programs(0) // SPLITS
    own = (pid % SPLITS) * SLICE + tl.arange(0, SLICE)
    own_mask = own < n_cols
    sib = tl.arange(0, SIBLINGS)
    w = tl.load(w_ptr + own, mask=own_mask, other=0.0).to(tl.float32)
    dw = tl.zeros([SLICE], dtype=tl.float32)
    db = tl.zeros([SLICE], dtype=tl.float32)
    row = group
    base = tl.cast(row, tl.int64) * n_cols
    ok = own_mask & (tl.zeros([SLICE], dtype=tl.int32) + row < n_rows)
    x = tl.load(x_ptr + base + own, mask=ok, other=0.0).to(tl.float32)
    dy = tl.load(dy_ptr + base + own, mask=ok, other=0.0).to(tl.float32)
    while row < n_rows:
        nxt = row + groups
        base = tl.cast(row, tl.int64) * n_cols
        rstd = tl.load(rstd_ptr + row)
        mean = tl.load(mean_ptr + row) if CENTERED else 0.0
        xhat = tl.where(own_mask, (x - mean) * rstd, 0.0)
        wdy = w * dy
        if PHASE != 2:
            tl.store(part_ptr + (row * SPLITS + pid % SPLITS) * 2, tl.sum(wdy, axis=0))
            tl.store(part_ptr + (row * SPLITS + pid % SPLITS) * 2 + 1, tl.sum(xhat * wdy, axis=0))
        ok = own_mask & (tl.zeros([SLICE], dtype=tl.int32) + nxt < n_rows)
        if PREFETCH:  # issued before the wait, used after it
            x_n = tl.load(x_ptr + base + n_cols * groups + own, mask=ok, other=0.0)
            dy_n = tl.load(dy_ptr + base + n_cols * groups + own, mask=ok, other=0.0)
        if PHASE == 0:
            _row_barrier(barrier_ptr + group * 32, SPLITS)
        if PHASE != 1:
            p = part_ptr + (row * SPLITS + sib) * 2
            c1 = tl.sum(tl.load(p, mask=sib < SPLITS, other=0.0, cache_modifier=".cg"), axis=0) / n_cols \
                if CENTERED else 0.0
            c2 = tl.sum(tl.load(p + 1, mask=sib < SPLITS, other=0.0, cache_modifier=".cg"), axis=0) / n_cols
            tl.store(dx_ptr + base + own, ((wdy - c1 - xhat * c2) * rstd).to(dx_ptr.dtype.element_ty), mask=own_mask)
            dw += dy * xhat
            if CENTERED:
                db += dy
        if PREFETCH:
            x = x_n.to(tl.float32)
            dy = dy_n.to(tl.float32)
        else:
            x = tl.load(x_ptr + base + n_cols * groups + own, mask=ok, other=0.0).to(tl.float32)
            dy = tl.load(dy_ptr + base + n_cols * groups + own, mask=ok, other=0.0).to(tl.float32)
        row = nxt
    if PHASE != 1:
        tl.store(dw_ptr + group * n_cols + own, dw, mask=own_mask)
        if CENTERED:
            tl.store(db_ptr + group * n_cols + own, db, mask=own_mask)


def bsplit(x, w, dy, mean, rstd, slice_: int = 4096, warps: int = 16, prefetch: bool = True) -> tuple:
    """The barrier split: column slices of `slice_`, the row's sums exchanged through a barrier; (dx, dw[, db]).
    One program an SM, so that every group's programs are resident together and the barrier ends."""
    n_rows, n_cols = x.shape
    splits = triton.cdiv(n_cols, slice_)
    groups = max(1, min(n_rows, num_sms(x) // splits))
    dx = torch.empty_like(x)
    partials = _partials(2 if mean is not None else 1, groups, x)
    part = torch.empty(n_rows * splits * 2, device=x.device, dtype=torch.float32)
    barriers = _row_barriers(x.device, groups)
    meta = dict(CENTERED=mean is not None, SPLITS=splits, SIBLINGS=triton.next_power_of_2(splits), SLICE=slice_,
                PREFETCH=prefetch, num_warps=warps)
    for phase in (1, 2) if INTERPRET else (0,):
        _bsplit_kernel[(groups * splits,)](x, w, dy, rstd if mean is None else mean, rstd, dx, partials[0],
                                           partials[-1], part, barriers, n_rows, n_cols, PHASE=phase, **meta)
    return (dx, *_finish(partials, w))


def inputs(norm: str, rows_: int, cols: int, device: str) -> dict:
    """The case's own inputs (x, w, dy and the saved statistics) at one bf16 shape."""
    g = torch.Generator().manual_seed(0)  # the inputs draw on the device from a CPU seed (device.on_device)
    module = layernorm if norm == "layernorm" else rmsnorm
    return module.make_backward_inputs({"rows": rows_, "cols": cols}, torch.bfloat16, device, g)


def call(norm: str, fn, t: dict):
    """fn on the case's inputs: layernorm passes its mean, rmsnorm None."""
    return fn(t["x"], t["w"], t["dy"], t.get("mean"), t["rstd"]) if norm == "layernorm" else \
        fn(t["x"], t["w"], t["dy"], None, t["rstd"])


def check() -> None:
    """Both candidates against each case's float64 reference, at widths that take every path (a ragged
    row, a split row, a last slice that is partly past the row)."""
    for norm, module in (("rmsnorm", rmsnorm), ("layernorm", layernorm)):
        for rows_, cols in ((37, 1000), (9, 4096), (5, 12000)):
            t = inputs(norm, rows_, cols, "cpu")
            ref = module.reference_backward(*(v.double() for v in t.values()))
            for name, fn in (("rows", lambda *a: rows(*a, stages=2)),
                             ("split", lambda *a: split(*a, slice_=2048, chunk=1024, warps=4)),
                             ("bsplit", lambda *a: bsplit(*a, slice_=2048, warps=4, prefetch=False)),
                             ("bsplit, prefetch", lambda *a: bsplit(*a, slice_=2048, warps=4))):
                got = call(norm, fn, t)
                worst = max(((g.double() - r).norm() / r.norm()).item() for g, r in zip(got, ref))
                verdict = "ok" if worst < 2e-2 else "WRONG"
                print(f"{norm:9s} {rows_:3d} x {cols:5d} {name:16s}: worst relative error {worst:.2e} {verdict}")


def compile_only() -> None:
    """Registers and stack of the committed kernels, Liger's and the candidates, lowered for sm_90a."""
    sys.path.insert(0, str(Path(__file__).parents[1]))  # aot.py, shared by the explorations
    from aot import jit_report

    f32 = {n: "*fp32" for n in ("mean_ptr", "rstd_ptr", "dw_ptr", "db_ptr", "Mean_ptr", "RSTD_ptr", "DW_ptr", "DB_ptr")}
    for cols in (4096, 8192, 16384):
        warps = max(1, min(32, cols // 256))
        for norm, module in (("rmsnorm", rmsnorm), ("layernorm", layernorm)):
            print(f"{cols:5d} {norm:9s} committed, {warps} warps:",
                  jit_report(module._backward_kernel, f32, {"ATOMIC": False, "BLOCK": cols}, num_warps=warps))
            for stages in (2, 3):
                print(f"{cols:5d} {norm:9s} rows, {stages} stages:", jit_report(
                    _rows_kernel, f32, {"CENTERED": norm == "layernorm", "STAGES": stages, "BLOCK": cols},
                    num_warps=warps))
        if cols >= 8192:
            for slice_, w in SPLIT_RUNGS:
                consts = {"CENTERED": True, "SPLITS": cols // slice_, "SLICE": slice_, "CHUNK": 4096, "STAGES": 3}
                print(f"{cols:5d} layernorm split {slice_}, {w} warps:", jit_report(_split_kernel, f32, consts,
                                                                                   num_warps=w))
    for slice_, w, prefetch in BSPLIT_RUNGS:
        consts = {"CENTERED": True, "SPLITS": 16384 // slice_, "SIBLINGS": 16384 // slice_, "SLICE": slice_,
                  "PREFETCH": prefetch, "PHASE": 0}
        print(f"16384 layernorm bsplit {slice_}, {w} warps{', prefetch' if prefetch else ''}:",
              jit_report(_bsplit_kernel, {**f32, "part_ptr": "*fp32", "barrier_ptr": "*i32"}, consts, num_warps=w))
    import liger_kernel.ops.layer_norm as liger
    for cols in (4096, 16384):
        _, w = liger.calculate_settings(cols)
        consts = {"rows_per_program": 62, "BLOCK_SIZE": cols, "COMPUTE_DW": True, "COMPUTE_DB": True}
        print(f"{cols:5d} layernorm Liger, {w} warps:", jit_report(liger._layer_norm_backward_kernel, f32, consts,
                                                                   num_warps=w))


def time_on_gpu(shapes, once: bool) -> None:
    """Every rung at each shape, TB/s on the case's traffic model (do_bench: L2 flushed, median)."""
    from triton.testing import do_bench

    for norm, module in (("rmsnorm", rmsnorm), ("layernorm", layernorm)):
        for rows_, cols in shapes:
            t = inputs(norm, rows_, cols, "cuda")
            model = module.traffic_backward({"rows": rows_, "cols": cols}, torch.bfloat16).bytes
            ref = None if once else module.reference_backward(*(v.double() for v in t.values()))  # not profiled
            runs = {"committed triton_partial": module.triton_partial, "liger": module.liger_backward,
                    "torch": module.torch_backward}
            if cols <= 16384:
                runs.update({f"rows, {s} stages, {n}/SM": (lambda s, n: lambda *a: rows(*a, stages=s, per_sm=n))(s, n)
                             for s, n in ROWS_RUNGS})
            runs.update({f"split {sl}, {w} warps": (lambda sl, w: lambda *a: split(*a, slice_=sl, warps=w))(sl, w)
                         for sl, w in SPLIT_RUNGS if cols >= 2 * sl})
            runs.update({f"bsplit {sl}, {w} warps{', prefetch' if pf else ''}":
                         (lambda sl, w, pf: lambda *a: bsplit(*a, slice_=sl, warps=w, prefetch=pf))(sl, w, pf)
                         for sl, w, pf in BSPLIT_RUNGS if cols >= 2 * sl})
            for name, fn in runs.items():
                kernel = (lambda: fn(*t.values())) if name in ("committed triton_partial", "liger", "torch") \
                    else (lambda: call(norm, fn, t))
                try:
                    got = kernel()
                except (NotImplementedError, RuntimeError) as e:
                    print(f"{norm:9s} {rows_} x {cols} {name:30s} skipped: {str(e).splitlines()[0][:80]}")
                    continue
                torch.cuda.synchronize()
                if once:  # ncu reads this launch's counters
                    continue
                worst = max(((g.double() - r).norm() / r.norm()).item() for g, r in zip(got, ref))
                us = do_bench(kernel, warmup=25, rep=200, return_mode="median") * 1e3
                print(f"{norm:9s} {rows_} x {cols} {name:30s} {us:8.1f} us {model / us / 1e6:5.2f} TB/s "
                      f"(error {worst:.1e})", flush=True)


def main() -> None:
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    if "--compile" in sys.argv:
        compile_only()
    elif "--check" in sys.argv:
        check()
    else:
        shapes = list(zip(map(int, args[::2]), map(int, args[1::2]))) or SHAPES
        time_on_gpu(shapes, "--once" in sys.argv)


if __name__ == "__main__":
    main()
