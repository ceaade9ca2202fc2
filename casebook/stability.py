"""Was a point timed on a quiet machine? Judged from its own spread and the readings that
`casebook.run.interference` took around its timing, against the bounds below. Pure functions: a point
over a bound is unstable, with the reason in numbers, and `casebook check` will not publish it.
"""

from __future__ import annotations

from casebook.result import Interference, Point, StabilityBounds, StabilitySummary

SPREAD_RATIO_MAX = {"cuda": 1.5, "cpu": 3.0}
"""Largest p90 / p10 of a point's repetitions. On an H200 the stored points reach 1.17 (softmax) to 1.47
(one grouped-GEMM point); CPU points on a quiet shared 2-core box 1.3-2.1, where each repetition pays a
cache flush of a few ms. A CPU point timed beside a busy process read 1,291-31,477 us (24x)."""

OTHER_CPU_MAX_CORES = 0.5
"""Most CPU other processes may take over a point's timing, in cores (their CPU seconds over the
window's): more than half a core means they ran on a CPU this run's timing thread or its torch threads
could have needed."""

RUN_QUEUE_WAIT_MAX = 0.05
"""Most of a point's timing window its thread may spend runnable but waiting for a CPU: a repetition that
waits is timed waiting. The measure of contention that also holds for short windows."""

MIN_WINDOW_S = 0.1
"""Shortest window over which other processes' CPU time is judged: /proc/stat counts in ticks of 10 ms
per CPU, so a shorter window's reading is mostly rounding (the run-queue wait, in ns, is judged anyway)."""

TICK_ALLOWANCE_S = 0.01
"""One /proc/stat tick per CPU: the rounding of a window's busy time, forgiven before judging it."""


def spread_limit(device: str) -> float:
    """The largest p90 / p10 a point on `device` may have (`SPREAD_RATIO_MAX`; a device it does not name, the CPU's)."""
    return SPREAD_RATIO_MAX.get(device, SPREAD_RATIO_MAX["cpu"])


def timed_on(point: Point, device: str) -> str:
    """Whose pace a point's repetitions read: on a GPU where most of them kept the host's time to issue the call
    (`late_reps_kept`: a call that waits for the device itself, which the device-side delay cannot hide), the
    host's, and its spread is the host's (Liger's cross-entropy at 64 x 128256 read 268-425 us, p90/p10 1.59, on
    a quiet H100, every repetition waiting on the host); else `device`'s. Other processes and CPU waits are
    judged either way."""
    reading = point.interference
    return "cpu" if device != "cpu" and reading is not None and reading.late_reps_kept else device


def bounds() -> StabilityBounds:
    """The bounds, as stored with every result."""
    return StabilityBounds(spread_ratio_max=SPREAD_RATIO_MAX, other_cpu_max_cores=OTHER_CPU_MAX_CORES,
                           run_queue_wait_max=RUN_QUEUE_WAIT_MAX, min_window_s=MIN_WINDOW_S)


def other_cores(reading: Interference) -> float | None:
    """Other processes' CPU over the window, in cores; None where unread or the window is too short."""
    window, other = reading.window_s, reading.other_cpu_s
    if other is None or not window or window < MIN_WINDOW_S:
        return None
    cpus = 1 if reading.cpus is None else reading.cpus
    return max(0.0, other - TICK_ALLOWANCE_S * cpus) / window


def readings(point: Point) -> list[tuple[str, Interference]]:
    """The readings a point is judged by, each with how a reason names it: a multi-device point's every
    rank's (`rank_interference`: a busy CPU slows the collective whichever rank it is beside), else its own."""
    if point.rank_interference:
        return [(f"rank {r}: ", reading) for r, reading in enumerate(point.rank_interference)]
    return [("", point.interference or Interference())]


def reasons(point: Point, device: str) -> list[str]:
    """Why a timed point is unstable (empty: stable, or nothing to judge)."""
    out = []
    p10, p90 = point.p10_us, point.p90_us
    pace = timed_on(point, device)
    limit = spread_limit(pace)
    if p10 and p90 and p90 / p10 > limit:
        whose = " (the host's bound: most repetitions waited on the host)" if pace != device else ""
        out.append(f"spread p90/p10 {p90 / p10:.2f} over {limit:g}{whose} ({p10:.1f}-{p90:.1f} us)")
    for who, reading in readings(point):
        out += reading_reasons(reading, who)
    return out


def reading_reasons(reading: Interference, who: str = "") -> list[str]:
    """Why one reading of the machine makes what was timed over it unstable, each reason led by `who` (empty:
    a quiet reading, or nothing read): a point's, or the ceilings' measured on a CPU."""
    out = []
    cores = other_cores(reading)
    if cores is not None and cores > OTHER_CPU_MAX_CORES:
        out.append(f"{who}other processes used {cores:.2f} cores over the {reading.window_s:.2f} s timing "
                   f"(at most {OTHER_CPU_MAX_CORES:g})")
    wait, window = reading.run_queue_wait_s, reading.window_s
    if wait is not None and window and wait / window > RUN_QUEUE_WAIT_MAX:
        out.append(f"{who}waited for a CPU {wait / window:.0%} of the timing (at most {RUN_QUEUE_WAIT_MAX:.0%})")
    if reading.gpu is not None and reading.gpu.other_processes:
        out.append(f"{who}other processes on the GPU: pid {', '.join(map(str, reading.gpu.other_processes))}")
    return out


def summary(points: list[Point]) -> StabilitySummary:
    """How many timed points were judged, how many are unstable, and the busiest reading of the run."""
    timed = [p for p in points if p.median_us is not None]
    unstable = [p for p in timed if p.unstable]
    every = [r for p in timed for _, r in readings(p)]
    cores = [c for c in (other_cores(r) for r in every) if c is not None]
    waits = [r.run_queue_wait_s / r.window_s for r in every if r.run_queue_wait_s is not None and r.window_s]
    return StabilitySummary(points=len(timed), unstable=len(unstable), other_cores_max=max(cores, default=None),
                            run_queue_wait_max=max(waits, default=None), bounds=bounds())
