"""attention_paged and attention_prefix on a GPU, compiled: every rung against float64 at ragged, GQA, page-size and
shared-prefix shapes (the autotuned tiles, the static loop's one-scalar and per-page table loads as the GPU builds
them), the fused combine over pages and the cascade's two launches over many calls. Skipped without CUDA; run with
`python3 -m pytest -q tests/kernels/test_attention_paged_gpu.py` (no TRITON_INTERPRET)."""

from __future__ import annotations

import pytest
import torch

from casebook.run.inprocess import check
from casebook.tolerance import TOLERANCE

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (compiled Triton)")

PAGED = [(8, 32, 8, 32768, 128, 16, 3), (8, 32, 8, 9000, 128, 8, 3), (2, 32, 8, 100003, 128, 128, 2),
         (4, 32, 32, 5000, 64, 32, 1), (16, 64, 8, 3001, 128, 64, 3), (3, 8, 1, 1, 64, 16, 3)]
PAGED_RUNGS = ["contiguous", "gather_sdpa", "triton_paged", "triton_paged_split", "triton_paged_static"]
PREFIX = [(64, 32, 8, 32768, 256, 128), (1, 32, 8, 8200, 37, 128), (37, 32, 8, 4100, 300, 128),
          (64, 64, 8, 8192, 128, 128), (5, 8, 1, 10, 1, 64)]
PREFIX_RUNGS = ["sdpa", "per_request", "gather_sdpa", "paged_shared", "triton_cascade", "triton_cascade_fused"]


def large_memory(shape=(), **_) -> bool:
    """Query heads x each request's context x head dim past 100 M elements: the float64 reference's working set
    and the rungs' own copies (a shared prefix's contiguous copy per request) then take gigabytes, and those tests
    run one at a time (tests/conftest.py)."""
    if len(shape) == 7:  # paged: batch, heads, kv_heads, seq_kv, head_dim, page_size, order
        b, h, _, skv, d, _, _ = shape
        return b * h * skv * d >= 1e8
    if len(shape) == 6:  # prefix: batch, heads, kv_heads, prefix, suffix, head_dim
        b, h, _, prefix, suffix, d = shape
        return b * h * (prefix + suffix) * d >= 1e8
    return False


def _run(mod, fn, shape, keys):
    try:
        c = check(getattr(mod, fn), mod.reference, mod.make_inputs, dict(zip(keys, shape)), "bf16", "cuda", [11, 12])
    except NotImplementedError as e:  # a backend that refuses the shape says why
        pytest.skip(str(e))
    assert c.correct, c.error
    assert c.max_rel_err <= TOLERANCE["bf16"]


@pytest.mark.parametrize("shape", PAGED, ids=["x".join(map(str, s)) for s in PAGED])
@pytest.mark.parametrize("fn", PAGED_RUNGS)
def test_paged_rung_on_gpu(fn, shape):
    from casebook.kernels import attention_paged as mod

    _run(mod, fn, shape, ("batch", "heads", "kv_heads", "seq_kv", "head_dim", "page_size", "order"))


@pytest.mark.parametrize("shape", PREFIX, ids=["x".join(map(str, s)) for s in PREFIX])
@pytest.mark.parametrize("fn", PREFIX_RUNGS)
def test_prefix_rung_on_gpu(fn, shape):
    from casebook.kernels import attention_prefix as mod

    _run(mod, fn, shape, ("batch", "heads", "kv_heads", "prefix", "suffix", "head_dim"))


def test_paged_fused_combine_and_cascade_hold_over_many_launches():
    """Five hundred back-to-back launches each: the fused paged split equals its first output bit for bit (a merge
    that read a partial before it landed, or a counter left non-zero, would differ), and so does the fused cascade
    (its suffix pass reads the prefix pass's partials: stream order)."""
    from casebook.kernels import attention_common as ac
    from casebook.kernels import attention_paged as paged
    from casebook.kernels import attention_prefix as prefix

    x = paged.make_inputs({"batch": 8, "heads": 32, "kv_heads": 8, "seq_kv": 32768, "head_dim": 128, "page_size": 16,
                           "order": 3}, torch.bfloat16, "cuda", torch.Generator().manual_seed(0))
    expect = paged.triton_paged_static(**x)
    for _ in range(500):
        y = paged.triton_paged_static(**x)
    torch.cuda.synchronize()
    assert torch.equal(y, expect)
    assert int(ac._COUNTERS[x["q"].device].abs().sum()) == 0
    x = prefix.make_inputs({"batch": 64, "heads": 32, "kv_heads": 8, "prefix": 32768, "suffix": 256, "head_dim": 128},
                           torch.bfloat16, "cuda", torch.Generator().manual_seed(0), contiguous=False)
    expect = prefix.triton_cascade_fused(**x)
    for _ in range(500):
        y = prefix.triton_cascade_fused(**x)
    torch.cuda.synchronize()
    assert torch.equal(y, expect)
