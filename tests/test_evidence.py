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

from casebook import evidence
from casebook.claims import evaluate
from casebook.load import load_case
from casebook.validate import validate

from conftest import FIXTURES, SOFTMAX


@pytest.fixture
def stored(tmp_path: Path):
    """(path of a consistent H200 result in a scratch results folder, its document, the case)."""
    case = load_case(SOFTMAX)
    doc = json.loads((FIXTURES / "results" / "nvidia-h200" / "softmax_fusion.json").read_text())
    doc["claims"] = evaluate(case, "nvidia-h200", doc["kernel_level"], doc["workload_level"], doc["end_to_end"])
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
    (lambda d: d["kernel_level"][0].update(p90_us=float("inf")), "is not a finite number"),
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
    doc["claims"] = evaluate(case, "nvidia-h200", doc["kernel_level"], doc["workload_level"], doc["end_to_end"])
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
