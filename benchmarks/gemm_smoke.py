"""GPU smoke test of the GEMM cases: every CUDA variant checked once against the float64 reference at one
level-1 shape, then timed with do_bench (autotuning happens in the first call, outside the timing).

Prints one line per variant as it goes, so a run cut short still says what it reached.
"""

import importlib
import sys
import time

import torch
import triton
import yaml

from casebook.run.check import TORCH_DTYPES
from casebook.run.inprocess import check

SKIP = {"torch_compile"}
for case_id in sys.argv[1:] or ["gemm_epilogue", "gemm_grouped", "gemm_tiled"]:
    case = yaml.safe_load(open(f"cases/{case_id}.yaml"))
    k = case["kernel"]
    mod = importlib.import_module(f"casebook.kernels.{k['module']}")
    shape = case["levels"]["kernel"]["shapes"][0]
    dtype = "bf16"
    for v in k["variants"]:
        if "cuda" not in v["backends"] or v["name"] in SKIP:
            continue
        fn = getattr(mod, v["fn"])
        t0 = time.perf_counter()
        try:
            c = check(fn, getattr(mod, k["reference"]), getattr(mod, k["inputs"]), shape, dtype, "cuda", [1])
            first_s = time.perf_counter() - t0
            inputs = getattr(mod, k["inputs"])(shape, TORCH_DTYPES[dtype], "cuda", torch.Generator().manual_seed(2))
            us = triton.testing.do_bench(lambda: fn(**inputs), return_mode="median") * 1e3 if c.correct else None
            print(f"{case_id} {v['name']} {shape} {dtype}: correct={c.correct} err={c.max_rel_err:.2e} "
                  f"first={first_s:.1f}s median={us and round(us, 1)}us {c.error or ''}", flush=True)
        except Exception as e:  # report and go on: this is a smoke test
            print(f"{case_id} {v['name']}: {type(e).__name__}: {str(e)[:300]}", flush=True)
