"""The rmsnorm_backward case's module: rmsnorm's backward ladder as `rmsnorm` defines it (the reference, the
inputs, the traffic model, the rungs to `triton_partial` and the level-3 step, imported unchanged, so that the
forward cases' results stay current), and the rung that keeps the next rows in flight (`norm_backward`)."""

from __future__ import annotations

import torch

from casebook.kernels import norm_backward
from casebook.kernels.rmsnorm import (  # noqa: F401 (the case's functions, by name)
    MAX_BACKWARD,
    eager_backward,
    liger_backward,
    make_backward_inputs,
    make_backward_layer_inputs,
    prenorm_projection_backward,
    reference_backward,
    torch_backward,
    torch_compile_backward,
    traffic_backward,
    triton_atomic,
    triton_partial,
)


def triton_pipelined(x, w, dy, rstd) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows pipelined to 8K columns; from there to MAX_BACKWARD the committed `triton_partial`, which an H100
    ran faster than the column split (1.87 TB/s against 1.63 at 8192 x 16384); past it the column split, which
    takes rows the committed kernel refuses."""
    if norm_backward.ROWS_UP_TO < x.shape[1] <= MAX_BACKWARD:
        return triton_partial(x, w, dy, rstd)
    return norm_backward.pipelined(x, w, dy, None, rstd)
