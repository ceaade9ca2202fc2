"""Device exploration (not a casebook run): does storing C in two halves buy the epilogue back?

gemm_epilogue's fused kernels pay for their epilogue at short K: over the plain TMA GEMM, the tanh form
costs +13.5% and the erf form +47% at 8192 x 8192 x 1024. At 16 K-steps per tile the
epilogue is a large share of each tile, and the pipeline refills after it. The 128x256 tile's C staging
buffer (64 KB) is what keeps the main loop at three stages (four were out of shared memory). Storing
C in two 128x128 halves (tutorial 09's epilogue subtiling) halves that buffer: a fourth stage fits
(229408 B of shared memory against 232448 B per block, compiled for sm90 here), more of the next tile's operands are in flight while this
tile's epilogue runs, and the second half's math overlaps the first half's TMA store.

Prediction, written before the run: with SUBTILE and four stages the tanh epilogue's cost at
8192 x 8192 x 1024 falls from +13.5% to 8% or less, the plain GEMM moves by under 2%, and the erf
form gains little (its ~20 instructions per element are serial with the tensor cores either way).

Measured on the H200: **falsified**. At 8192 x 8192 x
1024 the plain GEMM is unchanged (202.5, 202.1, 201.7 us), but the tanh epilogue costs +12% whole,
+20% in halves with three stages and +20% with four; erf +55%, +53%, +53%. At 4096^3 all three are
within 2%. The main loop was not short of stages: what the epilogue costs is its own time, serial with
the tensor cores. The knob was removed after; it is in gemm_common.py of commit ee7dc8a, so to run
this again:
    git show ee7dc8a:casebook/kernels/gemm_common.py > casebook/kernels/gemm_common.py
    python3 benchmarks/explore/gemm_epilogue/epilogue_subtile.py          (GPU)
    TRITON_INTERPRET=1 python3 benchmarks/explore/gemm_epilogue/epilogue_subtile.py --check   (CPU, tiny shapes)
"""
import sys

import torch
import torch.nn.functional as F
import triton

from casebook.kernels import gemm_common as gc

CHECK = "--check" in sys.argv
DEVICE = "cpu" if CHECK else "cuda"
SHAPES = [(64, 48, 32)] if CHECK else [(8192, 8192, 1024), (16384, 4096, 1024), (4096, 4096, 4096)]
# (BLOCK_M, BLOCK_N, BLOCK_K, stages, warps, SUBTILE): today's pick first
CONFIGS = [(32, 16, 16, 1, 4, s) for s in (False, True)] if CHECK else [
    (128, 256, 64, 3, 8, False), (128, 256, 64, 3, 8, True), (128, 256, 64, 4, 8, True)]


def one_config(bm, bn, bk, stages, warps, subtile):
    cfg = triton.Config({"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "GROUP_M": 8, "PER_SM": 1, "SUBTILE": subtile},
                        num_stages=stages, num_warps=warps, pre_hook=gc._set_tma_blocks)
    return triton.autotune(configs=[cfg], key=gc.KEY)(gc._tma_persistent_kernel.fn)


def main():
    sms = gc.num_sms(torch.empty(1, device=DEVICE))
    for m, n, k in SHAPES:
        g = torch.Generator(device=DEVICE).manual_seed(0)
        a = torch.randn(m, k, device=DEVICE, generator=g).to(torch.bfloat16)
        b = (torch.randn(k, n, device=DEVICE, generator=g) * k**-0.5).to(torch.bfloat16)
        bias = (torch.randn(n, device=DEVICE, generator=g) * 0.5).to(torch.bfloat16)
        pre = a.double() @ b.double() + bias.double()
        refs = {"none": a.double() @ b.double(), "tanh": F.gelu(pre, approximate="tanh"), "erf": F.gelu(pre)}
        flop = 2 * m * n * k

        def report(label, f, ref):
            y = f()
            err = ((y.double() - ref).norm() / ref.norm()).item()
            if CHECK:
                print(f"{m}x{n}x{k} {label:48s} err {err:.1e}", flush=True)
                assert err < 2e-2, label
                return
            from casebook.run.bench import Protocol, time_fn
            t = time_fn(f, "cuda", Protocol(time_cap_s=0.3)).summary
            print(f"{m}x{n}x{k} {label:48s} {t.median_us:8.1f} us  p10 {t.p10_us:7.1f}  p90 {t.p90_us:7.1f}  "
                  f"{flop / t.median_us / 1e6:6.1f} TFLOP/s  err {err:.1e}", flush=True)

        if not CHECK:
            report("torch.matmul (cuBLAS)", lambda: a @ b, refs["none"])
            report("addmm + gelu(tanh)", lambda: F.gelu(torch.addmm(bias, a, b), approximate="tanh"), refs["tanh"])
            report("addmm + gelu(erf)", lambda: F.gelu(torch.addmm(bias, a, b)), refs["erf"])
            report("_addmm_activation (cuBLASLt GELU_BIAS)", lambda: torch._addmm_activation(bias, a, b, use_gelu=True),
                   refs["tanh"])
        for bm, bn, bk, stages, warps, subtile in CONFIGS:
            kernel = one_config(bm, bn, bk, stages, warps, subtile)
            for gelu in ("none", "tanh", "erf"):
                c = torch.empty(m, n, device=DEVICE, dtype=torch.bfloat16)
                descs = [gc.TensorDescriptor.from_tensor(t, [1, 1]) for t in (a, b, c)]
                flags = dict(HAS_BIAS=gelu != "none", GELU=gelu, UPCAST_DOT=CHECK, NUM_SMS=sms)
                grid = (min(sms, triton.cdiv(m, bm) * triton.cdiv(n, bn)),)

                def call(kernel=kernel, descs=descs, flags=flags, grid=grid, c=c):
                    kernel[grid](*descs, bias, m, n, k, **flags)
                    return c
                label = f"tma {bm}x{bn}x{bk} s{stages} w{warps} subtile={int(subtile)} gelu={gelu}"
                try:
                    report(label, call, refs[gelu])
                except Exception as e:  # a config that does not fit or compile is reported, not fatal
                    if CHECK:
                        raise
                    print(f"{m}x{n}x{k} {label:48s} ERROR {repr(e)[:160]}", flush=True)


if __name__ == "__main__":
    main()
