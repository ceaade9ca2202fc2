"""cross_entropy on a GPU: triton_split's rows split over programs that wait for each other at a row
barrier (the interpreter runs programs one after another, so there it takes two launches instead), the
autotuned chunk sizes, the launchers' loss, and cluster_bulk's CUDA kernel (Hopper), persistent or not.
Skipped elsewhere; run on a GPU without TRITON_INTERPRET:
`python3 -m pytest -q tests/kernels/test_cross_entropy_gpu.py`."""

from __future__ import annotations

import os

import pytest
import torch

pytestmark = pytest.mark.skipif(not torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET") == "1",
                                reason="needs a GPU, not the interpreter")

ROWS = (1, 37, 1031)  # one row; odd; a prime over a thousand (1031 x 300007 still fits a fp64 reference)
VOCABS = (1000, 32000, 32001, 128256, 262144, 300007)  # one chunk; Llama-2; a ragged tail; Llama-3;
# Gemma-3 (at most 64 chunks of 4K); a prime past 256K


def large_memory(rows=0, vocab=0, **_) -> bool:
    """Logits past 100 M elements, whose float64 reference and gradients take gigabytes: those tests run one at a
    time (tests/conftest.py)."""
    return rows * vocab >= 1e8


@pytest.fixture(scope="module")
def mod():
    from casebook.kernels import cross_entropy
    return cross_entropy


@pytest.mark.parametrize("vocab", VOCABS)
@pytest.mark.parametrize("rows", ROWS)
@pytest.mark.parametrize("dtype", ["bf16", "fp32"])
@pytest.mark.parametrize("fn", ["triton_split", "triton_two_sweep", "liger", "cluster_bulk"])
def test_variant_matches_reference(mod, fn, rows, vocab, dtype):
    from casebook.run.inprocess import check
    from casebook.tolerance import TOLERANCE
    if fn == "liger":
        pytest.importorskip("liger_kernel", reason="liger-kernel is the `peers` extra")
    c = check(getattr(mod, fn), mod.reference, mod.make_inputs, {"tokens": rows, "vocab": vocab}, dtype, "cuda",
              [rows * 7 + vocab, rows * 7 + vocab + 1])
    assert c.correct, c.error
    assert c.max_rel_err <= TOLERANCE[dtype]


@pytest.mark.parametrize("launcher", ["split_triton", "two_sweep_triton", "cluster_loss"])
@pytest.mark.parametrize("rows,vocab,eps", [(37, 128256, 0.0), (512, 151936, 0.1), (3, 262144, 0.0)])
def test_launcher_loss_matches_reference(mod, launcher, rows, vocab, eps):
    from casebook.run.check import TORCH_DTYPES, upcast
    inputs = mod.make_inputs({"tokens": rows, "vocab": vocab}, TORCH_DTYPES["bf16"], "cuda",
                             torch.Generator().manual_seed(rows), eps)
    inputs["target"][0] = 1
    loss, grad = getattr(mod, launcher)(**inputs)
    want = mod.reference_loss(**upcast(inputs))
    assert abs(float(loss) - float(want)) <= 2e-2 * abs(float(want))
    ref = mod.reference(**upcast(inputs))
    assert float(torch.linalg.vector_norm(grad.double() - ref) / torch.linalg.vector_norm(ref)) <= 2e-2


def test_split_called_again_and_again_keeps_its_barriers_consistent(mod):
    # The barrier words are reused across launches (a generation per row); 50 calls on 64 rows, each
    # checked, would hang or go wrong if a launch left a count behind.
    from casebook.run.check import TORCH_DTYPES, upcast
    inputs = mod.make_inputs({"tokens": 64, "vocab": 128256}, TORCH_DTYPES["bf16"], "cuda",
                             torch.Generator().manual_seed(0))
    ref = mod.reference(**upcast(inputs))
    for _ in range(50):
        grad = mod.triton_split(**inputs)
    torch.cuda.synchronize()
    assert float(torch.linalg.vector_norm(grad.double() - ref) / torch.linalg.vector_norm(ref)) <= 2e-2


@pytest.mark.parametrize("persistent", [True, False])
@pytest.mark.parametrize("rows,vocab,dtype", [(300, 128256, "bf16"), (5, 262144, "fp32"), (1031, 32000, "bf16")])
def test_cluster_kernel_persistent_or_not_again_and_again(mod, persistent, rows, vocab, dtype):
    """Both schedules of the cluster kernel (a cluster a row; clusters taking rows from a counter, which every
    launch must leave at zero), called ten times, each time every row's loss and the gradient right, with
    label smoothing and an ignored row; an fp32 row of 1 MB is a cluster of 16, past the portable size."""
    from casebook.kernels import cross_entropy_cluster
    from casebook.run.check import TORCH_DTYPES, upcast
    inputs = mod.make_inputs({"tokens": rows, "vocab": vocab}, TORCH_DTYPES[dtype], "cuda",
                             torch.Generator().manual_seed(rows), 0.1)
    inputs["target"][0] = mod.IGNORE_INDEX
    inputs["target"][-1] = vocab - 1
    n_valid = mod._n_valid(inputs["target"])
    ref = mod.reference(**upcast(inputs))
    want = torch.nn.functional.cross_entropy(upcast(inputs)["logits"], inputs["target"], reduction="none",
                                             ignore_index=mod.IGNORE_INDEX, label_smoothing=0.1)
    for _ in range(10):
        losses, grad = cross_entropy_cluster.loss_and_grad(inputs["logits"], inputs["target"], 0.1, n_valid,
                                                           mod.IGNORE_INDEX, persistent=persistent)
        assert float((losses.double() - want).abs().max()) <= 2e-2 * float(want.abs().max())
        assert float(losses[0]) == 0.0 and not grad[0].any()  # the ignored row
        assert float(torch.linalg.vector_norm(grad.double() - ref) / torch.linalg.vector_norm(ref)) <= 1e-2
