"""The trust boundary under attack: each public way of fooling a kernel benchmark, tried through the real path.

The kernel side: tests/fixtures/kernels/attacks.py, one variant per attack, run by `casebook run`'s own
`run_case` from a scratch book (its children import the module through CASEBOOK_KERNELS_PATH). No attack
may end as an `ok` point while it cheated. The stored side: results forged after the run (a median under
the roofline floor, a claim's verdict flipped), which `casebook check` must refuse. The process side: a
grandchild that outlives its parent, a run ended by SIGTERM, a variant printing into `--json`.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import casebook.kernels
from casebook.result import Point, Result
from casebook.run import assemble, orchestrate

from conftest import REPO

pytestmark = pytest.mark.slow  # every test here runs child processes

ATTACKS_DIR = Path(__file__).parent / "fixtures" / "kernels"
CEILINGS = {"copy_gbps": 1e3, "matmul_tflops": {"fp32": 1e3, "bf16": 1e3}, "launch_us": 1e-3,
            "graph_launch_us": 1e-3}
"""Synthetic ceilings (1 TB/s, 1 PFLOP/s): the tiny case's kernels sit far under every roof."""

CAUGHT = {
    # attack: words its error must hold (None: any failure will do)
    "background_thread": None,
    "lazy_output": "returned LazySoftmax, not a plain torch.Tensor",
    "patches_timer": "rebound what the harness relies on",
    "patches_evaluator": None,
    "patches_reference": "relative error",
    "cache_by_address": "after timing",
    "allocator_reuse": None,
    "call_counting": "timed call",
    "deterministic_flag": "seed ",
    "input_identity": "timed call",
    "scaled_1015": "worst row off by",
    "zero_row": "worst row off by",
    "partial_write": None,
}
FORGED = {
    # an answer forged in the child's process, bypassing the harness: words its error must hold
    "forges_calls_as_a_dict": "the child's answer is not in the format",
    "forges_a_deep_header": "could not be received (RecursionError",
}
HARMLESS = ("honest", "stack_inspection", "grandchild", "prints")
"""Variants that return the honest answer (stack_inspection: because every call's stack is the same)."""


def attacks_case() -> str:
    variants = "\n".join(f"    - {{name: {n}, note: \"{n}\", backends: [cpu]}}" for n in (*HARMLESS, *CAUGHT, *FORGED))
    return f"""\
schema_version: 1
id: attacks
title: "Kernels that attack the harness"
operator: softmax
summary: "Row softmax with the public ways of fooling a benchmark."
bottleneck: {{kind: bandwidth, reasoning: "A few FLOPs per byte."}}
patterns: [fusion]
boundaries: [{{axis: shape, holds: "Tiny shapes.", breaks: "Never run on a GPU."}}]
transfers: [{{operator: layernorm, why: "Same row reduction."}}]
kernel:
  module: attacks
  inputs: make_inputs
  tensors: {{x: [rows, cols], y: [rows, cols]}}
  baseline: honest
  variants:
{variants}
levels:
  kernel:
    shapes: [{{rows: 16384, cols: 32}}]
    cpu_shapes: [{{rows: 16384, cols: 32}}]
    dtypes: [bf16]
  workload:
    description: "One small shape."
    dtype: bf16
    shapes: [{{shape: {{rows: 8, cols: 256}}, weight: 1.0, source: "test"}}]
    cpu_shapes: [{{shape: {{rows: 8, cols: 256}}, weight: 1.0, source: "test"}}]
  end_to_end:
    description: "Softmax then a cumulative sum."
    scenario: scenario
    inputs: scenario_inputs
    shape: {{rows: 4, cols: 64}}
    cpu_shape: {{rows: 4, cols: 64}}
    dtype: fp32
    baseline: honest
    variant: honest
claims:
  - {{kind: throughput, text: "The honest kernel moves some bytes.", variant: honest, at_least_gbps: 1.0e-6}}
writeup: {{gap: "None.", remaining_bottleneck: "None."}}
"""


@pytest.fixture(scope="module")
def attacked(tmp_path_factory):
    """`run_case` on the attacks case, once: (result, marks folder, the grandchild's late file)."""
    book = tmp_path_factory.mktemp("book")
    (book / "cases").mkdir()
    path = book / "cases" / "attacks.yaml"
    path.write_text(attacks_case())
    marks, late = book / "marks", book / "late.txt"
    marks.mkdir()
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("CASEBOOK_KERNELS_PATH", str(ATTACKS_DIR))
        mp.setenv("ATTACKS_MARKS", str(marks))
        mp.setenv("ATTACKS_LATE_FILE", str(late))
        mp.setattr(casebook.kernels, "__path__", [*casebook.kernels.__path__, str(ATTACKS_DIR)])
        result = orchestrate.run_case(path, quick=True, timeout_s=60, ceilings=CEILINGS)
    return result, marks, late


def point(result: Result, name: str) -> Point:
    [p] = [p for p in result.kernel_level if p.variant == name]
    return p


@pytest.mark.parametrize("name", sorted(CAUGHT))
def test_attack_is_caught(attacked, name):
    result, marks, _ = attacked
    assert (marks / name).exists(), f"{name} never cheated: the test proves nothing"
    for p in [point(result, name)] + [w for w in result.workload_level.points if w.variant == name]:
        assert p.status == "failed", p
        assert p.correct is False and p.median_us is None, p
    if CAUGHT[name]:  # at the level-1 point (16384 rows: one zero row is about 1% of the norm, under bf16's 2%)
        assert CAUGHT[name] in point(result, name).error, point(result, name).error


@pytest.mark.parametrize("name", sorted(FORGED))
def test_a_forged_answer_crashes_its_point_and_the_run_goes_on(attacked, name):
    """A malformed answer (a dict where a list belongs, a header nested past any parser's depth) ends its own
    point with why, never the run."""
    result, marks, _ = attacked
    assert (marks / name).exists(), f"{name} never forged: the test proves nothing"
    p = point(result, name)
    assert p.status == "crashed" and FORGED[name] in p.error, p


@pytest.mark.parametrize("name", HARMLESS)
def test_honest_answers_are_ok(attacked, name):
    result, marks, _ = attacked
    p = point(result, name)
    assert p.status == "ok" and p.correct, p
    assert not (marks / name).exists(), f"{name} cheated and was reported ok"


def test_the_timer_patch_is_named(attacked):
    error = point(attacked[0], "patches_timer").error
    assert "time.perf_counter" in error, error


def test_every_call_of_a_point_is_judged_in_the_parent(attacked):
    """Two checks, a sample of the timed calls, the one after a blend and the call after timing: six outputs per
    timed point."""
    p = point(attacked[0], "honest")
    assert p.checked_calls == 6 and p.max_row_err <= 1e-2


def test_a_grandchild_does_not_outlive_its_parent(attacked):
    _, _, late = attacked
    pid = int(Path(f"{late}.pid").read_text())  # it started
    status = Path(f"/proc/{pid}/status")
    assert not status.exists() or "zombie" in status.read_text(), "a process the variant started outlived its child"
    assert not late.exists()


# --- the device crossing: memory the parent lends (`casebook.run.transport`), over shared host memory here ------------

CROSSING = {
    # attack: words its error must hold (None: any failure will do)
    "writes_after_send": None,  # its checksum, or its values, if the scribbles land before the judge's copy
    "frees_its_loan": "unmapped in the child",  # the harness will not copy its answer in: refused, run goes on
    "oversized": "output shape (32768, 32), expected (16384, 32)",
}


@pytest.fixture(scope="module")
def attacked_on_device(tmp_path_factory):
    """`run_case` on the crossing's attacks with `CASEBOOK_TRANSPORT=device`: each variant's answers cross in
    memory the parent lends it (a file in shared memory here, the GPU's own memory on a GPU)."""
    book = tmp_path_factory.mktemp("book")
    (book / "cases").mkdir()
    keep = ("honest", *CROSSING)
    text = "\n".join(line for line in attacks_case().splitlines()
                     if not line.startswith("    - {name: ") or any(f"{{name: {v}," in line for v in keep))
    text = text.replace("levels:", "\n".join(f"    - {{name: {n}, note: \"{n}\", backends: [cpu]}}"
                                             for n in CROSSING) + "\nlevels:", 1)
    path = book / "cases" / "attacks.yaml"
    path.write_text(text + "\n")
    marks, spill = book / "marks", book / "shm"
    marks.mkdir()
    spill.mkdir()
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("CASEBOOK_KERNELS_PATH", str(ATTACKS_DIR))
        mp.setenv("ATTACKS_MARKS", str(marks))
        mp.setenv("CASEBOOK_TRANSPORT", "device")
        mp.setenv("CASEBOOK_SPILL_DIR", str(spill))
        mp.setattr(casebook.kernels, "__path__", [*casebook.kernels.__path__, str(ATTACKS_DIR)])
        result = orchestrate.run_case(path, quick=True, timeout_s=60, ceilings=CEILINGS)
    return result, marks, spill


@pytest.mark.parametrize("name", sorted(CROSSING))
def test_an_attack_on_the_crossing_is_refused_and_the_run_goes_on(attacked_on_device, name):
    result, marks, _ = attacked_on_device
    assert (marks / name).exists(), f"{name} never cheated: the test proves nothing"
    mine = [p for p in result.kernel_level + result.workload_level.points if p.variant == name]
    refused = [p for p in mine if p.status in ("failed", "crashed")]
    assert refused and all(p.median_us is None for p in refused), mine  # frees_its_loan: from its second point
    assert all(p.status in ("ok", "failed", "crashed") for p in mine)
    if CROSSING[name]:
        assert CROSSING[name] in refused[0].error, refused[0].error


def test_the_crossing_carries_honest_answers_and_leaves_nothing(attacked_on_device):
    result, _, spill = attacked_on_device
    assert point(result, "honest").status == "ok" and point(result, "honest").checked_calls == 6
    assert "device protocol" in result.protocol.transport
    assert list(spill.iterdir()) == [], "every lent memory and spilled file removed"


def test_the_stored_document_is_judged_and_loadable(attacked, tmp_path):
    from casebook import results

    result = attacked[0]
    assert assemble.failed(result)
    stored = results.load(results.save(result, tmp_path))
    assert stored == result and stored.case_id == "attacks"


# --- the command line: SIGTERM, stdout ---------------------------------------------------------------------------

def _cli_book(tmp_path: Path, variants: tuple[str, ...]) -> Path:
    text = attacks_case()
    keep = [line for line in text.splitlines() if not line.startswith("    - {name: ")
            or any(f"{{name: {v}," in line for v in variants)]
    path = tmp_path / "cases" / "attacks.yaml"
    path.parent.mkdir(parents=True)
    path.write_text("\n".join(keep) + "\n")
    return path


def _env(tmp_path: Path) -> dict:
    return {**os.environ, "CASEBOOK_KERNELS_PATH": str(ATTACKS_DIR), "CASEBOOK_CACHE": str(tmp_path / "cache"),
            "PYTHONPATH": str(REPO), "ATTACKS_MARKS": str(tmp_path)}


def test_a_variant_printing_cannot_corrupt_json(tmp_path):
    path = _cli_book(tmp_path, ("honest", "prints"))
    proc = subprocess.run([sys.executable, "-m", "casebook.cli", "run", str(path), "--quick", "--json"],
                          env=_env(tmp_path), capture_output=True, text=True, timeout=600)
    doc = json.loads(proc.stdout)  # the variant's print went to stderr
    assert doc["case_id"] == "attacks" and "{ not json" in proc.stderr


def test_sigterm_ends_the_run_and_its_children(tmp_path):
    hang = ATTACKS_DIR / "hangs.py"
    assert hang.exists()
    path = _cli_book(tmp_path, ("honest",))
    text = path.read_text().replace("module: attacks", "module: hangs")
    path.write_text(text)
    env = _env(tmp_path)
    proc = subprocess.Popen([sys.executable, "-m", "casebook.cli", "run", str(path), "--quick"], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    marker = tmp_path / "hanging"
    deadline = time.monotonic() + 300
    while not marker.exists() and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.2)
    assert marker.exists(), proc.communicate()[1][-2000:]
    child = int(marker.read_text())
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 143, err[-2000:]
    assert "Traceback" not in err
    time.sleep(0.5)
    assert not Path(f"/proc/{child}").exists() or "zombie" in Path(f"/proc/{child}/status").read_text().lower()


def test_a_point_without_its_sampled_timed_calls_is_refused():
    """The judge requires every call the harness keeps: a child whose sampler was emptied sends its two checks
    alone, and its timed calls were never seen (a graph's replays are not sampled, and none are required there)."""
    from casebook.result import Protocol
    from casebook.run import judge
    from casebook.run.child import Task
    from casebook.run.messages import Call

    task = Task(module="m", variant="v", fn="v", shape={"rows": 1}, dtype="fp32", level="kernel",
                device="cpu", timed=True, seed=1, protocol=Protocol(min_reps=1))  # one repetition: no blend
    def call(role: str) -> Call:
        return Call(role=role, seed=1, tuple=False, outputs=[])

    checks = [call("check"), call("check")]
    assert "0 timed, 0 after" in judge.missing_calls(task, checks)
    assert judge.missing_calls(task, checks + [call("timed")] * 2 + [call("after")]) is None
    assert "3 timed" in judge.missing_calls(task, checks + [call("timed")] * 3 + [call("after")])
    graph = Task(**{**task.__dict__, "device": "cuda", "protocol": Protocol(graph=True)})
    assert judge.missing_calls(graph, checks + [call("after")]) is None
    assert judge.missing_calls(Task(**{**task.__dict__, "timed": False}), checks) is None
