"""Device exploration (not a casebook run): does prefetching the next row or chunk lift long-row softmax?

The packed-bf16 experiment (notes/softmax_fusion.md) showed that registers are not what
holds bf16 long rows at 69-76% of the copy rate. The remaining suspect is the load-free phases of each
program's life: reductions, the row barrier's wait, the store's drain. These kernels are persistent:
each program walks rows (or one chunk of many rows), and the next item's load is in flight while this
one reduces, waits and stores: whole rows through `tl.range(..., num_stages=STAGES)`, which Triton
pipelines with asynchronous copies into shared memory; split rows through a load issued by hand one
iteration ahead (the pipeliner leaves a loop with the row barrier in it alone).

Prediction (written before the run): at 32K-256K columns bf16 these reach 3.5 TB/s or more, against
3.1 (32K, 64K) and 2.9 (256K) for the committed kernels, if the load-free phases are the limit.

    python3 benchmarks/explore/softmax_fusion/persistent_prefetch.py          (GPU; correctness via the interpreter:
    TRITON_INTERPRET=1 python3 benchmarks/explore/softmax_fusion/persistent_prefetch.py --check)
"""
import sys

import torch
import triton
import triton.language as tl

from casebook.kernels import softmax_fusion as sf


@triton.jit
def _split_kernel(x_ptr, y_ptr, m_ptr, s_ptr, barrier_ptr, n_rows, n_cols, stride, groups,
                  CHUNK: tl.constexpr, MAX_CHUNKS: tl.constexpr, PHASE: tl.constexpr):
    # Program p holds chunk p % n_chunks of rows p // n_chunks, + groups, + 2 groups, ...; the chunks of
    # a row meet at the committed kernel's row barrier. The next row's chunk is loaded into registers
    # before this row's reductions, barrier and store (Triton's pipeliner leaves a loop with a barrier
    # inside alone, so the prefetch is by hand). PHASE as in softmax_fusion._split_row_kernel.
    n_chunks = tl.cdiv(n_cols, CHUNK)
    pid = tl.program_id(0)
    chunk = pid % n_chunks
    cols = chunk * CHUNK + tl.arange(0, CHUNK)
    mask = cols < n_cols
    c = tl.arange(0, MAX_CHUNKS)
    first = pid // n_chunks
    x_next = tl.load(x_ptr + tl.cast(first, tl.int64) * stride + cols, mask=mask & (cols * 0 + first < n_rows),
                     other=-float("inf"))
    for row in tl.range(first, n_rows, groups):
        row64 = tl.cast(row, tl.int64)
        x = x_next.to(tl.float32)
        x_next = tl.load(x_ptr + (row64 + groups) * stride + cols, mask=mask & (cols * 0 + row + groups < n_rows),
                         other=-float("inf"))
        chunk_max = tl.max(x, axis=0)
        e = tl.exp(x - chunk_max)
        stats = row64 * n_chunks
        if PHASE != 2:
            tl.store(m_ptr + stats + chunk, chunk_max)
            tl.store(s_ptr + stats + chunk, tl.sum(e, axis=0))
        if PHASE == 0:
            sf._row_barrier(barrier_ptr + row64 * 32, n_chunks)
        if PHASE != 1:
            cm = tl.load(m_ptr + stats + c, mask=c < n_chunks, other=-float("inf"), cache_modifier=".cg")
            cs = tl.load(s_ptr + stats + c, mask=c < n_chunks, other=0.0, cache_modifier=".cg")
            row_max = tl.max(cm, axis=0)
            scale = tl.exp(chunk_max - row_max) / tl.sum(cs * tl.exp(cm - row_max), axis=0)
            tl.store(y_ptr + row64 * stride + cols, (e * scale).to(y_ptr.dtype.element_ty), mask=mask)


def rows(x, programs, warps, stages):
    y = torch.empty_like(x)
    block = triton.next_power_of_2(x.shape[1])
    # The kernel this exploration tried is the one triton_online now streams 16K-32K rows through.
    sf._streaming_rows_kernel[(min(programs, x.shape[0]),)](x, y, x.shape[0], x.shape[1], x.stride(0),
                                                             BLOCK=block, STAGES=stages, num_warps=warps)
    return y


def split(x, programs, chunk, warps, interpreted=False):
    n_rows, n_cols = x.shape
    n_chunks = triton.cdiv(n_cols, chunk)
    groups = max(1, min(n_rows, programs // n_chunks))
    y = torch.empty_like(x)
    m = torch.empty(n_rows * n_chunks, device=x.device)
    s = torch.empty_like(m)
    meta = dict(CHUNK=chunk, MAX_CHUNKS=triton.next_power_of_2(n_chunks), num_warps=warps)
    if interpreted:
        for phase in (1, 2):
            _split_kernel[(groups * n_chunks,)](x, y, m, s, m, n_rows, n_cols, x.stride(0), groups, PHASE=phase, **meta)
        return y
    barriers = sf._row_barriers(x.device, n_rows)
    _split_kernel[(groups * n_chunks,)](x, y, m, s, barriers, n_rows, n_cols, x.stride(0), groups, PHASE=0, **meta)
    return y


def check():
    for dt in (torch.bfloat16, torch.float32):
        for r, cols in ((37, 760), (5, 4100), (3, 65537)):
            x = (torch.randn(r, cols) * 2).to(dt)
            ref = torch.softmax(x.double(), -1)
            outs = [split(x, 8, 16384, 4, interpreted=True)] + ([rows(x, 4, 4, 2)] if cols <= 32768 else [])
            for y in outs:
                err = ((y.double() - ref).norm() / ref.norm()).item()
                assert err < 1e-2, (dt, r, cols, err)
    print("interpreter check passed")


def explore():
    from rowbench import bench, logits

    sms = torch.cuda.get_device_properties(0).multi_processor_count

    for n_rows, n_cols in ((4096, 32768), (4096, 65536), (1024, 262144), (128, 151936)):
        x, ref, nb, key = logits(n_rows, n_cols, torch.bfloat16)
        bench(f"{key} triton_online (committed)", lambda: sf.triton_online(x), ref, nb)
        if n_cols <= 32768:
            for warps, stages in ((32, 2), (32, 3), (16, 2), (16, 3)):
                bench(f"{key} rows warps={warps} stages={stages}", lambda w=warps, s=stages: rows(x, sms, w, s), ref, nb)
        # Two programs per SM only where two fit (8K x 8 warps: 79 registers; the others take 92-154).
        for chunk, warps, per_sm in ((8192, 8, 1), (8192, 8, 2), (16384, 8, 1), (16384, 16, 1)):
            bench(f"{key} split chunk={chunk} warps={warps} per_sm={per_sm}",
                  lambda c=chunk, w=warps, p=per_sm: split(x, sms * p, c, w), ref, nb)
        del x, ref
        torch.cuda.empty_cache()


if __name__ == "__main__":
    check() if "--check" in sys.argv else explore()
