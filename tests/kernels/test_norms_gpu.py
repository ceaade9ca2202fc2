"""The norm family's GPU paths (autotuned configs, the one-pass kernel to 32K columns and the chunked one
beyond, 4-row atomic programs, 2 programs per SM) at awkward shapes, without the interpreter; and the
GPU-only rungs (Liger, torch's fused RMSNorm backward, torch.compile). Skipped without a GPU; run on one
with `python3 -m pytest -q tests/kernels/test_norms_gpu.py` (`benchmarks/gpu_session.sh gpu-tests` runs it)."""

from __future__ import annotations

import pytest
import torch

from casebook.kernels import layernorm, layernorm_backward, rmsnorm, rmsnorm_backward
from casebook.run.inprocess import check

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(),
                                reason="needs a GPU (the CPU paths: test_rmsnorm.py, test_layernorm.py)")

SHAPES = [(1, 4097), (37, 1000), (7, 16385), (5, 32768), (3, 32769), (133, 4096), (1000, 8191)]
BACKWARD_SHAPES = [(1, 4097), (37, 1000), (263, 4096), (3001, 2048), (7, 16384), (129, 8192), (5, 32768),
                   (3, 20000)]
CASES = {
    "rmsnorm": (rmsnorm, rmsnorm.reference, rmsnorm.make_inputs, SHAPES,
                ["torch_rms_norm", "torch_compile", "liger", "triton_onepass", "triton_long"]),
    "rmsnorm_residual": (rmsnorm, rmsnorm.reference_residual, rmsnorm.make_residual_inputs, SHAPES,
                         ["torch_compile_residual", "liger_residual", "triton_onepass_residual",
                          "triton_long_residual"]),
    "rmsnorm_backward": (rmsnorm_backward, rmsnorm.reference_backward, rmsnorm.make_backward_inputs,
                         BACKWARD_SHAPES, ["torch_backward", "torch_compile_backward", "liger_backward",
                                           "triton_atomic", "triton_partial", "triton_pipelined"]),
    "layernorm": (layernorm, layernorm.reference, layernorm.make_inputs, SHAPES,
                  ["torch_compile", "liger", "triton_onepass", "triton_long"]),
    "layernorm_backward": (layernorm_backward, layernorm.reference_backward, layernorm.make_backward_inputs,
                           BACKWARD_SHAPES, ["torch_compile_backward", "liger_backward", "triton_atomic",
                                             "triton_partial", "triton_pipelined"]),
}
POINTS = [(case, fn, r, c, d) for case, (_, _, _, shapes, fns) in CASES.items() for fn in fns
          for r, c in shapes for d in ("bf16", "fp32")]


@pytest.mark.parametrize("case, fn, rows, cols, dtype", POINTS,
                         ids=[f"{c}-{f}-{r}x{n}-{d}" for c, f, r, n, d in POINTS])
def test_gpu_variant_matches_reference(case, fn, rows, cols, dtype):
    mod, reference, make_inputs, _, _ = CASES[case]
    try:
        c = check(getattr(mod, fn), reference, make_inputs, {"rows": rows, "cols": cols}, dtype, "cuda", [rows, cols])
    except NotImplementedError as e:
        pytest.skip(str(e))
    assert c.correct, c.error
