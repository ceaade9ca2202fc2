"""Device exploration: which TMA-persistent configuration matches cuBLAS, each timed alone?

Not a casebook run.

gemm_tiled's claim (0.95x cuBLAS at 4096^3 and 8192^3 bf16) held at one size and failed at the other
in each of two runs, the sizes swapping: 0.983x / 0.913x, then 0.907x / 1.002x. The write-up
blames which configuration the autotuner picked and the clocks cuBLAS met. This measures each
configuration with the casebook harness, cuBLAS between them (so clock drift shows), and then what the
autotuner picks, to tell "no configuration reaches 0.95x" from "the autotuner picks the wrong one".

    python3 benchmarks/explore/gemm_tiled/gemm_configs.py          (GPU)
"""
import torch
import triton

from casebook.kernels import gemm_common as gc
from casebook.run.bench import Protocol, time_fn


def main():
    proto = Protocol(time_cap_s=0.3, target_ci=0.01)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    for n in (4096, 8192):
        a = torch.randn(n, n, device="cuda").to(torch.bfloat16)
        b = (torch.randn(n, n, device="cuda") * n**-0.5).to(torch.bfloat16)
        flop = 2 * n**3

        def report(label, f):
            t = time_fn(f, "cuda", proto).summary
            print(f"{n}^3 {label:44s} {t.median_us:8.1f} us  p10 {t.p10_us:7.1f}  p90 {t.p90_us:7.1f}  "
                  f"{flop / t.median_us / 1e6:6.1f} TFLOP/s", flush=True)
            return t.median_us

        base = report("torch.matmul", lambda: torch.matmul(a, b))
        for cfg in gc.TMA_CONFIGS:
            k = cfg.kwargs
            label = (f"tma {k['BLOCK_M']}x{k['BLOCK_N']}x{k['BLOCK_K']} s{cfg.num_stages} w{cfg.num_warps} "
                     f"per_sm={k['PER_SM']}")
            one = triton.autotune(configs=[cfg], key=gc.KEY)(gc._tma_persistent_kernel.fn)
            c = torch.empty(n, n, device="cuda", dtype=torch.bfloat16)
            descs = [gc.TensorDescriptor.from_tensor(t, [1, 1]) for t in (a, b, c)]

            def call(one=one, descs=descs, k=k):
                grid = (min(sms * k["PER_SM"], triton.cdiv(n, k["BLOCK_M"]) * triton.cdiv(n, k["BLOCK_N"])),)
                one[grid](*descs, c, n, n, n, NUM_SMS=sms, HAS_BIAS=False, GELU="none", UPCAST_DOT=False)
                return c
            try:
                call()
                err = ((c.float() - a.float() @ b.float()).norm() / (a.float() @ b.float()).norm()).item()
                t = report(label, call)
                print(f"{'':53s} {base / t:.3f}x cuBLAS  err {err:.1e}", flush=True)
            except Exception as e:  # a config that does not fit shared memory
                print(f"{n}^3 {label:44s} ERROR {repr(e)[:120]}", flush=True)
        base2 = report("torch.matmul (again)", lambda: torch.matmul(a, b))
        gc.matmul(a, b, schedule="tma_persistent")
        picked = report(f"autotuned: {gc._tma_persistent_kernel.best_config}"[:44],
                        lambda: gc.matmul(a, b, schedule="tma_persistent"))
        print(f"{n}^3 autotuned {min(base, base2) / picked:.3f}x the faster cuBLAS", flush=True)


if __name__ == "__main__":
    main()
