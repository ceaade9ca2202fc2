"""Correctness before timing: fresh random inputs, a float64 reference, poisoned outputs, untouched inputs."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Callable

import torch

TOLERANCE = {
    "fp64": 1e-10, "fp32": 1e-5, "tf32": 2e-3, "bf16": 2e-2, "fp16": 4e-3,
    "fp8_e4m3": 1.5e-1, "fp8_e5m2": 2.5e-1, "int8": 0.0, "int32": 0.0, "int64": 0.0,
}
"""Bound on the normwise relative error ||out - ref|| / ||ref|| per input dtype (METHOD.md's ranges)."""

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


def check(fn: Callable[..., torch.Tensor], reference: Callable[..., torch.Tensor],
          make_inputs: Callable[..., dict], shape: dict, dtype: str, device: str, seeds: list[int],
          tolerance: float | None = None) -> Check:
    """Run `fn` on fresh random inputs per seed and compare with the float64 reference."""
    tol = TOLERANCE[dtype] if tolerance is None else tolerance
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
            err = _compare_all(out, expected, inputs, before, dtype, device)
        except NotImplementedError:
            raise
        except CheckFailed as e:
            return Check(False, worst, seeds, f"seed {seed}: {e}")
        worst = max(worst, err)
        if not err <= tol:  # NaN compares false: never passes
            return Check(False, worst, seeds, f"seed {seed}: relative error {err:.3g} over tolerance {tol:.3g}")
    return Check(True, worst, seeds)


def _outputs(expected) -> tuple:
    """The reference's outputs: one tensor, or a tuple of them (a fused kernel that writes two tensors)."""
    return tuple(expected) if isinstance(expected, tuple) else (expected,)


def _compare_all(out, expected, inputs: dict, before: dict, dtype: str, device: str) -> float:
    """Where the reference returns a tuple, the variant returns a tuple of as many tensors, each checked as
    a single output is, and must not alias another; the error is the worst output's."""
    if not isinstance(expected, tuple):
        return _compare(out, expected, inputs, before, dtype, device)
    if type(out) is not tuple or len(out) != len(expected):
        raise CheckFailed(f"returned {type(out).__name__}, not a tuple of {len(expected)} tensors as the reference")
    errs = []
    for i, (o, e) in enumerate(zip(out, expected)):
        try:
            errs.append(_compare(o, e, inputs, before, dtype, device))
        except CheckFailed as err:
            raise CheckFailed(f"output {i}: {err}") from None
        for j in range(i):
            if o.numel() and out[j].numel() and _overlaps(o, out[j]):
                raise CheckFailed(f"outputs {j} and {i} alias each other")
    return max(errs)


def _compare(out, expected: torch.Tensor, inputs: dict, before: dict, dtype: str, device: str) -> float:
    if type(out) is not torch.Tensor:
        raise CheckFailed(f"returned {type(out).__name__}, not a plain torch.Tensor")
    if out.device.type != device:
        raise CheckFailed(f"output on {out.device}, expected {device}")
    if tuple(out.shape) != tuple(expected.shape):
        raise CheckFailed(f"output shape {tuple(out.shape)}, expected {tuple(expected.shape)}")
    want = TORCH_DTYPES[dtype] if expected.is_floating_point() else expected.dtype
    if out.dtype != want:
        raise CheckFailed(f"output dtype {out.dtype}, expected {want}")
    for k, v in before.items():
        if not torch.equal(inputs[k], v):
            raise CheckFailed(f"input {k!r} was modified")
        if out.numel() and inputs[k].numel() and _overlaps(out, inputs[k]):
            raise CheckFailed(f"output aliases input {k!r}")
    got = out.detach().to(torch.float64)
    if not torch.isfinite(got).all():
        bad = (~torch.isfinite(got)).sum().item()
        raise CheckFailed(f"{bad} of {got.numel()} output elements are NaN or Inf (unwritten, or overflow)")
    expected = expected.to(got.device)
    ref_norm = torch.linalg.vector_norm(expected).item()
    diff = torch.linalg.vector_norm(got - expected).item()
    return diff / ref_norm if ref_norm else diff


def _overlaps(a: torch.Tensor, b: torch.Tensor) -> bool:
    sa, sb = a.untyped_storage(), b.untyped_storage()
    a0, b0 = sa.data_ptr(), sb.data_ptr()
    return a0 < b0 + sb.nbytes() and b0 < a0 + sa.nbytes()
