"""judge: a point judged in two goes (`judge_calls` over the calls whose answers are here, then `point` with the
rest's) reads exactly as the point judged at once, its first failing call included; and a run lets go of the first
go's outputs and answers before it asks the reference's child for the rest."""

from __future__ import annotations

import gc
import weakref

import pytest
import torch

from casebook.result import Protocol
from casebook.run import judge
from casebook.run.check import CheckFailed
from casebook.run.child import Task, record
from casebook.run.messages import Answer, Call, Expected, PointRun

TASK = Task(module="m", variant="v", fn="v", shape={"rows": 4, "cols": 64}, dtype="fp32", level="kernel",
            device="cpu", timed=False, seed=1, protocol=Protocol())


def _call(seed: int, out: torch.Tensor) -> Call:
    return Call.model_validate(record("check", seed, out, {}, None), strict=True)


def _answer(x: torch.Tensor) -> Expected:
    return Expected(tuple=False, outputs=[x.double()])


def _point_at_once_and_in_two_goes(outs: dict[int, torch.Tensor], answers: dict[int, torch.Tensor], first: set):
    run = PointRun(status="ran", calls=[_call(s, o) for s, o in outs.items()])
    every = Answer(status="ok", expected={str(s): _answer(a) for s, a in answers.items()})
    at_once = judge.point(TASK, run, every)
    here = {str(s): _answer(answers[s]) for s in first}
    judged = judge.judge_calls(TASK, run.calls, here)
    rest = Answer(status="ok", expected={k: v for k, v in every.expected.items() if k not in here})
    stripped = run.model_copy(update={"calls": [c.model_copy(update={"outputs": []}) if i in judged else c
                                                for i, c in enumerate(run.calls)]})
    return at_once, judge.point(TASK, stripped, rest, judged), judged


@pytest.mark.parametrize("first", [{1}, {2}, {1, 2}])
def test_two_goes_judge_as_one(first):
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(4, 64, generator=g), torch.randn(4, 64, generator=g)
    at_once, in_two, judged = _point_at_once_and_in_two_goes({1: a.clone(), 2: b * (1 + 1e-7)}, {1: a, 2: b}, first)
    assert sorted(judged) == sorted(i for i, s in enumerate((1, 2)) if s in first)
    assert at_once.status == in_two.status == "checked"
    assert (at_once.max_rel_err, at_once.max_row_err) == (in_two.max_rel_err, in_two.max_row_err) > (0.0, 0.0)


@pytest.mark.parametrize("first", [{1}, {2}])
def test_the_first_failing_call_is_still_the_one_reported(first):
    """Both calls wrong: whichever go judged it, the first call's failure is the point's error."""
    g = torch.Generator().manual_seed(1)
    a, b = torch.randn(4, 64, generator=g), torch.randn(4, 64, generator=g)
    at_once, in_two, judged = _point_at_once_and_in_two_goes({1: -a, 2: b * 2}, {1: a, 2: b}, first)
    assert any(isinstance(v, CheckFailed) for v in judged.values())
    assert at_once.status == in_two.status == "failed"
    assert at_once.error == in_two.error and at_once.error.startswith("seed 1:")


def test_a_run_lets_go_of_the_first_go_before_asking_for_the_rest(monkeypatch):
    """`orchestrate._point`: the outputs of the calls whose answers were asked for before the call, and those
    answers, are gone (judged, and freed with their last reference, no collection needed) and handed back to the
    device (the allocator's cache emptied) when the reference's child is asked for a kept call's further set (a
    blended one): on a GPU, the largest points' parent memory."""
    from casebook.run import orchestrate

    a = torch.randn(4, 64, generator=torch.Generator().manual_seed(2))
    held, seen, events = [], {}, []
    monkeypatch.setattr(orchestrate.transport, "give_back_device_memory",
                        lambda keeping=0, collect=True: events.append(("give back", collect,
                                                                       [r() is not None for r in held])))

    def kept(x: torch.Tensor) -> torch.Tensor:
        held.append(weakref.ref(x))
        return x

    class Answers:
        held, last_s, asked = 0, 0.0, 0

        def get(self, task, seeds):
            self.asked += 1
            if self.asked == 1:  # the seeds asked for before the call
                return Answer(status="ok", expected={str(s): Expected(tuple=False, outputs=[kept(a.double())])
                                                     for s in seeds})
            seen["alive"] = [r() is not None for r in held]
            events.append(("ask",))
            return Answer(status="ok", expected={str(s): _answer(a) for s in seeds})

    class Variant:
        arena, receive_s, start_wait_s, crossing_error = None, 0.0, 0.0, None

        def request(self, task, timeout_s, room=0):
            calls = [_call(1, a.clone()), _call(2, a.clone()), _call(-5, a.clone())]
            for c in calls[:2]:
                kept(c.outputs[0].tensor)
            return PointRun(status="ran", calls=calls)

    monkeypatch.setattr(orchestrate, "names_reference", lambda task, name: True)
    monkeypatch.setattr(orchestrate, "_read", lambda model, answer, variant: answer)
    gc.disable()  # what dies must die with its last reference, not wait for a collection
    try:
        orchestrate._point(TASK, Variant(), Answers(), 60.0, None, 0.0)
    finally:
        gc.enable()
    assert seen["alive"] == [False] * 4
    assert events[:2] == [("give back", False, [False] * 4), ("ask",)]  # the cache too, before the second ask
