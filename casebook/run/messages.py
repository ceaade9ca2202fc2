"""What the children send the parent, declared: the run's trust boundary.

A child's answer arrives as data (`transport`: a JSON header, its tensors apart) from a process that ran
contributed code, so it may say anything. `read` validates it once, strictly, against the model its task
expects: a variant's point (`PointRun`), a paired timing (`PairRun`), a scenario (`ScenarioRun`), the
reference's answers (`Answer`), the devices' link (`TopologyRun`); or a task that did not run to the end
(`Stopped`, which the harness itself also makes: a timeout, a death). An answer out of the format becomes a
`Stopped` that says where it is wrong; the judge (`casebook.run.judge`) then reads attributes of declared
types, never a key a child may have left out.

What the format cannot say stays the judge's: whether the times are a measurement, whether the calls kept are
the ones the harness keeps, whether the outputs are right.
"""

from __future__ import annotations

from typing import Annotated, Literal, TypeVar

import torch
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, InstanceOf, ValidationError

from casebook.result import Interference, Launches, MeasuredLink, TrafficTerm, first_error
from casebook.run.transport import Unsent

ERROR_MAX = 2000
"""The most of a child's own error message a record keeps (an exception's text can hold a tensor's repr)."""


class Message(BaseModel):
    """Base of the children's answers: every field declared, none other allowed, read strictly (`read`)."""

    model_config = ConfigDict(extra="forbid", arbitrary_types_allowed=True, frozen=True)


def _listed(v):
    return tuple(v) if isinstance(v, list) else v


IntStr = Annotated[tuple[int, str], BeforeValidator(_listed)]
IntInt = Annotated[tuple[int, int], BeforeValidator(_listed)]
"""Pairs, sent as JSON lists of two."""

Tensor = InstanceOf[torch.Tensor] | InstanceOf[Unsent]
"""A tensor as it crossed (`transport`): its bytes, or why they were not sent."""


class Stopped(Message):
    """A task that did not run to the end: skipped (the variant's own word, or no backend), failed before it was
    timed (a scenario that never called the kernel), crashed or timed out (said by the child or by the harness
    that watched it)."""

    status: Literal["skipped", "crashed", "timeout", "failed"]
    error: str = "no answer"
    traceback: str | None = None
    rank: int | None = None
    loaded: list[str] = []
    rebound: list[str] = []
    crossing_error: str | None = None

    def short(self) -> str:
        """The error, cut to `ERROR_MAX` characters."""
        return self.error if len(self.error) <= ERROR_MAX else self.error[:ERROR_MAX] + "..."


class Output(Message):
    """One value a call returned, as the child copied it when the call returned (`child._snapshot`)."""

    type: str = Field(description="The value's type name: `Tensor` for a plain torch.Tensor.")
    device: str | None = None
    tensor: Tensor | None = None
    digest: list[int] | None = Field(default=None, description="The copy's checksum (`transport.digest`).")


class Call(Message):
    """One call whose outputs the child kept (`child.record`): which, on what, and facts about memory."""

    role: Literal["check", "timed", "after"]
    seed: int
    call: int | None = Field(default=None, description="Timed calls: which repetition it was.")
    tuple: bool
    outputs: list[Output]
    aliases_input: list[IntStr] = []
    aliases_output: list[IntInt] = []
    modified: list[str] = []


class Ran(Message):
    """What every task that ran to the end sends beside its own data."""

    status: Literal["ran"]
    loaded: list[str] = Field(default=[], description="Kernel modules the child had imported.")
    rebound: list[str] = Field(default=[], description="What the harness relies on that the child's code "
                                                       "rebound (`child.rebound`).")
    crossing_error: str | None = Field(default=None, description="Why the lent memory could not be mapped.")
    rank: int | None = Field(default=None, description="On several devices: the rank whose answer this is "
                                                       "(`distributed.merge`: the slowest's).")
    ranks: int | None = None
    slowest_rank: int | None = None


class PointRun(Ran):
    """A point (`child._point`): its kept calls, raw repetition times and facts; on several devices, every
    rank's (`distributed.merge`)."""

    first_call_s: float | None = None
    peak_memory_bytes: int | None = Field(default=None, ge=0)
    input_bytes: int | None = Field(default=None, ge=0)
    calls: list[Call] = []
    times_us: list[float] | None = None
    timer: str | None = None
    host_us: float | None = None
    interference: Interference | None = None
    autotuned: dict[str, str] | None = None
    launches: Launches | None = None
    threads: int | None = None
    input_sets: int | None = None
    rank_calls: list[list[Call]] | None = None
    rank_median_us: list[float] | None = None
    rank_times_us: list[list[float]] | None = None
    rank_interference: list[Interference] | None = None


class PairCalls(Message):
    """A paired timing's kept calls, each variant's."""

    variant: list[Call]
    over: list[Call]


class PairRun(Ran):
    """A paired timing (`child._pair`): each round's two lists of repetition times, and the kept calls."""

    rounds_times_us: list[list[list[float]]]
    calls: PairCalls


class Fingerprint(Message):
    """A sample of a scenario's output (`child._fingerprint`)."""

    type: str
    tensor: InstanceOf[torch.Tensor] | None = None


class ScenarioRun(Ran):
    """The scenario with one variant (`child._end_to_end`): fingerprints of its outputs and raw times."""

    variant: str
    fingerprints: list[Fingerprint]
    timed_fingerprints: list[Annotated[tuple[int, Fingerprint], BeforeValidator(_listed)]]
    after_fingerprint: Fingerprint
    kernel_fingerprints: list[Fingerprint]
    scenario_times_us: list[float]
    kernel_times_us: list[float]
    rank_median_us: list[float] | None = None


class TopologyRun(Ran):
    """The devices and their link, measured on ranks started for it (`rank.topology`)."""

    topology: MeasuredLink


class Expected(Message):
    """The reference's outputs at one seed."""

    tuple: bool
    outputs: list[InstanceOf[torch.Tensor]]


class TrafficModel(Message):
    """The traffic model at a shape and dtype, as it crossed (`traffic.Traffic.as_dict`)."""

    bytes: float
    flops: float
    terms: list[TrafficTerm]
    link_bytes: float | None = None


class Answer(Message):
    """The reference's child's answer (`oracle.work`): its outputs by seed, and the traffic model where asked."""

    status: Literal["ok"]
    expected: dict[str, Expected] = {}
    traffic: TrafficModel | None = None


class Malformed(Stopped):
    """An answer out of the format (`read` makes these, never a child): the child that sent it is replaced, since
    a child that forged one answer may still send the true one, which must not answer the next task."""


M = TypeVar("M", bound=Message)


def read(model: type[M], answer) -> M | Stopped:
    """`answer` as `model`, or as the `Stopped` it is (a task that did not run); a `Malformed` crash saying where
    it is out of the format otherwise."""
    status = answer.get("status") if isinstance(answer, dict) else None
    try:
        if status in ("skipped", "crashed", "timeout", "failed"):
            return Stopped.model_validate(answer, strict=True)
        return model.model_validate(answer, strict=True)
    except ValidationError as e:
        return Malformed(status="crashed", error=f"the child's answer is not in the format ({e.error_count()} "
                                                 f"error(s); first, {first_error(e, 'the answer')})")
