"""The timer's protocol: the host's issue time measured in warm-up and hidden behind the device-side delay."""

import gc
import time

import pytest

import casebook.run.bench as bench
from casebook.run.bench import HOST_SLACK_MARGIN, HOST_SLACK_US, Protocol, slack_us, time_fn

QUICK = Protocol(warmup_ms=1.0, min_reps=5, max_reps=5, time_cap_s=0.1)


def test_slack_hides_the_hosts_p90_with_margin_and_never_drops_under_the_least():
    assert slack_us([10.0] * 20) == HOST_SLACK_US
    slow = [200.0] * 9 + [1000.0]  # one slow call in ten does not set the delay alone
    assert slack_us(slow) == pytest.approx(HOST_SLACK_MARGIN * 280.0)
    assert slack_us(slow, fixed=50.0) == 50.0


@pytest.mark.slow
def test_cpu_timing_has_no_host_time_and_no_delay():
    t = time_fn(lambda: sum(range(1000)), "cpu", QUICK)
    assert t.host_us == 0.0 and t.slack_us == 0.0 and t.summary.repetitions == 5


@pytest.fixture
def fake_gpu(monkeypatch):
    """The GPU path on a CPU: no-op syncs, a sampler that records the delay it was given."""
    seen = {}

    def sampler(flush, slack, prepare=None, align=None):
        seen["slack"] = slack
        late = iter(seen.get("late", []))

        def sample(n, observe):
            for _ in range(n):
                observe((yield bench.Step()))
            return [(50.0, True) if next(late, False) else (1.0, False) for _ in range(n)]

        return sample

    monkeypatch.setattr(bench, "_sync", lambda device: None)
    monkeypatch.setattr(bench, "_warm_sampler", lambda cold: None)
    monkeypatch.setattr(bench, "_cuda_sampler", sampler)
    return seen


def test_gpu_timing_measures_the_host_in_warm_up_and_hides_it(fake_gpu):
    t = time_fn(lambda: time.sleep(0.002), "cuda", QUICK)
    assert 2000 <= t.host_us < 20000
    assert fake_gpu["slack"] == t.slack_us >= HOST_SLACK_MARGIN * 2000
    assert t.summary.median_us == 1.0  # the device's time, not the host's


def test_a_repetition_the_host_issued_late_is_left_out_and_replaced(fake_gpu):
    fake_gpu["late"] = [False, True, False, False, True]  # two of the first five ran past their delay
    t = time_fn(lambda: None, "cuda", QUICK.model_copy(update={"max_reps": 20}))
    assert len(t.times) >= QUICK.min_reps and set(t.times) == {1.0}  # more taken; none of the slow two
    assert t.interference["late_reps"] == 2 and "late_reps_kept" not in t.interference


def test_a_call_the_delay_never_hides_keeps_every_repetition_and_stops_when_they_are_stable(fake_gpu):
    """Not one repetition on time (a call that waits on the device): every one kept, since the time includes the
    host's as it would in a loop, and judged so, so that timing stops once they are stable rather than at the cap
    (Liger's cross-entropy ran to the time cap at every point on an H200: 1.2-1.7 s of harness a point)."""
    fake_gpu["late"] = [True] * 10_000
    t = time_fn(lambda: None, "cuda", QUICK.model_copy(update={"max_reps": 1000, "time_cap_s": 60.0}))
    assert t.times == [50.0] * QUICK.min_reps
    assert t.interference["late_reps_kept"] == QUICK.min_reps and "late_reps" not in t.interference


def test_a_few_late_repetitions_among_many_are_left_out(fake_gpu):
    fake_gpu["late"] = [True, False, False, True, False]
    t = time_fn(lambda: None, "cuda", QUICK.model_copy(update={"max_reps": 5}))  # the cap: five made, three on time
    assert t.times == [1.0] * 3 and t.interference["late_reps"] == 2


def test_the_drive_stamps_when_the_delay_was_issued(monkeypatch):
    monkeypatch.setattr(bench.torch.cuda, "_sleep", lambda cycles: None)
    step = bench.Step(sleep_cycles=1000)

    def schedule():
        yield step

    bench.drive(lambda: time.sleep(0.001), schedule())
    assert 0 < step.ts <= step.t0 < step.t1 and step.t1 - step.ts >= 1_000_000


def test_the_delay_is_stamped_before_the_flush_so_a_late_call_cannot_hide_in_the_flushs_issue(monkeypatch):
    monkeypatch.setattr(bench.torch.cuda, "_sleep", lambda cycles: None)
    flushed = []
    step = bench.Step(sleep_cycles=1000, flush=lambda: (time.sleep(0.002), flushed.append(time.perf_counter_ns())))

    def schedule():
        yield step

    bench.drive(lambda: None, schedule())
    assert step.ts < flushed[0] and flushed[0] - step.ts >= 2_000_000  # the flush's issue counts against the call


def test_after_the_ranks_meet_the_delay_is_stamped_at_the_meeting(monkeypatch):
    monkeypatch.setattr(bench.torch.cuda, "_sleep", lambda cycles: None)
    met = []
    step = bench.Step(sleep_cycles=1000, flush=lambda: time.sleep(0.002),
                      align=lambda: met.append(time.perf_counter_ns()))

    def schedule():
        yield step

    bench.drive(lambda: None, schedule())
    assert step.ts >= met[0]  # the meeting waited for the device: its flush is done, the delay starts here


def test_every_call_runs_with_the_cycle_collector_paused_and_it_resumes_after():
    seen = []

    def schedule():
        for _ in range(3):  # a check, a warm-up call and a timed repetition alike
            yield bench.Step(prepare=lambda: seen.append(("prepare", gc.isenabled())))

    assert gc.isenabled()
    bench.drive(lambda: seen.append(("call", gc.isenabled())), schedule())
    assert seen == [("prepare", True), ("call", False)] * 3 and gc.isenabled()


def test_a_call_that_raises_leaves_the_collector_running():
    def schedule():
        yield bench.Step()

    with pytest.raises(ZeroDivisionError):
        bench.drive(lambda: 1 / 0, schedule())
    assert gc.isenabled()


def test_a_fixed_delay_is_kept_as_given(fake_gpu):
    t = time_fn(lambda: time.sleep(0.002), "cuda", QUICK.model_copy(update={"host_slack_us": HOST_SLACK_US}))
    assert fake_gpu["slack"] == t.slack_us == HOST_SLACK_US


def test_pipelined_host_time_issues_calls_back_to_back(monkeypatch):
    syncs = []
    monkeypatch.setattr(bench, "_sync", lambda device: syncs.append(device))
    us = bench.pipelined_host_us(lambda: time.sleep(0.001), calls=5)
    assert 1000 <= us < 10000
    assert syncs == ["cuda", "cuda"]  # one before the loop, one after: no wait between the calls


def test_host_issue_time_is_the_lesser_of_the_synchronised_and_the_pipelined(monkeypatch):
    monkeypatch.setattr(bench, "_sync", lambda device: None)
    quick = lambda: time.sleep(0.001)  # noqa: E731
    assert bench.host_issue_us(quick, [5000.0] * 4) < 5000.0  # a cold host after each wait: the loop wins
    assert bench.host_issue_us(quick, [50.0] * 4) == 50.0  # a call that waits on the device: the cold start wins


def test_rotating_inputs_span_twice_the_l2_within_a_bound():
    l2 = 50 * 2**20
    assert bench.input_sets(2**20, l2) == 100  # 1 MiB inputs: 100 copies are twice a 50 MiB L2
    assert bench.input_sets(2 * l2, l2) == 1  # already twice the L2: one set is cold by itself
    assert bench.input_sets(4096, l2) == bench.MAX_INPUT_SETS  # a few KB stay cached whatever is done
    assert bench.input_sets(0, l2) == 1


def test_a_graph_captures_a_call_for_every_input_set(monkeypatch):
    seen = {}

    def graph_sampler(fn, calls):
        seen["calls"] = calls
        return lambda n: [1.0] * n

    monkeypatch.setattr(bench, "_sync", lambda device: None)
    monkeypatch.setattr(bench, "_cuda_graph_sampler", graph_sampler)
    graph = QUICK.model_copy(update={"graph": True})
    time_fn(lambda: None, "cuda", graph)
    assert seen["calls"] == bench.GRAPH_CALLS
    time_fn(lambda: None, "cuda", graph, input_sets=100)
    assert seen["calls"] == 100


def test_ranks_meet_before_each_timed_repetition_outside_its_time(monkeypatch):
    """A multi-device case's ranks wait for each other after the flush (`Protocol.rank_barrier`): a sibling's
    lateness (here 5 ms a meeting) is not in the time of the call."""
    events = []

    def barrier(device):
        def align():
            events.append("meet")
            time.sleep(0.005)
        return align

    monkeypatch.setattr(bench, "_rank_barrier", barrier)
    monkeypatch.setattr(bench, "_cpu_flush", lambda: events.append("flush"))
    proto = Protocol(cache="cold", warmup_ms=0.0, min_reps=8, max_reps=8, target_ci=0.0, rank_barrier=True)
    t = time_fn(lambda: events.append("call"), "cpu", proto)
    assert len(t.times) == 8 and max(t.times) < 1000.0, t.times  # microseconds: no 5 ms meeting inside
    timed = events[events.index("flush"):]
    assert timed == ["flush", "meet", "call"] * 8
    assert "meet" not in events[:events.index("flush")], "warm-up calls meet nobody"
    events.clear()
    time_fn(lambda: events.append("call"), "cpu", proto.model_copy(update={"rank_barrier": False}))
    assert "meet" not in events  # one device: as before


def test_a_spread_over_the_bound_is_read_from_enough_repetitions(monkeypatch):
    """Three slow repetitions in the first twenty settle the median but make the p90: timing goes on, and where they
    were a burst the spread falls within the bound (three in forty); a spread that recurs is read from SPREAD_REPS
    repetitions and stays over it."""
    def sampler(pattern):
        def make(flush, slack, prepare=None, align=None):
            k = iter(range(10**6))

            def sample(n, observe):
                for _ in range(n):
                    observe((yield bench.Step()))
                return [(pattern(next(k)), False) for _ in range(n)]
            return sample
        return make

    monkeypatch.setattr(bench, "_sync", lambda device: None)
    monkeypatch.setattr(bench, "_warm_sampler", lambda cold: None)
    proto = Protocol(warmup_ms=0.0, min_reps=10, max_reps=2000, target_ci=0.005, time_cap_s=30.0)
    monkeypatch.setattr(bench, "_cuda_sampler", sampler(lambda i: 2.0 if i in (3, 7, 12) else 1.0))
    t = time_fn(lambda: None, "cuda", proto)
    assert len(t.times) > 20 and t.summary.p90_us == 1.0
    monkeypatch.setattr(bench, "_cuda_sampler", sampler(lambda i: 2.0 if i % 4 == 0 else 1.0))
    t = time_fn(lambda: None, "cuda", proto)
    assert bench.SPREAD_REPS <= len(t.times) < 2000 and t.summary.p90_us == 2.0  # read, and still over
    monkeypatch.setattr(bench, "_cuda_sampler", sampler(lambda i: 1.0 + (i % 5) * 1e-4))
    assert len(time_fn(lambda: None, "cuda", proto).times) < bench.SPREAD_REPS  # within the bound: the median rules


def test_spread_read_uses_the_devices_bound():
    assert bench.spread_read([1.0] * 9 + [1.4] * 3, "cuda") and not bench.spread_read([1.0] * 9 + [1.6] * 3, "cuda")
    assert bench.spread_read([1.0] * 9 + [2.9] * 3, "cpu") and not bench.spread_read([1.0] * 9 + [3.1] * 3, "cpu")
    assert bench.spread_read([1.0] * 50 + [9.0] * 50, "cuda")  # enough repetitions: read as it is
