"""attention_prefill: every CPU-checkable rung judged as `casebook run` judges it (Triton through
the interpreter) in both dtypes the case lists, at ragged, GQA and seq_q < seq_kv shapes; the traffic model
and the case's declared intensity; the GPU-only rungs' reasons; the level-3 attention block."""

from __future__ import annotations

import os

os.environ["TRITON_INTERPRET"] = "1"  # before any kernel module is imported: @triton.jit reads it then

import pytest
import torch
import triton
from attention_rungs import check_rung, cpu_rungs, load, matrix, rel

from casebook.kernels import attention_prefill as mod
from casebook.tolerance import TOLERANCE

CASE = load("attention_prefill")
ON_CPU = cpu_rungs(CASE)
GPU_ONLY = [v["fn"] for v in CASE["kernel"]["variants"] if v["backends"] == ["cuda"]]
DTYPES = CASE["levels"]["kernel"]["dtypes"]
KEYS = ("batch", "heads", "kv_heads", "seq_q", "seq_kv", "head_dim", "mask")
SHAPES = [  # mask 1 none, 2 causal
    (1, 4, 1, 23, 23, 64, 2),  # group 4, ragged
    (1, 8, 1, 7, 40, 128, 2),  # group 8, head dim 128, queries at the end of the context
    (2, 2, 2, 30, 17, 64, 1),  # group 1, seq_q > seq_kv without a mask
    (1, 2, 2, 1, 1, 64, 2),  # a context of 1
]
CASES, IDS = matrix(ON_CPU, SHAPES, DTYPES)


def as_shape(s: tuple) -> dict:
    return dict(zip(KEYS, s))


def test_every_cpu_rung_is_covered():
    assert set(ON_CPU) == {"eager", "sdpa_math", "sdpa_flash", "triton_flash", "triton_flash_tma", "triton_flash_ws"}


@pytest.mark.parametrize("fn, shape, dtype", CASES, ids=IDS)
def test_rung_matches_reference(fn, shape, dtype):
    check_rung(mod, fn, as_shape(shape), dtype)


@pytest.mark.parametrize("fn", GPU_ONLY)
def test_gpu_only_rungs_say_why_on_a_cpu(fn):
    x = mod.make_inputs(as_shape((1, 2, 1, 8, 8, 64, 2)), torch.bfloat16, "cpu", torch.Generator().manual_seed(0))
    with pytest.raises(NotImplementedError):
        getattr(mod, fn)(**x)


def test_traffic_halves_the_flops_under_the_mask_and_matches_the_declared_intensity():
    claim = as_shape((4, 32, 8, 4096, 4096, 128, 2))
    causal, full = mod.traffic(claim, torch.bfloat16), mod.traffic({**claim, "mask": 1}, torch.bfloat16)
    assert causal.bytes == full.bytes == 2 * (4 * 32 + 4 * 8) * 4096 * 128 * 2
    assert full.flops == 4 * 4 * 32 * 4096 * 4096 * 128
    assert causal.flops == full.flops * 4097 / 8192
    declared = CASE["bottleneck"]["arithmetic_intensity"]
    assert abs(causal.flops / causal.bytes - declared) / declared < 0.01


def test_attention_block_runs_the_kernel_on_strided_views():
    inputs = mod.make_block_inputs({"batch": 1, "seq": 20, "heads": 4, "kv_heads": 2, "head_dim": 64}, torch.bfloat16,
                                   "cpu", torch.Generator().manual_seed(4))
    base = mod.attention_block(mod.sdpa_math, **inputs)
    assert base.shape == (1, 20, 256)
    out = mod.attention_block(mod.triton_flash, **inputs)
    assert rel(out, base.double()) < TOLERANCE["bf16"]


@pytest.mark.parametrize("error, skipped", [
    (RuntimeError("PassManager::run failed"), True),  # Triton 3.6 on the H200, in NVGPUWarpSpecialization
    (RuntimeError("CUDA error: an illegal memory access was encountered"), False),  # a real failure stays one
])
def test_a_toolchain_that_cannot_warp_specialise_skips_the_rung_with_its_reason(monkeypatch, error, skipped):
    from casebook.kernels import attention_common as ac

    class Refuses:
        def __getitem__(self, grid):
            def launch(*args, **kwargs):
                raise error
            return launch

    monkeypatch.setattr(ac, "_flash_fwd_tma", Refuses())
    q, k, v = (torch.randn(1, 2, 64, 64) for _ in range(3))
    if skipped:
        with pytest.raises(NotImplementedError, match="cannot warp-specialise the K/V loop here: PassManager"):
            ac.flash_forward(q, k, v, causal=False, tma=True, warp_specialize=True)
    else:
        with pytest.raises(RuntimeError, match="illegal memory access"):
            ac.flash_forward(q, k, v, causal=False, tma=True, warp_specialize=True)
    with pytest.raises(RuntimeError):  # the TMA rung without warp specialisation never hides its failure
        ac.flash_forward(q, k, v, causal=False, tma=True, warp_specialize=False)


@pytest.mark.slow
def test_the_ws_rung_asks_the_compiler_whether_it_split_the_loop():
    """Without a GPU: the kernel lowered ahead of time for sm_100, where Triton's automatic warp specialisation
    splits the loop, is seen to be split; for sm_90 the answer is this Triton's (3.6 and 3.9: not split)."""
    from lowering import lowered

    out = lowered("""
        from casebook.kernels import attention_common as ac
        for capability in ((10, 0), (9, 0)):
            print(ac._ws_lowering(capability, 128, "bf16"))
    """)
    blackwell, hopper = out.splitlines()[-2:]
    assert blackwell == "None", blackwell
    assert hopper == "None" or hopper.startswith(f"Triton {triton.__version__} ") and "sm_90" in hopper, hopper


def test_a_gpu_whose_compiler_does_not_split_the_loop_skips_the_ws_rung_with_the_reason(monkeypatch):
    from casebook.kernels import attention_common as ac

    monkeypatch.setattr(ac, "ws_refusal", lambda q: "Triton x does not warp-specialise the K/V loop for sm_90")
    q, k, v = (torch.randn(1, 2, 64, 64) for _ in range(3))
    with pytest.raises(NotImplementedError, match="does not warp-specialise the K/V loop for sm_90"):
        ac.flash_forward(q, k, v, causal=False, tma=True, warp_specialize=True)
    assert ac.flash_forward(q, k, v, causal=False, tma=True).shape == q.shape  # the TMA rung is not asked


def test_a_warp_specialised_loop_is_tuned_over_two_warpgroups_or_more():
    from casebook.kernels import attention_common as ac

    configs = [triton.Config({"BLOCK_M": 128, "BLOCK_N": 64}, num_warps=8),
               triton.Config({"BLOCK_M": 64, "BLOCK_N": 64}, num_warps=4)]
    assert ac._prune_prefill(configs, {"SQ": 4096}, WARP_SPECIALIZE=True) == configs[:1]
    assert ac._prune_prefill(configs, {"SQ": 4096}, WARP_SPECIALIZE=False) == configs
    assert ac.ws_refusal(torch.zeros(1, 1, 4, 64)) is None  # on a CPU the interpreter runs the loop as written
