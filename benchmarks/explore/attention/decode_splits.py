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

Run on an H100 (graph-replayed, notes/attention_decode.md): no count reaches 0.95x SDPA at batch 1; the best is
0.80-0.86x at 256-512 keys a split (16 splits at 8K, where the committed rule takes 32). So `--tiles` times the
next suspects at the batch-1 shapes, each alone, at 8 and 16 splits: the tile (BLOCK_N 32-128), the warps (2-8)
and the stages (2-5), forced on the kernel the autotuner otherwise picks among three configs; and the combine,
fused into the last split to arrive (a serial tail: one program reads every split's partial) against its own
second launch (`triton_split`'s). Predicted (written before the run): the tile is not the lever, every forced
config within 5% of the autotuned one at 1 x 8K, since at 16 splits a program's 3 stages of 32 KB already keep
more bytes in flight than the copy rate needs; and the separate combine no faster than the fused one, its second
launch costing about what the serial tail does. If some config reaches 0.95x SDPA, the autotuner's three configs
are what is missing and the case takes that config; if the separate combine is faster by more than 1 us, the
fused tail is part of the 3 us the rung trails SDPA by at 1 x 8K.

    python3 benchmarks/explore/attention/decode_splits.py            # GPU: every level-2 shape
    python3 benchmarks/explore/attention/decode_splits.py --tiles    # GPU: batch 1, the tile and the combine
    python3 benchmarks/explore/attention/decode_splits.py --waves    # GPU: batch 1, configs by residency and waves
    TRITON_INTERPRET=1 python3 benchmarks/explore/attention/decode_splits.py --check   # forced counts are exact
    TRITON_INTERPRET=1 python3 benchmarks/explore/attention/decode_splits.py --check --tiles   # forced tiles too
"""

from __future__ import annotations

import sys

import torch
import triton

from casebook.kernels import attention_common as ac
from casebook.kernels import attention_decode as mod

BATCHES = (1, 16, 64)
CONTEXTS = (512, 2048, 4096, 8192)
SWEPT = [(b, c) for b in BATCHES for c in CONTEXTS] + [(8, 32768)]
"""Level 2's shapes, then the level-1 claim shape (8 x 32K), where a change to the split count must not cost."""
SPLITS = (1, 2, 4, 8, 16, 32, 64)


def inputs(batch: int, context: int, device: str) -> dict:
    """The case's own inputs at one level-2 shape (Llama-3-8B heads: 32 query heads, 8 KV heads, d 128), bf16."""
    shape = {"batch": batch, "heads": 32, "kv_heads": 8, "seq_q": 1, "seq_kv": context, "head_dim": 128}
    return mod.make_inputs(shape, torch.bfloat16, device, torch.Generator().manual_seed(0))


def check(tiles: bool) -> None:
    """Every forced count (and with `tiles` every forced tile, fused and not) against the float64 reference at a
    ragged context, under the interpreter."""
    t = inputs(2, 300, "cpu")
    want = mod.reference(**t)
    runs = {f"splits {n}": (lambda n=n: ac.decode_forward(t["q"], t["k"], t["v"], True, splits=n, fused=True))
            for n in (1, 2, 3, 8)}
    if tiles:  # the interpreter's splits are multiples of 16 keys, so its tile is 16 (the GPU's 32-128 divide 256)
        runs.update({f"forced: splits {n}, fused {f}": (lambda n=n, f=f: forced(t, n, 16, 4, 1, f))
                     for n in (1, 3, 8) for f in (True, False)})
    for name, fn in runs.items():
        err = ((fn().double() - want).norm() / want.norm()).item()
        print(f"{name}: normwise error {err:.1e} {'ok' if err < 1e-2 else 'WRONG'}")


def forced(t: dict, splits: int, block_n: int, warps: int, stages: int, fused: bool) -> torch.Tensor:
    """`ac.decode_forward` at a forced split count, its split kernel held to one config (the autotuner given that
    one alone, which it launches untimed, then its own list back), the combine fused or as its own launch."""
    tuner = ac._decode_split_tuned
    configs, tuner.configs = tuner.configs, [triton.Config({"BLOCK_N": block_n}, num_warps=warps, num_stages=stages)]
    try:
        return ac.decode_forward(t["q"], t["k"], t["v"], True, splits=splits, fused=fused)
    finally:
        tuner.configs = configs


def _graph_us(fn) -> float:
    """`do_bench_cudagraph`'s median in us: the call replayed from a CUDA graph, no host in the time."""
    from triton.testing import do_bench_cudagraph

    return do_bench_cudagraph(fn, rep=100, return_mode="median") * 1e3


def _times(fn) -> tuple[float, float]:
    """(issued, graph) in us: `do_bench` with the L2 flushed, and `_graph_us`."""
    from triton.testing import do_bench

    return do_bench(fn, warmup=25, rep=200, return_mode="median") * 1e3, _graph_us(fn)


def sweep() -> None:
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    for batch, context in SWEPT:
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


def tiles() -> None:
    """Batch 1, 2K-8K: at 8 and 16 splits, the autotuned rung, then one axis at a time from (64, 4 warps, 3
    stages), then the combine as its own launch at (64, 4, 3); graph-replayed, us."""
    axes = [(bn, 4, 3) for bn in (32, 128)] + [(64, w, 3) for w in (2, 8)] + [(64, 4, st) for st in (2, 4, 5)]
    for context in CONTEXTS[1:]:
        t = inputs(1, context, "cuda")
        sdpa = _graph_us(lambda: mod.sdpa(**t))
        for n in (8, 16):
            if context // n < ac.MIN_CHUNK:
                continue
            tuned = _graph_us(lambda: ac.decode_forward(t["q"], t["k"], t["v"], True, splits=n, fused=True))
            line = [f"1 x {context:5d}, {n:2d} splits: SDPA {sdpa:.1f} us; autotuned {tuned:.1f} ({sdpa / tuned:.2f}x)"]
            for fused in (True, False):
                for bn, w, st in [(64, 4, 3)] + (axes if fused else []):
                    try:
                        us = _graph_us(lambda: forced(t, n, bn, w, st, fused))
                        line.append(f"{'fused' if fused else 'separate'} {bn}/{w}w/{st}st {us:.1f} ({sdpa / us:.2f}x)")
                    except Exception as e:  # a config the GPU cannot hold (shared memory)
                        line.append(f"{bn}/{w}w/{st}st: {type(e).__name__}")
            print("\n    ".join(line), flush=True)


def compiled(t: dict, splits: int, block_n: int, warps: int, stages: int):
    """The kernel `forced` launches at this config (captured from the autotuner's one launch): its shared memory
    and registers say how many of its programs a SM holds."""
    fn = ac._decode_split_tuned.fn
    got = []
    fn.run = lambda *a, **k: got.append(type(fn).run(fn, *a, **k)) or got[-1]
    try:
        forced(t, splits, block_n, warps, stages, True)
    finally:
        del fn.run
    return got[-1]


def resident(kernel, warps: int) -> int:
    """Programs of `kernel` a SM holds: by its shared memory (a SM's, less 1 KB reserved a block) and registers."""
    props = torch.cuda.get_device_properties(0)
    smem = getattr(props, "shared_memory_per_multiprocessor", 228 * 1024)
    by_smem = smem // (kernel.metadata.shared + 1024)
    by_regs = 65536 // (max(kernel.n_regs, 1) * 32 * warps)
    return max(0, min(by_smem, by_regs, 32))


WAVE_CONFIGS = ((64, 4, 3), (64, 4, 4), (64, 8, 3), (128, 4, 2), (128, 4, 3), (128, 8, 3))


def waves() -> None:
    """Batch 1, 4K-32K: at 16, 32 and 64 splits, each config forced, with the programs a SM holds at it and the
    waves the grid takes; graph-replayed, us. Nsight Compute at 1 x 8K had the autotuned pick (BLOCK_N 128, 3
    stages, 136 KB of shared memory) at one program a SM, so the case's 32 splits ran in two waves where cuDNN's
    32 ran in one at two a SM (notes/attention_decode.md). Predicted (written before the run): at 32 splits a
    config that holds two a SM (one wave) beats every config that holds one, and reaches 0.9-1.0x SDPA at 1 x 8K;
    at 16 splits (one wave at any residency) the configs stay within 6% of each other, as `--tiles` found."""
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    for context in (4096, 8192, 16384, 32768):
        t = inputs(1, context, "cuda")
        sdpa = _graph_us(lambda: mod.sdpa(**t))
        picked = ac.split_count(1, 8, context, sms)[0]
        for n in (16, 32, 64):
            if context // n < ac.MIN_CHUNK:
                continue
            tuned = _graph_us(lambda: ac.decode_forward(t["q"], t["k"], t["v"], True, splits=n, fused=True))
            line = [f"1 x {context:5d}, {n:2d} splits{' (split_count)' if n == picked else ''}: SDPA {sdpa:.1f} us; "
                    f"autotuned {tuned:.1f} ({sdpa / tuned:.2f}x)"]
            for bn, w, st in WAVE_CONFIGS:
                try:
                    k = compiled(t, n, bn, w, st)
                    held = resident(k, w)
                    us = _graph_us(lambda: forced(t, n, bn, w, st, True))
                    line.append(f"{bn}/{w}w/{st}st: {k.metadata.shared // 1024} KB, {k.n_regs} regs, {held} a SM, "
                                f"{8 * n / max(held * sms, 1):.2f} waves: {us:.1f} us ({sdpa / us:.2f}x)")
                except Exception as e:  # a config the GPU cannot hold (shared memory)
                    line.append(f"{bn}/{w}w/{st}st: {type(e).__name__}: {str(e)[:80]}")
            print("\n    ".join(line), flush=True)


if __name__ == "__main__":
    if "--check" in sys.argv:
        check("--tiles" in sys.argv)
    elif "--waves" in sys.argv:
        waves()
    else:
        tiles() if "--tiles" in sys.argv else sweep()
