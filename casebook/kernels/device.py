"""Device helpers that every kernel module needs: the interpreter switch, device-side random inputs,
the float64 reference's device, the SM count and the `torch.compile` rung.

New kernel modules import these instead of copying them. (The softmax and GEMM modules keep their own
copies until their stored H200 results are re-measured: a kernel module's hash is part of its result.)
"""

from __future__ import annotations

import functools
import os
from typing import Callable

import torch

INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
"""True when Triton kernels run in the interpreter (on CPU tensors): launchers pick tiny configs."""

INTERPRETER_SMS = 3
"""Programs of a persistent grid under the interpreter: small and odd, so loops wrap unevenly."""


def on_device(generator: torch.Generator, device: str | torch.device) -> torch.Generator:
    """A generator on `device` seeded from `generator`: large inputs are drawn where they live
    (drawing gigabytes on the CPU and copying them takes seconds per check)."""
    seed = int(torch.randint(2**62, (1,), generator=generator))
    return torch.Generator(device=device).manual_seed(seed)


def reference_device() -> torch.device:
    """Where float64 references compute: a GPU when there is one, else the CPU."""
    return torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")


@functools.cache
def _properties(index: int):
    # torch looks the properties up on every call; they do not change while the process lives.
    return torch.cuda.get_device_properties(index)


def num_sms(t: torch.Tensor) -> int:
    """Programs of a persistent grid: the SM count on a GPU, `INTERPRETER_SMS` elsewhere."""
    if t.is_cuda:
        return _properties(t.device.index or 0).multi_processor_count
    return INTERPRETER_SMS


def compiled(fn: Callable, **options) -> Callable:
    """`torch.compile(fn, **options)` (e.g. `mode="reduce-overhead"`), compiled once per process,
    keeping every (shape, dtype) graph.

    Each shape of a ladder is its own graph (`dynamic=False`, as a benchmark of one shape wants);
    dynamo's default recompile limit (8) would fall back to eager past the eighth.
    """

    @functools.cache
    def build():
        import torch._dynamo as dynamo

        for knob in ("recompile_limit", "cache_size_limit"):
            if hasattr(dynamo.config, knob):
                setattr(dynamo.config, knob, 256)
        return torch.compile(fn, dynamic=False, **options)

    @functools.wraps(fn)
    def call(*args, **kwargs):
        return build()(*args, **kwargs)

    return call


def peer(module: str, x: torch.Tensor, what: str):
    """A peer library's module for a peer rung (the `peers` extra installs it), imported at the call, or
    NotImplementedError with the reason: not installed, or `x` is not on a GPU (peers' Triton kernels
    are written for one; Liger's fail under TRITON_INTERPRET, calling .to() on a scalar argument that
    the interpreter passes as a Python float). The run records the point as skipped with that reason."""
    import importlib

    try:
        ops = importlib.import_module(module)
    except ImportError as e:
        raise NotImplementedError(f"{what}: {module.split('.')[0]} is not installed "
                                  f"(pip install -e '.[peers]'): {e}") from None
    if not x.is_cuda:
        raise NotImplementedError(f"{what} runs on a GPU only: its Triton kernels fail under TRITON_INTERPRET")
    return ops


TUNE_WARMUP_MS, TUNE_REP_MS = 5, 20
"""How long `autotune` warms each candidate configuration up and times it, in ms (Triton's own default: 25 and
100). Timing the candidates was 36 s of the 281 s the softmax case took on a fresh H200 (compiling them, 49 s
more); 20 ms is still 20 calls of a 1 ms kernel and hundreds of a 10 us one, each behind an L2 flush, and
the pick is the median's."""


def _tune_bench(fn: Callable, quantiles=None):
    from triton.testing import do_bench

    return do_bench(fn, warmup=TUNE_WARMUP_MS, rep=TUNE_REP_MS, quantiles=quantiles)


def autotune(configs, key, **options):
    """`triton.autotune(configs, key, **options)`, each candidate timed for `TUNE_REP_MS`: the book's kernels
    are autotuned at every shape of a ladder on a fresh machine, so the tuning's own time is the run's."""
    import triton

    return triton.autotune(configs, key, do_bench=_tune_bench, **options)
