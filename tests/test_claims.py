"""casebook.claims: each kind of claim held, failed and not applicable, against synthetic points."""

from __future__ import annotations

import json

import pytest

from casebook.case import Case
from casebook.claims import Unpaired, evaluate
from casebook.load import load_case
from casebook.result import ClaimOutcome, ClaimPairedTiming, EndToEndResult, Point, WorkloadResult, shape_label

from conftest import SOFTMAX

SLUG = "nvidia-h200"
SMALL, LARGE = {"rows": 32768, "cols": 1024}, {"rows": 4096, "cols": 65536}


def pt(variant: str, shape: dict, median_us: float | None, dtype: str = "bf16", status: str = "ok", **kw) -> Point:
    fields = dict(regime="bandwidth", roof_fraction=0.9, gbps=4000.0, tflops=5.0)
    return Point(variant=variant, shape=shape, dtype=dtype, status=status, median_us=median_us, **{**fields, **kw})


def workload(*points: Point) -> WorkloadResult:
    return WorkloadResult(dtype="bf16", description="d", points=list(points), summary=[])


def scenario(status: str = "skipped", **kw) -> EndToEndResult:
    """A level 3 of the softmax case's scenario (nothing timed, unless `kw` says)."""
    return EndToEndResult(description="d", shape=SMALL, dtype="bf16", baseline="torch_softmax",
                          variant="triton_online", status=status, **kw)


def case_with(*claims: dict) -> Case:
    """The softmax case with its claims replaced."""
    base = load_case(SOFTMAX).model_dump()
    return Case.model_validate({**base, "claims": list(claims)}, strict=False)


def outcome(claim: dict, kernel=(), workload_level=None, e2e=None, slug=SLUG) -> ClaimOutcome:
    [o] = evaluate(case_with({"text": "t", **claim}), slug, list(kernel), workload_level or workload(),
                   e2e or scenario())
    assert o.text == "t" and o.kind == claim["kind"]
    return o


# --- not applicable -------------------------------------------------------------------------------------


@pytest.mark.parametrize("claim", [
    {"kind": "regime", "variant": "triton_online", "regime": "bandwidth"},
    {"kind": "roof_fraction", "variant": "triton_online", "at_least": 0.8},
    {"kind": "throughput", "variant": "triton_online", "at_least_gbps": 1000},
    {"kind": "latency", "variant": "triton_online", "at_most_us": 5},
    {"kind": "speedup", "variant": "triton_online", "over": "eager", "at_least": 2, "level": "kernel"},
])
def test_claim_for_other_hardware_is_not_applicable(claim):
    o = outcome({**claim, "hardware": ["nvidia-h100"]}, [pt("triton_online", SMALL, 10)])
    assert o.held is None and o.detail == f"not applicable on {SLUG} (claimed for nvidia-h100)"


def test_claim_without_hardware_applies_everywhere():
    o = outcome({"kind": "regime", "variant": "triton_online", "regime": "bandwidth"},
                [pt("triton_online", SMALL, 10)], slug="cpu-some-thing")
    assert o.held is True


# --- regime, roof fraction, throughput, latency --------------------------------------------------------


def test_latency_per_call():
    claim = {"kind": "latency", "variant": "triton_online", "at_most_us": 12.0, "hardware": [SLUG]}
    held = outcome(claim, [pt("triton_online", SMALL, 10), pt("triton_online", LARGE, 12)])
    assert held.held is True and "slowest 12.00 us at 4096x65536 bf16" in held.detail
    assert outcome(claim, [pt("triton_online", SMALL, 10), pt("triton_online", LARGE, 12.5)]).held is False


def test_latency_per_kernel_divides_by_the_kernels_the_profiler_counted():
    claim = {"kind": "latency", "variant": "triton_online", "at_most_us": 1.5, "per": "kernel", "hardware": [SLUG]}
    graph = {"direct": 0, "graph": 80, "counted": True}  # a graph replay: no direct launch, 80 kernels in it
    held = outcome(claim, [pt("triton_online", SMALL, 100.0, launches=graph),
                           pt("triton_online", LARGE, 30.0, launches={"direct": 20, "graph": 0, "counted": True})])
    assert held.held is True
    assert held.detail.startswith("slowest 1.50 us a kernel at 4096x65536 bf16 (30.0 us over 20 kernels")
    failed = outcome(claim, [pt("triton_online", SMALL, 121.0, launches=graph)])
    assert failed.held is False and "1.51 us a kernel" in failed.detail


def test_latency_per_kernel_fails_where_kernels_were_not_counted():
    claim = {"kind": "latency", "variant": "triton_online", "at_most_us": 1.5, "per": "kernel"}
    o = outcome(claim, [pt("triton_online", SMALL, 1.0, launches={"direct": 1, "graph": 0, "counted": False})],
                slug="cpu-some-thing")
    assert o.held is False and o.detail.startswith("kernels per call not counted at 32768x1024 bf16")



def test_regime():
    claim = {"kind": "regime", "variant": "triton_online", "regime": "bandwidth", "hardware": [SLUG]}
    held = outcome(claim, [pt("triton_online", SMALL, 10), pt("triton_online", LARGE, 10),
                           pt("eager", SMALL, 10, regime="launch")])
    assert held.held is True and held.detail == "bandwidth at all 2 points"
    failed = outcome(claim, [pt("triton_online", SMALL, 10, regime="launch"), pt("triton_online", LARGE, 10)])
    assert failed.held is False and failed.detail == "32768x1024 bf16 is launch"


def test_roof_fraction():
    claim = {"kind": "roof_fraction", "variant": "triton_online", "at_least": 0.8}
    points = [pt("triton_online", SMALL, 10, roof_fraction=0.85), pt("triton_online", LARGE, 10, roof_fraction=0.95)]
    held = outcome(claim, points)
    assert held.held is True and held.detail == "lowest 85.0% of roof at 32768x1024 bf16 (need 80%)"
    assert outcome({**claim, "at_least": 0.9}, points).held is False


def test_throughput_in_gbps_and_tflops():
    points = [pt("triton_online", SMALL, 10, gbps=3900.0, tflops=2.0),
              pt("triton_online", LARGE, 10, gbps=4100.0, tflops=3.0)]
    gbps = {"kind": "throughput", "variant": "triton_online", "at_least_gbps": 3800}
    assert outcome(gbps, points).held is True
    low = outcome({**gbps, "at_least_gbps": 4000}, points)
    assert low.held is False and low.detail == "lowest 3900 GB/s at 32768x1024 bf16 (need 4000)"
    tflops = {"kind": "throughput", "variant": "triton_online", "at_least_tflops": 2.5}
    assert outcome(tflops, points).held is False
    assert outcome({**tflops, "at_least_tflops": 2.0}, points).held is True


def test_where_selects_dtypes_and_shapes():
    claim = {"kind": "throughput", "variant": "triton_online", "at_least_gbps": 3800,
             "where": {"dtypes": ["bf16"], "shapes": [LARGE]}}
    points = [pt("triton_online", SMALL, 10, gbps=100.0), pt("triton_online", LARGE, 10, "fp32", gbps=100.0),
              pt("triton_online", LARGE, 10, gbps=4000.0)]
    assert outcome(claim, points).held is True


def test_point_claim_with_nothing_to_judge_fails():
    claim = {"kind": "regime", "variant": "triton_online", "regime": "bandwidth", "where": {"dtypes": ["fp32"]}}
    o = outcome(claim, [pt("triton_online", SMALL, 10)])
    assert o.held is False and o.detail == "no level-1 point matches this claim"


@pytest.mark.parametrize("status", ["failed", "crashed", "timeout", "checked", "skipped"])
def test_point_claim_on_an_unmeasured_point_fails(status):
    claim = {"kind": "roof_fraction", "variant": "triton_online", "at_least": 0.1}
    o = outcome(claim, [pt("triton_online", SMALL, 10), pt("triton_online", LARGE, None, status=status)])
    assert o.held is False and o.detail == f"not measured at 4096x65536 bf16: {status}"


# --- speedup: kernel, workload, end to end ---------------------------------------------------------------


def test_kernel_speedup_holds_at_every_point():
    claim = {"kind": "speedup", "variant": "triton_online", "over": "eager", "at_least": 2.0, "level": "kernel"}
    points = [pt("eager", SMALL, 30), pt("eager", LARGE, 50),
              pt("triton_online", SMALL, 10), pt("triton_online", LARGE, 20)]
    held = outcome(claim, points)
    assert held.held is True and held.detail == "worst 2.50x at 4096x65536 bf16 over 2 points (need 2x)"
    assert outcome({**claim, "at_least": 2.6}, points).held is False


def test_kernel_speedup_needs_both_sides_measured():
    claim = {"kind": "speedup", "variant": "triton_online", "over": "eager", "at_least": 1.0, "level": "kernel"}
    o = outcome(claim, [pt("eager", SMALL, None, status="crashed"), pt("triton_online", SMALL, 10)])
    assert o.held is False and o.detail == "not measured at 32768x1024 bf16"
    o = outcome(claim, [pt("triton_online", SMALL, 10)])
    assert o.held is False and "not measured" in o.detail
    o = outcome(claim, [pt("eager", SMALL, 10)])
    assert o.held is False and o.detail == "no kernel point matches this claim"


def test_workload_speedup_geomean_and_worst():
    level = workload(pt("torch_softmax", SMALL, 10, weight=3.0), pt("torch_softmax", LARGE, 10, weight=1.0),
                     pt("triton_online", SMALL, 5, weight=3.0), pt("triton_online", LARGE, 20, weight=1.0))
    geomean = {"kind": "speedup", "variant": "triton_online", "over": "torch_softmax", "at_least": 1.5,
               "level": "workload", "statistic": "geomean"}
    o = outcome(geomean, workload_level=level)  # 2x at weight 3, 0.5x at weight 1: 2^(2/4) = 1.41
    assert o.held is False and o.detail == "weighted geomean 1.41x over 2 shapes (need 1.5x)"
    assert outcome({**geomean, "at_least": 1.4}, workload_level=level).held is True
    worst = {**geomean, "statistic": "worst", "at_least": 1.0}
    o = outcome(worst, workload_level=level)
    assert o.held is False and o.detail.startswith("worst 0.50x at 4096x65536 bf16")


def test_a_kernel_level_geomean_weighs_its_points_alike():
    """Level-1 points carry no weight: each counts once."""
    claim = {"kind": "speedup", "variant": "triton_online", "over": "eager", "at_least": 1.4, "level": "kernel",
             "statistic": "geomean"}
    points = [pt("eager", SMALL, 20), pt("eager", LARGE, 10), pt("triton_online", SMALL, 10),
              pt("triton_online", LARGE, 10)]  # 2x and 1x: sqrt(2)
    o = outcome(claim, points)
    assert o.held is True and o.detail == "weighted geomean 1.41x over 2 shapes (need 1.4x)"


def test_end_to_end_speedup():
    claim = {"kind": "speedup", "variant": "triton_online", "over": "torch_softmax", "at_least": 1.1,
             "level": "end_to_end"}
    e2e = scenario("ok", measured_speedup=1.15)
    o = outcome(claim, e2e=e2e)
    assert o.held is True and o.detail == "1.15x end to end (need 1.1x)"
    assert outcome({**claim, "at_least": 1.2}, e2e=e2e).held is False
    other = outcome({**claim, "variant": "triton_onepass"}, e2e=e2e)
    assert other.held is False and other.detail == "the scenario compares triton_online with torch_softmax"
    missing = outcome(claim, e2e=scenario("partial", error="variant triton_online cannot be timed here"))
    assert missing.held is False
    assert missing.detail == "end-to-end not measured: variant triton_online cannot be timed here"
    assert outcome(claim).detail == "end-to-end not measured: skipped", "no error: its status says why"


def test_every_claim_is_evaluated_in_order():
    case = load_case(SOFTMAX)
    out = evaluate(case, "cpu-x", [], workload(), scenario())
    assert [o.text for o in out] == [c.text for c in case.claims]
    assert all(o.held is None for o in out)  # the real case's claims are all for an H200


# --- paired timings ----------------------------------------------------------------------------------


PAIRED_CLAIM = {"kind": "speedup", "variant": "triton_online", "over": "torch_softmax", "at_least": 1.0,
                "level": "kernel", "where": {"shapes": [LARGE], "dtypes": ["bf16"]}}
LADDER = [pt("triton_online", LARGE, 105.0), pt("torch_softmax", LARGE, 100.0)]  # 0.95x in the ladder


def paired_run(speedup: float, status: str = "ok") -> dict:
    key = ("triton_online", "torch_softmax", shape_label(LARGE), "bf16")
    if status != "ok":
        return {key: Unpaired(status, "RuntimeError: boom")}
    return {key: ClaimPairedTiming(shape=LARGE, dtype="bf16", status="ok", rounds_us=[[100.0, 100.0 * speedup]] * 6,
                                   speedup=speedup, speedup_min=speedup - 0.01, speedup_max=speedup + 0.01)}


def test_a_claim_with_paired_timings_is_judged_on_them():
    [o] = evaluate(case_with({"text": "t", **PAIRED_CLAIM}), SLUG, LADDER, workload(), scenario(), paired_run(1.01))
    assert o.held is True
    assert o.detail == ("worst 1.01x at 4096x65536 bf16, timed in alternation with torch_softmax (6 rounds, "
                        "1.00-1.02x); the ladder's medians: worst 0.95x at 4096x65536 bf16 over 1 points (need 1x)")
    stored = json.dumps(o.model_dump(mode="json", exclude_unset=True)["paired"])  # as the result file has it
    assert stored == json.dumps([{"shape": LARGE, "dtype": "bf16", "status": "ok", "rounds_us": [[100.0, 101.0]] * 6,
                                  "speedup": 1.01, "speedup_min": 1.0, "speedup_max": 1.02}])


def test_without_paired_timings_the_ladder_judges():
    assert outcome(PAIRED_CLAIM, LADDER).held is False
    [o] = evaluate(case_with({"text": "t", **PAIRED_CLAIM}), SLUG, LADDER, workload(), scenario(),
                   paired_run(1.01, status="crashed"))
    assert o.held is False and "paired" not in o.model_dump(exclude_unset=True)
    assert o.detail == ("worst 0.95x at 4096x65536 bf16 over 1 points; the paired timing crashed: "
                        "RuntimeError: boom (need 1x)")


def test_a_speedup_is_printed_as_finely_as_its_threshold():
    claim = {**PAIRED_CLAIM, "at_least": 0.9524}
    held = outcome(claim, [pt("triton_online", LARGE, 105.0), pt("torch_softmax", LARGE, 100.02)])
    assert held.held is True and held.detail.startswith("worst 0.9526x at")
    failed = outcome(claim, [pt("triton_online", LARGE, 105.0), pt("torch_softmax", LARGE, 99.98)])
    assert failed.held is False and failed.detail.startswith("worst 0.9522x at")


# --- peak memory -----------------------------------------------------------------------------------------


MIB = 2**20


def test_peak_memory_against_the_inputs_held_and_failed():
    claim = {"kind": "peak_memory", "variant": "triton_online", "at_most": 1.1}
    lean = [pt("triton_online", s, 10, peak_memory_bytes=64 * MIB, input_bytes=64 * MIB) for s in (SMALL, LARGE)]
    assert outcome(claim, lean).held is True
    fat = [lean[0], pt("triton_online", LARGE, 10, peak_memory_bytes=448 * MIB, input_bytes=64 * MIB)]
    o = outcome(claim, fat)
    assert o.held is False and "7x its inputs' bytes at 4096x65536 bf16 (448.0 MiB" in o.detail


def test_peak_memory_against_another_variant():
    claim = {"kind": "peak_memory", "variant": "triton_online", "at_most": 0.25, "of": "eager"}
    pts = [pt("triton_online", SMALL, 10, peak_memory_bytes=64 * MIB, input_bytes=64 * MIB),
           pt("eager", SMALL, 30, peak_memory_bytes=448 * MIB, input_bytes=64 * MIB)]
    o = outcome(claim, pts)
    assert o.held is True and "0.143x eager's peak" in o.detail


def test_peak_memory_not_measured_is_not_applicable_and_partly_measured_fails():
    claim = {"kind": "peak_memory", "variant": "triton_online", "at_most": 1.1}
    cpu = [pt("triton_online", SMALL, 10, input_bytes=64 * MIB)]  # a CPU: no allocator counts it
    assert outcome(claim, cpu).held is None
    partly = cpu + [pt("triton_online", LARGE, 10, peak_memory_bytes=64 * MIB, input_bytes=64 * MIB)]
    assert outcome(claim, partly).held is False


def test_peak_memory_of_a_variant_that_does_not_exist_is_a_case_error():
    with pytest.raises(ValueError, match="claims.0.of: 'nope' is not a variant"):
        case_with({"text": "t", "kind": "peak_memory", "variant": "triton_online", "at_most": 1, "of": "nope"})
