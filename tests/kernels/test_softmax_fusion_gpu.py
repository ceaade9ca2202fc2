"""softmax_fusion on a GPU: triton_online's streamed rows (persistent programs, asynchronous copies the
interpreter does not make) and rows split over programs that wait for each other at a row barrier, which
only a real GPU runs (the interpreter runs programs one after another); cluster_bulk's CUDA kernel. Skipped elsewhere;
run on a GPU without TRITON_INTERPRET: `python3 -m pytest -q tests/kernels/test_softmax_fusion_gpu.py`."""

from __future__ import annotations

import os

import pytest
import torch

pytestmark = pytest.mark.skipif(not torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET") == "1",
                                reason="needs a GPU, not the interpreter")

ROWS = (1, 199)
COLS = (20000, 32768, 32769, 65537, 300001)  # streamed (fp32 at 32K falls back to one pass), one past the
# one-pass limit, one past 64K, past 256K (37 chunks of 8K)


@pytest.fixture(scope="module")
def mod():
    from casebook.kernels import softmax_fusion
    return softmax_fusion


@pytest.mark.parametrize("cols", COLS)
@pytest.mark.parametrize("rows", ROWS)
@pytest.mark.parametrize("dtype", ["fp32", "bf16", "fp16"])
def test_long_rows_match_reference(mod, rows, cols, dtype):
    from casebook.run.inprocess import check
    from casebook.tolerance import TOLERANCE
    c = check(mod.triton_online, mod.reference, mod.make_inputs, {"rows": rows, "cols": cols}, dtype, "cuda",
              [rows * 1000 + cols, rows * 1000 + cols + 1])
    assert c.correct, c.error
    assert c.max_rel_err <= TOLERANCE[dtype]


CLUSTER_ROWS = (1, 37, 199)
CLUSTER_COLS = (16392, 32768, 40000, 65537, 151936, 300000)  # just over 32 KB in bf16, one CTA a row,
# a ragged last chunk, not whole 16-byte vectors (triton_online), a vocabulary (5 CTAs), 10 CTAs (past
# the portable 8) in 16-bit, over 1 MB in fp32 (triton_online)


@pytest.mark.parametrize("cols", CLUSTER_COLS)
@pytest.mark.parametrize("rows", CLUSTER_ROWS)
@pytest.mark.parametrize("dtype", ["fp32", "bf16", "fp16"])
def test_cluster_bulk_matches_reference(mod, rows, cols, dtype):
    from casebook.run.inprocess import check
    from casebook.tolerance import TOLERANCE
    if torch.cuda.get_device_capability() < (9, 0):
        pytest.skip("thread-block clusters and bulk copies need Hopper")
    c = check(mod.cluster_bulk, mod.reference, mod.make_inputs, {"rows": rows, "cols": cols}, dtype, "cuda",
              [rows * 1000 + cols, rows * 1000 + cols + 1])
    assert c.correct, c.error
    assert c.max_rel_err <= TOLERANCE[dtype]


@pytest.mark.parametrize("rows,cols,dtype", [(1237, 16392, "bf16"), (433, 151936, "bf16"), (1000, 40000, "fp32"),
                                             (2000, 32768, "fp16")])
@pytest.mark.parametrize("persistent,clusters", [(True, None), (True, 1), (True, 7), (False, None)])
def test_cluster_rows_refill_shared_memory_across_many_rows(mod, rows, cols, dtype, persistent, clusters):
    """More rows than clusters: each cluster takes its next row from the counter and refills its pieces with
    it while storing this one (the default grid, as many clusters as fit at once; or 1 and 7 clusters, tens
    to hundreds of rows each), and leaves the counter at rest; and the same shapes one row per cluster."""
    from casebook.kernels import softmax_cluster
    from casebook.run.check import TORCH_DTYPES
    from casebook.tolerance import TOLERANCE
    if torch.cuda.get_device_capability() < (9, 0):
        pytest.skip("thread-block clusters and bulk copies need Hopper")
    x = (torch.randn(rows, cols, device="cuda") * 3).to(TORCH_DTYPES[dtype])
    ref = torch.softmax(x.double(), -1)
    for _ in range(2):
        y = softmax_cluster.softmax(x, persistent, clusters)
    assert softmax_cluster._tickets(x.device).tolist() == [0, 0]
    assert bool(torch.isfinite(y).all())
    assert (torch.linalg.vector_norm(y.double() - ref) / torch.linalg.vector_norm(ref)).item() <= TOLERANCE[dtype]


@pytest.mark.parametrize("dtype", ["fp32", "bf16", "fp16"])
@pytest.mark.parametrize("persistent,clusters", [(True, 7), (False, None)])
def test_cluster_rows_with_masked_pieces_and_rows_far_below_zero(dtype, persistent, clusters):
    """Each thread takes its exponentials against its own running max and scales them once the row's is
    known: pieces of -inf (a mask: threads with nothing yet), a row near -1000 (2^(m - M) must not
    overflow), a row of -inf (NaN, as torch gives) and a row with one finite element stay right."""
    from casebook.kernels import softmax_cluster
    from casebook.run.check import TORCH_DTYPES
    from casebook.tolerance import TOLERANCE
    if torch.cuda.get_device_capability() < (9, 0):
        pytest.skip("thread-block clusters and bulk copies need Hopper")
    x = (torch.randn(300, 40000, device="cuda") * 3).to(TORCH_DTYPES[dtype])
    x[:, :5000] = float("-inf")
    x[1] -= 1000
    x[2] = float("-inf")
    x[3, :-1] = float("-inf")
    ref = torch.softmax(x.double(), -1)
    y = softmax_cluster.softmax(x, persistent, clusters)
    assert bool(torch.isnan(y[2]).all())
    keep = torch.arange(300, device="cuda") != 2
    assert bool(torch.isfinite(y[keep]).all())
    assert y[3, -1].item() == 1.0 and not bool(y[3, :-1].any())
    err = torch.linalg.vector_norm(y[keep].double() - ref[keep]) / torch.linalg.vector_norm(ref[keep])
    assert err.item() <= TOLERANCE[dtype]


def test_barriers_are_at_rest_after_many_launches(mod):
    """Every launch leaves each row's arrival count at 0 and moves its generation by exactly one."""
    x = torch.randn(300, 40000, device="cuda")
    mod.triton_online(x)  # autotune outside the count
    barriers = mod._row_barriers(x.device, 300)
    before = barriers[: 32 * 300 : 32].clone()
    for _ in range(50):
        y = mod.triton_online(x)
    torch.testing.assert_close(y, torch.softmax(x, dim=-1))
    after = barriers[: 32 * 300 : 32]
    assert int((after & 0xFFFF).abs().sum()) == 0
    assert ((after >> 16) - (before >> 16)).tolist() == [50] * 300
