"""Device exploration (not a casebook run): which resource the erfc epilogue exhausts in the ping-pong GEMM.

epilogue_clocks.py falsified the power hypothesis: under
sustained load the erfc ping-pong kernel ran at a *higher* SM clock than the plain one (1740 against
1538 MHz, both at the power cap) and took 45% more cycles (516 k against 356 k). So the epilogue is not
hidden under the other consumer's main loop, although by issue slots (~28 instructions per element,
two of them MUFU, 128 elements per thread) it needs ~2-3 k cycles a tile against a ~11 k-cycle main loop.

Each probe below replaces `gemm_pingpong._gelu_erf` (in a fresh process, so Gluon compiles it anew;
the probes ignore its BF16 argument, added later)
and times the kernel at 8192 x 8192 x 1024 bf16, beside the tanh form (~6 instructions, one MUFU):
- `mufu2`: two MUFU (rcp, ex2) and ~4 other instructions. If it costs as much as erfc, MUFU is the
  bottleneck.
- `fma28`: ~28 FP32 instructions, no MUFU. If it costs as much as erfc, the FP32 issue is.
- `approx`: erfc with ex2.approx.ftz and rcp.approx.ftz (inline PTX), which drop the range fix-ups
  (~5 instructions per element).
- `estrin`: erfc with the polynomial in Estrin's scheme: depth 4 instead of 9 dependent FMAs.
Prediction, written before running: fma28 costs about what erfc does and mufu2 about what tanh does
(FP32 issue, not MUFU); approx then gains ~15%, estrin little.

Measured on an H200, over the bias-only kernel (~201.8 us):
erfc +36.7%, tanh +3.1%, mufu2 +0.5%, fma28 +39.8%, approx +14.7%, estrin +21.6%. The prediction held
in direction: the MUFU is free, FP32 instructions are not. Read as a line, each FP32 instruction per
accumulator element beyond the first ~4 costs ~1.45% (tanh has 6 with the bias add, fma28 29, erfc
~28): about its own issue time, so the epilogue's FP32 work is not overlapped with the other
consumer's tensor-core work at all beyond that. Estrin's shorter chain with more multiplies was
slower than Horner (and its timing was of a wrong polynomial: a pair of coefficients swapped,
normwise error 1.6e-2; the cost, not the value, is what it measured). Latency is not the limit;
instruction count is. gemm_pingpong's erf now has 12 (a degree-5 fit, ERFC_FIT).

From then on `erfc` names the module's erf form, that fit. One more probe, `deg4`: a degree-4 fit
(t = 1 / (1 + 0.7 z), erfc relative error 5.0e-5, GELU within 5.8e-5 in fp32), one FMA fewer.
Prediction, by the line above: ~1.4% faster than the module's form, ~218 us at 8192 x 8192 x 1024 in
the case's protocol, which is what the 1.3x claim needs (218.8). It compiles for sm_90a with Triton 3.6
(11 FP32 instructions per element in the PTX, against the module form's 12).

Then a second change, in the module: each tile's accumulator was zeroed before its main loop (64 CS2R
per thread, half an instruction per element); now it is zeroed once and each tile's first wgmma
ignores it (use_acc=False). The module's erf form is the degree-4 fit, and `deg5` probes the one before.
Prediction, written before running, with both the module before these changes (argument MODULE, the
file as it was at main 15e7adc) and after: after/erfc is 2-2.5% faster than before/erfc (deg4 ~1.4%,
the zeroing up to ~0.7%), after/deg5 is 0-0.7% faster than before/erfc, and the bias-only kernel
moves by under 0.5% (its epilogue hides under the other consumer's main loop).

Measured on an H200 (two rounds, medians in us at 8192 x 8192 x 1024):
before/erfc 221.5 and 221.3, after/erfc 210.2 and 210.2 (5.0% faster: predicted 2-2.5%), after/deg5
213.3 and 212.7 (3.8% faster: predicted 0-0.7%), tanh 208.0 -> 205.6 and 205.0, bias-only ~202.7 ->
~199.6 (1.5%: predicted under 0.5%). The degree-4 fit did what the line predicted (1.3-1.5%); the
zeroing cost five times the prediction. Why, from the SASS of the kernel before (cuobjdump of the
sm_90a cubin): the CS2Rs came after the wait on the consumer's turn, so they sat between the other
consumer's last wgmma and this one's first, on the tensor cores' critical path, and they issued on
the same sub-partitions as the other consumer's epilogue. Half an instruction per element priced by
its issue time was the wrong model for an instruction on the hand-off. Over the bias-only kernel,
after/erfc costs +5.0-5.4% and tanh +2.8-2.9%.

    python3 benchmarks/explore/gemm_epilogue/epilogue_probe.py                  (H200: every probe, each in its own process)
    python3 benchmarks/explore/gemm_epilogue/epilogue_probe.py PROBE [MODULE]   (one, on gemm_pingpong or the module at MODULE)
"""
import subprocess
import sys

from triton.experimental import gluon
from triton.experimental.gluon import language as gl

from casebook.kernels import gemm_pingpong as gp
from casebook.kernels.gemm_pingpong import _ex2 as _ex2_ftz
from casebook.kernels.gemm_pingpong import _rcp as _rcp_ftz

PROBES = ("erfc", "tanh", "mufu2", "fma28", "approx", "estrin", "deg4", "deg5")


@gluon.jit
def mufu2(x, BF16: gl.constexpr):
    return x * _ex2_ftz(_rcp_ftz(x + 3.0) - x)


@gluon.jit
def fma28(x, BF16: gl.constexpr):
    p = x * 0.17087277 - 0.82215223
    for _ in gl.static_range(26):
        p = p * x + 0.37409196
    return p


@gluon.jit
def approx(x, BF16: gl.constexpr):
    z = gl.abs(x) * 0.7071067811865476
    t = _rcp_ftz(1.0 + 0.5 * z)
    p = t * 0.17087277 - 0.82215223
    p = p * t + 1.48851587
    p = p * t - 1.13520398
    p = p * t + 0.27886807
    p = p * t - 0.18628806
    p = p * t + 0.09678418
    p = p * t + 0.37409196
    p = p * t + 1.00002368
    p = p * t - 1.26551223
    half = 0.5 * x * t * _ex2_ftz((p - z * z) * 1.4426950408889634)
    return gl.where(x >= 0, x - half, half)


@gluon.jit
def estrin(x, BF16: gl.constexpr):
    z = gl.abs(x) * 0.7071067811865476
    t = _rcp_ftz(1.0 + 0.5 * z)
    t2 = t * t
    t4 = t2 * t2
    t8 = t4 * t4
    q01 = 1.00002368 * t - 1.26551223
    q23 = 0.09678418 * t + 0.37409196
    q45 = 0.27886807 * t - 0.18628806
    q67 = -1.13520398 * t + 1.48851587
    q89 = 0.17087277 * t - 0.82215223
    q03 = q23 * t2 + q01
    q47 = q67 * t2 + q45
    p = (q89 * t8) + (q47 * t4 + q03)
    half = 0.5 * x * t * _ex2_ftz((p - z * z) * 1.4426950408889634)
    return gl.where(x >= 0, x - half, half)


_DEG4 = [gl.constexpr(c * 1.4426950408889634 - (i == 0)) for i, c in
         enumerate((-0.92627048, 0.95588314, 0.507821787, -0.792299055, 0.254858285))]
_D0, _D1, _D2, _D3, _D4 = _DEG4
_K = gl.constexpr(0.7 * 0.7071067811865476)


@gluon.jit
def deg4(x, BF16: gl.constexpr):
    a = gl.abs(x)
    t = _rcp_ftz(1.0 + _K * a)
    p = t * _D4 + _D3
    p = p * t + _D2
    p = p * t + _D1
    p = p * t + _D0
    e = _ex2_ftz(p - 0.7213475204444817 * x * x)
    return gl.maximum(x, 0.0) - (a * t) * e


_DEG5 = [gl.constexpr(c * 1.4426950408889634 - (i == 0)) for i, c in
         enumerate((-1.26654132, 1.0180138, 0.254427332, 0.474543491, -0.709249068, 0.228813456))]
_F0, _F1, _F2, _F3, _F4, _F5 = _DEG5


@gluon.jit
def deg5(x, BF16: gl.constexpr):
    a = gl.abs(x)
    t = _rcp_ftz(1.0 + 0.35355339059327373 * a)
    p = t * _F5 + _F4
    p = p * t + _F3
    p = p * t + _F2
    p = p * t + _F1
    p = p * t + _F0
    e = _ex2_ftz(p - 0.7213475204444817 * x * x)
    return gl.maximum(x, 0.0) - (a * t) * e


def probe(name: str, module: str | None = None) -> None:
    import importlib.util

    import torch
    import torch.nn.functional as F

    from casebook.run.bench import Protocol, time_fn

    kernels = gp
    if module:
        spec = importlib.util.spec_from_file_location("gemm_pingpong_probed", module)
        kernels = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(kernels)
    form = "tanh" if name == "tanh" else "erf"
    if name not in ("erfc", "tanh"):
        kernels._gelu_erf = globals()[name]  # the kernel resolves the name when this process compiles it
    torch.manual_seed(0)
    m, n, k = 8192, 8192, 1024
    a = torch.randn(m, k, device="cuda").to(torch.bfloat16)
    b = (torch.randn(k, n, device="cuda") * k**-0.5).to(torch.bfloat16)
    bias = torch.randn(n, device="cuda").to(torch.bfloat16)
    out = kernels.matmul(a, b, bias, form).double()
    ref = a.double() @ b.double() + bias.double()
    want = F.gelu(ref, approximate="tanh" if form == "tanh" else "none")
    err = ((out - want).norm() / want.norm()).item()
    plain = time_fn(lambda: kernels.matmul(a, b, bias, "none"), "cuda", Protocol()).summary.median_us
    us = time_fn(lambda: kernels.matmul(a, b, bias, form), "cuda", Protocol()).summary.median_us
    print(f"{name:7s} {'before' if module else 'module'} {us:7.1f} us  (+{us / plain - 1:6.1%} over the bias-only kernel, {plain:.1f} us)  "
          f"normwise error against the exact GELU {err:.1e}", flush=True)


if __name__ == "__main__":
    if len(sys.argv) > 1:
        probe(*sys.argv[1:3])
    else:
        for name in PROBES:
            subprocess.run([sys.executable, __file__, name], timeout=60)
