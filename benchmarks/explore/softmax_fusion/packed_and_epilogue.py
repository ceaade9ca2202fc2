"""Device exploration (not a casebook run): do packed bf16 chunks lift softmax, and what does the GELU epilogue cost?

1. softmax: does holding the loaded bf16 chunk (packed, exp recomputed on the way out) instead of its fp32
   exponentials lift the long rows toward the copy rate? Split-kernel configurations (chunk x warps x
   hold) and the one-pass kernel, one by one, at the case's long-row and vocabulary shapes.
2. gemm_epilogue: what the GELU epilogue costs on the persistent TMA GEMM in its erf and tanh forms,
   with one or two programs per SM and with warp specialisation, beside cuBLAS and the library rungs.

Timed by casebook's own harness (cold L2, events, median), before changing the kernels' defaults;
the findings are in notes/softmax_fusion.md and cases/gemm_epilogue.yaml. It ran with the softmax module of commit 8a9219e
and the gemm_common of commit c7b49fc, which have the knobs it turns (HOLD_INPUT, WARP_SPECIALIZE, the
tanh form through exp2); both knobs were measured slower and removed after, so to run it again, check
those two modules out first:
    git show 8a9219e:casebook/kernels/softmax_fusion.py > casebook/kernels/softmax_fusion.py
    git show c7b49fc:casebook/kernels/gemm_common.py > casebook/kernels/gemm_common.py
    python3 benchmarks/explore/softmax_fusion/packed_and_epilogue.py [softmax|gemm ...]
"""
import sys
import time

import torch
import torch.nn.functional as F
import triton

from casebook.kernels import gemm_common as gc
from casebook.kernels import softmax_fusion as sf
from casebook.run.bench import Protocol, time_fn

PROTO = Protocol(time_cap_s=0.3, target_ci=0.02)
SMS = torch.cuda.get_device_properties(0).multi_processor_count
t0 = time.time()


def bench(label, f, ref, nbytes=None, flops=None):
    try:
        y = f()
        err = ((y.float() - ref).norm() / ref.norm()).item()
        s = time_fn(f, "cuda", PROTO).summary
    except Exception as e:  # a config that does not compile or launch is reported, not fatal
        print(f"{label:60s} ERROR {repr(e)[:200]}", flush=True)
        return None
    rate = f"{nbytes / s.median_us / 1e6:6.3f} TB/s" if nbytes else f"{flops / s.median_us / 1e6:6.1f} TFLOP/s"
    print(f"{label:60s} {s.median_us:9.1f} us  p10 {s.p10_us:8.1f}  p90 {s.p90_us:8.1f}  {rate}  err {err:.1e}",
          flush=True)
    return s.median_us


def softmax():
    shapes = [(131072, 1024), (4096, 32768), (4096, 65536), (2048, 131072), (1024, 262144),
              (64, 32000), (256, 128256), (128, 151936), (32, 128256)]
    for rows, cols in shapes:
        x = torch.randn(rows, cols, device="cuda", dtype=torch.float32).mul_(2).to(torch.bfloat16)
        ref = torch.softmax(x.float(), -1)
        nb = 4 * x.numel()
        key = f"sm {rows}x{cols}"
        bench(f"{key} copy", lambda: torch.empty_like(x).copy_(x), x.float(), nb)
        bench(f"{key} torch.softmax", lambda: torch.softmax(x, -1), ref, nb)
        bench(f"{key} triton_online (committed default)", lambda: sf.triton_online(x), ref, nb)
        if cols <= sf.MAX_ONEPASS:
            block = triton.next_power_of_2(cols)
            for r in (1, 2, 4, 8, 16):
                for w in (4, 8, 16, 32):
                    if not (4096 <= r * block <= sf.MAX_ONEPASS and 8 <= r * block // (32 * w) <= 64):
                        continue
                    for hold in (False, True):
                        def f(r=r, w=w, hold=hold):
                            y = torch.empty_like(x)
                            sf._onepass_kernel[(triton.cdiv(rows, r),)](x, y, rows, cols, x.stride(0), ROWS=r,
                                                                        BLOCK=block, HOLD_INPUT=hold, num_warps=w)
                            return y
                        bench(f"{key} onepass rows={r} warps={w} hold={int(hold)}", f, ref, nb)
        if cols >= 16384:
            m = torch.empty(rows * triton.cdiv(cols, 2048), device="cuda")
            s = torch.empty_like(m)
            barriers = sf._row_barriers(x.device, rows)
            for chunk, w in ((4096, 8), (8192, 8), (8192, 16), (16384, 8), (16384, 16), (32768, 16), (32768, 32)):
                    if triton.cdiv(cols, chunk) > SMS:
                        continue
                    for hold in (False, True):
                        if not hold and chunk == 32768:
                            continue
                        n = triton.cdiv(cols, chunk)

                        def f(chunk=chunk, w=w, hold=hold, n=n):
                            y = torch.empty_like(x)
                            sf._split_row_kernel[(rows * n,)](x, y, m, s, barriers, rows, cols, x.stride(0),
                                                              CHUNK=chunk, MAX_CHUNKS=triton.next_power_of_2(n),
                                                              PHASE=0, HOLD_INPUT=hold, num_warps=w)
                            return y
                        bench(f"{key} split chunk={chunk} warps={w} hold={int(hold)}", f, ref, nb)
        del x, ref
        torch.cuda.empty_cache()
        print(f"-- {time.time() - t0:.0f} s", flush=True)


def gemm():
    for mm, nn, kk in [(8192, 8192, 1024), (4096, 4096, 4096)]:
        g = torch.Generator(device="cuda").manual_seed(0)
        a = torch.randn(mm, kk, device="cuda", generator=g).to(torch.bfloat16)
        b = (torch.randn(kk, nn, device="cuda", generator=g) * kk**-0.5).to(torch.bfloat16)
        bias = (torch.randn(nn, device="cuda", generator=g) * 0.5).to(torch.bfloat16)
        pre = a.float() @ b.float() + bias.float()
        ref = {"none": pre, "erf": F.gelu(pre), "tanh": F.gelu(pre)}  # tanh form judged against the exact GELU
        flops = 2 * mm * nn * kk
        key = f"gemm {mm}x{nn}x{kk}"
        bench(f"{key} cublas mm", lambda: a @ b, pre - bias.float(), flops=flops)
        bench(f"{key} addmm", lambda: torch.addmm(bias, a, b), pre, flops=flops)
        bench(f"{key} addmm + gelu(erf)", lambda: F.gelu(torch.addmm(bias, a, b)), ref["erf"], flops=flops)
        bench(f"{key} addmm + gelu(tanh)", lambda: F.gelu(torch.addmm(bias, a, b), approximate="tanh"), ref["erf"], flops=flops)
        if hasattr(torch, "_addmm_activation"):
            bench(f"{key} _addmm_activation(gelu) [cuBLASLt]", lambda: torch._addmm_activation(bias, a, b, use_gelu=True),
                  ref["erf"], flops=flops)
        c0 = a @ b
        bench(f"{key} gelu(erf) pass alone", lambda: F.gelu(c0), F.gelu(c0.float()), nbytes=4 * c0.numel())
        bench(f"{key} gelu(tanh) pass alone", lambda: F.gelu(c0, approximate="tanh"), F.gelu(c0.float()), nbytes=4 * c0.numel())
        for mode in ("none", "erf", "tanh"):
            bench(f"{key} triton tma autotuned gelu={mode}",
                  lambda mode=mode: gc.matmul(a, b, bias=None if mode == "none" else bias, gelu=mode,
                                              schedule="tma_persistent"), ref[mode] if mode != "none" else pre - bias.float(), flops=flops)
            bench(f"{key} triton tiled autotuned gelu={mode}",
                  lambda mode=mode: gc.matmul(a, b, bias=None if mode == "none" else bias, gelu=mode,
                                              schedule="tiled"), ref[mode] if mode != "none" else pre - bias.float(), flops=flops)
        kernel = gc._tma_persistent_kernel.fn
        configs = [(128, 256, 64, 3, 8, 1, False), (128, 256, 64, 4, 8, 1, False), (128, 128, 64, 4, 8, 1, False),
                   (128, 128, 64, 2, 8, 2, False), (128, 128, 64, 2, 4, 2, False), (128, 128, 32, 4, 4, 2, False),
                   (128, 256, 64, 3, 8, 1, True), (128, 128, 64, 4, 8, 1, True), (128, 256, 64, 4, 12, 1, True)]
        for bm, bn, bk, stages, warps, per_sm, ws in configs:
            for mode in ("none", "erf", "tanh"):
                def f(bm=bm, bn=bn, bk=bk, stages=stages, warps=warps, per_sm=per_sm, ws=ws, mode=mode):
                    c = torch.empty(mm, nn, device="cuda", dtype=a.dtype)
                    da = gc.TensorDescriptor.from_tensor(a, [bm, bk])
                    db = gc.TensorDescriptor.from_tensor(b, [bk, bn])
                    dc = gc.TensorDescriptor.from_tensor(c, [bm, bn])
                    grid = (min(SMS * per_sm, triton.cdiv(mm, bm) * triton.cdiv(nn, bn)),)
                    kernel[grid](da, db, dc, bias, mm, nn, kk, HAS_BIAS=mode != "none", GELU=mode, UPCAST_DOT=False,
                                 NUM_SMS=SMS, PER_SM=per_sm, BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP_M=8,
                                 WARP_SPECIALIZE=ws, num_stages=stages, num_warps=warps)
                    return c
                bench(f"{key} tma {bm}x{bn}x{bk} s{stages} w{warps} per_sm{per_sm} ws{int(ws)} gelu={mode}", f,
                      ref[mode] if mode != "none" else pre - bias.float(), flops=flops)
        print(f"-- {time.time() - t0:.0f} s", flush=True)


if __name__ == "__main__":
    print(torch.cuda.get_device_name(), torch.__version__, triton.__version__, flush=True)
    for part in sys.argv[1:] or ["softmax", "gemm"]:
        {"softmax": softmax, "gemm": gemm}[part]()
