"""What a plain device-to-device copy reaches at each of the softmax case's bf16 level-1 sizes, timed by
casebook's own harness (cold L2, events, median). A tensor of 64 MB moves in ~35 us, where the ramp at the
start and the tail at the end of a kernel are a visible share: this is the bar a one-read-one-write kernel
can reach at that size, beside the large-copy ceiling the roofline uses.

    python3 benchmarks/copy_reference.py [out.json]      (GPU only)
"""

import json
import sys

import torch
import yaml

from casebook.run.bench import Protocol, time_fn

case = yaml.safe_load(open("cases/softmax_fusion.yaml"))
rows = []
for shape in case["levels"]["kernel"]["shapes"]:
    x = torch.randn(shape["rows"], shape["cols"], device="cuda").to(torch.bfloat16)
    y = torch.empty_like(x)
    t = time_fn(lambda: y.copy_(x), "cuda", Protocol()).summary
    tbps = 2 * x.numel() * 2 / t.median_us / 1e6
    rows.append({"shape": shape, "bytes": 2 * x.numel() * 2, "median_us": t.median_us, "tbps": tbps})
    print(f"copy {shape['rows']:>6} x {shape['cols']:<7} {t.median_us:8.1f} us  {tbps:.2f} TB/s", flush=True)
json.dump(rows, open(sys.argv[1], "w") if len(sys.argv) > 1 else sys.stdout, indent=1)
