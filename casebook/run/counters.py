"""The traffic model checked against the hardware: DRAM bytes read by Nsight Compute, per variant.

Each variant runs once (after a warm-up) under `ncu --clock-control none` between profiler start and
stop marks; the DRAM read and write counters of every kernel in that call are summed and set against
the modelled floor. ncu flushes caches before each kernel it profiles, so these are cold-cache bytes.
"""

from __future__ import annotations

import csv
import io
import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Callable

from casebook.case import Case
from casebook.result import Result
from casebook.run.check import TORCH_DTYPES
from casebook.run.plan import placement

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


def read(case: Case, result: Result, progress: Callable[[str], None] = print) -> list[dict]:
    """Modelled against measured DRAM bytes for every variant that runs on the GPU (in `result`, the run's
    measurement), at one large shape: rows of `Result.counters`."""
    ncu = shutil.which("ncu") or next((str(p) for p in Path("/opt/nvidia").glob("nsight-compute/*/ncu")), None)
    if ncu is None or result.hardware.kind != "gpu":
        progress("counters: Nsight Compute (ncu) not found or no GPU here; skipped")
        return []
    shape, dtype = _counters_shape(case), case.levels.kernel.dtypes[0]
    rows = []
    measured_here = {v.name for v in result.variants if v.device == "cuda"}
    for v in case.kernel.variants:
        if placement(v, on_gpu=True) != ("cuda", True) or v.name not in measured_here:
            continue
        progress(f"counters: {v.name} under ncu")
        spec = json.dumps({"module": case.kernel.module, "fn": v.fn, "inputs": case.kernel.inputs,
                           "traffic": case.kernel.traffic, "shape": shape, "dtype": dtype})
        cmd = [ncu, "--clock-control", "none", "--profile-from-start", "off", "--csv", "--metrics", ",".join(METRICS),
               sys.executable, "-m", "casebook.run.counters", spec]
        row = {"variant": v.name, "shape": shape, "dtype": dtype}
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=VARIANT_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            rows.append({**row, "error": f"ncu timed out after {VARIANT_TIMEOUT_S} s"})
            continue
        reason = _marked(proc.stdout, "CASEBOOK_NOT_APPLICABLE=")
        if reason is not None:  # the variant's own word that it does not cover this shape
            rows.append({**row, "not_applicable": reason})
            continue
        modelled = _marked(proc.stdout, "CASEBOOK_MODELLED_BYTES=")
        measured = _parse(proc.stdout)
        if measured is None or modelled is None:
            rows.append({**row, "error": f"ncu gave no counters (exit {proc.returncode}): {proc.stderr[-300:]}"})
            continue
        read_b, write_b, kernels = measured
        total = read_b + write_b
        modelled = float(modelled)
        rows.append({**row, "modelled_bytes": modelled, "measured_bytes": total, "read_bytes": read_b,
                     "write_bytes": write_b, "kernels": kernels, "gap": total / modelled - 1,
                     "flagged": abs(total / modelled - 1) > GAP_FLAG})
    return rows


def _marked(stdout: str, mark: str) -> str | None:
    """The rest of the child's line that starts with `mark` (ncu's own lines never do)."""
    for line in stdout.splitlines():
        if line.startswith(mark):
            return line[len(mark):]
    return None


def _parse(stdout: str) -> tuple[float, float, int] | None:
    """Sum the DRAM counters over every kernel in ncu's CSV output."""
    lines = [ln for ln in stdout.splitlines() if ln.startswith('"')]
    if not lines:
        return None
    totals = {m: 0.0 for m in METRICS}
    kernels = set()
    for r in csv.DictReader(io.StringIO("\n".join(lines))):
        name = r.get("Metric Name")
        if name in totals:
            value = float(r["Metric Value"].replace(",", ""))
            unit = r.get("Metric Unit", "byte").lower()
            scale = {"byte": 1, "kbyte": 1e3, "mbyte": 1e6, "gbyte": 1e9}.get(unit, 1)
            totals[name] += value * scale
            kernels.add(r.get("ID"))
    return totals[METRICS[0]], totals[METRICS[1]], len(kernels)


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


if __name__ == "__main__":
    _profiled_call(json.loads(sys.argv[1]))
