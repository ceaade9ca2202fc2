"""The case format: one strict pydantic module that is also the documentation.

A case answers the method's four questions (what limits the kernel, which patterns it reuses, where
its boundaries lie, where it transfers) as checkable data, and names the code that runs it.
Every field has a description; the JSON Schema (`casebook schema`) and the site are built from them.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, StrictInt, field_validator, model_validator

SCHEMA_VERSION = 1
"""Current version of the case format. Older cases are migrated in memory; newer ones are refused."""

IDENT = r"^[a-z][a-z0-9_]*$"
MAX_DEVICE_BYTES = 192 * 2**30
"""No shape may need more memory than this (larger than any device in the hardware registry)."""

DTYPE_BYTES: dict[str, float] = {
    "fp64": 8, "fp32": 4, "tf32": 4, "bf16": 2, "fp16": 2,
    "fp8_e4m3": 1, "fp8_e5m2": 1, "int8": 1, "int32": 4, "int64": 8,
}
Dtype = Literal["fp64", "fp32", "tf32", "bf16", "fp16", "fp8_e4m3", "fp8_e5m2", "int8", "int32", "int64"]

Bottleneck = Literal["compute", "bandwidth", "launch", "layout"]
Regime = Literal["compute", "bandwidth", "launch"]
Pattern = Literal["tiling", "fusion", "online_reduction", "persistent", "specialization"]
"""The closed list of reusable patterns. A new pattern is a schema change."""
Backend = Literal["cuda", "cpu", "interpreter"]
Level = Literal["kernel", "workload", "end_to_end"]


class Strict(BaseModel):
    """Base for every record: unknown fields are errors and nothing is coerced."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


Ident = Annotated[str, Field(pattern=IDENT, max_length=64)]
HardwareSlug = Annotated[str, Field(pattern=r"^[a-z0-9][a-z0-9-]*$", max_length=64)]
Text = Annotated[str, Field(min_length=1, max_length=20_000)]
Dim = Annotated[StrictInt, Field(gt=0, le=2**40)]
Shape = dict[Ident, Dim]
"""A shape is a mapping from dimension name to a positive size, e.g. `{rows: 32768, cols: 4096}`."""


# --- the four questions ----------------------------------------------------------------------


class Stage(Strict):
    """One stage of a mixed case (e.g. attention prefill vs decode), with its own limit."""

    name: Ident = Field(description="Stage name, e.g. `prefill`, `decode`, `paged_kv`, `prefix_reuse`.")
    kind: Bottleneck = Field(description="What limits this stage.")
    reasoning: Text = Field(description="Why: this stage's arithmetic intensity against the ridge point.")


class BottleneckClaim(Strict):
    """Question 1: what limits the kernel, and why."""

    kind: Literal[Bottleneck, "mixed"] = Field(
        description="compute, bandwidth, launch or layout; `mixed` when stages differ (then list them)."
    )
    reasoning: Text = Field(
        description="The arithmetic intensity (FLOP/byte) against the machine's ridge point, in words and numbers."
    )
    arithmetic_intensity: float | None = Field(
        default=None, ge=0, description="FLOP per byte at a typical shape, from the traffic model."
    )
    stages: list[Stage] = Field(
        default_factory=list, description="For `mixed`: each stage and what limits it."
    )

    @model_validator(mode="after")
    def _stages_iff_mixed(self) -> BottleneckClaim:
        if self.kind == "mixed" and len(self.stages) < 2:
            raise ValueError("stages: a `mixed` bottleneck names at least two stages")
        if self.kind != "mixed" and self.stages:
            raise ValueError("stages: stages are only for a `mixed` bottleneck")
        return self


class Boundary(Strict):
    """Question 3: one axis along which the method holds, and where it stops holding."""

    axis: Literal["shape", "dtype", "layout", "topology", "distribution"] = Field(
        description="Which kind of boundary: shape, dtype, layout, topology (devices, links) or request distribution."
    )
    holds: Text = Field(description="Where the method holds along this axis.")
    breaks: Text = Field(description="Where it stops holding, and what takes over.")


class Topology(Strict):
    """How many devices the case runs on and how they are linked (multi-device cases)."""

    devices: Dim = Field(default=1, description="Number of devices the kernel spans: a run of many cases gives the "
                                                "case that many devices of one host together (`casebook.run.pool`), or "
                                                "asks Ray for that many GPUs on one node.")
    interconnect: Literal["none", "nvlink", "pcie", "infiniband", "ethernet"] = Field(
        default="none", description="The link between devices."
    )


class Transfer(Strict):
    """Question 4: an operator the method carries to, and why."""

    operator: Text = Field(description="The operator the method transfers to, e.g. `layernorm`.")
    why: Text = Field(description="What about the method carries over, and what must change.")
    case: Ident | None = Field(default=None, description="Id of a case in the book showing it (must resolve).")


# --- the code --------------------------------------------------------------------------------


class Variant(Strict):
    """One rung of the variant ladder."""

    name: Ident = Field(description="Variant name, used in results and on the page.")
    fn: Ident = Field(default_factory=lambda data: data["name"],
                      description="Function in the kernel module that runs this variant (default: the variant's name).")
    note: Text = Field(description="One line: what this variant changes over the previous one.")
    backends: list[Backend] = Field(
        min_length=1,
        description="Where it runs: `cuda` (GPU), `cpu` (timed on CPU), `interpreter` (Triton interpreter, checked on "
                    "CPU, not timed).",
    )
    tolerance: float | None = Field(
        default=None, gt=0, lt=1, description="Override of the per-dtype normwise relative error bound."
    )
    reference: Ident | None = Field(
        default=None,
        description="A control that computes something else (e.g. the same GEMM without its epilogue, timed "
        "beside the fused one to price the epilogue): the float64 function it is checked against instead of "
        "the kernel's. Never the case's best variant.",
    )


class Kernel(Strict):
    """The runnable code: a module inside `casebook.kernels`, named, never a file path."""

    module: Ident = Field(description="Module name under `casebook/kernels/`, usually the case id.")
    reference: Ident = Field(default="reference", description="Float64 reference function: the inputs it names (upcast "
                             "to float64), returns the exact answer.")
    inputs: Ident = Field(default="make_inputs",
                          description="Input maker: `(shape, dtype, device, generator) -> dict of tensors`.")
    traffic: Ident = Field(default="traffic",
                           description="Traffic model: `(shape, dtype) -> Traffic` (FLOPs and bytes, term by term).")
    tensors: dict[Ident, list[Ident]] = Field(
        min_length=1,
        description="Every tensor the kernel reads or writes, as its dimension names, e.g. `x: [rows, cols]` "
                    "(row-major).",
    )
    variants: list[Variant] = Field(min_length=1, description="The variant ladder, simplest first.")
    baseline: Ident = Field(description="Name of the variant every speedup is measured against.")
    devices: Annotated[StrictInt, Field(ge=1, le=64)] = Field(
        default=1, description="Devices (ranks) every variant runs on at once: over 1, one process per device "
                               "joined by torch.distributed (NCCL on GPUs, two ranks over gloo on a CPU), the "
                               "slowest rank's time reported; results go under `<hardware>-x<devices>`.")

    @model_validator(mode="after")
    def _variants(self) -> Kernel:
        names = [v.name for v in self.variants]
        dup = {n for n in names if names.count(n) > 1}
        if dup:
            raise ValueError(f"variants: variant names repeat: {', '.join(sorted(dup))}")
        if self.baseline not in names:
            raise ValueError(f"baseline: {self.baseline!r} is not a variant (have: {', '.join(names)})")
        if next(v for v in self.variants if v.name == self.baseline).reference:
            raise ValueError(f"baseline: {self.baseline!r} is a control with its own reference; the baseline "
                             "computes the case's function")
        return self


# --- the three levels ------------------------------------------------------------------------


class KernelLevel(Strict):
    """Level 1: the single-kernel limit at fixed shapes."""

    shapes: list[Shape] = Field(min_length=1, description="Shapes timed on a GPU.")
    dtypes: list[Dtype] = Field(min_length=1, description="Dtypes timed at every shape.")
    cpu_shapes: list[Shape] = Field(
        min_length=1, description="Small shapes used on a CPU-only machine (timing and interpreter checks)."
    )
    cache: Literal["cold", "warm"] = Field(
        default="cold", description="`cold`: L2 flushed before each repetition; `warm`: data may sit in cache."
    )
    graph: bool = Field(default=False, description="Time by CUDA-graph replay (for launch-bound kernels); with `cold`, "
                                                   "the graph's calls take copies of the inputs in turn, spanning "
                                                   "twice the L2.")
    counters_shape: Shape | None = Field(
        default=None, description="Level-1 shape at which `run --counters` reads DRAM bytes (default: the largest)."
    )


class WeightedShape(Strict):
    """One shape of the real distribution, with its weight and where it comes from."""

    shape: Shape = Field(description="The shape.")
    weight: Annotated[float, Field(gt=0)] = Field(description="Relative weight (normalised over the list).")
    source: Text = Field(description="Where this weight comes from (a model config, a trace, a paper).")


class WorkloadLevel(Strict):
    """Level 2: a stable gain under the real distribution of shapes."""

    description: Text = Field(description="What workload this is (e.g. attention rows in LLM serving).")
    dtype: Dtype = Field(description="The dtype the workload runs in.")
    shapes: list[WeightedShape] = Field(min_length=1, description="Weighted shapes, each with its source.")
    cpu_shapes: list[WeightedShape] = Field(
        min_length=1, description="A scaled-down stand-in for a CPU-only machine."
    )


class EndToEndLevel(Strict):
    """Level 3: the larger computation the kernel sits in, with the baseline and the variant swapped in."""

    description: Text = Field(description="The scenario, e.g. a non-flash attention block (QK^T, softmax, PV).")
    scenario: Ident = Field(description="Function `(kernel, **inputs) -> Tensor` that runs the whole computation, "
                                        "calling `kernel` for the stage.")
    inputs: Ident = Field(description="Input maker for the scenario: `(shape, dtype, device, generator) -> dict`.")
    shape: Shape = Field(description="The scenario's shape on a GPU.")
    cpu_shape: Shape = Field(description="A small stand-in for a CPU-only machine.")
    dtype: Dtype = Field(description="The scenario's dtype.")
    baseline: Ident = Field(description="Variant used by the baseline scenario.")
    variant: Ident = Field(description="Variant swapped in.")


class Levels(Strict):
    """The three benchmark levels."""

    kernel: KernelLevel = Field(description="Level 1: the single-kernel limit.")
    workload: WorkloadLevel = Field(description="Level 2: the real shape distribution.")
    end_to_end: EndToEndLevel = Field(description="Level 3: the end-to-end effect.")


# --- claims ----------------------------------------------------------------------------------


class Where(Strict):
    """Which level-1 points a claim is about; unset fields match everything."""

    dtypes: list[Dtype] | None = Field(default=None, description="Only these dtypes.")
    shapes: list[Shape] | None = Field(default=None, description="Only these shapes.")


class _Claim(Strict):
    """Fields every claim has."""

    text: Text = Field(description="The claim in words, as shown on the page.")
    hardware: list[HardwareSlug] | None = Field(
        default=None,
        description="Hardware slugs where the claim applies (e.g. `nvidia-h200`); elsewhere it is reported as not "
                    "applicable. Unset: everywhere.",
    )


class RegimeClaim(_Claim):
    """The variant sits in this regime at the selected level-1 points."""

    kind: Literal["regime"] = Field(description="`regime`.")
    variant: Ident = Field(description="The variant the claim is about.")
    regime: Regime = Field(description="compute, bandwidth or launch: where the measured point sits on the roofline.")
    where: Where = Field(default_factory=Where, description="Which level-1 points; unset: all.")


class RoofClaim(_Claim):
    """The variant reaches at least this fraction of the roof at the selected level-1 points."""

    kind: Literal["roof_fraction"] = Field(description="`roof_fraction`.")
    variant: Ident = Field(description="The variant the claim is about.")
    at_least: Annotated[float, Field(gt=0, le=1)] = Field(description="Least fraction of the attainable roof (0-1].")
    where: Where = Field(default_factory=Where, description="Which level-1 points; unset: all.")


class ThroughputClaim(_Claim):
    """The variant reaches at least this throughput at the selected level-1 points."""

    kind: Literal["throughput"] = Field(description="`throughput`.")
    variant: Ident = Field(description="The variant the claim is about.")
    at_least_gbps: Annotated[float, Field(gt=0)] | None = Field(
        default=None, description="Least bandwidth in GB/s (bytes from the traffic model over the median time)."
    )
    at_least_tflops: Annotated[float, Field(gt=0)] | None = Field(
        default=None, description="Least compute throughput in TFLOP/s (FLOPs from the traffic model over the median "
                                  "time)."
    )
    where: Where = Field(default_factory=Where, description="Which level-1 points; unset: all.")

    @model_validator(mode="after")
    def _one_unit(self) -> ThroughputClaim:
        if (self.at_least_gbps is None) == (self.at_least_tflops is None):
            raise ValueError("give exactly one of at_least_gbps, at_least_tflops")
        return self


class LatencyClaim(_Claim):
    """The variant takes at most this long per call, or per kernel it runs, at the selected level-1 points:
    the claim of a launch-bound case, whose floor is launches, not bytes or FLOPs."""

    kind: Literal["latency"] = Field(description="`latency`.")
    variant: Ident = Field(description="The variant the claim is about.")
    at_most_us: Annotated[float, Field(gt=0)] = Field(description="Most microseconds (the median), per `per`.")
    per: Literal["call", "kernel"] = Field(
        default="call", description="call: the median time of one call; kernel: that time over the kernels the "
        "call ran (launched directly or replayed in a CUDA graph, as the profiler counted them).")
    where: Where = Field(default_factory=Where, description="Which level-1 points; unset: all.")


class MemoryClaim(_Claim):
    """The variant's peak device memory above its inputs is at most `at_most` times the bytes of its inputs,
    or of another variant's peak, at the selected level-1 points. Judged where memory is measured (a GPU);
    elsewhere not applicable."""

    kind: Literal["peak_memory"] = Field(description="`peak_memory`.")
    variant: Ident = Field(description="The variant the claim is about.")
    at_most: Annotated[float, Field(gt=0)] = Field(description="Most peak memory, as a multiple of `of`.")
    of: Literal["inputs"] | Ident = Field(
        default="inputs", description="inputs: the bytes of the call's input tensors; a variant's name: that "
                                      "variant's peak memory at the same point.")
    where: Where = Field(default_factory=Where, description="Which level-1 points; unset: all.")


class SpeedupClaim(_Claim):
    """`variant` is at least `at_least` times faster than `over` at a level."""

    kind: Literal["speedup"] = Field(description="`speedup`.")
    variant: Ident = Field(description="The faster variant.")
    over: Ident = Field(description="The variant it is compared with.")
    at_least: Annotated[float, Field(gt=0)] = Field(description="Least speedup: time of `over` divided by time of "
                                                                "`variant`.")
    level: Level = Field(description="kernel: every selected level-1 point; workload: weighted geomean (or worst "
                                     "shape); end_to_end: the scenario.")
    statistic: Literal["each", "geomean", "worst"] = Field(
        default="each", description="each: every point; geomean: weighted geometric mean; worst: the worst shape."
    )
    where: Where = Field(default_factory=Where, description="Which level-1 points (level `kernel` only); unset: all.")


Claim = Annotated[Union[RegimeClaim, RoofClaim, ThroughputClaim, LatencyClaim, MemoryClaim, SpeedupClaim],
                  Field(discriminator="kind")]


# --- the case --------------------------------------------------------------------------------


class Reference(Strict):
    """A paper, document or piece of code the write-up draws on."""

    title: Text = Field(description="Authors, title and year, or the name of the document.")
    url: Annotated[str, Field(pattern=r"^https?://\S+$", max_length=2000)] | None = Field(
        default=None, description="Where to read it (http or https)."
    )


class WriteUp(Strict):
    """Question 7 of the seed: why the end-to-end gain differs from the kernel gain."""

    gap: Text = Field(description="Why the end-to-end gain is smaller (or larger) than the kernel gain.")
    remaining_bottleneck: Text = Field(description="What limits the end-to-end computation once the kernel is fast.")
    notes: str = Field(default="", max_length=50_000, description="Longer discussion (Markdown).")
    references: list[Reference] = Field(default_factory=list, description="Papers, docs, code.")


class Case(Strict):
    """A case study: the four questions, the code, the three benchmark levels, the claims, the write-up."""

    schema_version: StrictInt = Field(ge=1, description="Version of this format the file was written for.")
    id: Ident = Field(description="Equal to the file stem.")
    title: Text = Field(description="Short title.")
    operator: Ident = Field(description="The operator, e.g. `softmax`, `gemm`, `attention`.")
    summary: Text = Field(description="Two or three sentences: the problem and the method.")
    tags: list[Ident] = Field(default_factory=list, description="Free tags for faceted browsing.")
    bottleneck: BottleneckClaim = Field(description="Q1: what limits the kernel.")
    patterns: list[Pattern] = Field(min_length=1, description="Q2: the reusable patterns applied.")
    boundaries: list[Boundary] = Field(min_length=1, description="Q3: where the method holds and where it stops.")
    topology: Topology = Field(default_factory=Topology, description="Devices and links (multi-device cases).")
    transfers: list[Transfer] = Field(min_length=1, description="Q4: operators the method carries to.")
    kernel: Kernel = Field(description="The runnable code.")
    levels: Levels = Field(description="The three benchmark levels.")
    claims: list[Claim] = Field(default_factory=list, description="What the run checks against its measurements.")
    writeup: WriteUp = Field(description="The end-to-end story and references.")

    @field_validator("patterns")
    @classmethod
    def _unique_patterns(cls, v: list[str]) -> list[str]:
        if len(set(v)) != len(v):
            raise ValueError("patterns repeat")
        return v

    @model_validator(mode="after")
    def _consistent(self) -> Case:
        """Every cross-field problem at once, one `field: message` line each (the loader splits them)."""
        problems = consistency_problems(self)
        if problems:
            raise ValueError("\n".join(problems))
        return self


def consistency_problems(case: Any) -> list[str]:
    """`field: message` for every cross-field problem of a case: shape keys against the tensors' dimensions,
    variant names in the levels and claims. Reads attributes only, so that `validate` can run it on the plain
    data of a file whose other errors keep it from loading (every problem of a file in one pass)."""
    problems: list[str] = []
    ranks, spans = getattr(case.kernel, "devices", 1), getattr(getattr(case, "topology", None), "devices", 1)
    if type(ranks) is int and type(spans) is int and ranks != spans and max(ranks, spans) > 1:
        problems.append(f"kernel.devices: {ranks} ranks, but topology.devices says the kernel spans {spans}")
    variants = {v.name for v in case.kernel.variants}
    lv = case.levels
    shapes = [(f"levels.kernel.shapes.{i}", s) for i, s in enumerate(lv.kernel.shapes)]
    shapes += [(f"levels.kernel.cpu_shapes.{i}", s) for i, s in enumerate(lv.kernel.cpu_shapes)]
    if lv.kernel.counters_shape is not None:
        shapes.append(("levels.kernel.counters_shape", lv.kernel.counters_shape))
    shapes += [(f"levels.workload.shapes.{i}", w.shape) for i, w in enumerate(lv.workload.shapes)]
    shapes += [(f"levels.workload.cpu_shapes.{i}", w.shape) for i, w in enumerate(lv.workload.cpu_shapes)]
    keys = {k for _, s in shapes for k in s}
    # A dimension named in `kernel.tensors` that no shape has is a wrong name where it stands.
    unknown = {d for dims in case.kernel.tensors.values() for d in dims} - keys
    for name, dims in case.kernel.tensors.items():
        for d in dims:
            if d in unknown:
                problems.append(f"kernel.tensors.{name}: dimension {d!r} is in no shape (the shapes' keys: "
                                f"{', '.join(sorted(keys))})")
    dims = {d for ds in case.kernel.tensors.values() for d in ds} - unknown

    def need_variant(name: str, where: str) -> None:
        if name not in variants:
            problems.append(f"{where}: {name!r} is not a variant (have: {', '.join(sorted(variants))})")

    for where, shape in shapes:
        if set(shape) != dims:
            problems.append(f"{where}: shape keys {sorted(shape)} differ from the tensors' dimensions {sorted(dims)}")
        elif not unknown:
            total = sum(_numel(t, shape) for t in case.kernel.tensors.values())
            if total * 8 > MAX_DEVICE_BYTES:  # the widest dtype any case may use
                problems.append(f"{where}: tensors at {shape} need {total * 8 / 2**30:.0f} GiB, more than any "
                                "device")
    need_variant(lv.end_to_end.baseline, "levels.end_to_end.baseline")
    need_variant(lv.end_to_end.variant, "levels.end_to_end.variant")
    controls = {v.name for v in case.kernel.variants if v.reference}
    for i, c in enumerate(case.claims):
        need_variant(c.variant, f"claims.{i}.variant")
        if getattr(c, "kind", None) == "speedup":
            need_variant(c.over, f"claims.{i}.over")
            if c.variant in controls:  # faster by doing less: a control is what a variant is measured against
                problems.append(f"claims.{i}.variant: {c.variant!r} is a control (it computes something else, "
                                "checked against its own reference); a speedup claim's variant computes the case's "
                                "function, and a control may be only what it is measured `over`")
        if getattr(c, "kind", None) == "peak_memory" and c.of != "inputs":
            need_variant(c.of, f"claims.{i}.of")
    return problems


def _numel(dims: list[str], shape: dict[str, int]) -> int:
    n = 1
    for d in dims:
        n *= shape[d]
    return n
