"""Where the chunked linear cross-entropy's time goes, step by step, and what the chunk size buys.

The issue's H200 measurement put the chunked rung at 546 TFLOP/s at 8192 x 4096 x 128256, 0.85x torch's
materialised path (643), where the notebook predicted 590-660 (notes/linear_cross_entropy.md). A chunk of c tokens
is four steps: the logits GEMM [c, H] x [H, V], the in-place loss and gradient (two passes over c x V), the d hidden
GEMM [c, V] x [V, H] (c / 128 x H / 128 output tiles: 96 at c = 384 for 132 SMs, so cuBLAS splits K or leaves SMs
idle) and the dW update dW += d logits^T h, which reads and writes dW whole (2.1 GB) for 2 c H V FLOPs: c / 2
FLOP/byte, the ridge at c ~ 374. This times each step alone at c = 256-2048 (`triton.testing.do_bench`, L2
flushed, median), the whole chunked call at each c, and the materialised path's three GEMMs at c = all tokens.

Predicted (written before the run, from the notebook's per-step figures): at c = 384 the logits GEMM ~0.58 ms
(~690 TFLOP/s), the loss ~70 us, the d hidden GEMM 0.6-0.75 ms and the dW update 0.6-0.7 ms; the two skinny GEMMs
are where 546 loses to 643. If the d hidden GEMM is the slow one, a chunk of 512-768 tokens (peak memory 1.12-1.18x
the inputs, over the case's 1.1x) moves it most; if the dW update is, no chunk inside the memory claim fixes it, and
the claim's two bars (600 TFLOP/s, never slower than torch, at 1.1x memory) cannot all hold.

    python3 benchmarks/explore/linear_cross_entropy/chunk_steps.py          # GPU: the claim's shape
    TRITON_INTERPRET=1 python3 benchmarks/explore/linear_cross_entropy/chunk_steps.py --check   # no GPU
"""

from __future__ import annotations

import sys

import torch

from casebook.kernels import linear_cross_entropy as m

SHAPE = {"tokens": 8192, "hidden": 4096, "vocab": 128256}
CHUNKS = (256, 384, 512, 768, 1024, 2048)


def check() -> None:
    """The chunked call at several chunk sizes (the last chunk short) against float64, under the interpreter."""
    small = {"tokens": 40, "hidden": 32, "vocab": 300}
    t = m.make_inputs(small, torch.float32, "cpu", torch.Generator().manual_seed(0))
    want = m.reference(t["hidden"], t["weight"], t["target"], 0.0)
    for chunk in (8, 16, 24, 40):
        got = m.chunked_triton(t["hidden"], t["weight"], t["target"], 0.0, chunk=chunk)
        err = max(((g.double() - w).norm() / w.norm()).item() for g, w in zip(got, want))
        print(f"chunk {chunk}: worst normwise error {err:.1e} {'ok' if err < 1e-4 else 'WRONG'}")


def steps(chunk: int, t: dict) -> dict:
    """Each step of one full chunk alone, in ms (each on the chunk's own buffers, as the chunked call runs it)."""
    from triton.testing import do_bench

    h, w, target = t["hidden"], t["weight"], t["target"]
    hc, tc = h[:chunk], target[:chunk]
    logits = torch.empty(chunk, w.shape[0], device=h.device, dtype=h.dtype)
    dh = torch.empty(chunk, h.shape[1], device=h.device, dtype=h.dtype)
    dw = torch.zeros_like(w)
    n_valid = m._n_valid(target)
    losses = torch.empty(chunk, device=h.device, dtype=torch.float32)
    bench = {
        "logits GEMM": lambda: torch.mm(hc, w.T, out=logits),
        "loss in place": lambda: (torch.mm(hc, w.T, out=logits), m.split_inplace(logits, tc, 0.0, n_valid, losses)),
        "d hidden GEMM": lambda: torch.mm(logits, w, out=dh),
        "dW update": lambda: dw.addmm_(logits.T, hc),
    }
    out = {name: do_bench(fn, warmup=10, rep=100, return_mode="median") for name, fn in bench.items()}
    out["loss in place"] -= out["logits GEMM"]  # timed behind a fresh GEMM: the in-place pass overwrites logits
    return out


def whole(t: dict) -> dict:
    """The materialised path's three GEMMs over every token, in ms (its logits freed on return)."""
    from triton.testing import do_bench

    h, w = t["hidden"], t["weight"]
    logits = h @ w.T
    return {"logits GEMM": do_bench(lambda: h @ w.T, warmup=5, rep=50, return_mode="median"),
            "d hidden GEMM": do_bench(lambda: logits @ w, warmup=5, rep=50, return_mode="median"),
            "dW GEMM": do_bench(lambda: logits.T @ h, warmup=5, rep=50, return_mode="median")}


def main() -> None:
    if "--check" in sys.argv:
        return check()
    from triton.testing import do_bench

    t = m.make_inputs(SHAPE, torch.bfloat16, "cuda", torch.Generator().manual_seed(0))
    n, hid, v = SHAPE["tokens"], SHAPE["hidden"], SHAPE["vocab"]
    flops = 2 * n * hid * v  # one GEMM's FLOPs over every token
    inputs = (n + v) * hid * 2
    print(f"{n} x {hid} x {v} bf16: one GEMM {flops / 1e12:.2f} TFLOP; the model's three {3 * flops / 1e12:.2f}")
    for name, ms in whole(t).items():
        print(f"  all tokens, {name:14s} {ms:7.3f} ms  {flops / ms / 1e9:6.1f} TFLOP/s")
    for c in CHUNKS:
        per = steps(c, t)
        f = flops * c / n
        line = ", ".join(f"{k} {ms:.3f} ms" + (f" ({f / ms / 1e9:.0f} TFLOP/s)" if "GEMM" in k or "dW" in k else "")
                         for k, ms in per.items())
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        call = do_bench(lambda: m.chunked_triton(t["hidden"], t["weight"], t["target"], 0.0, chunk=c),
                        warmup=2, rep=20, return_mode="median")
        peak = (torch.cuda.max_memory_allocated() - base) / inputs
        print(f"chunk {c:5d}: {line}; the whole call {call:.2f} ms, {3 * flops / call / 1e9:.0f} TFLOP/s, peak "
              f"{peak:.2f}x the inputs above them", flush=True)


if __name__ == "__main__":
    main()
