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

from casebook.kernels import layernorm, rmsnorm
from casebook.kernels.norm_backward import _bsplit_kernel, _rows_kernel, _split_kernel, bsplit, rows, split

SHAPES = ((16384, 4096), (32768, 4096), (16384, 8192), (8192, 16384), (2048, 32768))
"""The level-1 shapes of both backward cases past 512 rows (bf16)."""

ROWS_RUNGS = ((1, 2), (2, 2), (3, 1), (3, 2), (4, 1))
"""(stages, programs an SM) of the pipelined row kernel: 1 stage, 2 an SM is the committed kernel's loop."""

SPLIT_RUNGS = ((8192, 16), (8192, 32), (4096, 16))
"""(slice, warps) of the split kernel, where a row holds at least two slices."""


BSPLIT_RUNGS = ((8192, 16, False), (8192, 16, True), (4096, 16, False), (4096, 16, True), (4096, 8, True))
"""(slice, warps, prefetch) of the barrier split, where a row holds at least two slices."""


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
