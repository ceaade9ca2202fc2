"""casebook.provenance: a kernel module's hash covers what it imports; a case's measurement hash goes by meaning."""

import hashlib
import json
import runpy
from pathlib import Path

import pytest
import yaml

from casebook import provenance, results
from casebook.load import load_case

from conftest import REPO, SMALL_CASE


def test_a_change_to_an_imported_kernel_module_changes_the_hash(tmp_path):
    (tmp_path / "shared_core.py").write_text("BLOCK = 64\n")
    (tmp_path / "user.py").write_text("from casebook.kernels.shared_core import BLOCK\n")
    (tmp_path / "alone.py").write_text("import torch\n")
    before = provenance.kernel_sha256("user", tmp_path)
    alone = provenance.kernel_sha256("alone", tmp_path)
    (tmp_path / "shared_core.py").write_text("BLOCK = 128\n")
    assert provenance.kernel_sha256("user", tmp_path) != before
    assert provenance.kernel_sha256("alone", tmp_path) == alone


def test_a_change_two_imports_away_changes_the_hash(tmp_path):
    """user imports gemm, which imports gelu: an edit to gelu stales user's results too."""
    (tmp_path / "gelu.py").write_text("FORM = 'erf'\n")
    (tmp_path / "gemm.py").write_text("from casebook.kernels import gelu\n")
    (tmp_path / "user.py").write_text("from casebook.kernels import gemm\n")
    before = provenance.kernel_sha256("user", tmp_path)
    (tmp_path / "gelu.py").write_text("FORM = 'tanh'\n")
    assert provenance.kernel_sha256("user", tmp_path) != before


def test_import_cycles_end(tmp_path):
    (tmp_path / "a.py").write_text("from casebook.kernels import b\n")
    (tmp_path / "b.py").write_text("from casebook.kernels import a\n")
    assert provenance.kernel_sha256("a", tmp_path) != provenance.kernel_sha256("b", tmp_path)


def test_a_module_without_kernel_imports_hashes_its_own_bytes(tmp_path):

    (tmp_path / "k.py").write_text("from casebook.traffic import Traffic\n")
    source = b"from casebook.traffic import Traffic\n"
    assert provenance.kernel_sha256("k", tmp_path) == hashlib.sha256(source).hexdigest()


def test_kernel_imports_reads_every_import_form():
    src = (b"from casebook.kernels import a\nfrom casebook.kernels.b import x\nimport casebook.kernels.c\n"
           b"from .d import y\n")
    assert provenance.kernel_imports(src) == {"a", "b", "c", "d"}


# --- staleness by meaning --------------------------------------------------------------------------


def _hash_of(tmp_path: Path, text: str) -> str:
    path = tmp_path / "cases" / "scaled_add.yaml"
    path.parent.mkdir(exist_ok=True)
    path.write_text(text)
    return provenance.measurement_sha256(load_case(path))


def test_reformatting_comments_and_key_order_keep_a_result_current(tmp_path):
    text = SMALL_CASE.read_text()
    before = _hash_of(tmp_path, text)
    data = yaml.safe_load(text)
    data["kernel"]["tensors"] = dict(reversed(list(data["kernel"]["tensors"].items())))
    data["levels"] = dict(reversed(list(data["levels"].items())))
    reformatted = "# a comment\n" + yaml.safe_dump(data, sort_keys=True, indent=4, width=60)
    assert reformatted != text
    assert _hash_of(tmp_path, reformatted) == before


def test_spelling_out_a_default_keeps_a_result_current(tmp_path):
    text = SMALL_CASE.read_text()
    before = _hash_of(tmp_path, text)
    spelled = (text.replace("  module: scaled_add\n", "  module: scaled_add\n  reference: reference\n"
                            "  inputs: make_inputs\n  traffic: traffic\n")
               .replace("    - name: eager\n", "    - name: eager\n      fn: eager\n      tolerance: null\n")
               .replace("    cache: cold ", "    graph: false\n    cache: cold "))
    assert spelled.count("fn: eager") == 1 and "graph: false" in spelled
    assert _hash_of(tmp_path, spelled) == before


def test_a_changed_value_stales_a_result(tmp_path):
    text = SMALL_CASE.read_text()
    before = _hash_of(tmp_path, text)
    for old, new in (("      - {n: 65536}\n", "      - {n: 65537}\n"), ("    cache: cold ", "    cache: warm "),
                     ("    - name: eager\n", "    - name: eager\n      fn: triton_fused\n")):
        assert text.count(old) == 1
        assert _hash_of(tmp_path, text.replace(old, new)) != before, new


def test_a_field_at_its_default_is_left_out_so_a_new_optional_field_stales_nothing():
    from pydantic import BaseModel, Field

    class Grown(BaseModel):
        name: str
        added: int | None = None
        listed: list[int] = Field(default_factory=list)

    assert provenance.meaning(Grown(name="a")) == {"name": "a"}
    assert provenance.meaning(Grown(name="a", added=0, listed=[1])) == {"name": "a", "added": 0, "listed": [1]}


def test_every_committed_result_is_current():
    """The hard line of the rule change: the stored results (H200 ones included) stay current."""
    stored = sorted((REPO / "results").glob("*/*.json"))
    assert len(stored) >= 8
    for path in stored:
        doc = results.load(path)
        case_path = REPO / "cases" / f"{doc.case_id}.yaml"
        assert provenance.stale_reasons(doc, case_path, load_case(case_path)) == [], path


def test_the_restamp_moves_only_results_current_under_the_first_rule(tmp_path):
    restamp = runpy.run_path(str(REPO / "benchmarks" / "restamp_measurement_sha256.py"))
    case = load_case(SMALL_CASE)
    first = restamp["first_rule_sha256"](case)
    cases = tmp_path / "cases"
    cases.mkdir()
    (cases / "scaled_add.yaml").write_text(SMALL_CASE.read_text())
    held, broken = tmp_path / "a" / "scaled_add.json", tmp_path / "b" / "scaled_add.json"
    for path, recorded in ((held, first), (broken, "0" * 64)):
        path.parent.mkdir()
        path.write_text(json.dumps({"case_id": "scaled_add", "measurement_sha256": recorded}, indent=1) + "\n")
    assert restamp["restamp"](held, cases).startswith("re-stamped")
    assert json.loads(held.read_text())["measurement_sha256"] == provenance.measurement_sha256(case)
    assert restamp["restamp"](held, cases) == "already on the rule by meaning"
    assert restamp["restamp"](broken, cases).startswith("left stale")
    assert json.loads(broken.read_text())["measurement_sha256"] == "0" * 64


def test_every_check_finds_a_kernel_where_a_run_would(tmp_path, monkeypatch):
    """One resolution for validate, check, record, the resumed book and the site: the case's own book first, then
    the package's folder and CASEBOOK_KERNELS_PATH's (before, validate and record read only the book's folder, so a
    result of an out-of-tree kernel was stale to them and current to `run --all --resume`)."""
    fixtures = Path(__file__).parent / "fixtures" / "kernels"
    case = tmp_path / "book" / "cases" / "c.yaml"
    case.parent.mkdir(parents=True)
    monkeypatch.delenv("CASEBOOK_KERNELS_PATH", raising=False)
    assert provenance.kernel_file("softmax_fusion", case) == provenance.KERNELS_DIR / "softmax_fusion.py"
    assert provenance.kernel_file("scaled_add", case) == provenance.KERNELS_DIR / "scaled_add.py"  # missing as
    monkeypatch.setenv("CASEBOOK_KERNELS_PATH", str(fixtures))
    assert provenance.kernel_file("scaled_add", case) == fixtures / "scaled_add.py"
    own = tmp_path / "book" / "casebook" / "kernels"
    own.mkdir(parents=True)
    assert provenance.kernel_file("nowhere", case) == own / "nowhere.py"  # missing from the book's own folder
    (own / "scaled_add.py").write_text("# the book's own\n")
    assert provenance.kernel_file("scaled_add", case) == own / "scaled_add.py"
    with pytest.raises(ValueError):
        provenance.kernel_file("../scaled_add", case)
