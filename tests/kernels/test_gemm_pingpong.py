"""gemm_pingpong: Gluon does not run on the CPU (no interpreter), so the kernel is lowered ahead of time
for sm_90a with the installed Triton, and its PTX is checked for what the design depends on; the erf
epilogue's arithmetic is replayed in fp32 with the module's constants. The kernel's results are checked
on the H200 (every `casebook run` of gemm_epilogue, tests/kernels/test_gemm_epilogue.py's GPU-only
test, and benchmarks/explore/gemm_epilogue/pingpong_epilogue.py --check at ragged shapes).

The lowering runs in a child process: once Triton's interpreter has run a kernel in a process (the
other kernel tests do), compiling a Gluon kernel there fails, so the result would depend on test order
and on whether Triton's cache already holds the kernel."""

from __future__ import annotations

import os

os.environ["TRITON_INTERPRET"] = "1"  # as in the other kernel tests, whichever module is collected first

import json
import re
import subprocess
import sys

import pytest
import torch

gp = pytest.importorskip("casebook.kernels.gemm_pingpong", reason="this Triton has no Gluon", exc_type=ImportError)

LOWER = """
import json, sys
from casebook.kernels import gemm_pingpong as gp
out = {}
for form in gp.GELU_FORMS:
    kernel = gp.compile_for_sm90(form)
    out[form] = {"shared": kernel.metadata.shared, "ptx": kernel.asm["ptx"]}
out["erf fp16"] = {"ptx": gp.compile_for_sm90("erf", dtype="fp16").asm["ptx"]}
json.dump(out, open(sys.argv[1], "w"))
"""
HOPPER_SMEM = 227 * 1024  # the most shared memory one block may have on sm_90


@pytest.fixture(scope="module")
def lowered_forms(tmp_path_factory) -> dict:
    """{form: {"shared": bytes, "ptx": text}}, lowered in a child process without the interpreter."""
    path = tmp_path_factory.mktemp("pingpong") / "lowered.json"
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    subprocess.run([sys.executable, "-c", LOWER, str(path)], env=env, check=True, timeout=300)
    return json.loads(path.read_text())


@pytest.fixture(params=sorted(gp.GELU_FORMS))
def lowered(request, lowered_forms):
    return request.param, lowered_forms[request.param]


def test_lowers_for_hopper_within_its_shared_memory(lowered):
    _, kernel = lowered
    assert 4 * 2 * 128 * 64 * 2 < kernel["shared"] <= HOPPER_SMEM  # the ring alone is 128 KB


def test_two_consumers_and_a_producer_share_the_register_file(lowered):
    ptx = lowered[1]["ptx"]
    assert "wgmma.mma_async" in ptx
    assert re.search(rf"setmaxnreg\.inc\.sync\.aligned\.u32\s+{gp.CONSUMER_REGS};", ptx)
    assert re.search(rf"setmaxnreg\.dec\.sync\.aligned\.u32\s+{gp.PRODUCER_REGS};", ptx)


def test_epilogue_forms_are_straight_line(lowered):
    """erf through the branch-free erfc, not libdevice's (which branches per element); tanh on the
    special-function unit."""
    form, kernel = lowered
    ptx = kernel["ptx"]
    assert "__nv_erff" not in ptx
    assert ("tanh.approx.f32" in ptx) == (form == "tanh")
    assert (ptx.count("ex2.approx.ftz") >= 128) == (form == "erf")  # one per accumulator element of a thread
    assert "div.full" not in ptx and "div.rn" not in ptx


@pytest.mark.parametrize("bf16, bound", [(False, 6e-5), (True, 2e-4)])
def test_erf_fit_is_exact_to_16_bit_precision(bf16, bound):
    """_gelu_erf's arithmetic, step for step in fp32 with the module's constants, against float64 over
    [-12, 12], element by element (the MUFU's ex2 and rcp are exact to 2^-22 here, ~1e-7 on the GPU).
    The bf16 fit's bound is a 20th of a bf16 ulp; the other's an 8th of an fp16 one."""
    x = torch.linspace(-12, 12, 1_000_001, dtype=torch.float64)
    xf = x.float()
    a = xf.abs()
    if bf16:
        t, coeffs = 1.0 / (1.0 + gp._T_RSQRT2_BF16.value * a), (gp._Q3, gp._Q2, gp._Q1, gp._Q0)
    else:
        t, coeffs = 1.0 / (1.0 + gp._T_RSQRT2.value * a), (gp._P4, gp._P3, gp._P2, gp._P1, gp._P0)
    p = torch.full_like(t, coeffs[0].value)
    for c in coeffs[1:]:
        p = p * t + c.value
    gelu = xf.clamp_min(0) - (a * t) * torch.exp2(p - gp._HALF_LOG2E.value * xf * xf)
    exact = 0.5 * x * torch.erfc(-x / 2**0.5)
    rel = (gelu.double() - exact).abs() / exact.abs()
    assert rel.max() < bound


def test_bf16_output_takes_the_shorter_fit(lowered_forms):
    """One FMA per accumulator element fewer when the output rounds to bf16: 128 per thread in each of
    the two consumers' code."""
    fma = {form: len(re.findall(r"\bfma\.rn(?:\.ftz)?\.f32\b", lowered_forms[form]["ptx"]))
           for form in ("erf", "erf fp16")}
    assert fma["erf fp16"] - fma["erf"] == 2 * 128, fma


def test_refuses_what_it_cannot_run():
    a = torch.zeros(128, 64, dtype=torch.bfloat16)
    assert "Hopper" in gp.unsupported(a, a.T.contiguous())
    with pytest.raises(RuntimeError, match="Hopper"):
        gp.matmul(a, a.T.contiguous())
    with pytest.raises(ValueError, match="gelu"):
        gp.matmul(a, a.T.contiguous(), gelu="relu")
