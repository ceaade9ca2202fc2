"""Which configuration each Triton autotuner ran: the choice a timing depends on, stored beside it.

An autotuned kernel picks its configuration (tile shape, warps, stages) by timing the candidates at
its first call of each key, once per process; two processes can pick differently, and the time of
the call follows the pick. Recording the pick per point turns "this point moved between runs" into
"this point ran another configuration" or "the same configuration ran slower".
"""

from __future__ import annotations

import sys


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
