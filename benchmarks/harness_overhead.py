"""What measuring cost, beside what was measured: per point, the wall time of its measurement against the time of
its timed calls, its first call (the variant's own compilation or autotuning, never timed), the wait for the
reference's answers, the crossing of its outputs and the judging.

Reads kept or stored results (`casebook run` records each point's `harness`); prints a row per point (with
--points) and a summary line per result: points, the harness's overhead per point (wall less timed less the
first call: median and worst), the first calls' total, the total wall and timed time, the run's span and the
counters' time after it (the machine time a case took), each variant's share.

    python3 benchmarks/harness_overhead.py RESULT.json [RESULT.json ...] [--points]
    python3 benchmarks/harness_overhead.py ~/.cache/casebook/runs/nvidia-h200/softmax_fusion/*.json
    python3 benchmarks/harness_overhead.py results/nvidia-h200/*.json --table   # the book's machine time, a row
                                                                                 # a case (Markdown), and the total
"""

from __future__ import annotations

import argparse
import statistics
import sys
from datetime import datetime
from pathlib import Path
from typing import NamedTuple

from casebook import results
from casebook.result import shape_label


class Row(NamedTuple):
    """One measured point's costs, seconds; `overhead` is the wall time less the timed calls, the first call and
    the wait for the variant's child to finish starting (its first point's, where it had not)."""

    level: str
    variant: str
    shape: str
    dtype: str
    wall: float
    timed: float
    first: float
    oracle: float
    transport: float
    judge: float
    start: float
    overhead: float


def rows(result, kept: bool = False) -> list[Row]:
    """A `Row` for each point measured in this run; with `kept`, those a resumed run kept from its earlier parts
    too (their costs were paid there)."""
    out = []
    for level, points in (("kernel", result.kernel_level), ("workload", result.workload_level.points)):
        for p in points:
            h = p.harness
            if h is None or h.wall_s is None or (h.kept and not kept):
                continue
            timed, first, start = h.timed_s or 0.0, p.first_call_s or 0.0, h.start_s or 0.0
            out.append(Row(level, p.variant, shape_label(p.shape), p.dtype, h.wall_s, timed, first, h.oracle_s or 0.0,
                           h.transport_s or 0.0, h.judge_s or 0.0, start, h.wall_s - timed - first - start))
    return out


def _seconds(result) -> float:
    return (datetime.fromisoformat(result.finished_at) - datetime.fromisoformat(result.started_at)).total_seconds()


def machine_s(result, found: list[Row]) -> float:
    """The seconds a case's run held the machine, counters excluded: its span, or for a run resumed over several
    parts (whose span includes the time between them) the wall time of its points in every part (`found`, kept
    ones included), which leaves out each part's start (loading, ceilings) and so reads low."""
    return sum(r.wall for r in found) if result.resumed else _seconds(result)


def _span(result) -> str:
    """The run's span in seconds, from its start to its last point; a resumed run's spans the time between its
    parts too, and says so."""
    return f"{_seconds(result):.1f} s" + (f", over {len(result.resumed) + 1} parts" if result.resumed else "")


TABLE_HEAD = ("| case | machine | run s | counters s | points | timed s | first calls s | child starts s "
              "| overhead a point, median / worst s |\n|---|---|---|---|---|---|---|---|---|")


def starts_recorded(result) -> bool:
    """Whether the run recorded its points' waits for their children's starts (results before it did not)."""
    return any(p.harness is not None and p.harness.start_s is not None
               for p in [*result.kernel_level, *result.workload_level.points])


def table_row(result, found: list[Row]) -> str:
    """A case's machine time as a Markdown row: its run's (`machine_s`; a resumed run's marked), the counters
    after it, and of its points' wall time (`found`, every part's) what was timed, compiled and started."""
    overhead = [r.overhead for r in found]
    counters = f"{result.counters_s:.1f}" if result.counters_s is not None else "-"
    parts = f" ({len(result.resumed) + 1} parts, points only)" if result.resumed else ""
    starts = f"{sum(r.start for r in found):.1f}" if starts_recorded(result) else "-"
    return (f"| {result.case_id} | {result.hardware.slug} | {machine_s(result, found):.1f}{parts} | {counters} | "
            f"{len(found)} | {sum(r.timed for r in found):.1f} | {sum(r.first for r in found):.1f} | "
            f"{starts} | {statistics.median(overhead):.3f} / {max(overhead):.3f} |")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("results", nargs="+", type=Path)
    parser.add_argument("--points", action="store_true", help="a row per point")
    parser.add_argument("--table", action="store_true", help="a Markdown row per result, and their total")
    args = parser.parse_args(argv)
    total = 0.0
    if args.table:
        print(TABLE_HEAD)
    for path in args.results:
        result = results.load(path)
        found = rows(result, kept=args.table)  # the table is the case's machine time: every part's points
        if not found:
            print(f"{path}: no point records its harness cost (a result from before it was recorded)",
                  file=sys.stderr if args.table else sys.stdout)
            continue
        if args.table:
            print(table_row(result, found))
            total += machine_s(result, found) + (result.counters_s or 0.0)
            continue
        if args.points:
            print(f"{'level':8s} {'variant':16s} {'shape':16s} {'dtype':5s} {'wall s':>7s} {'timed s':>8s} "
                  f"{'first s':>8s} {'oracle s':>8s} {'cross s':>8s} {'judge s':>8s} {'start s':>8s} "
                  f"{'overhead s':>10s}")
            for level, variant, shape, dtype, *seconds in found:
                print(f"{level:8s} {variant:16s} {shape:16s} {dtype:5s} " + " ".join(
                    f"{x:{w}.3f}" for x, w in zip(seconds, (7, 8, 8, 8, 8, 8, 8, 10))))
        overhead = [r.overhead for r in found]
        wall, timed, first, start = (sum(getattr(r, f) for r in found) for f in ("wall", "timed", "first", "start"))
        worst = max(found, key=lambda r: r.overhead)
        waited = max(found, key=lambda r: r.start)
        starts = (f"{start:.1f} s waiting for variants' children to start (longest {waited.start:.1f} s, "
                  f"{waited.variant})" if starts_recorded(result)
                  else "the children's starts not recorded (a result from before they were)")
        # each variant's first point also pays its process's first uses of the device: the rest apart
        seen, rest = set(), []
        for r in found:
            if r.variant in seen:
                rest.append(r.overhead)
            seen.add(r.variant)
        counters = f", then counters {result.counters_s:.1f} s" if result.counters_s is not None else ""
        variants = ", ".join(f"{v.name} {v.wall_s:.1f} s ({v.timed_s:.2f} timed)" for v in result.variants
                             if v.wall_s is not None)
        print(f"{result.case_id} on {result.hardware.slug} ({result.protocol.transport or 'crossing not recorded'}): "
              f"{len(found)} points; harness overhead a point (less timed calls, first call and child start) median "
              f"{statistics.median(overhead):.3f} s, worst {max(overhead):.3f} s ({worst.variant} {worst.shape} "
              f"{worst.dtype}: oracle {worst.oracle:.3f}, crossing {worst.transport:.3f}, judge {worst.judge:.3f}), "
              f"past each variant's first point {max(rest, default=0.0):.3f} s; points {wall:.1f} s, "
              f"{timed:.1f} s of it timed, {first:.1f} s first calls, {starts}; run {result.started_at} -> "
              f"{result.finished_at} ({_span(result)}){counters}; variants: {variants}")
    if args.table:
        print(f"\nin all: {total:.0f} s of runs and counters ({total / 60:.1f} min; a resumed run counts its "
              f"points' time alone)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
