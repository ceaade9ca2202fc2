"""The exact GELU's erfc, fitted for few instructions: constants shared by the Triton and Gluon GEMMs.

GELU(x) = x Phi(x) = max(x, 0) - |x| erfc(|x| / sqrt 2) / 2, and erfc(z) = t exp(-z^2 + P(t)) with
t = 1 / (1 + T_SCALE z): Numerical Recipes' `erfcc` form (there T_SCALE = 1/2 and P has degree 9,
relative error 1.2e-7). ERFC_FIT is a degree-4 P with T_SCALE = 0.7, least squares iterated toward
minimax over z in [0, 9]: relative error of erfc at most 5.0e-5; of GELU in fp32, 5.7e-5
(tests/kernels/test_gemm_epilogue.py, tests/kernels/test_gemm_pingpong.py): a 60th of a bf16 ulp and
an 8th of an fp16 one.

Why short: on Hopper, every FP32 instruction per output element costs a GEMM ~1.4% once its epilogue
outgrows what overlaps the tensor cores, and special-function-unit (MUFU) operations cost nothing
(benchmarks/explore/epilogue_probe.py). Five FMAs fewer than degree 9, with the exponential and the
reciprocal on the MUFU, take the exact GELU from ~28 FP32 instructions per element to 11 (10 in bf16).

Plain Python on purpose: both kernel modules import it, whichever Triton dialect they are written in.
"""

ERFC_FIT = (-0.92627048, 0.95588314, 0.507821787, -0.792299055, 0.254858285)
T_SCALE = 0.7

ERFC_FIT_BF16 = (-1.22721555, 0.923816006, 0.655845239, -0.352597586)
T_SCALE_BF16 = 0.516
"""For bf16 outputs, one FMA fewer: a degree-3 P with T_SCALE_BF16, fitted the same way. Relative error
of erfc at most 1.7e-4; of GELU in fp32, 1.8e-4: a 22nd of a bf16 ulp, but a third of an fp16 one, so
the kernels use it only when they round to bf16."""
LOG2E = 1.4426950408889634
RSQRT2 = 0.7071067811865476


def _folded(fit: tuple[float, ...]) -> tuple[float, ...]:
    """P's coefficients for the kernels' base-2 exponential: log2(e) folded in, and the 1/2 of
    |x| erfc / 2 folded into the constant term as -1 (2^-1)."""
    return tuple(c * LOG2E - (i == 0) for i, c in enumerate(fit))


# What the kernels use, each module wrapping them in its dialect's constexpr: GELU(x) = max(x, 0) -
# |x| t 2^(EXP2_FIT(t) - HALF_LOG2E x^2), t = 1 / (1 + T_RSQRT2 |x|).
EXP2_FIT = _folded(ERFC_FIT)
EXP2_FIT_BF16 = _folded(ERFC_FIT_BF16)
T_RSQRT2 = T_SCALE * RSQRT2  # z = |x| / sqrt 2, so T_SCALE z = T_RSQRT2 |x|
T_RSQRT2_BF16 = T_SCALE_BF16 * RSQRT2
HALF_LOG2E = 0.5 * LOG2E  # z^2 = x^2 / 2, in base 2
