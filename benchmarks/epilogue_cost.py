"""What the GELU epilogue costs its own GEMM: the persistent TMA Triton GEMM without an epilogue
(`gemm_epilogue.triton_plain`, not a case variant since it computes a different function) beside the
fused kernels with the erf and tanh forms, timed by casebook's harness (cold L2, events, median).
The issue's bar: the fused kernel costs at most 5% more than its plain GEMM.

    python3 benchmarks/epilogue_cost.py [out.json]      (GPU only)
"""

import json
import sys

import torch
import yaml

from casebook.kernels import gemm_epilogue as mod
from casebook.run.bench import Protocol, time_fn

case = yaml.safe_load(open("cases/gemm_epilogue.yaml"))
rows = []
for shape in case["levels"]["kernel"]["shapes"]:
    inputs = mod.make_inputs(shape, torch.bfloat16, "cuda", torch.Generator().manual_seed(0))
    times = {}
    for name in ("triton_plain", "triton_fused", "triton_fused_tanh"):
        fn = getattr(mod, name)  # time_fn's own first call pays the autotuning, outside the timing
        times[name] = time_fn(lambda: fn(**inputs), "cuda", Protocol()).summary.median_us
    row = {"shape": shape, **{f"{k}_us": v for k, v in times.items()},
           "erf_over_plain": times["triton_fused"] / times["triton_plain"],
           "tanh_over_plain": times["triton_fused_tanh"] / times["triton_plain"]}
    rows.append(row)
    print(f"{shape['m']:>6} x {shape['n']:<6} x {shape['k']:<5} plain {times['triton_plain']:7.1f} us   "
          f"erf {times['triton_fused']:7.1f} us ({row['erf_over_plain']:.3f}x)   "
          f"tanh {times['triton_fused_tanh']:7.1f} us ({row['tanh_over_plain']:.3f}x)", flush=True)
json.dump(rows, open(sys.argv[1], "w") if len(sys.argv) > 1 else sys.stdout, indent=1)
