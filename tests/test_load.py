"""casebook.load: every bad input is one `file:line: field: message` line, exit status 2, no traceback."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from casebook import case as case_format
from casebook import load
from casebook.load import CaseError, load_case, read_case

from conftest import REPO, SOFTMAX


@pytest.fixture
def refused(cli):
    """Assert that loading `path` fails at `line` and `field`, with `words` in the message, also through the CLI."""

    def check(path: Path, line: int, field: str, *words: str) -> CaseError:
        with pytest.raises(CaseError) as info:
            load_case(path)
        e = next((x for x in info.value.errors if x.field == field), info.value)
        assert (e.line, e.field) == (line, field), str(e)
        assert str(e) == f"{path}:{line}: {field}: {e.message}"
        for w in words:
            assert w in e.message, str(e)
        result = cli("validate", path)
        assert result.exit_code == 2
        assert str(e) in result.output
        return e

    return check


# --- what loads -------------------------------------------------------------------------------------


@pytest.mark.parametrize("path", sorted((REPO / "cases").glob("*.yaml")), ids=lambda p: p.stem)
def test_every_case_in_the_book_loads(path):
    assert load_case(path).id == path.stem


def test_lines_of_fields(line_of):
    case, lines = read_case(SOFTMAX)
    assert lines.line(("levels", "kernel", "shapes", 3)) == line_of(SOFTMAX, "{rows: 4096, cols: 32768}")
    assert lines.line(("kernel", "variants", 2, "backends")) == line_of(SOFTMAX, "backends: [cuda]")
    assert lines.line(("writeup", "nowhere", 7)) == line_of(SOFTMAX, "writeup:")


def test_yaml_dialect(make_case):
    """Only true/false are booleans; 1e-3 is a float; dates and sexagesimals stay text."""
    path = make_case({"    cache: cold\n": "    cache: cold\n    graph: TRUE\n",
                      '      note: "The library\'s fused softmax kernel."\n':
                      '      note: 2024-01-01\n      tolerance: 1e-3\n'})
    case = load_case(path)
    assert case.levels.kernel.graph is True
    assert case.kernel.variants[1].note == "2024-01-01"
    assert case.kernel.variants[1].tolerance == 1e-3
    data, _ = load.parse("a: 1:20\nb: 0x10\nc: 1_000\nd: .inf\ne: ~\nf: No\ng: '12'\n", "x.yaml")
    assert data == {"a": "1:20", "b": 16, "c": 1000, "d": float("inf"), "e": None, "f": "No", "g": "12"}


def test_libyaml_and_pure_python_agree(softmax_text):
    """Without libyaml (some platforms), the pure-Python parser gives the same data and lines."""
    fast = load._build(load.CaseLoader, softmax_text, "x.yaml")
    slow = load._build(load._PureLoader, softmax_text, "x.yaml")
    assert fast == slow


# --- syntax ----------------------------------------------------------------------------------------


def test_bad_indentation(make_case, refused, line_of):
    path = make_case({"  baseline: torch_softmax\n  variants:": "  baseline: torch_softmax\n   extra: 1\n  variants:"})
    refused(path, line_of(path, "   extra: 1"), "yaml", "not allowed")


def test_tab_indentation(make_case, refused, line_of):
    path = make_case({"  traffic: traffic\n": "\ttraffic: traffic\n"})
    refused(path, line_of(path, "\ttraffic"), "yaml", "tabs")


def test_invalid_utf8(make_case, refused, line_of, softmax_text):
    path = make_case(text=softmax_text)
    raw = path.read_bytes().replace(b"operator: softmax", b"operator: soft\xffmax")
    path.write_bytes(raw)
    refused(path, line_of(path, "operator: soft"), "file", "not UTF-8", "0xff")


def test_control_character(make_case, refused, line_of):
    path = make_case({"operator: softmax": "operator: soft\x07max"})
    refused(path, line_of(path, "operator: soft"), "yaml", "not allowed")


@pytest.mark.parametrize("text", ["", "\n\n", "# only a comment\n", "---\n"])
def test_empty_file(make_case, refused, text):
    refused(make_case(text=text), 1, "file", "empty")


@pytest.mark.parametrize("text, kind", [("- a\n- b\n", "a list"), ("just text\n", "a single value")])
def test_top_level_not_a_mapping(make_case, refused, text, kind):
    refused(make_case(text=text), 1, "file", kind, "mapping")


def test_several_documents(make_case, refused, softmax_text):
    path = make_case(text=softmax_text + "---\nid: second\n")
    refused(path, len(softmax_text.splitlines()) + 1, "file", "several YAML documents")


def test_duplicate_key_names_both_lines(make_case, refused, line_of):
    path = make_case({"    cache: cold\n": "    cache: cold\n    graph: false\n    cache: warm\n"})
    first, second = line_of(path, "cache: cold"), line_of(path, "cache: warm")
    e = refused(path, second, "levels.kernel.cache", "duplicate key 'cache'")
    assert f"line {first}" in e.message


def test_too_deep(make_case, refused, line_of):
    path = make_case({"tags: [normalization, llm, attention, sampling]": "tags: " + "[" * 100_000 + "]" * 100_000})
    refused(path, line_of(path, "tags: [[["), "tags" + ".0" * 30, "deeper than 32")


# --- the schema ------------------------------------------------------------------------------------


def test_unknown_field_suggests_the_closest(make_case, refused, line_of):
    path = make_case({"  cache: cold\n": "  cahce: cold\n"})
    refused(path, line_of(path, "cahce"), "levels.kernel.cahce", "unknown field 'cahce'", "did you mean 'cache'?")


def test_unknown_field_in_a_claim(make_case, refused, line_of):
    path = make_case({"    over: eager\n": "    ovr: eager\n"})
    refused(path, line_of(path, "ovr: eager"), "claims.7.ovr", "did you mean 'over'?")


def test_missing_field(make_case, refused, line_of):
    path = make_case({"    dtypes: [bf16, fp16, fp32]\n": ""})
    refused(path, line_of(path, "  kernel:", 1), "levels.kernel.dtypes", "required field is missing")


def test_quoted_number_is_not_an_int(make_case, refused, line_of):
    path = make_case({"      - {rows: 64, cols: 32768}\n": '      - {rows: "64", cols: 32768}\n'})
    refused(path, line_of(path, '"64"'), "levels.kernel.cpu_shapes.1.rows", "valid integer", "remove the quotes")


@pytest.mark.parametrize("word", ["no", "yes", "on", "off", "Yes"])
def test_yaml11_booleans_are_text(make_case, refused, line_of, word):
    path = make_case({"  kernel:\n    cache: cold\n": f"  kernel:\n    cache: cold\n    graph: {word}\n"})
    refused(path, line_of(path, f"graph: {word}"), "levels.kernel.graph", "valid boolean", "true and false")


@pytest.mark.parametrize("value", ["0", "-4096"])
def test_dimension_must_be_positive(make_case, refused, line_of, value):
    path = make_case({"      - {rows: 512, cols: 1024}\n": f"      - {{rows: {value}, cols: 1024}}\n"})
    refused(path, line_of(path, f"rows: {value},"), "levels.kernel.cpu_shapes.0.rows", "greater than 0")


def test_shape_too_big_for_any_device(make_case, refused, line_of):
    path = make_case({"      - {rows: 1024, cols: 262144}\n    cpu_shapes:": "      - {rows: 1099511627776, cols: "
                                                                             "262144}\n    cpu_shapes:"})
    refused(path, line_of(path, "1099511627776"), "levels.kernel.shapes.6", "GiB", "more than any device")


def test_shape_keys_must_match_tensors(make_case, refused, line_of):
    path = make_case({"      - {rows: 64, cols: 32768}\n": "      - {rows: 64, columns: 32768}\n"})
    refused(path, line_of(path, "columns: 32768"), "levels.kernel.cpu_shapes.1", "differ from the tensors")


def test_unknown_dtype(make_case, refused, line_of):
    path = make_case({"    dtypes: [bf16, fp16, fp32]\n": "    dtypes: [bfloat16, fp16, fp32]\n"})
    refused(path, line_of(path, "bfloat16"), "levels.kernel.dtypes.0", "'bfloat16' is not one of", "'bf16'")


def test_unknown_pattern(make_case, refused, line_of):
    path = make_case({"patterns: [fusion, online_reduction, specialization]":
                      "patterns: [fusoin, online_reduction, specialization]"})
    refused(path, line_of(path, "fusoin"), "patterns.0", "did you mean 'fusion'?")


def test_unknown_claim_kind(make_case, refused, line_of):
    path = make_case({"  - kind: regime\n": "  - kind: regim\n"})
    refused(path, line_of(path, "kind: regim"), "claims.0.kind", "did you mean 'regime'?")


def test_baseline_not_a_variant(make_case, refused, line_of):
    path = make_case({"  baseline: torch_softmax\n  variants:": "  baseline: torch_softmx\n  variants:"})
    refused(path, line_of(path, "baseline: torch_softmx"), "kernel.baseline", "not a variant")


def test_every_problem_is_reported(make_case):
    path = make_case({"  cache: cold\n": "  cahce: cold\n",
                      "  baseline: torch_softmax\n  variants:": "  baseline: nope\n  variants:"})
    with pytest.raises(CaseError) as info:
        load_case(path)
    assert [e.field for e in info.value.errors] == ["kernel.baseline", "levels.kernel.cahce"]  # in line order


def test_id_must_equal_file_stem(make_case, refused, line_of, softmax_text):
    path = make_case(text=softmax_text.replace("\nid: softmax_fusion\n", "\nid: softmax_fused\n"), name="softmax_x")
    refused(path, line_of(path, "id: softmax_fused"), "id", "differs from the file name")


# --- safety ----------------------------------------------------------------------------------------

PAYLOAD = "title: !!python/object/apply:os.system ['touch {canary}']\n"


def test_python_tag_is_refused_and_nothing_runs(make_case, refused, line_of, tmp_path, softmax_text):
    canary = tmp_path / "canary"
    text = softmax_text.replace('title: "Fused softmax', PAYLOAD.format(canary=canary) + 'tagline: "Fused')
    path = make_case(text=text)
    refused(path, line_of(path, "!!python"), "title", "!!python/object/apply:os.system", "nothing in it is executed")
    assert not canary.exists()


def test_python_tag_through_the_installed_command(make_case, tmp_path, softmax_text):
    canary = tmp_path / "canary"
    path = make_case(text=PAYLOAD.format(canary=canary) + softmax_text)
    proc = subprocess.run([sys.executable, "-m", "casebook.cli", "validate", str(path)], cwd=REPO,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert f"{path}:1: title: tag !!python/object/apply:os.system refused" in proc.stdout
    assert "Traceback" not in proc.stdout + proc.stderr
    assert not canary.exists()


def test_other_tags_are_refused(make_case, refused, line_of):
    path = make_case({"operator: softmax": "operator: !!binary c29mdG1heA=="})
    refused(path, line_of(path, "!!binary"), "operator", "not allowed")


BOMB = "".join(
    [f"l0: &l0 [{', '.join(['lol'] * 9)}]\n"]
    + [f"l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * 9)}]\n" for i in range(1, 10)]
)


def test_alias_bomb_is_refused_before_expanding(make_case, refused):
    path = make_case(text=BOMB)
    start = time.perf_counter()
    refused(path, 1, "l0", "anchor &l0 refused")
    assert time.perf_counter() - start < 1.0


def test_any_alias_is_refused(make_case, refused, line_of):
    with pytest.raises(CaseError, match=r"x.yaml:2: b: alias \*x refused"):
        load.parse("a: [1]\nb: *x\n", "x.yaml")
    path = make_case({"  baseline: torch_softmax\n  variants:": "  baseline: &b torch_softmax\n  variants:"})
    refused(path, line_of(path, "&b"), "kernel.baseline", "anchors and aliases are not allowed")


def test_oversized_file_is_refused_unread(make_case, refused, softmax_text):
    path = make_case(text=softmax_text + "#" * (load.MAX_BYTES + 1))
    start = time.perf_counter()
    refused(path, 1, "file", "1 MiB")
    assert time.perf_counter() - start < 1.0


# --- versions --------------------------------------------------------------------------------------


def test_newer_schema_version_is_refused(make_case, refused, line_of):
    path = make_case({"schema_version: 1\n": "schema_version: 7\n"})
    refused(path, line_of(path, "schema_version: 7"), "schema_version", "upgrade casebook")


def test_older_schema_version_is_migrated_in_memory(make_case, monkeypatch):
    path = make_case({"  cache: cold\n": "  cache_policy: cold\n"})  # what version 1 might have called it
    before = path.read_bytes()

    def rename_cache(data: dict) -> dict:
        data["levels"]["kernel"]["cache"] = data["levels"]["kernel"].pop("cache_policy")
        return data

    monkeypatch.setattr(case_format, "SCHEMA_VERSION", 2)
    monkeypatch.setattr(load, "MIGRATIONS", {1: rename_cache})
    case = load_case(path)
    assert (case.schema_version, case.levels.kernel.cache) == (2, "cold")
    assert path.read_bytes() == before  # in memory only


def test_missing_migration(make_case, refused, line_of, monkeypatch):
    monkeypatch.setattr(case_format, "SCHEMA_VERSION", 3)
    monkeypatch.setattr(load, "MIGRATIONS", {2: lambda d: d})
    path = make_case()
    refused(path, line_of(path, "schema_version: 1"), "schema_version", "no migration from schema_version 1")
