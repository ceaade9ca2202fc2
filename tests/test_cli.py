"""The commands validate, check, list, schema and new; `casebook --help` stays fast and light."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from casebook.commands.schema import json_schema_text

from conftest import REPO

HEAVY = ("torch", "triton", "matplotlib", "numpy", "mkdocs", "yaml", "casebook.case", "casebook.result",
         "casebook.load", "rich", "typer.rich_utils", "pydantic")
"""Not needed to print help. typer's rich help (`typer.rich_utils`, with rich's console, markdown and
traceback) and its pydantic conversion of the group's absent `--help` (`cli.Commands`) each took 0.1-0.3 s
of every `casebook COMMAND --help`."""

HELP_S = 0.5
"""The bound on `casebook [COMMAND] --help`, interpreter start included, the best of five runs: on its CPU
time always, and on its wall time where the machine is not overloaded (load average under its CPUs). On a
shared 2-core box at a load average of 16 the wall time measures the load (`import typer` alone took
0.56-0.76 s there); the CPU time does not: 0.08 s for every command, against 0.17-0.28 s before help
stopped importing rich and pydantic. A quiet 2-core machine answers in about 0.1 s of wall time."""

PROBE = """
import sys
from casebook.cli import app
try:
    app({args!r})
except SystemExit:
    pass
print("HEAVY", [m for m in {heavy!r} if m in sys.modules])
"""


@pytest.mark.slow
def _command_names() -> list[str]:
    from casebook.cli import app

    return [c.name or c.callback.__name__ for c in app.registered_commands]


@pytest.mark.parametrize("args", [["--help"]] + [[name, "--help"] for name in _command_names()])
def test_help_is_fast_and_imports_nothing_heavy(args):
    runs = [_probe(args) for _ in range(5)]
    for _, _, code, out in runs:
        assert code == 0 and "Usage" in out, out
        assert "HEAVY []" in out, out
    best_wall, best_cpu = min(r[0] for r in runs), min(r[1] for r in runs)
    assert best_cpu < HELP_S, f"`casebook {' '.join(args)}` took {best_cpu:.2f} s of CPU"
    if os.getloadavg()[0] < (os.cpu_count() or 1):
        assert best_wall < HELP_S, f"`casebook {' '.join(args)}` took {best_wall:.2f} s"


def _probe(args: list[str]) -> tuple[float, float, int, str]:
    """One run of the probe: (wall seconds, CPU seconds (user + system), exit code, output)."""
    start = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-c", PROBE.format(args=args, heavy=HEAVY)], cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    out = proc.stdout.read()
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    proc.stdout.close()
    return time.perf_counter() - start, usage.ru_utime + usage.ru_stime, proc.returncode, out


def test_every_command_is_probed():
    assert {"new", "validate", "check", "list", "schema", "hardware", "run", "compare", "build", "serve"} <= set(
        _command_names())


# --- validate -------------------------------------------------------------------------------------


def test_validate_defaults_to_the_cases_folder(cli, make_case, tmp_path, monkeypatch):
    make_case()
    monkeypatch.chdir(tmp_path)
    result = cli("validate")
    assert result.exit_code == 0
    assert result.output == "1 case file checked: all valid\n"


def test_validate_reports_every_file(cli, make_case, line_of):
    good = make_case(name="good_case")
    bad = make_case({"    cache: cold\n": "    cahce: cold\n"}, name="bad_case")
    result = cli("validate", good, bad)
    assert result.exit_code == 2
    lines = result.output.strip().splitlines()
    assert lines == [f"{bad}:{line_of(bad, 'cahce')}: levels.kernel.cahce: unknown field 'cahce'; "
                     "did you mean 'cache'?",
                     "2 case files checked: 1 error in 1 file"]


def test_validate_long_lines_are_never_wrapped(cli, make_case):
    path = make_case({"    cache: cold\n": "    cahce: cold\n"}, name="a" * 64)
    [line, _] = cli("validate", path).output.strip().splitlines()
    assert line.startswith(str(path)) and line.endswith("did you mean 'cache'?")


# --- list -----------------------------------------------------------------------------------------


@pytest.fixture
def two_cases(make_case, tmp_path, monkeypatch):
    make_case(name="softmax_fusion")
    make_case({"operator: softmax": "operator: layernorm", "  kind: bandwidth\n  arithmetic": "  kind: launch\n  "
                                                                                              "arithmetic",
               "patterns: [fusion, online_reduction, specialization]": "patterns: [fusion, persistent]"},
              name="layernorm_fusion")
    monkeypatch.chdir(tmp_path)


@pytest.mark.parametrize("args, shown", [
    ([], {"softmax_fusion", "layernorm_fusion"}),
    (["--pattern", "online_reduction"], {"softmax_fusion"}),
    (["--pattern", "fusion"], {"softmax_fusion", "layernorm_fusion"}),
    (["--bottleneck", "launch"], {"layernorm_fusion"}),
    (["--operator", "softmax"], {"softmax_fusion"}),
    (["--operator", "gemm"], set()),
])
def test_list_filters(cli, two_cases, args, shown):
    result = cli("list", *args)
    assert result.exit_code == 0
    assert {c for c in ("softmax_fusion", "layernorm_fusion") if c in result.output} == shown
    assert f"{len(shown)} of 2 cases" in result.output


def test_list_unknown_filter_value(cli, two_cases):
    result = cli("list", "--pattern", "fusoin")
    assert result.exit_code == 2
    assert "did you mean 'fusion'?" in result.output


def test_list_with_an_invalid_case(cli, two_cases, make_case):
    bad = make_case({"    cache: cold\n": "    cahce: cold\n"}, name="broken")
    result = cli("list")
    assert result.exit_code == 2
    assert f"{bad.relative_to(bad.parent.parent)}:" in result.output
    assert "softmax_fusion" in result.output


# --- schema ---------------------------------------------------------------------------------------


def test_schema_command(cli, tmp_path):
    assert json.loads(cli("schema").output) == json.loads(json_schema_text())
    out = tmp_path / "docs" / "case.schema.json"
    assert cli("schema", "--out", out).exit_code == 0
    assert out.read_text() == json_schema_text()


# --- new ------------------------------------------------------------------------------------------


@pytest.fixture
def book(tmp_path, monkeypatch) -> Path:
    (tmp_path / "casebook" / "kernels").mkdir(parents=True)
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_new_scaffolds_a_case_that_validates(cli, book):
    result = cli("new", "scaled_add")
    assert result.exit_code == 0, result.output
    case, kernel = book / "cases" / "scaled_add.yaml", book / "casebook" / "kernels" / "scaled_add.py"
    notebook = book / "notes" / "scaled_add.md"
    assert case.read_text().startswith("# yaml-language-server: $schema=../docs/schema/case.schema.json\n")
    assert "{{" not in case.read_text() + kernel.read_text() + notebook.read_text()
    assert notebook.read_text().startswith("# scaled_add: the floors, the predictions")
    assert "## The two floors" in notebook.read_text() and "notes/scaled_add.md" in result.output
    assert cli("validate", case).exit_code == 0
    check = cli("check", "cases/scaled_add.yaml")  # nothing but the missing results: every variant has a CPU check path
    assert check.exit_code == 2
    assert check.output.splitlines()[0].startswith("cases/scaled_add.yaml:1: results: no results/")
    assert "warning" not in check.output


def test_new_refuses_to_overwrite(cli, book):
    (book / "cases").mkdir()
    (book / "cases" / "taken.yaml").write_text("mine\n")
    result = cli("new", "taken")
    assert result.exit_code == 2
    assert "already exists; nothing written" in result.output
    assert (book / "cases" / "taken.yaml").read_text() == "mine\n"
    assert not (book / "casebook" / "kernels" / "taken.py").exists()
    (book / "notes").mkdir()
    (book / "notes" / "family.md").write_text("a family's notebook\n")
    assert cli("new", "family").exit_code == 2  # a notebook of that name is not overwritten either
    assert (book / "notes" / "family.md").read_text() == "a family's notebook\n"


@pytest.mark.parametrize("name", ["ScaledAdd", "scaled-add", "1st_case", "_private", "a" * 65, "../escape", "lambda"])
def test_new_wants_lower_snake_case(cli, book, name):
    result = cli("new", name)
    assert result.exit_code == 2
    assert "lower_snake_case" in result.output
    assert not (book / "cases").exists()


def test_new_outside_a_book(cli, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    result = cli("new", "scaled_add")
    assert result.exit_code == 2
    assert "run `casebook new` from the book's root" in result.output


SCAFFOLD_RUNS = """
import importlib.util, torch
spec = importlib.util.spec_from_file_location("k", "casebook/kernels/scaled_add.py")
k = importlib.util.module_from_spec(spec)
spec.loader.exec_module(k)
g = torch.Generator().manual_seed(0)
for dtype, tol in ((torch.float32, 1e-6), (torch.bfloat16, 1e-2)):
    inputs = k.make_inputs({"n": 5000}, dtype, "cpu", g)
    expected = k.reference(**inputs)
    for fn in (k.eager, k.triton_fused):
        out = fn(**inputs)
        assert out.dtype == dtype and out.shape == expected.shape
        assert ((out.double() - expected).norm() / expected.norm()).item() < tol, fn.__name__
block = k.make_block_inputs({"tokens": 8, "hidden": 32}, torch.float32, "cpu", g)
assert torch.allclose(k.residual_block(k.eager, **block), k.residual_block(k.triton_fused, **block))
assert k.traffic({"n": 10}, torch.bfloat16).bytes == 60
print("OK")
"""


@pytest.mark.slow
def test_new_scaffold_kernel_is_correct_on_cpu(cli, book):
    pytest.importorskip("triton")
    assert cli("new", "scaled_add").exit_code == 0
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(REPO)}
    proc = subprocess.run([sys.executable, "-c", SCAFFOLD_RUNS], cwd=book, env=env, capture_output=True,
                          text=True, timeout=300)
    assert proc.stdout.strip() == "OK", proc.stderr[-3000:]


def test_help_lists_every_command_in_a_whole_line(cli):
    """`casebook --help` at 80 columns: each command's line is whole (click cut long ones with "...")."""
    out = cli("--help").output
    commands = out.split("Commands:")[1].strip().splitlines()
    assert len(commands) == 13 and not [c for c in commands if c.rstrip().endswith("...")], commands


def test_the_readme_names_every_command():
    from casebook.cli import app

    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    names = [c.name or c.callback.__name__ for c in app.registered_commands]
    assert [n for n in names if f"`casebook {n}" not in readme] == []


def test_a_book_refresh_measures_again_a_result_in_an_older_format(tmp_path, monkeypatch):
    """`casebook run --all --save --resume` leaves a current result alone, but not one written in an older result
    format: it reads through its migration and lacks what the format gained since."""
    from types import SimpleNamespace

    from casebook.commands.run_many import current_result
    from casebook.load import load_case
    from casebook.run import hardware

    from site_helpers import copy_cases, copy_results

    cases = copy_cases(tmp_path / "cases")
    results = copy_results(tmp_path / "results", cases)
    monkeypatch.setattr(hardware, "identify", lambda devices=None: SimpleNamespace(slug="nvidia-h200"))
    path = cases / "softmax_fusion.yaml"
    stored = results / "nvidia-h200" / "softmax_fusion.json"
    assert current_result(path, load_case(path), results) == stored
    doc = json.loads(stored.read_text())
    stored.write_text(json.dumps({**doc, "schema_version": doc["schema_version"] - 1}))
    assert current_result(path, load_case(path), results) is None
