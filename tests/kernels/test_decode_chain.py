"""decode_chain: every CPU-checkable variant against the float64 chain (Triton through the interpreter), through
casebook.run.inprocess as `casebook run` checks them, at the hidden sizes the issue names (1000 and 4096) and awkward
ones; the persistent kernel's barrier epochs; the traffic model; the level-3 step.

Shapes: batch 1, odd (3) and the largest tile (64); hidden 1, 7, 100, 129 (just past a power of two),
1000 (not a multiple of the tiles: masked tails in N and K) and 4096 (the claim's size); one layer and
several. The interpreter runs one Python step per program and K step, so the 4096-wide checks are one layer.
"""

from __future__ import annotations

import os

os.environ["TRITON_INTERPRET"] = "1"  # before any kernel module is imported: @triton.jit reads it then

import zlib
from pathlib import Path

import pytest
import torch
import yaml

from casebook.kernels import decode_chain as mod
from casebook.run.inprocess import check
from casebook.tolerance import TOLERANCE

REPO = Path(__file__).resolve().parents[2]
CASE = yaml.safe_load((REPO / "cases" / "decode_chain.yaml").read_text())
ON_CPU = [v["fn"] for v in CASE["kernel"]["variants"] if {"cpu", "interpreter"} & set(v["backends"])]
DTYPES = CASE["levels"]["kernel"]["dtypes"] + ["fp32"]  # the case times bf16; fp32 checks the kernels' math exactly

SHAPES = [  # (batch, hidden, layers)
    (1, 1, 1),
    (1, 7, 3),
    (3, 100, 2),
    (1, 129, 2),
    (64, 33, 2),
    (1, 1000, 2),
    (3, 1000, 1),
]
WIDE = [(1, 4096, 1)]
CASES = [(fn, s, d) for fn in ON_CPU for s in SHAPES for d in DTYPES] + [(fn, s, "bf16") for fn in ON_CPU for s in WIDE]


def seeds(*key) -> list[int]:
    """One fresh seed per test, different for every test (the interpreter is slow; shapes vary instead)."""
    return [zlib.crc32(repr(key).encode())]


def as_shape(s: tuple) -> dict:
    return dict(zip(("batch", "hidden", "layers"), s))


def test_every_cpu_variant_is_covered():
    assert set(ON_CPU) == {"eager", "fused", "persistent"}


@pytest.mark.parametrize("fn, shape, dtype", CASES, ids=[f"{f}-{'x'.join(map(str, s))}-{d}" for f, s, d in CASES])
def test_variant_matches_reference(fn, shape, dtype):
    c = check(getattr(mod, fn), mod.reference, mod.make_inputs, as_shape(shape), dtype, "cpu", seeds(fn, shape, dtype))
    assert c.correct, c.error
    assert c.max_rel_err <= TOLERANCE[dtype]


def test_fused_and_persistent_agree_bit_for_bit():
    """The same tile code in one launch a layer or one launch in all: identical bits, so the barrier and the
    ping-pong buffers lose nothing."""
    x = mod.make_inputs(as_shape((2, 200, 5)), torch.bfloat16, "cpu", torch.Generator().manual_seed(5))
    assert torch.equal(mod.fused(**x), mod.persistent(**x))


def test_fused_refuses_more_rows_than_a_tile():
    x = mod.make_inputs(as_shape((mod.MAX_BATCH + 1, 16, 1)), torch.float32, "cpu", torch.Generator().manual_seed(0))
    for fn in (mod.fused, mod.persistent):
        with pytest.raises(NotImplementedError, match=f"at most {mod.MAX_BATCH} rows a tile; got {mod.MAX_BATCH + 1}"):
            fn(**x)


def test_persistent_barrier_targets_move_on_across_launches(monkeypatch):
    """Each launch passes the arrivals so far; the counter (never reset per launch) ends where the next
    launch's epoch starts, so a second call's barriers wait for that call's arrivals, not the first's."""
    monkeypatch.setattr(mod, "_counters", {})
    x = mod.make_inputs(as_shape((1, 40, 4)), torch.float32, "cpu", torch.Generator().manual_seed(1))
    first = mod.persistent(**x).clone()
    counter, epoch = mod._counters[torch.device("cpu")]
    assert epoch == 3 and int(counter) == 3  # three barriers (between four layers), one program
    second = mod.persistent(**x)
    assert torch.equal(first, second)
    assert mod._counters[torch.device("cpu")][1] == 6 and int(counter) == 6


def test_persistent_counter_is_renewed_near_overflow(monkeypatch):
    old = torch.zeros(1, dtype=torch.int32)
    monkeypatch.setattr(mod, "_counters", {torch.device("cpu"): [old, mod.COUNTER_RESET + 1]})
    x = mod.make_inputs(as_shape((1, 16, 2)), torch.float32, "cpu", torch.Generator().manual_seed(2))
    mod.persistent(**x)
    counter, epoch = mod._counters[torch.device("cpu")]
    assert counter is not old and epoch == 1


@pytest.mark.parametrize("fn", ["graph", "torch_compile_graphs", "liger_norm"])
def test_gpu_only_rungs_say_why_on_a_cpu(fn):
    x = mod.make_inputs(as_shape((1, 8, 1)), torch.bfloat16, "cpu", torch.Generator().manual_seed(0))
    with pytest.raises(NotImplementedError):
        getattr(mod, fn)(**x)


def test_traffic_counts_weights_once_and_the_chain_ends():
    t = mod.traffic({"batch": 1, "hidden": 4096, "layers": 8}, torch.bfloat16)
    terms = {term.name.split(" (")[0]: term for term in t.terms}
    assert terms["read w"].bytes == 8 * 4096 * 4096 * 2
    assert terms["read x"].bytes == terms["write y"].bytes == 4096 * 2
    assert terms["read g"].bytes == 8 * 4096 * 2
    assert t.flops == 2 * 4096 * 4096 * 8 + 9 * 4096 * 8
    assert 0.99 < t.flops / t.bytes < 1.01  # the case's arithmetic_intensity: 1.0


def test_decode_step_runs_the_chain_then_the_head():
    inputs = mod.make_step_inputs({"batch": 2, "hidden": 32, "layers": 2, "vocab": 50}, torch.float32, "cpu",
                                  torch.Generator().manual_seed(4))
    base = mod.decode_step(mod.eager, **inputs)
    assert base.shape == (2, 50)
    torch.testing.assert_close(mod.decode_step(mod.persistent, **inputs), base, rtol=1e-4, atol=1e-4)


@pytest.mark.slow
def test_the_fused_layer_loads_nothing_one_after_another_lowered_for_sm90():
    """The norm's sums ride the GEMV's K loop (the x, g and w tiles copied asynchronously ahead): the only plain
    load left is the epilogue's residual. A prologue loop of its own was 16 serial loads of x a layer."""
    from lowering import lowered

    out = lowered("""
        from casebook.kernels import decode_chain as dc
        ir = lower(dc._fused_layer_kernel, {"eps": "fp32"}, {"BB": 16, "BN": 32, "BK": 256, "UPCAST": False},
                   num_warps=4, num_stages=3).asm["ttgir"]
        print(ir.count("tt.load "), ir.count("ttg.async_copy_global_to_local"))
    """)
    plain, copies = map(int, out.split())
    assert plain == 1 and copies >= 3, out
