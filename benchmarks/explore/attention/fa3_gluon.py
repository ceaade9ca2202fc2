"""The FA3-style Gluon forward (casebook/kernels/attention_fa3.py): is it right, and how fast, beside the rungs.

attention_prefill's Triton rungs stop at 447 (causal) and 490 (non-causal) TFLOP/s at the claim shape on the
H200, cuDNN's at 608 and 677 (notes/attention_prefill.md). The Gluon kernel is written on FA3's recipe: a
producer warp, two consumer warpgroups of 64 query rows in ping-pong over 128-key tiles, each group's softmax
under the other's GEMMs, and (OVERLAP) its own P V still running while it takes the next tile's softmax.

Predicted (written before any run): correct to bf16's rounding at every shape (normwise error under 1%, as the
Triton rungs); at 4 x 32 (8 KV) x 4096 x 128, causal, 520-600 TFLOP/s with OVERLAP (the Triton TMA rung's 463
plus the softmax's exposed share hidden: the exponentials alone are about half the GEMMs' time at d = 128),
480-540 without; non-causal 560-650. If it is no faster than the Triton TMA rung, the softmax is not what was
exposed: the loads (2 stages of 32 KB K and V for two groups; the run times 3 stages too) are next, then the
causal tail (the longest query blocks first, one program per block, no persistence). A hang is a barrier's
phase that is wrong: each shape runs in a child with a time limit, and the first hang ends the script (the
protocol is the same at every shape, so the rest would hang as well and spend the call's time).

    python3 benchmarks/explore/attention/fa3_gluon.py            # GPU: checks, then times, every shape
    python3 benchmarks/explore/attention/fa3_gluon.py --lower    # any machine: what sm_90a lowering gives
"""

from __future__ import annotations

import json
import subprocess
import sys

# (batch, heads, kv_heads, seq_q, seq_kv, head_dim, causal): the case's level-1 shapes, then small ones first
# in the check (a wrong phase shows on one tile as well as on thirty-two)
SMALL = [(1, 4, 2, 128, 128, 128, True), (1, 4, 2, 256, 256, 128, False), (2, 4, 1, 384, 640, 128, True),
         (1, 2, 2, 256, 512, 64, True), (1, 2, 2, 256, 256, 64, False)]
LEVEL1 = [(4, 32, 8, 4096, 4096, 128, True), (4, 32, 8, 4096, 4096, 128, False),
          (8, 16, 16, 2048, 2048, 64, True), (16, 32, 8, 1024, 1024, 128, True),
          (2, 32, 8, 8192, 8192, 128, True), (1, 32, 8, 2048, 8192, 128, True)]
CHILD_S = 90


def _label(shape) -> str:
    b, h, hkv, sq, skv, d, causal = shape
    return f"{b}x{h}x{hkv}x{sq}x{skv}x{d}{' causal' if causal else ''}"


def _inputs(shape):
    import torch

    from casebook.kernels import attention_common as ac

    b, h, hkv, sq, skv, d, _ = shape
    return ac.make_qkv(b, h, hkv, sq, skv, d, torch.bfloat16, "cuda", torch.Generator().manual_seed(0))


def one(shape, timed: bool) -> dict:
    """In a child: the kernel's error (against float64 for the small shapes, SDPA for the large)
    and, where `timed`, each rung's median time in us (do_bench, L2 flushed)."""
    import torch
    from triton.testing import do_bench

    from casebook.kernels import attention_common as ac
    from casebook.kernels import attention_fa3 as fa

    b, h, hkv, sq, skv, d, causal = shape
    t = _inputs(shape)
    q, k, v = t["q"], t["k"], t["v"]
    out: dict = {}
    for overlap in (True, False):
        got = fa.forward(q, k, v, causal, overlap=overlap).double()
        if timed:  # SDPA under its own dispatch (the flash backend refuses the lower-right mask of S_q < S_kv)
            want = ac.sdpa(q, k, v, causal, None).double()
        else:
            want = ac.reference(q, k, v, causal).double()
        rows = ((got - want).norm(dim=-1) / want.norm(dim=-1).clamp_min(1e-30)).max().item()
        out[f"error overlap={overlap}"] = {"normwise": ((got - want).norm() / want.norm()).item(), "worst row": rows}
    if not timed:
        return out
    pairs = ac.visible_pairs(sq, skv, causal)
    flops = 4 * b * h * pairs * d
    rungs = {"fa3 overlap": lambda: fa.forward(q, k, v, causal, overlap=True),
             "fa3": lambda: fa.forward(q, k, v, causal, overlap=False),
             "fa3 overlap 3 stages": lambda: fa.forward(q, k, v, causal, overlap=True, stages=3),
             "triton_flash_tma": lambda: ac.flash_forward(q, k, v, causal, tma=True),
             "sdpa cudnn": lambda: ac.sdpa(q, k, v, causal, "cudnn"),
             "sdpa flash": lambda: ac.sdpa(q, k, v, causal, "flash")}
    for name, fn in rungs.items():
        try:
            us = do_bench(fn, warmup=25, rep=200, return_mode="median") * 1e3
            out[name] = {"us": us, "tflops": flops / us / 1e6}
        except Exception as e:  # a backend this build lacks
            out[name] = {"error": f"{type(e).__name__}: {str(e).splitlines()[0][:160]}"}
        torch.cuda.synchronize()
    return out


def lower() -> None:
    from casebook.kernels import attention_fa3 as fa

    sys.path.insert(0, "benchmarks/explore")
    from aot import report

    for causal in (True, False):
        for d in fa.HEAD_DIMS:
            for overlap in (True, False):
                k = fa.compile_for_sm90(causal=causal, head_dim=d, overlap=overlap)
                print(f"causal={causal} d={d} overlap={overlap}: {report(k)}; "
                      f"wgmma {k.asm['ptx'].count('wgmma.mma_async')}")


def main() -> None:
    if "--lower" in sys.argv:
        return lower()
    import torch

    if not torch.cuda.is_available():
        sys.exit("fa3_gluon: the kernel runs on a Hopper GPU alone (no interpreter); --lower runs anywhere")
    if "--one" in sys.argv:
        shape, timed = json.loads(sys.argv[sys.argv.index("--one") + 1])
        print(json.dumps(one(tuple(shape), timed)))
        return
    wrong = False
    for shape, timed in [(s, False) for s in SMALL] + [(s, True) for s in LEVEL1]:
        if wrong and timed:
            print(f"{_label(shape)}: not timed (a small shape was wrong)")
            continue
        try:
            r = subprocess.run([sys.executable, __file__, "--one", json.dumps([shape, timed])], capture_output=True,
                               text=True, timeout=CHILD_S)
        except subprocess.TimeoutExpired:
            print(f"{_label(shape)}: HUNG (no answer in {CHILD_S} s); the other shapes not run")
            return
        if r.returncode:
            print(f"{_label(shape)}: FAILED (exit {r.returncode}): {r.stderr.strip().splitlines()[-1:]}")
            wrong = True
            continue
        res = json.loads(r.stdout.strip().splitlines()[-1])
        errs = {k.split()[-1]: v for k, v in res.items() if k.startswith("error")}
        bad = any(e["normwise"] > 1e-2 for e in errs.values())
        wrong |= bad and not timed
        line = "; ".join(f"{k}: {e['normwise']:.1e} (worst row {e['worst row']:.1e})" for k, e in errs.items())
        print(f"{_label(shape)}: {'WRONG ' if bad else ''}error {line}")
        for name, v in res.items():
            if not name.startswith("error"):
                rate = f"{v['us']:9.1f} us {v['tflops']:6.1f} TFLOP/s" if "us" in v else v["error"]
                print(f"    {name:20s} {rate}")


if __name__ == "__main__":
    main()
