"""The roofline with three roofs: time >= max(FLOPs / peak, bytes / bandwidth, launches x launch cost).

A multi-device case has a fourth: the bytes its traffic model sends over the link between devices (a
collective's bus bytes) over the link's measured bus bandwidth; its other bytes stay on memory's roof.

Memory's roof depends on the traffic's mix: a copy (half read, half written) is slower per byte than a stream
that only reads, or only writes (the bus turns around between them). Where a read stream and a write stream
were measured beside the copy, a point's bandwidth roof runs between them by its share of bytes written
(`Roofs.bandwidth_at`); never under the copy's.

A point is launch-bound where its launch floor is the highest, or where the host needs longer to issue
the call than any floor allows the GPU (a Python loop of small kernels). Pure arithmetic on measured
ceilings; nothing here touches a device.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import asdict, dataclass

from casebook.result import Ceilings

PHYSICS_MARGIN = 0.05
"""A time may beat the floor by this much (ceiling measurement noise) plus its own spread, no more."""

MAX_SPREAD = 0.25
"""The most a measurement's own spread widens the gate: on a loaded machine (median - p10) / median can
near 1, which would let any time through; a model 30% off the hardware is wrong however noisy the timing."""


class FasterThanPhysics(ValueError):
    """A measured time under the roofline floor: the byte or FLOP model, the timing, or the ceiling is wrong."""


@dataclass(frozen=True)
class Roofs:
    """The ceilings a point is held to, in the units they are measured in."""

    compute_tflops: float
    bandwidth_gbps: float
    launch_us: float
    link_gbps: float | None = None
    """The interconnect's measured bus bandwidth (multi-device cases); None: one device, no link."""
    graph_launch_us: float = 0.0
    """One kernel's cost inside a replayed CUDA graph (on a CPU, as launch_us): the launch floor's unit
    (`launch_count`)."""
    busy: bool = False
    """The ceilings were measured on a busy machine: a time under their floor then says more of them than of
    the kernel."""
    read_gbps: float | None = None
    """A stream that only reads (`Ceilings.read_gbps`); None: not measured, reads at the copy's rate."""
    write_gbps: float | None = None
    """A stream that only writes (`Ceilings.write_gbps`); None: not measured, writes at the copy's rate."""

    def bandwidth_at(self, write_share: float | None) -> float:
        """Memory's roof for traffic of which `write_share` of the bytes are written, GB/s: the read stream's
        at 0, the copy's at 1/2, the write stream's at 1, straight between them; each stream's never under the
        copy's (a stream slower than the copy was measured badly, not found). None: the copy's."""
        if write_share is None:
            return self.bandwidth_gbps
        share = min(max(write_share, 0.0), 1.0)
        end = self.read_gbps if share < 0.5 else self.write_gbps
        end = max(end or self.bandwidth_gbps, self.bandwidth_gbps)
        return end + (self.bandwidth_gbps - end) * (1 - abs(2 * share - 1))

    @property
    def ridge_point(self) -> float:
        """FLOP per byte at which the compute and bandwidth roofs meet."""
        return ridge_point(self.compute_tflops, self.bandwidth_gbps)

    @classmethod
    def under(cls, ceilings: Ceilings, dtype: str, link_gbps: float | None = None) -> "Roofs":
        """The roofs a point in `dtype` is held to under measured `ceilings` (and a multi-device case's measured
        link): where the run places it (`run.plan`) and where a stored point is placed again (`evidence`)."""
        return cls(compute_roof(ceilings.matmul_tflops, dtype), ceilings.copy_gbps, ceilings.launch_us,
                   link_gbps=link_gbps or None, graph_launch_us=ceilings.graph_launch_us,
                   busy=bool(ceilings.unstable), read_gbps=ceilings.read_gbps, write_gbps=ceilings.write_gbps)


def write_share(terms) -> float | None:
    """The share of a traffic model's bytes on memory's roof that are written: a term named `write ...` is
    written, `read ...` read, any other half each (a copy's mix); the link's bytes are not memory's. None
    where no bytes are."""
    written = total = 0.0
    for t in terms or ():
        if t.link or not t.bytes:
            continue
        name = t.name.lstrip().lower()
        total += t.bytes
        written += t.bytes if name.startswith("write") else 0.0 if name.startswith("read") else t.bytes / 2
    return written / total if total else None


def ridge_point(compute_tflops: float, bandwidth_gbps: float) -> float:
    """FLOP per byte at which a compute roof (TFLOP/s) and a bandwidth roof (GB/s) meet."""
    return compute_tflops * 1e3 / bandwidth_gbps


@dataclass(frozen=True)
class Placement:
    """Where one measurement sits under the roofs."""

    arithmetic_intensity: float
    compute_floor_us: float
    bandwidth_floor_us: float
    launch_floor_us: float
    link_floor_us: float
    bandwidth_roof_gbps: float
    floor_us: float
    attainable_tflops: float
    roof_fraction: float
    regime: str
    gbps: float
    tflops: float

    def as_dict(self) -> dict:
        return asdict(self)


def floors_us(flops: float, bytes_moved: float, launches: float, roofs: Roofs,
              link_bytes: float = 0.0, write_share: float | None = None) -> dict[str, float]:
    """The lower bounds on time, in microseconds: `link_bytes` of `bytes_moved` over the link's roof (where
    the roofs have one; without, they stay on memory's), the rest over memory's roof for their mix
    (`write_share` of them written: `Roofs.bandwidth_at`)."""
    on_link = link_bytes if roofs.link_gbps else 0.0
    out = {
        "compute": flops / (roofs.compute_tflops * 1e12) * 1e6,
        "bandwidth": (bytes_moved - on_link) / (roofs.bandwidth_at(write_share) * 1e9) * 1e6,
        "launch": launches * roofs.launch_us,
    }
    if on_link:
        out["link"] = on_link / (roofs.link_gbps * 1e9) * 1e6
    return out


def host_bound(host_us: float | None, floor_us: float | None) -> bool:
    """Whether the host needs longer to issue a call than the hardware floor allows the GPU to run it:
    what files a point under "launch" by its host time (see `place`), and what its regime label says."""
    return bool(host_us) and bool(floor_us) and host_us > floor_us


def place(flops: float, bytes_moved: float, launches: float, median_us: float, roofs: Roofs,
          spread: float = 0.0, host_us: float = 0.0, link_bytes: float = 0.0,
          write_share: float | None = None) -> Placement:
    """Place a measured median on the roofline; refuse a time that beats physics.

    Args:
        spread: the measurement's own relative spread (e.g. (p90 - p10) / median), widening the gate.
        host_us: the host's time to issue the call. Where it exceeds every floor the point is
            launch-bound (the host cannot issue the kernels as fast as the GPU runs them). It is not a
            floor: another launcher could issue faster, so it neither gates nor sets the roof fraction.
        link_bytes: the part of `bytes_moved` that crosses the link (`roofs.link_gbps`); a point bound by
            the link is in the bandwidth regime (the link's bandwidth), its `link_floor_us` the highest.
        write_share: the share of the bytes on memory's roof that are written (`write_share`), which sets
            that roof (`Roofs.bandwidth_at`); None: the copy's.
    """
    if median_us <= 0:
        raise ValueError(f"median must be positive, got {median_us}")
    f = floors_us(flops, bytes_moved, launches, roofs, link_bytes, write_share)
    floor_regime = max(f, key=f.get)
    floor = f[floor_regime]
    regime = "launch" if host_bound(host_us, floor) else floor_regime.replace("link", "bandwidth")
    if median_us < floor * (1 - PHYSICS_MARGIN - min(spread, MAX_SPREAD)):
        raise FasterThanPhysics(
            f"faster than physics: {median_us:.2f} us is under the {floor_regime} floor of {floor:.2f} us "
            f"({flops:.3g} FLOP, {bytes_moved:.3g} B, {launches:g} launches"
            + (f", {link_bytes:.3g} B of them over the link" if "link" in f else "") + "): "
            "the byte or FLOP model, or the timing, is wrong (or the machine's ceiling was measured low: "
            "`casebook hardware --remeasure`)"
        )
    return Placement(
        arithmetic_intensity=flops / bytes_moved if bytes_moved else float("inf"),
        compute_floor_us=f["compute"],
        bandwidth_floor_us=f["bandwidth"],
        launch_floor_us=f["launch"],
        link_floor_us=f.get("link", 0.0),
        bandwidth_roof_gbps=roofs.bandwidth_at(write_share),
        floor_us=floor,
        attainable_tflops=flops / floor / 1e6 if floor else 0.0,
        roof_fraction=floor / median_us,
        regime=regime,
        gbps=bytes_moved / median_us / 1e3,
        tflops=flops / median_us / 1e6,
    )


UPCAST = frozenset({"bf16", "fp16", "tf32", "fp8_e4m3", "fp8_e5m2"})
"""Dtypes whose arithmetic can always be done in fp32 instead (their values upcast): fp32's rate is theirs too."""


def compute_roof(matmul_tflops: dict, dtype: str) -> float | None:
    """The compute roof of a point in `dtype`: the measured matmul rate in that dtype, or fp32's where the dtype's
    own is lower or not measured and its arithmetic can run in fp32 (`UPCAST`; a CPU's fp16 matmul, with no fast
    path, ran at 0.003 TFLOP/s where its fp16 softmax upcasts to fp32 and runs at fp32's rate); fp32's where
    nothing of the dtype was measured."""
    own, fp32 = matmul_tflops.get(dtype), matmul_tflops.get("fp32")
    if own is None:
        return fp32
    return max(own, fp32) if dtype in UPCAST and fp32 is not None else own


CEILINGS_APART = 0.20
"""Two results under one hardware name whose measured ceilings differ by more than this (the larger over
the smaller, less one) were measured on different machines, or one of them on a disturbed one: a GPU's
ceilings move a few percent with its clocks (1% between the stored H200 runs), never 20%."""


def ceilings_apart(a: Ceilings, b: Ceilings) -> list[str]:
    """The measured ceilings (copy bandwidth, matmul per dtype) on which `a` and `b` differ by more than
    `CEILINGS_APART`, each as `name a vs b`."""
    ra, rb = own_rates(a.matmul_tflops), own_rates(b.matmul_tflops)
    pairs = [("copy", "GB/s", a.copy_gbps, b.copy_gbps)]
    pairs += [(f"{d} matmul", "TFLOP/s", ra[d], rb[d]) for d in ra if d in rb]
    return [f"{what} {x:.3g} vs {y:.3g} {unit}" for what, unit, x, y in pairs
            if min(x, y) > 0 and max(x, y) / min(x, y) - 1 > CEILINGS_APART]


def own_rates(matmul_tflops: dict[str, float]) -> dict[str, float]:
    """The matmul rates measured in their own dtype: one equal to another dtype's to the last bit was copied from
    it (ceilings before their cache's version 6 gave fp64 the fp32 rate, fp8_e5m2 the e4m3 one, and on a CPU every
    dtype the fp32 one), and says nothing about its machine."""
    seen = Counter(matmul_tflops.values())
    return {d: rate for d, rate in matmul_tflops.items() if seen[rate] == 1}


def launch_count(kernels: int, roofs: Roofs) -> float:
    """The launch floor in units of one launch: every kernel at its cost inside a CUDA graph, the least a
    kernel takes on the device. A true lower bound, whatever issues the kernels: a lone kernel timed by
    events does not wait for the host's pace of issue (`launch_us`), and a 4 MB copy on the H200 took
    5.5 us where back-to-back launches cost 6.6 us each. The host's own issue time is measured per
    variant (`host_issue_us`) and decides the regime, not the gate. `kernels`: those one call runs, launched
    directly or replayed in a graph."""
    return kernels * roofs.graph_launch_us / roofs.launch_us
