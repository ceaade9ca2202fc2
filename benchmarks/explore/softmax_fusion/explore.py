"""Device exploration (not a casebook run): which softmax long-row design, and does a TMA GEMM reach cuBLAS?
do_bench medians with L2 cleared; correctness against torch.softmax / torch.matmul on each candidate.
What it found is in notes/softmax_fusion.md ("Rows split across programs").

The "v1_online" column there is the kernel module as of commit 6e81945; to compare against it again:
    git show 6e81945:casebook/kernels/softmax_fusion.py > benchmarks/explore/softmax_fusion/softmax_v1.py
(without that file the column is skipped). The split kernel is called with today's one-word barrier.
"""
import json
import sys
import time
import traceback

import torch
import triton
from triton.testing import do_bench

sys.path.insert(0, "benchmarks/explore/softmax_fusion")
try:
    import softmax_v1 as old
except ImportError:
    old = None
from casebook.kernels import gemm_common as gc
from casebook.kernels import softmax_fusion as new

out = {}
def bench(f):
    return do_bench(f, warmup=25, rep=150, return_mode="median") * 1e3  # us

def rec(key, us, nbytes=None, flops=None, err=None):
    d = {"us": round(us, 2)}
    if nbytes: d["tbps"] = round(nbytes / us / 1e6, 3)
    if flops: d["tflops"] = round(flops / us / 1e6, 1)
    if err is not None: d["err"] = float(err)
    out[key] = d
    print(key, d, flush=True)

def try_(key, f, ref, nbytes=None, flops=None):
    try:
        y = f(); e = (y.float() - ref.float()).abs().max().item()
        rec(key, bench(f), nbytes, flops, e)
    except Exception as ex:
        out[key] = {"error": repr(ex)[:300]}; print(key, "ERROR", repr(ex)[:300], flush=True)

t0 = time.time()
SHAPES = [(32768, 1024), (32768, 4096), (16384, 8192), (8192, 16384), (4096, 32768), (4096, 65536),
          (2048, 131072), (1024, 262144), (256, 128256), (128, 151936), (16, 262144), (1, 262144)]
sms = torch.cuda.get_device_properties(0).multi_processor_count
for rows, cols in SHAPES:
    x = torch.randn(rows, cols, device="cuda", dtype=torch.bfloat16) * 2
    ref = torch.softmax(x.float(), -1)
    nb = 2 * x.numel() * 2
    k = f"sm {rows}x{cols}"
    try_(k + " torch", lambda: torch.softmax(x, -1), ref, nb)
    if old is not None:
        try_(k + " v1_online", lambda: old.triton_online(x), ref, nb)
    try_(k + " new_online", lambda: new.triton_online(x), ref, nb)
    if cols <= 32768:
        try_(k + " onepass", lambda: new.triton_onepass(x), ref, nb)
    if cols >= 8192:
        y = torch.empty_like(x)
        m = torch.empty(rows * triton.cdiv(cols, 2048), device="cuda"); s = torch.empty_like(m)
        barriers = new._row_barriers(x.device, rows)
        for chunk in (2048, 4096, 8192, 16384):
            for w in (4, 8, 16):
                if not (8 <= chunk // (32 * w) <= 64) or triton.cdiv(cols, chunk) > sms: continue
                g = triton.cdiv(cols, chunk)
                def split(chunk=chunk, w=w, g=g):
                    new._split_row_kernel[(rows * g,)](x, y, m, s, barriers, rows, cols, x.stride(0), CHUNK=chunk,
                                                       MAX_CHUNKS=triton.next_power_of_2(g), PHASE=0, num_warps=w)
                    return y
                try_(k + f" split c{chunk} w{w}", split, ref, nb)
    if cols <= 4096:
        y = torch.empty_like(x)
        for R in (1, 2, 4, 8, 16):
            for w in (1, 2, 4, 8):
                if R * cols > 32768 or w * 32 * 4 > R * cols: continue
                def f3(R=R, w=w):
                    new._onepass_kernel[(triton.cdiv(rows, R),)](x, y, rows, cols, x.stride(0), ROWS=R, BLOCK=cols, num_warps=w)
                    return y
                try_(k + f" onepass R{R} w{w}", f3, ref, nb)
    del x, ref
    torch.cuda.empty_cache()
print("softmax done", time.time() - t0, flush=True)
try:
    at = new._split_row_tuned.cache; print({str(k): str(v) for k, v in at.items()})
    out["split_tuned"] = {str(k): str(v) for k, v in at.items()}
    out["onepass_tuned"] = {str(k): str(v) for k, v in new._onepass_tuned.cache.items()}
except Exception: traceback.print_exc()

# GEMM: cuBLAS against the three schedules (the TMA one with host-side descriptors)
for M, N, K in [(1024, 1024, 1024), (4096, 4096, 4096), (8192, 8192, 8192), (8192, 8192, 1024), (2048, 28672, 4096)]:
    a = torch.randn(M, K, device="cuda", dtype=torch.bfloat16); b = torch.randn(K, N, device="cuda", dtype=torch.bfloat16)
    ref = a @ b; fl = 2 * M * N * K; k = f"mm {M}x{N}x{K}"
    try_(k + " cublas", lambda: a @ b, ref, flops=fl)
    for sch in ("tiled", "persistent", "tma_persistent"):
        try_(k + " " + sch, lambda: gc.matmul(a, b, schedule=sch), ref, flops=fl)
    for kern in (gc._tiled_kernel, gc._persistent_kernel, gc._tma_persistent_kernel):
        out[f"{k} cfg {kern.fn.__name__ if hasattr(kern.fn, '__name__') else kern}"] = str(kern.best_config)
    print({kk: v for kk, v in out.items() if kk.startswith(k + " cfg")}, flush=True)
    bias = torch.randn(N, device="cuda", dtype=torch.bfloat16)
    if K == 1024:
        ref2 = torch.nn.functional.gelu(torch.addmm(bias, a, b))
        try_(k + " addmm_gelu", lambda: torch.nn.functional.gelu(torch.addmm(bias, a, b)), ref2, flops=fl)
        for sch in ("tiled", "persistent", "tma_persistent"):
            try_(k + " fused " + sch, lambda: gc.matmul(a, b, bias, True, schedule=sch), ref2, flops=fl)
    del a, b, ref
print("total", time.time() - t0, flush=True)
json.dump(out, open(sys.argv[1], "w"), indent=1)
