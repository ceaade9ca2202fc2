"""Whether the one-pass RMSNorm kernel's extra DRAM writes at 16K columns come with its warp count: `_rows_kernel`
(one row a program, ROWS=1) launched directly at each warp count, beside Liger's kernel, on the same inputs.

On the H200 the autotuner picked 32 warps at 8192 x 16384 bf16, and Nsight Compute counted 349 MB of writes for a
268 MB output where Liger (16 warps) wrote 242 MB (notes/rmsnorm.md). Times: `triton.testing.do_bench` (L2 flushed,
median), TB/s on the model's bytes (x read, y written). Bytes: each kernel launched once, under ncu.

    python3 benchmarks/explore/rmsnorm/onepass_warps.py [ROWS COLS]
    ncu --clock-control none --metrics dram__bytes_read.sum,dram__bytes_write.sum \\
        python3 benchmarks/explore/rmsnorm/onepass_warps.py [ROWS COLS] --once
"""

from __future__ import annotations

import sys

import torch
import triton
from triton.testing import do_bench

from casebook.kernels import rmsnorm as m

WARPS = (8, 16, 32)


def main() -> None:
    once = "--once" in sys.argv
    args = [a for a in sys.argv[1:] if a != "--once"]
    rows, cols = (int(args[0]), int(args[1])) if len(args) == 2 else (8192, 16384)
    g = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(rows, cols, device="cuda", dtype=torch.bfloat16, generator=g)
    w = torch.randn(cols, device="cuda", dtype=torch.bfloat16, generator=g)
    y = torch.empty_like(x)
    block = triton.next_power_of_2(cols)
    model_bytes = 2 * x.numel() * x.element_size() + w.numel() * w.element_size()

    def onepass(warps: int):
        return lambda: m._rows_kernel[(rows,)](x, x, w, x, y, rows, cols, m.EPS, RESIDUAL=False, ROWS=1, BLOCK=block,
                                               num_warps=warps)

    runs = {f"one-pass, {w_} warps": onepass(w_) for w_ in WARPS}
    runs["liger"] = lambda: m.liger(x, w)  # the case's peer rung (NotImplementedError where not installed)
    for name, fn in runs.items():
        try:
            fn()
        except NotImplementedError as e:
            print(f"{name}: {e}")
            continue
        torch.cuda.synchronize()
        if once:  # ncu reads this launch's counters
            continue
        us = do_bench(fn, warmup=25, rep=200, return_mode="median") * 1e3
        print(f"{rows} x {cols} bf16 {name:20s} {us:8.1f} us  {model_bytes / us / 1e6:5.2f} TB/s")


if __name__ == "__main__":
    main()
