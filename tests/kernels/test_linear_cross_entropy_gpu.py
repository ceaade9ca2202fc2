"""linear_cross_entropy on a GPU: the in-place split kernel's rows meeting at their barrier with the
gradient written over the logits (the race the interpreter's two launches cannot show: the target's logit
read after another program has overwritten it), the autotuner's restore of the logits it overwrites, and
the chunked and Liger rungs against float64 at GPU-sized chunks. Skipped elsewhere; run on a GPU without
TRITON_INTERPRET: `python3 -m pytest -q tests/kernels/test_linear_cross_entropy_gpu.py`."""

from __future__ import annotations

import os

import pytest
import torch

pytestmark = pytest.mark.skipif(not torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET") == "1",
                                reason="needs a GPU, not the interpreter")


@pytest.fixture(scope="module")
def mods():
    from casebook.kernels import cross_entropy, linear_cross_entropy
    return cross_entropy, linear_cross_entropy


@pytest.mark.parametrize("vocab", [1000, 32001, 128256, 262144])
@pytest.mark.parametrize("eps", [0.0, 0.1])
def test_inplace_split_matches_the_out_of_place_kernel(mods, vocab, eps):
    ce, mod = mods
    g = torch.Generator(device="cuda").manual_seed(vocab)
    rows = 131
    logits = (torch.randn(rows, vocab, generator=g, device="cuda") * 2).to(torch.bfloat16)
    # Targets on both sides of every 4K boundary the autotuner's chunks can have, the last column, ignored.
    edges = torch.tensor([0, 4095, 4096, 8191, 8192, 16383, 16384, vocab - 1], device="cuda") % vocab
    target = torch.randint(vocab, (rows,), generator=g, device="cuda")
    target[:len(edges)] = edges
    target[-1] = ce.IGNORE_INDEX
    n_valid = ce._n_valid(target)
    want_loss, want_grad = ce.split_triton(logits, target, eps)
    for _ in range(3):  # the first call autotunes over the same logits (restored between configurations)
        grad = logits.clone()
        losses = torch.empty(rows, device="cuda")
        mod.split_inplace(grad, target, eps, n_valid, losses)
        torch.cuda.synchronize()
        # The two autotuners may pick different chunks: the same math summed in another order.
        diff = torch.linalg.vector_norm(grad.double() - want_grad.double())
        assert float(diff / torch.linalg.vector_norm(want_grad.double())) <= 4e-3
        assert abs(float(losses.sum() / n_valid) - float(want_loss)) <= 1e-5 * abs(float(want_loss))


@pytest.mark.parametrize("fn", ["chunked", "liger", "split"])
@pytest.mark.parametrize("t, h, v", [(1000, 1024, 32000), (777, 512, 151936)])
def test_variant_matches_reference(mods, fn, t, h, v):
    from casebook.run.inprocess import check
    from casebook.tolerance import TOLERANCE
    _, mod = mods
    if fn == "liger":
        pytest.importorskip("liger_kernel", reason="liger-kernel is the `peers` extra")
    c = check(getattr(mod, fn), mod.reference, mod.make_inputs, {"tokens": t, "hidden": h, "vocab": v}, "bf16",
              "cuda", [t + v, t + v + 1], tolerance=0.1)
    assert c.correct, c.error
    assert c.max_rel_err <= TOLERANCE["bf16"]
