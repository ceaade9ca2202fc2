"""Projection onto another machine: the band's arithmetic by hand, its bounds, refusals."""

import json

import pytest

from casebook.commands import project as command
from casebook.projection import ProjectionError, project
from casebook.result import Result

from conftest import empty_result

REGISTRY = {
    "gpu-a": {"name": "GPU A", "bandwidth_gbps": 1000, "sm_count": 100, "peak_tflops": {"bf16": 100.0}},
    "gpu-b": {"name": "GPU B", "bandwidth_gbps": 4000, "sm_count": 200, "peak_tflops": {"bf16": 400.0}},
}


def point(variant, regime, median_us, flops, moved, roof_fraction, **extra):
    return {"variant": variant, "shape": {"n": 1}, "dtype": "bf16", "status": "ok", "median_us": median_us,
            "flops": flops, "bytes": moved, "regime": regime, "roof_fraction": roof_fraction, **extra}


def result(slug="gpu-a", points=(), copy_gbps=800.0, tflops=80.0):
    doc = empty_result(slug, {"copy_gbps": copy_gbps, "matmul_tflops": {"bf16": tflops}, "launch_us": 5.0,
                              "graph_launch_us": 2.0},
                       case_sha256="0", kernel_file="toy.py", kernel_sha256="0", measurement_sha256="0", complete=True,
                       started_at="2026-12-02T00:00:00+00:00", finished_at="2026-12-02T00:01:00+00:00",
                       kernel_level=list(points))
    doc["hardware"]["datasheet"] = {**REGISTRY[slug], "match": [slug]}
    return Result.model_validate(doc)


# A bandwidth-bound point on gpu-a: 8e9 bytes at the measured 800 GB/s is a 10,000 us floor; it ran
# 12,500 us, 80% of the roof. gpu-b has no result, so its roofs are its datasheet scaled by gpu-a's
# ratios (800/1000 bandwidth, 80/100 compute): 3200 GB/s and 320 TFLOP/s.
BANDWIDTH = point("fused", "bandwidth", 12_500.0, 1e9, 8e9, 0.8, launch_floor_us=5.0)
# A compute-bound point: 8e12 FLOP at 80 TFLOP/s is 100,000 us; it ran 125,000 us, 80%.
COMPUTE = point("gemm", "compute", 125_000.0, 8e12, 1e9, 0.8, launch_floor_us=5.0)


def test_bandwidth_point_by_hand():
    roofs, [p] = project(result(points=[BANDWIDTH]), "gpu-b", REGISTRY)
    assert roofs.bandwidth_gbps == pytest.approx(3200) and roofs.compute_tflops["bf16"] == pytest.approx(320)
    # optimistic: the 8e9 B floor at 3200 GB/s is 2500 us, at 80% of the roof 3125 us.
    assert p.optimistic_us == pytest.approx(3125)
    # pessimistic: 8e9 B / 12,500 us = 640 GB/s over 100 SMs, 6.4 GB/s an SM; on 200 SMs 1280 GB/s: 6250 us.
    assert p.pessimistic_us == pytest.approx(6250)
    assert "per-SM bandwidth" in p.bound


def test_compute_point_by_hand():
    _, [p] = project(result(points=[COMPUTE]), "gpu-b", REGISTRY)
    # optimistic: 8e12 FLOP at 320 TFLOP/s is 25,000 us, at 80%: 31,250 us.
    assert p.optimistic_us == pytest.approx(31_250)
    # pessimistic: 64 TFLOP/s over 100 SMs = 0.64 an SM, 128 on 200 SMs: 62,500 us.
    assert p.pessimistic_us == pytest.approx(62_500)


def test_band_never_inverts_and_launch_points_keep_their_time():
    slow_to_fast = project(result(points=[BANDWIDTH, COMPUTE]), "gpu-b", REGISTRY)[1]
    assert all(p.optimistic_us <= p.pessimistic_us for p in slow_to_fast)
    # Onto a machine with fewer SMs and less bandwidth the per-SM cap does not bind: the band closes.
    fast = result(slug="gpu-b", points=[point("fused", "bandwidth", 3125.0, 1e9, 8e9, 0.8)], copy_gbps=3200)
    [down] = project(fast, "gpu-a", REGISTRY)[1]
    assert down.optimistic_us == down.pessimistic_us == pytest.approx(8e9 / 800e3 / 0.8)  # 800 GB/s: 10,000 us at 80%
    launch = point("tiny", "launch", 9.0, 1e3, 1e3, 0.5)
    [kept] = project(result(points=[launch]), "gpu-b", REGISTRY)[1]
    assert kept.optimistic_us == kept.pessimistic_us == 9.0


def test_the_launch_floor_is_kept():
    tiny = point("tiny", "bandwidth", 10.0, 1.0, 8e3, 0.5, launch_floor_us=5.0)
    [p] = project(result(points=[tiny]), "gpu-b", REGISTRY)[1]
    assert p.optimistic_us == pytest.approx(10.0)  # the 5 us launch floor binds, at the same 50%


def test_measured_target_roofs_and_the_error_beside_a_real_result():
    there = result(slug="gpu-b", points=[point("fused", "bandwidth", 4000.0, 1e9, 8e9, 0.75)], copy_gbps=2667)
    measured = {"gpu-b": there.hardware.measured}
    roofs, [p] = project(result(points=[BANDWIDTH]), "gpu-b", REGISTRY, measured, actual=there)
    assert roofs.basis == "measured on the target" and roofs.bandwidth_gbps == 2667
    assert p.measured_us == 4000.0 and p.in_band
    assert p.error == pytest.approx((p.optimistic_us * p.pessimistic_us) ** 0.5 / 4000 - 1)


def test_refusals():
    with pytest.raises(ProjectionError, match="not in the hardware registry"):
        project(result(points=[BANDWIDTH]), "gpu-z", REGISTRY)
    with pytest.raises(ProjectionError, match="measured there"):
        project(result(points=[BANDWIDTH]), "gpu-a", REGISTRY)
    cpu = result(points=[BANDWIDTH])
    cpu.hardware.datasheet = None
    with pytest.raises(ProjectionError, match="GPU results only"):
        project(cpu, "gpu-b", REGISTRY)


def test_the_nearest_gpu_by_its_datasheet_is_the_source():
    from casebook.datasheets import datasheets
    from casebook.projection import nearest_source

    sheets = datasheets()
    assert nearest_source(["nvidia-h100-sxm", "nvidia-h200"], "nvidia-b200", sheets) == "nvidia-h200"
    assert nearest_source(["nvidia-h200", "nvidia-h100-sxm"], "nvidia-a100-sxm", sheets) == "nvidia-h100-sxm"
    assert nearest_source(["nvidia-nope", "nvidia-h200"], "nvidia-b200", sheets) == "nvidia-h200"  # unknown: last
    assert nearest_source(["nvidia-b200"], "nvidia-b200", sheets) is None


def test_command_on_the_stored_h200_result(capsys):
    assert command.main("softmax_fusion", "nvidia-b200", None, __import__("pathlib").Path("results"),
                        json_out=True) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["from"] == "nvidia-h200" and doc["points"]
    assert all(p["optimistic_us"] <= p["pessimistic_us"] for p in doc["points"])
    assert command.main("softmax_fusion", "nvidia-nope", None, __import__("pathlib").Path("results")) == 2
    assert "not in the hardware registry" in capsys.readouterr().err
