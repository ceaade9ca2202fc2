"""Where a 2-rank CPU point's slow repetitions come from: allreduce_norm's allreduce_separate on two gloo ranks,
timed as `casebook run` times it (each rank's lockstep repetitions), several tasks in a row; prints each rank's
repetitions' quantiles and the share of slow ones.

    python benchmarks/explore/allreduce_norm/cpu_ranks_spread.py [TASKS] [tokens hidden]
"""

from __future__ import annotations

import os
import statistics
import sys

from casebook.load import load_case
from casebook.result import Ceilings
from casebook.run.bench import CPU
from casebook.run.child import work
from casebook.run.isolate import run_isolated
from casebook.run.plan import plan


def main() -> None:
    tasks_n = int(sys.argv[1]) if len(sys.argv) > 1 else 10
    tokens, hidden = (int(sys.argv[2]), int(sys.argv[3])) if len(sys.argv) > 3 else (1, 1024)
    shape = {"tokens": tokens, "hidden": hidden}
    os.environ["CASEBOOK_DEVICES"] = "2"
    case = load_case("cases/allreduce_norm.yaml")
    ceilings = Ceilings(copy_gbps=10.0, matmul_tflops={"fp32": 0.1}, launch_us=5.0, graph_launch_us=5.0)
    groups = plan(case, False, CPU, ceilings, only=["allreduce_separate"])
    task = next(t for t in groups["allreduce_separate"].tasks if t.kind == "point" and t.shape == shape)
    runs = run_isolated(work, [task] * tasks_n, timeout_s=600, env={"CASEBOOK_DEVICES": "2"})
    ranks: list[list[float]] = [[], []]
    for raw in runs:
        assert raw["status"] == "ran", raw.get("error")
        for r, times in enumerate(raw["rank_times_us"]):
            ranks[r] += times
    for r, times in enumerate(ranks):
        q = statistics.quantiles(times, n=10)
        slow = sum(t > 2 * statistics.median(times) for t in times)
        print(f"rank {r}: {len(times)} reps, p10 {q[0]:.0f} median {statistics.median(times):.0f} p90 {q[-1]:.0f} us, "
              f"max {max(times):.0f}; {slow} over twice the median")
        print("  in order:", " ".join(f"{t:.0f}" for t in times[:40]))


if __name__ == "__main__":
    main()
