"""Verdicts from raw data, in the parent, which never imports contributed code.

A variant's child (`casebook.run.child`) sends outputs, raw times and facts; the reference's child
(`casebook.run.oracle`) sends the answers and the traffic model; each answer is read once as its declared
message (`casebook.run.messages`). Here the outputs are compared with the answers (`check.compare_output`:
normwise and row by row), the times summarised (`stats.summarize`), the point placed on the roofline
(`roofline.place`, the physics gate) and the point's status decided: what leaves is a record of the result's
own types (a `Point`, a paired timing, a scenario's summary). Nothing the variant's process rebinds reaches
this code.
"""

from __future__ import annotations

import math
import statistics

from casebook.claims import Unpaired
from casebook.levels import Scenario
from casebook.result import ClaimPairedTiming, Interference, Launches, Point
from casebook.roofline import FasterThanPhysics, Roofs, launch_count, place, write_share
from casebook.run.check import TORCH_DTYPES, CheckFailed, compare_output
from casebook.run.inputs import blends
from casebook.run.messages import (
    Answer,
    Call,
    Expected,
    Output,
    PairRun,
    PointRun,
    Ran,
    ScenarioRun,
    Stopped,
    TrafficModel,
)
from casebook.run.transport import Unsent, digest
from casebook.stats import summarize
from casebook.tolerance import TOLERANCE

TIMED_SAMPLES = 2
"""Timed repetitions whose outputs the variant's child keeps (reservoir sampling, `child`) and the judge
requires: a point without them is not accepted, whatever its checks said."""

TIMER_REBOUND = ("the variant's process rebound what the harness relies on ({names}): nothing timed or returned "
                 "there is evidence")


def times_problem(times: list[float] | None) -> str | None:
    """Why a list of repetition times is not a measurement (None: it is one)."""
    if not times:
        return "no repetitions timed"
    if not all(math.isfinite(t) and t > 0 for t in times):
        return "a repetition's time is not a finite positive number"
    return None


def _where(rec: Call) -> str:
    if rec.role == "timed":
        return f"timed call {rec.call} (seed {rec.seed}, checked after timing)"
    if rec.role == "after":
        return f"after timing: seed {rec.seed}"
    return f"seed {rec.seed}"


def judge_call(rec: Call, expected: Expected | None, device: str, dtype: str, tolerance: float | None) -> tuple:
    """One call's outputs against the reference's at the same seed: (normwise error, row error), or
    CheckFailed."""
    if expected is None:
        raise CheckFailed("no reference answer for this seed")
    outs, exps = rec.outputs, expected.outputs
    if expected.tuple:
        if not rec.tuple or len(outs) != len(exps):
            got = "tuple" if rec.tuple else (outs[0].type if outs else "nothing")
            raise CheckFailed(f"returned {got}, not a tuple of {len(exps)} tensors as the reference")
    elif rec.tuple or len(outs) != 1:
        raise CheckFailed("returned tuple, not a plain torch.Tensor")
    for j, i in rec.aliases_output:
        raise CheckFailed(f"outputs {j} and {i} alias each other")
    errs, rows = [], []
    for i, (o, e) in enumerate(zip(outs, exps)):
        prefix = f"output {i}: " if expected.tuple else ""
        try:
            if o.type != "Tensor" or o.tensor is None:
                raise CheckFailed(f"returned {o.type}, not a plain torch.Tensor")
            if o.device != device:
                raise CheckFailed(f"output on {o.device}, expected {device}")
            unchanged(o, e, dtype)
            for k in rec.modified:
                raise CheckFailed(f"input {k!r} was modified")
            for j, k in rec.aliases_input:
                if j == i:
                    raise CheckFailed(f"output aliases input {k!r}")
            err, row = compare_output(o.tensor, e, dtype, tolerance, device=judged_on(device))
        except CheckFailed as err:
            raise CheckFailed(f"{prefix}{err}") from None
        errs.append(err)
        rows.append(row)
    return max(errs, default=0.0), max(rows, default=0.0)


def unchanged(o: Output, expected, dtype: str) -> None:
    """CheckFailed unless the output crossed whole and as it was copied when the call returned: not left
    behind for want of room (with its shape and dtype where those already say why), and with the checksum the
    child took of its copy then (`transport.digest`): bytes written into the copy after the call, or into the
    lent memory after the answer was sent, do not match it."""
    t = o.tensor
    if isinstance(t, Unsent):
        want = str(TORCH_DTYPES[dtype] if expected.is_floating_point() else expected.dtype).removeprefix("torch.")
        if list(t.shape) != list(expected.shape):
            raise CheckFailed(f"output shape {t.shape}, expected {tuple(expected.shape)} (not sent: {t.reason})")
        if t.dtype != want:
            raise CheckFailed(f"output dtype {t.dtype}, expected {want} (not sent: {t.reason})")
        raise CheckFailed(f"output not sent: {t.reason}")
    if o.digest is None:
        raise CheckFailed("output sent without the checksum taken when the call returned")
    if digest(t) != o.digest:
        raise CheckFailed("output's bytes changed after they were copied when the call returned (written into "
                          "the copy, or into the memory it crossed in, before the judge read it)")


def judged_on(device: str) -> str | None:
    """Where the parent does a GPU's outputs' arithmetic: on the GPU (float64 over a gigabyte output takes
    milliseconds there, seconds on the host), a slice at a time (`check.CHUNK_ELEMENTS`), so the judge needs
    little of the device's memory beside the children's; elsewhere where the tensors are. Only the bytes the
    child sent are moved: nothing it owns runs here."""
    import torch

    return "cuda" if device == "cuda" and torch.cuda.is_available() else None


def _unusable(run: Ran | Stopped, reference: Answer | Stopped | None, needs_reference: bool = True) -> dict | None:
    """Why the task cannot be judged, as a record's status and error (and, where the variant's child rebound what
    the harness relies on, `correct: False`): it did not run to the end, or the reference could not be computed.
    None where it can be judged."""
    if isinstance(run, Stopped):
        return {"status": run.status, "error": run.short()}
    if run.rebound:
        return {"status": "failed", "correct": False, "error": TIMER_REBOUND.format(names=", ".join(run.rebound[:4]))}
    if needs_reference and not isinstance(reference, Answer):
        return {"status": "crashed",
                "error": f"the reference could not be computed: {reference.error if reference else 'no answer'}"}
    return None


def judge_calls(task, calls: list[Call], expected: dict[str, Expected]) -> dict[int, tuple | CheckFailed]:
    """Each of `calls` whose seed has an answer in `expected` judged now (`judge_call`), by its place in `calls`:
    its (normwise, row) errors, or the CheckFailed it raised, for `point` to take as `judged`. So a point can be
    judged in two goes, the outputs and answers of the first let go before the rest are asked for."""
    out: dict[int, tuple | CheckFailed] = {}
    for i, rec in enumerate(calls):
        if (answer := expected.get(str(rec.seed))) is not None:
            try:
                out[i] = judge_call(rec, answer, task.device, task.dtype, task.tolerance)
            except CheckFailed as e:
                out[i] = e
    return out


def point(task, run: PointRun | Stopped, reference: Answer | Stopped | None,
          judged: dict[int, tuple | CheckFailed] | None = None) -> Point:
    """The point's record from what the two children sent: status, errors, the summary and the placement.
    `judged`: calls of a single-device point already judged (`judge_calls`), by their place in `run.calls`; each is
    taken as it was judged, in its turn, so the first failing call is still the one reported."""
    at = {"variant": task.variant, "shape": task.shape, "dtype": task.dtype}
    if why := _unusable(run, reference):
        return Point(**at, **why)
    by_rank = ([(f"rank {r}: ", c) for r, c in enumerate(run.rank_calls)] if run.rank_calls
               else [("", run.calls)])  # a multi-device point: every rank's outputs, each against the reference
    if not all(c for _, c in by_rank):
        return Point(**at, status="crashed", error="the variant's process sent no outputs")
    for who, rank_calls in by_rank:
        if why := missing_calls(task, rank_calls):
            return Point(**at, status="failed", correct=False, error=f"{who}{why}")
    worst = worst_row = 0.0
    judged = {} if judged is None or run.rank_calls else judged
    for who, rank_calls in by_rank:
        for i, rec in enumerate(rank_calls):
            try:
                verdict = judged.get(i)
                if isinstance(verdict, CheckFailed):
                    raise verdict
                err, row = verdict or judge_call(rec, reference.expected.get(str(rec.seed)), task.device,
                                                 task.dtype, task.tolerance)
            except CheckFailed as e:
                return Point(**at, status="failed", correct=False, max_rel_err=worst,
                             error=f"{who}{_where(rec)}: {e}")
            worst, worst_row = max(worst, err), max(worst_row, row)
    checked = {**at, "correct": True, "max_rel_err": worst, "max_row_err": worst_row,
               "checked_calls": sum(len(c) for _, c in by_rank),
               **_present(first_call_s=run.first_call_s, peak_memory_bytes=run.peak_memory_bytes,
                          input_bytes=run.input_bytes)}
    if not task.timed:
        return Point(**checked, status="checked")
    times, ranked = run.times_us, {}
    if run.rank_times_us is not None:
        if why := ranks_problem(run.rank_times_us):
            return Point(**checked, status="failed", error=f"timing: {why}")
        times, ranked = slowest_rank(run)
    if why := times_problem(times):
        return Point(**checked, status="failed", error=f"timing: {why}")
    return place_point(task, run, times, ranked, reference.traffic, checked)


def missing_calls(task, calls: list[Call], checks: int = 2) -> str | None:
    """Why a point's kept calls are not the ones the harness keeps (None: they are): `checks` checks, and when timed
    the sampled repetitions (none under CUDA-graph replay, whose calls are not sampled), the one after a blend
    (`inputs.blends`) and the call after timing.
    A child whose sampler was emptied sends its checks alone: its timed calls were never seen."""
    roles = [rec.role for rec in calls]
    graph = task.protocol.graph and task.device == "cuda"
    timed = 0 if not task.timed or graph else TIMED_SAMPLES + (1 if blends(task) else 0)
    want = {"check": checks, "timed": timed, "after": 1 if task.timed else 0}
    have = {role: roles.count(role) for role in want}
    if have != want or len(roles) != sum(want.values()):
        return (f"the child sent {', '.join(f'{have[r]} {r}' for r in want)} call(s) where the harness keeps "
                f"{', '.join(f'{want[r]} {r}' for r in want)}: outputs of calls it made were not shown")
    return None


def ranks_problem(ranks: list[list[float]]) -> str | None:
    """Why a multi-device point's per-rank repetitions are not a measurement (None: they are one)."""
    if not ranks:
        return "no rank's repetitions"
    for r, times in enumerate(ranks):
        if why := times_problem(times):
            return f"rank {r}: {why}"
    return None


def slowest_rank(run: PointRun) -> tuple[list[float], dict]:
    """A multi-device point's times, the slowest rank's, and what the point records of its ranks: each rank's
    median taken again here from its own repetitions (`rank_times_us`), every one kept (`rank_median_us`), and
    the slowest rank's reading of the machine as the point's. A collective is as fast as its slowest rank."""
    medians = [summarize(t).median_us for t in run.rank_times_us]
    r = max(range(len(medians)), key=medians.__getitem__)
    ranked = {"ranks": len(medians), "slowest_rank": r, "rank_median_us": medians}
    readings = run.rank_interference
    if readings is not None and len(readings) == len(medians):
        ranked.update(interference=readings[r], rank_interference=readings)
    return run.rank_times_us[r], ranked


def place_point(task, run: PointRun, times: list[float], ranked: dict, traffic: TrafficModel | None,
                checked: dict) -> Point:
    """The timing summarised and placed on the roofline of the task's ceilings."""
    s = summarize(times)
    launches = run.launches or Launches(direct=1, graph=0)
    timed = _present(median_us=s.median_us, median_ci_us=[s.ci_lo_us, s.ci_hi_us], p10_us=s.p10_us,
                     p90_us=s.p90_us, cv=s.cv, repetitions=s.repetitions, timer=run.timer,
                     flops=traffic and traffic.flops, bytes=traffic and traffic.bytes,
                     traffic_terms=traffic and traffic.terms, launches=launches, threads=run.threads,
                     interference=run.interference or Interference(), autotuned=run.autotuned or None,
                     input_sets=run.input_sets if (run.input_sets or 1) > 2 else None)
    timed.update(ranked)
    if traffic is None:
        return Point(**checked, **timed, status="failed", error="the traffic model gave no FLOPs and bytes")
    roofs = task.roofs
    host_us = run.host_us or 0.0
    link_bytes = traffic.link_bytes or 0.0
    try:
        p = place(traffic.flops, traffic.bytes, launch_count(launches.direct + launches.graph, roofs),
                  s.median_us, roofs, spread=(s.median_us - s.p10_us) / s.median_us, host_us=host_us,
                  link_bytes=link_bytes, write_share=write_share(traffic.terms))
    except FasterThanPhysics as e:
        if roofs.busy:  # the ceiling, not the kernel, is the suspect: not placed, not published
            return Point(**checked, **timed, status="ok",
                         unstable=[f"under the floor of ceilings measured on a busy machine ({e})"])
        return Point(**checked, **timed, status="failed", error=str(e))
    return Point(**checked, **timed, status="ok", gbps=p.gbps, tflops=p.tflops,
                 arithmetic_intensity=p.arithmetic_intensity, floor_us=p.floor_us,
                 compute_floor_us=p.compute_floor_us, bandwidth_floor_us=p.bandwidth_floor_us,
                 launch_floor_us=p.launch_floor_us, host_issue_us=host_us, roof_fraction=p.roof_fraction,
                 regime=p.regime, attainable_tflops=p.attainable_tflops, compute_roof_tflops=roofs.compute_tflops,
                 bandwidth_roof_gbps=p.bandwidth_roof_gbps, **_on_link(link_bytes, s.median_us, roofs, p))


def _present(**fields) -> dict:
    """The fields given that hold something: a record keeps no field it did not measure."""
    return {k: v for k, v in fields.items() if v is not None}


def _on_link(link_bytes: float, median_us: float, roofs: Roofs, p) -> dict:
    """A multi-device point's place against the link: its bus bytes, the bus bandwidth they reached, the
    link's floor and roof (nothing for one device)."""
    if not (link_bytes and roofs.link_gbps):
        return {}
    return {"link_bytes": link_bytes, "bus_gbps": link_bytes / median_us / 1e3, "link_floor_us": p.link_floor_us,
            "link_roof_gbps": roofs.link_gbps}


def pair(task, run: PairRun | Stopped, reference: Answer | Stopped | None) -> ClaimPairedTiming | Unpaired:
    """A paired timing's rounds: each round's two medians, and the median of their ratios; each variant's kept
    outputs (a sample of its timed calls, the call after timing) judged first, as a point's are."""
    if why := _unusable(run, reference):
        return Unpaired(why["status"], why["error"])
    for name, kept in ((task.variant, run.calls.variant), (task.over, run.calls.over)):
        if why := missing_calls(task, kept, checks=0):
            return Unpaired("failed", f"{name} in the paired timing: {why}")
        for rec in kept:
            try:
                judge_call(rec, reference.expected.get(str(rec.seed)), task.device, task.dtype, task.tolerance)
            except CheckFailed as e:
                return Unpaired("failed", f"{name} in the paired timing, {_where(rec)}: {e}")
    rounds = []
    for r in run.rounds_times_us:
        if len(r) != 2 or any(times_problem(t) for t in r):
            return Unpaired("failed", "a paired round's times are not a measurement")
        rounds.append([summarize(r[0]).median_us, summarize(r[1]).median_us])
    if not rounds:
        return Unpaired("failed", "no paired rounds timed")
    ratios = sorted(over / mine for mine, over in rounds)
    return ClaimPairedTiming(shape=task.shape, dtype=task.dtype, status="ok", rounds_us=rounds,
                             speedup=statistics.median(ratios), speedup_min=ratios[0], speedup_max=ratios[-1])


def fingerprint_diff(a, b) -> float:
    """Relative difference of two scenario fingerprints (plain sequences of floats)."""
    num = math.sqrt(sum((x - y) ** 2 for x, y in zip(a, b)))
    den = math.sqrt(sum(x * x for x in a)) or 1.0
    return num / den if len(a) == len(b) else math.inf


def end_to_end(task, run: ScenarioRun | Stopped) -> Scenario:
    """The scenario's summary from raw times, once its outputs are judged: each sampled timed output against the
    first output of its input set, each sampled output of the kernel timed alone against the kernel's first output
    in the scenario (a variant that does no work when timed alone fails here), and the samples the harness keeps
    all present. The output after timing, on new values, is the baseline's to compare (`levels.end_to_end`)."""
    if why := _unusable(run, None, needs_reference=False):
        return Scenario(status=why["status"], error=why["error"])
    prints, timed, alone = run.fingerprints, run.timed_fingerprints, run.kernel_fingerprints
    graph = task.protocol.graph and task.device == "cuda"
    if len(prints) != 2 or len(timed) != TIMED_SAMPLES or len(alone) != 1 + (0 if graph else TIMED_SAMPLES):
        return Scenario(status="failed", error="the child sent other outputs than the scenario's first two, "
                                               f"{TIMED_SAMPLES} sampled timed ones and the kernel's: outputs of "
                                               "calls it made were not shown")
    every = [*prints, *(fp for _, fp in timed), run.after_fingerprint, *alone]
    if any(p.type != "Tensor" or p.tensor is None for p in every):
        kind = next(p.type for p in every if p.type != "Tensor" or p.tensor is None)
        return Scenario(status="failed", error=f"the scenario returned {kind}, not a plain torch.Tensor")
    values = [[float(v) for v in p.tensor.tolist()] for p in every]
    if not all(math.isfinite(v) for fp in values for v in fp):
        return Scenario(status="failed", error="scenario output has NaN or Inf")
    first = values[:2]
    timed_values = values[2:2 + len(timed)]
    after, kernel_first, kernel_samples = values[2 + len(timed)], values[3 + len(timed)], values[4 + len(timed):]
    bound = 2 * TOLERANCE[task.dtype]
    for i, ((k, _), v) in enumerate(zip(timed, timed_values), 1):
        if k not in (0, 1) or len(v) != len(first[k]) or not fingerprint_diff(first[k], v) <= bound:
            return Scenario(status="failed", error=f"a timed scenario call's output (sample {i}) differs from the "
                                                   f"first on its inputs by {fingerprint_diff(first[k % 2], v):.3g}")
    for i, v in enumerate(kernel_samples, 1):
        if len(v) != len(kernel_first) or not fingerprint_diff(kernel_first, v) <= bound:
            return Scenario(status="failed", error=f"the kernel timed alone returned another output (sample {i}) "
                                                   "than it did in the scenario on the same arguments, by "
                                                   f"{fingerprint_diff(kernel_first, v):.3g}")
    for times in (run.scenario_times_us, run.kernel_times_us):
        if why := times_problem(times):
            return Scenario(status="failed", error=f"timing: {why}")
    whole, alone_t = summarize(run.scenario_times_us), summarize(run.kernel_times_us)
    return Scenario(status="ok", variant=run.variant, scenario_us=whole.median_us, scenario_p10_us=whole.p10_us,
                    scenario_p90_us=whole.p90_us, kernel_us=alone_t.median_us, kernel_p10_us=alone_t.p10_us,
                    kernel_p90_us=alone_t.p90_us, fingerprint=first[0], after_fingerprint=after,
                    timed_outputs_checked=len(timed) + len(kernel_samples))
