"""attention_decode: every CPU-checkable rung judged as `casebook run` judges it (Triton through
the interpreter) at GQA groups 1, 4 and 8, draft tokens, ragged contexts and a context of 1; the traffic model
and the declared intensity; the level-3 decode step."""

from __future__ import annotations

import os

os.environ["TRITON_INTERPRET"] = "1"  # before any kernel module is imported: @triton.jit reads it then

import pytest
import torch
from attention_rungs import check_rung, cpu_rungs, load, matrix, rel

from casebook.kernels import attention_decode as mod
from casebook.tolerance import TOLERANCE

CASE = load("attention_decode")
ON_CPU = cpu_rungs(CASE)
KEYS = ("batch", "heads", "kv_heads", "seq_q", "seq_kv", "head_dim")
SHAPES = [
    (2, 4, 4, 1, 50, 64),  # group 1
    (1, 8, 2, 1, 77, 128),  # group 4, head dim 128
    (2, 16, 2, 1, 61, 64),  # group 8
    (1, 8, 2, 4, 45, 64),  # 4 draft tokens
    (3, 8, 1, 1, 1, 64),  # a context of 1
]
DTYPES = CASE["levels"]["kernel"]["dtypes"] + ["fp16"]
CASES, IDS = matrix(ON_CPU, SHAPES, DTYPES)


def as_shape(s: tuple) -> dict:
    return dict(zip(KEYS, s))


def test_every_cpu_rung_is_covered():
    assert set(ON_CPU) == {"eager", "sdpa", "triton_gqa", "triton_split", "triton_split_fused"}


@pytest.mark.parametrize("fn, shape, dtype", CASES, ids=IDS)
def test_rung_matches_reference(fn, shape, dtype):
    check_rung(mod, fn, as_shape(shape), dtype)


def test_traffic_is_the_cache_and_matches_the_declared_intensity():
    t = mod.traffic(as_shape((8, 32, 8, 1, 32768, 128)), torch.bfloat16)
    kv = 2 * 8 * 8 * 32768 * 128 * 2
    assert t.bytes == kv + 2 * 8 * 32 * 128 * 2
    assert t.flops == 4 * 8 * 32 * 32768 * 128
    declared = CASE["bottleneck"]["arithmetic_intensity"]
    assert abs(t.flops / t.bytes - declared) / declared < 0.01


def test_decode_layer_writes_the_new_token_and_runs_the_kernel():
    shape = {"batch": 2, "seq_kv": 40, "heads": 4, "kv_heads": 2, "head_dim": 64}
    inputs = mod.make_step_inputs(shape, torch.bfloat16, "cpu", torch.Generator().manual_seed(4))
    base = mod.decode_layer(mod.sdpa, **inputs)
    assert base.shape == (2, 1, 256)
    expect_k = (inputs["x"] @ inputs["w_qkv"])[:, 0, 256:384].view(2, 2, 64)
    torch.testing.assert_close(inputs["k_cache"][:, :, -1], expect_k)
    out = mod.decode_layer(mod.triton_split_fused, **inputs)
    assert rel(out, base.double()) < TOLERANCE["bf16"]
