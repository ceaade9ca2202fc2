"""The result document of a run from what it measured: the points, the three levels, the claims, the
protocol and the sources that tie it to its code."""

from __future__ import annotations

import datetime as dt
import math
import os
import re
import shlex
from dataclasses import asdict, replace
from pathlib import Path

from casebook import claims as claims_mod
from casebook import levels, stability
from casebook.case import Case
from casebook.provenance import (
    case_sha256,
    imported_closure,
    kernel_file,
    kernel_sha256,
    measurement_sha256,
)
from casebook.result import RESULT_SCHEMA_VERSION, Result, shape_label
from casebook.run import hardware, interference
from casebook.run.bench import (
    HOST_SLACK_MARGIN,
    HOST_SLACK_US,
    L2_FLUSH_METHOD,
    PIPELINED_CALLS,
    Protocol,
    l2_flush_bytes,
)
from casebook.run.distributed import LOCKSTEP
from casebook.run.plan import CPU_MALLOC, SEED, traffic_task
from casebook.tolerance import ROW_TOLERANCE, TOLERANCE
from casebook.traffic import INTENSITY_TOLERANCE


def command_line(path: Path, only: list[str] | None, quick: bool, counters: bool,
                 argv: list[str] | None = None) -> str:
    """The command a result names: `argv` as one shell line where the caller gave it, else spelled from the
    run's options."""
    if argv:
        return shlex.join(argv)
    return (f"casebook run {path.as_posix()}" + (" --quick" if quick else "")
            + "".join(f" --variant {v}" for v in only or []) + (" --counters" if counters else ""))


def intensity_check(case: Case, payload: dict) -> dict:
    """The declared arithmetic intensity beside the traffic model's at `traffic_task`'s shape and dtype."""
    task = traffic_task(case)
    out = {"shape": task.shape, "dtype": task.dtype, "declared": case.bottleneck.arithmetic_intensity,
           "tolerance": INTENSITY_TOLERANCE}
    traffic = payload.get("traffic") if isinstance(payload.get("traffic"), dict) else payload
    flops, nbytes = traffic.get("flops"), traffic.get("bytes")
    if payload.get("status") != "ok" or not isinstance(nbytes, (int, float)) or not nbytes:
        return {**out, "error": payload.get("error") or "the traffic model gives no bytes"}
    if not isinstance(flops, (int, float)) or not math.isfinite(flops / nbytes):
        return {**out, "error": "the traffic model gives no finite FLOPs"}
    modelled = flops / nbytes
    out["modelled"] = modelled
    if out["declared"] is not None and modelled > 0:
        out["difference"] = out["declared"] / modelled - 1
        out["flagged"] = abs(out["difference"]) > INTENSITY_TOLERANCE
    return out


def assemble(run: dict, protocol: Protocol, groups: dict, outcomes: dict, complete: bool) -> dict:
    """The result document from the variants measured so far: points, the three levels, the claims. A plain
    dict, the run's own assembly: `run_case` validates it into the `Result` that leaves the run."""
    case, on_gpu = run["case"], run["on_gpu"]
    kernel_points, workload_points, e2e_runs, variants = [], [], {}, []
    weights = {shape_label(w.shape): w for w in (case.levels.workload.shapes if on_gpu
                                                 else case.levels.workload.cpu_shapes)}
    for name, g in groups.items():
        v = g["variant"]
        pairs = outcomes[name]
        first_calls = [p.get("first_call_s") for _, p in pairs if p.get("first_call_s") is not None]
        variants.append({"name": name, "note": v.note, "backends": list(v.backends), "device": g["device"],
                         "mode": "timed" if g["timed"] else ("checked" if g["device"] else "skipped"),
                         "first_call_s": first_calls[0] if first_calls else None,
                         "first_call_s_max": max(first_calls) if first_calls else None,
                         **({"wall_s": g["wall_s"], "timed_s": g["timed_s"]} if "wall_s" in g else {})})
        if g["device"] is None:
            shapes = case.levels.kernel.shapes if on_gpu else case.levels.kernel.cpu_shapes
            kernel_points += [{"variant": name, "shape": s, "dtype": d, "status": "skipped",
                               "error": f"no backend of {list(v.backends)} on this machine"}
                              for s in shapes for d in case.levels.kernel.dtypes]
            continue
        for task, p in pairs:
            point = {"variant": name, "shape": task.shape, "dtype": task.dtype, **p}
            point.pop("traceback", None)
            if task.kind == "point" and (unstable := stability.reasons(point, task.device)):
                point["unstable"] = list(dict.fromkeys(point.get("unstable", []) + unstable))  # a kept point's once
            if task.kind == "end_to_end":
                e2e_runs[name] = p
            elif task.level == "kernel":
                kernel_points.append(point)
            else:
                w = weights[shape_label(task.shape)]
                workload_points.append({**point, "weight": w.weight, "source": w.source})

    for points in (kernel_points, workload_points):
        for p, s in zip(points, levels.speedups(points, case.kernel.baseline)):
            if s:
                p["speedup"] = s
    workload = {"dtype": case.levels.workload.dtype, "description": case.levels.workload.description,
                "points": workload_points, "summary": levels.workload_summary(workload_points, case.kernel.baseline)}
    e2e = levels.end_to_end(case.levels.end_to_end, e2e_runs, on_gpu)
    env = {**run["env"], "clocks_end": hardware.clocks(), "load_average_end": interference.load_average()}
    protocol_doc = {**asdict(replace(protocol, cache=case.levels.kernel.cache, graph=case.levels.kernel.graph)),
                    "timer": "cuda events" if on_gpu else "time.perf_counter_ns", "seed": SEED,
                    "tolerances": {d: TOLERANCE[d] for d in {*case.levels.kernel.dtypes, case.levels.workload.dtype}},
                    "row_tolerances": {d: ROW_TOLERANCE[d]
                                       for d in {*case.levels.kernel.dtypes, case.levels.workload.dtype}},
                    "isolation": "one child process per variant, which only runs it; the reference in another, "
                                 "which never runs a variant; outputs judged and times summarised in the parent; a "
                                 "crash or hang is recorded and the rest goes on" + (
                                     "" if on_gpu else "; glibc's allocator kept warm in a child timed on the CPU "
                                     f"(GLIBC_TUNABLES={os.environ.get('GLIBC_TUNABLES') or CPU_MALLOC})"),
                    "transport": run.get("crossing"),
                    "correctness": "2 calls on fresh random inputs before timing, 2 timed repetitions sampled as they "
                                   "returned and 1 kept after an input set was blended at random places, 1 call "
                                   "after timing on new values in the same tensors; float64 "
                                   "reference; normwise and per-row relative error; NaN/Inf fail; the allocator "
                                   "poisoned before every call alike; inputs checked unmodified; each output's "
                                   "checksum taken as it was copied, checked where it is judged"}
    if case.kernel.devices > 1:
        protocol_doc.update(rank_barrier=True, ranks=LOCKSTEP)
    if on_gpu:
        protocol_doc["host_slack"] = (f"device-side delay before each repetition: max({HOST_SLACK_US:g} us, "
                                      f"{HOST_SLACK_MARGIN:g} x the p90 of the warm-up calls' host times, each from "
                                      "a synchronised start)")
        protocol_doc["host_issue"] = ("the lesser of the warm-up calls' median host time from a synchronised start "
                                      f"and the median per call of up to {PIPELINED_CALLS} calls issued back to back")
        if protocol_doc["cache"] == "cold":
            protocol_doc["l2_flush"] = L2_FLUSH_METHOD
        try:
            protocol_doc["l2_flush_bytes"] = l2_flush_bytes()
        except Exception:  # the flush size is a record, not a requirement
            pass
    return {
        "schema_version": RESULT_SCHEMA_VERSION,
        "case_id": case.id,
        **run["sources"],
        "command": run["command"],
        "complete": complete,
        "started_at": run["started"],
        "finished_at": now(),
        "hardware": {**run["ident"], "measured": run["ceilings"]},
        "environment": env,
        "protocol": protocol_doc,
        "variants": variants,
        "kernel_level": kernel_points,
        "workload_level": workload,
        "end_to_end": e2e,
        "counters": [],
        "stability": stability.summary(kernel_points + workload_points),
        "arithmetic_intensity": run.get("intensity"),
        "claims": claims_mod.evaluate(case, run["ident"]["slug"], kernel_points, workload, e2e, _paired(run)),
        **({"argv": list(run["argv"])} if run.get("argv") else {}),
        **({"resumed": run["resumed"]} if run.get("resumed") else {}),
    }


def _paired(run: dict) -> dict:
    """{claims.pair_key(...): the paired timing's payload} of this run so far."""
    return {claims_mod.pair_key(t.variant, t.over, t.shape, t.dtype): p for t, p in run.get("pairs", [])}


def sources_of(path: Path, case, start: dict | None = None, loaded: set | None = None) -> dict:
    """The kernel file and the hashes that tie a result to what it ran, taken as the run starts: a case
    or kernel edited while it runs (its variants import the module one by one) leaves the result stale,
    not falsely current. Again at the end with `loaded`, the kernel modules the children imported (a
    module imported at run time, by name, is no static import): the hash then covers them too, and the
    result names them (`kernel_modules`); where the statically imported part changed meanwhile, the start's
    hash is kept, and the result reads stale."""
    module = case.kernel.module
    source = kernel_file(module)  # where the children import it from (CASEBOOK_KERNELS_PATH included)
    now = {"case_sha256": case_sha256(path), "kernel_file": source.name,
           "kernel_sha256": kernel_sha256(module, source.parent), "measurement_sha256": measurement_sha256(case)}
    if start is None:
        return now
    static = imported_closure(module, source.parent)
    extra = sorted(m for m in (loaded or set()) - static if re.fullmatch(r"[a-z][a-z0-9_]*", m))
    if now["kernel_sha256"] != start["kernel_sha256"] or not extra:
        return start
    return {**start, "kernel_sha256": kernel_sha256(module, source.parent, extra=extra), "kernel_modules": extra}


def now(timespec: str = "seconds") -> str:
    """UTC now, ISO 8601. A run's start to the microsecond: it names the run's file (`results.run_path`), and two
    runs of a case started in the same second are two runs."""
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec=timespec)


def failed(result: Result) -> bool:
    """True when any check failed, any variant crashed or timed out, or any claim failed."""
    points = result.kernel_level + result.workload_level.points
    bad = any(p.status in ("failed", "crashed", "timeout") for p in points)
    bad |= result.end_to_end.status == "failed"
    return bad or any(c.held is False for c in result.claims)
