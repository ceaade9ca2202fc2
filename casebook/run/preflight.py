"""Bad states found before measuring, each as one located line: a run that cannot end well does not start.

A kernel module named by a valid name with no file behind it (`module: os`), a kernel module that is not
UTF-8 text, a folder the run must write that cannot be written or a disk with no room, a case whose
points would take hours. `casebook run` prints the first and exits 2, with no traceback and no child.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from casebook import provenance
from casebook.load import CaseError, read_case
from casebook.results import runs_dir

MIN_FREE_BYTES = 64 * 2**20
"""Room a run needs where it writes: its kept run, checkpoints, the ceilings cache."""

MAX_POINTS = 2000
"""The most points (variant x shape x dtype) one run may plan: each takes at least its protocol's time cap
(0.5 s on a CPU, 1 s on a GPU) plus two children's checks, so 2000 is about an hour."""

SECONDS_PER_POINT = {"cpu": 0.5, "gpu": 1.0}


def writable_problem(folder: Path, what: str) -> str | None:
    """Why the run could not write under `folder` (None: it can): the nearest folder that exists is
    checked, and the free room on its disk."""
    here = Path(folder).absolute()
    while not here.exists() and here != here.parent:
        here = here.parent
    if not here.is_dir():
        return f"{what} {folder}: {here} is not a folder"
    if not os.access(here, os.W_OK | os.X_OK):
        return f"{what} {folder}: {here} cannot be written (permissions)"
    free = shutil.disk_usage(here).free
    if free < MIN_FREE_BYTES:
        return f"{what} {folder}: the disk holding {here} has {free / 2**20:.0f} MiB free (a run needs " \
               f"{MIN_FREE_BYTES / 2**20:.0f} MiB)"
    return None


def planned_points(case) -> int:
    """Points a run of `case` would measure on the larger of its GPU and CPU shape lists."""
    k, lv = case.kernel, case.levels
    shapes = max(len(lv.kernel.shapes), len(lv.kernel.cpu_shapes)) * len(lv.kernel.dtypes)
    shapes += max(len(lv.workload.shapes), len(lv.workload.cpu_shapes))
    return len(k.variants) * shapes


def problems(path: Path, results_dir: Path | None = None, loaded: tuple | None = None) -> list[str]:
    """Every bad state of running the case at `path` here, one line each (empty: none found). `results_dir`:
    where the run will be stored (`--save`), checked for room and permission; `loaded`: the case and its
    lines (`load.read_case`), where the caller has read them already."""
    try:
        case, lines = loaded or read_case(path)
    except CaseError as e:
        return [str(p) for p in e.errors]
    out = []
    module = case.kernel.module
    source = provenance.kernel_source(module)
    if source is None:
        out.append(str(lines.error(("kernel", "module"), f"no kernel module casebook/kernels/{module}.py (a valid "
                                                         "name, but no file of that name in the kernels package)")))
    else:
        try:
            source.read_bytes().decode("utf-8")
        except UnicodeDecodeError as e:
            out.append(str(lines.error(("kernel", "module"), f"casebook/kernels/{module}.py is not UTF-8 text "
                                                             f"(byte {e.start}); save it as UTF-8")))
        except OSError as e:
            out.append(str(lines.error(("kernel", "module"), f"casebook/kernels/{module}.py cannot be read: "
                                                             f"{e.strerror}")))
    n = planned_points(case)
    if n > MAX_POINTS:
        hours = n * SECONDS_PER_POINT["gpu"] / 3600
        out.append(str(lines.error(("levels",), f"{n} points ({len(case.kernel.variants)} variants over the "
                                                f"shapes and dtypes) would take at least {hours:.1f} h; at most "
                                                f"{MAX_POINTS} points a run: split the case, or sample its shapes")))
    for folder, what in ((runs_dir(), "the runs folder"), (results_dir, "the results folder")):
        if folder is not None and (why := writable_problem(folder, what)):
            out.append(f"{path}:1: run: {why}")
    return out
