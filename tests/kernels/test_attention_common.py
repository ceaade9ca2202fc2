"""attention_common: the family's reference against a plain softmax, the mask's alignment, the traffic terms,
the split count, and the Triton kernels (through the interpreter) at the shapes issue 25 names: sequence lengths
not a multiple of the tile, seq_q != seq_kv, causal with seq_q < seq_kv (queries at the end of the context),
GQA groups of 1, 4 and 8, head dims 64 and 128, a context of 1. The per-case tests run each case's rungs
through casebook.run.inprocess."""

from __future__ import annotations

import os

os.environ["TRITON_INTERPRET"] = "1"  # before any kernel module is imported: @triton.jit reads it then

import zlib

import pytest
import torch

from casebook.kernels import attention_common as ac
from casebook.tolerance import TOLERANCE

BF16 = TOLERANCE["bf16"]


def qkv(b, h, hkv, sq, skv, d, dtype=torch.bfloat16, seed=None):
    seed = zlib.crc32(repr((b, h, hkv, sq, skv, d, dtype)).encode()) if seed is None else seed
    return ac.make_qkv(b, h, hkv, sq, skv, d, dtype, "cpu", torch.Generator().manual_seed(seed))


def rel(out, ref):
    return ((out.double() - ref).norm() / ref.norm()).item()


def test_reference_is_softmax_attention_with_bottom_right_mask():
    x = qkv(1, 2, 1, 3, 5, 16, torch.float64)
    q, k, v = x["q"], x["k"], x["v"]
    s = (q @ k.repeat_interleave(2, 1).transpose(-1, -2)) / 4.0
    keep = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 0], [1, 1, 1, 1, 1]], dtype=torch.bool)  # last query sees all
    expect = s.masked_fill(~keep, float("-inf")).softmax(-1) @ v.repeat_interleave(2, 1)
    torch.testing.assert_close(ac.reference(q, k, v, causal=True), expect)
    assert torch.equal(ac.visible(3, 5, "cpu"), keep)


def test_reference_chunks_agree_with_one_pass(monkeypatch):
    x = qkv(1, 2, 2, 37, 40, 16, torch.float64)
    whole = ac.reference(**x, causal=True)
    monkeypatch.setattr(ac, "REFERENCE_ELEMENTS", 2 * 2 * 40 * 5)  # five query rows a chunk: 8 chunks, the last short
    torch.testing.assert_close(ac.reference(**x, causal=True), whole, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("causal", [True, False])
def test_reference_over_grouped_heads_is_the_repeated_heads_formula(causal, monkeypatch):
    """Four query heads on two KV heads, each KV head's query heads one block of rows, in chunks of five rows that
    straddle one query head's rows and the next's: the formula with K and V repeated to every head, exactly."""
    x = qkv(2, 4, 2, 37, 40, 16, torch.float64)
    q, k, v = x["q"], x["k"].repeat_interleave(2, 1), x["v"].repeat_interleave(2, 1)
    s = q @ k.transpose(-1, -2) / 4.0
    if causal:
        s = s.masked_fill(~ac.visible(37, 40, "cpu"), float("-inf"))
    expect = s.softmax(-1) @ v
    monkeypatch.setattr(ac, "REFERENCE_ELEMENTS", 2 * 2 * 40 * 5)
    torch.testing.assert_close(ac.reference(**x, causal=causal), expect, rtol=1e-12, atol=1e-12)


def test_visible_pairs_halve_the_square_under_the_mask():
    assert ac.visible_pairs(4096, 4096, False) == 4096 * 4096
    assert ac.visible_pairs(4096, 4096, True) == 4096 * 4097 // 2
    assert ac.visible_pairs(1, 1000, True) == 1000  # one query at the end sees the whole context
    assert ac.visible_pairs(3, 5, True) == int(ac.visible(3, 5, "cpu").sum())


def test_terms_count_each_tensor_once():
    t = {term.name.split(" (")[0]: term for term in ac.terms(2, 8, 2, 3, 10, 64, False, 2)}
    assert t["read q"].bytes == t["write o"].bytes == 2 * 8 * 3 * 64 * 2
    assert t["read k"].bytes == t["read v"].bytes == 2 * 2 * 10 * 64 * 2
    assert t["QK^T multiply-add"].flops == t["PV multiply-add"].flops == 2 * 2 * 8 * 3 * 10 * 64


@pytest.mark.parametrize("b, hkv, skv, sms, want", [
    (8, 8, 32768, 132, (5, 6656)),  # 64 programs -> 5 splits of 26 tiles of 256
    (1, 8, 131072, 132, (32, 4096)),
    (64, 8, 4096, 132, (1, 4096)),  # batch x KV heads already fills two programs an SM
    (16, 8, 512, 132, (1, 512)),  # 128 pairs fill 0.9 of 132 SMs: no split (two would cost their partials)
    (14, 8, 8192, 132, (3, 2816)),  # 112 pairs do not: two programs an SM
])
def test_split_count_fills_the_gpu_without_tiny_splits(b, hkv, skv, sms, want, monkeypatch):
    monkeypatch.setattr(ac, "MIN_CHUNK", 256)  # the GPU's value (the interpreter's is one tile)
    assert ac.split_count(b, hkv, skv, sms) == want
    splits, chunk = want
    assert (splits - 1) * chunk < skv <= splits * chunk  # none empty


PREFILL = [  # (batch, heads, kv_heads, seq_q, seq_kv, head_dim, causal)
    (1, 4, 4, 37, 37, 64, True),  # group 1, ragged: 37 is no multiple of the 16-row tile
    (2, 8, 2, 19, 19, 128, True),  # group 4, head dim 128
    (1, 8, 1, 21, 53, 64, True),  # group 8, causal with seq_q < seq_kv: queries at the end of the context
    (1, 4, 1, 33, 18, 64, False),  # seq_q > seq_kv without a mask
    (2, 4, 4, 1, 1, 64, True),  # a context of 1
    (1, 2, 2, 16, 48, 128, False),  # tile-aligned
]


@pytest.mark.parametrize("mode", ["pointers", "tma", "tma_ws"])
@pytest.mark.parametrize("shape", PREFILL, ids=lambda s: "x".join(map(str, s[:6])) + ("-causal" if s[6] else ""))
def test_flash_forward_matches_reference(shape, mode):
    *geometry, causal = shape
    x = qkv(*geometry)
    out = ac.flash_forward(**x, causal=causal, tma=mode != "pointers", warp_specialize=mode == "tma_ws")
    assert out.shape == x["q"].shape and out.dtype == torch.bfloat16
    assert rel(out, ac.reference(**x, causal=causal)) < BF16


def test_flash_forward_takes_strided_views():
    """The level-3 block hands over q, k, v as transposed views of one projection: strides, no copies."""
    b, s, h, hkv, d = 1, 20, 4, 2, 64
    qkv_ = torch.randn(b, s, (h + 2 * hkv) * d, generator=torch.Generator().manual_seed(3)).to(torch.bfloat16)
    q, k, v = qkv_.split([h * d, hkv * d, hkv * d], dim=-1)
    q, k, v = (t.reshape(b, s, -1, d).transpose(1, 2) for t in (q, k, v))
    assert not q.is_contiguous()
    ref = ac.reference(q, k, v, True)
    for tma in (False, True):
        assert rel(ac.flash_forward(q, k, v, True, tma=tma), ref) < BF16


def test_flash_forward_refuses_what_it_cannot_do():
    with pytest.raises(NotImplementedError, match="head_dim"):
        ac.flash_forward(**qkv(1, 2, 2, 8, 8, 96), causal=False)
    with pytest.raises(NotImplementedError, match="see no key"):
        ac.flash_forward(**qkv(1, 2, 2, 9, 8, 64), causal=True)


DECODE = [  # (batch, heads, kv_heads, seq_q, seq_kv, head_dim)
    (2, 8, 8, 1, 70, 64),  # group 1
    (3, 8, 2, 1, 45, 128),  # group 4, ragged context
    (1, 16, 2, 1, 100, 64),  # group 8
    (2, 8, 2, 3, 50, 64),  # 3 draft tokens, causal among themselves
    (2, 4, 1, 1, 1, 128),  # a context of 1
]


@pytest.mark.parametrize("mode", ["one_split", "split", "split_fused", "split_7_fused"])
@pytest.mark.parametrize("shape", DECODE, ids=lambda s: "x".join(map(str, s)))
def test_decode_forward_matches_reference(shape, mode):
    x = qkv(*shape)
    splits = {"one_split": 1, "split_7_fused": 7}.get(mode)
    out = ac.decode_forward(**x, causal=True, splits=splits, fused="fused" in mode)
    assert out.shape == x["q"].shape
    assert rel(out, ac.reference(**x, causal=True)) < BF16


def test_split_and_fused_combine_agree_and_leave_the_counters_at_zero():
    x = qkv(2, 8, 2, 2, 90, 64)
    a = ac.decode_forward(**x, causal=True, splits=4)
    b = ac.decode_forward(**x, causal=True, splits=4, fused=True)
    torch.testing.assert_close(a, b, rtol=0, atol=0)
    assert int(ac._COUNTERS[torch.device("cpu")].abs().sum()) == 0  # reset by each (batch, KV head)'s last split
    torch.testing.assert_close(ac.decode_forward(**x, causal=True, splits=4, fused=True), b, rtol=0, atol=0)


def test_a_split_no_draft_token_sees_merges_to_nothing():
    """Context 33 in splits of 16: the last split holds key 32 alone, which draft tokens 0 and 1 of 3 cannot see
    (their lse is -inf there); the merge must weigh that split zero, not NaN."""
    x = qkv(1, 4, 1, 3, 33, 64)
    out = ac.decode_forward(**x, causal=True, splits=3)
    assert torch.isfinite(out).all()
    assert rel(out, ac.reference(**x, causal=True)) < BF16


def test_decode_refuses_too_many_rows_and_unmasked_drafts():
    with pytest.raises(NotImplementedError, match="at most 128 rows"):
        ac.decode_forward(**qkv(1, 64, 1, 3, 20, 64), causal=True)
    with pytest.raises(NotImplementedError, match="causal"):
        ac.decode_forward(**qkv(1, 4, 1, 2, 20, 64), causal=False)


def test_eager_and_sdpa_match_reference_with_gqa_and_the_mask():
    x = qkv(1, 8, 2, 5, 23, 64)
    ref = ac.reference(**x, causal=True)
    assert rel(ac.eager(**x, causal=True), ref) < BF16
    for backend in ("math", "flash", None):
        assert rel(ac.sdpa(**x, causal=True, backend=backend), ref) < BF16


def test_flex_is_gpu_only():
    with pytest.raises(NotImplementedError, match="GPU"):
        ac.flex(**qkv(1, 2, 2, 4, 4, 64), causal=True)
