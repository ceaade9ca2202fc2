"""The prefix cascade's tile: how many query rows a program holds, and its prefix pass's config, by request count.

The stored H200 run (notes/attention_prefix.md) puts the fused cascade at 178 us at the claim shape (64 requests x
4 heads a KV head on a 32K prefix): 195 TFLOP/s and 1.14 TB/s of the model's bytes, neither roof; the claim asks
at most 57 us. At 1 to 32 requests it runs 69-96 us on the device where the bytes floor is 31-38 us, and at one
request it is slower than the per-request kernel (69 against 56). The prefix pass holds a fixed 64-row Q tile
(`BLOCK_M`): at 64 x 4 = 256 rows a KV head that is 4 row tiles, each streaming the whole prefix through the L2,
and each tile's two GEMMs are one warpgroup's; at one request the tile holds 4 real rows and 60 of padding, 16x the
MMA work the rows need. The notebook named the lever first: 128-row tiles at many rows, and, read from this, the
least tile at few.

This times `triton_cascade_fused` at each level-1 shape (the cache paged as the case pages it), with the prefix
pass's row tile forced (`BLOCK_M` 16-128, at most the rows a KV head has, rounded up) and its config tuned over a
wider list than the case's three (BLOCK_N 32-128, 4 or 8 warps, 2-4 stages), beside the committed kernel. Each
time is the device's (`do_bench_cudagraph`: replayed, no host), with the two passes' kernels timed apart by the
profiler, and each output compared with the committed kernel's (normwise, bf16's rounding).

Predicted (written before the run):
- at the claim shape a 128-row tile (8 warps) takes the prefix pass from ~150 us to 95-120 us (half the L2
  re-reads of K/V, two warpgroups' MMAs a tile); the fused cascade to 110-140 us, still over the claim's 57 us
  (which needs ~610 TFLOP/s of the pass: FA3-style specialisation, attention_prefill's gluon_fa3, is the step
  after);
- at 1 and 4 requests the 16-row tile takes the pass to within 1.3x of the bytes floor (31-32 us), the cascade
  to 40-50 us, at or under per_request's 56 at one request;
- the config beyond the tile moves under 10% anywhere (the case's three configs already hold 2-3 stages).
If the 128-row tile gains under 10% at the claim shape, the re-reads and the MMA width are not what binds, and the
ncu reading of the pass (`gpu_session.sh bound`: tensor pipe, L2 throughput, stalls) is the next step.

    python3 benchmarks/explore/attention/prefix_tiles.py             # GPU: every level-1 shape
    TRITON_INTERPRET=1 python3 benchmarks/explore/attention/prefix_tiles.py --check   # no GPU: forced tiles exact
"""

from __future__ import annotations

import argparse
import contextlib

import torch
import triton

from casebook.kernels import attention_prefix as mod

SHAPES = [(64, 32, 32768, 256), (1, 32, 32768, 256), (4, 32, 32768, 256), (16, 32, 32768, 256),
          (32, 32, 32768, 256), (64, 64, 32768, 128), (64, 32, 4096, 256)]
"""(requests, query heads, prefix, suffix) of the case's level-1 shapes; 8 KV heads, d 128."""

TILES = (16, 32, 64, 128)


def inputs(batch: int, heads: int, prefix: int, suffix: int, head_dim: int, kv_heads: int, device: str) -> dict:
    shape = {"batch": batch, "heads": heads, "kv_heads": kv_heads, "prefix": prefix, "suffix": suffix,
             "head_dim": head_dim}
    t = mod.make_inputs(shape, torch.bfloat16, device, torch.Generator().manual_seed(0), contiguous=False)
    return {k: t[k] for k in ("q", "k_cache", "v_cache", "block_table", "seq_lens", "shared")}


def configs(interpret: bool) -> list:
    if interpret:
        return [triton.Config({"BLOCK_N": 16}, num_warps=4, num_stages=1)]
    return [triton.Config({"BLOCK_N": bn}, num_warps=w, num_stages=st)
            for bn in (32, 64, 128) for w in (4, 8) for st in (2, 3, 4)]


@contextlib.contextmanager
def forced(block_m: int | None, tuned: list | None):
    """The cascade with its prefix pass's row tile `block_m` (None: the committed one) and its configs `tuned`
    (None: the committed list), the autotuner's picks forgotten on the way in and out."""
    tuner = mod._prefix_pass_tuned
    saved = mod.BLOCK_M, tuner.configs
    mod.BLOCK_M = block_m or saved[0]
    tuner.configs = tuned or saved[1]
    tuner.cache.clear()
    try:
        yield tuner
    finally:
        mod.BLOCK_M, tuner.configs = saved
        tuner.cache.clear()


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).norm() / b.double().norm())


def kernel_us(fn, names=("_prefix_pass", "_suffix_pass")) -> dict:
    """Each named kernel's device time a call, by the profiler over 20 calls."""
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(20):
            fn()
        torch.cuda.synchronize()
    out = dict.fromkeys(names, 0.0)
    for e in prof.key_averages():
        for n in names:
            if n in e.key:
                out[n] += e.device_time_total / 20  # us
    return out


def gpu() -> None:
    for b, h, prefix, suffix in SHAPES:
        one_shape(b, h, prefix, suffix)
        torch.cuda.empty_cache()


def one_shape(b: int, h: int, prefix: int, suffix: int) -> None:
    """The committed cascade, then each forced row tile with the wide configs, at one level-1 shape."""
    t = inputs(b, h, prefix, suffix, 128, 8, "cuda")
    rows = b * (h // 8)
    floor_us = 2 * 8 * 128 * 2 * (prefix + b * suffix) / 4.27e6  # K and V once, at the H200's copy rate
    want = mod.triton_cascade_fused(**t)
    tag = f"{b} x {h} heads, prefix {prefix}, suffix {suffix}"

    def call() -> torch.Tensor:
        return mod.triton_cascade_fused(**t)

    def run(block_m=None, tuned=None) -> str:
        with forced(block_m, tuned) as tuner:
            err = rel(call(), want)
            us = triton.testing.do_bench_cudagraph(call, rep=200, return_mode="median") * 1e3
            parts = kernel_us(call)
            pick = next(iter(tuner.cache.values()), None)
        return (f"{us:7.1f} us (prefix pass {parts['_prefix_pass']:6.1f}, suffix {parts['_suffix_pass']:5.1f}), "
                f"vs committed {err:.1e}{'  WRONG' if err > 1e-2 else ''}, pick {pick}")

    print(f"{tag}: bytes floor at the H200's copy {floor_us:.1f} us; committed (BLOCK_M {mod.BLOCK_M}): {run()}",
          flush=True)
    for bm in TILES:
        if bm > max(16, triton.next_power_of_2(rows)):
            continue
        try:
            print(f"{tag}: BLOCK_M {bm:3d}, wide configs: {run(bm, configs(False))}", flush=True)
        except Exception as e:  # noqa: BLE001 (an exploration reports what failed and goes on)
            print(f"{tag}: BLOCK_M {bm:3d} failed: {type(e).__name__}: {str(e)[:160]}", flush=True)


def check() -> None:
    """Each forced tile against the float64 reference at ragged shapes, under the interpreter."""
    for b, h, hkv, prefix, suffix in ((3, 8, 2, 40, 9), (5, 8, 2, 64, 3)):
        t = inputs(b, h, prefix, suffix, 64, hkv, "cpu")
        ref = mod.reference(*(t[k] for k in ("q", "k_cache", "v_cache", "block_table", "seq_lens")))
        for bm in (16, 32):
            with forced(bm, configs(True)):
                err = rel(mod.triton_cascade_fused(**t), ref)
            print(f"{b} x {h} heads, prefix {prefix}: BLOCK_M {bm}: normwise error {err:.1e} "
                  f"{'ok' if err < 1e-2 else 'WRONG'}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--check", action="store_true", help="no GPU: forced tiles against float64 (interpreter)")
    args = parser.parse_args()
    check() if args.check else gpu()


if __name__ == "__main__":
    main()
