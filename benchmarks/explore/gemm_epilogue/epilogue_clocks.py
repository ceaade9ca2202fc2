"""Device check (not a casebook run): why the erfc epilogue is not hidden under the ping-pong main loop.

At 8192 x 8192 x 1024 bf16 the ping-pong GEMM took 202.0 us
plain, 213.5 with the tanh epilogue and 277.5 with the branch-free erfc one (~28 SASS instructions per
element against ~10 for tanh, by a count of the compiled kernel). By issue slots the erfc epilogue is
~2.2 us a tile against a ~6.5 us main loop on the other consumer, so it should hide; it costs 2.4 us a
tile. Two hypotheses, with predictions written before running:

H1 power. The GEMM alone runs at the H200's power limit (1470 MHz at 688 of 700 W, ceiling_clocks.py),
   and the epilogue's FP32 work over all of C adds power, so the clock drops. Prediction: under
   sustained load the erfc kernel's SM clock is at least 15% below the plain kernel's, and clock x time
   (cycles per launch) is within 10% of the plain kernel's.
H2 issue or register-file contention. The clock is the same (within 5%) and the cycles grow: the
   epilogue's warps slow the tensor cores' warps on the same SM sub-partitions.

Each kernel runs 1.5 s back to back after a 2 s rest; nvidia-smi is sampled during the load.

    python3 benchmarks/explore/gemm_epilogue/epilogue_clocks.py          (H200)
"""
import statistics
import threading
import time

import torch

from casebook.kernels import gemm_common
from casebook.kernels import gemm_pingpong as gp
from casebook.run.hardware import _nvidia_smi

FIELDS = ("clocks.sm", "power.draw", "clocks_throttle_reasons.active")


def sustained(fn, seconds: float = 1.5) -> tuple[float, dict]:
    """Microseconds per call over `seconds` of back-to-back calls, and nvidia-smi's medians meanwhile."""
    samples, stop = [], threading.Event()

    def sample():
        time.sleep(0.3)  # past the ramp
        while not stop.is_set():
            samples.append(_nvidia_smi(FIELDS))
            time.sleep(0.1)

    fn()
    torch.cuda.synchronize()
    time.sleep(2.0)
    watcher = threading.Thread(target=sample)
    calls, start = 0, time.perf_counter()
    watcher.start()
    while time.perf_counter() - start < seconds:
        for _ in range(20):
            fn()
        torch.cuda.synchronize()
        calls += 20
    elapsed = time.perf_counter() - start
    stop.set()
    watcher.join()
    clock = statistics.median(float(s["clocks_sm"]) for s in samples if s)
    power = statistics.median(float(s["power_draw"]) for s in samples if s)
    reasons = sorted({s["clocks_throttle_reasons_active"] for s in samples if s})
    return elapsed / calls * 1e6, {"clock_mhz": clock, "power_w": power, "throttle": reasons}


def main() -> None:
    torch.manual_seed(0)
    m, n, k = 8192, 8192, 1024
    a = torch.randn(m, k, device="cuda").to(torch.bfloat16)
    b = (torch.randn(k, n, device="cuda") * k**-0.5).to(torch.bfloat16)
    bias = torch.randn(n, device="cuda").to(torch.bfloat16)
    runs = {
        "cuBLAS matmul": lambda: a @ b,
        "ping-pong, bias only": lambda: gp.matmul(a, b, bias, "none"),
        "ping-pong + tanh": lambda: gp.matmul(a, b, bias, "tanh"),
        "ping-pong + erfc": lambda: gp.matmul(a, b, bias, "erf"),
        "Triton TMA plain": lambda: gemm_common.matmul(a, b, schedule="tma_persistent"),
        "Triton TMA + erfc": lambda: gemm_common.matmul(a, b, bias, "erf", schedule="tma_persistent"),
    }
    print(f"{m}x{n}x{k} bf16, 1.5 s back to back after 2 s rest", flush=True)
    for label, fn in runs.items():
        us, smi = sustained(fn)
        kcycles = us * smi["clock_mhz"] / 1e3
        print(f"{label:22s} {us:7.1f} us  SM {smi['clock_mhz']:6.0f} MHz  {smi['power_w']:5.0f} W  "
              f"{kcycles:6.1f} k cycles  throttle {smi['throttle']}", flush=True)


if __name__ == "__main__":
    main()
