"""decode_chain on a GPU, compiled: every variant against the float64 chain, and the persistent kernel's grid
barrier with one program per SM (the interpreter runs one program, so only a GPU waits at it). Skipped
without CUDA; run with `python3 -m pytest -q tests/kernels/test_decode_chain_gpu.py` (no TRITON_INTERPRET)."""

from __future__ import annotations

import pytest
import torch

from casebook.run.inprocess import check
from casebook.tolerance import TOLERANCE

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (compiled Triton)")

SHAPES = [(1, 1000, 3), (3, 4096, 2), (64, 1024, 4), (1, 4096, 8), (8, 2304, 3)]
VARIANTS = ["eager", "torch_compile", "torch_compile_graphs", "liger_norm", "graph", "fused", "persistent"]


@pytest.mark.parametrize("shape", SHAPES, ids=["x".join(map(str, s)) for s in SHAPES])
@pytest.mark.parametrize("fn", VARIANTS)
def test_variant_on_gpu(fn, shape):
    from casebook.kernels import decode_chain as mod

    try:
        c = check(getattr(mod, fn), mod.reference, mod.make_inputs, dict(zip(("batch", "hidden", "layers"), shape)),
                  "bf16", "cuda", [11, 12])
    except NotImplementedError as e:  # liger-kernel absent
        pytest.skip(str(e))
    assert c.correct, c.error
    assert c.max_rel_err <= TOLERANCE["bf16"]


def test_persistent_barrier_holds_over_many_launches():
    """A thousand back-to-back launches, each with seven barriers over every SM's program: each output equals
    the per-layer kernels' bit for bit (a program that ran ahead of the barrier would read a stale layer)."""
    from casebook.kernels import decode_chain as mod

    x = mod.make_inputs({"batch": 1, "hidden": 4096, "layers": 8}, torch.bfloat16, "cuda",
                        torch.Generator().manual_seed(0))
    expect = mod.fused(**x)
    for _ in range(1000):
        y = mod.persistent(**x)
    torch.cuda.synchronize()
    assert torch.equal(y, expect)
    for _ in range(20):
        assert torch.equal(mod.persistent(**x), expect)
