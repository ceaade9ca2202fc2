"""Why a variant's first points time with a heavy tail on the H200 (rmsnorm, book run: p90/p10 up to 44 at
256 x 4096, 10 repetitions, the first batch taking 3.5 s): each step of the harness's schedule traced
in-process, as `child.work` makes it, for the first points of a fresh process.

    python3 benchmarks/explore/method/first_point_trace.py [CASE] [VARIANT ...]

Per timed repetition: its device time, the host time from the step's start to the call's return, and the
time the schedule took after the previous call (prepare, observe: the sampled outputs' copies and checksums)."""

from __future__ import annotations

import sys
import time

import torch

from casebook.load import load_case
from casebook.run import bench, child
from casebook.run.bench import Protocol
from casebook.run.plan import plan

CEILINGS = {"matmul_tflops": {"bf16": 800.0, "fp16": 800.0, "fp32": 50.0, "tf32": 400.0},
            "copy_gbps": 4200.0, "launch_us": 5.0, "graph_launch_us": 2.0}
trace: list[dict] = []


def traced_drive(call, schedule):
    try:
        step = next(schedule)
    except StopIteration as e:
        return e.value
    after = time.perf_counter()
    while True:
        row = {"sched_ms": (time.perf_counter() - after) * 1e3}
        a = time.perf_counter()
        if step.prepare is not None:
            step.prepare()
        b = time.perf_counter()
        if step.flush is not None:
            step.flush()
        if step.align is not None:
            step.align()
        if step.sleep_cycles:
            torch.cuda._sleep(step.sleep_cycles)
        if step.start is not None:
            bench._event_record(step.start)
        step.t0 = bench._perf_counter_ns()
        out = call()
        step.t1 = bench._perf_counter_ns()
        if step.end is not None:
            bench._event_record(step.end)
        if step.sync:
            bench._sync(step.sync)
        step.t2 = bench._perf_counter_ns()
        row.update(prepare_ms=(b - a) * 1e3, issue_us=(step.t1 - step.t0) / 1e3, step=step,
                   slack_us=step.sleep_cycles / 2000 if step.sleep_cycles else 0.0)
        trace.append(row)
        after = time.perf_counter()
        try:
            step = schedule.send(out)
        except StopIteration as e:
            return e.value
        finally:
            out = None


def main() -> None:
    name = sys.argv[1] if len(sys.argv) > 1 else "rmsnorm"
    only = sys.argv[2:] or None
    case = load_case(f"cases/{name}.yaml")
    groups = plan(case, torch.cuda.is_available(), Protocol(), CEILINGS, only)
    bench.drive = traced_drive
    for variant, g in groups.items():
        for task in g["tasks"][:3]:
            trace.clear()
            t = time.perf_counter()
            payload = child.work(task)
            wall = time.perf_counter() - t
            if torch.cuda.is_available():
                torch.cuda.synchronize()
            timed = [r for r in trace if r["step"].start is not None]
            print(f"{variant} {task.shape} {task.dtype}: {payload.get('status')} wall {wall:.2f} s, "
                  f"{len(trace)} steps, {len(timed)} timed, first call {payload.get('first_call_s')}")
            for i, r in enumerate(timed[:40]):
                dev = r["step"].start.elapsed_time(r["step"].end) * 1e3 if r["step"].start is not None else 0.0
                print(f"  rep {i:3d}: device {dev:9.1f} us  issue {r['issue_us']:8.1f} us  "
                      f"before it {r['sched_ms']:9.2f} ms (prepare {r['prepare_ms']:.2f})  slack {r['slack_us']:.0f} us")


if __name__ == "__main__":
    main()
