"""Device exploration: do long rows swept twice by persistent programs get their second sweep from L2?

Not a casebook run.

The split kernel (one read, one write) holds 64K-256K bf16 rows at 2.9-3.1 TB/s; the whole-row
persistent kernel lifted 32K from 3.1 to 3.45 by keeping loads in flight, but rows over 32K do not fit
on chip. These kernels never hold a row: each persistent program walks its rows in chunks, first for
the online (max, sum), then again to normalise and store. With one or two programs per SM, the bytes
read and not yet re-read are programs x row bytes (132 x 128 KB = 17 MB at 64K bf16), well inside the
50 MB L2, so the second sweep should hit L2 and device memory should see one read and one write. No
barrier, no cooperating programs: rows are independent, so SMs never wait on each other.

The first version of the case (grid = rows, several programs per SM, no pipelining) tried a second
sweep and got 2.41-2.68 TB/s; there the working set was rows in flight x row bytes with 4-8 programs
per SM, well past L2. Here the grid is capped at 1-2 programs per SM and the chunk loop is pipelined.

  two_sweep  two pipelined loops per row (stats, then normalise); the pipeline drains between them
  flat       one pipelined loop over (row, sweep, chunk): the loads never stop at a sweep or row edge;
             one exp per element in both sweeps (the running max is the exponent's shift in sweep 1)

Prediction (written before the run): at 64K bf16, 3.6 TB/s or more for the best configuration (the
32K whole-row kernel's 3.45 plus the drained-barrier share), against 3.12 committed; at 256K with 132
programs the working set (67 MB) exceeds L2 and the second sweep misses: expect no gain unless fewer
programs (64: 33 MB) can still pull the bandwidth.

Result: falsified. Best at 64K bf16 2.74 TB/s (two_sweep,
8K chunk, 16 warps, 2 per SM) against 3.12 committed; flat at most 1.87. Bandwidth rose with warps,
chunk and programs per SM, and 256K (working set far past L2) did as well as 64K: the kernels are
latency-bound per chunk (a block-wide reduction and a wait on each chunk's load), not L2-bound.

  lane       the second try: running (max, sum) per lane, so no block-wide reduction in the loops,
             and the next chunk's load issued by hand before this one is used.
Prediction for lane (written before its run): if per-chunk latency is the limit, 64K bf16 reaches
3.3 TB/s or more with 2-4 programs per SM.

    python3 benchmarks/explore/softmax_fusion/two_sweep_rows.py          (GPU; --lane for the second run)
    TRITON_INTERPRET=1 python3 benchmarks/explore/softmax_fusion/two_sweep_rows.py --check
"""
import sys

import torch
import triton
import triton.language as tl

from casebook.kernels import softmax_fusion as sf


@triton.jit
def _two_sweep_kernel(x_ptr, y_ptr, n_rows, n_cols, stride, CHUNK: tl.constexpr, STAGES: tl.constexpr,
                      EVICT: tl.constexpr):
    offs = tl.arange(0, CHUNK)
    for row in range(tl.program_id(0), n_rows, tl.num_programs(0)):
        base = tl.cast(row, tl.int64) * stride
        m = tl.full([], -float("inf"), tl.float32)
        s = tl.zeros([CHUNK], tl.float32)
        for start in tl.range(0, n_cols, CHUNK, num_stages=STAGES):
            cols = start + offs
            if EVICT:
                x = tl.load(x_ptr + base + cols, mask=cols < n_cols, other=-float("inf"),
                            eviction_policy="evict_last").to(tl.float32)
            else:
                x = tl.load(x_ptr + base + cols, mask=cols < n_cols, other=-float("inf")).to(tl.float32)
            m_new = tl.maximum(m, tl.max(x, axis=0))
            s = s * tl.exp(m - m_new) + tl.exp(x - m_new)
            m = m_new
        inv = 1.0 / tl.sum(s, axis=0)
        for start in tl.range(0, n_cols, CHUNK, num_stages=STAGES):
            cols = start + offs
            if EVICT:
                x = tl.load(x_ptr + base + cols, mask=cols < n_cols, other=0.0,
                            eviction_policy="evict_first").to(tl.float32)
                tl.store(y_ptr + base + cols, (tl.exp(x - m) * inv).to(y_ptr.dtype.element_ty),
                         mask=cols < n_cols, eviction_policy="evict_first")
            else:
                x = tl.load(x_ptr + base + cols, mask=cols < n_cols, other=0.0).to(tl.float32)
                tl.store(y_ptr + base + cols, (tl.exp(x - m) * inv).to(y_ptr.dtype.element_ty), mask=cols < n_cols)


@triton.jit
def _flat_kernel(x_ptr, y_ptr, n_rows, n_cols, stride, CHUNK: tl.constexpr, STAGES: tl.constexpr,
                 EVICT: tl.constexpr):
    # Iteration i of this program: its row i // (2 n), sweep (i // n) % 2, chunk i % n. Sweep 0 keeps
    # a running max m and per-lane sums relative to it; sweep 1 writes exp(x - m) / sum. Both sweeps
    # take exp(x - shift) once per element, shift being the new max (sweep 0) or the final one.
    n = tl.cdiv(n_cols, CHUNK)
    pid, progs = tl.program_id(0), tl.num_programs(0)
    my_rows = tl.cdiv(n_rows - pid, progs)
    offs = tl.arange(0, CHUNK)
    m = tl.full([], -float("inf"), tl.float32)
    s = tl.zeros([CHUNK], tl.float32)
    inv = tl.full([], 0.0, tl.float32)
    for i in tl.range(0, my_rows * 2 * n, num_stages=STAGES):
        row = pid + (i // (2 * n)) * progs
        k = i % (2 * n)
        first_sweep = k < n
        cols = (k % n) * CHUNK + offs
        ptr = tl.cast(row, tl.int64) * stride + cols
        if EVICT:
            x = tl.load(x_ptr + ptr, mask=cols < n_cols, other=-float("inf"), eviction_policy="evict_last")
        else:
            x = tl.load(x_ptr + ptr, mask=cols < n_cols, other=-float("inf"))
        x = x.to(tl.float32)
        m_old = tl.where(k == 0, -float("inf"), m)
        s = tl.where(k == 0, 0.0, s)
        m = tl.where(first_sweep, tl.maximum(m_old, tl.max(x, axis=0)), m_old)
        e = tl.exp(x - m)
        s = tl.where(first_sweep, s * tl.exp(m_old - m) + e, s)
        inv = tl.where(k == n, 1.0 / tl.sum(s, axis=0), inv)
        tl.store(y_ptr + ptr, (e * inv).to(y_ptr.dtype.element_ty), mask=(cols < n_cols) & (offs * 0 + k >= n),
                 eviction_policy="evict_first")


@triton.jit
def _lane_kernel(x_ptr, y_ptr, n_rows, n_cols, stride, CHUNK: tl.constexpr, STAGES: tl.constexpr,
                 EVICT: tl.constexpr):
    # Second try (after two_sweep and flat were latency-bound: bandwidth rose with warps and chunk,
    # not with the working set): no block-wide reduction inside the loops, so warps never wait for
    # each other, and the next chunk's load is issued by hand before this chunk is used. Sweep 1
    # keeps a running max and sum per lane (two exps per element), merged once per row.
    # (STAGES and EVICT are unused; the signature matches `launch`.)
    offs = tl.arange(0, CHUNK)
    n = tl.cdiv(n_cols, CHUNK)
    for row in range(tl.program_id(0), n_rows, tl.num_programs(0)):
        base = tl.cast(row, tl.int64) * stride
        m = tl.full([CHUNK], -float("inf"), tl.float32)
        s = tl.zeros([CHUNK], tl.float32)
        x_next = tl.load(x_ptr + base + offs, mask=offs < n_cols, other=-float("inf"), eviction_policy="evict_last")
        for k in range(0, n):
            x = x_next.to(tl.float32)
            cols = (k + 1) * CHUNK + offs
            x_next = tl.load(x_ptr + base + cols, mask=cols < n_cols, other=-float("inf"),
                             eviction_policy="evict_last")
            m_new = tl.maximum(m, x)
            shift = tl.where(m_new == -float("inf"), 0.0, m_new)  # lanes that saw only padding
            s = s * tl.exp(m - shift) + tl.exp(x - shift)
            m = m_new
        row_max = tl.max(m, axis=0)
        inv = 1.0 / tl.sum(s * tl.exp(m - row_max), axis=0)
        x_next = tl.load(x_ptr + base + offs, mask=offs < n_cols, other=0.0, eviction_policy="evict_first")
        for k in range(0, n):
            x = x_next.to(tl.float32)
            cols = (k + 1) * CHUNK + offs
            x_next = tl.load(x_ptr + base + cols, mask=cols < n_cols, other=0.0, eviction_policy="evict_first")
            tl.store(y_ptr + base + cols - CHUNK, (tl.exp(x - row_max) * inv).to(y_ptr.dtype.element_ty),
                     mask=cols - CHUNK < n_cols, eviction_policy="evict_first")


def launch(kernel, x, chunk, warps, programs, stages=3, evict=0):
    y = torch.empty_like(x)
    kernel[(min(programs, x.shape[0]),)](x, y, x.shape[0], x.shape[1], x.stride(0), CHUNK=chunk, STAGES=stages,
                                          EVICT=evict, num_warps=warps)
    return y


def check():
    for dt in (torch.bfloat16, torch.float32):
        for r, cols in ((1, 1), (37, 760), (5, 4100), (3, 65537), (7, 3000)):
            x = (torch.randn(r, cols) * 2).to(dt)
            ref = torch.softmax(x.double(), -1)
            for kernel in (_two_sweep_kernel, _flat_kernel, _lane_kernel):
                for evict in (0, 1):
                    y = launch(kernel, x, 1024, 4, 3, stages=2, evict=evict)
                    err = ((y.double() - ref).norm() / ref.norm()).item()
                    assert err < 1e-2, (kernel, dt, r, cols, err)
    print("interpreter check passed")


def explore():
    from rowbench import bench, logits

    sms = torch.cuda.get_device_properties(0).multi_processor_count
    shapes = ((4096, 65536, torch.bfloat16), (2048, 131072, torch.bfloat16), (1024, 262144, torch.bfloat16),
              (4096, 32768, torch.bfloat16), (4096, 65536, torch.float32), (256, 128256, torch.bfloat16),
              (4096, 262144, torch.bfloat16))
    for n_rows, n_cols, dt in shapes:
        x, ref, nb, key = logits(n_rows, n_cols, dt)
        bench(f"{key} triton_online (committed)", lambda: sf.triton_online(x), ref, nb)
        bench(f"{key} copy", lambda: x.clone(), ref.to(dt), nb)
        for chunk, warps in ((4096, 8), (8192, 8), (8192, 16), (16384, 16)):
            for per_sm in (1, 2):
                for evict in (0, 1):
                    bench(f"{key} two_sweep chunk={chunk} w={warps} per_sm={per_sm} ev={evict}",
                          lambda c=chunk, w=warps, p=per_sm, e=evict: launch(_two_sweep_kernel, x, c, w, sms * p, evict=e),
                          ref, nb)
                bench(f"{key} flat chunk={chunk} w={warps} per_sm={per_sm}",
                      lambda c=chunk, w=warps, p=per_sm: launch(_flat_kernel, x, c, w, sms * p), ref, nb)
        if n_cols >= 262144:  # a smaller working set: fewer programs, each pulling more
            for programs in (64, 96):
                bench(f"{key} two_sweep chunk=8192 w=16 programs={programs} ev=1",
                      lambda p=programs: launch(_two_sweep_kernel, x, 8192, 16, p, evict=1), ref, nb)
                bench(f"{key} flat chunk=8192 w=16 programs={programs}",
                      lambda p=programs: launch(_flat_kernel, x, 8192, 16, p), ref, nb)
        del x, ref
        torch.cuda.empty_cache()


def explore_lane():
    """The second run: the lane kernel against the committed kernels at the long-row shapes."""
    from rowbench import bench, logits

    sms = torch.cuda.get_device_properties(0).multi_processor_count
    for n_rows, n_cols, dt in ((4096, 65536, torch.bfloat16), (1024, 262144, torch.bfloat16),
                               (4096, 32768, torch.bfloat16), (256, 128256, torch.bfloat16)):
        x, ref, nb, key = logits(n_rows, n_cols, dt)
        bench(f"{key} triton_online (committed)", lambda: sf.triton_online(x), ref, nb)
        for chunk, warps, per_sm in ((2048, 4, 4), (4096, 4, 4), (4096, 8, 2), (4096, 8, 4), (8192, 8, 2),
                                     (8192, 16, 1), (8192, 16, 2)):
            bench(f"{key} lane chunk={chunk} w={warps} per_sm={per_sm}",
                  lambda: launch(_lane_kernel, x, chunk, warps, sms * per_sm), ref, nb)
        del x, ref
        torch.cuda.empty_cache()


if __name__ == "__main__":
    if "--check" in sys.argv:
        check()
    elif "--lane" in sys.argv:
        explore_lane()
    else:
        explore()
