"""Shared fixtures: scratch books holding the tests' own small case (or a copy of the real softmax case),
and the CLI run in-process."""

from __future__ import annotations

import gc
import os
import shutil
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SOFTMAX = REPO / "tests" / "fixtures" / "cases" / "softmax_fusion.yaml"
"""The tests' frozen copy of the softmax case (the same kernel, levels and claims, a short write-up):
what the tests copy and edit, so that an edit to the real case cannot break them."""
FIXTURES = REPO / "tests" / "fixtures"
SMALL_CASE = FIXTURES / "cases" / "scaled_add.yaml"
"""The tests' own small case: a scaled add on the CPU, relying on every default of the format."""


SLOW_FIXTURES = frozenset({"built", "plot_cache", "cheats_run", "payloads"})
"""Fixtures that build the site or run child processes: every test using one is marked `slow`."""


def empty_result(slug: str = "nvidia-h200", measured: dict | None = None, **fields) -> dict:
    """A result with nothing measured in it, valid in the result model: every required field at its least."""
    from casebook.result import RESULT_SCHEMA_VERSION

    return {
        "schema_version": RESULT_SCHEMA_VERSION, "case_id": "toy", "case_sha256": "0" * 64, "kernel_sha256": "0" * 64,
        "command": "casebook run cases/toy.yaml", "started_at": "2026-12-01T00:00:00+00:00",
        "finished_at": "2026-12-01T00:01:00+00:00",
        "hardware": {"slug": slug, "name": slug, "kind": "gpu",
                     "measured": measured or {"copy_gbps": 1000.0, "matmul_tflops": {"bf16": 100.0}, "launch_us": 5.0,
                                              "graph_launch_us": 2.0}},
        "environment": {"python": "3.11", "platform": "Linux", "torch": "2.5", "cpu": "x86-64", "clocks_start": {},
                        "clocks_end": {}},
        "protocol": {"cache": "cold", "graph": False, "warmup_ms": 25.0, "min_reps": 10, "max_reps": 2000,
                     "time_cap_s": 1.0, "statistic": "median", "timer": "cuda events", "seed": 0, "tolerances": {},
                     "isolation": "one child process per variant", "correctness": "float64 reference"},
        "variants": [], "kernel_level": [],
        "workload_level": {"dtype": "bf16", "description": "none", "points": [], "summary": []},
        "end_to_end": {"description": "none", "shape": {}, "dtype": "bf16", "baseline": "base", "variant": "base",
                       "status": "skipped"},
        "claims": [], **fields}


KERNELS = REPO / "tests" / "kernels"
"""The kernels' own checks (Triton's interpreter over each case's rungs, shapes and dtypes): marked `kernels`,
so the harness's quick loop can leave them out and a kernel's author can run its file alone."""


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The markers: `slow`, `kernels`, and where the tests are spread over processes (pytest-xdist) the
    `large_memory` group. The GPU-only tests run spread over several processes on one card (`pytest -n 8 --dist
    loadgroup`); a test module names the tests whose float64 reference needs gigabytes with a function
    `large_memory(**params) -> bool`, called with each test's parameters, and those run one after another in one
    process, so no two of them meet on the card: eight processes at once ran 16 of them out of memory on an 80 GB
    H100."""
    spread = config.pluginmanager.hasplugin("xdist")
    for item in items:
        if SLOW_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.slow)
        if KERNELS in Path(item.fspath).parents:
            item.add_marker(pytest.mark.kernels)
        large = getattr(getattr(item, "module", None), "large_memory", None)
        if spread and large is not None and hasattr(item, "callspec") and large(**item.callspec.params):
            item.add_marker(pytest.mark.xdist_group("large_memory"))


def _cuda():
    """torch, where a test has put it to work on a GPU (a test that never imported torch leaves it unimported)."""
    torch = sys.modules.get("torch")
    return torch if torch is not None and torch.cuda.is_available() and torch.cuda.is_initialized() else None


@pytest.fixture(autouse=True)
def _release_cached_gpu_memory(request):
    """After each test on a GPU, the memory it used handed back, so that the processes sharing the card (`pytest
    -n`) do not each hold the largest test's blocks for the rest of the session: the traceback pytest keeps of the
    last failure (`sys.last_traceback`, for post-mortem debugging) let go, with the tensors its frames hold, then
    the cycles collected and the allocator's cache emptied. On an 80 GB H100, 63 of 970 tests failed, every one
    out of memory, while two processes held 22-24 GB each from one failure to the next: a failed test's frames
    keep its inputs and its float64 reference alive until the process's next failure.

    `CASEBOOK_TEST_MEMORY=PREFIX`: each GPU test's peak, and what its process still holds once it is let go, in
    bytes, a line each in PREFIX.<pid> (test, peak allocated, allocated after, reserved after): where the card's
    memory goes when the tests share it."""
    if torch := _cuda():
        torch.cuda.reset_peak_memory_stats()
    yield
    if torch := _cuda():
        for name in ("last_type", "last_value", "last_traceback", "last_exc"):
            if hasattr(sys, name):
                setattr(sys, name, None)
        if torch.cuda.memory_allocated():
            gc.collect()
        torch.cuda.empty_cache()
        if log := os.environ.get("CASEBOOK_TEST_MEMORY"):
            with open(f"{log}.{os.getpid()}", "a") as f:
                f.write(f"{request.node.nodeid}\t{torch.cuda.max_memory_allocated()}\t"
                        f"{torch.cuda.memory_allocated()}\t{torch.cuda.memory_reserved()}\n")


@pytest.fixture
def small_case(tmp_path: Path):
    """Write a scratch book at `<tmp>`: `cases/scaled_add.yaml` (each `edits` pair applied once, or `text`)
    and its kernel module in `casebook/kernels/`; return the case's path."""

    def make(edits: dict[str, str] | None = None, text: str | None = None) -> Path:
        if text is None:
            text = SMALL_CASE.read_text()
            for old, new in (edits or {}).items():
                assert text.count(old) == 1, f"edit target not unique: {old!r}"
                text = text.replace(old, new)
        kernels = tmp_path / "casebook" / "kernels"
        kernels.mkdir(parents=True, exist_ok=True)
        shutil.copy(FIXTURES / "kernels" / "scaled_add.py", kernels / "scaled_add.py")
        path = tmp_path / "cases" / "scaled_add.yaml"
        path.parent.mkdir(exist_ok=True)
        path.write_text(text)
        return path

    return make


@pytest.fixture
def softmax_text() -> str:
    """The tests' softmax case (tests/fixtures/cases/softmax_fusion.yaml), as text."""
    return SOFTMAX.read_text()


@pytest.fixture
def make_case(tmp_path: Path, softmax_text: str):
    """Write `<tmp>/cases/<name>.yaml`: the tests' softmax case with its id set to `name`, each `edits` pair applied
    once."""

    def make(edits: dict[str, str] | None = None, name: str = "softmax_fusion", text: str | None = None) -> Path:
        if text is None:
            text = softmax_text.replace("\nid: softmax_fusion\n", f"\nid: {name}\n")
            for old, new in (edits or {}).items():
                assert text.count(old) == 1, f"edit target not unique: {old!r}"
                text = text.replace(old, new)
        path = tmp_path / "cases" / f"{name}.yaml"
        path.parent.mkdir(exist_ok=True)
        path.write_text(text)
        return path

    return make


@pytest.fixture
def cli():
    """Run `casebook ARGS...` in-process; the output never holds a traceback."""
    from typer.testing import CliRunner

    from casebook.cli import app

    def run(*args: str):
        result = CliRunner().invoke(app, [str(a) for a in args])
        assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
        assert "Traceback" not in result.output
        return result

    return run


@pytest.fixture
def line_of():
    """`line_of(path, snippet, nth=1)`: the 1-based line of the nth line of a file containing `snippet`."""

    def find(path: Path, snippet: str, nth: int = 1) -> int:
        rows = Path(path).read_bytes().decode("utf-8", "replace").splitlines()
        return [i for i, row in enumerate(rows, 1) if snippet in row][nth - 1]

    return find


POOL_CEILINGS = {"copy_gbps": 1e3, "matmul_tflops": {"fp32": 1e3}, "launch_us": 1e-3, "graph_launch_us": 1e-3}
"""Synthetic ceilings (as tests/run/test_orchestrate.py's): the tiny case's kernels sit far under every roof."""


@pytest.fixture
def small_book(tmp_path, monkeypatch):
    """Two copies of the tests' scaled add (scaled_add, scaled_add_b) in a scratch book, the fixture
    kernels importable by the workers' children, and a cache holding synthetic ceilings for this CPU."""
    import json

    import torch

    from casebook import paths
    from casebook.run import hardware

    cases = tmp_path / "cases"
    cases.mkdir()
    text = SMALL_CASE.read_text()
    (cases / "scaled_add.yaml").write_text(text)
    (cases / "scaled_add_b.yaml").write_text(text.replace("id: scaled_add ", "id: scaled_add_b "))
    cache = tmp_path / "cache"
    cache.mkdir()
    ident = hardware.identify()
    (cache / f"ceilings-{hardware.ceilings_key(ident)}.json").write_text(json.dumps(
        {**POOL_CEILINGS, "version": hardware.CEILINGS_VERSION, "torch": torch.__version__, "slug": ident.slug}))
    monkeypatch.setenv("CASEBOOK_CACHE", str(cache))
    monkeypatch.setattr(paths, "CACHE_DIR", cache)
    monkeypatch.setenv("CASEBOOK_KERNELS_PATH", str(FIXTURES / "kernels"))
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.chdir(tmp_path)
    return tmp_path
