"""Cross-check: casebook's harness against two independent measurements of the same calls (GPU only).

- `triton.testing.do_bench`: flushes L2 before each repetition and reports a median, like casebook;
  but it issues its repetitions back to back behind a ~80 us flush only, so a call whose host side
  takes longer (a Triton launch through its autotuner) lets host time into its number.
- The profiler (CUPTI): each kernel's own start and end on the device, read from the driver, no
  events and no host in the loop; the median over repetitions with L2 flushed before each.

Measured on an H200: do_bench 0.964-1.008
at six points of 21-494 us; the profiler 0.999-1.020 from 130 us up, and 2.7-2.8 us less at the 18-32 us
points: events around a call include its launch latency, a kernel's own duration does not.
"""

import json
import sys

import torch
import triton
from torch.profiler import ProfilerActivity, profile

from casebook.kernels import softmax_fusion as k
from casebook.run.bench import Protocol, _get_flusher, time_fn


def profiler_us(fn, reps: int = 50) -> float:
    """Median device time per call from the profiler's kernel records (the L2 flush's own kernel excluded)."""
    flush = _get_flusher()
    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            flush()
            fn()
        torch.cuda.synchronize()
    times = [e.time_range.elapsed_us() for e in prof.events()
             if e.device_type == torch.autograd.DeviceType.CUDA and "fill" not in e.name.lower()]
    if not times or len(times) % reps:
        raise RuntimeError(f"{len(times)} kernels in {reps} calls")
    per = len(times) // reps  # kernels per call, in launch order
    per_call = [sum(times[i * per:(i + 1) * per]) for i in range(reps)]
    return sorted(per_call)[len(per_call) // 2]


rows = []
for shape in ({"rows": 32768, "cols": 4096}, {"rows": 4096, "cols": 65536}, {"rows": 16384, "cols": 1024}):
    x = k.make_inputs(shape, torch.bfloat16, "cuda", torch.Generator().manual_seed(0))["x"]
    for name in ("torch_softmax", "triton_online"):
        fn = getattr(k, name)
        timing = time_fn(lambda: fn(x), "cuda", Protocol())
        ours = timing.summary.median_us
        theirs = triton.testing.do_bench(lambda: fn(x), warmup=25, rep=200, return_mode="median") * 1e3
        cupti = profiler_us(lambda: fn(x))
        rows.append({"shape": shape, "variant": name, "casebook_us": ours, "do_bench_us": theirs, "profiler_us": cupti,
                     "host_us": timing.host_us, "ratio_do_bench": ours / theirs, "ratio_profiler": ours / cupti})
        print(f"{name:14s} {shape}  casebook {ours:8.1f} us  do_bench {theirs:8.1f} us ({ours / theirs:.3f})  "
              f"profiler {cupti:8.1f} us ({ours / cupti:.3f})  host {timing.host_us:5.0f} us")
json.dump(rows, open(sys.argv[1], "w") if len(sys.argv) > 1 else sys.stdout, indent=1)
