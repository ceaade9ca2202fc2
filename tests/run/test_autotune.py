"""casebook.run.autotune: finding the kernel modules' autotuners and naming the configuration each one ran."""

from __future__ import annotations

import os

os.environ["TRITON_INTERPRET"] = "1"  # before the kernel below is decorated: @triton.jit reads it then

import sys
import types

import torch
import triton
import triton.language as tl

from casebook.run import autotune


@triton.jit
def _copy_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(y_ptr + offs, tl.load(x_ptr + offs, mask=offs < n), mask=offs < n)


def _tuned(winner: int):
    """An autotuned copy whose benchmark ranks configuration `winner` first (no GPU timer needed)."""
    configs = [triton.Config({"BLOCK": 32}, num_warps=1, num_stages=1),
               triton.Config({"BLOCK": 64}, num_warps=2, num_stages=2)]
    ranks = iter([0.0, 1.0] if winner == 0 else [1.0, 0.0])

    def bench(kernel_call, quantiles):
        kernel_call()
        rank = next(ranks)
        return [rank] * len(quantiles)

    return triton.autotune(configs, key=["n"], do_bench=bench)(_copy_kernel)


def test_picks_name_the_configuration_each_autotuner_ran(monkeypatch):
    mod = types.ModuleType("casebook.kernels._tuned_fixture")
    mod.first, mod.second, mod.plain = _tuned(winner=1), _tuned(winner=0), _copy_kernel
    monkeypatch.setitem(sys.modules, mod.__name__, mod)
    tuners = autotune.autotuners("casebook.kernels")
    assert tuners["_tuned_fixture.first"] is mod.first and "_tuned_fixture.plain" not in tuners

    autotune.forget(tuners)
    assert autotune.picks(tuners) == {}
    x = torch.randn(100)
    y = torch.empty_like(x)
    mod.first[lambda meta: (triton.cdiv(100, meta["BLOCK"]),)](x, y, 100)
    assert torch.equal(x, y)
    # Only the autotuner that ran since `forget` is reported, with the configuration its benchmark chose.
    assert autotune.picks(tuners) == {"_tuned_fixture.first": "BLOCK=64 warps=2 stages=2"}


def test_modules_outside_the_package_are_not_searched(monkeypatch):
    mod = types.ModuleType("elsewhere_tuned")
    mod.tuned = _tuned(winner=0)
    monkeypatch.setitem(sys.modules, mod.__name__, mod)
    assert not any(name.startswith("elsewhere") for name in autotune.autotuners("casebook.kernels"))
