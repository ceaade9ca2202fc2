"""What a variant's child process does for one task: run the contributed code, and nothing more.

Runs inside an `isolate.Worker`; imports the case's kernel module, which validation never does. It judges
nothing. It sends back the outputs of the variant's calls (the first two on fresh inputs, a sample of the
timed repetitions chosen as each call returned, one after timing on new contents in the same tensors),
the raw time of every repetition and what it saw; `casebook.run.judge`, in the parent that never imports the
module, compares them with the reference (`casebook.run.oracle`, another child), summarises, places and
decides (docs/method.md, "The trust boundary").

Every call is made by `bench.drive`, one frame whatever the phase; the allocator is poisoned before
every call alike; no global flag is set for some calls and not others: a variant cannot tell a check
from a timed call by its stack, a flag, or the inputs' identity (two sets taken in turn; the last call
finds new values in the first set's tensors), nor by counting calls (the sampled ones are picked after
they return).
"""

from __future__ import annotations

import importlib
import random
import sys
from dataclasses import dataclass, field
from typing import ClassVar

from casebook.result import Protocol
from casebook.roofline import Roofs
from casebook.run import autotune, bench
from casebook.run import inputs as inputs_mod
from casebook.run.check import TORCH_DTYPES
from casebook.run.distributed import run_ranks
from casebook.run.interference import cpu_threads, gpu_state
from casebook.run.judge import TIMED_SAMPLES
from casebook.run.transport import digest, lent

KERNELS_PACKAGE = "casebook.kernels"

SAMPLES = TIMED_SAMPLES
"""Timed repetitions whose outputs are kept (reservoir sampling: each call kept, or not, as it returns)."""


def kept_calls(timed: bool) -> int:
    """Calls of a point whose outputs are sent to be judged, at most: two checks; when timed, the sampled
    repetitions, the one after a blend (`inputs.blend`) and the call after timing (what the room lent for its
    outputs is counted in)."""
    return 2 + (SAMPLES + 2 if timed else 0)


@dataclass(frozen=True, kw_only=True)
class Task:
    """One unit of measurement: a variant at a shape and dtype (levels 1 and 2), checked and, where `timed`, timed.
    Its kind is its type (`kind` names it): a point here, a paired timing (`PairTask`), the scenario
    (`ScenarioTask`)."""

    kind: ClassVar[str] = "point"
    module: str
    variant: str
    fn: str
    shape: dict
    dtype: str
    level: str
    device: str  # "cuda" | "cpu"
    timed: bool  # False: checked through the interpreter, not timed
    seed: int
    protocol: Protocol = field(default_factory=Protocol)
    """How it is timed: the case's cache and graph in the run's protocol (`plan.plan`)."""
    roofs: Roofs | None = None
    """The ceilings a timed point is placed under (`plan.plan`)."""
    tolerance: float | None = None
    reference: str = "reference"
    inputs: str = "inputs"
    traffic: str = "traffic"
    devices: int = 1
    """Ranks the task runs on (the case's `kernel.devices`); over 1, `casebook.run.distributed` runs it."""


@dataclass(frozen=True, kw_only=True)
class PairTask(Task):
    """A speedup claim's variant and the one it is measured against, timed in alternation at one of its ladder
    points (`_pair`)."""

    kind: ClassVar[str] = "pair"
    over: str
    over_fn: str


@dataclass(frozen=True, kw_only=True)
class ScenarioTask(Task):
    """The case's level-3 scenario with this variant in it (`_end_to_end`)."""

    kind: ClassVar[str] = "end_to_end"
    scenario: str
    scenario_inputs: str


@dataclass(frozen=True)
class TopologyTask:
    """The devices and their link, measured on ranks of their own (`rank.topology`)."""

    kind: ClassVar[str] = "topology"
    device: str
    devices: int


# --- what the variant may not rebind -------------------------------------------------------------------


def _identities() -> dict[str, int]:
    """id() of what the harness in this process relies on: the clocks, the device's events and sync, the
    tensor methods that copy outputs out, and every function of casebook's modules loaded here, with its code
    object (a function whose `__code__` is replaced keeps its own id), and every method of their classes (a
    class attribute replaced leaves the module's names as they were)."""
    import time

    import torch

    found = {f"time.{n}": id(getattr(time, n)) for n in ("perf_counter", "perf_counter_ns", "monotonic", "time")}
    for label, owner, names in (("torch.cuda", torch.cuda, ("Event", "synchronize", "_sleep", "reset_peak_memory_stats",
                                                            "memory_allocated", "max_memory_allocated")),
                                ("torch.cuda.Event", torch.cuda.Event, ("record", "elapsed_time", "synchronize")),
                                ("torch.Tensor", torch.Tensor,
                                 ("clone", "cpu", "copy_", "to", "detach", "contiguous", "numpy", "view")),
                                ("torch", torch, ("full", "equal", "empty"))):
        found.update({f"{label}.{n}": id(getattr(owner, n, None)) for n in names})
    for name, mod in list(sys.modules.items()):
        if name.startswith("casebook.") and not name.startswith(KERNELS_PACKAGE + "."):
            for k, v in list(vars(mod).items()):
                if callable(v):
                    found.update(_ids(f"{name}.{k}", v))
                if isinstance(v, type) and v.__module__ == name:
                    for a, w in list(vars(v).items()):
                        if callable(w) or isinstance(w, (classmethod, staticmethod, property)):
                            found.update(_ids(f"{name}.{k}.{a}", w))
    return found


def _ids(label: str, v) -> dict[str, int]:
    """A callable's id, and its code object's where it has one (through a classmethod's or staticmethod's)."""
    code = getattr(getattr(v, "__func__", v), "__code__", None)
    return {label: id(v), **({f"{label}.__code__": id(code)} if code is not None else {})}


def _bound_allocator():
    """The allocator's statistics as they are at import, before any kernel module: what the peak memory is
    read through (a variant that rebinds torch.cuda's own is caught by `rebound`)."""
    import torch

    return (torch.cuda.synchronize, torch.cuda.reset_peak_memory_stats, torch.cuda.memory_allocated,
            torch.cuda.max_memory_allocated)


_cuda_synchronize, _reset_peak, _allocated, _max_allocated = _bound_allocator()



def rebound() -> list[str]:
    """Names of the harness's clocks, checkers and copies that no longer are what they were at import."""
    now = _identities()
    return sorted(k for k, v in _HARNESS.items() if now.get(k) != v)


def loaded_kernel_modules() -> list[str]:
    """The kernel modules this process has imported (static imports, and any imported at run time)."""
    prefix = KERNELS_PACKAGE + "."
    return sorted({k[len(prefix):].split(".")[0] for k in list(sys.modules) if k.startswith(prefix)})


def work(task: Task) -> dict:
    """Entry point in the child."""
    if task.devices > 1:  # a multi-device case: one process per rank, this one gathers them
        return run_ranks(task)
    import torch

    torch.set_num_threads(cpu_threads())  # explicit, and recorded with each point
    torch.backends.cuda.matmul.allow_tf32 = task.dtype == "tf32"
    torch.backends.cudnn.allow_tf32 = task.dtype == "tf32"
    try:
        mod = importlib.import_module(f"{KERNELS_PACKAGE}.{task.module}")
        if task.device == "cuda":
            autotune.compile_ahead(autotune.autotuners(KERNELS_PACKAGE))
        if isinstance(task, ScenarioTask):
            payload = _end_to_end(task, mod)
        elif isinstance(task, PairTask):
            payload = _pair(task, mod)
        else:
            payload = _point(task, mod)
    except NotImplementedError as e:  # the variant's own word that it does not cover this shape
        payload = {"status": "skipped", "error": f"unsupported: {e}"}
    payload["loaded"] = loaded_kernel_modules()
    payload["rebound"] = rebound()
    return payload


# --- a point: the calls and the timing --------------------------------------------------------------------


class _Rotation:
    """Which input set the next call takes: pinned (the checks), or each in turn (the timing)."""

    def __init__(self, n: int):
        self.n, self.k, self.pin = n, -1, None

    def next(self) -> int:
        if self.pin is not None:
            self.k = self.pin
        else:
            self.k = (self.k + 1) % self.n
        return self.k


class _Poison:
    """Before every call: a NaN-filled block of each output's size left as the allocator's next free one,
    so that an element the variant does not write shows (the first call: each input's size)."""

    def __init__(self, device: str, shapes: list[tuple]):
        self.device, self.shapes = device, shapes

    def learn(self, out) -> None:
        import torch

        items = out if type(out) is tuple else (out,)
        shapes = [(tuple(x.shape), x.dtype) for x in items if type(x) is torch.Tensor]
        if shapes:
            self.shapes = shapes

    def __call__(self) -> None:
        import torch

        for shape, dtype in self.shapes:
            if dtype.is_floating_point:
                torch.full(shape, float("nan"), dtype=dtype, device=self.device)


def _snapshot(x) -> dict:
    """One returned value as the parent will see it: its type, its device, a copy taken now (a plain tensor
    only: a subclass's own code is not run to copy it) and the copy's checksum, taken now too: bytes written
    into the copy later, before the parent's judge has its own, do not match it (`transport.digest`)."""
    import torch

    if type(x) is not torch.Tensor:
        return {"type": type(x).__name__}
    x = torch.Tensor.detach(x)
    loan = lent()  # the copy taken straight into the memory lent for the answer, where it can be
    copy = loan.hold(x) if loan is not None else None
    if copy is None:
        copy = torch.Tensor.clone(x)
    return {"type": "Tensor", "device": x.device.type, "tensor": copy, "digest": digest(copy)}


def _release(rec: dict) -> None:
    """The loan's room a kept call's snapshots took, free again (the call was dropped from the sample)."""
    loan = lent()
    if loan is not None:
        for output in rec["outputs"]:
            if "tensor" in output:
                loan.release(output["tensor"])


def _overlaps(a, b) -> bool:
    sa, sb = a.untyped_storage(), b.untyped_storage()
    a0, b0 = sa.data_ptr(), sb.data_ptr()
    return a0 < b0 + sb.nbytes() and b0 < a0 + sa.nbytes()


def record(role: str, seed: int, out, inputs: dict, before: dict | None) -> dict:
    """What the parent needs to judge one call: each output (copied now) and facts about memory."""
    import torch

    items = list(out) if type(out) is tuple else [out]
    rec = {"role": role, "seed": seed, "tuple": type(out) is tuple, "outputs": [_snapshot(x) for x in items]}
    tensors = [(i, x) for i, x in enumerate(items) if type(x) is torch.Tensor and x.numel()]
    ins = {k: v for k, v in inputs.items() if torch.is_tensor(v) and v.numel()}
    rec["aliases_input"] = [[i, k] for i, x in tensors for k, v in ins.items() if _overlaps(x, v)]
    rec["aliases_output"] = [[j, i] for a, (i, x) in enumerate(tensors) for j, y in tensors[:a] if _overlaps(x, y)]
    if before is not None:
        rec["modified"] = [k for k, v in before.items() if not torch.equal(inputs[k], v)]
    return rec


class _Reservoir:
    """A uniform sample of `k` timed calls' outputs, each kept or not as it returns (Algorithm R, from the
    operating system's randomness): which calls are checked is decided after they are made."""

    def __init__(self, k: int, rotation: _Rotation, seeds: list[int], make=None):
        self.k, self.rotation, self.seeds, self.make = k, rotation, seeds, make
        self.kept: list[tuple[int, dict]] = []
        self.seen = 0
        self.rng = random.SystemRandom()

    def offer(self, out, make=None) -> None:
        """Keep `out` or not; what is kept is `make(out, set)` (`make` here, else the reservoir's own)."""
        self.seen += 1
        if len(self.kept) < self.k:
            slot = len(self.kept)
            self.kept.append(None)
        else:
            slot = self.rng.randrange(self.seen)
            if slot >= self.k:
                return
            _release(self.kept[slot][1])
            self.kept[slot] = None
        self.kept[slot] = (self.seen, (make or self.make)(out, self.rotation.k))


_BLENDS_WARM: set = set()


def _warm_blend(inputs: dict, derived=None) -> None:
    """A blend made once per process for each kind of input set (devices and dtypes), on a copy, before any timing:
    the first one loads its code (2.9 s on an H200), a pause in which the device idled and the repetitions after it
    timed up to 10x slow."""
    import torch

    kind = tuple((v.device.type, v.dtype) for v in inputs.values() if torch.is_tensor(v))
    if kind not in _BLENDS_WARM:
        _BLENDS_WARM.add(kind)
        inputs_mod.blend(clone_inputs(inputs), 0, derived)


class _Sampler:
    """What a timing shows the parent of its repetitions: a uniform sample of `SAMPLES` outputs (`_Reservoir`),
    and, where `inputs.blends`, the output of one repetition chosen at random before which the input set it takes
    was blended (`inputs.blend`), kept whatever the sample. `ids`: what each input set holds now (its seed, or
    its blended name once blended), shared by the samplers of calls that take the same sets (a paired timing's two)."""

    def __init__(self, task: Task, protocol, sets: list[dict], ids: list[int], rotation: _Rotation, poison,
                 derived=None):
        self.sets, self.ids, self.rotation, self.poison, self.derived = sets, ids, rotation, poison, derived
        self.seen, self.force, self.forced = 0, False, []
        self.blend_at = (random.SystemRandom().randrange(1, protocol.min_reps) if inputs_mod.blends(task) else None)
        if self.blend_at is not None:
            _warm_blend(sets[0], derived)
        # The sampler's own method is given at each offer: held by the reservoir, it made a reference cycle that
        # kept a point's input sets and kept outputs alive after the point, on a GPU until the cycle collector ran.
        self.reservoir = _Reservoir(SAMPLES, rotation, ids)

    def _timed(self, out, k: int) -> dict:
        return {**record("timed", self.ids[k], out, self.sets[k], None), "call": self.seen}

    def prepare(self) -> None:
        if self.blend_at is not None and self.seen == self.blend_at and not self.forced and not self.force:
            k = (self.rotation.k + 1) % self.rotation.n  # the set the next repetition takes
            if self.ids[k] >= 0:
                blend_seed = random.SystemRandom().getrandbits(inputs_mod.BLEND_BITS)
                inputs_mod.blend(self.sets[k], blend_seed, self.derived)
                self.ids[k] = inputs_mod.blended_name(self.ids[k], blend_seed)
            self.force = True
        self.poison()

    def observe(self, out) -> None:
        self.seen += 1
        if self.force:
            self.force = False
            self.forced.append(self._timed(out, self.rotation.k))
        else:
            self.reservoir.offer(out, self._timed)

    def kept(self) -> list[dict]:
        return sorted([rec for _, rec in self.reservoir.kept] + self.forced, key=lambda rec: rec["call"])


class _PeakMemory:
    """The second check call's peak device memory above what was allocated when it started (its inputs,
    and everything the harness holds): the allocator's peak statistics, reset after the poison and just
    before the call. A first call is left out (an autotuner's or a compiler's buffers are not the
    variant's). Not measured on a CPU: no allocator counts it there."""

    def __init__(self, device: str, poison):
        self.device, self.poison, self.base = device, poison, None

    def __call__(self) -> None:
        self.poison()
        if self.device == "cuda":
            _cuda_synchronize()
            _reset_peak()
            self.base = _allocated()

    def read(self) -> dict:
        if self.base is None:
            return {}
        return {"peak_memory_bytes": max(0, _max_allocated() - self.base)}


def _nbytes(inputs: dict) -> int:
    import torch

    return sum(v.numel() * v.element_size() for v in inputs.values() if torch.is_tensor(v))


def clone_inputs(inputs: dict) -> dict:
    import torch

    return {k: v.clone() for k, v in inputs.items() if torch.is_tensor(v)}


def _refill(inputs: dict, fresh: dict) -> dict:
    """`fresh`'s values written into `inputs`' own tensors (the same memory, new contents); where a value
    cannot be written in place (another shape, a number), `fresh` as it is."""
    import torch

    same = set(inputs) == set(fresh) and all(
        (torch.is_tensor(v) and torch.is_tensor(fresh[k]) and v.shape == fresh[k].shape and v.dtype == fresh[k].dtype)
        or (not torch.is_tensor(v) and v == fresh[k]) for k, v in inputs.items())
    if not same:
        return fresh
    for k, v in inputs.items():
        if torch.is_tensor(v):
            v.copy_(fresh[k])
    return inputs


def _point(task: Task, mod) -> dict:
    import torch

    fn, make_inputs = getattr(mod, task.fn), getattr(mod, task.inputs)
    dtype = TORCH_DTYPES[task.dtype]

    def inputs(seed: int) -> dict:
        return make_inputs(task.shape, dtype, task.device, torch.Generator().manual_seed(seed))

    protocol = task.protocol if task.timed else None
    sets = [inputs(task.seed)]
    nbytes = sum(t.numel() * t.element_size() for t in sets[0].values() if isinstance(t, torch.Tensor))
    seeds = input_seeds(task, protocol, nbytes)
    sets += [inputs(s) for s in seeds[1:]]
    rotation = _Rotation(len(sets))
    poison = _Poison(task.device, [(tuple(v.shape), v.dtype) for v in sets[0].values() if torch.is_tensor(v)])

    def call():
        return fn(**sets[rotation.next()])

    return bench.drive(call, _point_schedule(task, protocol, sets, seeds, rotation, poison, inputs, call,
                                             inputs_mod.derived_of(make_inputs)))


def input_seeds(task: Task, protocol, input_bytes: int) -> list[int]:
    """The seeds of the input sets a point's calls take in turn: two; for a cold cache under CUDA-graph replay
    (where nothing flushes L2 between the graph's calls), enough further ones that each call finds its
    inputs in memory (`bench.input_sets`)."""
    seeds = [task.seed, task.seed + 1]
    if protocol is not None and task.device == "cuda" and protocol.graph and protocol.cache == "cold":
        extra = bench.input_sets(input_bytes, bench.l2_bytes()) - len(seeds)
        seeds += [task.seed + 10 + j for j in range(max(0, extra))]
    return seeds


def _point_schedule(task: Task, protocol, sets: list[dict], seeds: list[int], rotation: _Rotation, poison: _Poison,
                    inputs, call, derived=None):
    calls: list[dict] = []
    payload: dict = {"status": "ran"}
    memory = _PeakMemory(task.device, poison)
    for j in (0, 1):  # two calls on fresh inputs; the first one pays JIT, autotuning or compilation
        rotation.pin = j
        before = clone_inputs(sets[j])
        step = bench.Step(prepare=memory if j == 1 else poison, sync=task.device)
        out = yield step
        if j == 0:
            payload["first_call_s"] = (step.t2 - step.t0) / 1e9
        else:
            payload.update(memory.read(), input_bytes=_nbytes(sets[j]))
        poison.learn(out)
        calls.append(record("check", seeds[j], out, sets[j], before))
        del out
    if task.timed:
        rotation.pin, rotation.k = None, -1
        sampler = _Sampler(task, protocol, sets, list(seeds), rotation, poison, derived)
        tuners = autotune.autotuners(KERNELS_PACKAGE)
        autotune.forget(tuners)
        timing = yield from bench.timing_schedule(task.device, protocol, len(sets), observe=sampler.observe,
                                                  prepare=sampler.prepare, graph_call=call)
        calls += sampler.kept()
        payload.update(times_us=timing.times, timer=timing.timer, host_us=timing.host_us,
                       interference=timing.interference, autotuned=autotune.picks(tuners),
                       launches=_launches(task, call), threads=_threads(), input_sets=len(sets))
        # After timing: new values in the first set's own tensors, so a cache keyed by the inputs' memory
        # (or a variant that stops working once it has answered) returns a stale answer here.
        sets[0] = _refill(sets[0], inputs(task.seed + 3))
        rotation.pin = 0
        before = clone_inputs(sets[0])
        out = yield bench.Step(prepare=poison, sync=task.device)
        calls.append(record("after", task.seed + 3, out, sets[0], before))
        del out
        if task.device == "cuda":  # once per point, after its timing: the clocks it ended at, who else was there

            payload["interference"] = {**timing.interference, "gpu": gpu_state()}
    payload["calls"] = calls
    return payload


def _threads() -> int:
    import torch

    return torch.get_num_threads()


_launch_counts: dict = {}


def _launches(task: Task, call) -> dict:
    """Kernels per call, counted once per variant and shape (the profiler is slow to start)."""
    if task.device != "cuda":
        return {"direct": 1, "graph": 0}
    key = (task.variant, tuple(task.shape.items()))
    if key not in _launch_counts:
        _launch_counts[key] = bench.count_launches(call)
    return _launch_counts[key]


# --- a paired timing ---------------------------------------------------------------------------------


PAIR_ROUNDS = 6
"""Rounds of a paired timing: each times the claim's variant and the one it is measured against, in
the order A B, B A, B A, A B, A B, B A, so that a drift in clocks over the rounds weighs on both alike."""


def _pair(task: PairTask, mod) -> dict:
    """A speedup claim's two variants timed in alternation on the same inputs, in one process; the raw
    times of each round (`judge.pair` takes their medians and ratios), and each variant's outputs as a point
    keeps them: a sample of its timed calls, and one call after timing on new values in the same tensors.

    The ladder times one variant at every shape, then the next: minutes apart on a GPU whose clock
    follows its recent power draw. The ratio of the same two kernels read 0.96x and 0.93x in two runs
    one after the other on one H200 (cases/gemm_tiled.yaml, 8192^3). Alternating the two cancels that drift
    (Google Benchmark's random interleaving answers the same problem).

    The inputs are the ladder point's (its seeds), so the reference's answers for them judge the outputs; a
    variant that computes something else only here (it can tell a paired timing from its stack) fails its
    claim, as it would fail its point."""
    import torch

    protocol = task.protocol
    make = getattr(mod, task.inputs)
    seeds = [task.seed, task.seed + 1]

    def inputs(seed: int) -> dict:
        return make(task.shape, TORCH_DTYPES[task.dtype], task.device, torch.Generator().manual_seed(seed))

    sets = [inputs(s) for s in seeds]
    poison = _Poison(task.device, [(tuple(v.shape), v.dtype) for v in sets[0].values() if torch.is_tensor(v)])
    roles = {"variant": getattr(mod, task.fn), "over": getattr(mod, task.over_fn)}
    calls, samples, rotations, ids = {}, {}, {}, list(seeds)
    for role, f in roles.items():
        rotations[role] = rotation = _Rotation(len(sets))
        calls[role] = lambda f=f, rotation=rotation: f(**sets[rotation.next()])
        samples[role] = _Sampler(task, protocol, sets, ids, rotation, poison, inputs_mod.derived_of(make))
        rotation.pin = 0
        poison()
        poison.learn(calls[role]())  # each output's size, for the poison before every timed call
        rotation.pin = None
    rounds = []
    for r in range(PAIR_ROUNDS):
        order = ("variant", "over") if r % 4 in (0, 3) else ("over", "variant")
        times = {role: bench.drive(calls[role], bench.timing_schedule(
            task.device, protocol, observe=samples[role].observe, prepare=samples[role].prepare,
            graph_call=calls[role])).times for role in order}
        rounds.append([times["variant"], times["over"]])
    kept: dict[str, list] = {}
    sets[0] = _refill(sets[0], inputs(task.seed + 3))  # as after a point's timing: new values, the same memory
    for role in roles:
        rotations[role].pin = 0
        before = clone_inputs(sets[0])
        poison()
        out = calls[role]()
        kept[role] = samples[role].kept()
        kept[role].append(record("after", task.seed + 3, out, sets[0], before))
        del out
    return {"status": "ran", "rounds_times_us": rounds, "calls": kept}


# --- level 3: the scenario -----------------------------------------------------------------------------

FINGERPRINT = 4096


def _fingerprint(result):
    """A sample of a returned value's elements, in float64 on the host: a plain tensor's, or those of a tuple of
    plain tensors one after another (a kernel returning two outputs)."""
    import torch

    items = result if type(result) is tuple and result else (result,)
    if any(type(x) is not torch.Tensor for x in items):
        return {"type": type(result).__name__}
    # Every step-th element of the values one after another, picked where they are: only the sample crosses to
    # the host (the whole output did, at 1.2 GB/s from a GPU's pageable copy: 12 s of the softmax case's run).
    n = sum(x.numel() for x in items)
    picks, pieces, start = torch.arange(0, n, max(1, n // FINGERPRINT))[:FINGERPRINT], [], 0
    for x in items:
        mine = picks[(picks >= start) & (picks < start + x.numel())] - start
        pieces.append(torch.Tensor.detach(x).flatten()[mine.to(x.device)].to("cpu", torch.float64))
        start += x.numel()
    return {"type": "Tensor", "tensor": torch.cat(pieces)}


def _copy(x):
    import torch

    return torch.Tensor.clone(torch.Tensor.detach(x)) if type(x) is torch.Tensor else x


def _end_to_end(task: ScenarioTask, mod) -> dict:
    """The scenario with this variant, timed on two input sets in turn, a sample of its timed outputs kept, and
    once more after timing on new values in the first set's own tensors (a scenario answer kept by the inputs'
    memory is stale there; the parent compares it with the baseline's on the same values). Then the variant
    alone on the arguments the scenario gave it, a sample of those outputs kept beside the first one. Raw times;
    the parent summarises and judges."""
    import torch

    fn = getattr(mod, task.fn)
    scenario = getattr(mod, task.scenario)
    make = getattr(mod, task.scenario_inputs)

    def inputs(seed: int) -> dict:
        return make(task.shape, TORCH_DTYPES[task.dtype], task.device, torch.Generator().manual_seed(seed))

    sets = [inputs(task.seed), inputs(task.seed + 1)]
    captured: list = []

    def capture(*args, **kwargs):
        if captured:
            return fn(*args, **kwargs)
        # The arguments as they are now, kept apart from the scenario (which may write into its buffers later):
        # timed alone on them, the kernel must return what it returns here.
        kept = ([_copy(a) for a in args], {k: _copy(v) for k, v in kwargs.items()})
        out = fn(*args, **kwargs)
        captured.append((*kept, _fingerprint(out)))
        return out

    first = [_fingerprint(scenario(capture, **sets[0])), _fingerprint(scenario(fn, **sets[1]))]
    if not captured:
        return {"status": "failed", "error": "the scenario never called the kernel"}
    protocol = task.protocol
    rotation = _Rotation(len(sets))
    reservoir = _Reservoir(SAMPLES, rotation, [0, 1], lambda out, k: [k, _fingerprint(out)])
    whole = bench.drive(lambda: scenario(fn, **sets[rotation.next()]),
                        bench.timing_schedule(task.device, protocol, len(sets), observe=reservoir.offer))
    sets[0] = _refill(sets[0], inputs(task.seed + 3))
    after = _fingerprint(scenario(fn, **sets[0]))
    args, kwargs, kernel_first = captured[0]
    alone_samples = _Reservoir(SAMPLES, _Rotation(1), [0], lambda out, k: _fingerprint(out))
    call = lambda: fn(*args, **kwargs)  # noqa: E731
    alone = bench.drive(call, bench.timing_schedule(task.device, protocol, observe=alone_samples.offer,
                                                    graph_call=call))
    return {"status": "ran", "variant": task.variant, "fingerprints": first,
            "timed_fingerprints": [fp for _, fp in sorted(reservoir.kept, key=lambda kr: kr[0])],
            "after_fingerprint": after, "kernel_fingerprints": [kernel_first] + [fp for _, fp in alone_samples.kept],
            "scenario_times_us": whole.times, "kernel_times_us": alone.times}


_HARNESS = _identities()
"""Taken when this module has been imported (the last of its lines, so that every function and class of it is
in): in the child, before any kernel module."""
