"""Do the attention family's Triton kernels compile and agree with float64 on an H200, and where do they stand
against SDPA's backends before the harness times them? (do_bench, warm L2: a first look, not a result.)

python3 benchmarks/explore/attention/triton_smoke.py
"""

from __future__ import annotations

import torch
import triton

from casebook.kernels import attention_common as ac


def rel(o, r):
    return ((o.double() - r).norm() / r.norm()).item()


def main() -> None:
    print(torch.__version__, triton.__version__, torch.cuda.get_device_name())
    g = torch.Generator().manual_seed(0)
    prefill = [(4, 32, 8, 4096, 4096, 128, True), (4, 32, 8, 4096, 4096, 128, False), (8, 16, 16, 2048, 2048, 64, True),
               (1, 32, 8, 2048, 8192, 128, True)]
    for b, h, hkv, sq, skv, d, causal in prefill:
        x = ac.make_qkv(b, h, hkv, sq, skv, d, torch.bfloat16, "cuda", g)
        ref = ac.reference(**x, causal=causal)
        flops = 4 * b * h * d * ac.visible_pairs(sq, skv, causal)
        fns = {"triton": lambda: ac.flash_forward(**x, causal=causal),
               "tma": lambda: ac.flash_forward(**x, causal=causal, tma=True),
               "ws": lambda: ac.flash_forward(**x, causal=causal, tma=True, warp_specialize=True)}
        for name in ("flash", "cudnn", "efficient"):
            fns["sdpa_" + name] = lambda name=name: ac.sdpa(**x, causal=causal, backend=name)
        fns["flex"] = lambda: ac.flex(**x, causal=causal)
        for name, fn in fns.items():
            try:
                err = rel(fn(), ref)
                ms = triton.testing.do_bench(fn, warmup=50, rep=200, return_mode="median")
                print(f"prefill {b}x{h}/{hkv}x{sq}x{skv}x{d} causal={causal} {name:14s} err {err:.2e} "
                      f"{ms * 1e3:8.1f} us {flops / ms / 1e9:6.0f} TFLOP/s", flush=True)
            except Exception as e:  # noqa: BLE001
                print(f"prefill {name}: {type(e).__name__}: {str(e)[:300]}", flush=True)
    decode = [(8, 32, 8, 1, 32768, 128), (1, 32, 8, 1, 131072, 128), (64, 32, 8, 1, 4096, 128),
              (8, 32, 8, 4, 32768, 128)]
    for b, h, hkv, sq, skv, d in decode:
        x = ac.make_qkv(b, h, hkv, sq, skv, d, torch.bfloat16, "cuda", g)
        ref = ac.reference(**x, causal=True)
        kv = 2 * b * hkv * skv * d * 2
        fns = {"gqa": lambda: ac.decode_forward(**x, causal=True, splits=1),
               "split": lambda: ac.decode_forward(**x, causal=True, splits=None),
               "fused": lambda: ac.decode_forward(**x, causal=True, splits=None, fused=True),
               "sdpa": lambda: ac.sdpa(**x, causal=True, backend=None)}
        print("splits", ac.split_count(b, hkv, skv, 132))
        for name, fn in fns.items():
            try:
                err = rel(fn(), ref)
                ms = triton.testing.do_bench(fn, warmup=50, rep=200, return_mode="median")
                print(f"decode {b}x{h}/{hkv}x{sq}x{skv}x{d} {name:8s} err {err:.2e} {ms * 1e3:8.1f} us "
                      f"{kv / ms / 1e6:6.0f} GB/s of KV", flush=True)
            except Exception as e:  # noqa: BLE001
                print(f"decode {name}: {type(e).__name__}: {str(e)[:300]}", flush=True)


if __name__ == "__main__":
    main()
