"""What holds the decode chain's fused layer at ~1.1-1.35 TB/s of its weight bytes on an H100 (notes/decode_chain.md,
"The stored H100 result"): one layer's kernel (`_fused_layer_kernel`) launched at each tile (BN output columns a
program, BK the K step), stage count and warp count, one axis at a time from the case's (32, 256, 3 stages, 4 warps),
beside cuBLAS's GEMV of the same weight (`torch.nn.functional.linear`, what the torch_compile rung calls).

If some tile reaches cuBLAS's rate, the tile is the lever and the case takes it; if none moves past ~1.5 TB/s while
cuBLAS reads 2.5 or more, the loop's own structure is (its x tiles from L2 each step, a 16-row MMA for one row).
Times: `triton.testing.do_bench` (L2 flushed, median); TB/s on the layer's bytes (the H x H weight, x read twice,
the output written). Every config's output is compared with the case's eager layer (float32 sums, bf16 out).

    python3 benchmarks/explore/decode_chain/gemv_tiles.py [BATCH HIDDEN]   # default: 1 4096, then 1 8192
    TRITON_INTERPRET=1 python3 benchmarks/explore/decode_chain/gemv_tiles.py 1 256   # no GPU: outputs checked only
"""

from __future__ import annotations

import sys

import torch
import torch.nn.functional as F
import triton
from triton.testing import do_bench

from casebook.kernels import decode_chain as m

CASE = {"BN": 32, "BK": 256, "stages": 3, "warps": 4}
AXES = {"BN": (16, 64, 128), "BK": (64, 128, 512), "stages": (2, 4, 5), "warps": (2, 8)}


def configs() -> list[dict]:
    out = [dict(CASE)]
    for axis, values in AXES.items():
        out += [{**CASE, axis: v} for v in values]
    return out


def sweep(batch: int, hidden: int, device: str) -> None:
    g = torch.Generator(device=device).manual_seed(0)
    x = torch.randn(batch, hidden, device=device, dtype=torch.bfloat16, generator=g)
    w = torch.randn(1, hidden, hidden, device=device, dtype=torch.bfloat16, generator=g) / hidden**0.5
    gamma = 1 + 0.1 * torch.randn(1, hidden, device=device, dtype=torch.bfloat16, generator=g)
    want = m.eager(x, w, gamma).float()
    out = torch.empty_like(x)
    layer_bytes = w.numel() * 2 + 3 * x.numel() * 2
    bb = max(16, triton.next_power_of_2(batch))

    def report(name: str, fn) -> None:
        if device != "cuda":  # the interpreter: correct or not, no time
            print(f"{batch} x {hidden} {name:34s} correct")
            return
        us = do_bench(fn, warmup=25, rep=200) * 1e3
        print(f"{batch} x {hidden} {name:34s} {us:8.1f} us  {layer_bytes / us / 1e6:5.2f} TB/s", flush=True)

    if device == "cuda":
        report("cuBLAS GEMV (F.linear), alone", lambda: F.linear(x, w[0]))
    for c in configs():
        name = f"fused BN {c['BN']} BK {c['BK']} st {c['stages']} w {c['warps']}"

        def launch(c=c):
            m._fused_layer_kernel[(triton.cdiv(hidden, c["BN"]),)](
                x, out, w[0], gamma[0], batch, hidden, m.EPS, BB=bb, BN=c["BN"], BK=min(c["BK"], hidden),
                UPCAST=device != "cuda", num_warps=c["warps"], num_stages=c["stages"])
        try:
            launch()
            if device == "cuda":
                torch.cuda.synchronize()
        except Exception as e:  # a tile the compiler refuses (shared memory, say): said, and the sweep goes on
            print(f"{batch} x {hidden} {name:34s} refused: {str(e).splitlines()[0][:120]}")
            continue
        err = ((out.float() - want).abs().max() / want.abs().max()).item()
        if err > 2e-2:
            print(f"{batch} x {hidden} {name:34s} WRONG (max error {err:.3g} of the largest output)")
            continue
        report(name, launch)


def main() -> None:
    args = [int(a) for a in sys.argv[1:]]
    shapes = [tuple(args)] if len(args) == 2 else [(1, 4096), (1, 8192)]
    device = "cuda" if torch.cuda.is_available() else "cpu"
    for batch, hidden in shapes:
        sweep(batch, hidden, device)


if __name__ == "__main__":
    main()
