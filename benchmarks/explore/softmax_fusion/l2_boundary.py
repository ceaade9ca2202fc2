"""Why does softmax at 32768 x 1024 bf16 (64 MB a tensor) read ~3.66 TB/s where larger shapes read 3.83+?

Three suspects, told apart by timing the same kernel and a same-size copy under three cache protocols
at tensor sizes from 16 MB to 512 MB (rows x 1024 bf16):
  dirty   the harness's cold protocol: a 2 x L2 buffer zeroed before each call, so the timed call
          starts by writing back up to an L2 of dirty lines (a fixed cost a call, whatever its size);
  clean   the same zeroing, then a read of another 2 x L2 buffer: the write-back happens before the
          timer starts, and the L2 holds clean, unrelated lines;
  warm    no flush: back-to-back calls on one buffer (what fits of it stays in L2).
Predictions (written before the run): if the dirty write-back is the cost, `dirty` loses a fixed
~10-15 us a call (50 MB at ~4 TB/s) and the gap to `clean` shrinks as 1/size, identically for the copy
and the kernel; if launch and tail are the cost, `clean` also falls under ~128 MB for both; if the
kernel is the cost, the kernel falls where the copy does not.

Run on a GPU: python3 benchmarks/explore/softmax_fusion/l2_boundary.py [OUT.json]
"""

from __future__ import annotations

import json
import statistics
import sys

import torch

from casebook.kernels.softmax_fusion import triton_onepass

REPS = 60
COLS = 1024


def l2_bytes() -> int:
    return torch.cuda.get_device_properties(0).L2_cache_size


def timed(fn, before) -> float:
    """Median of REPS calls, each timed with events after `before()` ran on the same stream."""
    start = [torch.cuda.Event(enable_timing=True) for _ in range(REPS)]
    end = [torch.cuda.Event(enable_timing=True) for _ in range(REPS)]
    for _ in range(5):
        before()
        fn()
    for s, e in zip(start, end):
        before()
        s.record()
        fn()
        e.record()
    torch.cuda.synchronize()
    return statistics.median(s.elapsed_time(e) * 1e3 for s, e in zip(start, end))


def main() -> None:
    flush = torch.empty(2 * l2_bytes() // 4, dtype=torch.int32, device="cuda")
    clean = torch.ones(2 * l2_bytes() // 4, dtype=torch.int32, device="cuda")
    sink = torch.empty((), dtype=torch.int64, device="cuda")
    protocols = {"dirty": lambda: flush.zero_(),
                 "clean": lambda: (flush.zero_(), torch.sum(clean, dim=0, out=sink)),
                 "warm": lambda: None}
    rows_list = [8192, 16384, 32768, 65536, 131072, 262144]
    out = []
    print(f"L2 {l2_bytes() / 2**20:.0f} MiB; TB/s counting one read and one write")
    print(f"{'MB/tensor':>9} {'op':>8} " + " ".join(f"{p:>14}" for p in protocols))
    for rows in rows_list:
        x = torch.randn(rows, COLS, device="cuda").mul_(2).to(torch.bfloat16)
        y = torch.empty_like(x)
        moved = 2 * x.numel() * x.element_size()
        ops = {"onepass": lambda: triton_onepass(x), "softmax": lambda: torch.softmax(x, -1),
               "copy": lambda: y.copy_(x)}
        for name, fn in ops.items():
            row = {"rows": rows, "cols": COLS, "op": name, "mb_per_tensor": moved / 2 / 2**20}
            cells = []
            for p, before in protocols.items():
                us = timed(fn, before)
                row[f"{p}_us"] = us
                cells.append(f"{us:7.1f}us {moved / us / 1e6:4.2f}")
            out.append(row)
            print(f"{moved / 2 / 2**20:9.0f} {name:>8} " + " ".join(f"{c:>14}" for c in cells))
        del x, y
    # Launch: ten back-to-back warm calls in one CUDA graph against one call at a time.
    x = torch.randn(32768, COLS, device="cuda").to(torch.bfloat16)
    triton_onepass(x)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(10):
            triton_onepass(x)
    per_call = timed(g.replay, lambda: None) / 10
    print(f"32768 x 1024 onepass in a graph of 10 warm calls: {per_call:.1f} us a call")
    out.append({"rows": 32768, "cols": COLS, "op": "onepass_graph10_warm", "per_call_us": per_call})
    if len(sys.argv) > 1:
        json.dump(out, open(sys.argv[1], "w"), indent=1)


if __name__ == "__main__":
    main()
