"""attention_fa3: Gluon does not run on the CPU (no interpreter), so the kernel is lowered ahead of time for
sm_90a with the installed Triton, and its PTX is checked for what the design depends on: two consumer
warpgroups and a producer sharing the register file, P V with P in registers, one FFMA and one ex2 a score,
nothing spilled. Its results are checked on the GPU (benchmarks/explore/attention/fa3_gluon.py, against the
float64 reference and SDPA). The lowering runs in a child process (`lowering.lowered`): a process in which
Triton's interpreter has run cannot compile a Gluon kernel."""

from __future__ import annotations

import os

os.environ["TRITON_INTERPRET"] = "1"  # as in the other kernel tests, whichever module is collected first

import json
import re

import pytest
import torch

fa = pytest.importorskip("casebook.kernels.attention_fa3", reason="this Triton has no Gluon", exc_type=ImportError)

SNIPPET = """
import json
from casebook.kernels import attention_fa3 as fa
out = {}
for causal in (True, False):
    for d in fa.HEAD_DIMS:
        kernel = fa.compile_for_sm90(causal=causal, head_dim=d)
        out[f"{causal} {d}"] = {"shared": kernel.metadata.shared, "ptx": kernel.asm["ptx"]}
out["three stages"] = {"shared": fa.compile_for_sm90(head_dim=128, stages=3).metadata.shared}
print(json.dumps(out))
"""
HOPPER_SMEM = 227 * 1024


@pytest.fixture(scope="module")
def lowered_all() -> dict:
    from lowering import lowered

    return json.loads(lowered(SNIPPET).strip().splitlines()[-1])


@pytest.fixture(params=[(c, d) for c in (True, False) for d in fa.HEAD_DIMS], ids=lambda p: f"causal={p[0]}-d{p[1]}")
def lowered(request, lowered_all):
    causal, d = request.param
    return d, lowered_all[f"{causal} {d}"]


def test_rings_fit_in_shared_memory(lowered):
    d, kernel = lowered
    tiles = 2 * fa.ROWS * d * 2 + 2 * fa.STAGES * fa.BLOCK_N * d * 2  # two Q tiles, the K and V rings, bf16
    assert tiles <= kernel["shared"] <= HOPPER_SMEM


def test_three_stages_fit_at_head_dim_128(lowered_all):
    assert 2 * fa.ROWS * 128 * 2 + 2 * 3 * fa.BLOCK_N * 128 * 2 <= lowered_all["three stages"]["shared"] <= HOPPER_SMEM


def test_two_consumers_and_a_producer_share_the_register_file(lowered):
    ptx = lowered[1]["ptx"]
    assert re.search(rf"setmaxnreg\.inc\.sync\.aligned\.u32\s+{fa.CONSUMER_REGS};", ptx)
    assert re.search(rf"setmaxnreg\.dec\.sync\.aligned\.u32\s+{fa.PRODUCER_REGS};", ptx)
    assert 2 * 128 * fa.CONSUMER_REGS + 128 * fa.PRODUCER_REGS <= 64 * 1024  # the SM's register file


def test_pv_takes_p_from_registers(lowered):
    """P V's A operand is P in registers (four 32-bit registers a thread a k-step), not a shared-memory
    descriptor: the probabilities never make a round trip through shared memory."""
    d, kernel = lowered
    register_a = re.findall(rf"wgmma\.mma_async\.sync\.aligned\.m64n{d}k16\.f32\.bf16\.bf16 \{{[^}}]*\}}, "
                            r"\{%r\d+,%r\d+,%r\d+,%r\d+\}", kernel["ptx"])
    assert register_a


def test_one_ffma_and_one_ex2_a_score_one_division_a_row_nothing_spilled(lowered):
    ptx = lowered[1]["ptx"]
    ex2 = len(re.findall(r"\bex2\.approx\.ftz\.f32\b", ptx))
    fma = len(re.findall(r"\bfma\.rn(?:\.ftz)?\.f32\b", ptx))
    assert ex2 >= 2 * 2 * 64 and fma >= 2 * 2 * 64  # 64 scores a thread a tile, two groups, two copies of the loop
    assert "ld.local" not in ptx and "st.local" not in ptx
    assert len(re.findall(r"\bdiv\.(?:full|rn)\.f32\b", ptx)) <= 2 * 2 * 2  # the output: 1 / l a row (two a thread)


def test_refuses_what_it_cannot_run():
    q = torch.zeros(1, 2, 128, 128, dtype=torch.bfloat16)
    assert "Hopper" in fa.unsupported(q, q, q, True)
    with pytest.raises(NotImplementedError, match="Hopper"):
        fa.forward(q, q, q, True)
