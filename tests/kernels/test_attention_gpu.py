"""attention_prefill and attention_decode on a GPU, compiled: every rung against float64 at ragged, GQA and
seq_q < seq_kv shapes (the autotuned tiles, TMA and warp specialisation as the GPU builds them), and the fused
combine's arrival counters over many launches (on a GPU any split may arrive last); the Gluon FA3-style forward
(attention_fa3, on Hopper alone) the same way. Skipped without CUDA; run
with `python3 -m pytest -q tests/kernels/test_attention_gpu.py` (no TRITON_INTERPRET)."""

from __future__ import annotations

import functools
from pathlib import Path

import pytest
import torch

from casebook.run.inprocess import check
from casebook.tolerance import TOLERANCE

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (compiled Triton)")

PREFILL = [(1, 32, 8, 1000, 1000, 128, 2), (2, 16, 16, 777, 777, 64, 1), (1, 32, 4, 300, 2049, 128, 2),
           (1, 8, 1, 1, 1, 64, 2), (1, 32, 8, 4096, 4096, 128, 2)]
PREFILL_RUNGS = ["eager", "sdpa_math", "sdpa_efficient", "sdpa_flash", "sdpa_cudnn", "flex", "triton_flash",
                 "triton_flash_tma", "triton_flash_ws"]
DECODE = [(8, 32, 8, 1, 32768, 128), (1, 32, 8, 1, 100003, 128), (4, 32, 32, 1, 5000, 64), (8, 32, 8, 4, 9000, 128),
          (16, 64, 8, 1, 3000, 128), (2, 8, 1, 1, 1, 64)]
DECODE_RUNGS = ["eager", "sdpa", "triton_gqa", "triton_split", "triton_split_fused"]


def large_memory(shape=(), **_) -> bool:
    """Prefill's scores, or decode's query heads x keys x head dim, past 100 M elements: the float64 reference's
    working set and the rungs' own copies then take gigabytes, and those tests run one at a time
    (tests/conftest.py)."""
    if len(shape) == 7:  # prefill: batch, heads, kv_heads, seq_q, seq_kv, head_dim, mask
        b, h, _, sq, skv, _, _ = shape
        return b * h * sq * skv >= 1e8
    if len(shape) == 6:  # decode: batch, heads, kv_heads, seq_q, seq_kv, head_dim
        b, h, _, _, skv, d = shape
        return b * h * skv * d >= 1e8
    return False


@functools.cache
def _declared_tolerances(case: str) -> dict[str, float | None]:
    """{fn: the tolerance the case declares for the rung that calls it} (None where it declares none; a declared
    one marks a knowingly inexact rung): the run judges each rung by it, and so does this test. The case is
    loaded once, not at every test."""
    from casebook.load import load_case

    return {v.fn: v.tolerance for v in load_case(Path(__file__).parents[2] / "cases" / f"{case}.yaml").kernel.variants}


def _run(mod, fn, shape, keys, dtype):
    tolerance = _declared_tolerances(mod.__name__.rsplit(".", 1)[1]).get(fn)
    try:
        c = check(getattr(mod, fn), mod.reference, mod.make_inputs, dict(zip(keys, shape)), dtype, "cuda", [11, 12],
                  tolerance=tolerance)
    except NotImplementedError as e:  # a backend that refuses the shape says why
        pytest.skip(str(e))
    assert c.correct, c.error
    assert c.max_rel_err <= (tolerance or TOLERANCE[dtype])


@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
@pytest.mark.parametrize("shape", PREFILL, ids=["x".join(map(str, s)) for s in PREFILL])
@pytest.mark.parametrize("fn", PREFILL_RUNGS)
def test_prefill_rung_on_gpu(fn, shape, dtype):
    from casebook.kernels import attention_prefill as mod

    _run(mod, fn, shape, ("batch", "heads", "kv_heads", "seq_q", "seq_kv", "head_dim", "mask"), dtype)


@pytest.mark.parametrize("shape", DECODE, ids=["x".join(map(str, s)) for s in DECODE])
@pytest.mark.parametrize("fn", DECODE_RUNGS)
def test_decode_rung_on_gpu(fn, shape):
    from casebook.kernels import attention_decode as mod

    _run(mod, fn, shape, ("batch", "heads", "kv_heads", "seq_q", "seq_kv", "head_dim"), "bf16")


FA3 = [(1, 32, 8, 1024, 1024, 128, 2), (2, 16, 16, 768, 768, 64, 1), (1, 32, 4, 384, 2048, 128, 2),
       (2, 8, 8, 256, 640, 64, 2), (1, 32, 8, 4096, 4096, 128, 2)]
"""attention_fa3's shapes: whole 128-query and 128-key tiles (its TMA boxes), GQA, S_q < S_kv, d 64 and 128."""


@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
@pytest.mark.parametrize("shape", FA3, ids=["x".join(map(str, s)) for s in FA3])
@pytest.mark.parametrize("overlap", [True, False], ids=["overlap", "in-series"])
@pytest.mark.timeout(120, method="thread")  # a barrier phase gone wrong hangs in the driver: the worker is ended
def test_fa3_forward_on_gpu(overlap, shape, dtype):
    """The Gluon FA3-style forward (not yet a rung: benchmarks/explore/attention/fa3_gluon.py times it) against
    float64 as the run judges a rung, on Hopper alone."""
    from casebook.kernels import attention_fa3 as fa
    from casebook.kernels import attention_prefill as mod

    def forward(q, k, v, causal):  # NotImplementedError, with attention_fa3.unsupported's reason, off Hopper
        return fa.forward(q, k, v, causal, overlap=overlap)

    forward.__name__ = "fa3"
    keys = ("batch", "heads", "kv_heads", "seq_q", "seq_kv", "head_dim", "mask")
    try:
        c = check(forward, mod.reference, mod.make_inputs, dict(zip(keys, shape)), dtype, "cuda", [11, 12])
    except NotImplementedError as e:
        pytest.skip(str(e))
    assert c.correct, c.error
    assert c.max_rel_err <= TOLERANCE[dtype]


def test_fused_combine_holds_over_many_launches():
    """A thousand back-to-back launches of the fused split: every output equals the first bit for bit (a merge
    that read a partial before it landed, or a counter left non-zero, would differ from launch to launch), the
    first agrees with the two-launch split to bf16's rounding, and the counters are back at 0. Not bit for bit
    against the two-launch split: the autotuner keys the two apart and times each one's tile choice, so they may
    sum the keys in different tiles, and with other processes on the card (`pytest -n`) they did differ."""
    from casebook.kernels import attention_common as ac
    from casebook.kernels import attention_decode as mod

    x = mod.make_inputs({"batch": 8, "heads": 32, "kv_heads": 8, "seq_q": 1, "seq_kv": 32768, "head_dim": 128},
                        torch.bfloat16, "cuda", torch.Generator().manual_seed(0))
    ys = [mod.triton_split_fused(**x) for _ in range(1000)]  # 64 KB each, kept: no sync between the launches
    first = ys[0]
    differ = sum(not torch.equal(y, first) for y in ys[1:])
    assert differ == 0, f"{differ} of 999 launches differ from the first"
    torch.testing.assert_close(first, mod.triton_split(**x), rtol=2e-2, atol=2e-3)
    assert int(ac._COUNTERS[x["q"].device].abs().sum()) == 0
