"""Correctness: an output against the float64 reference, normwise and row by row, per dtype.

`compare_output` is the judgement itself, pure arithmetic on tensors: the parent of `casebook run` applies it
to the outputs a variant's child sent back (`casebook.run.judge`), never in the child; the kernel tests reach
it the same way (`casebook.run.inprocess`).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable

import torch

from casebook.tolerance import ROW_FLOOR, bounds

TORCH_DTYPES = {
    "fp64": torch.float64, "fp32": torch.float32, "tf32": torch.float32, "bf16": torch.bfloat16,
    "fp16": torch.float16, "int8": torch.int8, "int32": torch.int32, "int64": torch.int64,
}
for _name, _attr in (("fp8_e4m3", "float8_e4m3fn"), ("fp8_e5m2", "float8_e5m2")):
    if hasattr(torch, _attr):
        TORCH_DTYPES[_name] = getattr(torch, _attr)


class CheckFailed(AssertionError):
    """A variant computed the wrong thing, or cheated."""


def upcast(inputs: dict) -> dict:
    """Float tensors to float64 on their own device (a GPU's fp64 is fast); other values unchanged."""
    return {k: v.detach().to(torch.float64) if torch.is_tensor(v) and v.is_floating_point() else v
            for k, v in inputs.items()}


def reference_inputs(reference: Callable, inputs: dict) -> dict:
    """What the float64 reference is called with: the inputs its signature names (every one, where it takes
    `**kwargs`), upcast. An input only the variants read is never copied to float64: the contiguous copy of each
    request's context that attention_prefix makes for its per-request rungs is 2.2 G elements at its claim shape,
    17 GB in float64, and upcasting K's and V's ran the GPU tests out of memory on an H100."""
    try:
        params = inspect.signature(reference).parameters.values()
    except (TypeError, ValueError):  # no signature to read (a builtin): every input, as before
        return upcast(inputs)
    if not any(p.kind is p.VAR_KEYWORD for p in params):
        named = {p.name for p in params}
        inputs = {k: v for k, v in inputs.items() if k in named}
    return upcast(inputs)


ROW_MIN = 32
"""Rows narrower than this are not judged alone (the whole output's bound holds them): a row of three
values whose gradient cancels to almost nothing (layer norm's backward over three columns, torch's CPU
kernel with its statistics rounded to bf16) is off by 15% of its own norm, honestly."""


CHUNK_ELEMENTS = 2**25
"""Elements compared at a time (256 MB in float64): a gigabyte output is judged in slices, so the judge
needs a few hundred megabytes of the device beside what the children hold (a 4096 x 128256 gradient in one
float64 piece asked the H200 for 8 GB while the variant's and the reference's children held 130 GB)."""


def _rows(t: torch.Tensor) -> torch.Tensor:
    """`t` as rows of its last dimension (a vector is one row)."""
    width = t.shape[-1] if t.dim() >= 2 else t.numel()
    return t.reshape(-1, max(width, 1))


def _row_norms(got: torch.Tensor, expected: torch.Tensor, device: str | torch.device | None) -> tuple:
    """(||got - expected||, ||expected||) per row, in float64 on `device` (default: got's), slice by slice;
    raises CheckFailed on a NaN or Inf in `got`."""
    g2, e2 = _rows(got.detach()), _rows(expected)
    device = device or g2.device
    rows, width = g2.shape
    step = max(1, CHUNK_ELEMENTS // width)
    diff, scale, bad = [], [], []
    for i in range(0, rows, step):  # queued on the device, one wait at the end
        g = g2[i:i + step].to(device=device, dtype=torch.float64)
        e = e2[i:i + step].to(device=device, dtype=torch.float64)
        bad.append((~torch.isfinite(g)).sum())
        diff.append(torch.linalg.vector_norm(g - e, dim=1))
        scale.append(torch.linalg.vector_norm(e, dim=1))
    bad = int(torch.stack(bad).sum()) if bad else 0
    if bad:
        raise CheckFailed(f"{bad} of {got.numel()} output elements are NaN or Inf (unwritten, or overflow)")
    return torch.cat(diff), torch.cat(scale)


def row_error(got: torch.Tensor, expected: torch.Tensor) -> float:
    """The worst row's ||got - expected|| over its ||expected|| (`ROW_TOLERANCE`), both float64; 0 where the
    rows are narrower than `ROW_MIN`."""
    if got.numel() == 0:
        return 0.0
    return _worst_row(*_row_norms(got, expected, None), _rows(got).shape[1])


def _worst_row(diff: torch.Tensor, scale: torch.Tensor, width: int) -> float:
    if width < ROW_MIN:
        return 0.0
    floor = ROW_FLOOR * float(torch.sqrt(torch.mean(scale**2)))
    if floor == 0.0:
        return float(diff.max())
    return float((diff / torch.clamp(scale, min=floor)).max())


def compare_output(out, expected: torch.Tensor, dtype: str, tolerance: float | None = None,
                   device: str | torch.device | None = None) -> tuple[float, float]:
    """Judge one output tensor against its reference: (normwise error, row error), or CheckFailed saying
    why it is not an answer (type, shape, dtype, NaN or Inf) or is over a bound. The arithmetic is float64 on
    `device` (default: the output's), `CHUNK_ELEMENTS` at a time."""
    if type(out) is not torch.Tensor:
        raise CheckFailed(f"returned {type(out).__name__}, not a plain torch.Tensor")
    if tuple(out.shape) != tuple(expected.shape):
        raise CheckFailed(f"output shape {tuple(out.shape)}, expected {tuple(expected.shape)}")
    want = TORCH_DTYPES[dtype] if expected.is_floating_point() else expected.dtype
    if out.dtype != want:
        raise CheckFailed(f"output dtype {out.dtype}, expected {want}")
    if out.numel() == 0:
        return 0.0, 0.0
    diff, scale = _row_norms(out, expected, device)
    ref_norm = float(torch.linalg.vector_norm(scale))
    err = float(torch.linalg.vector_norm(diff))
    err = err / ref_norm if ref_norm else err
    tol, row_tol = bounds(dtype, tolerance)
    if not err <= tol:  # NaN compares false: never passes
        raise CheckFailed(f"relative error {err:.3g} over tolerance {tol:.3g}")
    row = _worst_row(diff, scale, _rows(out).shape[1])
    if not row <= row_tol:
        raise CheckFailed(f"worst row off by {row:.3g} of its norm, over the row tolerance {row_tol:.3g} "
                          "(a row unwritten, or every value scaled)")
    return err, row
