"""casebook.case and casebook.result: a description on every field; the committed JSON Schemas are current."""

from __future__ import annotations

import inspect
import json

import pytest
from pydantic import BaseModel

from casebook import case, result
from casebook.commands.schema import COMMITTED, RESULT_COMMITTED, json_schema_text

from conftest import REPO

MODELS = [m for module in (case, result) for m in vars(module).values()
          if inspect.isclass(m) and issubclass(m, BaseModel) and m.__module__ == module.__name__]


@pytest.mark.parametrize("model", MODELS, ids=lambda m: m.__name__)
def test_every_field_is_described(model):
    assert model.__doc__ and model.__doc__ != BaseModel.__doc__, f"{model.__name__} has no docstring"
    undescribed = [name for name, f in model.model_fields.items() if not (f.description or "").strip()]
    assert undescribed == [], f"{model.__name__}: fields without a description: {undescribed}"


def test_committed_json_schema_is_current():
    committed = (REPO / COMMITTED).read_text()
    assert json.loads(committed) == json.loads(json_schema_text()), (
        f"{COMMITTED} is stale: run `casebook schema --out {COMMITTED}` and commit it")
    assert committed == json_schema_text()


@pytest.mark.parametrize("path", sorted((REPO / "cases").glob("*.yaml")), ids=lambda p: p.stem)
def test_cases_point_editors_at_the_schema(path):
    first = path.read_text().splitlines()[0]
    assert first == "# yaml-language-server: $schema=../docs/schema/case.schema.json"


def test_json_schema_accepts_the_book_and_refuses_typos():
    jsonschema = pytest.importorskip("jsonschema")
    from casebook.load import read_yaml

    doc = json.loads(json_schema_text())
    data, _ = read_yaml(REPO / "cases" / "softmax_fusion.yaml")
    jsonschema.validate(data, doc)  # what an editor checks agrees with what casebook checks
    data["levels"]["kernel"]["cahce"] = "cold"
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(data, doc)


def test_committed_result_schema_is_current():
    committed = (REPO / RESULT_COMMITTED).read_text()
    assert committed == json_schema_text(result=True), (
        f"{RESULT_COMMITTED} is stale: run `casebook schema --result --out {RESULT_COMMITTED}` and commit it")


def test_every_committed_result_validates_against_the_result_schema():
    jsonschema = pytest.importorskip("jsonschema")
    doc = json.loads(json_schema_text(result=True))
    stored = sorted((REPO / "results").glob("*/*.json"))
    assert stored
    for path in stored:
        jsonschema.validate(json.loads(path.read_text()), doc)


def test_the_result_schema_refuses_a_point_without_its_variant():
    jsonschema = pytest.importorskip("jsonschema")
    doc = json.loads(json_schema_text(result=True))
    result = json.loads((REPO / "results" / "nvidia-h200" / "softmax_fusion.json").read_text())
    del result["kernel_level"][0]["variant"]
    with pytest.raises(jsonschema.ValidationError, match="'variant' is a required property"):
        jsonschema.validate(result, doc)


def test_the_result_schema_refuses_an_undeclared_key():
    jsonschema = pytest.importorskip("jsonschema")
    doc = json.loads(json_schema_text(result=True))
    result = json.loads((REPO / "results" / "nvidia-h200" / "softmax_fusion.json").read_text())
    result["hardware"]["measured"]["surprise_gbps"] = 1.0
    with pytest.raises(jsonschema.ValidationError, match="'surprise_gbps' was unexpected"):
        jsonschema.validate(result, doc)


def test_the_text_cap_leaves_the_committed_schema_whatever_pydantic_writes_of_it():
    """pydantic 2.14 writes a config's `str_max_length` into every text's and key's schema, 2.13 nowhere."""
    from casebook.commands.schema import _uncap_texts

    written = {"properties": {"note": {"type": "string", "maxLength": 20000, "title": "Note"},
                              "slug": {"type": "string", "maxLength": 64},
                              "terms": {"type": "object", "propertyNames": {"maxLength": 20000}}}}
    _uncap_texts(written, 20000)
    assert written == {"properties": {"note": {"type": "string", "title": "Note"},
                                      "slug": {"type": "string", "maxLength": 64},
                                      "terms": {"type": "object"}}}
    assert "20,000 characters" in json_schema_text(result=True)
