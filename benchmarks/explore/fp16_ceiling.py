"""Device check (not a casebook run): why the H200's fp16 matmul ceiling reads below its bf16 one.

`casebook hardware` measured 797 TFLOP/s bf16 and 717 fp16 (results/nvidia-h200, 2026-12-01e) with the
same shapes, rests and protocol; the tensor cores' fp16 and bf16 rates are the same on paper (989.5
dense, H200 datasheet). The ceiling times unscaled randn operands; the cases scale B by K^-1/2.

Hypothesis, with its prediction written before running: the GPU runs matmuls at its power limit, and
the power depends on the operands' bits. fp16 carries 10 mantissa bits to bf16's 7, so its multipliers
toggle more bits per product. Prediction at 8192^3: fp16 randn is 8-12% below bf16 randn; fp16 holding
bf16's values (three low mantissa bits zero) is within 2% of bf16; scaling B by K^-1/2 changes neither
dtype by more than 2% (it moves exponents, not mantissas); under 1.5 s of sustained load the SM clock of
fp16 randn is lower than bf16's by about the time ratio, at the same power.

    python3 benchmarks/explore/fp16_ceiling.py        (H200)
"""
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(__file__))
from epilogue_clocks import sustained  # noqa: E402

from casebook.bench import Protocol, time_fn  # noqa: E402


def operands(kind: str, n: int):
    g = torch.Generator(device="cuda").manual_seed(0)
    a = torch.randn(n, n, device="cuda", generator=g)
    b = torch.randn(n, n, device="cuda", generator=g)
    if "scaled" in kind:
        b = b * n**-0.5
    if kind.startswith("bf16"):
        return a.bfloat16(), b.bfloat16()
    if "bf16 values" in kind:
        return a.bfloat16().half(), b.bfloat16().half()
    return a.half(), b.half()


def main() -> None:
    proto = Protocol(cache="warm", time_cap_s=1.0)  # the ceiling's protocol
    for n in (8192, 4096):
        for kind in ("bf16", "fp16", "fp16 bf16 values", "bf16 scaled", "fp16 scaled"):
            a, b = operands(kind, n)
            time.sleep(2.0)  # the ceiling's rest
            s = time_fn(lambda: torch.matmul(a, b), "cuda", proto).summary
            flop = 2 * n**3
            us, smi = sustained(lambda: torch.matmul(a, b))
            print(f"{n}^3 {kind:17s} rested: best {flop / s.min_us / 1e6:5.0f} median {flop / s.median_us / 1e6:5.0f}"
                  f" TFLOP/s | sustained {flop / us / 1e6:5.0f} TFLOP/s, {smi}", flush=True)


if __name__ == "__main__":
    main()
