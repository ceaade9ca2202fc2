"""A variant checked in this process and judged as `casebook run` judges it: each call's outputs recorded as the
variant's child records them (`child.record`: copied, checksummed, inputs compared, aliasing found), read as the
parent reads them (`messages.Call`) and judged
by `judge.judge_call` against the float64 reference, the one correctness path. For the kernel tests, which import
the kernel module anyway. Stricter than a run in one way: on a CPU every tensor the call allocates is NaN-filled
(torch's deterministic mode), which a run does not do, since a flag set only while checking would tell a
variant it is being checked."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Callable

import torch

from casebook.run.check import TORCH_DTYPES, CheckFailed, reference_inputs
from casebook.run.child import clone_inputs, record
from casebook.run.judge import judge_call
from casebook.run.messages import Call, Expected


@dataclass(frozen=True)
class Check:
    correct: bool
    max_rel_err: float
    seeds: list[int]
    error: str | None = None


def check(fn: Callable[..., torch.Tensor], reference: Callable[..., torch.Tensor],
          make_inputs: Callable[..., dict], shape: dict, dtype: str, device: str, seeds: list[int],
          tolerance: float | None = None) -> Check:
    """Run `fn` on fresh random inputs per seed and judge each call against the float64 reference."""
    worst = 0.0
    for seed in seeds:
        inputs = make_inputs(shape, TORCH_DTYPES[dtype], device, torch.Generator().manual_seed(seed))
        expected = reference(**reference_inputs(reference, inputs))
        outputs = tuple(expected) if isinstance(expected, tuple) else (expected,)
        answer = Expected(tuple=isinstance(expected, tuple), outputs=[e.detach() for e in outputs])
        before = clone_inputs(inputs)
        for e in outputs:
            _poison_allocator(tuple(e.shape), TORCH_DTYPES[dtype], device)
        with _fill_new_memory_with_nan(device):
            out = fn(**inputs)
        if device == "cuda":
            torch.cuda.synchronize()
        try:
            call = Call.model_validate(record("check", seed, out, inputs, before), strict=True)
            err, _ = judge_call(call, answer, device, dtype, tolerance)
        except CheckFailed as e:
            return Check(False, max(worst, normwise(out, expected)), seeds, f"seed {seed}: {e}")
        worst = max(worst, err)
    return Check(True, worst, seeds)


def normwise(out, expected) -> float:
    """The normwise error of a failed output, where it has one (0 where it is not an answer at all)."""
    try:
        got, e = out.detach().to(torch.float64), expected.to(out.device, torch.float64)
        n = torch.linalg.vector_norm(e).item()
        d = torch.linalg.vector_norm(got - e).item()
        return d / n if n else d
    except Exception:
        return 0.0


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
