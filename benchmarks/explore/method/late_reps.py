"""Device check: why do most repetitions of some 13-30 us points run past their delay?

Not a casebook run.

On the H200 the book's softmax and layernorm runs each stored one unstable point: softmax's triton_onepass at
16384 x 512 bf16 (p10 12.8 us, p90 80.9 us, 52 of 80 repetitions late, so all kept) and layernorm's liger at
4096 x 4096 bf16 (23.0-73.7 us, 250 of 320 late). Their host issue times were 37 and 68 us, under the 100 us
delay, yet a repetition is late when its call returns more than the flush's time and the delay's after its
flush is issued. Other rungs at the same shapes had 1-48 late repetitions, a minority, left out. Hypotheses,
each with its prediction, written before the run:

A. The host really is late, by work between the flush's issue and the call that warm-up does not time (the
   flush, the delay and the start event are launches too) or by the harness's own work between repetitions
   (the poison before each call; a kept output's copy and checksum after, whose `.tolist()` waits for the
   device, so the next repetition starts on an idle device). Prediction: late repetitions have a long
   `t1 - ts`, cluster right after a kept output, and their device times are the slow ones; a 300 us delay
   leaves (almost) none late and the spread under 1.5.
B. The host runs ahead of the device (a repetition of ~160 us of device work, flush and delay included,
   against ~60-90 us to issue it), so launches block once the queue is full: `t1 - ts` is long but the device
   never idled, and the late repetitions' device times are as fast as the others. Prediction: late
   repetitions come in runs late in long batches, their times equal the on-time ones'; the slow times come
   from somewhere else (then C).
C. The slow times are the device's own: repetitions after a kept output's copy (its clone and checksum
   kernels) or after the poison run with the L2 or the clocks in another state. Prediction: the plain timing
   (no poison, nothing kept) has no spread.

For each point the script times three ways (the harness's steps; the same with a 300 us delay; plain
`bench.time_fn`) and prints, per way: repetitions, late ones, device time p10/median/p90 of the on-time and
the late, host time from the flush's issue to the call's return (`t1 - ts`) and from the call's start
(`t1 - t0`), and how many late repetitions followed a kept output.

Measured on an H200 (slack: the delay the harness's rule gave, 100-207 us):
A held. Late repetitions are slow on the device (softmax triton_onepass: 21.7/40.1/123.8 us p10/median/p90
against 12.2/12.4/12.9 on time), 32 of its 37 followed a kept output, and their host time from the flush's
issue was 143-241 us against 90-122 (the call alone 89-163 against 57-74: slower after the checksum's wait).
Behind a 300 us delay, 0 of 160-320 repetitions were late at softmax's two points and 3-4 of 320 at layernorm's,
spread 1.05-1.11. B did not: the late repetitions' device times are the slow ones. C did not: the plain timing's
spread is 1.07-1.12, its few late repetitions mostly a batch's first. The least delay became 300 us
(`bench.HOST_SLACK_US`); the book's softmax run then had 62 late repetitions in all, against 1,440 before.

    python3 benchmarks/explore/method/late_reps.py          (GPU)
"""

from __future__ import annotations

import random

import numpy as np
import torch

from casebook.kernels import layernorm, softmax_fusion
from casebook.result import Protocol
from casebook.run import bench, child

POINTS = [
    ("softmax triton_onepass 16384x512 bf16", softmax_fusion, "triton_onepass", {"rows": 16384, "cols": 512}),
    ("softmax triton_online 16384x512 bf16", softmax_fusion, "triton_online", {"rows": 16384, "cols": 512}),
    ("layernorm liger 4096x4096 bf16", layernorm, "liger", {"rows": 4096, "cols": 4096}),
    ("layernorm triton_onepass 4096x4096 bf16", layernorm, "triton_onepass", {"rows": 4096, "cols": 4096}),
]
KEEP = 8


class _Recorded(bench.Step):
    made: list = []

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        _Recorded.made.append(self)


def _timed(fn, inputs, protocol, harness: bool):
    """One timing; each timed repetition as (device us, late, t1 - ts us, t1 - t0 us, after a kept output)."""
    out = fn(**inputs)
    poison = child._Poison("cuda", [(tuple(out.shape), out.dtype)])
    kept, seen = [], [0]
    after_kept = []

    def observe(o):
        seen[0] += 1
        keep = len(kept) < KEEP or random.randrange(seen[0]) < KEEP
        after_kept.append(keep)
        if keep:
            kept.append(child._snapshot(o))
            del kept[:-KEEP]

    _Recorded.made = []
    schedule = bench.timing_schedule("cuda", protocol, 1, observe=observe if harness else None,
                                     prepare=poison if harness else None, graph_call=None)
    timing = bench.drive(lambda: fn(**inputs), schedule)
    steps = [s for s in _Recorded.made if s.sleep_cycles]
    flags = [False] + after_kept[:-1] if harness else [False] * len(steps)
    late_us = timing.slack_us + bench._flush_us()
    return timing, [(s.start.elapsed_time(s.end) * 1e3, (s.t1 - s.ts) / 1e3 > late_us,
                     (s.t1 - s.ts) / 1e3, (s.t1 - s.t0) / 1e3, f) for s, f in zip(steps, flags)]


def _q(xs):
    return " / ".join(f"{np.percentile(xs, q):6.1f}" for q in (10, 50, 90)) if xs else "    -"


def main() -> None:
    bench.Step = _Recorded
    for label, mod, fn_name, shape in POINTS:
        inputs = mod.make_inputs(shape, torch.bfloat16, "cuda", torch.Generator().manual_seed(1))
        fn = getattr(mod, fn_name)
        fn(**inputs)
        torch.cuda.synchronize()
        print(f"\n{label}", flush=True)
        for way, protocol, harness in (("harness", Protocol(), True),
                                       ("harness, 300 us delay", Protocol(host_slack_us=300.0), True),
                                       ("plain", Protocol(), False)):
            try:
                timing, reps = _timed(fn, inputs, protocol, harness)
            except Exception as e:  # noqa: BLE001 (an exploration: the other points still run)
                print(f"  {way}: {type(e).__name__}: {e}")
                continue
            on = [r for r in reps if not r[1]]
            late = [r for r in reps if r[1]]
            print(f"  {way:22s} reps {len(reps):4d} late {len(late):4d} (after a kept output {sum(r[4] for r in late)})"
                  f"  slack {timing.slack_us:5.0f} us  host_us {timing.host_us:5.1f}  kept spread "
                  f"{timing.summary.p90_us / timing.summary.p10_us:4.2f}")
            print(f"    device us p10/med/p90  on time {_q([r[0] for r in on])}   late {_q([r[0] for r in late])}")
            print(f"    t1-ts us               on time {_q([r[2] for r in on])}   late {_q([r[2] for r in late])}")
            print(f"    t1-t0 us               on time {_q([r[3] for r in on])}   late {_q([r[3] for r in late])}")
            slow = [i for i, r in enumerate(reps) if r[0] > 2 * np.median([x[0] for x in reps])]
            print(f"    slow (> 2x median) reps at {slow[:20]}{' ...' if len(slow) > 20 else ''} of {len(reps)}; "
                  f"late at {[i for i, r in enumerate(reps) if r[1]][:20]}")


if __name__ == "__main__":
    main()
