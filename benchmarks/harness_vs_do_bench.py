"""Cross-check: casebook's harness against triton.testing.do_bench on the same calls (GPU only).

Both flush L2 before each repetition and report a median; they should agree within 5%.
"""

import json
import sys

import torch
import triton

from casebook.bench import Protocol, time_fn
from casebook.kernels import softmax_fusion as k

rows = []
for shape in ({"rows": 32768, "cols": 4096}, {"rows": 4096, "cols": 65536}, {"rows": 16384, "cols": 1024}):
    x = k.make_inputs(shape, torch.bfloat16, "cuda", torch.Generator().manual_seed(0))["x"]
    for name in ("torch_softmax", "triton_online"):
        fn = getattr(k, name)
        ours = time_fn(lambda: fn(x), "cuda", Protocol()).summary.median_us
        theirs = triton.testing.do_bench(lambda: fn(x), warmup=25, rep=200, return_mode="median") * 1e3
        rows.append({"shape": shape, "variant": name, "casebook_us": ours, "do_bench_us": theirs,
                     "ratio": ours / theirs})
        print(f"{name:14s} {shape}  casebook {ours:8.1f} us  do_bench {theirs:8.1f} us  ratio {ours / theirs:.3f}")
json.dump(rows, open(sys.argv[1], "w") if len(sys.argv) > 1 else sys.stdout, indent=1)
