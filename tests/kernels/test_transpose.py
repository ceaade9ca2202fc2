"""transpose: every CPU-checkable variant against the float64 transpose at awkward shapes (Triton through
the interpreter), through casebook.run.inprocess as `casebook run` checks them; which path `tma` takes; the
traffic model.

Shapes: one row, one column, odd and prime sizes, sizes just past a power of two (masked tails in both
tile directions), a non-square batch, and inner runs of 1, 3, 40 and 129 elements (129: past one inner
step of 128, so the permute loop's masked second step runs), in every dtype the case lists.
"""

from __future__ import annotations

import os

os.environ["TRITON_INTERPRET"] = "1"  # before any kernel module is imported: @triton.jit reads it then

import zlib
from pathlib import Path

import pytest
import torch
import yaml

from casebook.kernels import transpose as mod
from casebook.run.inprocess import check

REPO = Path(__file__).resolve().parents[2]
CASE = yaml.safe_load((REPO / "cases" / "transpose.yaml").read_text())
VARIANTS = {v["name"]: v for v in CASE["kernel"]["variants"]}
ON_CPU = [v["fn"] for v in VARIANTS.values() if {"cpu", "interpreter"} & set(v["backends"]) and not v.get("reference")]
DTYPES = CASE["levels"]["kernel"]["dtypes"]

SHAPES = [  # (batch, rows, cols, inner)
    (1, 1, 1, 1),  # one element
    (1, 1, 129, 1),  # one row, just past a power of two
    (1, 67, 1, 1),  # one column
    (1, 67, 45, 1),  # odd, prime rows
    (3, 33, 65, 1),  # batched, just past 32 and 64: a masked tail in both tile directions
    (1, 64, 48, 1),  # TMA-eligible in bf16 and fp32 (16-byte row strides both ways)
    (2, 37, 12, 3),  # an inner run shorter than a sector
    (2, 13, 5, 40),  # a long inner run, not a power of two
    (1, 5, 3, 129),  # inner past one 128-element step
]
CASES = [(fn, s, d) for fn in ON_CPU for s in SHAPES for d in DTYPES]


def seeds(*key) -> list[int]:
    """Two fresh seeds per test, different for every test."""
    s = zlib.crc32(repr(key).encode())
    return [s, s + 1]


def as_shape(s: tuple) -> dict:
    return dict(zip(("batch", "rows", "cols", "inner"), s))


def test_every_cpu_variant_is_covered():
    assert set(ON_CPU) == {"torch_contiguous", "naive_write_strided", "naive_read_strided", "tiled", "tiled_tuned",
                           "tma"}


@pytest.mark.parametrize("fn, shape, dtype", CASES, ids=[f"{f}-{'x'.join(map(str, s))}-{d}" for f, s, d in CASES])
def test_variant_matches_reference(fn, shape, dtype):
    c = check(getattr(mod, fn), mod.reference, mod.make_inputs, as_shape(shape), dtype, "cpu", seeds(fn, shape, dtype))
    assert c.correct, c.error
    assert c.max_rel_err == 0.0  # a transpose moves values; it never rounds them


def test_copy_control_checks_against_its_own_reference():
    c = check(mod.copy, mod.copy_reference, mod.make_inputs, as_shape((2, 7, 5, 3)), "bf16", "cpu", [1, 2])
    assert c.correct, c.error


def test_every_element_lands_where_the_swap_says():
    # A tensor of distinct integers (exact in bf16 up to 256): y[b, c, r, i] must be x[b, r, c, i].
    x = torch.arange(2 * 5 * 7 * 3, dtype=torch.float32).view(2, 5, 7, 3)
    for fn in ON_CPU:
        y = getattr(mod, fn)(x)
        assert y.shape == (2, 7, 5, 3), fn
        for b, r, c, i in [(0, 0, 0, 0), (1, 4, 6, 2), (0, 3, 1, 1), (1, 0, 6, 0)]:
            assert y[b, c, r, i] == x[b, r, c, i], (fn, b, r, c, i)


@pytest.mark.parametrize("shape, dtype, expected", [
    ((1, 64, 48, 1), torch.bfloat16, True),  # 96- and 128-byte rows
    ((1, 64, 44, 1), torch.bfloat16, False),  # 88-byte rows: not 16-byte strides
    ((1, 60, 48, 1), torch.bfloat16, False),  # y's rows are 120 bytes
    ((1, 64, 48, 4), torch.float32, False),  # a permute with inner runs: not the 2-D TMA path
    ((1, 67, 45, 1), torch.float32, False),  # odd sizes
])
def test_tma_applies_only_where_descriptors_are_valid(shape, dtype, expected):
    assert mod.tma_applies(torch.zeros(shape, dtype=dtype)) is expected


class Spy:
    """Stands in for a @triton.jit kernel: records `kernel[grid]` launches, then launches the real one."""

    def __init__(self, name: str, kernel, launches: list):
        self.name, self.kernel, self.launches = name, kernel, launches

    def __getitem__(self, grid):
        self.launches.append(self.name)
        return self.kernel[grid]


@pytest.mark.parametrize("shape, expected", [((1, 64, 48, 1), "_tma_kernel"), ((1, 67, 45, 1), "_tile_kernel")])
def test_tma_falls_back_to_tiles(monkeypatch, shape, expected):
    seen: list = []
    for name in ("_tma_kernel", "_tile_kernel"):
        monkeypatch.setattr(mod, name, Spy(name, getattr(mod, name), seen))
    x = torch.randn(shape).to(torch.bfloat16)
    assert torch.equal(mod.tma(x), x.transpose(1, 2).contiguous())
    assert seen == [expected]


def test_tiled_shrinks_tiles_for_long_runs(monkeypatch):
    seen: list = []
    monkeypatch.setattr(mod, "_tiles", lambda x, bm, bn, bi, w, y: seen.append((bm, bn, bi)))
    mod.tiled(torch.zeros(1, 4, 4, 1))
    mod.tiled(torch.zeros(1, 4, 4, 128))
    assert seen[0] == (32, 32, 1)
    bm, bn, bi = seen[1]
    assert bi == 128 and bm * bn * bi <= mod.MAX_TILE_ELEMENTS // 4


def test_refuses_a_tensor_that_is_not_four_dimensional():
    with pytest.raises(ValueError, match=r"\[batch, rows, cols, inner\]"):
        mod.naive_write_strided(torch.zeros(3, 4))


def test_traffic_is_one_read_and_one_write():
    t = mod.traffic({"batch": 1, "rows": 16384, "cols": 16384, "inner": 1}, torch.bfloat16)
    assert t.bytes == 2 * 16384 * 16384 * 2
    assert t.flops == 0
    assert [term.name.split()[0] for term in t.terms] == ["read", "write"]
    assert mod.traffic({"batch": 2, "rows": 3, "cols": 5, "inner": 7}, torch.float32).bytes == 2 * 210 * 4


def test_weight_grad_matches_the_unfused_layer():
    inputs = mod.make_weight_grad_inputs({"tokens": 16, "hidden": 8, "inter": 24}, torch.float32, "cpu",
                                         torch.Generator().manual_seed(3))
    expect = (inputs["x"] @ inputs["w_up"]).t() @ inputs["dy"]
    for fn in (mod.torch_contiguous, mod.tma):
        torch.testing.assert_close(mod.weight_grad(fn, **inputs), expect)
