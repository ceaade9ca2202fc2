"""What one child process does for one task: check, time, re-check, place on the roofline.

Runs inside `isolate.run_isolated`; imports the case's kernel module, which validation never does.
"""

from __future__ import annotations

import importlib
import itertools
import time
from dataclasses import dataclass, field

from casebook import autotune

KERNELS_PACKAGE = "casebook.kernels"


@dataclass(frozen=True)
class Task:
    """One unit of measurement: a variant at a shape and dtype (levels 1, 2) or in the scenario (level 3)."""

    kind: str  # "point" | "end_to_end" | "pair" | "traffic"
    module: str
    variant: str
    fn: str
    shape: dict
    dtype: str
    level: str
    device: str  # "cuda" | "cpu"
    timed: bool  # False: checked through the interpreter, not timed
    seed: int
    protocol: dict
    roofs: dict = field(default_factory=dict)
    tolerance: float | None = None
    reference: str = "reference"
    inputs: str = "inputs"
    traffic: str = "traffic"
    scenario: str = ""
    scenario_inputs: str = ""
    over: str = ""
    over_fn: str = ""
    """kind "pair": the variant a speedup claim is measured against, and its function."""


def work(task: Task) -> dict:
    """Entry point in the child."""
    import torch

    from casebook.interference import cpu_threads

    torch.set_num_threads(cpu_threads())  # explicit, and recorded with each point
    torch.backends.cuda.matmul.allow_tf32 = task.dtype == "tf32"
    torch.backends.cudnn.allow_tf32 = task.dtype == "tf32"
    mod = importlib.import_module(f"{KERNELS_PACKAGE}.{task.module}")
    try:
        if task.kind == "end_to_end":
            return _end_to_end(task, mod)
        if task.kind == "pair":
            return _pair(task, mod)
        if task.kind == "traffic":
            return _traffic(task, mod)
        return _point(task, mod)
    except NotImplementedError as e:  # the variant's own word that it does not cover this shape
        return {"status": "skipped", "error": f"unsupported: {e}"}


def _traffic(task: Task, mod) -> dict:
    """The traffic model alone, at the task's shape and dtype: nothing runs but the model."""
    from casebook.check import TORCH_DTYPES

    traffic = getattr(mod, task.traffic)(task.shape, TORCH_DTYPES[task.dtype])
    return {"status": "ok", "flops": traffic.flops, "bytes": traffic.bytes}


def _point(task: Task, mod) -> dict:
    from casebook.bench import Protocol, _sync
    from casebook.check import TORCH_DTYPES, check
    from casebook.roofline import FasterThanPhysics, Roofs, place

    fn = getattr(mod, task.fn)
    reference, make_inputs = getattr(mod, task.reference), getattr(mod, task.inputs)
    out: dict = {"variant": task.variant, "shape": task.shape, "dtype": task.dtype}
    # The first call of this variant at this shape and dtype pays JIT, autotuning or compilation; it
    # happens inside the first check, so that is where it is timed (time_fn's own first call is warm).
    first_call: list[float] = []

    def timed_first(**kw):
        if first_call:
            return fn(**kw)
        t0 = time.perf_counter()
        y = fn(**kw)
        _sync(task.device)
        first_call.append(time.perf_counter() - t0)
        return y

    first = check(timed_first, reference, make_inputs, task.shape, task.dtype, task.device,
                  [task.seed, task.seed + 1], task.tolerance)
    out.update(correct=first.correct, max_rel_err=first.max_rel_err)
    if not first.correct:
        return {**out, "status": "failed", "error": first.error}
    if not task.timed:
        return {**out, "status": "checked"}

    timing, autotuned, launches, n_sets = _timed(task, fn, Protocol(**task.protocol), make_inputs)
    if n_sets > 1:
        out["input_sets"] = n_sets
    # Checked again after timing, on new inputs: a variant that caches its first answer fails here.
    again = check(fn, reference, make_inputs, task.shape, task.dtype, task.device, [task.seed + 3], task.tolerance)
    if not again.correct:
        return {**out, "status": "failed", "correct": False, "error": f"after timing: {again.error}"}

    traffic = getattr(mod, task.traffic)(task.shape, TORCH_DTYPES[task.dtype])
    s = timing.summary
    if autotuned:
        out["autotuned"] = autotuned
    out.update(status="ok", median_us=s.median_us, median_ci_us=[s.ci_lo_us, s.ci_hi_us], p10_us=s.p10_us,
               p90_us=s.p90_us, cv=s.cv, repetitions=s.repetitions, first_call_s=first_call[0],
               timer=timing.timer, flops=traffic.flops, bytes=traffic.bytes,
               traffic_terms=traffic.as_dict()["terms"], launches=launches,
               threads=_threads(), interference=timing.interference)
    if task.device == "cuda":  # once per point, after its timing: the clocks it ended at, who else was there
        from casebook.interference import gpu_state

        out["interference"] = {**timing.interference, "gpu": gpu_state()}
    roofs = Roofs(compute_tflops=task.roofs["compute_tflops"], bandwidth_gbps=task.roofs["bandwidth_gbps"],
                  launch_us=task.roofs["launch_us"])
    n_launch = launch_count(launches, task.roofs)
    try:
        p = place(traffic.flops, traffic.bytes, n_launch, s.median_us, roofs,
                  spread=(s.median_us - s.p10_us) / s.median_us, host_us=timing.host_us)
    except FasterThanPhysics as e:
        return {**out, "status": "failed", "error": str(e)}
    out.update(gbps=p.gbps, tflops=p.tflops, arithmetic_intensity=p.arithmetic_intensity, floor_us=p.floor_us,
               compute_floor_us=p.compute_floor_us, bandwidth_floor_us=p.bandwidth_floor_us,
               launch_floor_us=p.launch_floor_us, host_issue_us=timing.host_us, roof_fraction=p.roof_fraction,
               regime=p.regime,
               attainable_tflops=p.attainable_tflops, compute_roof_tflops=roofs.compute_tflops,
               bandwidth_roof_gbps=roofs.bandwidth_gbps)
    return out


def _threads() -> int:
    import torch

    return torch.get_num_threads()


def _timed(task: Task, fn, protocol, make_inputs) -> tuple:
    """Time `fn` on its timing inputs: (timing, autotuner picks, launches per call, input sets). The
    inputs are freed on return, before the check that follows."""
    from casebook.bench import time_fn

    sets = _timed_inputs(task, protocol, make_inputs)
    rotation = itertools.cycle(sets)
    call = lambda: fn(**next(rotation))  # noqa: E731
    tuners = autotune.autotuners(KERNELS_PACKAGE)
    autotune.forget(tuners)
    timing = time_fn(call, task.device, protocol, input_sets=len(sets))
    return timing, autotune.picks(tuners), _launches(task, call), len(sets)


PAIR_ROUNDS = 6
"""Rounds of a paired timing: each times the claim's variant and the one it is measured against, in
the order A B, B A, B A, A B, A B, B A, so that a drift in clocks over the rounds weighs on both alike."""


def _pair(task: Task, mod) -> dict:
    """A speedup claim's two variants timed in alternation on the same inputs, in one process.

    The ladder times one variant at every shape, then the next: minutes apart on a GPU whose clock
    follows its recent power draw. The ratio of the same two kernels read 0.96x and 0.93x in two runs
    of one session on one H200 (cases/gemm_tiled.yaml, 8192^3). Alternating the two cancels that drift
    (Google Benchmark's random interleaving answers the same problem); each round's ratio is kept, and
    the claim is judged on their median."""
    import statistics

    from casebook.bench import Protocol, time_fn

    protocol = Protocol(**task.protocol)
    sets = _timed_inputs(task, protocol, getattr(mod, task.inputs))
    calls = {}
    for role, name in (("variant", task.fn), ("over", task.over_fn)):
        f, rotation = getattr(mod, name), itertools.cycle(sets)
        calls[role] = lambda f=f, rotation=rotation: f(**next(rotation))
    rounds = []
    for r in range(PAIR_ROUNDS):
        order = ("variant", "over") if r % 4 in (0, 3) else ("over", "variant")
        us = {role: time_fn(calls[role], task.device, protocol).summary.median_us for role in order}
        rounds.append([us["variant"], us["over"]])
    ratios = sorted(over / mine for mine, over in rounds)
    return {"status": "ok", "rounds_us": rounds, "speedup": statistics.median(ratios),
            "speedup_min": ratios[0], "speedup_max": ratios[-1]}


def _timed_inputs(task: Task, protocol, make_inputs) -> list[dict]:
    """The inputs a point is timed on: fresh random ones, and, for a cold cache under CUDA-graph replay
    (where nothing flushes L2 between the graph's calls), enough further copies to take in turn that each
    call finds its inputs in memory (`bench.input_sets`)."""
    import torch

    from casebook.bench import input_sets, l2_bytes
    from casebook.check import TORCH_DTYPES

    g = torch.Generator().manual_seed(task.seed + 2)
    new = lambda: make_inputs(task.shape, TORCH_DTYPES[task.dtype], task.device, g)  # noqa: E731
    sets = [new()]
    if task.device == "cuda" and protocol.graph and protocol.cache == "cold":
        nbytes = sum(t.numel() * t.element_size() for t in sets[0].values() if isinstance(t, torch.Tensor))
        sets += [new() for _ in range(input_sets(nbytes, l2_bytes()) - 1)]
    return sets


def launch_count(launches: dict, roofs: dict) -> float:
    """The launch floor in units of one launch: every kernel at its cost inside a CUDA graph, the least a
    kernel takes on the device. A true lower bound, whatever issues the kernels: a lone kernel timed by
    events does not wait for the host's pace of issue (`launch_us`), and a 4 MB copy on the H200 took
    5.5 us where back-to-back launches cost 6.6 us each. The host's own issue time is measured per
    variant (`host_issue_us`) and decides the regime, not the gate."""
    kernels = launches["direct"] + launches["graph"]
    return kernels * roofs["graph_launch_us"] / roofs["launch_us"]


_launch_counts: dict = {}


def _launches(task: Task, call) -> dict:
    """Kernels per call, counted once per variant and shape (the profiler is slow to start)."""
    if task.device != "cuda":
        return {"direct": 1, "graph": 0}
    from casebook.bench import count_launches

    key = (task.variant, tuple(task.shape.items()))
    if key not in _launch_counts:
        _launch_counts[key] = count_launches(call)
    return _launch_counts[key]


FINGERPRINT = 4096


def _end_to_end(task: Task, mod) -> dict:
    """Time the scenario with this variant, and the variant alone on the arguments the scenario gives it."""
    import torch

    from casebook.bench import Protocol, time_fn
    from casebook.check import TORCH_DTYPES

    fn = getattr(mod, task.fn)
    scenario = getattr(mod, task.scenario)
    g = torch.Generator().manual_seed(task.seed)
    inputs = getattr(mod, task.scenario_inputs)(task.shape, TORCH_DTYPES[task.dtype], task.device, g)
    captured: list = []

    def capture(*args, **kwargs):
        if not captured:
            captured.append((args, kwargs))
        return fn(*args, **kwargs)

    result = scenario(capture, **inputs)
    flat = result.detach().flatten().to("cpu", torch.float64)
    fingerprint = flat[:: max(1, flat.numel() // FINGERPRINT)][:FINGERPRINT]
    if not torch.isfinite(fingerprint).all():
        return {"status": "failed", "error": "scenario output has NaN or Inf"}
    if not captured:
        return {"status": "failed", "error": "the scenario never called the kernel"}
    protocol = Protocol(**task.protocol)
    whole = time_fn(lambda: scenario(fn, **inputs), task.device, protocol).summary
    args, kwargs = captured[0]
    alone = time_fn(lambda: fn(*args, **kwargs), task.device, protocol).summary
    return {"status": "ok", "variant": task.variant, "scenario_us": whole.median_us,
            "scenario_p10_us": whole.p10_us, "scenario_p90_us": whole.p90_us, "kernel_us": alone.median_us,
            "kernel_p10_us": alone.p10_us, "kernel_p90_us": alone.p90_us, "fingerprint": fingerprint.tolist()}
