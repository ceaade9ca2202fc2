"""casebook.run.inputs: a blended input set is made alike in the variant's child (in place) and in the reference's
(from its name), moves about 1% of each floating tensor, and only where a timing observes each repetition."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from casebook.result import Protocol
from casebook.run import inputs
from casebook.run.child import Task


def make(shape: dict, dtype: torch.dtype, device: str, generator: torch.Generator) -> dict:
    x = torch.randn(shape["rows"], shape["cols"], generator=generator).to(dtype)
    return {"x": x, "w": torch.randn(shape["cols"], generator=generator).to(dtype).t(),
            "index": torch.arange(shape["rows"]), "scale": 2.0, "xt": x.t()}


SHAPE = {"rows": 64, "cols": 300}


def test_the_child_blends_in_place_what_the_reference_makes_from_the_name():
    here = make(SHAPE, torch.float32, "cpu", torch.Generator().manual_seed(7))
    before = {k: v.clone() for k, v in here.items() if torch.is_tensor(v)}
    memory = here["x"].data_ptr()
    inputs.blend(here, 12345)
    there = inputs.make(make, SHAPE, torch.float32, "cpu", inputs.blended_name(7, 12345))
    assert here["x"].data_ptr() == memory, "the same memory, new contents"
    for k in ("x", "w", "index"):
        assert torch.equal(here[k], there[k]), k
    moved = (here["x"] != before["x"]).sum().item()
    assert 0 < moved <= 0.02 * here["x"].numel() + 2, moved  # x and its transpose are one memory: blended twice
    assert torch.equal(here["xt"], here["x"].t()), "a view stays a view of what was blended"
    assert torch.equal(here["index"], before["index"]), "integers (indices, lengths) are left as the case made them"
    assert set(here["x"].flatten().tolist()) <= set(before["x"].flatten().tolist()), "its own values, moved"


def test_another_blend_seed_moves_other_places():
    a = inputs.make(make, SHAPE, torch.float32, "cpu", inputs.blended_name(7, 1))
    b = inputs.make(make, SHAPE, torch.float32, "cpu", inputs.blended_name(7, 2))
    assert not torch.equal(a["x"], b["x"])


@pytest.mark.parametrize("seed, blend_seed", [(0, 0), (20261133, 2**32 - 1), (5, 123)])
def test_a_name_gives_back_its_seed_and_blend(seed, blend_seed):
    name = inputs.blended_name(seed, blend_seed)
    assert name < 0 and inputs.unblended(name) == (seed, blend_seed)
    assert inputs.unblended(seed) == (seed, None)


def test_only_a_timing_that_sees_each_repetition_blends():
    task = Task(module="m", variant="v", fn="v", shape=SHAPE, dtype="fp32", level="kernel",
                device="cuda", timed=True, seed=1, protocol=Protocol(min_reps=10, graph=False))
    assert inputs.blends(task)
    assert not inputs.blends(replace(task, timed=False))
    assert not inputs.blends(replace(task, protocol=Protocol(min_reps=10, graph=True))), "graph replay"
    assert inputs.blends(replace(task, device="cpu", protocol=Protocol(min_reps=10, graph=True))), "no graph on a CPU"
    assert not inputs.blends(replace(task, devices=2)) and not inputs.blends(
        replace(task, protocol=Protocol(min_reps=10, rank_barrier=True))), "ranks in lockstep"
    assert not inputs.blends(replace(task, protocol=Protocol(min_reps=1))), "one repetition has no second to blend for"


def test_a_blend_recomputes_the_inputs_the_case_derives_from_the_others():
    """A backward's saved statistic moved to another row is a set the kernel is never given: the inputs function's
    `derived` recomputes it from the blended inputs, in its own memory, alike wherever the set is made."""
    from casebook.kernels import rmsnorm

    make = rmsnorm.make_backward_inputs
    assert inputs.derived_of(make) is not None and inputs.derived_of(rmsnorm.make_inputs) is None
    shape = {"rows": 64, "cols": 512}
    clean = make(shape, torch.bfloat16, "cpu", torch.Generator().manual_seed(3))
    blended = make(shape, torch.bfloat16, "cpu", torch.Generator().manual_seed(3))
    memory = blended["rstd"].data_ptr()
    inputs.blend(blended, 11, inputs.derived_of(make))
    assert blended["rstd"].data_ptr() == memory and not torch.equal(blended["x"], clean["x"])
    assert torch.equal(blended["rstd"], rmsnorm._saved_rstd(blended)["rstd"])  # consistent with the blended x
    named = inputs.make(make, shape, torch.bfloat16, "cpu", inputs.blended_name(3, 11))  # the reference's side
    assert all(torch.equal(named[k], blended[k]) for k in blended)
