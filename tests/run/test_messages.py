"""casebook.run.messages: a child's answer read once, strictly, against its task's declared message.

No child processes: answers are built here as the transport delivers them (JSON data, tensors at the leaves).
"""

from __future__ import annotations

import pytest
import torch

from casebook.run import orchestrate
from casebook.run.messages import (
    ERROR_MAX,
    Answer,
    Malformed,
    PairRun,
    PointRun,
    ScenarioRun,
    Stopped,
    TopologyRun,
    read,
)
from casebook.run.transport import Unsent, digest


def output(t: torch.Tensor) -> dict:
    return {"type": "Tensor", "device": "cpu", "tensor": t, "digest": digest(t)}


def call(role: str = "check", seed: int = 1, **kw) -> dict:
    return {"role": role, "seed": seed, "tuple": False, "outputs": [output(torch.ones(3))], "aliases_input": [],
            "aliases_output": [], "modified": [], **kw}


def point(**kw) -> dict:
    return {"status": "ran", "loaded": ["softmax"], "rebound": [], "first_call_s": 0.5, "calls": [call()],
            "times_us": [10.0, 11.0], "timer": "time.perf_counter_ns", "interference": {"window_s": 0.2, "cpus": 2},
            "launches": {"direct": 1, "graph": 0}, **kw}


def test_a_point_as_the_child_sends_it_is_read_into_its_types():
    run = read(PointRun, point(calls=[call(aliases_input=[[0, "x"]]), call("timed", 11, call=7)]))
    assert isinstance(run, PointRun) and run.times_us == [10.0, 11.0] and run.interference.cpus == 2
    assert run.calls[0].aliases_input == [(0, "x")] and run.calls[1].call == 7
    assert torch.equal(run.calls[0].outputs[0].tensor, torch.ones(3)) and run.launches.direct == 1
    unsent = Unsent(reason="no room", dtype="float32", shape=(3,))
    sent = read(PointRun, point(calls=[call(outputs=[{"type": "Tensor", "device": "cpu", "tensor": unsent}])]))
    assert sent.calls[0].outputs[0].tensor is unsent


@pytest.mark.parametrize("edit, where", [
    (lambda p: p.update(times_us=["10"]), "times_us.0: Input should be a valid number"),
    (lambda p: p.update(times_us=[True]), "times_us.0: Input should be a valid number"),
    (lambda p: p.update(first_call_s=[1]), "first_call_s: Input should be a valid number"),
    (lambda p: p["calls"][0].update(seed=True), "calls.0.seed: Input should be a valid integer"),
    (lambda p: p["calls"][0].update(seed="1"), "calls.0.seed: Input should be a valid integer"),
    (lambda p: p["calls"][0].update(role="sampled"), "calls.0.role: Input should be 'check', 'timed' or 'after'"),
    (lambda p: p["calls"][0]["outputs"][0].update(tensor=[1.0, 2.0]), "calls.0.outputs.0.tensor"),
    (lambda p: p["calls"][0].update(aliases_input=[[0, "x", 2]]), "calls.0.aliases_input.0"),
    (lambda p: p.update(calls={"variant": []}), "calls: Input should be a valid list"),
    (lambda p: p.update(interference={"window_s": "long"}), "interference.window_s: Input should be a valid number"),
    (lambda p: p.update(median_us=1.0), "median_us: Extra inputs are not permitted"),  # the judge takes medians
    (lambda p: p.update(peak_memory_bytes=-1), "peak_memory_bytes: Input should be greater than or equal to 0"),
    (lambda p: p.update(status="ok"), "status: Input should be 'ran'"),
])
def test_an_answer_out_of_the_format_is_a_malformed_crash_that_says_where(edit, where):
    answer = point()
    edit(answer)
    run = read(PointRun, answer)
    assert isinstance(run, Malformed) and run.status == "crashed", run
    assert run.error.startswith("the child's answer is not in the format (") and where in run.error, run.error


@pytest.mark.parametrize("answer", [None, [], "ran", 7, {}])
def test_what_is_no_answer_at_all_is_malformed(answer):
    assert isinstance(read(PointRun, answer), Malformed)


def test_a_task_that_did_not_run_is_read_as_stopped_whatever_the_task():
    said = {"status": "timeout", "error": "no answer within 60 s: killed"}
    for model in (PointRun, PairRun, ScenarioRun, Answer, TopologyRun):
        run = read(model, said)
        assert type(run) is Stopped and run.error == said["error"]
    long = read(PointRun, {"status": "crashed", "error": "x" * (ERROR_MAX + 10), "traceback": "tb", "rank": 1})
    assert type(long) is Stopped and long.short() == "x" * ERROR_MAX + "..." and len(long.error) == ERROR_MAX + 10
    assert isinstance(read(PointRun, {"status": "skipped", "error": 3}), Malformed), "an error is text"


def test_the_reference_and_the_paired_timing_and_the_scenario_are_declared_too():
    answer = read(Answer, {"status": "ok", "expected": {"7": {"tuple": False, "outputs": [torch.zeros(2)]}},
                           "traffic": {"bytes": 8.0, "flops": 2.0, "terms": [{"name": "read x", "bytes": 8.0,
                                                                               "flops": 2.0}]}})
    assert answer.expected["7"].outputs[0].shape == (2,) and answer.traffic.terms[0].name == "read x"
    assert isinstance(read(Answer, {"status": "ok", "expected": {"7": {"tuple": False, "outputs": [1.0]}}}),
                      Malformed)
    pair = read(PairRun, {"status": "ran", "rounds_times_us": [[[1.0], [2.0]]],
                          "calls": {"variant": [call("after", 4)], "over": [call("after", 4)]}})
    assert isinstance(pair, PairRun) and pair.calls.over[0].role == "after"
    fingerprint = {"type": "Tensor", "tensor": torch.ones(4, dtype=torch.float64)}
    scenario = read(ScenarioRun, {"status": "ran", "variant": "v", "fingerprints": [fingerprint] * 2,
                                  "timed_fingerprints": [[0, fingerprint], [1, fingerprint]],
                                  "after_fingerprint": fingerprint, "kernel_fingerprints": [fingerprint],
                                  "scenario_times_us": [5.0], "kernel_times_us": [1.0]})
    assert isinstance(scenario, ScenarioRun) and scenario.timed_fingerprints[1][0] == 1


def test_a_malformed_answer_replaces_the_child_that_sent_it():
    """A child that forged one answer may still send the true one: it must not answer the next task."""
    closed = []

    class Child:
        def close(self):
            closed.append(True)

    assert isinstance(orchestrate._read(PointRun, point(), Child()), PointRun) and closed == []
    assert type(orchestrate._read(PointRun, {"status": "crashed", "error": "died"}, Child())) is Stopped
    assert closed == [], "a crash the harness saw ends its child already; a child's own word is believed"
    assert isinstance(orchestrate._read(PointRun, point(times_us="fast"), Child()), Malformed) and closed == [True]
