"""gemm_tiled: every variant against the float64 reference at small awkward shapes (Triton through the
interpreter), the traffic model, the SwiGLU scenario, and an sm90 compile of the largest GPU configs."""

from __future__ import annotations

import os

os.environ["TRITON_INTERPRET"] = "1"  # before any kernel module is imported: @triton.jit reads it then

import textwrap
import zlib
from pathlib import Path

import pytest
import torch
import yaml

from casebook.kernels import gemm_common
from casebook.kernels import gemm_tiled as mod
from casebook.run.check import TORCH_DTYPES
from casebook.tolerance import TOLERANCE

REPO = Path(__file__).resolve().parents[2]
CASE = yaml.safe_load((REPO / "cases" / "gemm_tiled.yaml").read_text())
# The harness's own per-dtype bounds, so the tests hold the kernels to what `casebook run` checks.
TOL = {TORCH_DTYPES[d]: TOLERANCE[d] for d in ("fp16", "bf16")}
DTYPES = [torch.float16, torch.bfloat16]
ON_CPU = [v["fn"] for v in CASE["kernel"]["variants"] if {"cpu", "interpreter"} & set(v["backends"])]
# The case's CPU shapes, plus: one row; K shorter than a tile; TMA-aligned but not tile-aligned.
SHAPES = CASE["levels"]["kernel"]["cpu_shapes"] + [{"m": 1, "n": 40, "k": 24}, {"m": 33, "n": 8, "k": 8},
                                                   {"m": 70, "n": 40, "k": 48}]


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    return (torch.linalg.vector_norm(out.double() - ref) / torch.linalg.vector_norm(ref)).item()


def inputs(shape: dict, dtype: torch.dtype, seed: int = 0) -> dict:
    return mod.make_inputs(shape, dtype, "cpu", torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s.values())))
@pytest.mark.parametrize("fn", ON_CPU)
def test_variant_matches_reference(fn, shape, dtype):
    x = inputs(shape, dtype, seed=zlib.crc32(f"{fn}{shape}{dtype}".encode()))
    out = getattr(mod, fn)(**x)
    assert out.shape == (shape["m"], shape["n"]) and out.dtype == dtype
    assert rel_err(out, mod.reference(**{k: v.double() for k, v in x.items()})) < TOL[dtype]


def test_tma_path_is_taken_where_valid_and_skipped_where_not():
    aligned = inputs({"m": 70, "n": 40, "k": 48}, torch.float16)
    odd = inputs({"m": 37, "n": 53, "k": 29}, torch.float16)
    assert gemm_common.tma_supported(aligned["a"], aligned["b"])
    assert not gemm_common.tma_supported(odd["a"], odd["b"])  # 29 x 2 B rows are not 16-byte aligned


@pytest.mark.parametrize("m, n, flags, big_only", [
    (4096, 4096, {}, True),  # 512 tiles of 128x256 on 132 SMs: 3.9 waves
    (2048, 2048, {}, False),  # 128 tiles: under one wave, every configuration stays
    (4096, 4096, {"HAS_BIAS": True, "GELU": "erf"}, False),  # a fused epilogue keeps the full choice
])
def test_large_plain_gemms_keep_the_big_tile_alone(m, n, flags, big_only):
    import triton

    configs = [triton.Config({"BLOCK_M": bm, "BLOCK_N": bn}) for bm, bn in ((128, 256), (128, 128), (64, 128))]
    kept = gemm_common._prune_tma(configs, {"M": m, "N": n, "K": 4096}, NUM_SMS=132,
                                  **{"HAS_BIAS": False, "GELU": "none", **flags})
    assert kept == (configs[:1] if big_only else configs)


def test_inputs_are_seeded_random_and_scaled():
    s = {"m": 64, "n": 48, "k": 32}
    a, b = inputs(s, torch.float32, 7), inputs(s, torch.float32, 7)
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not torch.equal(a["a"], inputs(s, torch.float32, 8)["a"])
    assert set(a) == {"a", "b"} and a["a"].shape == (64, 32) and a["b"].shape == (32, 48)
    assert 0.5 < (a["a"] @ a["b"]).std().item() < 2.0  # fan-in scaling keeps C near unit variance


def test_traffic_is_the_gemm_floor():
    t = mod.traffic({"m": 4096, "n": 4096, "k": 4096}, torch.bfloat16)
    assert t.flops == 2 * 4096**3
    assert t.bytes == 3 * 4096 * 4096 * 2
    assert [term.name for term in t.terms][:3] == ["read a", "read b", "write c"]
    assert 1300 < t.flops / t.bytes < 1400  # the arithmetic intensity the YAML states


def test_swiglu_scenario_with_triton_matches_torch():
    e2e = CASE["levels"]["end_to_end"]
    x = mod.make_mlp_inputs(e2e["cpu_shape"], torch.float16, "cpu", torch.Generator().manual_seed(0))
    want = mod.swiglu_mlp(mod.torch_matmul, **x)
    got = mod.swiglu_mlp(getattr(mod, e2e["variant"]), **x)
    assert got.shape == (e2e["cpu_shape"]["tokens"], e2e["cpu_shape"]["hidden"])
    assert rel_err(got, want.double()) < 1e-2


SM90_COMPILE = textwrap.dedent("""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    from casebook.kernels import gemm_common as gc

    def jit(k):
        while not isinstance(k, triton.runtime.jit.JITFunction):
            k = k.fn
        return k

    def build(kernel, cfg, consts):
        fn = jit(kernel)
        consts = {**consts, **cfg.kwargs}
        consts = {k: v for k, v in consts.items() if k in fn.arg_names}
        blocks = {"a_desc": ("BLOCK_M", "BLOCK_K"), "b_desc": ("BLOCK_K", "BLOCK_N"), "c_desc": ("BLOCK_M", "BLOCK_N")}
        def ty(n):
            if n in blocks:  # a host-side TMA descriptor, typed by its block shape
                return "tensordesc<bf16[%d, %d]>" % tuple(consts[b] for b in blocks[n])
            return "*bf16" if n.endswith("_ptr") else "constexpr" if n in consts else "i32"
        sig = {n: ty(n) for n in fn.arg_names}
        attrs = {(i,): [["tt.divisibility", 16]] for i, n in enumerate(fn.arg_names) if sig[n] != "constexpr"}
        ck = triton.compile(ASTSource(fn=fn, signature=sig, constexprs=consts, attrs=attrs),
                            target=GPUTarget("cuda", 90, 64),
                            options=dict(num_warps=cfg.num_warps, num_stages=cfg.num_stages))
        assert "wgmma" in ck.asm["ptx"], "no Hopper tensor-core instructions"
        assert ck.metadata.shared <= 232448, f"{ck.metadata.shared} B of shared memory"
        return ck

    base = dict(HAS_BIAS=True, GELU=True, UPCAST_DOT=False, EVEN_K=True, NUM_SMS=132,
                stride_ak=1, stride_bn=1, stride_cn=1)
    def footprint(cfg):  # shared memory of the operand stages, the configs likeliest not to fit
        k = cfg.kwargs
        return (k["BLOCK_M"] + k["BLOCK_N"]) * k["BLOCK_K"] * cfg.num_stages

    for kernel, configs in ((gc._tiled_kernel, gc.TILED_CONFIGS), (gc._persistent_kernel, gc.PERSISTENT_CONFIGS),
                            (gc._tma_persistent_kernel, gc.TMA_CONFIGS)):
        for cfg in sorted(configs, key=footprint)[-2:]:  # two per kernel keeps a cold compile near 15 s
            ck = build(kernel, cfg, base)
            print(jit(kernel).__name__, cfg.kwargs["BLOCK_M"], cfg.kwargs["BLOCK_N"], cfg.kwargs["BLOCK_K"],
                  cfg.num_stages, cfg.num_warps, ck.metadata.shared)
    print("ok")
""")


@pytest.mark.slow
def test_largest_gpu_configs_compile_for_sm90():
    """Without a GPU: Triton compiles each kernel, with its two largest configs, to sm90 (ptxas is bundled)."""
    from lowering import lowered

    out = lowered(SM90_COMPILE)
    assert out.strip().endswith("ok"), out[-2000:]
