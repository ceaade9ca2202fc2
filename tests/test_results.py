"""casebook.results: atomic, validated saving; versioned loading (newer refused, older migrated); staleness."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
from pydantic import ValidationError

from casebook import results
from casebook.result import RESULT_SCHEMA_VERSION, Result
from casebook.results import ResultError, load, result_path, save

FIXTURE = Path(__file__).parent / "fixtures" / "results" / "cpu-x86-64-2c" / "softmax_fusion.json"


@pytest.fixture
def doc() -> dict:
    return json.loads(FIXTURE.read_text())


def leftovers(folder: Path) -> list[Path]:
    return [p for p in folder.rglob("*") if p.is_file() and p.suffix != ".json"]


def test_save_writes_where_load_reads(doc, tmp_path):
    result = Result.model_validate(doc)
    path = save(result, tmp_path)
    expected = tmp_path / "cpu-x86-64-2c" / "softmax_fusion.json"
    assert path == result_path(tmp_path, "cpu-x86-64-2c", "softmax_fusion") == expected
    assert json.loads(path.read_text()) == doc == results.document(result), "the keys it was given, no defaults"
    assert load(path) == result
    assert leftovers(tmp_path) == [], "no temporary file is left behind"
    assert [p for p, _ in results.all_results(tmp_path)] == [path]
    assert path.stat().st_mode & 0o777 == 0o644, "readable as a checkout's files are, not the temp file's 0600"


def test_save_refuses_an_invalid_result_and_keeps_the_old_one(doc, tmp_path):
    path = save(Result.model_validate(doc), tmp_path)
    before = path.read_bytes()
    with pytest.raises(TypeError, match="take a Result, not a dict"):
        save(doc, tmp_path)  # a document is not a result: it becomes one through Result.model_validate
    bad = copy.deepcopy(doc)
    del bad["claims"]
    with pytest.raises(ValidationError):
        save(Result.model_validate(bad), tmp_path)
    edited = Result.model_validate(doc)
    with pytest.raises(ValidationError, match=r"status\n  Input should be 'ok'"):
        edited.kernel_level[0].status = "fine"  # an attribute set past construction is validated as it is set
    with pytest.raises(ValidationError, match=r"median_us\n  Input should be a finite number"):
        edited.kernel_level[0].median_us = float("nan")
    assert path.read_bytes() == before and leftovers(tmp_path) == []


def test_a_failure_while_writing_keeps_the_old_file(doc, tmp_path):
    """A write that fails half-way (strict JSON refuses a NaN, here one forced past the model's checks) leaves the
    old file and no temp file."""
    path = save(Result.model_validate(doc), tmp_path)
    before = path.read_bytes()
    bad = Result.model_validate(doc)
    object.__setattr__(bad.kernel_level[0], "median_us", float("nan"))
    with pytest.raises(ValueError, match="Out of range float"):
        save(bad, tmp_path)
    assert path.read_bytes() == before and leftovers(tmp_path) == []


@pytest.mark.parametrize("value", [float("nan"), float("inf"), -float("inf")])
def test_a_number_that_is_not_finite_is_refused_by_the_model(doc, value):
    bad = copy.deepcopy(doc)
    bad["kernel_level"][0]["median_us"] = value
    with pytest.raises(ValidationError, match=r"kernel_level\.0\.median_us\n  Input should be a finite number"):
        Result.model_validate(bad)


def test_save_replaces_the_old_result(doc, tmp_path):
    save(Result.model_validate(doc), tmp_path)
    doc["finished_at"] = "2030-01-01T00:00:00+00:00"
    path = save(Result.model_validate(doc), tmp_path)
    assert load(path).finished_at == "2030-01-01T00:00:00+00:00"


def write(tmp_path: Path, doc: dict) -> Path:
    path = tmp_path / "r.json"
    path.write_text(json.dumps(doc))
    return path


def test_newer_schema_version_is_refused(doc, tmp_path):
    doc["schema_version"] = RESULT_SCHEMA_VERSION + 1
    with pytest.raises(ResultError, match=f"schema_version: {RESULT_SCHEMA_VERSION + 1} is newer than this casebook"):
        load(write(tmp_path, doc))


@pytest.mark.parametrize("text, words", [
    ("{not json", "unreadable result"),
    ('{"case_id": "x"}', "schema_version: missing"),
    ('{"schema_version": "1"}', "schema_version: missing"),
])
def test_unreadable_results_are_refused(tmp_path, text, words):
    path = tmp_path / "r.json"
    path.write_text(text)
    with pytest.raises(ResultError, match=words):
        load(path)


def test_missing_file(tmp_path):
    with pytest.raises(ResultError, match="unreadable"):
        load(tmp_path / "absent.json")


def test_older_version_is_migrated_in_memory(doc, tmp_path, monkeypatch):
    """With the format one version on, a file of today's version loads through the migration; the file is untouched."""
    now = RESULT_SCHEMA_VERSION
    monkeypatch.setattr(results, "RESULT_SCHEMA_VERSION", now + 1)
    monkeypatch.setitem(results.MIGRATIONS, now, lambda d: {**d, "schema_version": now + 1, "command": "migrated"})
    path = write(tmp_path, doc)
    before = path.read_text()
    r = load(path)
    assert r.schema_version == now + 1 and r.command == "migrated"
    assert path.read_text() == before


def test_version_1_drops_the_keys_no_field_holds(doc, tmp_path):
    """1 -> 2: a multi-device point's leaked `rank` and the protocol's old `target_rse` go, in memory only."""
    doc["schema_version"] = 1
    doc["kernel_level"][0]["rank"] = 1
    doc["workload_level"]["points"][0]["rank"] = 0
    doc["protocol"]["target_rse"] = 0.01
    path = write(tmp_path, doc)
    before = path.read_text()
    r = load(path)
    assert r.schema_version == RESULT_SCHEMA_VERSION == 2
    assert "rank" not in r.kernel_level[0].model_dump() and "rank" not in r.workload_level.points[0].model_dump()
    assert "target_rse" not in r.protocol.model_dump()
    assert path.read_text() == before


def test_stale_without_a_measurement_hash_means_the_case_file_changed(doc, tmp_path):
    """Results from before measurement_sha256: stale when the case file or the kernel differs byte for byte."""
    from casebook.load import load_case
    from casebook.provenance import case_sha256, kernel_sha256, stale_reasons

    from conftest import SOFTMAX

    case = load_case(SOFTMAX)
    fields = {**doc, "case_sha256": case_sha256(SOFTMAX), "kernel_sha256": kernel_sha256("softmax_fusion")}
    fields.pop("measurement_sha256", None)
    r = Result.model_validate(fields)
    assert stale_reasons(r, SOFTMAX, case) == []
    edited = tmp_path / "softmax_fusion.yaml"
    edited.write_bytes(SOFTMAX.read_bytes() + b"\n")
    assert stale_reasons(r, edited, case) == ["the case file softmax_fusion.yaml changed since the run"]
    assert stale_reasons(r.model_copy(update={"kernel_sha256": "0" * 64}), SOFTMAX, case) == [
        "the kernel module softmax_fusion.py changed since the run"]


def test_with_a_measurement_hash_prose_edits_keep_a_result_current(doc, tmp_path):
    from casebook.load import load_case
    from casebook.provenance import kernel_sha256, measurement_sha256, stale_reasons

    from conftest import SOFTMAX

    case = load_case(SOFTMAX)
    r = Result.model_validate({**doc, "case_sha256": "0" * 64, "kernel_sha256": kernel_sha256("softmax_fusion"),
                               "measurement_sha256": measurement_sha256(case)})
    assert stale_reasons(r, SOFTMAX, case) == [], "the write-up changed, not what was measured"
    retitled = case.model_copy(update={"title": "Another title"})
    assert measurement_sha256(retitled) == measurement_sha256(case)
    fewer = case.model_copy(update={"claims": case.claims[:1]})
    assert stale_reasons(r, SOFTMAX, fewer) == [
        "the kernel, levels or claims of softmax_fusion.yaml changed since the run"]


def test_an_optional_field_enters_the_hash_only_where_it_is_set():
    """A variant's `reference` left unset is out of the hash; set, it stales the case's results."""
    from casebook.load import load_case
    from casebook.provenance import meaning, measurement_sha256

    from conftest import SOFTMAX

    case = load_case(SOFTMAX)
    assert all("reference" not in v for v in meaning(case.kernel)["variants"])
    variants = [v.model_copy(update={"reference": "reference"}) if v.name == "eager" else v
                for v in case.kernel.variants]
    control = case.model_copy(update={"kernel": case.kernel.model_copy(update={"variants": variants})})
    assert measurement_sha256(control) != measurement_sha256(case)


def test_an_incomplete_run_is_a_checkpoint_beside_the_result_never_over_it(doc, tmp_path):
    path = save(Result.model_validate(doc), tmp_path)
    before = path.read_bytes()
    partial = save(Result.model_validate({**doc, "complete": False}), tmp_path)
    assert partial == path.with_name("softmax_fusion.json.partial")
    assert path.read_bytes() == before, "a checkpoint never replaces a finished result"
    assert load(partial).complete is False, "a checkpoint reads back as a result"
    assert [p for p, _ in results.all_results(tmp_path)] == [path], "checkpoints are not published"
    save(Result.model_validate({**doc, "complete": True}), tmp_path)
    assert not partial.exists(), "a finished run removes its checkpoint"


REPO = Path(__file__).resolve().parents[1]
COMMITTED = sorted((REPO / "results").glob("*/*.json"))


@pytest.mark.parametrize("where", [
    pytest.param(lambda d: d["kernel_level"][0], id="point"),
    pytest.param(lambda d: d["workload_level"]["points"][0], id="workload point"),
    pytest.param(lambda d: d["hardware"], id="hardware"),
    pytest.param(lambda d: d["hardware"]["measured"], id="ceilings"),
    pytest.param(lambda d: d["variants"][0], id="variant outcome"),
    pytest.param(lambda d: d["environment"], id="environment"),
    pytest.param(lambda d: d["protocol"], id="protocol"),
    pytest.param(lambda d: d["end_to_end"], id="end to end"),
    pytest.param(lambda d: d, id="result"),
])
def test_an_undeclared_key_is_refused_on_save_and_named(doc, tmp_path, where):
    where(doc)["surprise_us"] = 1.0
    with pytest.raises(ValidationError, match=r"surprise_us\s+Extra inputs are not permitted"):
        save(Result.model_validate(doc), tmp_path)
    assert not list(tmp_path.rglob("*.json*")), "nothing is written"


def test_an_undeclared_key_is_refused_on_load(doc, tmp_path):
    doc["kernel_level"][0]["interference"] = {"window_s": 1.0, "surprise": 2}
    with pytest.raises(ValidationError, match=r"kernel_level\.0\.interference\.surprise"):
        load(write(tmp_path, doc))


@pytest.mark.parametrize("path", COMMITTED, ids=[f"{p.parent.name}/{p.stem}" for p in COMMITTED])
def test_each_committed_result_loads(path):
    r = load(path)
    assert r.schema_version == RESULT_SCHEMA_VERSION and r.kernel_level
    assert r.hardware.slug == path.parent.name and r.case_id == path.stem


def test_a_record_is_read_by_attribute_and_dumps_the_keys_it_was_stored_with():
    """Issue 20: readers take the declared fields, never a dict view of the record; the keys stored (an alias
    as stored, not every field declared) come back from model_dump(exclude_unset=True)."""
    r = load(REPO / "results" / "nvidia-h200" / "softmax_fusion.json")
    raw = json.loads((REPO / "results" / "nvidia-h200" / "softmax_fusion.json").read_text())
    assert r.hardware.topology is None and r.hardware.measured.copy_gbps > 0
    assert r.hardware.measured.method.model_dump(exclude_unset=True) == raw["hardware"]["measured"]["method"]
    assert r.environment.model_dump(exclude_unset=True) == raw["environment"]
    assert not any(hasattr(r.hardware, name) for name in ("get", "keys", "items", "values"))
    with pytest.raises(TypeError):
        r.hardware["measured"]


def test_two_runs_started_in_the_same_second_are_kept_apart():
    """A run's start names its kept file to the microsecond: two runs of a case started in one second (a pool's
    retry, a script) do not overwrite one another."""
    import re

    from casebook.run import assemble

    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}\+00:00", assemble.now("microseconds"))
    hw = type("H", (), {"slug": "cpu-x"})()
    paths = {results.run_path(Path("runs"), Result.model_construct(started_at=s, hardware=hw, case_id="c"))
             for s in ("2026-12-04T13:13:54.000001+00:00", "2026-12-04T13:13:54.000002+00:00")}
    assert len(paths) == 2 and all(p.name.endswith("Z.json") for p in paths)
