"""transpose on a GPU, compiled (not interpreted): every variant at awkward shapes, including the TMA path and
its fallback, against the float64 transpose. Skipped without CUDA; run with
`python3 -m pytest -q tests/kernels/test_transpose_gpu.py` (no TRITON_INTERPRET)."""

from __future__ import annotations

import pytest
import torch

from casebook.run.inprocess import check

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (compiled Triton)")

SHAPES = [(1, 1, 129, 1), (1, 67, 45, 1), (3, 33, 65, 1), (1, 1024, 1032, 1), (2, 37, 12, 3), (2, 130, 5, 129),
          (1, 2048, 4096, 1)]
VARIANTS = ["copy", "torch_contiguous", "torch_compile", "naive_write_strided", "naive_read_strided", "tiled",
            "tiled_tuned", "tma"]


@pytest.mark.parametrize("dtype", ["bf16", "fp32"])
@pytest.mark.parametrize("shape", SHAPES, ids=["x".join(map(str, s)) for s in SHAPES])
@pytest.mark.parametrize("fn", VARIANTS)
def test_variant_on_gpu(fn, shape, dtype):
    from casebook.kernels import transpose as mod

    reference = mod.copy_reference if fn == "copy" else mod.reference
    c = check(getattr(mod, fn), reference, mod.make_inputs, dict(zip(("batch", "rows", "cols", "inner"), shape)),
              dtype, "cuda", [7, 8])
    assert c.correct, c.error
    assert c.max_rel_err == 0.0


def test_tma_takes_its_path_on_hopper():
    from casebook.kernels import transpose as mod

    x = torch.zeros(1, 1024, 1032, 1, device="cuda", dtype=torch.bfloat16)
    assert mod.tma_applies(x) == (torch.cuda.get_device_capability()[0] >= 9)
