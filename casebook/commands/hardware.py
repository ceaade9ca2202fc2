"""`casebook hardware`: measured ceilings beside the datasheet."""

from __future__ import annotations

import json

from rich.console import Console
from rich.table import Table


def main(remeasure: bool, json_out: bool = False) -> int:
    import time

    from casebook.run import hardware

    ident = hardware.identify()
    since = time.time()
    measured = hardware.ceilings(remeasure=remeasure)
    sheet = ident.datasheet
    if json_out:  # what a result stores under `hardware`: the machine, its datasheet, its measured ceilings
        print(json.dumps({**ident.model_dump(mode="json", exclude_unset=True), "measured": measured}, indent=2,
                         default=str))
        return 0
    t = Table(title=f"{ident.name} ({ident.slug})", title_justify="left", header_style="bold")
    for col in ("ceiling", "measured", "datasheet", "measured / datasheet"):
        t.add_column(col, justify="left" if col == "ceiling" else "right")

    def row(label: str, got: float | None, spec: float | None, unit: str) -> None:
        ratio = f"{got / spec:.0%}" if got and spec else "-"
        t.add_row(label, _figure(got, unit), _figure(spec, unit), ratio)

    peaks = (sheet.peak_tflops if sheet else None) or {}
    row("memory bandwidth (copy, read + write)", measured["copy_gbps"], sheet.bandwidth_gbps if sheet else None,
        "GB/s")
    for what, key in (("reads only", "read_gbps"), ("writes only", "write_gbps")):  # the roofs of other mixes
        if measured.get(key) is not None:
            row(f"memory bandwidth ({what})", measured[key], sheet.bandwidth_gbps if sheet else None, "GB/s")
    for dtype in dict.fromkeys([*measured["matmul_tflops"], *peaks]):  # a datasheet dtype not measured: "-"
        row(f"dense matmul {dtype}", measured["matmul_tflops"].get(dtype), peaks.get(dtype), "TFLOP/s")
    row("one tiny launch" if ident.kind == "gpu" else "one tiny op call", measured["launch_us"], None, "us")
    if ident.kind == "gpu":
        row("one kernel inside a CUDA graph", measured["graph_launch_us"], None, "us")
    console = Console()
    console.print(t)
    if sheet and sheet.source:
        console.print(f"datasheet: {sheet.source}", highlight=False)
    console.print("a dtype without a measured matmul is placed under the fp32 roof; ceilings "
                  f"{hardware.provenance_of(measured, since)}", highlight=False)
    return 0


def _figure(value: float | None, unit: str) -> str:
    """A rate with three significant figures in the unit's prefix that fits it (0.41 TFLOP/s, not 0.4)."""
    if not value:
        return "-"
    return f"{value:,.1f} {unit}" if value >= 100 else f"{value:.3g} {unit}"
