"""The layernorm_backward case's module: layernorm's backward ladder as `layernorm` defines it (the reference,
the inputs, the traffic model, the rungs to `triton_partial` and the level-3 step, imported unchanged, so that the
forward case's result stays current), and the rung that keeps the next rows in flight and splits wide rows by
columns (`norm_backward`)."""

from __future__ import annotations

from casebook.kernels import norm_backward
from casebook.kernels.layernorm import (  # noqa: F401 (the case's functions, by name)
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


def triton_pipelined(x, w, b, dy, mean, rstd):
    """Rows pipelined to 8K columns, split by columns past it (an H100: 4.1x `triton_partial` at 8192 x 16384,
    where its whole row spills). `b` does not enter the gradient; it is an input of the case."""
    return norm_backward.pipelined(x, w, dy, mean, rstd)
