"""The traffic model checked against the hardware: DRAM bytes read by Nsight Compute, per variant.

Each variant runs once (after a warm-up) under `ncu --clock-control none` between profiler start and
stop marks; the DRAM read and write counters of every kernel in that call are summed and set against
the modelled floor. ncu flushes caches before each kernel it profiles, so these are cold-cache bytes.
Every variant of a case is profiled in one process (on the H200 a process a variant cost about 10 s of
start, imports and ncu's own, 60 s a case); a marker kernel before each call tells their kernels apart.
"""

from __future__ import annotations

import csv
import io
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Callable

from casebook.case import Case
from casebook.result import CounterRow, Result
from casebook.run.check import TORCH_DTYPES
from casebook.run.plan import placement, variant_env

METRICS = ("dram__bytes_read.sum", "dram__bytes_write.sum")
GAP_FLAG = 0.10
"""A measured byte count further than this from the model is flagged."""

VARIANT_TIMEOUT_S = 240
"""The longest one variant may run under ncu (its compile included) before its row says it timed out."""


def _counters_shape(case) -> dict:
    lv = case.levels.kernel
    if lv.counters_shape is not None:
        return lv.counters_shape
    return max(lv.shapes, key=lambda s: _numel(s))


def _numel(shape: dict) -> int:
    n = 1
    for v in shape.values():
        n *= v
    return n


def read(case: Case, result: Result, progress: Callable[[str], None] = print) -> list[CounterRow]:
    """Modelled against measured DRAM bytes for every variant that runs on the GPU (in `result`, the run's
    measurement), at one large shape: rows of `Result.counters`. Every variant in one profiled process, its
    kernels told apart by a marker kernel before each (`_together`); where they cannot be (a variant that broke
    the process, or kernels not where the markers say), a profiled process a variant, as before."""
    ncu = shutil.which("ncu") or next((str(p) for p in Path("/opt/nvidia").glob("nsight-compute/*/ncu")), None)
    if ncu is None or result.hardware.kind != "gpu":
        progress("counters: Nsight Compute (ncu) not found or no GPU here; skipped")
        return []
    shape, dtype = _counters_shape(case), case.levels.kernel.dtypes[0]
    measured_here = {v.name for v in result.variants if v.device == "cuda"}
    todo = [v for v in case.kernel.variants if placement(v, on_gpu=True) == ("cuda", True) and v.name in measured_here]
    if not todo:
        return []
    base = {"module": case.kernel.module, "inputs": case.kernel.inputs, "traffic": case.kernel.traffic,
            "shape": shape, "dtype": dtype}
    progress(f"counters: {len(todo)} variant(s) under ncu, in one process")
    # The variants' children's compile caches and autotuning picks: the profiled process runs the kernels the
    # timing ran (an autotuner choosing afresh there may pick another configuration), and compiles and tunes
    # nothing a run has already (without them it compiled every kernel and tuned every autotuner again)
    env = {**os.environ, **variant_env(interpreted=False, devices=case.kernel.devices)}
    try:
        rows = _together(ncu, base, todo, env)
    except (ValueError, KeyError, TypeError):  # output not as the one process writes it: read it a variant a process
        rows = None
    if rows is None:
        progress("counters: their kernels could not be told apart; a process a variant")
        rows = []
        for v in todo:
            progress(f"counters: {v.name} under ncu")
            rows.append(_alone(ncu, base, v, env))
    return rows


MARK = "spin_kernel"
"""The kernel `torch.cuda._sleep` launches: one before each variant's profiled call, which it splits the
process's kernels at (its own DRAM bytes are none, and it is not counted)."""


def _ncu(ncu: str, spec: dict, timeout_s: float, env: dict) -> subprocess.CompletedProcess | None:
    cmd = [ncu, "--clock-control", "none", "--profile-from-start", "off", "--csv", "--metrics", ",".join(METRICS),
           sys.executable, "-m", "casebook.run.counters", json.dumps(spec)]
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, env=env)
    except subprocess.TimeoutExpired:
        return None


NO_KERNEL = ("no kernel ran in its profiled call: Nsight Compute profiles kernels, and a copy within one device "
             "(`copy_`, `clone`) is a copy-engine transfer, so its DRAM bytes were not read")
"""Why a variant whose call launched no kernel has no counters (the transpose case's `copy` read as 0 bytes)."""


def _named(v, base: dict, **fields) -> CounterRow:
    """A variant's row: which variant, at the counters' shape and dtype, and what was found."""
    return CounterRow(variant=v.name, shape=base["shape"], dtype=base["dtype"], **fields)


def _row(v, base: dict, kernels: list[tuple[str, float, float]] | None, modelled: str | None,
         why: str) -> CounterRow:
    """A variant's row from its kernels' (name, read, write) bytes and the modelled bytes; `why` where none."""
    if kernels is None or modelled is None:
        return _named(v, base, error=why)
    if not kernels:  # nothing measured is not zero bytes measured
        return _named(v, base, modelled_bytes=float(modelled), error=NO_KERNEL)
    read_b, write_b = sum(k[1] for k in kernels), sum(k[2] for k in kernels)
    total, modelled_b = read_b + write_b, float(modelled)
    return _named(v, base, modelled_bytes=modelled_b, measured_bytes=total, read_bytes=read_b, write_bytes=write_b,
                  kernels=len(kernels), gap=total / modelled_b - 1, flagged=abs(total / modelled_b - 1) > GAP_FLAG)


def _alone(ncu: str, base: dict, v, env: dict) -> CounterRow:
    """One variant in a profiled process of its own."""
    proc = _ncu(ncu, {**base, "fn": v.fn}, VARIANT_TIMEOUT_S, env)
    if proc is None:
        return _named(v, base, error=f"ncu timed out after {VARIANT_TIMEOUT_S} s")
    reason = _marked(proc.stdout, "CASEBOOK_NOT_APPLICABLE=")
    if reason is not None:  # the variant's own word that it does not cover this shape
        return _named(v, base, not_applicable=reason)
    return _row(v, base, _kernels(proc.stdout), _marked(proc.stdout, "CASEBOOK_MODELLED_BYTES="),
                f"ncu gave no counters (exit {proc.returncode}): {proc.stderr[-300:]}")


def _together(ncu: str, base: dict, todo: list, env: dict) -> list[CounterRow] | None:
    """Every variant of `todo` in one profiled process, in order, each call behind a marker kernel; None where the
    process did not report every variant (one broke it) or its kernels do not split into one group a variant."""
    proc = _ncu(ncu, {**base, "variants": [[v.name, v.fn] for v in todo]}, VARIANT_TIMEOUT_S * len(todo), env)
    if proc is None:
        return None
    said = [json.loads(line[len("CASEBOOK_VARIANT="):]) for line in proc.stdout.splitlines()
            if line.startswith("CASEBOOK_VARIANT=")]
    if [s.get("name") for s in said] != [v.name for v in todo] or any("error" in s for s in said):
        return None
    groups: list[list] = []
    for kernel in _kernels(proc.stdout) or []:
        if MARK in kernel[0]:
            groups.append([])
        elif groups:
            groups[-1].append(kernel)
        else:
            return None  # a kernel before the first marker: the split would misplace it
    profiled = [v for v, s in zip(todo, said) if s.get("profiled")]
    if len(groups) != len(profiled):
        return None
    modelled = _marked(proc.stdout, "CASEBOOK_MODELLED_BYTES=")
    kernels_of = dict(zip((v.name for v in profiled), groups))
    return [_named(v, base, not_applicable=s["not_applicable"]) if "not_applicable" in s
            else _row(v, base, kernels_of[v.name], modelled, "ncu gave no modelled bytes") for v, s in zip(todo, said)]


def _marked(stdout: str, mark: str) -> str | None:
    """The rest of the child's line that starts with `mark` (ncu's own lines never do)."""
    for line in stdout.splitlines():
        if line.startswith(mark):
            return line[len(mark):]
    return None


def _kernels(stdout: str) -> list[tuple[str, float, float]] | None:
    """Each profiled kernel in ncu's CSV output, in launch order: (name, DRAM bytes read, written); None where
    the output holds no table."""
    lines = [ln for ln in stdout.splitlines() if ln.startswith('"')]
    if not lines:
        return None
    kernels: dict[str, list] = {}
    for r in csv.DictReader(io.StringIO("\n".join(lines))):
        name = r.get("Metric Name")
        if name in METRICS:
            value = float(r["Metric Value"].replace(",", ""))
            unit = r.get("Metric Unit", "byte").lower()
            scale = {"byte": 1, "kbyte": 1e3, "mbyte": 1e6, "gbyte": 1e9}.get(unit, 1)
            k = kernels.setdefault(r.get("ID"), [r.get("Kernel Name") or "", 0.0, 0.0])
            k[1 + METRICS.index(name)] += value * scale
    return [tuple(k) for _, k in sorted(kernels.items(), key=lambda item: int(item[0]) if item[0].isdigit() else 0)]


def _profiled_call(spec: dict) -> None:
    """Child under ncu: warm up, then one call between profiler start and stop."""
    import importlib

    import torch

    mod = importlib.import_module(f"casebook.kernels.{spec['module']}")
    fn = getattr(mod, spec["fn"])
    dtype = TORCH_DTYPES[spec["dtype"]]
    inputs = getattr(mod, spec["inputs"])(spec["shape"], dtype, "cuda", torch.Generator().manual_seed(0))
    try:
        fn(**inputs)
    except NotImplementedError as e:
        print(f"CASEBOOK_NOT_APPLICABLE={' '.join(str(e).split())}")
        return
    for _ in range(2):
        fn(**inputs)
    torch.cuda.synchronize()
    torch.cuda.profiler.start()
    fn(**inputs)
    torch.cuda.synchronize()
    torch.cuda.profiler.stop()
    print(f"CASEBOOK_MODELLED_BYTES={getattr(mod, spec['traffic'])(spec['shape'], dtype).bytes}")


def _profiled_calls(spec: dict) -> None:
    """Child under ncu, for every variant of `spec["variants"]` in turn: fresh inputs, warm-up, then a marker kernel
    and one call between profiler start and stop; a line a variant says what became of it. A variant that raises
    ends the process's work (its device may be left broken): the parent then profiles each in a process of its own."""
    import importlib

    import torch

    mod = importlib.import_module(f"casebook.kernels.{spec['module']}")
    dtype = TORCH_DTYPES[spec["dtype"]]
    for name, fn_name in spec["variants"]:
        fn = getattr(mod, fn_name)
        inputs = getattr(mod, spec["inputs"])(spec["shape"], dtype, "cuda", torch.Generator().manual_seed(0))
        try:
            for _ in range(3):
                fn(**inputs)
            torch.cuda.synchronize()
        except NotImplementedError as e:
            print("CASEBOOK_VARIANT=" + json.dumps({"name": name, "not_applicable": " ".join(str(e).split())}))
            continue
        except Exception as e:
            print("CASEBOOK_VARIANT=" + json.dumps({"name": name, "error": f"{type(e).__name__}: {e}"[:300]}))
            return
        torch.cuda.profiler.start()
        torch.cuda._sleep(1000)  # the marker (`MARK`)
        fn(**inputs)
        torch.cuda.synchronize()
        torch.cuda.profiler.stop()
        print("CASEBOOK_VARIANT=" + json.dumps({"name": name, "profiled": True}), flush=True)
        del inputs
    print(f"CASEBOOK_MODELLED_BYTES={getattr(mod, spec['traffic'])(spec['shape'], dtype).bytes}")


if __name__ == "__main__":
    request = json.loads(sys.argv[1])
    _profiled_calls(request) if "variants" in request else _profiled_call(request)
