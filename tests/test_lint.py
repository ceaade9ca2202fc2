"""The linter: configured in pyproject.toml, run by .ci/run, and the package and tests pass it."""

from __future__ import annotations

import subprocess
import sys
import tomllib

from conftest import REPO


def test_ci_runs_the_linter_before_the_tests():
    script = (REPO / ".ci" / "run").read_text()
    lint = script.index("python3 -m ruff check casebook tests")
    assert lint < script.index("python3 -m pytest"), "lint runs first, so a lint error fails CI"
    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]["test"]
    assert any(dep.startswith("ruff") for dep in extras), "the test extra, which .ci/run installs, brings ruff"


def test_the_package_and_the_tests_pass_the_linter():
    config = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["ruff"]
    assert config["line-length"] == 120 and set(config["lint"]["select"]) >= {"E", "F", "W", "I"}
    proc = subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", "casebook", "tests"], cwd=REPO,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
