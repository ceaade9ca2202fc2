"""Device exploration (not a casebook run): the LM head and its loss, forward and backward, time and peak
memory, with the logits materialised and without.

Now a case of its own, `cases/linear_cross_entropy.yaml` (the harness measures peak memory and takes a
case's own inputs): run that (`bash benchmarks/gpu_session.sh case linear_cross_entropy`); this script stays as the
quick look outside the harness, with chunk sizes on the command line.

`casebook run` neither records peak memory nor lets a variant take other inputs than the logits, so the
cross_entropy case cannot hold the fused linear cross-entropy. This measures, for the head of a training
step (hidden [tokens, hidden] @ W^T [vocab, hidden] -> loss -> d hidden, dW), each way of doing it:

  torch      logits = h W^T materialised, F.cross_entropy and autograd's backward (the case's level-3
             baseline without the norm)
  split      logits materialised, loss and d logits by the case's triton_split (one read, one write),
             then dW = d logits^T h and d h = d logits W
  liger      Liger-Kernel's fused linear cross-entropy: token chunks, logits of one chunk at a time,
             its cross-entropy kernel writing the gradient over the chunk, torch GEMMs around it
  chunked    the same chunking with the case's split kernel: per chunk of `--chunk` tokens, logits of
             the chunk, loss and gradient in one pass, d h of the chunk and dW accumulated (addmm)

For each: median time of `--reps` calls (CUDA events), TFLOP/s counted on the three GEMMs
(3 x 2 x tokens x hidden x vocab), and the allocator's peak above what was allocated before the call
(`torch.cuda.reset_peak_memory_stats` first), beside the floor of what the step must hold (d hidden
and dW) and the materialised logits' bytes. Outputs (loss, d hidden, dW) are compared with torch's.

Predictions (notes/cross_entropy.md, written before the run), 8192 x 4096 x 128256 bf16: torch ~41 ms,
peak ~9.5 GB above the inputs; split ~38.5 ms, ~5.3 GB; liger and chunked ~37-40 ms (GEMMs at
~650-700 TFLOP/s, the loss's bytes per chunk unchanged), peak ~1.4-1.7 GB (dW 1.05 GB, d hidden 67 MB,
one chunk's logits and gradient). The issue's targets for a fused kernel: 600 TFLOP/s or more on the
three GEMMs, peak at most 1.1x the floor (hidden, weight and their gradients), faster than Liger.

    python3 benchmarks/explore/cross_entropy/linear_cross_entropy.py                     (GPU)
    python3 benchmarks/explore/cross_entropy/linear_cross_entropy.py --tokens 4096 --vocab 262144
    TRITON_INTERPRET=1 python3 benchmarks/explore/cross_entropy/linear_cross_entropy.py --check
"""

from __future__ import annotations

import argparse
import statistics

import torch
import torch.nn.functional as F

from casebook.kernels import cross_entropy as ce


def torch_head(h: torch.Tensor, w: torch.Tensor, target: torch.Tensor, chunk: int):
    hh, ww = h.detach().requires_grad_(), w.detach().requires_grad_()
    loss = F.cross_entropy(hh @ ww.T, target, ignore_index=ce.IGNORE_INDEX)
    dh, dw = torch.autograd.grad(loss, (hh, ww))
    return loss.detach(), dh, dw


def split_head(h: torch.Tensor, w: torch.Tensor, target: torch.Tensor, chunk: int):
    logits = h @ w.T
    loss, dlogits = ce.split_triton(logits, target)
    del logits
    return loss, dlogits @ w, dlogits.T @ h


def liger_head(h: torch.Tensor, w: torch.Tensor, target: torch.Tensor, chunk: int):
    from liger_kernel.ops.fused_linear_cross_entropy import (
        fused_linear_cross_entropy_forward,
    )
    hh, ww = h.detach().requires_grad_(), w.detach().requires_grad_()
    loss, _, _, _, dh, dw, _ = fused_linear_cross_entropy_forward(hh, ww, target, ignore_index=ce.IGNORE_INDEX)
    return loss.detach(), dh, dw


def chunked_head(h: torch.Tensor, w: torch.Tensor, target: torch.Tensor, chunk: int):
    n_valid = ce._n_valid(target)  # the batch's count: each chunk's loss and gradient are its share
    dh = torch.empty_like(h)
    dw = torch.zeros_like(w)
    loss = torch.zeros((), device=h.device)
    for s in range(0, h.shape[0], chunk):
        hc = h[s:s + chunk]
        part, g = ce.split_triton(hc @ w.T, target[s:s + chunk], n_valid=n_valid)  # [chunk, vocab], freed per chunk
        loss += part
        torch.matmul(g, w, out=dh[s:s + chunk])
        dw.addmm_(g.T, hc)
    return loss, dh, dw


METHODS = {"torch": torch_head, "split": split_head, "liger": liger_head, "chunked": chunked_head}


def inputs(tokens: int, hidden: int, vocab: int, device: str, dtype=torch.bfloat16):
    g = torch.Generator(device=device).manual_seed(0)
    h = torch.randn(tokens, hidden, generator=g, device=device).to(dtype)
    w = (torch.randn(vocab, hidden, generator=g, device=device) * (2.0 / hidden**0.5)).to(dtype)
    target = torch.randint(vocab, (tokens,), generator=g, device=device)
    ignored = torch.rand(tokens, generator=g, device=device) < ce.IGNORED_SHARE
    return h, w, torch.where(ignored, torch.full_like(target, ce.IGNORE_INDEX), target)


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double(), b.double()
    return float(torch.linalg.vector_norm(a - b) / torch.linalg.vector_norm(b))


def agreement(outs: dict) -> dict:
    base = outs["torch"]
    return {name: tuple(rel(x, y) for x, y in zip(out, base)) for name, out in outs.items() if name != "torch"}


def check() -> None:
    """Every method against torch at small shapes (the interpreter on a CPU): loss, d hidden, dW."""
    for tokens, hidden, vocab, chunk in ((37, 16, 1000, 8), (64, 32, 2049, 64), (5, 8, 300, 2)):
        h, w, t = inputs(tokens, hidden, vocab, "cpu", torch.float32)
        outs = {}
        for name, fn in METHODS.items():
            try:
                outs[name] = fn(h, w, t, chunk)
            except ImportError as e:
                print(f"{name}: skipped ({e})")
        for name, errs in agreement(outs).items():
            ok = max(errs) < 1e-4
            print(f"{tokens}x{hidden}x{vocab} chunk {chunk} {name}: loss/dh/dW rel {errs[0]:.1e} {errs[1]:.1e} "
                  f"{errs[2]:.1e} {'ok' if ok else 'WRONG'}")
            assert ok, name


def measure(fn, args, reps: int) -> tuple[float, float]:
    """(median ms, peak MB above what was allocated before the call)."""
    fn(*args)  # JIT, autotuning, cuBLAS heuristics
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    out = fn(*args)
    torch.cuda.synchronize()
    peak_mb = (torch.cuda.max_memory_allocated() - base) / 1e6
    del out
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn(*args)
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times), peak_mb


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--check", action="store_true", help="correctness at small shapes (CPU, interpreter)")
    p.add_argument("--tokens", type=int, default=8192)
    p.add_argument("--hidden", type=int, default=4096)
    p.add_argument("--vocab", type=int, default=128256)
    p.add_argument("--chunk", type=int, nargs="+", default=[1024, 2048], help="tokens per chunk (chunked)")
    p.add_argument("--reps", type=int, default=10)
    a = p.parse_args()
    if a.check:
        check()
        return
    h, w, t = inputs(a.tokens, a.hidden, a.vocab, "cuda")
    gemm_flop = 3 * 2 * a.tokens * a.hidden * a.vocab
    logits_mb = a.tokens * a.vocab * 2 / 1e6
    floor_mb = (h.numel() + w.numel()) * 2 / 1e6  # d hidden and dW, bf16
    print(f"{a.tokens} tokens x hidden {a.hidden} x vocab {a.vocab}, bf16: GEMMs {gemm_flop / 1e12:.1f} TFLOP; "
          f"logits {logits_mb:.0f} MB; floor to hold (d hidden + dW) {floor_mb:.0f} MB")
    runs = [("torch", 0), ("split", 0), ("liger", 0)] + [("chunked", c) for c in a.chunk]
    outs = {}
    for name, chunk in runs:
        label = f"{name} {chunk}" if chunk else name
        try:
            ms, peak = measure(METHODS[name], (h, w, t, chunk), a.reps)
        except ImportError as e:
            print(f"{label:12s} skipped ({e})")
            continue
        outs[label] = METHODS[name](h, w, t, chunk)
        print(f"{label:12s} {ms:8.2f} ms  {gemm_flop / ms / 1e9:6.0f} TFLOP/s on the GEMMs  "
              f"peak {peak:8.0f} MB above the inputs ({peak / floor_mb:.2f}x the floor)")
    if "torch" in outs:
        for name, errs in agreement(outs).items():
            print(f"{name:12s} against torch: loss {errs[0]:.1e}, d hidden {errs[1]:.1e}, dW {errs[2]:.1e}")


if __name__ == "__main__":
    main()
