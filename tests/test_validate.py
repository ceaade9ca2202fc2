"""casebook.validate: ids, links, kernel names read from the source (never run), and strict results checks."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
import yaml

from casebook import provenance
from casebook.load import load_case
from casebook.validate import top_level_names, validate

from conftest import REPO, SOFTMAX

KERNEL = (REPO / "casebook" / "kernels" / "softmax_fusion.py").read_text()


def problems(*paths: Path, strict: bool = False) -> list[str]:
    return [str(p) for p in validate(list(paths), strict=strict).problems]


@pytest.mark.parametrize("path", sorted((REPO / "cases").glob("*.yaml")), ids=lambda p: p.stem)
def test_every_case_in_the_book_is_valid(path):
    assert [str(e) for e in validate([path]).errors] == []


def test_missing_kernel_module(make_case, line_of):
    path = make_case({"  module: softmax_fusion": "  module: softmax_fused"})
    assert problems(path) == [f"{path}:{line_of(path, 'module: softmax_fused')}: kernel.module: "
                              "no kernel module casebook/kernels/softmax_fused.py"]


@pytest.mark.parametrize("old, new, field", [
    ("  reference: reference", "  reference: referense", "kernel.reference"),
    ("      fn: triton_online", "      fn: triton_onlin", "kernel.variants.4.fn"),
    ("    scenario: attention_block", "    scenario: attention", "levels.end_to_end.scenario"),
    ("    inputs: make_attention_inputs", "    inputs: make_attn_inputs", "levels.end_to_end.inputs"),
])
def test_undefined_function(make_case, line_of, old, new, field):
    path = make_case({old: new})
    name = new.split(": ")[1]
    [problem] = problems(path)
    assert problem.startswith(f"{path}:{line_of(path, new)}: {field}: {name!r} is not defined at the top level of "
                              "casebook/kernels/softmax_fusion.py; did you mean")


def test_undefined_control_reference(make_case, line_of):
    path = make_case({"      fn: triton_online\n": "      fn: triton_online\n      reference: reference_rowz\n"})
    [problem] = [p for p in problems(path) if ".reference: " in p]  # (its claims, now a control's, are refused too)
    assert problem.startswith(f"{path}:{line_of(path, 'reference: reference_rowz')}: kernel.variants.4.reference: "
                              "'reference_rowz' is not defined at the top level")


def test_baseline_cannot_be_a_control(make_case, line_of):
    path = make_case({"      fn: torch_softmax\n": "      fn: torch_softmax\n      reference: reference\n"})
    [problem] = problems(path)
    assert "baseline: 'torch_softmax' is a control with its own reference" in problem


def test_a_speedup_claim_cannot_credit_a_control(make_case, line_of):
    """A control is faster by computing something else: it may be what a variant is measured over, never the
    variant a speedup is claimed for."""
    path = make_case({"      fn: triton_online\n": "      fn: triton_online\n      reference: reference\n"})
    found = problems(path)
    assert any(": claims." in p and ".variant: 'triton_online' is a control" in p for p in found), found


def book_with_kernel(tmp_path: Path, source: str) -> None:
    kernels = tmp_path / "casebook" / "kernels"
    kernels.mkdir(parents=True)
    (kernels / "softmax_fusion.py").write_text(source)


def test_kernel_module_is_read_never_run(make_case, tmp_path):
    canary = tmp_path / "canary"
    book_with_kernel(tmp_path, f"import os\nos.system('touch {canary}')\nraise SystemExit(3)\n" + KERNEL)
    assert problems(make_case()) == []
    assert not canary.exists()


def test_names_bound_any_way_at_top_level(tmp_path):
    source = tmp_path / "m.py"
    source.write_text("from x import y as reference\nimport a.b\neager = lambda x: x\nT: int = 1\n"
                      "if True:\n    def inner(): pass\nelse:\n    class K: pass\n"
                      "try:\n    import z\nexcept ImportError:\n    z = None\n"
                      "def outer():\n    def hidden(): pass\n")
    assert top_level_names(source) == {"reference", "a", "eager", "T", "inner", "K", "z", "outer"}


def test_kernel_module_that_does_not_parse(make_case, tmp_path, line_of):
    book_with_kernel(tmp_path, "def reference(:\n")
    path = make_case()
    assert problems(path) == [f"{path}:{line_of(path, 'module: softmax_fusion')}: kernel.module: "
                              "casebook/kernels/softmax_fusion.py does not parse: line 1: invalid syntax"]


def test_a_kernel_module_not_in_utf8_is_refused_as_the_run_refuses_it(make_case, tmp_path, line_of):
    """A latin-1 module with a coding cookie is valid Python, and passed validate; the run (preflight) and the
    site read kernel modules as UTF-8, and the site build crashed on it."""
    book_with_kernel(tmp_path, "def reference(x): pass\n")
    kernels = tmp_path / "casebook" / "kernels"
    (kernels / "softmax_fusion.py").write_bytes("# -*- coding: latin-1 -*-\n# caf\u00e9\n".encode("latin-1")
                                                + (kernels / "softmax_fusion.py").read_bytes())
    path = make_case()
    assert problems(path)[0] == (f"{path}:{line_of(path, 'module: softmax_fusion')}: kernel.module: "
                                 "casebook/kernels/softmax_fusion.py does not parse: not UTF-8 text (byte 31); "
                                 "save it as UTF-8")


def test_kernel_module_is_parsed_once(make_case, tmp_path):
    from casebook import validate as v

    book_with_kernel(tmp_path, KERNEL)
    paths = [make_case(name=f"case_{i}") for i in range(3)]
    v._names.cache_clear()
    validate(paths)
    info = v._names.cache_info()
    assert (info.misses, info.hits) == (1, 2)


def test_variants_take_the_reference_arguments(make_case, tmp_path, line_of):
    book_with_kernel(tmp_path, KERNEL.replace("def eager(x: torch.Tensor)", "def eager(logits: torch.Tensor)")
                     .replace("def torch_softmax(x: torch.Tensor)", "def torch_softmax(x, dim: int = -1)"))
    path = make_case()
    assert problems(path) == [f"{path}:{line_of(path, 'fn: eager')}: kernel.variants.0.fn: eager(logits) does not "
                              "take the arguments of reference(x): the input maker's tensors are passed by name, to "
                              "each variant and to the reference"]


def test_a_file_that_does_not_load_still_has_its_signatures_checked(make_case, tmp_path, line_of):
    """A wrong shape key keeps the case from loading; a variant that does not take the reference's arguments is
    still reported in the same pass, not after the first problem is fixed."""
    book_with_kernel(tmp_path, KERNEL.replace("def eager(x: torch.Tensor)", "def eager(logits: torch.Tensor)"))
    shape = "    counters_shape: {rows: 4096, cols: 65536}\n"
    path = make_case({shape: shape.replace("cols:", "col:")})
    found = problems(path)
    assert any("shape keys" in p for p in found), found
    assert f"{path}:{line_of(path, 'fn: eager')}: kernel.variants.0.fn: eager(logits) does not take the arguments " \
           "of reference(x): the input maker's tensors are passed by name, to each variant and to the " \
           "reference" in found, found


def test_signatures_not_judged_when_not_plain(tmp_path):
    from casebook.validate import _signatures

    source = tmp_path / "m.py"
    source.write_text("def a(x, *rest): pass\ndef b(x, y=1, *, z, w=2): pass\nc = lambda x: x\n"
                      "def d(x): pass\nif True:\n    def d(y): pass\n")
    st = source.stat()
    assert _signatures(str(source), st.st_mtime_ns, st.st_size) == {"b": (("x", "y", "z", "w"), ("x", "z"))}


# --- links and ids ---------------------------------------------------------------------------------


def test_transfer_link_must_resolve(make_case, line_of):
    path = make_case({"  - operator: layernorm\n": "  - operator: layernorm\n    case: layernorm_fused\n"})
    assert problems(path) == [f"{path}:{line_of(path, 'case: layernorm_fused')}: transfers.0.case: "
                              "no case 'layernorm_fused' in the book"]


def test_transfer_link_to_a_case_beside_it(make_case, line_of):
    make_case(name="layernorm_fusion")
    path = make_case({"  - operator: layernorm\n": "  - operator: layernorm\n    case: layernorm_fusion\n"})
    assert problems(path) == []  # resolves even when only this file is validated
    typo = make_case({"  - operator: layernorm\n": "  - operator: layernorm\n    case: layernorm_fuson\n"})
    assert problems(typo)[0].endswith("no case 'layernorm_fuson' in the book; did you mean 'layernorm_fusion'?")


def test_a_case_that_does_not_load_still_links_to_the_cases_beside_it(make_case):
    """Validating one file with a schema error: its real error, and no "no case ... in the book" for links to
    cases that exist beside it (the book around a file is there whether the file loads or not)."""
    make_case(name="layernorm_fusion")
    path = make_case({"  - operator: layernorm\n": "  - operator: layernorm\n    case: layernorm_fusion\n",
                      "\ntitle: ": "\ntitle: 5\nsubtitle: "})
    found = problems(path)
    assert found and not [p for p in found if "in the book" in p], found


def test_ids_are_unique_across_folders(tmp_path, softmax_text, line_of):
    first, second = tmp_path / "a" / "softmax_fusion.yaml", tmp_path / "b" / "softmax_fusion.yaml"
    for p in (first, second):
        p.parent.mkdir()
        p.write_text(softmax_text)
    assert problems(first, second) == [f"{second}:{line_of(second, 'id: softmax_fusion')}: id: "
                                       f"id 'softmax_fusion' is also the id of {first}"]


def test_paths(make_case, tmp_path):
    path = make_case()
    assert len(validate([path, path, path.parent]).files) == 1
    (tmp_path / "empty").mkdir()
    assert problems(tmp_path / "nowhere.yaml", tmp_path / "empty") == [
        f"{tmp_path / 'nowhere.yaml'}:1: file: no such file or folder (looked for {tmp_path / 'nowhere.yaml'}); "
        "name a case file (cases/<id>.yaml) or a folder of them",
        f"{tmp_path / 'empty'}:1: file: folder {tmp_path / 'empty'} holds no case files (*.yaml)",
    ]


def test_validate_outside_the_book_says_where_it_looked(tmp_path, cli, monkeypatch):
    monkeypatch.chdir(tmp_path)
    result = cli("validate")
    assert result.exit_code == 2
    assert (f"cases:1: file: no such file or folder (looked for {tmp_path / 'cases'}); run casebook in the book's "
            "root (the folder holding cases/ and casebook/kernels/), or name the case files") in result.output


# --- strict ----------------------------------------------------------------------------------------


def store_result(path: Path, case_sha: str | None = None, kernel_sha: str | None = None) -> Path:
    """A result with nothing measured in it, valid in the result model, hashed to the case and kernel."""
    from conftest import empty_result

    result = path.parent.parent / "results" / "nvidia-h200" / f"{path.stem}.json"
    result.parent.mkdir(parents=True, exist_ok=True)
    result.write_text(json.dumps(empty_result(
        case_id=path.stem, case_sha256=case_sha or provenance.case_sha256(path),
        kernel_sha256=kernel_sha or provenance.kernel_sha256("softmax_fusion"),
        command=f"casebook run cases/{path.stem}.yaml")))
    return result


def test_strict_warns_about_cuda_only_variants(make_case, line_of):
    path = make_case()
    store_result(path)
    report = validate([path], strict=True)
    assert report.errors == []
    assert [str(w) for w in report.warnings] == [
        f"{path}:{line_of(path, 'backends: [cuda]', 1)}: kernel.variants.2.backends: warning: variant 'torch_compile' "
        "runs only on cuda, but torch.compile's Inductor also compiles for a CPU (C++/OpenMP): add `cpu` to its "
        "backends so that it is checked and timed there",
        f"{path}:{line_of(path, 'backends: [cuda]', 2)}: kernel.variants.5.backends: warning: variant 'cluster_bulk' "
        "runs only on cuda; add `cpu` or `interpreter` so it is checked on CPU-only machines"]


def test_strict_wants_results(make_case):
    path = make_case()
    [error] = validate([path], strict=True).errors
    assert str(error).startswith(f"{path}:1: results: no results/<hardware>/softmax_fusion.json: run `casebook run")
    assert len(problems(path)) == 0


def test_strict_stale_results(make_case, line_of):
    path = make_case()
    store_result(path, case_sha="0" * 64, kernel_sha="1" * 64)
    errors = [str(e) for e in validate([path], strict=True).errors]
    assert errors == [
        f"{path}:1: results: results/nvidia-h200/softmax_fusion.json is stale: the case file softmax_fusion.yaml "
        "changed since the run; run it again",
        f"{path}:{line_of(path, 'module: softmax_fusion')}: results: results/nvidia-h200/softmax_fusion.json is "
        "stale: the kernel module softmax_fusion.py changed since the run; run it again",
    ]


def test_strict_unreadable_results(make_case):
    path = make_case()
    store_result(path).write_text("{not json")
    [error] = validate([path], strict=True).errors
    assert "results/nvidia-h200/softmax_fusion.json is unreadable" in str(error)


FAILED_POINT = {"variant": "triton_online", "shape": {"rows": 512, "cols": 1024}, "dtype": "fp32", "status": "failed",
                "error": "seed 1: relative error 0.3 over tolerance 1e-05"}


@pytest.mark.parametrize("extra, message", [
    ({"command": "casebook run cases/softmax_fusion.yaml --quick"},
     "is a --quick smoke run, not a result to publish; run without --quick"),
    ({"variants": [{"name": n, "note": "n", "backends": ["cuda"], "device": "cuda", "mode": "timed"}
                   for n in ("torch_softmax", "triton_online")]},
     "lacks variant(s) eager, torch_compile, triton_onepass, cluster_bulk (a --variant run); run the whole ladder"),
    ({"kernel_level": [{**FAILED_POINT, "variant": "eager", "status": "checked"}, FAILED_POINT, FAILED_POINT]},
     "records 2 failed point(s), first triton_online 512x1024 fp32: failed: seed 1: relative error 0.3 over "
     "tolerance 1e-05; fix the variant (or its traffic model) and run again"),
    ({"workload_level": {"points": [{**FAILED_POINT, "status": "timeout", "error": "killed"}]}},
     "records 1 failed point(s), first triton_online 512x1024 fp32: timeout: killed; fix the variant (or its "
     "traffic model) and run again"),
    ({"end_to_end": {"status": "failed", "error": "scenario output has NaN or Inf"}},
     "records a failed end-to-end scenario: scenario output has NaN or Inf"),
])
def test_strict_rejects_results_not_to_publish(make_case, extra, message):
    path = make_case()
    result = store_result(path)
    doc = json.loads(result.read_text())
    doc.update({k: {**doc[k], **v} if isinstance(v, dict) else v for k, v in extra.items()})  # a level: its fields
    result.write_text(json.dumps(doc))
    assert [str(e) for e in validate([path], strict=True).errors] == [
        f"{path}:1: results: results/nvidia-h200/softmax_fusion.json {message}"]


def test_strict_warns_of_a_missed_claim_without_rejecting_it(make_case):
    path = make_case()
    result = store_result(path)
    from casebook.claims import evaluate
    from casebook.results import load

    empty = load(result)  # nothing measured: every claim failed
    claims = [c.model_dump(mode="json", exclude_unset=True) for c in evaluate(
        load_case(path), "nvidia-h200", empty.kernel_level, empty.workload_level, empty.end_to_end)]
    result.write_text(json.dumps({**json.loads(result.read_text()), "claims": claims}))
    report = validate([path], strict=True)
    assert report.errors == []
    problems = [str(w) for w in report.warnings if w.field == "results"]
    assert len(problems) == len(claims)
    assert problems[0] == (f"{path}:1: results: warning: results/nvidia-h200/softmax_fusion.json records a failed "
                           f"claim: {claims[0]['text']!r} ({claims[0]['detail']}); the page shows it as failed; fix "
                           "the kernel, or restate the claim as what was measured")


def test_strict_warns_of_a_result_in_an_older_format(make_case):
    path = make_case()
    result = store_result(path)
    doc = json.loads(result.read_text())
    assert not [w for w in validate([path], strict=True).warnings if "result format" in str(w)]
    result.write_text(json.dumps({**doc, "schema_version": doc["schema_version"] - 1}))
    report = validate([path], strict=True)
    assert report.errors == []
    [warning] = [str(w) for w in report.warnings if "result format" in str(w)]
    assert warning.startswith(f"{path}:1: results: warning: results/nvidia-h200/softmax_fusion.json is written in "
                              f"result format {doc['schema_version'] - 1}, not {doc['schema_version']}")


def test_strict_accepts_a_clean_full_result(make_case):
    path = make_case()
    result = store_result(path)
    names = ["eager", "torch_softmax", "torch_compile", "triton_onepass", "triton_online", "cluster_bulk"]
    doc = json.loads(result.read_text())
    result.write_text(json.dumps({**doc, "command": "casebook run cases/softmax_fusion.yaml",
                                  "variants": [{"name": n, "note": "n", "backends": ["cuda"], "device": "cuda",
                                                "mode": "timed"} for n in names],
                                  "kernel_level": [{**FAILED_POINT, "status": s} for s in ("checked", "skipped")],
                                  "end_to_end": {**doc["end_to_end"], "status": "partial"}}))
    assert validate([path], strict=True).errors == []


def test_strict_rejects_an_untouched_scaffold(tmp_path, monkeypatch):
    from casebook.commands import new
    from casebook.validate import SCAFFOLD_CASE, SCAFFOLD_KERNEL

    (tmp_path / "casebook" / "kernels").mkdir(parents=True)
    assert new.main("fresh_case", root=tmp_path) == 0
    path = tmp_path / "cases" / "fresh_case.yaml"
    store_result(path, kernel_sha=provenance.kernel_sha256("fresh_case", tmp_path / "casebook" / "kernels"))
    rows = path.read_text().splitlines()
    lines = [i for mark in SCAFFOLD_CASE for i, row in enumerate(rows, 1) if mark in row]
    assert len(lines) == 5  # the header, the title, the summary and two workload sources
    errors = [str(e) for e in validate([path], strict=True).errors if e.field != "claims"]
    assert errors == [f"{path}:{i}: scaffold: still holds the scaffold's placeholder ({mark!r}); write your case's own"
                      for mark in SCAFFOLD_CASE for i, row in enumerate(rows, 1) if mark in row] + [
        f"{path}:1: scaffold: casebook/kernels/fresh_case.py:3 still is the scaffold's scaled add; write your kernel"]
    assert SCAFFOLD_KERNEL in (tmp_path / "casebook" / "kernels" / "fresh_case.py").read_text()
    assert validate([path]).errors == []  # plain validate accepts the scaffold: it is a valid case


def test_strict_warns_about_claims_never_checked(make_case, line_of):
    path = make_case()
    result = store_result(path)
    cpu = result.parent.parent / "cpu-x86-64-2c" / result.name
    cpu.parent.mkdir()
    result.rename(cpu)
    warnings = [str(w) for w in validate([path], strict=True).warnings if w.field.startswith("claims")]
    assert len(warnings) == 8  # every claim of the softmax case is scoped to nvidia-h200
    assert warnings[0] == (f"{path}:{line_of(path, 'hardware: [nvidia-h200]')}: claims.0.hardware: warning: claim is "
                           "scoped to nvidia-h200, which has no results/<hardware>/softmax_fusion.json: it is never "
                           "checked until the case runs there")
    store_result(path)
    assert [w for w in validate([path], strict=True).warnings if w.field.startswith("claims")] == []


def test_strict_rejects_a_case_without_claims(make_case, softmax_text, line_of, cli):
    text = softmax_text[: softmax_text.index("\nclaims:")] + "\nclaims: []\n" + \
        softmax_text[softmax_text.index("\nwriteup:"):]
    path = make_case(text=text)
    store_result(path)
    assert f"{path}:{line_of(path, 'claims: []')}: claims: no claims: the run checks nothing against its " \
           "measurements; review requires at least one (kinds: regime, roof_fraction, throughput, speedup)" \
        in [str(e) for e in validate([path], strict=True).errors]
    assert cli("check", path).exit_code == 2
    assert [e for e in validate([path]).errors if e.field == "claims"] == []  # plain validate: a valid case


def test_check_warns_of_one_hardware_name_with_two_machines_ceilings(make_case, cli):
    """Two results under one name, copy ceilings 45.9 and 19.3 GB/s: two hosts of one model (a contributor's and
    the book's); check warns on both results and does not refuse either case: neither author can act on it, and
    the site shows them as two machines."""
    paths = [make_case(), make_case(name="other_case")]
    for path, copy_gbps in zip(paths, (45.9, 19.3)):
        result = store_result(path)
        doc = json.loads(result.read_text())
        doc["hardware"].update(slug="cpu-one-name-2c-24g", name="cpu-one-name-2c-24g")
        doc["hardware"]["measured"]["copy_gbps"] = copy_gbps
        (result.parent.parent / "cpu-one-name-2c-24g").mkdir(exist_ok=True)
        (result.parent.parent / "cpu-one-name-2c-24g" / result.name).write_text(json.dumps(doc))
        result.unlink()
    report = validate(paths, strict=True)
    assert not [e for e in report.errors if "share the hardware name" in str(e)]
    assert [str(e) for e in report.warnings if "share the hardware name" in str(e)] == [
        f"{paths[0]}:1: results: warning: results/cpu-one-name-2c-24g/softmax_fusion.json and "
        "results/cpu-one-name-2c-24g/other_case.json share the hardware name 'cpu-one-name-2c-24g' but their measured "
        "ceilings differ by more than 20% (copy 45.9 vs 19.3 GB/s): two hosts of one model, or a disturbed run; the "
        "site shows each on its own ceilings, as two machines",
        f"{paths[1]}:1: results: warning: results/cpu-one-name-2c-24g/other_case.json and "
        "results/cpu-one-name-2c-24g/softmax_fusion.json share the hardware name 'cpu-one-name-2c-24g' but their "
        "measured ceilings differ by more than 20% (copy 19.3 vs 45.9 GB/s): two hosts of one model, or a disturbed "
        "run; the site shows each on its own ceilings, as two machines"]
    assert cli("check", paths[0]).exit_code == 0


def test_check_command_passes_with_fresh_results(make_case, cli):
    path = make_case()
    store_result(path)
    result = cli("check", path)
    assert result.exit_code == 0, result.output
    assert "2 warnings" in result.output  # the two CUDA-only variants


# --- provenance ------------------------------------------------------------------------------------


def test_provenance_hashes_bytes():
    assert provenance.case_sha256(SOFTMAX) == hashlib.sha256(SOFTMAX.read_bytes()).hexdigest()
    leaf = REPO / "casebook" / "kernels" / "gelu_fit.py"  # a kernel module that imports no other
    assert provenance.kernel_sha256("gelu_fit") == hashlib.sha256(leaf.read_bytes()).hexdigest()
    with pytest.raises(ValueError):
        provenance.kernel_path("../etc/passwd")


# --- conventions: names a case may leave out ----------------------------------------------------------


def test_a_case_relying_on_the_conventional_names_validates(small_case):
    """The fixture case names no `fn`, `reference`, `inputs` or `traffic`: the defaults resolve and exist."""
    path = small_case()
    kernel = yaml.safe_load(path.read_text())["kernel"]
    assert not {"reference", "inputs", "traffic"} & set(kernel) and not any("fn" in v for v in kernel["variants"])
    report = validate([path], strict=False)
    assert report.errors == [], [str(e) for e in report.errors]
    case = load_case(path)
    assert [v.fn for v in case.kernel.variants] == ["eager", "triton_fused"]
    assert (case.kernel.reference, case.kernel.inputs, case.kernel.traffic) == ("reference", "make_inputs", "traffic")


def test_a_missing_conventional_function_is_reported_at_its_field(small_case, line_of):
    """Defaults are still checked against the module's source (by ast): a renamed `traffic` is an error."""
    path = small_case()
    kernel = path.parent.parent / "casebook" / "kernels" / "scaled_add.py"
    kernel.write_text(kernel.read_text().replace("def traffic(", "def traffic_model(")
                      .replace("def triton_fused(", "def triton_fused_v2("))
    errors = sorted(str(e) for e in validate([path], strict=False).errors)
    assert errors == sorted([
        f"{path}:{line_of(path, 'kernel:')}: kernel.traffic: 'traffic' is not defined at the top level of "
        "casebook/kernels/scaled_add.py; did you mean 'Traffic'?",
        f"{path}:{line_of(path, '- name: triton_fused')}: kernel.variants.1.fn: 'triton_fused' is not defined at the "
        "top level of casebook/kernels/scaled_add.py; did you mean 'triton_fused_v2'?"]), errors


# --- one pass ----------------------------------------------------------------------------------------


def test_every_problem_of_a_file_in_one_pass(make_case, line_of):
    path = make_case({
        "operator: softmax\n": "operator: softmax\nopertor: typo\n",          # schema: an unknown field
        "  kind: bandwidth\n": "  kind: bandwith\n",                           # schema: a wrong literal
        "    x: [rows, cols]": "    x: [rows, colz]",                          # shapes: a wrong dimension name
        "  - operator: layernorm\n": "  - operator: layernorm\n    case: layer_norm_nope\n",  # links
        "  reference: reference\n": "  reference: referense\n",                # kernel names
    })
    found = [(e.line, e.field) for e in validate([path]).errors]
    assert found == sorted(found)  # in line order
    assert found == [
        (line_of(path, "opertor: typo"), "opertor"),
        (line_of(path, "kind: bandwith"), "bottleneck.kind"),
        (line_of(path, "case: layer_norm_nope"), "transfers.0.case"),
        (line_of(path, "reference: referense"), "kernel.reference"),
        (line_of(path, "x: [rows, colz]"), "kernel.tensors.x"),
    ]


def test_a_wrong_dimension_name_points_at_the_tensors_line(make_case, line_of):
    path = make_case({"    x: [rows, cols]": "    x: [rows, colz]"})
    [error] = validate([path]).errors
    assert str(error) == (f"{path}:{line_of(path, 'x: [rows, colz]')}: kernel.tensors.x: dimension 'colz' is in no "
                          "shape (the shapes' keys: cols, rows)")


def test_strict_tells_a_torch_compile_variant_that_inductor_runs_on_a_cpu(make_case, line_of):
    path = make_case()
    [warning] = [str(w) for w in validate([path], strict=True).warnings if "torch_compile" in str(w)]
    assert "Inductor also compiles for a CPU" in warning and "add `cpu` to its backends" in warning


def test_check_flags_a_tolerance_far_above_the_dtypes(make_case, line_of):
    eager = "    - name: eager\n      fn: eager\n"
    path = make_case({eager: eager + "      tolerance: 0.5\n"})
    store_result(path)
    [flag] = [str(w) for w in validate([path], strict=True).warnings if "tolerance" in w.field]
    assert flag.startswith(f"{path}:{line_of(path, 'tolerance: 0.5')}: kernel.variants.0.tolerance: warning: variant "
                           "'eager' is checked to 0.5, more than 10 times the bound of bf16 (0.02)")
