"""casebook.run.preflight and `casebook run`'s bad states: one located line each, exit 2, no traceback, no child."""

from __future__ import annotations

import os

import pytest

from casebook.run import preflight


def test_a_valid_name_with_no_file_is_refused(small_case, line_of):
    path = small_case({"module: scaled_add": "module: os"})
    [why] = preflight.problems(path)
    assert why == (f"{path}:{line_of(path, 'module: os')}: kernel.module: no kernel module casebook/kernels/os.py "
                   "(a valid name, but no file of that name in the kernels package)")


def test_a_kernel_module_in_another_encoding_is_refused(small_case, monkeypatch, tmp_path, line_of):
    path = small_case()
    kernels = tmp_path / "casebook" / "kernels"
    (kernels / "scaled_add.py").write_bytes("# -*- coding: latin-1 -*-\n# caf\xe9\n".encode("latin-1"))
    monkeypatch.setattr(preflight.provenance, "kernel_source", lambda module: kernels / f"{module}.py")
    [why] = preflight.problems(path)
    assert why.endswith("kernel.module: casebook/kernels/scaled_add.py is not UTF-8 text (byte 31); save it as UTF-8")


def test_a_case_of_ten_thousand_shapes_is_refused(small_case):
    shapes = ", ".join(f"{{n: {1024 + i}}}" for i in range(10_000))
    path = small_case({"    cpu_shapes:                 # small stand-ins for a CPU-only machine\n      - {n: 65536}":
                       f"    cpu_shapes: [{shapes}]"})
    [why] = [w for w in preflight.problems(path) if "points" in w]
    assert "40004 points" in why and f"at most {preflight.MAX_POINTS} points a run" in why


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes anywhere")
def test_a_results_folder_that_cannot_be_written(small_case, tmp_path):
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o500)
    assert any("cannot be written" in w for w in preflight.problems(small_case(), locked / "results"))


def test_a_full_disk(small_case, tmp_path, monkeypatch):
    import shutil
    from collections import namedtuple

    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda p: usage(10**9, 10**9, 1024))
    why = preflight.writable_problem(tmp_path, "the results folder")
    assert why.endswith("has 0 MiB free (a run needs 64 MiB)")


def test_run_prints_the_bad_state_and_exits_2(small_case, cli, line_of):
    path = small_case({"module: scaled_add": "module: os"})
    result = cli("run", path)
    assert result.exit_code == 2
    assert "no kernel module casebook/kernels/os.py" in result.output


def test_finding_a_kernel_module_runs_nothing_of_the_kernels_package(tmp_path, monkeypatch):
    """The run's parent finds a kernel module's file as the package would (its folder, then CASEBOOK_KERNELS_PATH)
    without importing `casebook.kernels`: its `__init__.py`, contributed code like the rest, never runs there."""
    import subprocess
    import sys

    (tmp_path / "mine.py").write_text("x = 1\n")
    code = ("import sys; from casebook import provenance; from casebook.run import preflight; "
            "print(provenance.kernel_source('mine'), provenance.kernel_source('softmax_fusion').name, "
            "'casebook.kernels' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={**__import__("os").environ, "CASEBOOK_KERNELS_PATH": str(tmp_path)}).stdout.split()
    assert out == [str(tmp_path / "mine.py"), "softmax_fusion.py", "False"]
