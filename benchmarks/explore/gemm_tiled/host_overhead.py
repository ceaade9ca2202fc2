"""Device exploration (not a casebook run): where a TMA GEMM call's 100-200 us of host time goes.

casebook records each call's host issue time; the persistent TMA GEMM's is 90-200 us at every shape
(then), against 10-20 us for torch.matmul and 35-70 us for the softmax Triton kernels. At
4096^3 that is as long as the GEMM's compute floor, so the fused kernel there is filed `launch (host)`.
The suspects: three host tensor descriptors per call (built in Python, encoded by the launcher), the
autotuner's dispatch (key, pre-hook), Triton's argument specialisation.

Prediction, written before the run: most of the time is in Triton's launch path (JITFunction.run and
the descriptors' handling), not in casebook's wrapper; the tiled schedule (no descriptors) costs
half as much.

Measured (and again once gemm_common
cached the device properties): the first half held, the second did not. Under cProfile the
autotuner's dispatch and Triton's launch were 55% of the call, casebook's TMA check 19% (12 us
without the profiler, 8 us after the fix), the three descriptors 9 us. The tiled schedule cost 86%
of the TMA call, not half (87 against 102 us; 62 against 77 us in the second run).

    python3 benchmarks/explore/gemm_tiled/host_overhead.py          (GPU)
"""
import cProfile
import io
import pstats
import time

import torch

from casebook.kernels import gemm_common as gc
from casebook.kernels import softmax_fusion as sf
from casebook.run.bench import pipelined_host_us


def host_us(fn, n=300):
    fn()
    torch.cuda.synchronize()
    out = []
    for _ in range(n):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        out.append((time.perf_counter() - t0) * 1e6)
    torch.cuda.synchronize()
    out.sort()
    return out[len(out) // 2], out[len(out) // 10], out[9 * len(out) // 10]


def main():
    a = torch.randn(1024, 1024, device="cuda").to(torch.bfloat16)
    b = torch.randn(1024, 1024, device="cuda").to(torch.bfloat16)
    bias = torch.randn(1024, device="cuda").to(torch.bfloat16)
    x = torch.randn(16384, 1024, device="cuda").to(torch.bfloat16)
    calls = {
        "torch.matmul": lambda: a @ b,
        "gc.matmul tiled": lambda: gc.matmul(a, b, schedule="tiled"),
        "gc.matmul persistent": lambda: gc.matmul(a, b, schedule="persistent"),
        "gc.matmul tma_persistent": lambda: gc.matmul(a, b, schedule="tma_persistent"),
        "gc.matmul tma_persistent bias+tanh": lambda: gc.matmul(a, b, bias=bias, gelu="tanh", schedule="tma_persistent"),
        "TensorDescriptor.from_tensor x3": lambda: [gc.TensorDescriptor.from_tensor(t, [1, 1]) for t in (a, b, a)],
        "tma_supported(a, b, c)": lambda: gc.tma_supported(a, b, a),
        "softmax triton_online 16384x1024": lambda: sf.triton_online(x),
    }
    for label, fn in calls.items():
        med, p10, p90 = host_us(fn)
        loop = pipelined_host_us(fn, 20)
        print(f"{label:40s} host median {med:7.1f} us  p10 {p10:7.1f}  p90 {p90:7.1f}  in a loop {loop:7.1f}",
              flush=True)
    fn = calls["gc.matmul tma_persistent bias+tanh"]
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(300):
        fn()
    prof.disable()
    torch.cuda.synchronize()
    s = io.StringIO()
    pstats.Stats(prof, stream=s).sort_stats("tottime").print_stats(25)
    print(s.getvalue())


if __name__ == "__main__":
    main()
