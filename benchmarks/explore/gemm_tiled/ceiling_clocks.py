"""Device check (not a casebook run): why the matmul ceiling reads lower than the cases' own matmuls.

On two H200s the measured bf16 ceiling (`casebook hardware`, the fastest repetition of
warm back-to-back torch.matmul) read 727 and then 683 TFLOP/s, while the same runs' cold-cache case points
reached 775-786 and 735-750: cuBLAS at 4096^3 took 183 us in the case and at least 201 us in the
ceiling, minutes apart on one machine. Earlier runs read 764 and 802. The gate then refused honest
points as faster than physics. Two hypotheses, with predictions written before running:

H1 clocks ramping. The ceiling is measured first, on an idle GPU, within ~100 ms per shape; the SM clock
   has not reached its boost yet. Prediction: the same warm measurement repeated after 3 s of sustained
   matmuls is at least 5% faster than the first, and nvidia-smi's SM clock is higher then.
H2 duty cycle. The case points are timed behind an L2 flush and a device-side delay (a spin, light on
   power); the ceiling's warm repetitions run the tensor cores nearly back to back, so the power limit
   pulls the clock down. Prediction: at one moment, the cold protocol (flush + delay) gives a fastest
   repetition at least 5% faster than the warm one.

Measured on an H200: both falsified, and
the data showed the cause. H1: the first, idle-start measurement was the fastest (4096^3: 768
TFLOP/s; 8192^3: 792 at best), not the slowest. H2: cold was not faster than warm at one moment
(750 against 768, measured after it). After 3 s of 8192^3 the SM clock sat at 1470 MHz at 688 of
700 W and 4096^3 ran 711, warm or cold; after 2 s idle the clock was back at 1980 MHz and 4096^3 ran
771. The clock follows recent power draw, so the ceiling is now timed after a rest
(hardware.MATMUL_REST_S): 782 TFLOP/s on the next H200, where the hot-measured ones read 683-727.

    python3 benchmarks/explore/gemm_tiled/ceiling_clocks.py          (GPU)
"""
import time

import torch

from casebook.run.bench import Protocol, time_fn
from casebook.run.hardware import _nvidia_smi

WARM, COLD = Protocol(cache="warm", time_cap_s=1.0), Protocol(time_cap_s=1.0)


def smi() -> str:
    fields = ("clocks.sm", "clocks.max.sm", "power.draw", "power.limit", "temperature.gpu",
              "clocks_throttle_reasons.active")
    return ", ".join(f"{k} {v}" for k, v in _nvidia_smi(fields).items())


def rate(label: str, m: int, n: int, k: int, proto: Protocol, scale_b: bool = False) -> None:
    a = torch.randn(m, k, device="cuda").to(torch.bfloat16)
    b = (torch.randn(k, n, device="cuda") * (k**-0.5 if scale_b else 1)).to(torch.bfloat16)
    s = time_fn(lambda: a @ b, "cuda", proto).summary
    f = 2 * m * n * k / 1e6
    print(f"{label:34s} {m}x{n}x{k}  fastest {f / s.min_us:6.1f}  median {f / s.median_us:6.1f} TFLOP/s"
          f"  ({s.repetitions} reps)  smi after: {smi()}", flush=True)


def main():
    print("idle:", smi(), flush=True)
    rate("1 first, warm (as the ceiling)", 4096, 4096, 4096, WARM)
    rate("1 first, warm (as the ceiling)", 8192, 8192, 8192, WARM)
    rate("2 then cold (as a case point)", 4096, 4096, 4096, COLD)
    rate("2 cold, B scaled (as gemm_tiled)", 4096, 4096, 4096, COLD, scale_b=True)
    a = torch.randn(8192, 8192, device="cuda").to(torch.bfloat16)
    t = time.perf_counter()
    while time.perf_counter() - t < 3:
        for _ in range(20):
            a @ a
        torch.cuda.synchronize()
    print("after 3 s of 8192^3:", smi(), flush=True)
    rate("3 after sustained load, warm", 4096, 4096, 4096, WARM)
    rate("3 after sustained load, cold", 4096, 4096, 4096, COLD)
    rate("3 after sustained load, warm", 8192, 8192, 8192, WARM)
    rate("3 after sustained load, cold", 8192, 8192, 8192, COLD)
    rate("3 after sustained load, cold", 2048, 28672, 4096, COLD)
    time.sleep(2)
    print("after 2 s idle:", smi(), flush=True)
    rate("4 after 2 s idle, warm", 4096, 4096, 4096, WARM)


if __name__ == "__main__":
    main()
