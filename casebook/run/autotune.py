"""Which configuration each Triton autotuner ran: the choice a timing depends on, stored beside it; and the
candidates compiled ahead of their timing, in threads.

An autotuned kernel picks its configuration (tile shape, warps, stages) by timing the candidates at
its first call of each key, once per process; two processes can pick differently, and the time of
the call follows the pick. Recording the pick per point turns "this point moved between runs" into
"this point ran another configuration" or "the same configuration ran slower".
"""

from __future__ import annotations

import functools
import os
import sys
from concurrent.futures import ThreadPoolExecutor

COMPILE_THREADS = max(1, min(8, (os.cpu_count() or 2) // 2))
"""Threads that compile an autotuner's candidates before it times them (`compile_ahead`). Triton's compiler leaves
the GIL in its passes and in ptxas: twelve rmsnorm candidates compiled for sm_90 in 2.3 s on two threads against
4.2 s in turn, on a 2-core machine. Triton compiles each candidate as it first times it, in turn: compiling was
49 s of the 281 s the softmax case took on a fresh H200."""


def autotuners(package: str) -> dict:
    """Every Triton autotuner bound at the top level of the loaded modules of `package`, by
    "module.name" (a kernel module and the shared kernel modules it imports)."""
    try:
        from triton.runtime.autotuner import Autotuner
    except ImportError:  # no Triton: nothing is autotuned
        return {}
    found = {}
    for name, mod in list(sys.modules.items()):
        if mod is None or not name.startswith(package + "."):
            continue
        for attr, obj in vars(mod).items():
            if isinstance(obj, Autotuner):
                found[f"{name.rsplit('.', 1)[-1]}.{attr}"] = obj
    return found


def forget(tuners: dict) -> None:
    """Clear each autotuner's last pick, so that `picks` reports only the calls that follow."""
    for tuner in tuners.values():
        tuner.best_config = None


def picks(tuners: dict) -> dict[str, str]:
    """The configuration each autotuner ran at its last call since `forget`, as "BLOCK_M=128 ... warps=8 stages=3"."""
    return {name: describe(t.best_config) for name, t in sorted(tuners.items())
            if getattr(t, "best_config", None) is not None}


def describe(config) -> str:
    """A Triton Config in one line: its meta-parameters, then warps and stages."""
    meta = " ".join(f"{k}={v}" for k, v in config.kwargs.items())
    return f"{meta} warps={config.num_warps} stages={config.num_stages}".strip()


def compile_ahead(tuners: dict) -> None:
    """Each of `tuners` (Triton's own `Autotuner`s) made to compile all its candidates before it times the first,
    where it is about to time them (`_ahead`), and to time each for the book's span (`quick_bench`) where its module
    left Triton's own: the child does this once it has imported the case's module. The kernels and their candidates
    are the same; when they compile changes, and how long a candidate is timed."""
    try:
        from triton.runtime.autotuner import Autotuner
    except ImportError:
        return
    for tuner in tuners.values():
        if type(tuner) is Autotuner:
            tuner.__class__ = _compiling_class()  # Triton's class, two methods more


@functools.cache
def _compiling_class():
    from triton.runtime.autotuner import Autotuner

    class CompilingAhead(Autotuner):
        """Triton's autotuner, its candidates compiled in threads (`_ahead`) where it is about to time them: when
        the tuning is not in the disk cache, which casebook's children keep (`TRITON_CACHE_AUTOTUNING`). Each is
        timed by the bench its module chose, else by `quick_bench`."""

        @property
        def do_bench(self):
            return getattr(self, "_do_bench", None) or quick_bench

        def run(self, *args, **kwargs):
            self._call_kwargs = kwargs
            try:
                return super().run(*args, **kwargs)
            finally:
                self._call_kwargs = None

        def check_disk_cache(self, tuning_key, configs, bench_fn):
            """Triton's disk cache of picks, keyed by this machine's device too (`machine_key`): Triton keys a
            pick by the compiler and the architecture alone, so an H100's picks, carried in a cache, were an
            H200's. A pick found is stored under the key the call asked for; one timed here, by `bench_fn`."""
            def compiled_then_timed():
                _ahead(self, configs)
                return bench_fn()

            keyed = machine_key(tuning_key) if tuning_key else tuning_key  # no key: Triton times at once
            found = super().check_disk_cache(keyed, configs, compiled_then_timed)
            if keyed in self.cache:
                self.cache[tuning_key] = self.cache.pop(keyed)
            return found

    return CompilingAhead


def machine_key(tuning_key: tuple) -> tuple:
    """An autotuner's key with the device it tunes on: its name (an H100 and an H200 are both sm_90 to Triton,
    and tile and stage picks made on one are not the other's), or the interpreter's."""
    import torch

    device = torch.cuda.get_device_name() if torch.cuda.is_available() else "interpreter"
    return (*tuning_key, f"device={device}")


def quick_bench(kernel_call, quantiles=None):
    """A candidate's timing for a module that left Triton's own (25 ms of warm-up, 100 timed): the book's
    (`device.TUNE_WARMUP_MS`, `TUNE_REP_MS`), as its other modules ask through `device.autotune`. The softmax and
    GEMM modules keep Triton's default in their source, so that their stored results stay current. On a fresh H100
    the softmax ladder's first calls took 102 s with Triton's timing and 61 s with this (the one-pass rung 42 s
    against 21, the online rung 24 against 10)."""
    from triton.testing import do_bench

    from casebook.kernels.device import TUNE_REP_MS, TUNE_WARMUP_MS

    return do_bench(kernel_call, warmup=TUNE_WARMUP_MS, rep=TUNE_REP_MS, quantiles=quantiles)


def _ahead(tuner, configs) -> None:
    """Every candidate of the tuning `tuner` is in now compiled (launching nothing), the first on this thread (the
    kernel's caches for this device are made once), the rest on `COMPILE_THREADS`; the timing then finds each
    compiled. Best effort: a candidate that fails to compile here is left to the timing, which meets the failure
    again and reports it as Triton does."""
    import torch

    call = getattr(tuner, "_call_kwargs", None)
    todo = [c for c in configs if not c.pre_hook]  # a hook is the timing's to call
    if call is None or not tuner.nargs or len(todo) < 2 or COMPILE_THREADS < 2:
        return
    args = list(tuner.nargs.values())
    device = torch.cuda.current_device() if torch.cuda.is_available() else None

    def compile_one(config) -> None:
        try:
            if device is not None:
                torch.cuda.set_device(device)  # a thread starts on device 0
            tuner.fn.run(*args, **{**call, **config.all_kwargs(), "warmup": True})
        except Exception:  # noqa: BLE001 (the timing compiles it again and says why it cannot)
            pass

    compile_one(todo[0])
    with ThreadPoolExecutor(COMPILE_THREADS) as pool:
        list(pool.map(compile_one, todo[1:]))
