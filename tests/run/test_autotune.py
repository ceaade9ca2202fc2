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


def test_a_kernels_autotuners_compile_ahead_and_still_tune_and_run_as_before(monkeypatch):
    from triton.runtime.autotuner import Autotuner

    mod = types.ModuleType("casebook.kernels._ahead_fixture")
    mod.tuned = _tuned(winner=1)
    monkeypatch.setitem(sys.modules, mod.__name__, mod)
    tuners = autotune.autotuners("casebook.kernels")
    autotune.compile_ahead(tuners)
    autotune.compile_ahead(tuners)  # once is enough: a second pass changes nothing
    assert type(mod.tuned).__mro__[1] is Autotuner and tuners["_ahead_fixture.tuned"] is mod.tuned
    x = torch.randn(100)
    y = torch.empty_like(x)
    mod.tuned[lambda meta: (triton.cdiv(100, meta["BLOCK"]),)](x, y, 100)
    assert torch.equal(x, y) and autotune.picks({"t": mod.tuned}) == {"t": "BLOCK=64 warps=2 stages=2"}
    assert mod.tuned._call_kwargs is None  # nothing of the call kept past it

    order = []
    monkeypatch.setattr(autotune, "_ahead", lambda tuner, configs: order.append(("compile", len(configs))))
    mod.tuned.check_disk_cache(None, mod.tuned.configs, lambda: order.append(("time", 2)))  # no key: timed at once
    assert order == [("compile", 2), ("time", 2)]


def test_candidates_are_timed_for_the_books_span_unless_the_module_chose_a_bench(monkeypatch):
    from triton.runtime.autotuner import Autotuner

    mod = types.ModuleType("casebook.kernels._bench_fixture")
    mod.default = triton.autotune([triton.Config({"BLOCK": 32})], key=["n"])(_copy_kernel)
    mod.chosen = _tuned(winner=0)
    own = mod.chosen.do_bench
    monkeypatch.setitem(sys.modules, mod.__name__, mod)
    assert type(mod.default) is Autotuner and mod.default._do_bench is None  # Triton's own bench, before
    autotune.compile_ahead(autotune.autotuners("casebook.kernels"))
    assert mod.default.do_bench is autotune.quick_bench
    assert mod.chosen.do_bench is own

    spans = []
    monkeypatch.setattr("triton.testing.do_bench", lambda fn, warmup, rep, quantiles: spans.append((warmup, rep)))
    autotune.quick_bench(lambda: None, quantiles=(0.5,))
    from casebook.kernels.device import TUNE_REP_MS, TUNE_WARMUP_MS

    assert spans == [(TUNE_WARMUP_MS, TUNE_REP_MS)] and TUNE_REP_MS < 100


def test_candidates_are_compiled_ahead_in_threads_each_launching_nothing(monkeypatch):
    import threading

    monkeypatch.setattr(autotune, "COMPILE_THREADS", 4)
    seen = []

    def run(*args, **kwargs):
        seen.append((threading.current_thread() is threading.main_thread(), args, kwargs))
        if kwargs["BLOCK"] == 64:
            raise RuntimeError("this candidate does not compile")  # left to the timing, which says so

    tuner = types.SimpleNamespace(fn=types.SimpleNamespace(run=run), nargs={"x_ptr": "x", "n": 7},
                                  _call_kwargs={"grid": (1,), "warmup": False, "EPS": 0.5})
    hooked = triton.Config({"BLOCK": 128}, pre_hook=lambda nargs: None)  # its hook is the timing's to call
    configs = [triton.Config({"BLOCK": b}, num_warps=4) for b in (16, 32, 64)] + [hooked]
    autotune._ahead(tuner, configs)
    assert sorted(kw["BLOCK"] for _, _, kw in seen) == [16, 32, 64]
    assert seen[0][0] and seen[0][2]["BLOCK"] == 16  # the first on the calling thread
    assert all(args == ("x", 7) and kw["warmup"] is True and kw["EPS"] == 0.5 and kw["num_warps"] == 4
               for _, args, kw in seen)
    seen.clear()
    autotune._ahead(types.SimpleNamespace(fn=types.SimpleNamespace(run=run), nargs={"x_ptr": "x"},
                                          _call_kwargs=None), configs)
    assert seen == []  # not inside a call: nothing to compile for


def test_a_pick_kept_on_disk_is_the_devices_that_made_it(monkeypatch):
    """Triton keys its disk cache of picks by compiler and architecture, which an H100 and an H200 share (sm_90):
    casebook's tuners add the device's name, so a pick carried in from one is timed afresh on the other, and a pick
    found is stored under the key the call asked for."""
    from triton.runtime.autotuner import Autotuner

    disk = {}

    def triton_disk_cache(self, tuning_key, configs, bench_fn):  # Triton's, as it behaves: a pick by the key's text
        if str(tuning_key) in disk:
            self.cache[tuning_key] = disk[str(tuning_key)]
            return True
        bench_fn()
        disk[str(tuning_key)] = "picked"
        return False

    monkeypatch.setattr(Autotuner, "check_disk_cache", triton_disk_cache)
    monkeypatch.setattr(autotune, "_ahead", lambda tuner, configs: None)
    mod = types.ModuleType("casebook.kernels._disk_fixture")
    mod.tuned = _tuned(winner=0)
    monkeypatch.setitem(sys.modules, mod.__name__, mod)
    autotune.compile_ahead(autotune.autotuners("casebook.kernels"))
    timed = []

    def on(device: str) -> bool:
        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
        monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: device)
        mod.tuned.cache.clear()
        return mod.tuned.check_disk_cache((100, "torch.float32"), mod.tuned.configs, lambda: timed.append(device))

    assert on("NVIDIA H100 80GB HBM3") is False and timed == ["NVIDIA H100 80GB HBM3"]
    assert on("NVIDIA H100 80GB HBM3") is True and mod.tuned.cache == {(100, "torch.float32"): "picked"}
    assert on("NVIDIA H200") is False and timed[-1] == "NVIDIA H200", "another device's pick is not taken"
    assert sorted(disk) == sorted(str((100, "torch.float32", f"device={d}")) for d in ("NVIDIA H100 80GB HBM3",
                                                                                        "NVIDIA H200"))
