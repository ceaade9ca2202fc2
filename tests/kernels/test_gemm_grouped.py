"""gemm_grouped: every CPU-checkable variant against the float64 per-expert reference at small ragged
shapes (empty experts included; Triton through the interpreter, both its TMA and pointer paths), the
seeded group-size distribution, the traffic model, the MoE scenario, and an sm90 compile."""

from __future__ import annotations

import os

os.environ["TRITON_INTERPRET"] = "1"  # before any kernel module is imported: @triton.jit reads it then

import subprocess
import sys
import textwrap
import zlib
from pathlib import Path

import pytest
import torch
import yaml

from casebook.kernels import gemm_grouped as mod
from casebook.run.check import TORCH_DTYPES
from casebook.tolerance import TOLERANCE

REPO = Path(__file__).resolve().parents[2]
CASE = yaml.safe_load((REPO / "cases" / "gemm_grouped.yaml").read_text())
# The harness's own per-dtype bounds, so the tests hold the kernels to what `casebook run` checks.
TOL = {TORCH_DTYPES[d]: TOLERANCE[d] for d in ("fp16", "bf16")}
DTYPES = [torch.float16, torch.bfloat16]
ON_CPU = [v["fn"] for v in CASE["kernel"]["variants"] if {"cpu", "interpreter"} & set(v["backends"])]
SHAPES = CASE["levels"]["kernel"]["cpu_shapes"] + [{"experts": 6, "tokens": 70, "n": 40, "k": 48}]
# Hand-made sizes: empty first and last experts, an expert with several row tiles, a one-row expert.
RAGGED = [0, 23, 1, 0, 40, 6, 0]


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    return (torch.linalg.vector_norm(out.double() - ref) / torch.linalg.vector_norm(ref)).item()


def upcast(x: dict) -> dict:
    return {k: v.double() if v.is_floating_point() else v for k, v in x.items()}


def inputs(shape: dict, dtype: torch.dtype, seed: int = 0) -> dict:
    return mod.make_inputs(shape, dtype, "cpu", torch.Generator().manual_seed(seed))


def ragged_inputs(dtype: torch.dtype, n: int = 24, k: int = 32) -> dict:
    g = torch.Generator().manual_seed(1)
    sizes = torch.tensor(RAGGED, dtype=torch.int32)
    x = torch.randn(int(sizes.sum()), k, generator=g).to(dtype)
    w = (torch.randn(len(RAGGED), n, k, generator=g) * k**-0.5).to(dtype)
    return {"x": x, "w": w, "group_sizes": sizes}


def call(fn: str, x: dict) -> torch.Tensor:
    try:
        return getattr(mod, fn)(**x)
    except NotImplementedError as e:  # torch._grouped_mm without a CPU kernel in this PyTorch
        pytest.skip(str(e))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s.values())))
@pytest.mark.parametrize("fn", ON_CPU)
def test_variant_matches_reference(fn, shape, dtype):
    x = inputs(shape, dtype, seed=zlib.crc32(f"{fn}{shape}{dtype}".encode()))
    out = call(fn, x)
    assert out.shape == (shape["tokens"], shape["n"]) and out.dtype == dtype
    assert rel_err(out, mod.reference(**upcast(x))) < TOL[dtype]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("fn", ON_CPU)
def test_empty_and_one_row_experts(fn, dtype):
    x = ragged_inputs(dtype)
    assert rel_err(call(fn, x), mod.reference(**upcast(x))) < TOL[dtype]


@pytest.mark.parametrize("use_tma", [False, True], ids=["pointers", "tma"])
@pytest.mark.parametrize("k", [32, 40], ids=["even_k", "ragged_k"])
def test_triton_both_load_paths(use_tma, k):
    x = ragged_inputs(torch.bfloat16, n=20, k=k)
    out = mod.grouped_gemm(**x, use_tma=use_tma)
    assert rel_err(out, mod.reference(**upcast(x))) < TOL[torch.bfloat16]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a GPU")
def test_loop_graph_replays_and_tracks_new_inputs():
    x = mod.make_inputs({"experts": 8, "tokens": 256, "n": 64, "k": 64}, torch.bfloat16, "cuda",
                        torch.Generator().manual_seed(0))
    first = mod.loop_graph(**x).clone()
    assert rel_err(first.cpu(), mod.reference(**upcast({k: v.cpu() for k, v in x.items()}))) < TOL[torch.bfloat16]
    x["x"].mul_(2)  # same pointers, new values: the replay must see them
    assert rel_err(mod.loop_graph(**x).cpu(), 2 * first.cpu().double()) < TOL[torch.bfloat16]


def test_group_sizes_are_seeded_skewed_and_sum_to_tokens():
    s = {"experts": 64, "tokens": 8192, "n": 8, "k": 8}
    a, b, c = inputs(s, torch.float32, 5), inputs(s, torch.float32, 5), inputs(s, torch.float32, 6)
    assert torch.equal(a["group_sizes"], b["group_sizes"]) and torch.equal(a["x"], b["x"])
    assert not torch.equal(a["group_sizes"], c["group_sizes"])
    sizes = a["group_sizes"]
    assert sizes.dtype == torch.int32 and sizes.shape == (64,) and int(sizes.sum()) == 8192
    assert 3.0 < sizes.max().item() / 128 < 6.0  # Zipf(0.5) at 64 experts: the hottest ~4.4x the mean
    p = mod.expert_probabilities(64)
    assert abs(p.sum().item() - 1) < 1e-12 and 4.2 < 64 * p[0].item() < 4.6


def test_traffic_counts_expected_active_experts():
    t = mod.traffic({"experts": 64, "tokens": 8192, "n": 1408, "k": 4096}, torch.bfloat16)
    assert t.flops == 2 * 8192 * 1408 * 4096
    assert abs(t.bytes - (8192 * 4096 * 2 + 64 * 1408 * 4096 * 2 + 64 * 4 + 8192 * 1408 * 2)) < 1e3
    assert 110 < t.flops / t.bytes < 118  # the arithmetic intensity the YAML states
    few = mod.traffic({"experts": 128, "tokens": 16, "n": 8, "k": 8}, torch.bfloat16)
    assert 14 < mod.expected_active_experts(128, 16) < 16  # 16 draws over 128 experts: a few collide
    assert few.bytes < 128 * 8 * 8 * 2


def test_launch_model_names_every_variant():
    names = {v["name"] for v in CASE["kernel"]["variants"]}
    assert set(mod.LAUNCHES) == names
    assert mod.LAUNCHES["loop"]({"experts": 64}) == 64 and mod.LAUNCHES["triton_grouped"]({"experts": 64}) == 1


def test_moe_scenario_matches_a_dense_float64_layer():
    e2e = CASE["levels"]["end_to_end"]
    shape = e2e["cpu_shape"]
    x = mod.make_moe_inputs(shape, torch.float16, "cpu", torch.Generator().manual_seed(0))
    h = x["x"].double()
    want = torch.zeros_like(h)
    for t in range(shape["tokens"]):
        for j in range(shape["top_k"]):
            e = int(x["topk_ids"][t, j])
            u = h[t] @ x["w13"][e].double().T
            act = torch.nn.functional.silu(u[:shape["inter"]]) * u[shape["inter"]:]
            want[t] += float(x["topk_weights"][t, j]) * (act @ x["w2"][e].double().T)
    for fn in (e2e["baseline"], e2e["variant"]):
        got = mod.moe_ffn(getattr(mod, fn), **x)
        assert got.shape == (shape["tokens"], shape["hidden"]) and rel_err(got, want) < 1e-2, fn
    ids = x["topk_ids"]
    assert all(len(set(row.tolist())) == shape["top_k"] for row in ids)  # distinct experts per token


SM90_COMPILE = textwrap.dedent("""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    from casebook.kernels import gemm_grouped as gg

    fn = gg._grouped_kernel
    while not isinstance(fn, triton.runtime.jit.JITFunction):
        fn = fn.fn
    for cfg in gg._grouped_configs():
        for use_tma in (False, True):
            consts = {**cfg.kwargs, "NUM_SMS": 132, "USE_TMA": use_tma, "UPCAST_DOT": False, "EVEN_K": True}
            sig = {n: ("*bf16" if n in ("x_ptr", "w_ptr", "y_ptr") else "*i32" if n == "sizes_ptr"
                       else "constexpr" if n in consts else "i32") for n in fn.arg_names}
            attrs = {(i,): [["tt.divisibility", 16]] for i, n in enumerate(fn.arg_names) if sig[n] != "constexpr"}
            ck = triton.compile(ASTSource(fn=fn, signature=sig, constexprs=consts, attrs=attrs),
                                target=GPUTarget("cuda", 90, 64),
                                options=dict(num_warps=cfg.num_warps, num_stages=cfg.num_stages))
            assert "wgmma" in ck.asm["ptx"], "no Hopper tensor-core instructions"
            assert ck.metadata.shared <= 232448, ck.metadata.shared
            print(cfg.kwargs, cfg.num_stages, cfg.num_warps, use_tma, ck.metadata.shared)
    print("ok")
""")


@pytest.mark.slow
def test_every_gpu_config_compiles_for_sm90():
    """Without a GPU: both load paths of the grouped kernel compile to sm90 for every config."""
    try:
        from triton.backends.nvidia import compiler  # noqa: F401
    except ImportError:
        pytest.skip("this Triton has no NVIDIA backend")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_DEFAULT_FP_FUSION"] = "1"
    r = subprocess.run([sys.executable, "-c", SM90_COMPILE], cwd=REPO, env=env, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0 and r.stdout.strip().endswith("ok"), r.stdout[-2000:] + r.stderr[-4000:]
