"""Timing, done the way the seed's microbenchmark norms ask.

First call (JIT, autotune, compile) kept out of the timing (casebook.run.child times it where it happens, in
the first correctness check); warm-up until steady; L2 flushed before every
repetition unless the case asks for a warm cache; device events on a GPU, a monotonic clock on a CPU;
repetitions until the median is stable and the spread can be read (`spread_read`), or the time cap is hit;
median, p10, p90 and CV kept.

On a GPU the timing is the device's: the host's time to issue the call is measured during warm-up and hidden
behind a device-side delay before each repetition (`host_slack_us`), so a slow or jittery host neither adds to
nor scatters the time. A repetition whose call the host issued after its delay ran out (a host pause: the
first use of some code, the scheduler) let the device idle inside its time: it is left out, and another taken,
while such repetitions are few (`Timing.interference["late_reps"]`). The host's own time to issue a call is
kept beside it (`Timing.host_us`; casebook.roofline files a point under "launch" where it exceeds every
floor). A call that waits for the device itself (a copy to the host) cannot be hidden: its time includes the
host's, as it would in a loop.
"""

from __future__ import annotations

import gc
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np
import torch

from casebook.result import Protocol
from casebook.run import interference
from casebook.stability import spread_limit
from casebook.stats import Summary, median_stable, summarize

QUICK = Protocol(warmup_ms=5.0, min_reps=5, max_reps=50, target_ci=0.04, time_cap_s=0.3)

CPU = Protocol(target_ci=0.02, time_cap_s=0.5)
"""A CPU-only machine's default: each repetition there pays a last-level-cache flush of several ms and
the median's spread on a shared 2-core machine rarely falls under 0.5%, so the GPU's 1 s cap would be
spent on every point; half of it, and a confidence interval of 2% either side, keep a whole case
under a minute."""


@dataclass(frozen=True)
class Timing:
    summary: Summary
    timer: str
    host_us: float = 0.0
    """The host's time to issue one call (`host_issue_us`); 0 on a CPU."""
    slack_us: float = 0.0
    """The device-side delay each GPU repetition started behind."""
    interference: dict = field(default_factory=dict)
    """What else the machine did over the repetitions (`interference.Window`): raw readings, judged by
    `casebook.stability`."""
    times: list[float] = field(default_factory=list)
    """Every repetition's time, in microseconds: the raw data the parent summarises again."""


_perf_counter_ns = time.perf_counter_ns
"""The clock the harness reads, bound when casebook.run.bench is imported, before any kernel module: a kernel
module that rebinds `time.perf_counter_ns` (or `time.perf_counter`) changes no timing."""
_cuda_synchronize = torch.cuda.synchronize
_CudaEvent = torch.cuda.Event
_event_record = torch.cuda.Event.record
_event_elapsed = torch.cuda.Event.elapsed_time
"""The same for the device's events: a module that monkeypatches `torch.cuda.Event` times nothing here."""


def _sync(device: str) -> None:
    if device == "cuda":
        _cuda_synchronize()


def l2_bytes() -> int:
    """The GPU's L2 size (64 MiB where torch does not say)."""
    return getattr(torch.cuda.get_device_properties(0), "L2_cache_size", 64 * 2**20) or 64 * 2**20


MAX_INPUT_SETS = 256
"""Most copies of a call's inputs taken in turn (inputs of a few KB stay in cache whatever is done)."""


def input_sets(input_bytes: int, l2: int) -> int:
    """Copies of a call's inputs to take in turn where nothing flushes the cache between calls (CUDA-graph
    replay): enough to span twice the L2, so each call finds its inputs in memory, not in L2."""
    if input_bytes <= 0 or input_bytes >= 2 * l2:
        return 1
    return min(MAX_INPUT_SETS, -(-2 * l2 // input_bytes))


L2_FLUSH_METHOD = "zero a buffer twice the L2 before each repetition (dirty lines, as triton.testing.do_bench)"


class _L2Flusher:
    """Writes a buffer twice the L2 size, evicting whatever the last repetition left there.

    It writes (as triton.testing.do_bench does), leaving dirty lines whose write-back the timed call
    pays: it also leaves its own last writes in the L2 unpaid, so the two balance, as for a kernel
    whose predecessor wrote its output (docs/method.md, 3: "The flush writes")."""

    def __init__(self) -> None:
        self.buffer = torch.empty(l2_flush_bytes() // 4, dtype=torch.int32, device="cuda")

    def __call__(self) -> None:
        self.buffer.zero_()


_flusher: _L2Flusher | None = None


def l2_flush_bytes() -> int:
    """The flush buffer's size: twice the L2, in whole int32 words (read off the device, nothing allocated)."""
    return 2 * l2_bytes() // 4 * 4


def _get_flusher() -> _L2Flusher:
    global _flusher
    if _flusher is None:
        _flusher = _L2Flusher()
    return _flusher


@dataclass
class Step:
    """One call of the function being timed, and what `drive` does around it: all of it outside the
    interval between `t0` and `t1` (and between the `start` and `end` events) but the call itself."""

    prepare: Callable[[], object] | None = None
    flush: Callable[[], object] | None = None
    align: Callable[[], object] | None = None
    """After the flush: the ranks of a multi-device case meet (`Protocol.rank_barrier`)."""
    sleep_cycles: int = 0
    ts: int = 0
    """In ns, when the device-side delay's wait began: before the flush is issued (after the ranks met, with
    `align`). A call returned later than the flush and the delay last ran late."""
    start: object = None
    end: object = None
    sync: str | None = None
    t0: int = 0
    t1: int = 0
    t2: int = 0
    """After the sync (`sync`: the device to wait for), in ns: a first call's time includes its wait."""


def drive(call: Callable[[], object], schedule) -> object:
    """Make every call of `call` that `schedule` (a generator of `Step`s, sent each call's output) asks for,
    here, in this one frame, and return the schedule's value.

    A check, a warm-up call, a timed repetition and a call after timing are the same frame with the same
    caller, each with the cycle collector paused: a function that inspects its call stack or the collector cannot
    tell them apart (docs/method.md, "The trust boundary")."""
    try:
        step = next(schedule)
    except StopIteration as e:
        return e.value
    collecting = gc.isenabled()
    while True:
        if step.prepare is not None:
            step.prepare()
        gc.disable()  # as timeit: a collection set off by the call's allocations would land in its time or delay
        try:
            if step.sleep_cycles:  # before the flush is issued: on an idle device the delay ends no sooner than
                step.ts = _perf_counter_ns()  # the flush's time and its own after this (stamped after the flush, a
            if step.flush is not None:  # call up to the flush's issue time late passed as on time)
                step.flush()
            if step.align is not None:
                step.align()
                step.ts = _perf_counter_ns()  # the ranks met, each after waiting for its device: the delay starts
            if step.sleep_cycles:
                torch.cuda._sleep(step.sleep_cycles)
            if step.start is not None:
                _event_record(step.start)
            step.t0 = _perf_counter_ns()
            out = call()
            step.t1 = _perf_counter_ns()
            if step.end is not None:
                _event_record(step.end)
            if step.sync:
                _sync(step.sync)
            step.t2 = _perf_counter_ns()
        finally:
            if collecting:
                gc.enable()
        try:
            step = schedule.send(out)
        except StopIteration as e:
            return e.value
        finally:
            out = None  # the next call runs with this one's output freed, as in a loop that drops it


def time_fn(fn: Callable[[], object], device: str, protocol: Protocol = Protocol(), input_sets: int = 1) -> Timing:
    """Time `fn()` (which launches the work) on `device`: 'cuda' or 'cpu'. `input_sets`: how many
    different inputs `fn` takes in turn; a CUDA graph captures at least that many calls."""
    return drive(fn, timing_schedule(device, protocol, input_sets, graph_call=fn))


def _ignore(out: object) -> None:
    return None


def timing_schedule(device: str, protocol: Protocol, input_sets: int = 1, *, observe=None, prepare=None,
                    graph_call: Callable[[], object] | None = None):
    """The steps of a timing, for `drive`; returns the `Timing`. `observe(out)` sees each timed
    repetition's output as the call returns (outside its time); `prepare` runs before every call.

    The first call (JIT / autotune / compile, for a caller that has not called yet) is outside the timing;
    then warm-up until steady, the host's issue time (GPU), and repetitions until the median is stable."""
    observe = observe or _ignore
    cold = protocol.cache == "cold"
    if device == "cuda" and not protocol.graph:
        _warm_sampler(cold)
    yield Step(prepare=prepare, sync=device)
    deadline = _perf_counter_ns() + protocol.warmup_ms * 1e6
    host: list[float] = []
    while len(host) < 2 or _perf_counter_ns() < deadline:
        st = Step(prepare=prepare, sync=device)
        yield st
        host.append((st.t1 - st.t0) / 1e3)
    host_us = slack = 0.0  # the events sampler's delay; none on a CPU or in a graph
    if device == "cuda":
        # Back to back, as a loop of calls would issue them (`pipelined_host_us`); the lesser of the two.
        steps = [Step(prepare=prepare) for _ in range(max(2, min(len(host), PIPELINED_CALLS)))]
        steps[-1].sync = device
        for st in steps:
            yield st
        host_us = min(float(np.median(host)), float(np.median([(s.t1 - s.t0) / 1e3 for s in steps])))
    align = _rank_barrier(device) if protocol.rank_barrier else None
    if device != "cuda":
        sample, timer = _cpu_sampler(cold, prepare, align), "time.perf_counter_ns"
    elif protocol.graph:
        graph = _cuda_graph_sampler(graph_call, max(GRAPH_CALLS, input_sets))
        sample, timer = _passive(graph), "cuda graph replay"
    else:
        slack = slack_us(host, protocol.host_slack_us)
        sample, timer = _cuda_sampler(cold, slack, prepare, align), "cuda events"

    reps: list[tuple[float, bool]] = []  # (time, whether the host issued the call after its delay ran out)
    window = interference.Window()
    cap = _perf_counter_ns() + protocol.time_cap_s * 1e9
    batch = protocol.min_reps
    while True:
        reps.extend((yield from sample(batch, observe)))
        times = [t for t, late in reps if not late]
        # Not one repetition on time: a call that waits on the device (`.item()`, a copy to the host), whose time
        # holds the host's. Judged on every repetition, as they will be kept, it stops once they are stable rather
        # than at the cap (Liger's cross-entropy ran to it at every point).
        if not times:
            times = [t for t, _ in reps]
        enough = len(times) >= protocol.min_reps
        if ((enough and median_stable(times, protocol.target_ci) and spread_read(times, device))
                or len(reps) >= protocol.max_reps
                or (_perf_counter_ns() > cap and len(reps) >= protocol.min_reps)):
            break
        batch = min(max(batch, len(reps)), protocol.max_reps - len(reps))
    times = [t for t, late in reps if not late]
    late = len(reps) - len(times)
    readings = window.close()
    if late > len(times):  # the delay does not hide this call's host: every repetition kept
        times = [t for t, _ in reps]
        readings["late_reps_kept"] = late
    elif late:
        readings["late_reps"] = late
    return Timing(summarize(times), timer, host_us, slack, readings, times=times)


SPREAD_REPS = 100
"""Fewest repetitions a point's spread is read from where it is over the stability bound. The median settles in a
few: on an H100 a decode point stopped at 17 repetitions, two of them twice the rest, and its p90 / p10 of 2.02
(the p90 of 17 is their second-slowest) made `casebook check` refuse the case's result. Over the bound, timing
goes on to this many (or the time cap), so the spread is that of the kernel, recurring, not of two repetitions."""


def spread_read(times: list[float], device: str) -> bool:
    """Whether the repetitions' p90 / p10 can be read as the point's: within the stability bound
    (`stability.spread_limit`), or from `SPREAD_REPS` repetitions or more."""
    if len(times) >= SPREAD_REPS:
        return True
    p10, p90 = np.percentile(times, [10, 90])
    return p90 <= spread_limit(device) * p10


_flush_time_us: float | None = None


def _flush_us() -> float:
    """The device's time for one L2 flush (the least of five), measured once a process."""
    global _flush_time_us
    if _flush_time_us is None:
        flusher, pairs = _get_flusher(), [(_CudaEvent(enable_timing=True), _CudaEvent(enable_timing=True))
                                          for _ in range(5)]
        for start, end in pairs:
            _event_record(start)
            flusher()
            _event_record(end)
        _cuda_synchronize()
        _flush_time_us = min(_event_elapsed(a, b) for a, b in pairs) * 1e3
    return _flush_time_us


def _warm_sampler(cold: bool) -> None:
    """What the device-event sampler uses, made and run once before the warm-up: the flush buffer (allocated the
    first time), the device-side delay and the events (each loaded at its first use). Made inside the timing, the
    first repetition followed a host pause of ~80 ms (measured on an H200) in which the device idled, and timed
    slow."""
    if cold:
        _flush_us()
    torch.cuda._sleep(1000)
    start, end = _CudaEvent(enable_timing=True), _CudaEvent(enable_timing=True)
    _event_record(start)
    _event_record(end)


def _rank_barrier(device: str) -> Callable[[], None]:
    """Every rank of the process group waits for the others (and, on a GPU, for its own device: the barrier's
    all-reduce is a kernel), so that each starts its timed repetition together."""
    import torch.distributed as dist

    def align() -> None:
        dist.barrier()
        _sync(device)

    return align


def _passive(sampler: Callable[[int], list[float]]):
    """A sampler that makes its calls itself (a graph's replays), as a schedule's step."""

    def sample(n: int, observe):
        return [(t, False) for t in sampler(n)]
        yield  # a generator that asks `drive` for no call

    return sample


PIPELINED_CALLS = 20
"""Back-to-back calls whose issue times give `Timing.host_us` (fewer where warm-up made fewer calls)."""


def pipelined_host_us(fn: Callable[[], object], calls: int) -> float:
    """Median host time per call of `calls` calls issued back to back, as a loop of them would be. A
    call that waits on the device inside pays that wait here too."""
    _sync("cuda")
    stamps = [time.perf_counter()]
    for _ in range(max(calls, 2)):
        fn()
        stamps.append(time.perf_counter())
    _sync("cuda")
    return float(np.median(np.diff(stamps))) * 1e6


def host_issue_us(fn: Callable[[], object], synced_us: list[float]) -> float:
    """The host's own time to issue one call: the lesser of two measurements, each of which can only
    overstate it. From a synchronised start (`synced_us`, the warm-up calls), a host just back from
    waiting is slow (cold caches, clocks); in a back-to-back loop (`pipelined_host_us`), a call that
    waits on the device inside (a copy of sizes to the host) pays the device's time as well
    (docs/method.md, 3: "Host time is measured two ways")."""
    return min(float(np.median(synced_us)), pipelined_host_us(fn, min(len(synced_us), PIPELINED_CALLS)))


HOST_SLACK_US = 300.0
"""The least device-side delay before each timed call. Warm-up times the call alone; a repetition also issues
the flush, the delay and the start event before it (about 35 us on an H200), and a call just after a device
wait (a kept output's checksum) issues slower (the softmax one-pass kernel's: 89-163 us, p10-p90, against 57-74).
Behind the 100-207 us delays those rules gave, 13-37 of 80-320 repetitions of 12-23 us kernels ran late, and where
they were the majority the point was unstable (p90/p10 up to 6.3); behind 300 us, 0-4 of 160-320, spread
1.05-1.11 (benchmarks/explore/method/late_reps.py). The delay costs wall time only: 200 us more a repetition."""

HOST_SLACK_MARGIN = 1.5
"""The delay covers this many times the p90 of the host's issue time in warm-up: a repetition whose
host time reaches the delay lets the device idle inside the timing (measured on an H200: torch.compile
calls of 100-170 us behind a fixed 100 us delay moved their medians 6-8% between runs)."""


def slack_us(host_times_us: list[float], fixed: float | None = None) -> float:
    """The device-side delay before each repetition: `fixed` if given, else enough to hide the host."""
    if fixed is not None:
        return fixed
    return max(HOST_SLACK_US, HOST_SLACK_MARGIN * float(np.percentile(host_times_us, 90)))


def _cuda_sampler(flush: bool, slack: float, prepare=None, align=None):
    """Repetitions timed by device events, each behind an L2 flush (cold) and a device-side delay that hides
    the host's issue time; the events are made before the batch and read after it. Each time comes with whether
    the host issued the call later than the delay lasts (from the delay's issue to the call's return): then the
    device may have idled between the start event and the call. The delay begins once the flush issued before it
    has run, so a call is late only past the flush's time and the delay's together."""
    flusher = _get_flusher() if flush else None
    cycles = int(slack * 2000)  # at least `slack` us at any SM clock up to 2 GHz
    # the delay starts once the flush issued after `Step.ts` has run; after a meeting of ranks (`align`, which waits
    # for the device) at once
    late_us = slack + (_flush_us() if flush and align is None else 0.0)

    def sample(n: int, observe):
        steps = [Step(prepare=prepare, flush=flusher, align=align, sleep_cycles=cycles,
                      start=_CudaEvent(enable_timing=True), end=_CudaEvent(enable_timing=True)) for _ in range(n)]
        steps[-1].sync = "cuda"
        for st in steps:
            observe((yield st))
        return [(_event_elapsed(s.start, s.end) * 1e3, (s.t1 - s.ts) / 1e3 > late_us) for s in steps]

    return sample


GRAPH_CALLS = 20


def _cuda_graph_sampler(fn: Callable[[], object], calls: int) -> Callable[[int], list[float]]:
    """Replay a graph of `calls` calls; one sample is the replay time over `calls`. Nothing is flushed
    between them: a cold-cache case gives `fn` inputs to take in turn (`input_sets`), all inside the graph."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            fn()
    graph.replay()
    torch.cuda.synchronize()

    def sample(n: int) -> list[float]:
        starts = [torch.cuda.Event(enable_timing=True) for _ in range(n)]
        ends = [torch.cuda.Event(enable_timing=True) for _ in range(n)]
        for s, e in zip(starts, ends):
            s.record()
            graph.replay()
            e.record()
        torch.cuda.synchronize()
        return [s.elapsed_time(e) * 1e3 / calls for s, e in zip(starts, ends)]

    return sample


def _cpu_last_level_cache_bytes() -> int:
    sizes = []
    for f in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*/size"):
        text = f.read_text().strip().upper()
        scale = {"K": 2**10, "M": 2**20}.get(text[-1:], 1)
        sizes.append(int(text.rstrip("KM")) * scale)
    return max(sizes, default=64 * 2**20)


_cpu_flush_buffer: torch.Tensor | None = None


def _cpu_flush() -> None:
    """Read and write a buffer twice the last-level cache: the next call finds its data in memory, not cache."""
    global _cpu_flush_buffer
    if _cpu_flush_buffer is None:
        _cpu_flush_buffer = torch.zeros(2 * _cpu_last_level_cache_bytes() // 4, dtype=torch.int32)
    _cpu_flush_buffer.add_(1)  # not zero_(): large memsets use non-temporal stores, which bypass the cache


def _cpu_sampler(flush: bool, prepare=None, align=None):
    def sample(n: int, observe):
        steps = [Step(prepare=prepare, flush=_cpu_flush if flush else None, align=align) for _ in range(n)]
        for st in steps:
            observe((yield st))
        return [((s.t1 - s.t0) / 1e3, False) for s in steps]

    return sample


def count_launches(fn: Callable[[], object]) -> dict[str, int]:
    """Kernels one call runs on the GPU, counted with the profiler: launched directly, or replayed in a graph."""
    import warnings

    from torch.profiler import ProfilerActivity, profile

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
                fn()
                torch.cuda.synchronize()
    except Exception:  # the profiler is optional: without it, one launch is the floor
        return {"direct": 1, "graph": 0, "counted": False}
    events = prof.events()
    kernels = sum(1 for e in events if e.device_type == torch.autograd.DeviceType.CUDA
                  and not any(w in e.name.lower() for w in ("memcpy", "memset")))
    direct = sum(1 for e in events if e.device_type == torch.autograd.DeviceType.CPU
                 and "launchkernel" in e.name.lower())
    direct = min(direct, kernels) if kernels else direct
    return {"direct": max(direct, 1 if kernels == 0 else direct), "graph": max(0, kernels - direct), "counted": True}
