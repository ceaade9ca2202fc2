"""Device check (not a casebook run): do rotated inputs make CUDA-graph replay measure a cold cache?

casebook times `graph: true` points by replaying a CUDA graph of calls, where nothing can flush L2
between calls. A cold-cache point takes fresh copies of its inputs in turn inside the
graph, enough to span twice the L2 (`bench.input_sets`). This script times one small bandwidth-bound
call three ways with casebook's harness:

  events, cold      one call per repetition, L2 flushed before each (the default protocol)
  graph, warm       the graph replays one set of inputs: they stay in L2
  graph, rotated    the graph takes `input_sets` copies in turn

Prediction, written before any run: at 256 x 4096 bf16 (2 MiB in, 2 MiB out, inside the L2) the
warm graph is the fastest, well above the copy rate; the rotated graph reads from memory, so its
bandwidth stays under the measured copy rate (~4.2 TB/s) and within 15% of the events-and-flush time
(the graph saves each call's launch latency, ~2.7 us, so it can be a little faster). At 16384 x 4096
(128 MiB, past the L2) all three agree within 10%, and the rotation takes a single set.

Measured on an H200: at 256 x 4096 the
prediction failed. The warm graph ran 4.32 us (0.97 TB/s), nowhere near the copy rate, and the
rotated graph (60 sets) 4.61 us, 42% under the events-and-flush time (8.00 us), not within 15%: a
2 MiB softmax on 132 SMs is bound by latency (one wave of 256 rows), not bandwidth, so a graph saves
the ~3.4 us of launch latency and the cache state moves the time only 7%. The rotation does what it
is for (the rotated graph is slower than the warm one: its inputs come from memory), but this shape
cannot show how much. At 16384 x 4096 the three agreed within 1.7% (212.7, 209.2, 209.2 us), with a
single set, as predicted.

    python3 benchmarks/explore/method/graph_rotation.py          (GPU)
"""
import itertools

import torch

from casebook.run.bench import Protocol, input_sets, l2_bytes, time_fn


def main():
    for rows in (256, 16384):
        n = rows * 4096
        make = lambda: torch.randn(rows, 4096, device="cuda").to(torch.bfloat16)  # noqa: E731
        x = make()
        nbytes = 2 * x.numel() * x.element_size()  # one read, one write
        sets = [x] + [make() for _ in range(input_sets(x.numel() * x.element_size(), l2_bytes()) - 1)]
        rotation = itertools.cycle(sets)
        runs = {
            "events, cold": time_fn(lambda: torch.softmax(x, -1), "cuda", Protocol()),
            "graph, warm": time_fn(lambda: torch.softmax(x, -1), "cuda", Protocol(graph=True)),
            f"graph, rotated ({len(sets)} sets)": time_fn(lambda: torch.softmax(next(rotation), -1), "cuda",
                                                         Protocol(graph=True), input_sets=len(sets)),
        }
        for label, t in runs.items():
            s = t.summary
            print(f"{rows}x4096 bf16 ({n * 2 / 2**20:.0f} MiB) {label:28s} {s.median_us:8.2f} us  "
                  f"p10 {s.p10_us:7.2f}  p90 {s.p90_us:7.2f}  {nbytes / s.median_us / 1e6:6.3f} TB/s", flush=True)


if __name__ == "__main__":
    main()
