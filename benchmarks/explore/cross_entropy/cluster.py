"""The cluster rung against the Triton split kernel it should beat, Liger and softmax's own cluster kernel at the
same bytes, outside the harness: is cross-entropy's carried-over cluster kernel where softmax's is?

Predicted (notes/cross_entropy.md, written before the run): cluster_bulk 3.6-3.9 TB/s at 4096 x 128256 and
4096 x 262144 bf16, against triton_split's 2.0, and within a few percent of softmax_cluster on the same logits
(one read, one write each; the gradient's extra arithmetic hides under the loads). A miss of more than ~5%
against softmax_cluster points at what the kernel adds (the third number's shuffles, the dealer's `x_t` load).

Times: `triton.testing.do_bench` (L2 flushed, median); TB/s over the floor's bytes, the logits read once and the
gradient written once. Each variant's gradient is checked against the float64 reference first.

    python3 benchmarks/explore/cross_entropy/cluster.py        (GPU)
"""

from __future__ import annotations

import torch
import triton

from casebook.kernels import cross_entropy as mod
from casebook.kernels import softmax_cluster

SHAPES = ((4096, 128256), (4096, 262144), (8192, 32000), (64, 128256))


def main() -> None:
    variants = {"cluster_bulk": mod.cluster_bulk, "triton_split": mod.triton_split, "liger": mod.liger}
    for tokens, vocab in SHAPES:
        inputs = mod.make_inputs({"tokens": tokens, "vocab": vocab}, torch.bfloat16, "cuda",
                                 torch.Generator().manual_seed(tokens))
        ref = mod.reference(inputs["logits"][:256], inputs["target"][:256], 0.0) if tokens > 256 else None
        floor = 2 * inputs["logits"].numel() * inputs["logits"].element_size()
        line = [f"{tokens} x {vocab} bf16:"]
        for name, fn in variants.items():
            try:
                grad = fn(**inputs)
            except Exception as e:  # noqa: BLE001 (an exploration reports what failed and goes on)
                line.append(f"{name} failed ({type(e).__name__}: {e})"[:120])
                continue
            if ref is not None:  # the first 256 rows' gradient, scaled to the whole batch's count
                n_all = int((inputs["target"] != mod.IGNORE_INDEX).sum())
                n_head = int((inputs["target"][:256] != mod.IGNORE_INDEX).sum())
                diff = grad[:256].double() * n_all / n_head - ref
                err = torch.linalg.vector_norm(diff) / torch.linalg.vector_norm(ref)
                if err > 2e-2:
                    line.append(f"{name} WRONG (rel err {float(err):.3g})")
                    continue
            us = triton.testing.do_bench(lambda fn=fn: fn(**inputs), warmup=25, rep=200, return_mode="median") * 1e3
            line.append(f"{name} {us:.1f} us {floor / us / 1e6:.2f} TB/s")
        x = inputs["logits"]
        us = triton.testing.do_bench(lambda x=x: softmax_cluster.softmax(x), warmup=25, rep=200,
                                      return_mode="median") * 1e3
        line.append(f"softmax_cluster (same bytes) {us:.1f} us {floor / us / 1e6:.2f} TB/s")
        print("  ".join(line), flush=True)


if __name__ == "__main__":
    main()
