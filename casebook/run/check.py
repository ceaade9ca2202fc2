"""Correctness: an output against the float64 reference, normwise and row by row, per dtype.

`compare_output` is the judgement itself, pure arithmetic on tensors: the parent of `casebook run` applies it
to the outputs a variant's child sent back (`casebook.run.judge`), never in the child. `check` runs a variant
in this process on fresh inputs and judges it the same way: for the kernel tests, which import the kernel
module anyway.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Callable

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


@dataclass(frozen=True)
class Check:
    correct: bool
    max_rel_err: float
    seeds: list[int]
    error: str | None = None


def upcast(inputs: dict) -> dict:
    """Float tensors to float64 on their own device (a GPU's fp64 is fast); other values unchanged."""
    return {k: v.detach().to(torch.float64) if torch.is_tensor(v) and v.is_floating_point() else v
            for k, v in inputs.items()}


def _poison_allocator(shape: tuple, dtype: torch.dtype, device: str) -> None:
    """Leave a NaN-filled block of the output's size as the allocator's next free one: unwritten elements show."""
    if dtype.is_floating_point:
        torch.full(shape, float("nan"), dtype=dtype, device=device)  # freed at once, its block left NaN


@contextlib.contextmanager
def _fill_new_memory_with_nan(device: str):
    """On a CPU, NaN-fill every tensor allocated during the call (torch's deterministic mode does that): the C
    allocator returns large freed blocks to the OS, so the poison block alone misses unwritten outputs there."""
    if device != "cpu" or torch.are_deterministic_algorithms_enabled():
        yield
        return
    torch.use_deterministic_algorithms(True, warn_only=True)
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(False)


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
    diff, scale, bad = [], [], 0
    for i in range(0, rows, step):
        g = g2[i:i + step].to(device=device, dtype=torch.float64)
        e = e2[i:i + step].to(device=device, dtype=torch.float64)
        bad += int((~torch.isfinite(g)).sum())
        diff.append(torch.linalg.vector_norm(g - e, dim=1))
        scale.append(torch.linalg.vector_norm(e, dim=1))
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


def check(fn: Callable[..., torch.Tensor], reference: Callable[..., torch.Tensor],
          make_inputs: Callable[..., dict], shape: dict, dtype: str, device: str, seeds: list[int],
          tolerance: float | None = None) -> Check:
    """Run `fn` on fresh random inputs per seed and compare with the float64 reference."""
    worst = 0.0
    for seed in seeds:
        g = torch.Generator().manual_seed(seed)
        inputs = make_inputs(shape, TORCH_DTYPES[dtype], device, g)
        expected = reference(**upcast(inputs))
        before = {k: v.clone() for k, v in inputs.items() if torch.is_tensor(v)}
        for e in _outputs(expected):
            _poison_allocator(tuple(e.shape), TORCH_DTYPES[dtype], device)
        try:
            with _fill_new_memory_with_nan(device):
                out = fn(**inputs)
            if device == "cuda":
                torch.cuda.synchronize()
            err = _compare_all(out, expected, inputs, before, dtype, device, tolerance)
        except NotImplementedError:
            raise
        except CheckFailed as e:
            return Check(False, max(worst, _normwise(out, expected)), seeds, f"seed {seed}: {e}")
        worst = max(worst, err)
    return Check(True, worst, seeds)


def _normwise(out, expected) -> float:
    """The normwise error of a failed output, where it has one (0 where it is not an answer at all)."""
    try:
        got, e = out.detach().to(torch.float64), expected.to(out.device, torch.float64)
        n = torch.linalg.vector_norm(e).item()
        d = torch.linalg.vector_norm(got - e).item()
        return d / n if n else d
    except Exception:
        return 0.0


def _outputs(expected) -> tuple:
    """The reference's outputs: one tensor, or a tuple of them (a fused kernel that writes two tensors)."""
    return tuple(expected) if isinstance(expected, tuple) else (expected,)


def _compare_all(out, expected, inputs: dict, before: dict, dtype: str, device: str,
                 tolerance: float | None = None) -> float:
    """Where the reference returns a tuple, the variant returns a tuple of as many tensors, each checked as
    a single output is, and must not alias another; the error is the worst output's."""
    if not isinstance(expected, tuple):
        return _compare(out, expected, inputs, before, dtype, device, tolerance)
    if type(out) is not tuple or len(out) != len(expected):
        raise CheckFailed(f"returned {type(out).__name__}, not a tuple of {len(expected)} tensors as the reference")
    errs = []
    for i, (o, e) in enumerate(zip(out, expected)):
        for j in range(i):
            if (type(o) is torch.Tensor and type(out[j]) is torch.Tensor and o.numel() and out[j].numel()
                    and _overlaps(o, out[j])):
                raise CheckFailed(f"outputs {j} and {i} alias each other")
        try:
            errs.append(_compare(o, e, inputs, before, dtype, device, tolerance))
        except CheckFailed as err:
            raise CheckFailed(f"output {i}: {err}") from None
    return max(errs)


def _compare(out, expected: torch.Tensor, inputs: dict, before: dict, dtype: str, device: str,
             tolerance: float | None = None) -> float:
    if type(out) is not torch.Tensor:
        raise CheckFailed(f"returned {type(out).__name__}, not a plain torch.Tensor")
    if out.device.type != device:
        raise CheckFailed(f"output on {out.device}, expected {device}")
    for k, v in before.items():
        if not torch.equal(inputs[k], v):
            raise CheckFailed(f"input {k!r} was modified")
        if out.numel() and inputs[k].numel() and _overlaps(out, inputs[k]):
            raise CheckFailed(f"output aliases input {k!r}")
    return compare_output(out, expected, dtype, tolerance)[0]


def _overlaps(a: torch.Tensor, b: torch.Tensor) -> bool:
    sa, sb = a.untyped_storage(), b.untyped_storage()
    a0, b0 = sa.data_ptr(), sb.data_ptr()
    return a0 < b0 + sb.nbytes() and b0 < a0 + sa.nbytes()
