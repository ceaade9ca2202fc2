"""casebook.levels: speedups, the workload's weighted geomean and worst shape, the scenario's Amdahl bound."""

from __future__ import annotations

import pytest

from casebook import levels
from casebook.levels import Scenario
from casebook.load import load_case
from casebook.result import Point, WorkloadSummary

from conftest import SOFTMAX


def point(variant: str, rows: int, median_us: float | None, weight: float = 1.0, status: str = "ok") -> Point:
    return Point(variant=variant, shape={"rows": rows, "cols": 8}, dtype="bf16", status=status, median_us=median_us,
                 weight=weight)


def test_workload_summary():
    points = [point("base", 1, 10.0, 3.0), point("base", 2, 10.0, 1.0),
              point("fast", 1, 5.0, 3.0), point("fast", 2, 20.0, 1.0),  # 2x at weight 3, 0.5x at weight 1
              point("partial", 1, 5.0, 3.0), point("partial", 2, None, 1.0, "failed")]
    found = levels.speedups(points, "base")
    assert found == [1.0, 1.0, 2.0, 0.5, 2.0, None]
    points = [p.model_copy(update={"speedup": s}) for p, s in zip(points, found)]
    rows = {r.variant: r for r in levels.workload_summary(points, "base")}
    assert rows["base"].geomean_speedup == pytest.approx(1.0) and rows["base"].regressions == []
    assert rows["fast"].geomean_speedup == pytest.approx(2 ** ((3 - 1) / 4))
    assert rows["fast"].worst_speedup == 0.5 and rows["fast"].worst_shape == {"rows": 2, "cols": 8}
    assert rows["fast"].regressions == [{"rows": 2, "cols": 8}]
    assert rows["partial"].model_dump(exclude_unset=True) == {"variant": "partial", "shapes": 2, "timed": 1}, \
        "no geomean over part of the workload, and no key for one in the stored summary"


def test_regressions_say_none_only_where_every_shape_was_timed():
    def pt(variant: str, rows: int, status: str = "ok", speedup: float | None = 1.0, error: str | None = None) -> Point:
        return Point(variant=variant, shape={"rows": rows, "cols": 8}, dtype="bf16", status=status, speedup=speedup,
                     error=error)

    def row(variant: str, slower: list[int] = ()) -> WorkloadSummary:
        return WorkloadSummary(variant=variant, shapes=2, timed=0, regressions=[{"rows": r, "cols": 8} for r in slower])

    points = [pt("clean", 1), pt("clean", 2), pt("slow", 1), pt("slow", 2, speedup=0.5),
              pt("checked", 1, "checked", None), pt("checked", 2, "checked", None),
              pt("half", 1, speedup=0.5), pt("half", 2, "crashed", None, "illegal memory access"),
              pt("orphan", 1, speedup=None), pt("orphan", 2, speedup=None)]
    assert levels.regressions(row("clean"), points) == "none"
    assert levels.regressions(row("slow", [2]), points) == "2x8"
    assert levels.regressions(row("checked"), points) == "never timed: checked only at 2 of 2 shapes"
    assert levels.regressions(row("half", [1]), points) == \
        "not timed: crashed at 1 of 2 shapes (first: illegal memory access); slower at 1x8"
    assert levels.regressions(row("orphan"), points) == "never timed: its baseline untimed at 2 of 2 shapes"
    assert levels.regressions(row("slow", [2]), points, label=lambda s: "×".join(map(str, s.values()))) == "2×8"


E2E = load_case(SOFTMAX).levels.end_to_end  # baseline torch_softmax, variant triton_online, bf16


def e2e(kernel_us: float, scenario_us: float, fingerprint=(1.0, 2.0), status: str = "ok",
        after=(3.0, 1.0)) -> Scenario:
    return Scenario(status=status, kernel_us=kernel_us, scenario_us=scenario_us, fingerprint=list(fingerprint),
                    after_fingerprint=list(after))


def test_end_to_end_amdahl():
    runs = {"torch_softmax": e2e(30.0, 100.0), "triton_online": e2e(10.0, 80.0)}
    doc = levels.end_to_end(E2E, runs, on_gpu=True)
    assert doc.status == "ok"
    assert doc.kernel_share == pytest.approx(0.3) and doc.kernel_speedup == pytest.approx(3.0)
    assert doc.amdahl_speedup == pytest.approx(1 / (0.7 + 0.1))  # 1.25
    assert doc.measured_speedup == pytest.approx(1.25) and doc.gap == pytest.approx(0.0)
    assert doc.shape == E2E.shape
    assert "error" not in doc.model_dump(exclude_unset=True), "an agreeing scenario stores no error"


def test_end_to_end_outputs_must_agree():
    runs = {"torch_softmax": e2e(30.0, 100.0), "triton_online": e2e(10.0, 80.0, fingerprint=(1.0, 2.5))}
    doc = levels.end_to_end(E2E, runs, on_gpu=True)
    assert doc.status == "failed" and "scenario outputs differ" in doc.error


def test_end_to_end_partial_and_missing():
    only_base = levels.end_to_end(E2E, {"torch_softmax": e2e(30.0, 100.0)}, on_gpu=False)
    assert only_base.status == "partial" and only_base.kernel_share == pytest.approx(0.3)
    assert only_base.shape == E2E.cpu_shape
    assert not {"variant_us", "kernel_speedup", "measured_speedup"} & set(only_base.model_dump(exclude_unset=True))
    assert levels.end_to_end(E2E, {}, on_gpu=False).status == "skipped"
    crashed = levels.end_to_end(E2E, {"torch_softmax": Scenario(status="crashed", error="boom")}, on_gpu=False)
    assert crashed.status == "failed" and crashed.error == "boom"
    silent = levels.end_to_end(E2E, {"torch_softmax": Scenario(status="crashed")}, on_gpu=False)
    assert silent.error == "baseline torch_softmax cannot be timed here"


def test_amdahl_and_the_share_past_which_timings_are_disturbed():
    assert levels.amdahl(0.5, 2.0) == pytest.approx(4 / 3)
    assert levels.amdahl(0.0, 10.0) == 1.0 and levels.amdahl(1.0, 3.0) == pytest.approx(3.0)
    doc = levels.end_to_end(E2E, {"torch_softmax": e2e(110.0, 100.0)}, on_gpu=True)
    assert doc.status == "failed" and "kernel share 110%" in doc.error


def test_the_variants_share_past_which_its_timings_are_disturbed():
    """The share check holds for the variant as for the baseline: its kernel alone cannot take longer than its whole
    scenario."""
    doc = levels.end_to_end(E2E, {"torch_softmax": e2e(30.0, 100.0), "triton_online": e2e(90.0, 80.0)}, on_gpu=True)
    assert doc.status == "failed" and "the variant's kernel share 112%" in doc.error, doc


def test_the_outputs_after_timing_on_new_values_must_agree_too():
    """A variant whose scenario answer is kept by its inputs' memory returns the old answer on new values."""
    runs = {"torch_softmax": e2e(30.0, 100.0), "triton_online": e2e(10.0, 80.0, after=(3.0, 1.5))}
    doc = levels.end_to_end(E2E, runs, on_gpu=True)
    assert doc.status == "failed" and "scenario outputs differ" in doc.error, doc
