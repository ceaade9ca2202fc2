"""The reference's answers, each computed once a run and kept where the parent judges.

The reference's child (`casebook.run.oracle`) lives for the whole run. The parent asks it for the answer at a
(module, reference, inputs, shape, dtype, device, seed) once and keeps the answer, on the device it arrived
on (a GPU's through the device crossing, `casebook.run.transport`), for every variant of the ladder: every rung
is judged against the same tensors, so a ladder of six rungs costs one reference computation a point, not
six. The traffic model at a (shape, dtype) is asked for once too.

Answers are kept while they fit in a budget (`BUDGET_FRACTION` of the device's memory); past it a new answer
is used and let go, and asked for again by the next variant. The ladder sweeps its shapes in the same order
for every variant, and for such a cycle keeping the first answers that fit serves more of them than evicting
the oldest (which would evict each just before it is needed again).
"""

from __future__ import annotations

import json
import time

from casebook.run.child import Task
from casebook.run.hardware import device_memory_bytes
from casebook.run.isolate import Worker
from casebook.run.messages import Answer, Expected, Stopped, TrafficModel, read
from casebook.run.oracle import OracleTask

BUDGET_FRACTION = 0.05
"""Of the judging device's memory (a GPU's, else the host's), what kept answers may hold: the variant's child,
the reference's child, the memory lent to them and the judge's own copies need the rest (at 4096 x 262144 a
point's six bf16 outputs are 12 GiB, lent and then copied, and its four float32 answers 16 GiB)."""


def default_budget(device: str) -> int:
    """`BUDGET_FRACTION` of the device's memory (`hardware.device_memory_bytes`), in bytes."""
    return int(BUDGET_FRACTION * device_memory_bytes(device))


def fixed_seeds(task: Task) -> tuple[int, ...]:
    """The seeds a point's kept calls always name (`child._point`): the two checks, and when timed the contents
    after timing; a cold graph's further input sets are asked for when a sampled call names one."""
    return (task.seed, task.seed + 1, task.seed + 3) if task.timed else (task.seed, task.seed + 1)


def _nbytes(answer: Expected) -> int:
    return sum(t.numel() * t.element_size() for t in answer.outputs)


class Answers:
    """The reference's answers for a run, asked of `oracle` (a `Worker` running `oracle.work`) once each."""

    def __init__(self, oracle: Worker, timeout_s: float, budget_bytes: int):
        self.oracle, self.timeout_s, self.budget = oracle, timeout_s, budget_bytes
        self.kept: dict[tuple, Expected] = {}
        self.traffic: dict[tuple, TrafficModel] = {}
        self.held = 0
        self.computed = self.reused = 0
        self.last_s = 0.0
        """Seconds the last `get` waited for the reference's child (0 where every answer was kept)."""

    @staticmethod
    def _key(task: Task, seed: int) -> tuple:
        return (task.module, task.reference, task.inputs, json.dumps(task.shape), task.dtype, task.device, seed)

    @staticmethod
    def _traffic_key(task: Task) -> tuple:
        return (task.module, task.traffic, json.dumps(task.shape), task.dtype)

    def get(self, task: Task, seeds) -> Answer | Stopped:
        """The reference's answer at `seeds` for `task`'s point, as `judge.point` takes it: its outputs by seed
        (where the child computed them) and the traffic model; the child's own failure where it failed."""
        self.last_s = 0.0
        seeds = list(dict.fromkeys(seeds))
        missing = [s for s in seeds if self._key(task, s) not in self.kept]
        want_traffic = bool(task.timed and task.traffic) and self._traffic_key(task) not in self.traffic
        self.reused += len(seeds) - len(missing)
        fresh: dict[str, Expected] = {}
        if missing or want_traffic:
            t0 = time.perf_counter()
            answer = read(Answer, self.oracle.request(
                OracleTask(module=task.module, shape=task.shape, dtype=task.dtype, device=task.device,
                           seeds=tuple(missing), reference=task.reference, inputs=task.inputs,
                           traffic=task.traffic if want_traffic else ""),
                self.timeout_s, room=1, grow=True))
            self.last_s = time.perf_counter() - t0
            if isinstance(answer, Stopped):
                return answer
            fresh = answer.expected
            self.computed += len(missing)
            for seed in missing:
                self._keep(self._key(task, seed), fresh.get(str(seed)))
            if want_traffic and answer.traffic is not None:
                self.traffic[self._traffic_key(task)] = answer.traffic
        expected = {str(s): e for s in seeds if (e := self.kept.get(self._key(task, s)) or fresh.get(str(s)))}
        return Answer(status="ok", expected=expected, traffic=self.traffic.get(self._traffic_key(task)))

    def _keep(self, key: tuple, answer: Expected | None) -> None:
        if answer is None:
            return
        size = _nbytes(answer)
        if self.held + size <= self.budget:
            self.kept[key] = answer
            self.held += size
