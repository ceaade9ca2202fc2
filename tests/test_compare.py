"""`casebook compare`: run-to-run agreement of two results of one case, median against median."""

from __future__ import annotations

import copy
import json
from pathlib import Path

from casebook.commands import compare
from casebook.result import Result

REPO = Path(__file__).resolve().parents[1]
RESULT = json.loads((REPO / "results" / "nvidia-h200" / "softmax_fusion.json").read_text())


def write(tmp_path: Path, name: str, doc: dict) -> Path:
    path = tmp_path / name
    path.write_text(json.dumps(doc))
    return path


def test_a_result_agrees_with_itself(tmp_path, capsys):
    a = write(tmp_path, "a.json", RESULT)
    assert compare.main(a, a) == 0
    n = sum(1 for p in compare.timed_points(Result.model_validate(RESULT)).values() if p.median_us > 20)
    assert f"{n} points above 20 us in both; {n} within 2%" in capsys.readouterr().out


def test_one_point_moved_beyond_the_tolerance_fails_and_is_named(tmp_path, capsys):
    moved = copy.deepcopy(RESULT)
    point = next(p for p in moved["kernel_level"] if p.get("median_us", 0) > 100 and p["variant"] == "triton_online")
    point["median_us"] *= 1.03
    moved["environment"]["triton"] = "9.9.9"
    assert compare.main(write(tmp_path, "a.json", RESULT), write(tmp_path, "b.json", moved)) == 1
    out = capsys.readouterr().out
    assert "+3.00%" in out and "triton_online" in out and "environment differs: triton" in out
    assert compare.main(write(tmp_path, "a.json", RESULT), write(tmp_path, "b.json", moved), within=0.05) == 0


def test_points_without_a_host_time_compare(tmp_path, capsys):
    older, moved = copy.deepcopy(RESULT), copy.deepcopy(RESULT)
    for doc in (older, moved):  # results from before casebook recorded host issue times
        for p in doc["kernel_level"]:
            p["host_issue_us"] = None
    point = next(p for p in moved["kernel_level"] if p.get("median_us", 0) > 100)
    point["median_us"] *= 1.10
    assert compare.main(write(tmp_path, "a.json", older), write(tmp_path, "b.json", moved)) == 1
    assert "- / -" in capsys.readouterr().out


def _moved_with_host(host_us: float, fixed_slack_us: float | None) -> tuple[dict, dict]:
    """RESULT and a copy whose triton_online point's median moved 10% (the p10 did not) with this host time."""
    before, moved = copy.deepcopy(RESULT), copy.deepcopy(RESULT)
    for doc in (before, moved):
        doc["protocol"]["host_slack_us"] = fixed_slack_us
    point = next(p for p in moved["kernel_level"] if p.get("median_us", 0) > 100 and p["variant"] == "triton_online")
    point["median_us"] *= 1.10  # slow repetitions: the median moved, the p10 did not
    point["host_issue_us"] = host_us
    return before, moved


def test_a_moved_point_shows_its_p10_and_whether_host_time_passed_a_fixed_delay(tmp_path, capsys):
    before, moved = _moved_with_host(160.0, fixed_slack_us=100.0)  # a result timed behind a fixed delay
    assert compare.main(write(tmp_path, "a.json", before), write(tmp_path, "b.json", moved)) == 1
    out = capsys.readouterr().out
    assert "+10.00%" in out and "+0.00%" in out and "160*" in out and "host jitter reached the timing" in out


def test_behind_the_adaptive_delay_only_a_host_slower_than_the_device_is_marked(tmp_path, capsys):
    before, moved = _moved_with_host(110.0, fixed_slack_us=None)  # hidden: the point takes over 130 us
    assert compare.main(write(tmp_path, "a.json", before), write(tmp_path, "b.json", moved)) == 1
    out = capsys.readouterr().out
    assert "/ 110" in out and "110*" not in out and "host-bound" not in out
    before, moved = _moved_with_host(5000.0, fixed_slack_us=None)  # longer than the device ran it
    assert compare.main(write(tmp_path, "a.json", before), write(tmp_path, "b.json", moved)) == 1
    assert "5000*" in capsys.readouterr().out


def test_points_under_the_floor_are_not_compared(tmp_path):
    fast = copy.deepcopy(RESULT)
    for p in fast["workload_level"]["points"]:
        if p.get("median_us") and p["median_us"] < 20:
            p["median_us"] *= 2  # a launch-bound point doubling is noise the criterion leaves out
    assert compare.main(write(tmp_path, "a.json", RESULT), write(tmp_path, "b.json", fast)) == 0


def test_two_cases_or_a_missing_file_are_bad_input(tmp_path):
    other = json.loads((REPO / "results" / "nvidia-h200" / "gemm_tiled.json").read_text())
    a = write(tmp_path, "a.json", RESULT)
    assert compare.main(a, write(tmp_path, "b.json", other)) == 2
    assert compare.main(a, tmp_path / "missing.json") == 2


def test_a_move_says_whether_the_medians_intervals_are_apart(tmp_path, capsys):
    before, moved = copy.deepcopy(RESULT), copy.deepcopy(RESULT)
    point = next(p for p in moved["kernel_level"] if p.get("median_us", 0) > 100 and p["variant"] == "triton_online")
    m = point["median_us"]
    point["median_us"], point["median_ci_us"] = m * 1.03, [m * 1.025, m * 1.035]  # beyond its own noise
    assert compare.main(write(tmp_path, "a.json", before), write(tmp_path, "b.json", moved)) == 1
    assert "apart" in capsys.readouterr().out
    point["median_ci_us"] = [m * 0.99, m * 1.05]  # a wide interval: within sampling noise
    assert compare.main(write(tmp_path, "a.json", before), write(tmp_path, "b.json", moved)) == 1
    out = capsys.readouterr().out
    assert "overlap" in out and "apart" not in out
