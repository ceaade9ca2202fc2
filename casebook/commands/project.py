"""`casebook project CASE --to HARDWARE`: a stored GPU result carried to another machine of the registry."""

from __future__ import annotations

import json
import sys
from dataclasses import asdict
from pathlib import Path

from rich.console import Console
from rich.table import Table

from casebook import results
from casebook.commands import console as terminal
from casebook.projection import ProjectionError, nearest_source, project
from casebook.result import Ceilings, shape_label


def stored(results_dir: Path, case_id: str) -> dict[str, results.Result]:
    """{hardware slug: the stored result of `case_id` there}."""
    found = {}
    for path in sorted(Path(results_dir).glob(f"*/{case_id}.json")):
        found[path.parent.name] = results.load(path)
    return found


def measured_ceilings(results_dir: Path) -> dict[str, Ceilings]:
    """{hardware slug: measured ceilings} from any stored result of that machine."""
    out = {}
    for path in sorted(Path(results_dir).glob("*/*.json")):
        try:
            hw = results.load(path).hardware
        except results.ResultError:
            continue
        if hw.kind == "gpu" and hw.measured.copy_gbps:
            out.setdefault(hw.slug, hw.measured)
    return out


def main(case: str, to: str, source: str | None, results_dir: Path, json_out: bool = False) -> int:
    """0 on a projection shown, 2 on bad input (unknown case, machine or source)."""
    from casebook.datasheets import datasheets

    err = terminal(stderr=True, highlight=False)
    case_id = Path(case).stem
    by_machine = stored(results_dir, case_id)
    gpu = {slug: r for slug, r in by_machine.items() if r.hardware.kind == "gpu"}
    if source is None:
        source = nearest_source(list(gpu), to, datasheets())
    if source not in gpu:
        err.print(f"{case_id}: no stored GPU result{' on ' + source if source else ''} under {results_dir}/ "
                  f"to project from (stored: {', '.join(by_machine) or 'none'})")
        return 2
    try:
        roofs, points = project(gpu[source], to, datasheets(), measured_ceilings(results_dir), gpu.get(to))
    except ProjectionError as e:
        err.print(str(e))
        return 2
    if json_out:
        print(json.dumps({"case_id": case_id, "from": source, "to": asdict(roofs),
                          "points": [asdict(p) for p in points]}, indent=1))
        return 0
    out = Console(highlight=False, width=None if sys.stdout.isatty() else 160)
    out.print(f"[bold]{case_id}[/]: {source} projected onto {roofs.name} (roofs: {roofs.basis}; "
              f"copy {roofs.bandwidth_gbps:.0f} GB/s, bf16 {roofs.compute_tflops.get('bf16', 0):.0f} TFLOP/s, "
              f"{roofs.sm_count} SMs). A projection is a band, never a claim.")
    table = Table("variant", "shape", "dtype", f"{source} us", "regime", "roof", "optimistic us",
                  "pessimistic us", *(["measured us", "in band", "error"] if to in gpu else []))
    for p in points:
        row = [p.variant, shape_label(p.shape), p.dtype, f"{p.source_us:.1f}", p.regime, f"{p.roof_fraction:.0%}",
               f"{p.optimistic_us:.1f}", f"{p.pessimistic_us:.1f}"]
        if to in gpu:
            row += ["-", "-", "-"] if p.measured_us is None else [
                f"{p.measured_us:.1f}", "yes" if p.in_band else "no", f"{p.error:+.0%}"]
        table.add_row(*row)
    out.print(table)
    out.print("Pessimistic edge, by regime: " + "; ".join(
        f"{regime}: {bound}" for regime, bound in sorted({(p.regime, p.bound) for p in points})))
    return 0
