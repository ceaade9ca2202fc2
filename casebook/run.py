"""`casebook run`: every variant checked, then timed at the three levels, placed on the roofline,
the claims checked, the result assembled. The library does not print: progress goes to a callback.
"""

from __future__ import annotations

import datetime as dt
import json
import math
import os
import re
import shlex
import threading
import time
from dataclasses import asdict, replace
from pathlib import Path
from typing import Callable

from casebook import claims as claims_mod
from casebook import hardware, interference, judge, levels, stability, transport
from casebook.answers import Answers, default_budget, fixed_seeds
from casebook.bench import CPU, MAX_INPUT_SETS, QUICK, Protocol
from casebook.check import ROW_TOLERANCE, TOLERANCE, TORCH_DTYPES
from casebook.isolate import Worker
from casebook.load import load_case
from casebook.measure import Task, kept_calls
from casebook.measure import work as measure_work
from casebook.oracle import OracleTask
from casebook.oracle import work as oracle_work
from casebook.provenance import (
    case_sha256,
    imported_closure,
    kernel_path,
    kernel_sha256,
    kernel_source,
    measurement_sha256,
)
from casebook.roofline import compute_roof
from casebook.schema import RESULT_SCHEMA_VERSION, Case, ClaimPairedTiming, Point, Result, Variant, shape_label
from casebook.traffic import INTENSITY_TOLERANCE

Progress = Callable[[str, dict], None]
SEED = 20261129


def placement(variant: Variant, on_gpu: bool) -> tuple[str, bool] | None:
    """Where a variant runs on this machine: (device, timed), or None when it cannot run here."""
    if on_gpu and "cuda" in variant.backends:
        return "cuda", True
    if "cpu" in variant.backends:
        return "cpu", True
    if "interpreter" in variant.backends:
        return "cpu", False
    return None


def _roofs(ceilings: dict, dtype: str, link_gbps: float | None = None) -> dict:
    roofs = {"compute_tflops": compute_roof(ceilings["matmul_tflops"], dtype),
             "bandwidth_gbps": ceilings["copy_gbps"], "launch_us": ceilings["launch_us"],
             "graph_launch_us": ceilings["graph_launch_us"], "busy": bool(ceilings.get("unstable"))}
    if link_gbps:
        roofs["link_gbps"] = link_gbps
    return roofs


def plan(case: Case, on_gpu: bool, protocol: Protocol, ceilings: dict, only: list[str] | None = None,
         link_gbps: float | None = None) -> dict:
    """Tasks per variant (one child process each), levels 1 and 2 then level 3. `link_gbps`: a multi-device
    case's measured interconnect ceiling, the roof of its traffic model's link bytes."""
    k, lv = case.kernel, case.levels
    kernel_shapes = lv.kernel.shapes if on_gpu else lv.kernel.cpu_shapes
    workload = lv.workload.shapes if on_gpu else lv.workload.cpu_shapes
    e2e_shape = lv.end_to_end.shape if on_gpu else lv.end_to_end.cpu_shape
    proto = asdict(replace(protocol, cache=lv.kernel.cache, graph=lv.kernel.graph))
    groups: dict[str, dict] = {}
    for v in k.variants:
        if only and v.name not in only and v.name != k.baseline:
            continue
        where = placement(v, on_gpu)
        if where is None:
            groups[v.name] = {"variant": v, "device": None, "timed": False, "tasks": []}
            continue
        device, timed = where
        common = dict(module=k.module, variant=v.name, fn=v.fn, device=device, timed=timed, protocol=proto,
                      tolerance=v.tolerance, reference=v.reference or k.reference, inputs=k.inputs, traffic=k.traffic,
                      devices=k.devices)
        tasks = [Task(kind="point", shape=s, dtype=d, level="kernel", seed=SEED + i,
                      roofs=_roofs(ceilings, d, link_gbps), **common)
                 for i, (s, d) in enumerate((s, d) for s in kernel_shapes for d in lv.kernel.dtypes)]
        tasks += [Task(kind="point", shape=w.shape, dtype=lv.workload.dtype, level="workload", seed=SEED + 1000 + i,
                       roofs=_roofs(ceilings, lv.workload.dtype, link_gbps), **common) for i, w in enumerate(workload)]
        if timed and v.name in (lv.end_to_end.baseline, lv.end_to_end.variant):
            tasks.append(Task(kind="end_to_end", shape=e2e_shape, dtype=lv.end_to_end.dtype, level="end_to_end",
                              seed=SEED + 2000, scenario=lv.end_to_end.scenario,
                              scenario_inputs=lv.end_to_end.inputs, **common))
        groups[v.name] = {"variant": v, "device": device, "timed": timed, "tasks": tasks}
    return groups


def variant_env(*, interpreted: bool, devices: int = 1) -> dict[str, str]:
    """Environment of a variant's child process. Triton's interpreter where Triton kernels are checked
    on a CPU. Inductor's cache (its generated kernels and its autotuning picks) under casebook's cache
    unless the caller chose one: torch.compile benchmarks candidate kernels at its first call and keeps
    the winner there, so consecutive runs measure the same kernels instead of re-deciding per process.
    A multi-device case's children are told its device count (`CASEBOOK_DEVICES`): the reference's child
    makes every rank's inputs without joining the ranks."""
    env = {"TRITON_INTERPRET": "1"} if interpreted else {}
    if devices > 1:
        env["CASEBOOK_DEVICES"] = str(devices)
    if "TORCHINDUCTOR_CACHE_DIR" not in os.environ:
        env["TORCHINDUCTOR_CACHE_DIR"] = str(hardware.CACHE_DIR / "inductor")
    return env


def run_case(path: Path, *, only: list[str] | None = None, quick: bool = False, timeout_s: float = 600.0,
             progress: Progress | None = None, ceilings: dict | None = None,
             checkpoint: Callable[[Result], None] | None = None, counters: bool = False,
             case: Case | None = None, argv: list[str] | None = None, resume: Result | None = None) -> Result:
    """Run one case end to end: plan, run, and the validated `Result` (not yet kept or stored).

    `checkpoint`, if given, receives the result as it stands after each point (marked `complete: false`), so a
    run cut short by a signal or a time limit still leaves everything it measured. With `counters`, the DRAM
    bytes of each GPU variant under Nsight Compute (`casebook.counters`), read after the run is complete and
    handed to `checkpoint` once more: a profiler cut short loses nothing else. `case`: the case at `path`, where
    the caller has loaded it (it is loaded once a run). `argv`: the command line that asked for the run, stored
    with it (`argv`, and `command` as one line: every flag kept, for the page's Reproduce); without it, the
    command is spelled from the options given here. `resume`: a kept run of this case cut short; its points
    measured with the same code, case, harness, machine and protocol are kept, not measured again, and the run
    goes on under its ceilings (`resumable`).
    """
    progress = progress or (lambda event, info: None)
    case = case or load_case(path)
    ident = hardware.identify(devices=case.kernel.devices)
    on_gpu = ident["kind"] == "gpu"
    protocol = QUICK if quick else (Protocol() if on_gpu else CPU)
    sources = _sources(Path(path), case)
    reuse, parts = {}, []
    if resume is not None:
        reuse, why = resumable(resume, case, ident, protocol, sources)
        progress("note", {"message": f"resuming {resume.started_at}: {len(reuse)} points kept" if not why else
                          f"not resuming {resume.started_at}: {why}; measuring afresh"})
        if not why:
            ceilings = resume.hardware.measured.model_dump(mode="json", by_alias=True, exclude_unset=True)
            parts = [*(r.model_dump(mode="json") for r in resume.resumed or []),
                     {"finished_at": resume.finished_at, "resumed_at": _now(), "points": len(reuse)}]
    progress("ceilings", {"hardware": ident["name"]})
    since = time.time()
    run = {"path": Path(path), "case": case, "ident": ident, "on_gpu": on_gpu,
           "command": command_line(Path(path), only, quick, counters, argv), "argv": argv,
           "started": resume.started_at if parts else _now("microseconds"), "resumed": parts,
           "sources": sources, "ceilings": ceilings or hardware.ceilings(), "loaded": set(),
           "env": hardware.environment(), "reuse": reuse}
    run["env"].update(clocks_start=hardware.clocks(), load_average_start=interference.load_average(),
                      cpu_threads=interference.cpu_threads())
    progress("note", {"message": "ceilings: " + ("those of the run resumed" if parts else "given by the caller"
                                                  if ceilings else hardware.provenance_of(run["ceilings"], since))})
    if case.kernel.devices > 1:  # the devices and their link, measured first on ranks of their own: the link's roof
        from casebook.distributed import measure_topology

        progress("topology", {"devices": case.kernel.devices})
        ident["topology"] = measure_topology(case.kernel.devices, "cuda" if on_gpu else "cpu")
    groups = plan(case, on_gpu, protocol, run["ceilings"], only, (ident.get("topology") or {}).get("bus_gbps"))
    progress("plan", {"total": sum(len(g["tasks"]) for g in groups.values()), "variants": list(groups)})

    device = "cuda" if on_gpu else "cpu"
    arena, run["crossing"] = transport.arena_for(device)
    progress("note", {"message": f"crossing: {run['crossing']}"})
    oracle_env = variant_env(interpreted=False, devices=case.kernel.devices)
    with Worker(oracle_work, oracle_env, arena=arena, spill=False) as oracle:  # one oracle: it runs no variant
        run["answers"] = Answers(oracle, timeout_s, default_budget(device))
        outcomes = _measure(run, groups, protocol, timeout_s, progress, checkpoint)
    if parts:  # the points the resumed session kept: those of its plan, not every one the kept run held
        parts[-1]["points"] = sum(1 for pairs in outcomes.values() for _, p in pairs
                                  if isinstance(p.get("harness"), dict) and p["harness"].get("kept"))
    run["sources"] = _sources(Path(path), case, run["sources"], run["loaded"])
    doc = assemble(run, protocol, groups, outcomes, complete=True)
    result = Result.model_validate(doc)
    if counters:
        from casebook import counters as counters_mod

        if checkpoint is not None:
            checkpoint(result)
        rows = counters_mod.read(case, result, progress=lambda msg: progress("note", {"message": msg}))
        result = Result.model_validate({**doc, "counters": rows})
    return result


REUSED = ("ok", "checked", "failed", "skipped")
"""Statuses of a kept run's points that a resumed run keeps: each was measured, or told why it could not be;
a crash or a timeout is tried again."""

RESUME_PROTOCOL = ("warmup_ms", "min_reps", "max_reps", "target_ci", "time_cap_s")
"""What of the timing protocol a kept run must share (its cache and graph are the case's, which
`measurement_sha256` covers)."""


def resumable(kept: Result, case: Case, ident: dict, protocol: Protocol, sources: dict) -> tuple[dict, str | None]:
    """The points of `kept` a run of `case` here may keep, by `point_key`, as the payloads they were judged from;
    or why none: another case, kernel code, measured part of the case, harness, machine or timing protocol."""
    differs = [what for what, a, b in (
        ("case", kept.case_id, case.id),
        ("kernel code (kernel_sha256)", kept.kernel_sha256, sources["kernel_sha256"]),
        ("case's kernel, levels or claims (measurement_sha256)", kept.measurement_sha256,
         sources["measurement_sha256"]),
        ("harness (casebook_sha256)", kept.environment.casebook_sha256, hardware.source_sha256()),
        ("machine", kept.hardware.slug, ident["slug"]),
        ("timing protocol", [getattr(kept.protocol, k) for k in RESUME_PROTOCOL],
         [getattr(protocol, k) for k in RESUME_PROTOCOL])) if a != b]
    if differs:
        return {}, "another " + ", ".join(differs)
    out = {}
    for level, points in (("kernel", kept.kernel_level), ("workload", kept.workload_level.points)):
        for p in points:
            if p.status in REUSED:
                doc = p.model_dump(mode="json", by_alias=True, exclude_unset=True)
                for k in ("variant", "shape", "dtype", "speedup", "weight", "source"):
                    doc.pop(k, None)
                out[point_key(level, p.variant, p.shape, p.dtype)] = doc
    return out, None


def point_key(level: str, variant: str, shape: dict, dtype: str) -> tuple:
    return (level, variant, shape_label(shape), dtype)


def command_line(path: Path, only: list[str] | None, quick: bool, counters: bool,
                 argv: list[str] | None = None) -> str:
    """The command a result names: `argv` as one shell line where the caller gave it, else spelled from the
    run's options."""
    if argv:
        return shlex.join(argv)
    return (f"casebook run {path.as_posix()}" + (" --quick" if quick else "")
            + "".join(f" --variant {v}" for v in only or []) + (" --counters" if counters else ""))


def _measure(run: dict, groups: dict, protocol: Protocol, timeout_s: float, progress: Progress, checkpoint) -> dict:
    """Every group's tasks, the traffic model's intensity and the paired timings, into `run`; the outcomes. After
    each point, the result as it stands goes to `checkpoint`."""
    case = run["case"]
    outcomes: dict[str, list[tuple[Task, dict]]] = {}
    order = [n for n, g in groups.items() if g["tasks"]]
    ahead: _Ahead | None = None
    try:
        for name, g in groups.items():
            tasks, mine = g["tasks"], []
            outcomes[name] = mine

            def done(i, payload, tasks=tasks, mine=mine):
                mine.append((tasks[i], payload))
                progress("task", {"task": tasks[i], "payload": payload})
                if checkpoint is not None:
                    checkpoint(Result.model_validate(assemble(run, protocol, {n: groups[n] for n in outcomes},
                                                              outcomes, complete=False)))

            if not tasks:  # a variant with no backend here
                continue
            t0 = time.perf_counter()
            worker = ahead.take() if ahead is not None else _variant_worker(g, case)
            following = order[order.index(name) + 1:]
            ahead = _Ahead(_variant_worker(groups[following[0]], case)) if run["on_gpu"] and following else None
            execute(tasks, timeout_s=timeout_s, env=_child_env(g, case), on_done=done, loaded=run["loaded"],
                    answers=run["answers"], reuse=run["reuse"], worker=worker)
            _variant_done(g, mine, name, t0, progress)
    finally:
        if ahead is not None:  # cut short: the child started for the next variant ends too
            ahead.take().release()
    return _claims_stage(run, outcomes, protocol, timeout_s, progress)


def _variant_done(g: dict, mine: list, name: str, t0: float, progress: Progress) -> None:
    """A variant's cost, recorded in its group and reported: its wall time, and of it, this session's timed calls."""
    g["wall_s"] = time.perf_counter() - t0
    g["timed_s"] = sum(p["harness"].get("timed_s") or 0.0 for _, p in mine
                       if isinstance(p.get("harness"), dict) and not p["harness"].get("kept"))
    progress("variant", {"name": name, "points": len(mine), "wall_s": g["wall_s"], "timed_s": g["timed_s"],
                         "kept": sum(1 for _, p in mine if p.get("harness", {}).get("kept")),
                         "crossing": sorted({p["harness"]["crossing"] for _, p in mine
                                             if p.get("harness", {}).get("crossing")})})


def _child_env(g: dict, case: Case) -> dict:
    """A variant's child's environment (`variant_env`)."""
    return variant_env(interpreted=g["device"] == "cpu" and not g["timed"], devices=case.kernel.devices)


def _variant_worker(g: dict, case: Case) -> Worker:
    """The child a variant's tasks run in, not yet started: Triton's interpreter where it is only checked, and the
    memory its outputs cross in where its device has some to lend."""
    return Worker(measure_work, _child_env(g, case), arena=transport.arena_for(g["device"])[0])


class _Ahead:
    """A variant's child, started in a thread while the variant before it is measured. On a GPU its start (a new
    interpreter importing torch, Triton and casebook: seconds of host work, nothing on the device until its first
    task) overlaps the GPU's work; a CPU run starts each child in turn, where the start would take a core from the
    timing."""

    def __init__(self, worker: Worker):
        self.worker = worker
        self.thread = threading.Thread(target=worker.start, daemon=True)
        self.thread.start()

    def take(self) -> Worker:
        self.thread.join()
        return self.worker


def _claims_stage(run: dict, outcomes: dict, protocol: Protocol, timeout_s: float, progress: Progress) -> dict:
    """The traffic model's intensity and the paired timings of the speedup claims, into `run`; the outcomes."""
    case = run["case"]
    run["intensity"] = intensity_check(case, run["answers"].oracle.request(traffic_task(case), timeout_s))
    pairs = pair_tasks(case, run["ident"]["slug"], outcomes, protocol)
    if pairs:
        progress("pairs", {"total": len(pairs)})

        def paired(i, payload):
            progress("task", {"task": pairs[i], "payload": payload})

        payloads = execute(pairs, timeout_s=timeout_s, env=variant_env(interpreted=False, devices=case.kernel.devices),
                           on_done=paired, loaded=run["loaded"], answers=run["answers"])
        run["pairs"] = list(zip(pairs, payloads))
    return outcomes


def reference_seeds(task: Task) -> set[int]:
    """The seeds a point's calls may name (`measure._point`): two checks, the contents after timing, and
    the further input sets of a cold graph. A record naming another gets no reference, and fails."""
    return {task.seed, task.seed + 1, task.seed + 3} | {task.seed + 10 + j for j in range(MAX_INPUT_SETS)}


def call_bytes(answers: dict, dtype: str) -> int:
    """The room one call's outputs take in the arena, at the reference's shapes and the point's dtype (`ALIGN`ed
    each): what a variant that returns what the reference does needs. 0 where the reference gave nothing."""
    first = next((e for e in (answers.get("expected") or {}).values() if isinstance(e, dict)), None)
    total = 0
    for e in (first or {}).get("outputs") or []:
        if not hasattr(e, "is_floating_point"):
            continue
        size = TORCH_DTYPES[dtype].itemsize if e.is_floating_point() else e.element_size()
        total += transport.aligned(e.numel() * size)
    return total


def execute(tasks: list[Task], *, timeout_s: float, env: dict, answers: Answers | None = None,
            on_done: Callable[[int, dict], None] | None = None, loaded: set | None = None,
            reuse: dict | None = None, worker: Worker | None = None) -> list[dict]:
    """Each task run in the variant's child (`measure.work`, which only executes), judged here (`casebook.judge`)
    against the reference's answers (`answers`, from a child that never calls a variant; one of its own where not
    given). One payload per task, in order; `loaded` gathers the kernel modules the variant's child imported.
    `reuse`: payloads already measured, by `point_key` (a resumed run's), which are not measured again.

    A point's reference is asked for first: its outputs' shapes set the room the variant's child is lent for
    the outputs of its kept calls (`measure.kept_calls`); on a GPU they cross in device memory
    (`casebook.transport`). Each point records what its measurement cost (`harness`): wall time, the time of its
    timed calls, the wait for the reference, the crossing and the judging. `worker`: the variant's child, where
    the caller has made (or started) it; released at the end either way."""
    out: list[dict] = []
    if not tasks:
        return out
    if answers is None:
        with Worker(oracle_work, env, arena=transport.arena_for(tasks[0].device)[0], spill=False) as oracle:
            return execute(tasks, timeout_s=timeout_s, env=env, on_done=on_done, loaded=loaded, reuse=reuse,
                           answers=Answers(oracle, timeout_s, default_budget(tasks[0].device)))
    if worker is None:
        worker = Worker(measure_work, env, arena=transport.arena_for(tasks[0].device)[0])
    with worker as variant:
        for i, task in enumerate(tasks):
            t0 = time.perf_counter()
            key = point_key(task.level, task.variant, task.shape, task.dtype)
            if task.kind == "point" and reuse and key in reuse:
                payload = {**reuse[key], "harness": {**reuse[key].get("harness", {}), "kept": True}}
            elif task.kind == "pair":
                payload = _sound(task, lambda: judge.pair(variant.request(task, timeout_s)), variant)
            elif task.kind == "end_to_end":
                payload = _sound(task, lambda: _scenario(task, variant, timeout_s, t0), variant)
            else:
                payload = _sound(task, lambda: _point(task, variant, answers, timeout_s, loaded, t0), variant)
            out.append(payload)
            if on_done is not None:
                on_done(i, payload)
    return out


MALFORMED = (AttributeError, TypeError, ValueError, KeyError, IndexError, OverflowError, RecursionError)
"""What judging a child's answer raises where the answer is not in the shape the harness sends (a forged message
the transport could not tell from a true one: right framing, wrong contents)."""


def _sound(task: Task, judged: Callable[[], dict], variant: Worker) -> dict:
    """The record `judged()` makes of a task, where the child's answer makes one: judged without an exception, and
    a valid record (the result's model) of finite numbers. Else the task crashed, with why, and its child is
    replaced: a child that sent a forged answer may still send the true one, which must not answer the next task.
    A malformed answer ends its own task, never the run."""
    try:
        payload = judged()
        json.dumps(payload, allow_nan=False)  # every number finite: a stored result is strict JSON
        if task.kind == "point":
            Point.model_validate({"variant": task.variant, "shape": task.shape, "dtype": task.dtype, **payload})
        elif task.kind == "pair" and payload.get("status") == "ok":
            ClaimPairedTiming.model_validate({"shape": task.shape, "dtype": task.dtype, **payload})
        return payload
    except MALFORMED as e:
        variant.close()
        return {"status": "crashed", "error": f"the child's answer does not make a record ({type(e).__name__}: "
                                              f"{str(e).splitlines()[0][:200] if str(e) else ''})"}


def _scenario(task: Task, variant: Worker, timeout_s: float, t0: float) -> dict:
    """The scenario timed with the variant (level 3), judged, with what it cost."""
    raw = variant.request(task, timeout_s)
    return {**judge.end_to_end(raw, task.dtype), "harness": {
        "wall_s": time.perf_counter() - t0,
        "timed_s": _timed_s(raw.get("scenario_times_us"), raw.get("kernel_times_us"))}}


def _point(task: Task, variant: Worker, answers: Answers, timeout_s: float, loaded: set | None, t0: float) -> dict:
    """One point: the reference's answers, the variant's run with room lent for its outputs, the judgement."""
    fixed = answers.get(task, fixed_seeds(task)) if task.devices == 1 else {"status": "ok", "expected": {}}
    oracle_s = answers.last_s
    room = kept_calls(task.timed) * call_bytes(fixed, task.dtype) if fixed.get("status") == "ok" else 0
    taken = variant.arena.taken if variant.arena is not None else 0
    raw = variant.request(task, timeout_s, room=room)
    transport_s = variant.receive_s
    crossing = "device" if variant.arena is not None and variant.arena.taken > taken else "host"
    if crossing == "host" and room and variant.crossing_error:
        crossing = f"host: the child could not map the memory lent to it ({variant.crossing_error})"
    if loaded is not None and isinstance(raw.get("loaded"), list):
        loaded.update(m for m in raw["loaded"] if isinstance(m, str))
    reference = None
    if raw.get("status") == "ran":
        recs = [r for c in raw.get("rank_calls") or [raw.get("calls") or []] for r in c or []]
        seeds = sorted({r.get("seed") for r in recs if isinstance(r, dict)} & reference_seeds(task))
        have = fixed.get("expected") or {} if fixed.get("status") == "ok" else {}
        more = [s for s in seeds if not isinstance(have.get(str(s)), dict)]  # a cold graph's further input sets
        reference = answers.get(task, more) if more else {**fixed, "expected": {}}
        oracle_s += answers.last_s if more else 0.0
        if reference.get("status") == "ok":  # the answers already here are not asked for (nor held) twice
            reference = {**reference, "expected": {**have, **reference["expected"]},
                         "traffic": reference.get("traffic") or fixed.get("traffic") or {}}
    del fixed
    t1 = time.perf_counter()
    payload = judge.point(task, raw, reference)
    raw.pop("calls", None)  # the outputs: judged, and let go before the next point
    raw.pop("rank_calls", None)
    del reference
    judge.release(task.device)
    t2 = time.perf_counter()
    ranks = raw.get("rank_times_us") if isinstance(raw.get("rank_times_us"), list) else []
    timed_s = max([_timed_s(raw.get("times_us"))] + [_timed_s(r) for r in ranks])  # ranks time side by side
    payload["harness"] = {"wall_s": t2 - t0, "timed_s": timed_s, "oracle_s": oracle_s, "transport_s": transport_s,
                          "judge_s": t2 - t1, "crossing": crossing}
    return payload


def _timed_s(*runs) -> float:
    """Seconds of timed repetitions in the lists of microseconds given (what timing measured, not what it cost)."""
    return sum(t for times in runs if isinstance(times, list) for t in times
               if isinstance(t, (int, float)) and not isinstance(t, bool) and math.isfinite(t)) / 1e6


def traffic_task(case: Case) -> OracleTask:
    """The traffic model at the case's first level-1 (GPU) shape and first dtype, in a child like the rest."""
    k = case.kernel
    return OracleTask(module=k.module, shape=case.levels.kernel.shapes[0], dtype=case.levels.kernel.dtypes[0],
                      device="cpu", traffic=k.traffic)


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


PAIR_TIME_CAP_S = 0.5
"""A paired timing's each measurement stops here at the latest; a shape takes 12 of them."""


def pair_tasks(case: Case, slug: str, outcomes: dict, protocol: Protocol) -> list[Task]:
    """A paired timing (`measure._pair`) for each point of each kernel-level speedup claim that names its
    shapes and applies here, where both variants were timed and measured ok in the ladder."""
    ok = {(t.variant, shape_label(t.shape), t.dtype): t for pairs in outcomes.values()
          for t, p in pairs if t.kind == "point" and t.level == "kernel" and p.get("status") == "ok"}
    cap = min(protocol.time_cap_s, PAIR_TIME_CAP_S)
    tasks, seen = [], set()
    for claim in case.claims:
        if (claim.kind != "speedup" or claim.level != "kernel" or claim.where.shapes is None
                or (claim.hardware is not None and slug not in claim.hardware)):
            continue
        for shape in claim.where.shapes:
            for dtype in claim.where.dtypes or case.levels.kernel.dtypes:
                mine = ok.get((claim.variant, shape_label(shape), dtype))
                over = ok.get((claim.over, shape_label(shape), dtype))
                key = claims_mod.pair_key(claim.variant, claim.over, shape, dtype)
                if mine is None or over is None or mine.device != over.device or key in seen:
                    continue
                seen.add(key)
                tasks.append(replace(mine, kind="pair", over=claim.over, over_fn=over.fn,
                                     protocol={**mine.protocol, "time_cap_s": cap}))
    return tasks


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
                                 "crash or hang is recorded and the rest goes on",
                    "transport": run.get("crossing"),
                    "correctness": "2 calls on fresh random inputs before timing, 2 timed repetitions sampled as they "
                                   "returned, 1 call after timing on new values in the same tensors; float64 "
                                   "reference; normwise and per-row relative error; NaN/Inf fail; the allocator "
                                   "poisoned before every call alike; inputs checked unmodified; each output's "
                                   "checksum taken as it was copied, checked where it is judged"}
    if case.kernel.devices > 1:
        from casebook.distributed import LOCKSTEP

        protocol_doc.update(rank_barrier=True, ranks=LOCKSTEP)
    if on_gpu:
        from casebook.bench import HOST_SLACK_MARGIN, HOST_SLACK_US, L2_FLUSH_METHOD, PIPELINED_CALLS, l2_flush_bytes

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
        "finished_at": _now(),
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


def _sources(path: Path, case, start: dict | None = None, loaded: set | None = None) -> dict:
    """The kernel file and the hashes that tie a result to what it ran, taken as the run starts: a case
    or kernel edited while it runs (its variants import the module one by one) leaves the result stale,
    not falsely current. Again at the end with `loaded`, the kernel modules the children imported (a
    module imported at run time, by name, is no static import): the hash then covers them too, and the
    result names them (`kernel_modules`); where the statically imported part changed meanwhile, the start's
    hash is kept, and the result reads stale."""
    kernel_file = _kernel_file(case.kernel.module)
    module = case.kernel.module
    now = {"case_sha256": case_sha256(path), "kernel_file": kernel_file.name,
           "kernel_sha256": kernel_sha256(module, kernel_file.parent), "measurement_sha256": measurement_sha256(case)}
    if start is None:
        return now
    static = imported_closure(module, kernel_file.parent)
    extra = sorted(m for m in (loaded or set()) - static if re.fullmatch(r"[a-z][a-z0-9_]*", m))
    if now["kernel_sha256"] != start["kernel_sha256"] or not extra:
        return start
    return {**start, "kernel_sha256": kernel_sha256(module, kernel_file.parent, extra=extra), "kernel_modules": extra}


def _kernel_file(module: str) -> Path:
    """The source the children import as `casebook.kernels.<module>` (CASEBOOK_KERNELS_PATH included)."""
    return kernel_source(module) or kernel_path(module)


def _now(timespec: str = "seconds") -> str:
    """UTC now, ISO 8601. A run's start to the microsecond: it names the run's file (`results.run_path`), and two
    runs of a case started in the same second are two runs."""
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec=timespec)


def failed(result: Result) -> bool:
    """True when any check failed, any variant crashed or timed out, or any claim failed."""
    points = result.kernel_level + result.workload_level.points
    bad = any(p.status in ("failed", "crashed", "timeout") for p in points)
    bad |= result.end_to_end.status == "failed"
    return bad or any(c.held is False for c in result.claims)
