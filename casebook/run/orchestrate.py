"""`casebook run`: every variant checked, then timed at the three levels, placed on the roofline,
the claims checked, the result assembled. The library does not print: progress goes to a callback.
"""

from __future__ import annotations

import contextlib
import math
import os
import time
from pathlib import Path
from typing import Callable

from pydantic import ValidationError

from casebook.case import Case
from casebook.claims import Unpaired
from casebook.levels import Scenario
from casebook.load import load_case
from casebook.result import Ceilings, ClaimPairedTiming, HarnessCost, Point, Result, ResumedPart, first_error
from casebook.run import counters as counters_mod
from casebook.run import hardware, interference, judge, transport
from casebook.run.answers import Answers, default_budget, fixed_seeds
from casebook.run.assemble import Run, assemble, command_line, intensity_check, now, sources_of
from casebook.run.bench import CPU, MAX_INPUT_SETS, QUICK, Protocol
from casebook.run.check import TORCH_DTYPES
from casebook.run.child import Task, kept_calls
from casebook.run.child import work as measure_work
from casebook.run.inputs import unblended
from casebook.run.isolate import Worker
from casebook.run.messages import (
    Answer,
    Call,
    Malformed,
    PairRun,
    PointRun,
    Ran,
    ScenarioRun,
    Stopped,
    read,
)
from casebook.run.oracle import work as oracle_work
from casebook.run.plan import Group, pair_tasks, plan, traffic_task, variant_env
from casebook.run.rank import measure_topology
from casebook.run.resume import point_key, resumable

Progress = Callable[[str, dict], None]


def run_case(path: Path, *, only: list[str] | None = None, quick: bool = False, timeout_s: float = 600.0,
             progress: Progress | None = None, ceilings: dict | None = None,
             checkpoint: Callable[[Result], None] | None = None, counters: bool = False,
             case: Case | None = None, argv: list[str] | None = None, resume: Result | None = None,
             gate: Callable[[], None] | None = None) -> Result:
    """Run one case end to end: plan, run, and the validated `Result` (not yet kept or stored).

    `checkpoint`, if given, receives the result as it stands after each point (marked `complete: false`), so a
    run cut short by a signal or a time limit still leaves everything it measured. With `counters`, the DRAM
    bytes of each GPU variant under Nsight Compute (`casebook.run.counters`), read after the run is complete and
    handed to `checkpoint` once more: a profiler cut short loses nothing else. `case`: the case at `path`, where
    the caller has loaded it (it is loaded once a run). `argv`: the command line that asked for the run, stored
    with it (`argv`, and `command` as one line: every flag kept, for the page's Reproduce); without it, the
    command is spelled from the options given here. `resume`: a kept run of this case cut short; its points
    measured with the same code, case, harness, machine and protocol are kept, not measured again, and the run
    goes on under its ceilings (`resumable`). `gate`: called once the children that start early have started and
    before anything else touches the device (the ceilings, the plan's work); it returns when the device is this
    run's. A pool prestarts the next case of a busy GPU this way (`casebook.run.pool`).
    """
    progress = progress or (lambda event, info: None)
    case = case or load_case(path)
    ident = hardware.identify(devices=case.kernel.devices)
    on_gpu = ident.kind == "gpu"
    protocol = QUICK if quick else (Protocol() if on_gpu else CPU)
    sources = sources_of(Path(path), case)
    reuse, parts = {}, []
    if resume is not None:
        reuse, why = resumable(resume, case, ident, protocol, sources)
        progress("note", {"message": f"resuming {resume.started_at}: {len(reuse)} points kept" if not why else
                          f"not resuming {resume.started_at}: {why}; measuring afresh"})
        if not why:
            parts = [*(resume.resumed or []),
                     ResumedPart(finished_at=resume.finished_at, resumed_at=now(), points=len(reuse))]
    device = "cuda" if on_gpu else "cpu"
    arena, crossing = transport.arena_for(device)
    early = on_gpu and case.kernel.devices == 1
    with contextlib.ExitStack() as children:
        oracle = children.enter_context(Worker(oracle_work, variant_env(interpreted=False, devices=case.kernel.devices),
                                               arena=arena, spill=False, warm=_warm(case, device)))  # runs no variant
        first = None
        if early:  # the reference's child and the first variant's start now, beside the ceilings: their imports and
            # the device's context are seconds of host work the first point waited for (a CPU run starts each in
            # turn, a start would take a core from the ceilings; a multi-device case measures its link first)
            first = children.enter_context(_variant_worker(case, device, timed=True))
            oracle.start()
            first.start()
        if gate is not None:
            gate()
        progress("ceilings", {"hardware": ident.name})
        measured, said = _ceilings(resume if parts else None, ceilings)
        run = Run(path=Path(path), case=case, ident=ident, argv=argv,
                  command=command_line(Path(path), only, quick, counters, argv),
                  started=resume.started_at if parts else now("microseconds"), resumed=parts, sources=sources,
                  ceilings=measured, reuse=reuse,
                  env={**hardware.environment(), "clocks_start": hardware.clocks(),
                       "load_average_start": interference.load_average(),
                       "cpu_threads": interference.cpu_threads()})
        progress("note", {"message": f"ceilings: {said}"})
        link_gbps = None
        if case.kernel.devices > 1:  # the devices and their link, measured first on ranks of their own: its roof
            progress("topology", {"devices": case.kernel.devices})
            ident.topology = measure_topology(case.kernel.devices, device)
            link_gbps = ident.topology.bus_gbps
        groups = plan(case, on_gpu, protocol, run.ceilings, only, link_gbps)
        progress("plan", {"total": sum(len(g.tasks) for g in groups.values()), "variants": list(groups)})

        run.crossing = crossing
        progress("note", {"message": f"crossing: {run.crossing}"})
        if on_gpu:
            progress("note", {"message": f"GPU readings: {interference.gpu_reader()}"})
        oracle.start()  # on a CPU: its start (seconds of imports) goes on beside the first variant's child's
        run.answers = Answers(oracle, timeout_s, default_budget(device))
        _measure(run, groups, protocol, timeout_s, progress, checkpoint, first)
    if parts:  # the points kept from the run cut short: those of this plan, not every one that run held
        parts[-1].points = sum(1 for g in groups.values() for _, p in g.outcomes if p.harness and p.harness.kept)
    run.sources = sources_of(Path(path), case, run.sources, run.loaded)
    result = assemble(run, protocol, groups, complete=True)
    if counters:
        if checkpoint is not None:
            checkpoint(result)
        t0 = time.perf_counter()
        rows = counters_mod.read(case, result, progress=lambda msg: progress("note", {"message": msg}))
        result = result.model_copy(update={"counters": rows, "counters_s": round(time.perf_counter() - t0, 1)})
    return result


def _ceilings(resumed: Result | None, given: dict | None) -> tuple[Ceilings, str]:
    """The ceilings a run is placed under, and whence, in words: those of the run it resumes, those its caller
    gave (a pool's workers share one measurement), or this machine's (`hardware.ceilings`: cached, or measured
    now)."""
    if resumed is not None:
        return resumed.hardware.measured, "those of the run resumed"
    if given:
        return Ceilings.model_validate(given), "given by the caller"
    since = time.time()
    mine = hardware.ceilings()
    return Ceilings.model_validate(mine), hardware.provenance_of(mine, since)


def _measure(run: Run, groups: dict[str, Group], protocol: Protocol, timeout_s: float, progress: Progress,
             checkpoint, first: Worker | None = None) -> None:
    """Every group's tasks, the traffic model's intensity and the paired timings, into `groups` and `run`. After
    each point, the result as it stands goes to `checkpoint`. `first`: a GPU variant's child started before the plan
    was known, which the first variant takes where it runs on the GPU (every GPU variant's child is made alike,
    `_variant_worker`)."""
    case = run.case
    order = [n for n, g in groups.items() if g.tasks]
    ahead = first if order and groups[order[0]].device == "cuda" else None
    try:
        for n, (name, g) in enumerate(groups.items()):

            def done(i, record, g=g, n=n):
                g.outcomes.append((g.tasks[i], record))
                progress("task", {"task": g.tasks[i], "record": record})
                if checkpoint is not None:  # the variants so far
                    checkpoint(assemble(run, protocol, dict(list(groups.items())[:n + 1]), complete=False))

            if not g.tasks:  # a variant with no backend here
                continue
            t0 = time.perf_counter()
            worker = ahead if ahead is not None else _variant_worker(case, g.device, g.timed)
            worker.start()  # the first variant's child starts beside the reference's; the others have started
            following = order[order.index(name) + 1:]
            # On a GPU the next variant's child starts now, its start overlapping this variant's GPU work; a CPU
            # run starts each child in turn (a start would take a core from the timing).
            ahead = None
            if run.on_gpu and following:
                ahead = _variant_worker(case, groups[following[0]].device, groups[following[0]].timed)
                ahead.start()
            if name == order[0]:  # the reference's child's start is the run's, not the first point's: with the
                # ceilings cached the first point waited 7.2 s for it (H200), read as what judging the point cost
                t1 = time.perf_counter()
                run.answers.oracle.greet()
                progress("note", {"message": f"the reference's child ready in {time.perf_counter() - t1:.1f} s"})
            execute(g.tasks, timeout_s=timeout_s, env=_child_env(case, g.device, g.timed), on_done=done,
                    loaded=run.loaded, answers=run.answers, reuse=run.reuse, worker=worker)
            _variant_done(g, name, t0, progress)
    finally:
        if ahead is not None:  # cut short: the child started for the next variant ends too
            ahead.release()
    _claims_stage(run, groups, protocol, timeout_s, progress)


def _variant_done(g: Group, name: str, t0: float, progress: Progress) -> None:
    """A variant's cost, recorded in its group and reported: its wall time, and of it, the timed calls measured now
    (not those kept from a run cut short)."""
    costs = [p.harness for _, p in g.outcomes if p.harness is not None]
    g.wall_s = time.perf_counter() - t0
    g.timed_s = sum(h.timed_s or 0.0 for h in costs if not h.kept)
    progress("variant", {"name": name, "points": len(g.outcomes), "wall_s": g.wall_s, "timed_s": g.timed_s,
                         "kept": sum(1 for h in costs if h.kept),
                         "crossing": sorted({h.crossing for h in costs if h.crossing})})


def _child_env(case: Case, device: str, timed: bool) -> dict:
    """The environment of a variant's child on `device` (`variant_env`): a CPU's checks through Triton's
    interpreter, its timings with a warm allocator."""
    on_cpu = device == "cpu"
    return variant_env(interpreted=on_cpu and not timed, devices=case.kernel.devices, cpu=on_cpu and timed)


def _variant_worker(case: Case, device: str, timed: bool) -> Worker:
    """The child a variant's tasks run in, not yet started: its environment (`_child_env`), and the memory its
    outputs cross in where its device has some to lend; on a GPU, the case's module imported and the device's
    context made before it greets."""
    return Worker(measure_work, _child_env(case, device, timed), arena=transport.arena_for(device)[0],
                  warm=_warm(case, device))


def _warm(case: Case, device: str) -> tuple[str, str] | None:
    """What a child on `device` opens before it greets (`isolate.warm`): on a GPU, the case's module and the device;
    on a CPU nothing (a start would take a core from the timing)."""
    return (case.kernel.module, device) if device == "cuda" else None


def _claims_stage(run: Run, groups: dict[str, Group], protocol: Protocol, timeout_s: float,
                  progress: Progress) -> None:
    """The traffic model's intensity and the paired timings of the speedup claims, into `run`."""
    case = run.case
    run.intensity = intensity_check(case, read(Answer, run.answers.oracle.request(traffic_task(case), timeout_s)))
    pairs = pair_tasks(case, run.ident.slug, groups, protocol)
    if pairs:
        progress("pairs", {"total": len(pairs)})

        def paired(i, record):
            progress("task", {"task": pairs[i], "record": record})

        env = variant_env(interpreted=False, devices=case.kernel.devices, cpu=not run.on_gpu)
        records = execute(pairs, timeout_s=timeout_s, env=env, on_done=paired, loaded=run.loaded,
                          answers=run.answers)
        run.pairs = list(zip(pairs, records))


def reference_seeds(task: Task) -> set[int]:
    """The seeds a point's calls may name (`child._point`): two checks, the contents after timing, and the
    further input sets of a cold graph; and either of the first two blended during timing (`names_reference`)."""
    return {task.seed, task.seed + 1, task.seed + 3} | {task.seed + 10 + j for j in range(MAX_INPUT_SETS)}


def names_reference(task: Task, name) -> bool:
    """Whether a kept call's set may be asked of the reference: a seed of `reference_seeds`, or one of the two
    timed sets blended (`inputs.unblended`). A record naming another gets no reference, and fails."""
    if not isinstance(name, int) or isinstance(name, bool):
        return False
    seed, blend_seed = unblended(name)
    return seed in reference_seeds(task) if blend_seed is None else seed in (task.seed, task.seed + 1)


def call_bytes(answer: Answer | Stopped, dtype: str) -> int:
    """The room one call's outputs take in the arena, at the reference's shapes and the point's dtype (`ALIGN`ed
    each): what a variant that returns what the reference does needs. 0 where the reference gave nothing."""
    first = next(iter(answer.expected.values()), None) if isinstance(answer, Answer) else None
    total = 0
    for e in first.outputs if first is not None else []:
        size = TORCH_DTYPES[dtype].itemsize if e.is_floating_point() else e.element_size()
        total += transport.aligned(e.numel() * size)
    return total


Record = Point | Scenario | ClaimPairedTiming | Unpaired
"""What the judge makes of a task: a point, a scenario, a paired timing."""


def execute(tasks: list[Task], *, timeout_s: float, env: dict, answers: Answers | None = None,
            on_done: Callable[[int, Record], None] | None = None, loaded: set | None = None,
            reuse: dict[tuple, Point] | None = None, worker: Worker | None = None) -> list[Record]:
    """Each task run in the variant's child (`child.work`, which only executes), its answer read through its
    declared message (`messages.read`) and judged here (`casebook.run.judge`) against the reference's answers
    (`answers`, from a child that never calls a variant; one of its own where not given). One record per task, in
    order; `loaded` gathers the kernel modules the variant's child imported. `reuse`: points already measured, by
    `point_key` (a resumed run's), which are not measured again.

    A point's reference is asked for first: its outputs' shapes set the room the variant's child is lent for
    the outputs of its kept calls (`child.kept_calls`); on a GPU they cross in device memory
    (`casebook.run.transport`). Each point records what its measurement cost (`harness`): wall time, the time of its
    timed calls, the wait for the reference, the crossing and the judging. `worker`: the variant's child, where
    the caller has made (or started) it; released at the end either way."""
    out: list[Record] = []
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
                kept = reuse[key]
                record = kept.model_copy(update={"harness": (kept.harness or HarnessCost()).model_copy(
                    update={"kept": True})})
            elif task.kind == "pair":
                record = _sound(task, lambda: _pair(task, variant, answers, timeout_s), variant)
            elif task.kind == "end_to_end":
                record = _sound(task, lambda: _scenario(task, variant, timeout_s, t0), variant)
            else:
                record = _sound(task, lambda: _point(task, variant, answers, timeout_s, loaded, t0), variant)
            if isinstance(record, Point) and record.status == "crashed" and task.device == "cuda":
                record = record.model_copy(update={"error": with_roles(record.error, {
                    os.getpid(): "the parent", answers.oracle.pid: "the reference's child",
                    variant.pid: "this variant's child"})})
            out.append(record)
            if on_done is not None:
                on_done(i, record)
    return out


def with_roles(error: str | None, roles: dict[int | None, str]) -> str | None:
    """A device's out-of-memory error with the run's processes named: torch's message names each process holding
    memory by its pid alone ("Process 1737 has 81.60 GiB memory in use"), and which of the run's it was is what
    says where the memory went (the reference's answers, the memory lent for outputs, the variant's own)."""
    if not error or "out of memory" not in error.lower():
        return error
    named = ", ".join(f"{pid} {role}" for pid, role in roles.items() if pid is not None)
    return f"{error} (this run's processes: {named})"


MALFORMED = (AttributeError, TypeError, ValueError, KeyError, IndexError, OverflowError, RecursionError)
"""What judging a child's answer raises where the answer, though in the format (`messages.read`), does not make a
record: a number the result's model refuses (not finite, say), a tensor the arithmetic cannot take. A
`pydantic.ValidationError` is a ValueError."""


def _sound(task: Task, judged: Callable[[], Record], variant: Worker) -> Record:
    """The record `judged()` makes of a task, where the child's answer makes one: a record of its declared type
    (`casebook.result`, whose numbers are finite). Else the task crashed, with why, and its child is replaced: a
    child that sent a forged answer may still send the true one, which must not answer the next task. A
    malformed answer ends its own task, never the run."""
    try:
        return judged()
    except MALFORMED as e:
        variant.close()
        why = (first_error(e, "the record") if isinstance(e, ValidationError)
               else str(e).splitlines()[0][:200] if str(e) else "")
        error = f"the child's answer does not make a record ({type(e).__name__}: {why})"
        if task.kind == "point":
            return Point(variant=task.variant, shape=task.shape, dtype=task.dtype, status="crashed", error=error)
        return Unpaired("crashed", error) if task.kind == "pair" else Scenario(status="crashed", error=error)


def _read(model: type[Ran], answer, variant: Worker) -> Ran | Stopped:
    """A variant's child's answer read as its task's message (`messages.read`); a child whose answer is out of the
    format is replaced (`messages.Malformed`)."""
    run = read(model, answer)
    if isinstance(run, Malformed):
        variant.close()
    return run


def _pair(task: Task, variant: Worker, answers: Answers, timeout_s: float) -> ClaimPairedTiming | Unpaired:
    """A paired timing, its two variants' kept outputs judged against the ladder point's answers (the same seeds:
    asked for once a run), room lent for both."""
    fixed = answers.get(task, fixed_seeds(task))
    run = _read(PairRun, variant.request(task, timeout_s, room=2 * kept_calls(True) * call_bytes(fixed, task.dtype)),
                variant)
    recs = [*run.calls.variant, *run.calls.over] if isinstance(run, PairRun) else []
    return judge.pair(task, run, _reference(task, _more_seeds(task, recs, fixed), fixed, answers)[0])


def _scenario(task: Task, variant: Worker, timeout_s: float, t0: float) -> Scenario:
    """The scenario timed with the variant (level 3), judged, with what it cost."""
    run = _read(ScenarioRun, variant.request(task, timeout_s), variant)
    timed = _timed_s(run.scenario_times_us, run.kernel_times_us) if isinstance(run, ScenarioRun) else 0.0
    return judge.end_to_end(task, run).model_copy(update={"harness": HarnessCost(
        wall_s=time.perf_counter() - t0, timed_s=timed)})


def _point(task: Task, variant: Worker, answers: Answers, timeout_s: float, loaded: set | None, t0: float) -> Point:
    """One point: the reference's answers, the variant's run with room lent for its outputs, the judgement."""
    fixed = answers.get(task, fixed_seeds(task)) if task.devices == 1 else Answer(status="ok")
    oracle_s = answers.last_s
    room = kept_calls(task.timed) * call_bytes(fixed, task.dtype)
    taken = variant.arena.taken if variant.arena is not None else 0
    run = _read(PointRun, variant.request(task, timeout_s, room=room), variant)
    transport_s, start_s = variant.receive_s, variant.start_wait_s
    crossing = "device" if variant.arena is not None and variant.arena.taken > taken else "host"
    if crossing == "host" and room and variant.crossing_error:
        crossing = f"host: the child could not map the memory lent to it ({variant.crossing_error})"
    if loaded is not None:
        loaded.update(run.loaded)
    reference, judged, more = fixed, None, []
    t1 = time.perf_counter()
    if isinstance(run, PointRun):
        more = _more_seeds(task, [r for c in run.rank_calls or [run.calls] for r in c], fixed)
        if more and isinstance(fixed, Answer) and not run.rank_calls:
            # the calls whose answers are here judged first, and their outputs and answers let go, and handed
            # back to the device, before the reference's child computes the rest (the blended set's): at 4096 x
            # 262144 the parent held 40 GB of them while that child needed at least 36, and an 80 GB H100 ran out
            # of memory; let go but left in the parent's allocator cache, it ran out again (the parent at 48.7 GB)
            judged = judge.judge_calls(task, run.calls, fixed.expected)
            run = run.model_copy(update={"calls": [c.model_copy(update={"outputs": []}) if i in judged else c
                                                   for i, c in enumerate(run.calls)]})
            reference = Answer(status="ok", expected={}, traffic=fixed.traffic)
    del fixed
    if judged is not None:
        transport.give_back_device_memory(collect=False)
    if more:
        t2 = time.perf_counter()
        reference, asked_s = _reference(task, more, reference, answers)
        oracle_s += asked_s
        t1 += time.perf_counter() - t2  # the judging's time, not the wait for the reference
    record = judge.point(task, run, reference, judged)
    # ranks time side by side: the point took the longest rank's time
    timed_s = max(_timed_s(t) for t in [run.times_us, *(run.rank_times_us or [])]) if isinstance(
        run, PointRun) else 0.0
    del reference, run  # the outputs, judged: let go before the memory is given back (held, they made every
    # point pay a full collection, 0.1 s)
    transport.give_back_device_memory(keeping=answers.held)  # the parent holds only its kept answers between tasks
    t2 = time.perf_counter()
    record.harness = HarnessCost(wall_s=t2 - t0, timed_s=timed_s, oracle_s=oracle_s, start_s=start_s or None,
                                 transport_s=transport_s, judge_s=t2 - t1, crossing=crossing)
    return record


def _more_seeds(task: Task, recs: list[Call], fixed: Answer | Stopped) -> list[int]:
    """The seeds the kept records name (`reference_seeds`) whose answers were not asked for before the call: a
    blended set, a cold graph's further input sets."""
    if isinstance(fixed, Stopped):
        return []
    return [s for s in sorted({r.seed for r in recs if names_reference(task, r.seed)}) if str(s) not in fixed.expected]


def _reference(task: Task, more: list[int], fixed: Answer | Stopped, answers: Answers) -> tuple[Answer | Stopped,
                                                                                                 float]:
    """The reference's answers for the kept records: those asked for before the call (`fixed`), and `more`
    (`_more_seeds`) asked for now; with the seconds the asking took."""
    if isinstance(fixed, Stopped) or not more:
        return fixed, 0.0
    reference = answers.get(task, more)
    if isinstance(reference, Answer):  # the answers already here are not asked for (nor held) twice
        reference = Answer(status="ok", expected={**fixed.expected, **reference.expected},
                           traffic=reference.traffic or fixed.traffic)
    return reference, answers.last_s


def _timed_s(*runs: list[float] | None) -> float:
    """Seconds of timed repetitions in the lists of microseconds given (what timing measured, not what it cost)."""
    return sum(t for times in runs for t in times or [] if math.isfinite(t)) / 1e6
