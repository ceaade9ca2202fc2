"""casebook.roofline: the three floors, the regime, the roof fraction, the ridge point, the physics gate."""

from __future__ import annotations

import math

import pytest

from casebook.roofline import PHYSICS_MARGIN, FasterThanPhysics, Roofs, floors_us, host_bound, place, write_share
from casebook.traffic import Term

# 100 TFLOP/s, 1000 GB/s, 2 us per launch: ridge point 100 FLOP/byte.
ROOFS = Roofs(compute_tflops=100.0, bandwidth_gbps=1000.0, launch_us=2.0)


def test_ridge_point_is_where_compute_and_bandwidth_roofs_meet():
    assert ROOFS.ridge_point == pytest.approx(100.0)
    f = floors_us(flops=100.0 * 1e9, bytes_moved=1e9, launches=0, roofs=ROOFS)
    assert f["compute"] == pytest.approx(f["bandwidth"])


def test_floors_in_microseconds():
    f = floors_us(flops=2e9, bytes_moved=3e7, launches=4, roofs=ROOFS)
    assert f == pytest.approx({"compute": 20.0, "bandwidth": 30.0, "launch": 8.0})


@pytest.mark.parametrize("flops, bytes_moved, launches, regime, floor_us", [
    (1e10, 1e6, 1, "compute", 100.0),     # 10 GFLOP over 1 MB: 10,000 FLOP/byte, far over the ridge
    (1e7, 1e8, 1, "bandwidth", 100.0),    # 100 MB at 0.1 FLOP/byte
    (1e3, 1e3, 5, "launch", 10.0),        # a tiny kernel: 5 launches of 2 us dwarf 1 ns of data
])
def test_regime_is_the_highest_floor(flops, bytes_moved, launches, regime, floor_us):
    p = place(flops, bytes_moved, launches, median_us=4 * floor_us, roofs=ROOFS)
    assert p.regime == regime
    assert p.floor_us == pytest.approx(floor_us)
    assert p.roof_fraction == pytest.approx(0.25)


def test_placement_quantities():
    # 5e8 FLOP and 5e7 bytes (10 FLOP/byte): bandwidth floor 50 us, compute floor 5 us, launch 2 us.
    p = place(flops=5e8, bytes_moved=5e7, launches=1, median_us=100.0, roofs=ROOFS)
    assert p.arithmetic_intensity == pytest.approx(10.0)
    assert (p.compute_floor_us, p.bandwidth_floor_us, p.launch_floor_us) == pytest.approx((5.0, 50.0, 2.0))
    assert p.regime == "bandwidth"
    assert p.roof_fraction == pytest.approx(0.5)
    assert p.gbps == pytest.approx(500.0)          # 5e7 B / 100 us
    assert p.tflops == pytest.approx(5.0)          # 5e8 FLOP / 100 us
    assert p.attainable_tflops == pytest.approx(10.0)  # FLOPs over the floor: the roof at this intensity
    assert p.as_dict()["regime"] == "bandwidth"


def test_attainable_is_the_peak_above_the_ridge():
    p = place(flops=1e10, bytes_moved=1e6, launches=0, median_us=200.0, roofs=ROOFS)
    assert p.attainable_tflops == pytest.approx(ROOFS.compute_tflops)


def test_no_bytes_means_infinite_intensity():
    p = place(flops=1e9, bytes_moved=0, launches=1, median_us=20.0, roofs=ROOFS)
    assert math.isinf(p.arithmetic_intensity) and p.regime == "compute"


@pytest.mark.parametrize("median_us", [0.0, -1.0])
def test_non_positive_time_is_refused(median_us):
    with pytest.raises(ValueError, match="positive"):
        place(1e9, 1e6, 1, median_us, ROOFS)


# --- the physics gate --------------------------------------------------------------------------


def test_faster_than_the_floor_beyond_the_margin_is_refused():
    # Bandwidth floor 100 us; 94 us is 6% under it, past the 5% margin.
    with pytest.raises(FasterThanPhysics) as info:
        place(flops=1e7, bytes_moved=1e8, launches=1, median_us=94.0, roofs=ROOFS)
    assert isinstance(info.value, ValueError)
    msg = str(info.value)
    assert "faster than physics" in msg and "bandwidth floor of 100.00 us" in msg and "94.00 us" in msg


def test_within_the_margin_is_placed_above_the_roof():
    p = place(flops=1e7, bytes_moved=1e8, launches=1, median_us=96.0, roofs=ROOFS)
    assert p.roof_fraction == pytest.approx(100 / 96) and p.roof_fraction > 1


def test_margin_edge():
    floor = 100.0
    place(1e7, 1e8, 1, floor * (1 - PHYSICS_MARGIN) + 1e-9, ROOFS)
    with pytest.raises(FasterThanPhysics):
        place(1e7, 1e8, 1, floor * (1 - PHYSICS_MARGIN) - 1e-6, ROOFS)


def test_spread_widens_the_gate():
    # 6% under the floor: refused with no spread, accepted when the measurement's own spread is 2%.
    with pytest.raises(FasterThanPhysics):
        place(1e7, 1e8, 1, 94.0, ROOFS, spread=0.0)
    assert place(1e7, 1e8, 1, 94.0, ROOFS, spread=0.02).regime == "bandwidth"
    with pytest.raises(FasterThanPhysics):  # ... but not without end
        place(1e7, 1e8, 1, 90.0, ROOFS, spread=0.02)


def test_a_noisy_timing_does_not_open_the_gate():
    # On a loaded machine p10 can sit far under the median; half the floor is still refused.
    with pytest.raises(FasterThanPhysics):
        place(1e7, 1e8, 1, 50.0, ROOFS, spread=0.97)


@pytest.mark.parametrize("flops, bytes_moved, launches, regime", [
    (1e10, 1e6, 1, "compute"), (1e3, 1e3, 5, "launch")])
def test_gate_holds_for_every_roof(flops, bytes_moved, launches, regime):
    floor = floors_us(flops, bytes_moved, launches, ROOFS)[regime]
    with pytest.raises(FasterThanPhysics, match=f"{regime} floor"):
        place(flops, bytes_moved, launches, floor / 2, ROOFS)


def test_a_host_slower_than_every_floor_makes_the_point_launch_bound():
    # A Python loop of small GEMMs: 2 ms to issue against a 50 us bandwidth floor. Launch-bound, but the
    # host time is no floor: the roof fraction and the gate stay on the hardware floors.
    p = place(flops=5e8, bytes_moved=5e7, launches=1, median_us=2100.0, roofs=ROOFS, host_us=2000.0)
    assert p.regime == "launch"
    assert p.floor_us == pytest.approx(50.0) and p.roof_fraction == pytest.approx(50.0 / 2100.0)
    placed = place(flops=5e8, bytes_moved=5e7, launches=1, median_us=100.0, roofs=ROOFS, host_us=20.0)
    assert placed.regime == "bandwidth"
    with pytest.raises(FasterThanPhysics):  # a host time never excuses a time under the hardware floor
        place(flops=5e8, bytes_moved=5e7, launches=1, median_us=10.0, roofs=ROOFS, host_us=2000.0)


def test_host_bound_is_what_place_files_under_launch():
    assert host_bound(2000.0, 50.0) and not host_bound(20.0, 50.0)
    assert not host_bound(None, 50.0) and not host_bound(2000.0, None)


# --- a multi-device case: the link's bytes on the link's roof ------------------------------------------

LINKED = Roofs(compute_tflops=100.0, bandwidth_gbps=1000.0, launch_us=2.0, link_gbps=100.0)


def test_link_bytes_are_held_to_the_link_and_the_rest_to_memory():
    f = floors_us(flops=0.0, bytes_moved=5e7, launches=0, roofs=LINKED, link_bytes=1e7)
    assert f["link"] == pytest.approx(100.0) and f["bandwidth"] == pytest.approx(40.0)  # 1e7 B at 100, 4e7 at 1000
    assert floors_us(flops=0.0, bytes_moved=5e7, launches=0, roofs=ROOFS, link_bytes=1e7) == pytest.approx(
        {"compute": 0.0, "bandwidth": 50.0, "launch": 0.0}), "one device, no link roof: every byte on memory's"


def test_a_link_bound_point_is_bandwidth_bound_at_the_links_floor():
    p = place(flops=1e6, bytes_moved=5e7, launches=1, median_us=200.0, roofs=LINKED, link_bytes=1e7)
    assert p.regime == "bandwidth" and p.floor_us == pytest.approx(100.0) == p.link_floor_us
    assert p.roof_fraction == pytest.approx(0.5)
    with pytest.raises(FasterThanPhysics, match="over the link"):
        place(flops=1e6, bytes_moved=5e7, launches=1, median_us=50.0, roofs=LINKED, link_bytes=1e7)


def test_a_dtype_computable_in_fp32_is_placed_under_the_higher_of_the_two_rates():
    """The compute roof: the dtype's own matmul rate, or fp32's where the dtype can upcast and its own is lower
    (a CPU's fp16 GEMM has no fast path: 0.003 TFLOP/s, while its fp16 softmax runs in fp32) or unmeasured."""
    from casebook.roofline import compute_roof

    cpu = {"fp32": 0.18, "fp64": 0.08, "bf16": 0.42, "fp16": 0.003}
    assert compute_roof(cpu, "fp16") == 0.18 and compute_roof(cpu, "bf16") == 0.42
    assert compute_roof(cpu, "fp64") == 0.08, "fp64 cannot run in fp32: its own rate"
    assert compute_roof(cpu, "tf32") == 0.18, "not measured: fp32's"
    assert compute_roof({"fp32": 51.0, "bf16": 800.0}, "bf16") == 800.0


# --- memory's roof by the traffic's mix: a read stream, the copy, a write stream ------------------------------


H200ISH = Roofs(compute_tflops=800.0, bandwidth_gbps=4270.0, launch_us=5.0, graph_launch_us=0.8,
                read_gbps=4600.0, write_gbps=4400.0)


def test_memorys_roof_runs_from_the_read_stream_through_the_copy_to_the_write_stream():
    assert H200ISH.bandwidth_at(0.0) == 4600.0  # only reads
    assert H200ISH.bandwidth_at(0.5) == 4270.0  # a copy's mix
    assert H200ISH.bandwidth_at(1.0) == 4400.0  # only writes
    assert H200ISH.bandwidth_at(0.25) == pytest.approx(4435.0)  # halfway from the read stream to the copy
    assert H200ISH.bandwidth_at(None) == 4270.0  # a mix not known: the copy's


def test_without_streams_measured_or_with_one_slower_than_the_copy_every_mix_is_at_the_copys_rate():
    plain = Roofs(compute_tflops=800.0, bandwidth_gbps=4270.0, launch_us=5.0)
    slow = Roofs(compute_tflops=800.0, bandwidth_gbps=4270.0, launch_us=5.0, read_gbps=3000.0)
    assert {plain.bandwidth_at(s) for s in (0.0, 0.3, 0.5, 1.0)} == {4270.0}
    assert slow.bandwidth_at(0.0) == 4270.0  # a stream under the copy was measured badly, not found


def test_the_share_written_is_read_from_the_traffic_terms_names():
    terms = [Term("read k", bytes=600.0), Term("read q", bytes=100.0), Term("write o", bytes=100.0),
             Term("copy the partial (read + write)", bytes=200.0), Term("bus bytes", bytes=1e6, link=True),
             Term("exp", flops=5.0)]
    assert write_share(terms) == pytest.approx((100.0 + 100.0) / 1000.0)  # the copy term half each; the link's not
    assert write_share([Term("exp", flops=1.0)]) is None and write_share(None) is None


def test_a_read_only_kernel_over_the_copy_rate_is_placed_under_the_read_stream_not_refused():
    gb = 1e9  # read at 4.51 TB/s, the rate attention_paged's contiguous rung streamed its cache at on an H200
    placed = place(0.0, gb, 1, gb / 4510.0 / 1e3, H200ISH, write_share=0.0)
    assert placed.bandwidth_roof_gbps == 4600.0 and placed.roof_fraction == pytest.approx(4510 / 4600)
    with pytest.raises(FasterThanPhysics):  # held to the copy, as before the streams were measured
        place(0.0, gb, 1, gb / 4510.0 / 1e3, H200ISH)
    with pytest.raises(FasterThanPhysics):  # and over the read stream itself, refused still
        place(0.0, gb, 1, gb / 5000.0 / 1e3, H200ISH, write_share=0.0)


def test_a_rate_copied_from_another_dtype_is_not_compared():
    """Ceilings cached before version 6 gave fp64 the fp32 rate (and fp8_e5m2 the e4m3 one): those copies are not
    measurements, and two H200 results, one with fp64 copied (51.4) and one measured (63.0), are one machine."""
    from casebook.result import Ceilings
    from casebook.roofline import ceilings_apart, own_rates

    old = {"bf16": 810.7, "fp32": 51.4, "fp64": 51.4, "fp8_e4m3": 1480.1, "fp8_e5m2": 1480.1}
    new = {"bf16": 804.8, "fp32": 51.2, "fp64": 63.0, "fp8_e4m3": 1429.9}
    assert own_rates(old) == {"bf16": 810.7}
    assert own_rates(new) == new

    def ceilings(rates: dict) -> Ceilings:
        return Ceilings(copy_gbps=4250.0, matmul_tflops=rates, launch_us=5.0, graph_launch_us=2.0)

    assert ceilings_apart(ceilings(old), ceilings(new)) == []
    assert ceilings_apart(ceilings({**old, "bf16": 600.0}), ceilings(new)) == ["bf16 matmul 600 vs 805 TFLOP/s"]
    assert ceilings_apart(ceilings({**new, "fp64": 40.0}), ceilings(new)) == ["fp64 matmul 40 vs 63 TFLOP/s"]
