"""How many splits the decode kernel should take, by context as well as by programs.

The book's H200 run (notes/attention_decode.md) missed "never slower than SDPA at level 2" at batch 1 x 8K
context: 28.4 us against SDPA's 22.7 (0.80x). `split_count` aims at two programs an SM whatever the context, so at
1 x 8K (8 KV heads) it takes 32 splits of 256 keys: four 64-key tiles a program, a pipeline that barely fills
before it drains, and 32 partials to combine. This times `triton_split_fused` at each level-2 shape with the
split count forced (`decode_forward(splits=N)`), beside the count `split_count` picks and SDPA, so that the rule
can be read off the measurement rather than guessed.

Predicted (written before the run): at 1 x 512-8K the best count gives each program 1-2K keys (16-32 tiles),
4-8 splits at 8K, and reaches at least 0.95x SDPA where the committed count reaches 0.80-0.90x; at batch 16-64 the
committed count is already within 3% of the best (there the programs come from the batch, not the splits).
If no count reaches 0.95x at 1 x 8K, the split count is not the gap, and the tile (BLOCK_N 128, 4 stages) is
the next thing to sweep.

Each time is given twice, `issued / graph`: `do_bench` (L2 flushed, each call issued from Python) and
`do_bench_cudagraph` (the call replayed from a CUDA graph: the device's time without the host's). A first run, on
an H100, timed the issued calls alone, and at batch 1 they measured the host: SDPA took 22-63 us for 2-33 MB
of cache, unordered by context, and every count of the Triton rung 18-81 us (notes/attention_decode.md).

    python3 benchmarks/explore/attention/decode_splits.py            # GPU: every level-2 shape
    TRITON_INTERPRET=1 python3 benchmarks/explore/attention/decode_splits.py --check   # forced counts are exact
"""

from __future__ import annotations

import sys

import torch

from casebook.kernels import attention_common as ac
from casebook.kernels import attention_decode as mod

BATCHES = (1, 16, 64)
CONTEXTS = (512, 2048, 4096, 8192)
SPLITS = (1, 2, 4, 8, 16, 32, 64)


def inputs(batch: int, context: int, device: str) -> dict:
    """The case's own inputs at one level-2 shape (Llama-3-8B heads: 32 query heads, 8 KV heads, d 128), bf16."""
    shape = {"batch": batch, "heads": 32, "kv_heads": 8, "seq_q": 1, "seq_kv": context, "head_dim": 128}
    return mod.make_inputs(shape, torch.bfloat16, device, torch.Generator().manual_seed(0))


def check() -> None:
    """Every forced count against the float64 reference at a ragged context, under the interpreter."""
    t = inputs(2, 300, "cpu")
    want = mod.reference(**t)
    for n in (1, 2, 3, 8):
        got = ac.decode_forward(t["q"], t["k"], t["v"], True, splits=n, fused=True)
        err = ((got.double() - want).norm() / want.norm()).item()
        print(f"splits {n}: normwise error {err:.1e} {'ok' if err < 1e-2 else 'WRONG'}")


def _times(fn) -> tuple[float, float]:
    """(issued, graph) in us: `do_bench` with the L2 flushed, and `do_bench_cudagraph` (no host in the time)."""
    from triton.testing import do_bench, do_bench_cudagraph

    return do_bench(fn, warmup=25, rep=200) * 1e3, do_bench_cudagraph(fn, rep=100) * 1e3


def sweep() -> None:
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    for batch in BATCHES:
        for context in CONTEXTS:
            t = inputs(batch, context, "cuda")
            sdpa = _times(lambda: mod.sdpa(**t))
            picked, chunk = ac.split_count(batch, 8, context, sms)
            line = [f"{batch:3d} x {context:5d}: SDPA {sdpa[0]:.1f} / {sdpa[1]:.1f} us; split_count {picked} x {chunk}"
                    " keys"]
            for n in SPLITS:
                if n > 1 and context // n < ac.MIN_CHUNK:
                    continue
                us = _times(lambda n=n: ac.decode_forward(t["q"], t["k"], t["v"], True, splits=n, fused=True))
                line.append(f"{n}{'*' if n == picked else ''}: {us[0]:.1f} / {us[1]:.1f} "
                            f"({sdpa[0] / us[0]:.2f}x / {sdpa[1] / us[1]:.2f}x)")
            print("  ".join(line), flush=True)


if __name__ == "__main__":
    check() if "--check" in sys.argv else sweep()
