"""casebook.run.child: the work one child does (check, time, re-check, place), run the real way, in a child.

All the wrong-answer cheats of tests/fixtures/kernels/cheats.py share one child process (each child imports
torch: seconds); crashes and hangs are in test_isolate.py (bare) and test_run.py (through `casebook run`).
"""

from __future__ import annotations

from dataclasses import fields as dataclass_fields
from dataclasses import replace
from pathlib import Path

import pytest

from casebook.result import Launches
from casebook.roofline import Roofs
from casebook.run.bench import Protocol
from casebook.run.child import PairTask, ScenarioTask, Task
from casebook.run.orchestrate import execute
from casebook.tolerance import TOLERANCE

CHEATS_DIR = Path(__file__).parents[1] / "fixtures" / "kernels"
SHAPE = {"rows": 64, "cols": 1000}
SEED = 100
FAST = Protocol(warmup_ms=1.0, min_reps=5, max_reps=20, time_cap_s=0.05)
ROOFS = Roofs(compute_tflops=1000.0, bandwidth_gbps=1000.0, launch_us=1e-3, graph_launch_us=1e-3)
"""1 TB/s: the honest kernel (512 KB at this shape, tens of us on a CPU) sits far under the roof."""


def task(fn: str, dtype: str = "fp32", **kw) -> Task:
    fields = dict(module="cheats", variant=fn, fn=fn, shape=SHAPE, dtype=dtype, level="kernel",
                  device="cpu", timed=True, seed=SEED, protocol=FAST, roofs=ROOFS, inputs="make_inputs")
    return Task(**{**fields, **kw})


def pair_of(point: Task, over: str) -> PairTask:
    """The paired timing of `point`'s variant against `over`, at its point."""
    return PairTask(**{f.name: getattr(point, f.name) for f in dataclass_fields(Task)}, over=over, over_fn=over)


# (task, status, words in the error)
EXPECTED = [
    (task("honest"), "ok", None),
    # Unwritten memory on a CPU holds whatever the allocator left there (NaN where the poisoned block came
    # back, zeros or an old answer elsewhere): failed, for one reason or another.
    (task("writes_nothing"), "failed", None),
    # The same for one element left unwritten (no global flag fills new memory in the checks alone): NaN, or
    # a row off by far more than bf16's row bound.
    (task("writes_part", "bf16"), "failed", None),
    (task("mutates_input"), "failed", "input 'x' was modified"),
    (task("returns_nan"), "failed", "1 of 64000 output elements are NaN or Inf"),
    (task("returns_subclass"), "failed", "returned Lazy, not a plain torch.Tensor"),
    (task("wrong_dtype", "bf16"), "failed", "output dtype torch.float32, expected torch.bfloat16"),
    (task("low_precision"), "failed", "relative error"),
    (task("cached"), "failed", f"seed {SEED + 1}: relative error"),
    # Honest in the two calls before timing: a sampled timed call, or the call after timing, sees the cache.
    (task("cached_after_check"), "failed", "relative error"),
    (replace(task("honest"), variant="byte_model_too_large", traffic="traffic_inflated"), "failed",
     "faster than physics"),
    (task("unsupported"), "skipped", "unsupported: no shape is supported"),
    (task("raises"), "crashed", "RuntimeError: CUDA error: an illegal memory access"),
    (replace(task("writes_part"), variant="interpreted", timed=False), "failed", None),  # NaN or a bad row
    (replace(task("honest"), variant="interpreted", timed=False), "checked", None),
    (task("honest", "bf16"), "ok", None),  # after the exception, in the same child
    (task("compiles_first"), "ok", None),
]


@pytest.fixture(scope="module")
def payloads() -> list:
    tasks = [t for t, _, _ in EXPECTED]
    tasks.append(pair_of(task("honest"), "slower"))
    tasks.append(ScenarioTask(module="cheats", variant="honest", fn="honest", shape={"rows": 8, "cols": 50},
                      dtype="fp32", level="end_to_end", device="cpu", timed=True, seed=SEED, protocol=FAST,
                      scenario="scenario", scenario_inputs="scenario_inputs"))
    return execute(tasks, timeout_s=120, env={"CASEBOOK_KERNELS_PATH": str(CHEATS_DIR)})


@pytest.mark.parametrize("i", range(len(EXPECTED)), ids=[f"{t.variant}-{t.dtype}" for t, _, _ in EXPECTED])
def test_outcome(payloads, i):
    t, status, words = EXPECTED[i]
    p = payloads[i]
    assert p.status == status, p
    if words:
        assert words in p.error, p.error
    if t.variant == "cached_after_check":
        assert "timed call" in p.error or p.error.startswith(f"after timing: seed {SEED + 3}: "), p.error
    if status == "failed":
        assert p.correct is False or "faster than physics" in p.error
        assert p.median_us is None or "faster than physics" in p.error


def test_ok_point_is_placed_on_the_roofline(payloads):
    p = payloads[0]
    assert p.correct is True and p.max_rel_err <= TOLERANCE["fp32"]
    assert p.timer == "time.perf_counter_ns" and p.launches == Launches(direct=1, graph=0)
    assert p.p10_us <= p.median_us <= p.p90_us and 5 <= p.repetitions <= 20
    assert p.bytes == 2 * 64 * 1000 * 4 and p.flops == 5 * 64 * 1000
    assert [t.name for t in p.traffic_terms] == ["read x", "write y", "softmax"]
    assert p.gbps == pytest.approx(p.bytes / p.median_us / 1e3)
    assert p.tflops == pytest.approx(p.flops / p.median_us / 1e6)
    assert p.arithmetic_intensity == pytest.approx(5 / 8)
    assert p.regime == "bandwidth" and p.floor_us == pytest.approx(p.bytes / 1e12 * 1e6)
    assert p.roof_fraction == pytest.approx(p.floor_us / p.median_us)
    assert p.bandwidth_roof_gbps == 1000.0 and p.compute_roof_tflops == 1000.0
    assert p.first_call_s > 0


def test_memory_is_not_measured_on_a_cpu_and_the_inputs_are_counted(payloads):
    """No allocator on a CPU counts a call's peak: it is absent, never guessed; the inputs' bytes are kept."""
    p = payloads[0]
    assert p.peak_memory_bytes is None and p.input_bytes == 64 * 1000 * 4


def test_first_call_is_timed_where_it_happens(payloads):
    """The first call (JIT, autotuning) happens inside the first check: its cost is reported from there,
    apart from the timing, whose median never sees it."""
    p = payloads[len(EXPECTED) - 1]
    assert p.first_call_s >= 0.3 and p.median_us < 0.1e6


def test_checked_point_is_not_timed(payloads):
    p = payloads[len(EXPECTED) - 3]  # the interpreted honest point
    assert p.correct is True and p.median_us is None


def test_physics_gate_keeps_the_measurement(payloads):
    """A point refused by the gate still says what was measured, so that the byte model can be fixed."""
    p = payloads[10]
    assert p.median_us > 0 and p.bytes == 2 * 64 * 1000 * 4 * 1e6


def test_pair_times_both_variants_in_alternation(payloads):
    p = payloads[-2]
    assert p.status == "ok", p
    assert len(p.rounds_us) == 6 and all(a > 0 and b > 0 for a, b in p.rounds_us)
    ratios = sorted(b / a for a, b in p.rounds_us)
    assert p.speedup_min == ratios[0] and p.speedup_max == ratios[-1]
    assert p.speedup == pytest.approx((ratios[2] + ratios[3]) / 2)
    # `slower` sleeps 1 ms a call: its column can never read less, however busy the machine (on a quiet one the
    # ratio is ~20x; three busy loops on two cores drowned it in 20 ms scheduler slices)
    assert all(b >= 1000.0 for _, b in p.rounds_us), "the second column is the variant measured against"


def test_a_variant_that_cheats_only_in_the_paired_timing_fails_it():
    """Its ladder point is honest; the paired timing keeps a sample of each variant's timed outputs and one call
    after timing, judged against the ladder's answers, so the claim it would inflate fails."""
    pair = pair_of(task("cheats_in_pair"), "slower")
    point, paired = execute([task("cheats_in_pair"), pair], timeout_s=120,
                            env={"CASEBOOK_KERNELS_PATH": str(CHEATS_DIR)})
    assert point.status == "ok", point
    assert paired.status == "failed", paired
    assert paired.error.startswith("cheats_in_pair in the paired timing, "), paired.error


def test_a_variant_that_does_no_work_when_timed_alone_fails_level_three():
    """Honest in the scenario, a zeros tensor when timed alone on the scenario's arguments (the kernel time that
    sets level 3's kernel speedup and Amdahl's bound): its sampled outputs there are compared with its output in
    the scenario on the same arguments."""
    scenario = ScenarioTask(module="cheats", variant="cheats_in_scenario", fn="cheats_in_scenario",
                    shape={"rows": 8, "cols": 50}, dtype="fp32", level="end_to_end", device="cpu", timed=True,
                    seed=SEED, protocol=FAST, scenario="scenario", scenario_inputs="scenario_inputs")
    [p] = execute([scenario], timeout_s=120, env={"CASEBOOK_KERNELS_PATH": str(CHEATS_DIR)})
    assert p.status == "failed" and "the kernel timed alone returned another output" in p.error, p


def test_an_answer_kept_by_the_inputs_memory_and_a_value_fails_the_blended_repetition():
    """Each timing blends one input set at random places before a random repetition and keeps that repetition's
    output: a lookup keyed by the memory and one value misses the change (unless a blended place is its value:
    about 1% a point) and returns the old answer. Three points: all three escape about once in a million."""
    points = [task("memo_by_address", seed=SEED + 100 * i) for i in range(3)]
    out = execute(points, timeout_s=120, env={"CASEBOOK_KERNELS_PATH": str(CHEATS_DIR)})
    failed = [p for p in out if p.status == "failed"]
    assert failed, out
    assert all(p.status in ("failed", "ok") for p in out), out
    assert any("timed call" in p.error and "relative error" in p.error for p in failed), failed


def test_end_to_end(payloads):
    p = payloads[-1]
    assert p.status == "ok", p
    assert p.scenario_us > 0 and p.kernel_us > 0 and p.scenario_p10_us <= p.scenario_p90_us
    # the cumsum of a row of probabilities
    assert len(p.fingerprint) == 8 * 50 and p.fingerprint[49] == pytest.approx(1.0)


def test_launch_floor_is_every_kernel_at_its_in_graph_cost():
    from casebook.roofline import launch_count, place

    roofs = Roofs(compute_tflops=1.0, bandwidth_gbps=1.0, launch_us=6.0, graph_launch_us=0.75)
    assert launch_count(1, roofs) == pytest.approx(0.125)
    assert launch_count(64, roofs) == pytest.approx(64 * 0.125)
    # A lone copy timed by events under the host's pace of issue (the H200's 4 MB copy: 5.54 us against
    # 6.57 us a back-to-back launch) is no faster than physics.
    h200 = Roofs(compute_tflops=800.0, bandwidth_gbps=4270.0, launch_us=6.57, graph_launch_us=0.84)
    n = launch_count(1, h200)
    assert place(0.0, 4.19e6, n, 5.54, h200).regime == "bandwidth"


def _task(**protocol):
    from casebook.run.child import Task

    return Task(module="m", variant="v", fn="f", shape={"n": 1024}, dtype="fp32", level="kernel",
                device="cuda", timed=True, seed=7, protocol=Protocol(**protocol))


def test_a_cold_graph_point_is_timed_on_inputs_taken_in_turn(monkeypatch):
    import casebook.run.bench
    from casebook.run.bench import Protocol
    from casebook.run.child import input_seeds

    monkeypatch.setattr(casebook.run.bench, "l2_bytes", lambda: 64 * 1024)  # 4 KiB inputs: 32 sets span 128 KiB
    seeds = input_seeds(_task(), Protocol(graph=True, cache="cold"), 4096)
    assert len(seeds) == 32 and len(set(seeds)) == 32  # fresh random sets, not one repeated
    assert input_seeds(_task(), Protocol(graph=True, cache="warm"), 4096) == [7, 8]  # the two checked sets
    assert input_seeds(_task(), Protocol(), 4096) == [7, 8]  # events: the flush empties L2 each time


def test_a_point_under_the_floor_of_busy_ceilings_is_unstable_not_failed():
    """A copy ceiling measured beside a busy process reads low; a time under its floor then says more
    about the ceiling than the kernel: the point is kept, unplaced and unstable (never published)."""
    from casebook.run.judge import place_point
    from casebook.run.messages import PointRun, TrafficModel

    roofs = Roofs(compute_tflops=1.0, bandwidth_gbps=1.0, launch_us=1.0, graph_launch_us=1.0)
    run = PointRun(status="ran", times_us=[10.0] * 20, launches=Launches(direct=1, graph=0))
    traffic = TrafficModel(flops=0.0, bytes=1e6, terms=[])  # 1 MB at 1 GB/s: a 1000 us floor
    at = {"variant": "honest", "shape": SHAPE, "dtype": "fp32", "correct": True}
    quiet = place_point(replace(task("honest"), roofs=roofs), run, run.times_us, {}, traffic, at)
    assert quiet.status == "failed" and "faster than physics" in quiet.error
    busy = place_point(replace(task("honest"), roofs=replace(roofs, busy=True)), run, run.times_us, {}, traffic, at)
    assert busy.status == "ok" and busy.median_us == 10.0 and busy.regime is None
    assert "ceilings measured on a busy machine" in busy.unstable[0]


def test_a_replaced_method_or_code_object_of_the_harness_is_rebound():
    """Rebinding a module's name is not the only way to bend the harness in its own process: a class attribute
    replaced, or a function's code swapped under its own identity. Both are recorded (`child.rebound`)."""
    from casebook.run import child, judge

    offer, code = child._Reservoir.offer, judge.times_problem.__code__
    try:
        child._Reservoir.offer = lambda self, out: None
        judge.times_problem.__code__ = (lambda times: None).__code__
        names = child.rebound()
    finally:
        child._Reservoir.offer, judge.times_problem.__code__ = offer, code
    assert "casebook.run.child._Reservoir.offer" in names
    assert "casebook.run.judge.times_problem.__code__" in names
    assert child.rebound() == []


def test_a_point_leaves_no_tensor_in_a_reference_cycle(monkeypatch):
    """What a point's child made (its input sets, its kept outputs) is freed as soon as the point's payload is sent
    and let go, without the cycle collector: on a GPU a tensor in a reference cycle held device memory until the
    collector ran, and the next process to allocate ran out (the softmax case's largest points, on the H200)."""
    import gc

    import torch

    import casebook.kernels
    from casebook.run import child
    from casebook.run.transport import split

    monkeypatch.setattr(casebook.kernels, "__path__", [*casebook.kernels.__path__, str(CHEATS_DIR)])
    gc.collect()
    gc.disable()
    try:
        payload = child.work(task("honest"))
        assert payload.get("calls"), payload
        split({"done": payload})
        del payload
        gc.set_debug(gc.DEBUG_SAVEALL)
        gc.collect()
        cycled = [tuple(o.shape) for o in gc.garbage if torch.is_tensor(o)]
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        gc.enable()
    assert cycled == []


def test_the_first_blend_of_each_kind_of_inputs_is_made_on_a_copy_before_timing(monkeypatch):
    import torch

    from casebook.run import child

    made = []
    monkeypatch.setattr(child, "_BLENDS_WARM", set())
    monkeypatch.setattr(child.inputs_mod, "blend", lambda inputs, seed, derived=None: made.append(inputs))
    x = {"x": torch.ones(4, 8), "w": torch.ones(8)}
    child._warm_blend(x)
    child._warm_blend({"x": torch.zeros(2, 2), "w": torch.zeros(2)})  # the same kind: already warm
    assert len(made) == 1 and made[0]["x"] is not x["x"] and torch.equal(made[0]["x"], x["x"])
    child._warm_blend({"x": torch.ones(4, 8, dtype=torch.bfloat16), "w": torch.ones(8)})
    assert len(made) == 2


def test_a_fingerprint_samples_every_step_th_value_across_a_tuples_tensors():
    import torch

    from casebook.run import child

    a, b = torch.arange(6000.0).reshape(60, 100).t(), torch.arange(6000, 9000, dtype=torch.bfloat16)  # a: a view
    fp = child._fingerprint((a, b))["tensor"]
    whole = torch.cat([a.flatten(), b.to(torch.float32)]).to(torch.float64)
    assert fp.dtype == torch.float64 and torch.equal(fp, whole[:: 9000 // child.FINGERPRINT][: child.FINGERPRINT])


def test_kept_outputs_are_snapshot_into_the_loan_and_a_sample_holds_no_more_than_its_calls(tmp_path, monkeypatch):
    """Under a loan (the device crossing), a kept call's snapshot is taken straight into the memory lent for the
    answer, not into memory of the child's own as well; a call the sample drops gives its room back, so a sample
    of 2 offered 50 calls still holds each kept one in the loan, beside a check's."""
    import torch

    from casebook.run import child, transport

    monkeypatch.setenv("CASEBOOK_SPILL_DIR", str(tmp_path))
    monkeypatch.setattr(transport, "_opened", {})
    arena = transport.Arena(transport.HostMemory)
    out = torch.arange(1000.0)
    outbox = transport.open_loan(arena.lend(3 * transport.aligned(out.numel() * out.element_size())))
    transport.serving(outbox)
    try:
        check = child.record("check", 0, out, {}, None)
        reservoir = child._Reservoir(2, child._Rotation(1), [0])
        for i in range(50):
            reservoir.offer(out + i, lambda o, k: child.record("timed", 0, o, {}, None))
        kept = [check] + [rec for _, rec in reservoir.kept]
        snapshots = [rec["outputs"][0] for rec in kept]
        assert all(outbox.held(s["tensor"]) is not None for s in snapshots)
        assert len(outbox.spans) == 3
        assert all(s["digest"] == transport.digest(s["tensor"]) for s in snapshots)
        assert torch.equal(snapshots[0]["tensor"], out)
    finally:
        transport.serving(None)
        transport._opened["memory"].close()
        arena.close()
