"""The result format: what one `casebook run` measured, as it is stored under `results/` and read by the
site; strict, every field described (`casebook schema --result`)."""

from __future__ import annotations

import re
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationError

from casebook.case import DTYPE_BYTES, HardwareSlug, Ident, Regime

RESULT_SCHEMA_VERSION = 2
"""Current version of the result format. 2: every field declared (`Result`), none undeclared allowed; version 1
is migrated in memory (`results.MIGRATIONS`)."""

RECORD_TEXT_MAX = 20_000
"""The longest text a result may hold in one field (a case's longest prose, `Text`): a forged 8 MiB error string
would otherwise make an 8 MiB page."""


class Record(BaseModel):
    """Base for result records: written by casebook; a field not declared here is an error, and so is a text longer
    than `RECORD_TEXT_MAX` or a number that is not finite (a stored result is strict JSON). A field set after
    construction is validated as it is set: a record is valid from the moment it exists, and is not validated
    again before it is written. Read by attribute; `model_dump(exclude_unset=True)` gives the keys the stored
    JSON had."""

    model_config = ConfigDict(extra="forbid", str_max_length=RECORD_TEXT_MAX, allow_inf_nan=False,
                              validate_assignment=True)


ShapeDims = dict[str, int]
"""A measured shape: dimension name to size, as the case gives it."""


class GpuState(Record):
    """A GPU's clocks and tenants, read after a point's timing (`interference.gpu_state`)."""

    sm_clock_mhz: float = Field(description="SM clock, MHz.")
    mem_clock_mhz: float = Field(description="Memory clock, MHz.")
    other_processes: list[int] = Field(description="Pids of compute processes on the GPU that are not this run's.")


class Interference(Record):
    """What else the machine did over one timing window (`casebook.run.interference.Window`); absent where unread."""

    window_s: float | None = Field(default=None, description="Length of the window, seconds.")
    other_cpu_s: float | None = Field(
        default=None, description="CPU seconds other processes used over the window (busy time less this run's).")
    cpus: int | None = Field(default=None, description="CPUs the busy time was read over (those the process may "
                                                       "run on).")
    run_queue_wait_s: float | None = Field(
        default=None, description="Seconds the timing thread waited, runnable, for a CPU over the window.")
    load_average: list[float] | None = Field(default=None, description="1, 5 and 15 minute load averages at the "
                                                                       "window's end.")
    load_average_start: list[float] | None = Field(default=None, description="The load averages at its start.")
    run_cpu_s: float | None = Field(
        default=None, description="Multi-device runs: CPU seconds of the sibling ranks and their launcher, left "
                                  "out of other_cpu_s.")
    gpu: GpuState | None = Field(default=None, description="On a GPU: its clocks and other tenants after the timing.")
    late_reps: int | None = Field(
        default=None, description="On a GPU: repetitions whose call the host issued after the device-side delay ran "
                                  "out (the device idled inside their time), left out of the times and replaced.")
    late_reps_kept: int | None = Field(
        default=None, description="Such repetitions kept in the times, as they were the majority: the delay does not "
                                  "hide this call's host time (a call that waits for the device itself).")


class TrafficTerm(Record):
    """One pass the traffic model counts: what it is, the bytes it moves through device memory, the FLOPs it does.
    A kernel module's traffic model lists them (`casebook.traffic.Term`, its name first: `Term("read x",
    bytes=n * 2)`); a point stores them as its model gave them."""

    model_config = ConfigDict(frozen=True)

    name: str = Field(description="What the pass is, e.g. `read x`. Its first word gives its bytes' direction, "
                                  "which sets their memory roof (`roofline.write_share`): `read` or `write`; any "
                                  "other, half each (a copy's mix).")
    bytes: float = Field(default=0.0, description="Bytes it moves.")
    flops: float = Field(default=0.0, description="FLOPs it does.")
    link: bool = Field(default=False, description="True where its bytes cross the interconnect between devices "
                                                  "instead (a collective's bus bytes), held to the link's measured "
                                                  "ceiling, not memory's.")

    def __init__(self, name: str | None = None, /, **fields):
        super().__init__(**({"name": name} if name is not None else {}), **fields)


class Launches(Record):
    """Kernels one call launches."""

    direct: int = Field(description="Kernels launched directly.")
    graph: int = Field(description="Kernels replayed inside a CUDA graph.")
    counted: bool | None = Field(
        default=None, description="On a GPU: whether the profiler counted them (else one direct launch is assumed).")


class HarnessCost(Record):
    """What measuring one point cost the harness, beside what its timed calls took (`run.orchestrate.execute`)."""

    wall_s: float | None = Field(default=None, description="The point's whole time in the run, seconds: the "
                                                           "reference, the variant's child, the crossing, the judging.")
    timed_s: float | None = Field(default=None, description="The sum of its timed repetitions, seconds: what the "
                                                            "timing measured.")
    oracle_s: float | None = Field(default=None, description="Waiting for the reference's answers, seconds (0 where "
                                                             "every answer was kept from an earlier variant).")
    start_s: float | None = Field(default=None, description="Waiting for the variant's child to finish starting "
                                                            "(importing torch, Triton and the case, making the "
                                                            "device's context), seconds: a variant's first point, "
                                                            "where the child started ahead had not yet greeted.")
    transport_s: float | None = Field(default=None, description="Reading the child's answer once it began to "
                                                                "arrive, seconds: the crossing of its outputs.")
    judge_s: float | None = Field(default=None, description="Comparing the outputs with the answers, summarising "
                                                            "and placing the point, seconds.")
    crossing: str | None = Field(default=None, description="How its outputs reached the judge: `device` (memory "
                                                           "lent on the GPU) or `host`, with why where the device "
                                                           "crossing was meant and failed.")
    kept: bool | None = Field(default=None, description="True where a resumed run kept the point from the run it "
                                                        "resumed (these costs are that run's).")


class Point(Record):
    """One level-1 (or level-2) measurement of one variant at one shape and dtype."""

    variant: str = Field(description="Variant name.")
    shape: ShapeDims = Field(description="The shape measured.")
    dtype: str = Field(description="The dtype measured.")
    status: Literal["ok", "failed", "crashed", "timeout", "checked", "skipped"] = Field(
        description="ok: checked and timed; failed: wrong answer; crashed/timeout: contained; checked: correct, not "
                    "timed here; skipped: backend absent."
    )
    correct: bool | None = Field(default=None, description="Whether the output matched the float64 reference.")
    max_rel_err: float | None = Field(default=None, description="Largest normwise relative error over the checks.")
    max_row_err: float | None = Field(default=None, description="Largest per-row relative error over the checks.")
    checked_calls: int | None = Field(default=None, description="Calls whose outputs were checked (every rank's).")
    median_us: float | None = Field(default=None, description="Median time per call, microseconds.")
    median_ci_us: list[float] | None = Field(
        default=None, description="The median's 95% confidence interval (order statistics), microseconds.")
    p10_us: float | None = Field(default=None, description="10th percentile time per call, microseconds.")
    p90_us: float | None = Field(default=None, description="90th percentile time per call, microseconds.")
    cv: float | None = Field(default=None, description="Coefficient of variation of the timings (std / mean).")
    repetitions: int | None = Field(default=None, description="Timed repetitions.")
    input_sets: int | None = Field(
        default=None, description="Copies of the inputs taken in turn (CUDA-graph replay with a cold cache); absent: "
                                  "one.")
    flops: float | None = Field(default=None, description="FLOPs from the traffic model.")
    bytes: float | None = Field(default=None, description="Bytes moved, from the traffic model.")
    gbps: float | None = Field(default=None, description="Achieved bandwidth: bytes over the median time, GB/s.")
    tflops: float | None = Field(default=None, description="Achieved throughput: FLOPs over the median time, TFLOP/s.")
    arithmetic_intensity: float | None = Field(default=None, description="FLOPs per byte, from the traffic model.")
    floor_us: float | None = Field(default=None, description="The roofline floor: least time the roofs allow, "
                                                             "microseconds.")
    bandwidth_floor_us: float | None = Field(default=None, description="Bytes over the bandwidth roof, microseconds "
                                                                       "(less link_bytes, where there is a link).")
    launch_floor_us: float | None = Field(
        default=None, description="Every kernel at its cost inside a CUDA graph, microseconds.")
    roof_fraction: float | None = Field(default=None, description="floor_us over median_us: the fraction of the roof "
                                                                  "reached.")
    regime: Regime | None = Field(default=None, description="Which roof bounds this point: compute, bandwidth or "
                                                            "launch.")
    host_issue_us: float | None = Field(
        default=None, description="Host time to issue one call (GPU only; measured in warm-up, hidden from the "
                                  "timing): "
                                 "the lesser of the median from a synchronised start and the median per call in a "
                                 "back-to-back loop. Above every floor it makes the point launch-bound.")
    autotuned: dict[str, str] | None = Field(
        default=None, description="Configuration each Triton autotuner ran in the timed calls, by module.kernel.")
    speedup: float | None = Field(default=None, description="Baseline median over this median.")
    threads: int | None = Field(default=None, description="Threads torch's CPU path ran with (set explicitly).")
    ranks: int | None = Field(default=None, description="Multi-device cases: the ranks (one process a device) that "
                                                        "timed the point together; absent: one device.")
    rank_median_us: list[float] | None = Field(
        default=None, description="Multi-device cases: each rank's median time per call, microseconds, in rank "
                                  "order; the point's median_us (and its p10, p90) are the slowest rank's.")
    rank_interference: list[Interference] | None = Field(
        default=None, description="Multi-device cases: each rank's reading of the machine over its timing (as "
                                  "`interference`, in rank order); the point is unstable where any rank's is over "
                                  "the bounds.")
    slowest_rank: int | None = Field(default=None, description="Multi-device cases: the rank whose times are the "
                                                               "point's (the largest of rank_median_us).")
    interference: Interference | None = Field(
        default=None, description="What else the machine did over the repetitions: window_s, other_cpu_s (other "
                                 "processes' CPU seconds), cpus, run_queue_wait_s, load_average; in a multi-device "
                                 "run, run_cpu_s (the sibling ranks' and their launcher's CPU seconds, left out of "
                                 "other_cpu_s); on a GPU, its clocks and other processes (`run.interference`).")
    unstable: list[str] | None = Field(
        default=None, description="Why the point is unstable (spread or interference over the bounds in "
                                 "`casebook.stability`); absent: stable. `casebook check` does not publish it.")
    error: str | None = Field(default=None, description="What went wrong, when status is not ok.")
    first_call_s: float | None = Field(
        default=None, description="The first call at this shape (JIT, autotuning, compilation), seconds: never inside "
                                  "the median.")
    timer: str | None = Field(default=None, description="What timed the repetitions: cuda events, or "
                                                        "time.perf_counter_ns on a CPU.")
    traffic_terms: list[TrafficTerm] | None = Field(
        default=None, description="The traffic model's terms: name, bytes and FLOPs of each pass it counts.")
    launches: Launches | None = Field(
        default=None, description="Kernels a call launches, counted by the profiler: direct, in a CUDA graph, and "
                                  "whether they were counted (else assumed one).")
    compute_floor_us: float | None = Field(default=None, description="FLOPs over the compute roof, microseconds.")
    attainable_tflops: float | None = Field(
        default=None, description="The FLOPs over the floor: the rate the roofs allow at this point, TFLOP/s.")
    compute_roof_tflops: float | None = Field(default=None, description="The compute roof it was placed under, TFLOP/s "
                                                                        "(the measured matmul ceiling of its dtype).")
    bandwidth_roof_gbps: float | None = Field(default=None, description="The bandwidth roof it was placed under, GB/s "
                                                                        "(the measured copy ceiling, or between it "
                                                                        "and a measured read or write stream by the "
                                                                        "share of its bytes written).")
    link_bytes: float | None = Field(
        default=None, description="Multi-device cases: the part of `bytes` that crosses the link between devices (a "
                                  "collective's bus bytes, 2(n-1)/n of an all-reduce's message, NCCL's convention).")
    bus_gbps: float | None = Field(default=None, description="Multi-device cases: link_bytes over the median time, "
                                                             "GB/s (NCCL's bus bandwidth).")
    link_floor_us: float | None = Field(
        default=None, description="Multi-device cases: link_bytes over the link roof, microseconds; the other bytes "
                                  "are on the bandwidth (memory) roof.")
    link_roof_gbps: float | None = Field(
        default=None, description="Multi-device cases: the link roof it was placed under, GB/s (the hardware's "
                                  "measured interconnect ceiling, `hardware.topology.bus_gbps`).")
    peak_memory_bytes: int | None = Field(
        default=None, description="Device memory one call allocated at its peak above what was allocated when it "
                                  "started (its inputs among it), bytes: the allocator's peak statistics, reset "
                                  "before the second check call. Absent: not measured (a CPU).")
    input_bytes: int | None = Field(default=None, description="Bytes of the call's input tensors.")
    weight: float | None = Field(default=None, description="Level 2: the shape's weight in the distribution.")
    source: str | None = Field(default=None, description="Level 2: where the shape and its weight come from.")
    harness: HarnessCost | None = Field(
        default=None, description="What measuring the point cost: wall time, timed time, the wait for the "
                                  "reference, the crossing and the judging, seconds.")


class ClaimPairedTiming(Record):
    """One point of a kernel-level speedup claim timed in alternation with the variant it is measured against."""

    shape: ShapeDims = Field(description="The shape timed.")
    dtype: str = Field(description="The dtype timed.")
    status: str = Field(description="ok: timed.")
    rounds_us: list[list[float]] = Field(description="Each round's two medians (the variant, then the other), "
                                                     "microseconds.")
    speedup: float = Field(description="Median over the rounds of the other's median over the variant's.")
    speedup_min: float = Field(description="The least round's ratio.")
    speedup_max: float = Field(description="The greatest round's ratio.")


class ClaimOutcome(Record):
    """One claim checked against the measurements."""

    text: str = Field(description="The claim in words.")
    kind: str = Field(description="The claim's kind: regime, roof_fraction, throughput, latency or speedup.")
    variant: str | None = Field(default=None, description="The variant the claim is about.")
    held: bool | None = Field(description="True held, False failed, None not applicable on this hardware.")
    detail: str = Field(description="The numbers behind the verdict.")
    paired: list[ClaimPairedTiming] | None = Field(
        default=None, description="Kernel-level speedup claims: the paired timing at each point, where every one "
                                  "was timed; the verdict is on the worst.")


class Datasheet(Record):
    """The hardware registry's entry for the device (`casebook/data/hardware.yaml`): leads, not ceilings."""

    name: str = Field(description="The product's name.")
    match: list[str] = Field(description="Substrings of the device name that select this entry.")
    bandwidth_gbps: float | None = Field(default=None, description="Peak memory bandwidth, GB/s.")
    memory_gb: float | None = Field(default=None, description="Device memory, GB.")
    l2_mb: float | None = Field(default=None, description="L2 cache, MB.")
    sm_count: int | None = Field(default=None, description="Streaming multiprocessors.")
    peak_tflops: dict[str, float] | None = Field(default=None, description="Dense peak rate per dtype, TFLOP/s.")
    link_gbps: float | None = Field(default=None, description="GPU-to-GPU link bandwidth one way, GB/s.")
    source: str | None = Field(default=None, description="Where the figures come from.")


class CeilingMethod(Record):
    """How each ceiling was measured, in words."""

    model_config = ConfigDict(validate_by_name=True, serialize_by_alias=True)

    copy_: str = Field(alias="copy", description="The copy whose bytes read + written over its fastest time are "
                                                 "copy_gbps.")
    read: str | None = Field(default=None, description="The read-only streams whose fastest rate is read_gbps.")
    write: str | None = Field(default=None, description="The fill whose rate is write_gbps.")
    matmul: str = Field(description="The matmuls whose fastest rate is matmul_tflops.")
    launch: str = Field(description="The tiny kernel whose cost is launch_us.")
    graph_launch: str | None = Field(default=None, description="On a GPU: the CUDA graph whose per-kernel cost is "
                                                               "graph_launch_us.")


class Ceilings(Record):
    """The machine's measured ceilings (`hardware.ceilings`): the roofs every point is placed under."""

    copy_gbps: float = Field(description="Copy bandwidth, bytes read + written over the fastest copy, GB/s.")
    read_gbps: float | None = Field(default=None, description="A stream that only reads: bytes read over the "
                                                              "fastest of the read-only streams timed, GB/s; the "
                                                              "roof of read-only traffic (`Roofs.bandwidth_at`). "
                                                              "Absent: not measured, reads at the copy's rate.")
    write_gbps: float | None = Field(default=None, description="A stream that only writes: bytes written over the "
                                                               "fastest fill, GB/s. Absent: not measured, writes at "
                                                               "the copy's rate.")
    matmul_tflops: dict[str, float] = Field(description="Fastest dense matmul rate per dtype, TFLOP/s.")
    launch_us: float = Field(description="Cost of one back-to-back kernel launch (on a CPU, one tiny op call), "
                                         "microseconds.")
    graph_launch_us: float = Field(description="Cost of one kernel inside a replayed CUDA graph (on a CPU, as "
                                               "launch_us), microseconds.")
    method: CeilingMethod | None = Field(default=None, description="How each ceiling was measured.")
    interference: Interference | None = Field(default=None, description="What else the machine did while they "
                                                                        "were measured.")
    unstable: list[str] | None = Field(default=None, description="Why they were measured on a busy machine (not "
                                                                 "cached); absent: a quiet one.")
    version: int | None = Field(default=None, description="Version of the ceilings' cache format.")
    torch: str | None = Field(default=None, description="torch version they were measured with.")
    slug: str | None = Field(default=None, description="The hardware they were measured on.")
    measure_s: float | None = Field(default=None, description="How long measuring them took, seconds (every attempt "
                                                              "on a busy machine included).")
    measured_at: str | None = Field(default=None, description="When they were measured, UTC ISO 8601 (a run may "
                                                              "read them from the machine's cache, measured earlier).")


class MeasuredLink(Record):
    """Multi-device cases: the devices and their link, measured before the run (`run.rank.topology`)."""

    devices: int = Field(description="Devices (ranks) the case runs on.")
    backend: str | None = Field(default=None, description="torch.distributed backend: nccl or gloo.")
    link: str | None = Field(default=None, description="The link between devices: `loopback` for CPU ranks, else "
                                                       "what `nvidia-smi topo -m` says.")
    message_bytes: int | None = Field(default=None, description="Size of the all-reduce timed, bytes.")
    bus_gbps: float | None = Field(default=None, description="Bus bandwidth of the fastest all-reduce, GB/s: the "
                                                             "link roof.")
    method: str | None = Field(default=None, description="How it was measured, in words.")
    error: str | None = Field(default=None, description="Why it was not measured.")


class Machine(Record):
    """Which machine this is (`run.hardware.identify`): its name, its datasheet entry; over one device, the devices
    a case runs on together and their link."""

    slug: HardwareSlug = Field(description="The hardware's name in results/ (with `-x<devices>` over one device).")
    name: str = Field(description="The device's name (a CPU's model name).")
    kind: Literal["gpu", "cpu"] = Field(description="gpu or cpu.")
    datasheet: Datasheet | None = Field(default=None, description="The registry's entry, where one matches.")
    cores: int | None = Field(default=None, description="CPU machines: logical CPUs.")
    memory_gib: float | None = Field(default=None, description="CPU machines: installed memory, GiB.")
    devices: int | None = Field(default=None, description="Multi-device cases: devices run together; absent: one.")
    topology: MeasuredLink | None = Field(default=None, description="Multi-device cases: the devices and their link.")

    def given(self) -> dict:
        """Its fields as they were set (none defaulted), records as records: to build a larger record from it."""
        return {k: getattr(self, k) for k in self.model_fields_set}


class Hardware(Machine):
    """The machine that ran: its name, its datasheet entry, the ceilings measured on it."""

    measured: Ceilings = Field(description="The ceilings measured on this machine.")


class Clocks(Record):
    """The GPU's clocks, temperature and power at one moment, as nvidia-smi prints them; empty elsewhere."""

    clocks_sm: str | None = Field(default=None, description="SM clock, MHz.")
    clocks_mem: str | None = Field(default=None, description="Memory clock, MHz.")
    temperature_gpu: str | None = Field(default=None, description="GPU temperature, degrees C.")
    power_draw: str | None = Field(default=None, description="Power draw, W.")


class DeviceIds(Record):
    """Which device of the host ran."""

    cuda_visible_devices: str | None = Field(default=None, description="`CUDA_VISIBLE_DEVICES` as set.")
    uuid: str | None = Field(default=None, description="The GPU's UUID (nvidia-smi).")
    pci_bus_id: str | None = Field(default=None, description="The GPU's PCI bus id (nvidia-smi).")


class Environment(Record):
    """Software and device versions, clocks and load: what a reproduction needs (`hardware.environment`)."""

    python: str = Field(description="Python version.")
    platform: str = Field(description="`platform.platform()`: OS, kernel, libc.")
    torch: str = Field(description="torch version.")
    cuda: str | None = Field(default=None, description="CUDA version torch was built with; absent: a CPU build.")
    cpu: str = Field(description="The host CPU's model name.")
    cpu_count: int | None = Field(default=None, description="Logical CPUs of the host.")
    triton: str | None = Field(default=None, description="Triton version; absent: not installed.")
    casebook_commit: str | None = Field(default=None, description="git HEAD of casebook; absent outside a checkout.")
    casebook_dirty: bool | None = Field(default=None, description="Whether the checkout had uncommitted changes.")
    casebook_sha256: str | None = Field(default=None, description="sha256 over casebook's own Python sources.")
    device_name: str | None = Field(default=None, description="GPU: the device's name.")
    sm_count: int | None = Field(default=None, description="GPU: streaming multiprocessors.")
    memory_gb: float | None = Field(default=None, description="GPU: device memory, GB.")
    l2_mb: float | None = Field(default=None, description="GPU: L2 cache, MiB.")
    capability: str | None = Field(default=None, description="GPU: compute capability, e.g. `9.0`.")
    driver_version: str | None = Field(default=None, description="GPU: driver version (nvidia-smi).")
    clocks_max_sm: str | None = Field(default=None, description="GPU: maximum SM clock, MHz (nvidia-smi).")
    clocks_max_mem: str | None = Field(default=None, description="GPU: maximum memory clock, MHz (nvidia-smi).")
    power_limit: str | None = Field(default=None, description="GPU: power limit, W (nvidia-smi).")
    device: DeviceIds | None = Field(default=None, description="Which device of the host ran.")
    clocks_start: Clocks = Field(description="GPU clocks as the run started.")
    load_average_start: list[float] | None = Field(default=None, description="1, 5, 15 minute load averages at the "
                                                                             "start.")
    cpu_threads: int | None = Field(default=None, description="Threads torch's CPU path ran with in every child.")
    clocks_end: Clocks = Field(description="GPU clocks as it finished.")
    load_average_end: list[float] | None = Field(default=None, description="The load averages at the end.")


class Protocol(Record):
    """How a point is timed: the harness times by it (`casebook.run.bench`), and every result stores it (as part of
    `TimingProtocol`). Each field has the harness's default; a stored result sets every one it was timed with."""

    model_config = ConfigDict(frozen=True)

    cache: str = Field(default="cold", description="cold: caches flushed before each repetition; warm: not.")
    graph: bool = Field(default=False, description="Whether each call is replayed in a CUDA graph.")
    warmup_ms: float = Field(default=25.0, description="Warm-up before timing, milliseconds.")
    min_reps: int = Field(default=10, description="Fewest timed repetitions.")
    max_reps: int = Field(default=2000, description="Most timed repetitions.")
    target_ci: float | None = Field(
        default=0.005, description="Repetitions stop once the median's 95% confidence interval lies within this "
                                   "fraction of it on either side (`stats.median_stable`), or at max_reps or "
                                   "time_cap_s (why: docs/method.md, 3); absent in results timed under the older "
                                   "rule.")
    time_cap_s: Annotated[float, Field(allow_inf_nan=True)] = Field(
        default=1.0, description="Most time spent timing one point, seconds (unbounded for the ranks of a "
                                 "multi-device point, which stop together: `run.distributed.lockstep`).")
    statistic: str = Field(default="median", description="The statistic reported: median.")
    host_slack_us: float | None = Field(
        default=None, description="Device-side delay before each GPU call, microseconds; absent: long enough to "
                                  "hide the call's host time (`bench.slack_us`); a number: exactly that, and host "
                                  "time beyond it shows in the timing.")
    rank_barrier: bool | None = Field(
        default=False, description="Multi-device cases: whether every rank waits for the others at a barrier "
                                   "before each timed repetition, after its cache flush, outside its time (without "
                                   "it a rank's time of a collective holds its siblings' lateness).")


class TimingProtocol(Protocol):
    """How the points were timed and checked: the `Protocol`, with the case's cache and graph, and the rules."""

    timer: str = Field(description="cuda events, or time.perf_counter_ns on a CPU.")
    seed: int = Field(description="Base seed of the inputs.")
    tolerances: dict[str, float] = Field(description="Normwise relative error allowed, per dtype.")
    row_tolerances: dict[str, float] | None = Field(default=None, description="Per-row relative error allowed, per "
                                                                             "dtype.")
    isolation: str = Field(description="How variants are kept apart, in words.")
    transport: str | None = Field(default=None, description="How outputs and answers crossed to the judge: on the "
                                                            "device, or through the host (and why), in words.")
    correctness: str = Field(description="How outputs are checked, in words.")
    ranks: str | None = Field(default=None, description="Multi-device cases: how the ranks time a point, in words.")
    host_slack: str | None = Field(default=None, description="GPU: the device-side delay's rule, in words.")
    host_issue: str | None = Field(default=None, description="GPU: how host_issue_us is measured, in words.")
    l2_flush: str | None = Field(default=None, description="GPU, cold cache: how L2 is flushed, in words.")
    l2_flush_bytes: int | None = Field(default=None, description="GPU: bytes written to flush L2.")


class VariantOutcome(Record):
    """One variant on this machine: where it ran and how."""

    name: str = Field(description="Variant name.")
    note: str = Field(description="The case's one line on what it changes.")
    backends: list[str] = Field(description="The backends it declares.")
    device: str | None = Field(description="Where it ran: cuda or cpu; absent: it cannot run here.")
    mode: Literal["timed", "checked", "skipped"] = Field(
        description="timed: checked and timed; checked: correct, not timed here; skipped: no backend here.")
    first_call_s: float | None = Field(default=None, description="Its first call at its first shape (JIT, "
                                                                 "autotuning, compilation), seconds.")
    first_call_s_max: float | None = Field(default=None, description="The longest first call over its shapes, "
                                                                     "seconds.")
    wall_s: float | None = Field(default=None, description="Its points and scenario, from the first task to the last, "
                                                           "seconds (the child's start and compilation included).")
    timed_s: float | None = Field(default=None, description="Of that, the sum of its timed repetitions, seconds: the "
                                                            "rest is what the harness cost.")


class WorkloadSummary(Record):
    """One variant over the weighted shape distribution."""

    variant: str = Field(description="Variant name.")
    shapes: int = Field(description="Shapes in the distribution.")
    timed: int = Field(description="Shapes with a speedup over the baseline.")
    geomean_speedup: float | None = Field(default=None, description="Weighted geometric mean of the speedups; "
                                                                    "absent unless every shape was timed.")
    worst_speedup: float | None = Field(default=None, description="The least speedup.")
    worst_shape: ShapeDims | None = Field(default=None, description="The shape of the least speedup.")
    regressions: list[ShapeDims] | None = Field(default=None, description="Shapes slower than the baseline (speedup "
                                                                          "under 0.98).")


class WorkloadResult(Record):
    """Level 2: the weighted shape distribution, measured."""

    dtype: str = Field(description="The dtype measured.")
    description: str = Field(description="The case's words on the distribution.")
    points: list[Point] = Field(description="Every variant at every shape, with its weight.")
    summary: list[WorkloadSummary] = Field(description="Each variant over the distribution.")


class EndToEndResult(Record):
    """Level 3: the scenario timed with the baseline and with the variant, beside Amdahl's prediction."""

    description: str = Field(description="The case's words on the scenario.")
    shape: ShapeDims = Field(description="The scenario's shape.")
    dtype: str = Field(description="The scenario's dtype.")
    baseline: str = Field(description="The baseline variant.")
    variant: str = Field(description="The variant set against it.")
    status: Literal["ok", "failed", "partial", "skipped"] = Field(
        description="ok: both timed and outputs agree; partial: the baseline only; failed; skipped: not timed here.")
    error: str | None = Field(default=None, description="What went wrong, when status is not ok.")
    baseline_us: float | None = Field(default=None, description="The scenario with the baseline, microseconds.")
    baseline_kernel_us: float | None = Field(default=None, description="The baseline kernel alone, microseconds.")
    kernel_share: float | None = Field(default=None, description="baseline_kernel_us over baseline_us.")
    variant_us: float | None = Field(default=None, description="The scenario with the variant, microseconds.")
    variant_kernel_us: float | None = Field(default=None, description="The variant kernel alone, microseconds.")
    kernel_speedup: float | None = Field(default=None, description="baseline_kernel_us over variant_kernel_us.")
    amdahl_speedup: float | None = Field(default=None, description="The scenario's speedup Amdahl's law predicts "
                                                                   "from kernel_share and kernel_speedup.")
    measured_speedup: float | None = Field(default=None, description="baseline_us over variant_us.")
    gap: float | None = Field(default=None, description="measured_speedup over amdahl_speedup, less 1.")
    outputs_rel_diff: float | None = Field(default=None, description="Relative difference of the two scenarios' "
                                                                     "outputs.")


class CounterRow(Record):
    """One variant's DRAM bytes under Nsight Compute against the traffic model (`casebook.run.counters`)."""

    variant: str = Field(description="Variant name.")
    shape: ShapeDims = Field(description="The shape profiled.")
    dtype: str = Field(description="The dtype profiled.")
    modelled_bytes: float | None = Field(default=None, description="Bytes the traffic model counts.")
    measured_bytes: float | None = Field(default=None, description="DRAM bytes read + written, summed over the "
                                                                   "call's kernels.")
    read_bytes: float | None = Field(default=None, description="DRAM bytes read.")
    write_bytes: float | None = Field(default=None, description="DRAM bytes written.")
    kernels: int | None = Field(default=None, description="Kernels profiled in the call.")
    gap: float | None = Field(default=None, description="measured_bytes over modelled_bytes, less 1.")
    flagged: bool | None = Field(default=None, description="Whether the gap is over 10%.")
    not_applicable: str | None = Field(default=None, description="The variant's own word that it does not cover "
                                                                 "this shape.")
    error: str | None = Field(default=None, description="Why no counters were read.")


class StabilityBounds(Record):
    """The bounds a point is judged stable by (`casebook.stability`)."""

    spread_ratio_max: dict[str, float] = Field(description="Largest p90 / p10 of a point's repetitions, per device.")
    other_cpu_max_cores: float = Field(description="Most CPU other processes may use over a timing, cores.")
    run_queue_wait_max: float = Field(description="Most of a timing its thread may wait for a CPU, a fraction.")
    min_window_s: float = Field(description="Shortest window other processes' CPU is judged over, seconds.")


class StabilitySummary(Record):
    """The timed points judged, how many unstable, the busiest readings, the bounds."""

    points: int = Field(description="Timed points judged.")
    unstable: int = Field(description="Of them, unstable.")
    other_cores_max: float | None = Field(default=None, description="Most cores other processes used over a timing.")
    run_queue_wait_max: float | None = Field(default=None, description="Largest fraction of a timing spent waiting "
                                                                       "for a CPU.")
    bounds: StabilityBounds = Field(description="The bounds they were judged by.")


class IntensityCheck(Record):
    """The case's declared arithmetic intensity beside its traffic model's, at one shape and dtype."""

    shape: ShapeDims = Field(description="The case's first level-1 shape.")
    dtype: str = Field(description="Its first dtype.")
    declared: float | None = Field(default=None, description="The case's declared FLOPs per byte.")
    tolerance: float = Field(description="Largest relative difference not flagged.")
    modelled: float | None = Field(default=None, description="The traffic model's FLOPs per byte.")
    difference: float | None = Field(default=None, description="declared over modelled, less 1.")
    flagged: bool | None = Field(default=None, description="Whether the difference is over the tolerance.")
    error: str | None = Field(default=None, description="Why the model gave no intensity.")


class ResumedPart(Record):
    """A cut in a resumed run: where the run stopped and `--resume` took it up again, keeping what was measured."""

    finished_at: str = Field(description="When the run was cut short (its last checkpoint), UTC ISO 8601.")
    resumed_at: str = Field(description="When `--resume` took it up again, UTC ISO 8601.")
    points: int = Field(description="The points measured before the cut that this result keeps.")


class Result(Record):
    """What one `casebook run` measured, with everything needed to trust and reproduce it."""

    schema_version: int = Field(description="Version of the result format.")
    _written_in: int | None = PrivateAttr(default=None)
    """The format of the file it was read from, where `results.load` migrated an older one (not stored)."""

    @property
    def written_in(self) -> int:
        """The result format its file was written in: `schema_version` unless it was migrated on reading."""
        return self._written_in or self.schema_version

    case_id: Ident = Field(description="The case measured (a file name in results/, never a path).")
    case_sha256: str = Field(description="sha256 hex of the case file's bytes when it was run.")
    kernel_file: str | None = Field(default=None, description="The kernel module's file name, in the kernels package.")
    kernel_sha256: str = Field(description="sha256 hex of the kernel module file's bytes (with every kernel module it "
                                           "imports, directly or not) when it was run.")
    complete: bool | None = Field(
        default=None, description="Whether the run finished every task (a `.json.partial` checkpoint is not).")
    measurement_sha256: str | None = Field(
        default=None,
        description="sha256 of the case's kernel, levels and claims: staleness is judged by it when present, so prose "
                    "edits keep a result current.")
    kernel_modules: list[str] | None = Field(
        default=None, description="Kernel modules the run's children imported beyond the static imports of its "
                                  "module (imported at run time): `kernel_sha256` covers them too.")
    hardware: Hardware = Field(description="The device: name, slug, datasheet peaks and measured ceilings.")
    environment: Environment = Field(description="Versions, driver, clocks: what a reproduction needs.")
    protocol: TimingProtocol = Field(description="How it was timed and checked: warm-up, repetitions, cache, timer, "
                                                 "tolerances.")
    variants: list[VariantOutcome] = Field(description="Each variant's outcome on this machine.")
    kernel_level: list[Point] = Field(description="Level 1: every variant at every shape and dtype.")
    workload_level: WorkloadResult = Field(description="Level 2: the weighted shape distribution and its summary.")
    end_to_end: EndToEndResult = Field(description="Level 3: the scenario with the baseline and the variant.")
    counters: list[CounterRow] = Field(default_factory=list, description="DRAM bytes read by Nsight Compute, if "
                                                                             "asked.")
    counters_s: float | None = Field(default=None, ge=0, description="Seconds reading the counters took, after "
                                     "`finished_at` (the profiled process's start included): with the span from "
                                     "`started_at`, the machine time the run took; absent where none were asked.")
    claims: list[ClaimOutcome] = Field(description="Each claim and whether it held.")
    arithmetic_intensity: IntensityCheck | None = Field(
        default=None, description="The case's declared arithmetic intensity beside its traffic model's at the first "
                                 "level-1 shape and dtype: shape, dtype, declared, modelled, difference, flagged.")
    stability: StabilitySummary | None = Field(
        default=None, description="Timed points judged, how many unstable, the busiest readings, the bounds.")
    started_at: str = Field(description="UTC start time, ISO 8601.")
    finished_at: str = Field(description="UTC finish time, ISO 8601.")
    command: str = Field(description="The command that produced this result.")
    argv: list[str] | None = Field(
        default=None, description="The exact argument list of that command, every flag kept (absent in older results).")
    resumed: list[ResumedPart] | None = Field(
        default=None, description="Where the run was cut short and resumed (`casebook run --resume`): each cut's "
                                  "time, the resumption's and the points kept across it; absent: never cut.")


def first_error(e: ValidationError, whole: str) -> str:
    """A validation error's first complaint, by its place in the document (`whole` where it is the document
    itself): where, and what is wrong there."""
    first = e.errors()[0]
    return f"{'.'.join(str(x) for x in first['loc']) or whole}: {first['msg']}"


def dtype_bytes(dtype: str) -> float:
    return DTYPE_BYTES[dtype]


def shape_label(shape: dict[str, int]) -> str:
    """`{rows: 32768, cols: 4096}` -> `32768x4096`."""
    return "x".join(str(v) for v in shape.values())


def shape_named(shape: dict[str, int]) -> str:
    """`{rows: 32768, cols: 4096}` -> `rows=32768 cols=4096`: a shape where its dimensions' names are not shown
    beside it."""
    return " ".join(f"{k}={v}" for k, v in shape.items())


def slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")
