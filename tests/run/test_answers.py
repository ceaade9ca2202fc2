"""casebook.run.answers: the reference's answers asked for once a run and shared by every variant of the ladder.

No child processes: the reference's child is stood for by an object answering in this process
(`casebook.run.oracle.work`), which counts what it is asked. The kernel module is the tests' cheats.py
(tests/fixtures/kernels), importable here as `casebook.kernels.cheats` through the package's path.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
import torch

import casebook.kernels
from casebook.run import orchestrate, transport
from casebook.run.answers import Answers, fixed_seeds
from casebook.run.bench import QUICK
from casebook.run.child import Task
from casebook.run.messages import Answer, Expected, Stopped
from casebook.run.oracle import OracleTask, work

KERNELS_DIR = Path(__file__).parents[1] / "fixtures" / "kernels"
SHAPE = {"rows": 4, "cols": 8}
SEED = 7
ANSWER_BYTES = SHAPE["rows"] * SHAPE["cols"] * 8
"""One answer at SHAPE: the float64 reference of a CPU point (`oracle.shipped` keeps float64 off a GPU)."""


@pytest.fixture(autouse=True)
def cheats_importable(monkeypatch):
    monkeypatch.setattr(casebook.kernels, "__path__", [*casebook.kernels.__path__, str(KERNELS_DIR)])


class CountingOracle:
    """Stands for the reference's child: answers in this process, and keeps every task it was asked."""

    def __init__(self, answer: dict | None = None):
        self.asked: list[OracleTask] = []
        self.answer = answer

    def request(self, task, timeout_s, room=0, grow=False):
        self.asked.append(task)
        return self.answer if self.answer is not None else work(task)

    @property
    def calls(self) -> int:
        return len(self.asked)


def task(variant: str = "honest", **kw) -> Task:
    fields = dict(module="cheats", variant=variant, fn=variant, shape=SHAPE, dtype="fp32",
                  level="kernel", device="cpu", timed=True, seed=SEED, protocol=QUICK,
                  reference="reference", inputs="make_inputs", traffic="traffic")
    return Task(**{**fields, **kw})


def answers(oracle: CountingOracle, budget: int = 2**30) -> Answers:
    return Answers(oracle, timeout_s=10.0, budget_bytes=budget)


def outputs(answer: Answer, seed: int) -> list[torch.Tensor]:
    return answer.expected[str(seed)].outputs


def direct(t: Task, seed: int) -> torch.Tensor:
    """The reference at `seed`, computed here without `Answers`."""
    [out] = work(OracleTask(module=t.module, shape=t.shape, dtype=t.dtype, device=t.device, seeds=(seed,),
                            reference=t.reference, inputs=t.inputs))["expected"][str(seed)]["outputs"]
    return out


# --- one computation a point, whatever the variant -------------------------------------------------------


def test_two_variants_share_one_computation():
    oracle = CountingOracle()
    a = answers(oracle)
    first, second = task("honest"), task("slower")
    seeds = fixed_seeds(first)
    one = a.get(first, seeds)
    assert oracle.calls == 1 and oracle.asked[0].seeds == seeds
    assert (a.computed, a.reused) == (3, 0)
    two = a.get(second, fixed_seeds(second))
    assert oracle.calls == 1, "the second variant's answers were kept: the reference was not asked again"
    assert (a.computed, a.reused) == (3, 3) and a.last_s == 0.0
    assert one.status == two.status == "ok" and one.traffic == two.traffic is not None
    for seed in seeds:
        [x], [y] = outputs(one, seed), outputs(two, seed)
        assert torch.equal(x, y) and torch.equal(x, direct(first, seed))
        assert one.expected[str(seed)].tuple is False
    assert not torch.equal(outputs(one, SEED)[0], outputs(one, SEED + 1)[0]), "each seed its own inputs"


def test_a_seed_asked_twice_in_one_get_is_computed_once():
    oracle = CountingOracle()
    a = answers(oracle)
    got = a.get(task(), [SEED, SEED, SEED + 1])
    assert oracle.asked[0].seeds == (SEED, SEED + 1) and list(got.expected) == [str(SEED), str(SEED + 1)]
    assert a.computed == 2


def test_only_the_missing_seeds_are_asked_for():
    oracle = CountingOracle()
    a = answers(oracle)
    a.get(task(), [SEED, SEED + 1])
    got = a.get(task("slower"), [SEED + 1, SEED + 12])  # a sampled call naming a cold graph's input set
    assert [t.seeds for t in oracle.asked] == [(SEED, SEED + 1), (SEED + 12,)]
    assert (a.computed, a.reused) == (3, 1)
    assert torch.equal(outputs(got, SEED + 12)[0], direct(task(), SEED + 12))


@pytest.mark.parametrize("other", [
    dict(shape={"rows": 4, "cols": 16}),
    dict(dtype="bf16"),
    dict(inputs="scenario_inputs"),  # the same inputs here, but another function: another key
    dict(seed=SEED + 100),
])
def test_another_point_is_computed_again(other):
    oracle = CountingOracle()
    a = answers(oracle)
    a.get(task(), fixed_seeds(task()))
    t = task("slower", **other)
    a.get(t, fixed_seeds(t))
    assert oracle.calls == 2 and a.computed == 6 and a.reused == 0


# --- the traffic model ---------------------------------------------------------------------------------


def test_traffic_is_asked_for_once_per_shape_and_dtype_when_timed():
    oracle = CountingOracle()
    a = answers(oracle)
    got = [a.get(t, fixed_seeds(t)) for t in (task(), task(seed=SEED + 1000), task("slower", seed=SEED + 2000),
                                               task(dtype="bf16"), task(shape={"rows": 2, "cols": 8}))]
    assert [bool(t.traffic) for t in oracle.asked] == [True, False, False, True, True]
    assert [t.traffic for t in oracle.asked if t.traffic] == ["traffic"] * 3
    assert all(g.status == "ok" for g in got)
    fp32 = got[0].traffic
    assert fp32.bytes == 2 * SHAPE["rows"] * SHAPE["cols"] * 4 and got[1].traffic == got[2].traffic == fp32
    assert got[3].traffic.bytes == fp32.bytes / 2, "bf16: half the bytes of fp32"
    assert len(a.traffic) == 3


def test_traffic_is_never_asked_for_untimed_points():
    oracle = CountingOracle()
    a = answers(oracle)
    t = task(timed=False)
    got = a.get(t, fixed_seeds(t))
    assert oracle.calls == 1 and oracle.asked[0].traffic == "" and got.traffic is None
    assert a.traffic == {}
    a.get(task(timed=False, dtype="bf16"), [SEED])
    assert [x.traffic for x in oracle.asked] == ["", ""]


def test_a_timed_point_after_an_untimed_one_asks_for_the_traffic_alone():
    """The interpreter's rung (untimed) computed the answers; a timed rung at the point still needs the model."""
    oracle = CountingOracle()
    a = answers(oracle)
    a.get(task(timed=False), [SEED, SEED + 1])
    got = a.get(task(), [SEED, SEED + 1])
    assert len(oracle.asked) == 2 and oracle.asked[1].seeds == () and oracle.asked[1].traffic == "traffic"
    assert got.traffic.bytes > 0 and a.computed == 2 and a.reused == 2
    a.get(task("slower"), [SEED])
    assert len(oracle.asked) == 2


def test_a_case_without_a_traffic_model_is_not_asked_for_one():
    oracle = CountingOracle()
    a = answers(oracle)
    assert a.get(task(traffic=""), [SEED]).traffic is None
    a.get(task(traffic=""), [SEED])
    assert oracle.calls == 1 and oracle.asked[0].traffic == ""


# --- the budget ----------------------------------------------------------------------------------------


def test_nothing_is_kept_under_a_budget_smaller_than_one_answer():
    oracle = CountingOracle()
    a = answers(oracle, budget=ANSWER_BYTES - 1)
    t = task()
    first = a.get(t, [SEED])
    second = a.get(task("slower"), [SEED])
    assert oracle.calls == 2 and a.kept == {} and a.held == 0
    assert (a.computed, a.reused) == (2, 0)
    for got in (first, second):
        assert got.status == "ok" and torch.equal(outputs(got, SEED)[0], direct(t, SEED))
    assert oracle.asked[1].traffic == "", "the traffic model is kept whatever the budget"


def test_the_first_answers_that_fit_are_kept_and_none_is_evicted():
    oracle = CountingOracle()
    a = answers(oracle, budget=2 * ANSWER_BYTES)  # room for exactly two answers
    t = task()
    seeds = fixed_seeds(t)
    assert seeds == (SEED, SEED + 1, SEED + 3)
    got = a.get(t, seeds)
    assert a.held == 2 * ANSWER_BYTES and len(a.kept) == 2
    for seed in seeds:
        assert torch.equal(outputs(got, seed)[0], direct(t, seed)), "returned, kept or not"
    again = a.get(task("slower"), [SEED, SEED + 1])
    assert oracle.calls == 1, "the first two seeds were kept"
    assert torch.equal(outputs(again, SEED + 1)[0], direct(t, SEED + 1))
    a.get(task("slower"), [SEED + 3])
    assert [x.seeds for x in oracle.asked] == [seeds, (SEED + 3,)], "the third did not fit: asked for again"
    a.get(task("slower"), [SEED + 3])
    assert oracle.calls == 3, "still not kept: admit until full"
    a.get(task("third"), [SEED, SEED + 1])
    assert oracle.calls == 3, "and the earlier ones were not evicted"
    assert a.held == 2 * ANSWER_BYTES


# --- the reference's failures ----------------------------------------------------------------------------


@pytest.mark.parametrize("failure, said", [
    ({"status": "crashed", "error": "child process died (exit code -6)"}, "child process died (exit code -6)"),
    ({"status": "timeout", "error": "no answer within 10 s: killed"}, "no answer within 10 s: killed"),
    ({"status": "ok", "expected": None}, "not in the format (1 error(s); first, expected: Input should be a valid "
                                         "dictionary)"),
    ({"status": "ok", "expected": {"5": {"tuple": False, "outputs": ["not a tensor"]}}},
     "first, expected.5.outputs.0: Input should be an instance of Tensor"),
])
def test_a_failure_of_the_reference_is_returned_as_it_is(failure, said):
    oracle = CountingOracle(answer=failure)
    a = answers(oracle)
    got = a.get(task(), fixed_seeds(task()))
    assert isinstance(got, Stopped) and said in got.error
    assert got.status == (failure["status"] if failure["status"] != "ok" else "crashed")
    assert a.kept == {} and a.traffic == {} and a.computed == 0
    assert a.get(task(), [SEED]) == got and oracle.calls == 2, "nothing kept: asked again"


def test_a_failure_leaves_what_was_kept_before_it():
    oracle = CountingOracle()
    a = answers(oracle)
    kept = a.get(task(), [SEED])
    oracle.answer = {"status": "crashed", "error": "child process died"}
    assert a.get(task(), [SEED, SEED + 1]) == Stopped(**oracle.answer)
    assert torch.equal(outputs(a.get(task("slower"), [SEED]), SEED)[0], outputs(kept, SEED)[0])
    assert oracle.calls == 2


# --- the seeds a point always names --------------------------------------------------------------------------


def test_fixed_seeds():
    assert fixed_seeds(task(seed=100)) == (100, 101, 103)
    assert fixed_seeds(task(seed=100, timed=False)) == (100, 101)
    assert set(fixed_seeds(task(seed=100))) <= orchestrate.reference_seeds(task(seed=100))


# --- the room a variant's child is lent -------------------------------------------------------------------


def expected(*outputs, is_tuple: bool | None = None) -> Answer:
    return Answer(status="ok", expected={"5": Expected(tuple=len(outputs) > 1 if is_tuple is None else is_tuple,
                                                       outputs=list(outputs))})


def test_call_bytes_counts_float_outputs_at_the_points_dtype():
    f64 = torch.zeros(300, dtype=torch.float64)  # the reference's float64: the variant returns the point's dtype
    assert orchestrate.call_bytes(expected(f64), "bf16") == transport.aligned(600) == 1024
    assert orchestrate.call_bytes(expected(f64), "fp32") == transport.aligned(1200) == 1536
    assert orchestrate.call_bytes(expected(f64), "fp64") == transport.aligned(2400) == 2560
    one = expected(torch.zeros(256, dtype=torch.float64))
    assert orchestrate.call_bytes(one, "bf16") == transport.ALIGN, "exactly one"
    assert orchestrate.call_bytes(expected(torch.zeros(1, dtype=torch.float64)), "bf16") == transport.ALIGN


def test_call_bytes_sums_a_tuples_outputs_each_aligned():
    f64, small = torch.zeros(3, 5, dtype=torch.float64), torch.zeros(7, dtype=torch.float64)
    assert orchestrate.call_bytes(expected(f64, small), "bf16") == 2 * transport.ALIGN
    wide = expected(torch.zeros(1000, dtype=torch.float64), small)
    assert orchestrate.call_bytes(wide, "fp32") == 4096 + transport.ALIGN


def test_call_bytes_keeps_integer_outputs_own_itemsize():
    idx = torch.zeros(300, dtype=torch.int64)
    i32 = torch.zeros(300, dtype=torch.int32)
    assert orchestrate.call_bytes(expected(idx), "bf16") == transport.aligned(2400)
    assert orchestrate.call_bytes(expected(i32), "bf16") == transport.aligned(1200)
    assert orchestrate.call_bytes(expected(torch.zeros(300, dtype=torch.float64), idx), "bf16") == 1024 + 2560


@pytest.mark.parametrize("payload", [
    Stopped(status="crashed", error="died"), Answer(status="ok"), expected(is_tuple=False),
])
def test_call_bytes_of_nothing_is_zero(payload):
    assert orchestrate.call_bytes(payload, "bf16") == 0


def test_call_bytes_of_a_real_answer():
    a = answers(CountingOracle())
    for dtype, size in (("fp32", 4), ("bf16", 2)):
        t = replace(task(), dtype=dtype, shape={"rows": 16, "cols": 100})
        assert orchestrate.call_bytes(a.get(t, fixed_seeds(t)), dtype) == transport.aligned(1600 * size)
