"""Device exploration (not a casebook run): why the grouped GEMM at the Mixtral boundary has two modes.

triton_grouped at 8 experts x 8192 rows x 14336 x 4096 bf16 took 1568, 1444 and 1567 us in three
runs (the loop 1439 and 1368 in the last two), so the boundary claim (at most 10% behind the loop)
failed in the slow mode. Suspect: the autotuner's pick, made once per process. Each run below is a
fresh process, as a `casebook run` child is: the pick (casebook.run.autotune, the code that now records it
per point), the autotuner's own timing of every configuration, and the harness's median.

Prediction: the slow runs ran a different configuration from the fast ones; if all runs pick the same
configuration and still differ, the modes are on the GPU side (clocks), not the pick.

Result: falsified. All four runs picked 128x256x64/3/8;
the kernel took 1478-1538 us and the loop 1355-1496 us (ratios 0.88-1.01x): the modes are the GPU's.

    python3 benchmarks/explore/gemm_grouped/grouped_modes.py [RUNS]     (GPU)
"""
import subprocess
import sys

CHILD = r'''
import torch
from casebook.run import autotune
from casebook.run.bench import Protocol, time_fn
from casebook.kernels import gemm_grouped as gg
shape = {"experts": 8, "tokens": 8192, "n": 14336, "k": 4096}
inputs = gg.make_inputs(shape, torch.bfloat16, "cuda", torch.Generator().manual_seed(7))
tuners = autotune.autotuners("casebook.kernels")
gg.triton_grouped(**inputs)
torch.cuda.synchronize()
tuner = tuners["gemm_grouped._grouped_kernel"]
for config, t in sorted(tuner.configs_timings.items(), key=lambda kv: kv[1]):
    print(f"  autotuner timed {autotune.describe(config):62s} {t[0] * 1e3:8.1f} us")
autotune.forget(tuners)
ours = time_fn(lambda: gg.triton_grouped(**inputs), "cuda", Protocol()).summary
picked = autotune.picks(tuners)
loop = time_fn(lambda: gg.loop(**inputs), "cuda", Protocol()).summary
print(f"  picked {picked}")
print(f"  triton_grouped {ours.median_us:8.1f} us (p10 {ours.p10_us:.1f}, p90 {ours.p90_us:.1f}); "
      f"loop {loop.median_us:8.1f} us: {loop.median_us / ours.median_us:.3f}x")
'''

if __name__ == "__main__":
    for run in range(int(sys.argv[1]) if len(sys.argv) > 1 else 4):
        print(f"run {run + 1}", flush=True)
        subprocess.run([sys.executable, "-c", CHILD], check=False)
