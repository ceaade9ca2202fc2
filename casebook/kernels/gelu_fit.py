"""The exact GELU's erfc, fitted for few instructions: constants shared by the Triton and Gluon GEMMs.

GELU(x) = x Phi(x) = max(x, 0) - |x| erfc(|x| / sqrt 2) / 2, and erfc(z) = t exp(-z^2 + P(t)) with
t = 1 / (1 + z/2): Numerical Recipes' `erfcc` form, whose P has degree 9 (relative error 1.2e-7).
ERFC_FIT is a degree-5 P, least squares iterated toward minimax over z in [0, 9]: relative error of
erfc at most 7.8e-6; of GELU in fp32, 1.1e-5 for |x| < 6 and 2.4e-5 beyond
(tests/kernels/test_gemm_epilogue.py, tests/kernels/test_gemm_pingpong.py), a 160th of a bf16 ulp and a
40th of an fp16 one.

Why short: on Hopper, every FP32 instruction per output element costs a GEMM ~1.4% once its epilogue
outgrows what overlaps the tensor cores, and special-function-unit (MUFU) operations cost nothing
(benchmarks/explore/epilogue_probe.py). Four FMAs fewer than degree 9, with the exponential and the
reciprocal on the MUFU, take the exact GELU from ~28 FP32 instructions per element to 12.

Plain Python on purpose: both kernel modules import it, whichever Triton dialect they are written in.
"""

ERFC_FIT = (-1.26654132, 1.0180138, 0.254427332, 0.474543491, -0.709249068, 0.228813456)
LOG2E = 1.4426950408889634
