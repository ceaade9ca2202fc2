"""casebook.evidence: a stored result is derived again, and a forged one is refused by `check` and `build`.

The forgeries are the ones a pull request could carry: a median edited under the roofline floor, a
claim's verdict flipped, a rate that its median does not give, ceilings above the datasheet, a hardware
name that is no slug, a file far too large. The document forged is the tests' H200 fixture result, its
claims judged again from its own points so that, unforged, it is evidence.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from casebook import evidence, results
from casebook.claims import evaluate
from casebook.load import load_case
from casebook.result import Ceilings, Datasheet, Hardware, Launches, Point, Result, TrafficTerm
from casebook.validate import validate

from conftest import FIXTURES, REPO, SOFTMAX


def judged_as_run(case, doc: dict) -> list[dict]:
    """The claims of the result document `doc`, judged from its own points as a run judges and stores them."""
    result = Result.model_validate(doc)
    claims = evaluate(case, result.hardware.slug, result.kernel_level, result.workload_level, result.end_to_end)
    return [c.model_dump(mode="json", exclude_unset=True) for c in claims]


@pytest.fixture
def stored(tmp_path: Path):
    """(path of a consistent H200 result in a scratch results folder, its document, the case)."""
    case = load_case(SOFTMAX)
    doc = json.loads((FIXTURES / "results" / "nvidia-h200" / "softmax_fusion.json").read_text())
    doc["claims"] = judged_as_run(case, doc)
    path = tmp_path / "nvidia-h200" / "softmax_fusion.json"
    path.parent.mkdir()
    path.write_text(json.dumps(doc))
    return path, doc, case


def write(path: Path, doc: dict) -> Path:
    path.write_text(json.dumps(doc))
    return path


def test_an_honest_result_is_evidence(stored):
    path, _, case = stored
    assert evidence.problems(path, case) == []


def test_a_median_forged_under_the_floor_fails_the_gate_again(stored):
    path, doc, case = stored
    p = next(p for p in doc["kernel_level"] if p["status"] == "ok")
    for key in ("median_us", "p10_us", "p90_us"):
        p[key] = p["floor_us"] / 10
    [why] = evidence.problems(write(path, doc), case)[:1]
    assert "faster than physics" in why


def test_a_rate_its_median_does_not_give_is_caught(stored):
    path, doc, case = stored
    p = next(p for p in doc["kernel_level"] if p["status"] == "ok")
    p["gbps"] *= 2
    assert any("stored gbps" in why for why in evidence.problems(write(path, doc), case))


def test_busy_readings_with_their_unstable_mark_removed_are_caught(stored):
    """`unstable` is judged again from the point's own readings: a timing whose run queue waited half its window
    (or whose spread is over the bound) with the mark deleted is caught, not published."""
    path, doc, case = stored
    p = next(p for p in doc["kernel_level"] if p["status"] == "ok")
    p["interference"] = {**(p.get("interference") or {}), "window_s": 1.0, "run_queue_wait_s": 0.5}
    p.pop("unstable", None)
    assert any("its readings make it unstable" in why and "waited for a CPU" in why
               for why in evidence.problems(write(path, doc), case))
    p["unstable"] = ["waited for a CPU 50% of the timing"]  # marked: what check's publishing rules then refuse
    assert not any("its readings make it unstable" in why for why in evidence.problems(write(path, doc), case))


def test_a_flipped_claim_verdict_is_caught(stored):
    path, doc, case = stored
    i = next(i for i, c in enumerate(doc["claims"]) if c["held"] is False)
    doc["claims"][i]["held"] = True
    [why] = evidence.problems(write(path, doc), case)
    assert why.startswith(f"claim {doc['claims'][i]['text']!r} is stored as held, but its points say failed")


def test_claims_other_than_the_cases_are_caught(stored):
    path, doc, case = stored
    doc["claims"][0]["text"] = "Something the case never claimed."
    assert evidence.problems(write(path, doc), case) == ["its claims are not the case's claims (text and order)"]


@pytest.mark.parametrize("edit, words", [
    (lambda d: d["hardware"]["measured"].update(copy_gbps=1e6), "above the datasheet's 4800 GB/s"),
    (lambda d: d["hardware"].update(slug="../../etc"), "is not a valid result: hardware.slug: String should match"),
    (lambda d: d["kernel_level"][0].update(status="ok", median_us=-1.0), "is not a positive time"),
    (lambda d: d["kernel_level"][0].update(p90_us=float("inf")),
     "is not a valid result: kernel_level.0.p90_us: Input should be a finite number"),
])
def test_numbers_that_cannot_be_are_caught(stored, edit, words):
    path, doc, case = stored
    edit(doc)
    text = json.dumps(doc)  # Infinity: the JSON a forger can write
    path.write_text(text)
    assert any(words in why for why in evidence.problems(path, case)), evidence.problems(path, case)


def test_a_file_over_the_cap_is_not_read(stored, monkeypatch):
    path, _, case = stored
    monkeypatch.setattr(evidence, "MAX_BYTES", 1000)
    [why] = evidence.problems(path, case)
    assert "over the 0 MiB a result may be" in why or "MiB a result may be" in why


def test_check_refuses_a_forged_result(make_case, tmp_path):
    """Through `casebook check`: the forged result of a current case is an error, not a warning."""
    from casebook import provenance

    path = make_case()
    case = load_case(path)
    doc = json.loads((FIXTURES / "results" / "nvidia-h200" / "softmax_fusion.json").read_text())
    doc["claims"] = judged_as_run(case, doc)
    doc.pop("measurement_sha256", None)
    doc.update(case_sha256=provenance.case_sha256(path), kernel_sha256=provenance.kernel_sha256("softmax_fusion"))
    i = next(i for i, c in enumerate(doc["claims"]) if c["held"] is False)
    doc["claims"][i]["held"] = True
    result = tmp_path / "results" / "nvidia-h200" / "softmax_fusion.json"
    result.parent.mkdir(parents=True)
    result.write_text(json.dumps(doc))
    errors = [str(e) for e in validate([path], strict=True).errors if "is not evidence" in str(e)]
    assert errors and "is stored as held, but its points say failed" in errors[0]


def test_a_text_longer_than_any_the_harness_writes_is_refused(stored):
    """An 8 MiB error string would make an 8 MiB page: a result's texts are capped (the longest a case's prose may
    be), and a longer one is no valid result."""
    from casebook.result import RECORD_TEXT_MAX

    path, doc, case = stored
    doc["kernel_level"][0]["error"] = "x" * (RECORD_TEXT_MAX + 1)
    [why] = evidence.problems(write(path, doc), case)
    assert why.startswith("is not a valid result: kernel_level.0.error: String should have at most")


CEILINGS = Ceilings(copy_gbps=10.0, matmul_tflops={"fp32": 1.0}, launch_us=1e-3, graph_launch_us=1e-3)


def test_a_stored_median_that_is_not_the_slowest_ranks_is_refused():
    p = Point(variant="v", shape={"n": 1}, dtype="fp32", status="ok", median_us=10.0, p10_us=9.0, p90_us=11.0,
              flops=1.0, bytes=1.0, rank_median_us=[10.0, 14.0])
    [why] = evidence.point_problems(p, CEILINGS)
    assert why == "v 1 fp32: its median 10 us is not the slowest of its ranks' medians ([10.0, 14.0])"
    assert evidence.point_problems(p.model_copy(update={"rank_median_us": [10.0, 7.0]}), CEILINGS) == []


def test_a_point_placed_under_other_ceilings_or_with_uncounted_launches_is_caught():
    """Without its launches recorded a point is placed as one direct launch, and its floor has no bound from above."""
    p = Point(variant="v", shape={"n": 1}, dtype="fp32", status="ok", median_us=10.0, p10_us=9.0, p90_us=11.0,
              flops=1.0, bytes=1e4, bandwidth_roof_gbps=20.0, floor_us=1e6)
    assert evidence.point_problems(p, CEILINGS) == [
        "v 1 fp32: stored bandwidth_roof_gbps 20 is not the result's measured 10"]
    counted = p.model_copy(update={"launches": Launches(direct=1, graph=0, counted=True)})
    assert "stored floor 1e+06 us is outside" in evidence.point_problems(counted, CEILINGS)[1]


def test_a_read_only_point_is_placed_again_under_the_read_stream_its_ceilings_measured():
    """A point that only reads, at 1.08x the copy rate: evidence where the result measured a read stream (and
    its stored roof is that stream's), refused where it did not."""
    streams = CEILINGS.model_copy(update={"read_gbps": 12.0, "write_gbps": 11.0})
    p = Point(variant="v", shape={"n": 1}, dtype="fp32", status="ok", median_us=1e3, p10_us=990.0, p90_us=1010.0,
              flops=0.0, bytes=1.08e7, gbps=10.8, bandwidth_roof_gbps=12.0,
              traffic_terms=[TrafficTerm(name="read cache", bytes=1.08e7)])
    assert evidence.point_problems(p, streams) == []
    assert "faster than physics" in evidence.point_problems(p, CEILINGS)[0]  # held to the copy alone
    assert "stored bandwidth_roof_gbps 10 is not the result's measured 12" in evidence.point_problems(
        p.model_copy(update={"bandwidth_roof_gbps": 10.0}), streams)[0]
    forged = streams.model_copy(update={"read_gbps": 500.0})  # a read stream past the datasheet's bandwidth
    sheet = Datasheet(name="GPU", match=["GPU"], bandwidth_gbps=100.0)
    assert evidence.ceilings_problems(forged, sheet) == [
        "its measured read stream 500 GB/s is above the datasheet's 100 GB/s"]


def test_ceilings_above_or_far_under_the_datasheet_are_caught():
    """Against the datasheet's peaks: a dtype it has a peak for and the result did not measure is not judged."""
    sheet = Datasheet(name="GPU", match=["GPU"], bandwidth_gbps=100.0, peak_tflops={"fp32": 10.0, "bf16": 20.0})
    measured = CEILINGS.model_copy(update={"copy_gbps": 200.0, "matmul_tflops": {"fp32": 0.05}})
    hw = Hardware(slug="gpu", name="GPU", kind="gpu", datasheet=sheet, measured=measured)
    assert evidence.ceilings_problems(hw.measured, hw.datasheet) == [
        "its measured copy bandwidth 200 GB/s is above the datasheet's 100 GB/s",
        "its measured fp32 matmul 0.05 TFLOP/s is under a hundredth of the datasheet's 10"]
    assert evidence.ceilings_problems(hw.measured, None) == []


COMMITTED = sorted((REPO / "results").glob("*/*.json"))


@pytest.mark.parametrize("path", COMMITTED, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_every_committed_verdict_is_what_its_points_give(path):
    """What `casebook check` holds every stored result to: its claims judged again from its points (and its paired
    timings' rounds) give its stored verdicts, word for word."""
    result = results.load(path)
    case = load_case(REPO / "cases" / f"{result.case_id}.yaml")
    again = evidence.judged(case, result)
    assert evidence.claims_problems(case, result) == []
    assert [(c.held, c.detail) for c in again] == [(c.held, c.detail) for c in result.claims]


def test_a_paired_timing_is_judged_from_its_rounds_not_its_stored_speedup():
    """gemm_tiled's TMA claim holds on its paired timings alone (0.91x in the ladder, 1.02x in alternation): a
    stored speedup edited is taken again from the rounds, and rounds edited fail it."""
    path = REPO / "results" / "nvidia-h200" / "gemm_tiled.json"
    case = load_case(REPO / "cases" / "gemm_tiled.yaml")
    result = results.load(path)
    i, claim = next((i, c) for i, c in enumerate(result.claims) if c.paired)
    assert claim.held is True and "timed in alternation" in claim.detail

    def with_paired(*paired) -> Result:
        forged = claim.model_copy(update={"paired": list(paired)})
        return result.model_copy(update={"claims": [*result.claims[:i], forged, *result.claims[i + 1:]]})

    first, second = claim.paired
    boasted = with_paired(first.model_copy(update={"speedup": 9.0}), second)
    assert evidence.judged(case, boasted)[i].detail == claim.detail
    slow = [[a, 0.5 * a] for a, _ in first.rounds_us]  # the other at half the variant's time in every round
    [why] = evidence.claims_problems(case, with_paired(first.model_copy(update={"rounds_us": slow}), second))
    assert "is stored as held, but its points say failed (worst 0.50x at 4096x4096x4096 bf16, timed" in why
    [why] = evidence.claims_problems(case, with_paired(first.model_copy(update={"rounds_us": [[1.0, -1.0]]}), second))
    assert "its points say failed (worst 0.91x at 4096x4096x4096 bf16 over 2 points (need 0.95x)" in why, \
        "a round that is no time leaves the timing out: the ladder judges"
