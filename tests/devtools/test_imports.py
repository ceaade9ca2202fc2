"""casebook.devtools.imports: the import graph has no cycle, no upward import, no torch outside the run and the
kernels; and the commands that read a book run with torch absent."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from casebook.devtools import imports

from conftest import REPO


def test_casebook_keeps_the_rules():
    r = imports.report()
    assert len(r.edges) > 100, "the graph was read"
    assert (r.cycles, r.upward, r.torch_outside, r.unplaced) == ([], [], [], [])


def _package(tmp_path: Path, files: dict[str, str]) -> Path:
    package = tmp_path / "casebook"
    for name, text in {"__init__.py": "", **files}.items():
        (package / name).parent.mkdir(parents=True, exist_ok=True)
        (package / name).write_text(text)
    return package


def test_each_rule_can_fail(tmp_path):
    package = _package(tmp_path, {
        "case.py": "def f():\n    from casebook import result  # inside a function: still a cycle\n",
        "result.py": "from casebook import case\nimport torch\n",
        "claims.py": "from casebook.render import pages\n",
        "render/__init__.py": "", "render/pages.py": "",
        "run/__init__.py": "", "run/bench.py": "import torch\nfrom casebook.claims import x\n",
        "newthing.py": "",
    })
    r = imports.report(package)
    assert r.cycles == [["casebook.case", "casebook.result"]]
    assert [(e.source, e.target) for e in r.upward] == [("casebook.claims", "casebook.render.pages")]
    assert [(e.source, e.target) for e in r.torch_outside] == [("casebook.result", "torch")]
    assert r.unplaced == ["casebook.newthing"]
    assert r.problems == 4


def test_the_script_prints_the_graph_and_says_zero():
    out = subprocess.run([sys.executable, "-m", "casebook.devtools.imports"], capture_output=True, text=True,
                         cwd=REPO)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "run.orchestrate:" in out.stdout
    assert "0 cycles, 0 upward imports, 0 imports of torch or triton" in out.stdout


NO_TORCH = """
import sys
class Absent:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("torch", "triton"):
            raise ModuleNotFoundError(f"No module named {name!r}")
sys.meta_path.insert(0, Absent())
"""
"""A `sitecustomize` that makes torch and triton absent, as in the base install (no `kernels` extra)."""


@pytest.fixture
def without_torch(tmp_path):
    (tmp_path / "sitecustomize.py").write_text(NO_TORCH)
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(REPO)])}


@pytest.mark.parametrize("args", [["validate", "cases/softmax_fusion.yaml"], ["check", "cases/softmax_fusion.yaml"],
                                  ["list"], ["schema"], ["compare", "--help"]])
def test_the_commands_that_read_a_book_run_without_torch(args, without_torch):
    out = subprocess.run([sys.executable, "-m", "casebook.cli", *args], capture_output=True, text=True, cwd=REPO,
                         env=without_torch, timeout=120)
    assert "Traceback" not in out.stderr and "ModuleNotFoundError" not in out.stderr, out.stderr
    assert out.returncode in (0, 1), out.stdout + out.stderr  # check may find a result to warn about; never exit 2


def test_new_runs_without_torch(tmp_path, without_torch):
    book = tmp_path / "book"
    (book / "cases").mkdir(parents=True)
    (book / "casebook" / "kernels").mkdir(parents=True)
    out = subprocess.run([sys.executable, "-m", "casebook.cli", "new", "my_op"], capture_output=True, text=True,
                         cwd=book, env=without_torch, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    assert (book / "cases" / "my_op.yaml").is_file()


def test_reading_modules_import_no_torch():
    code = ("import sys, casebook.validate, casebook.render.site, casebook.commands.build, casebook.commands.list, "
            "casebook.commands.new, casebook.commands.validate, casebook.commands.compare, casebook.commands.record, "
            "casebook.commands.project, casebook.commands.history, casebook.commands.schema; "
            "print(sorted(m for m in ('torch', 'triton') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr


def test_the_readme_layout_names_every_module():
    """The README's layout gives each module its one job: a module added without a line there is caught here."""
    readme = (REPO / "README.md").read_text()
    layout = readme[readme.index("## Layout"):readme.index("## Adding a case")]
    folders = [REPO / "casebook" / f for f in ("", "run", "render", "devtools")]
    modules = [p for folder in folders for p in sorted(folder.glob("*.py")) if p.name != "__init__.py"]
    assert len(modules) > 40
    missing = [str(p.relative_to(REPO)) for p in modules if p.name not in layout]
    assert missing == []
