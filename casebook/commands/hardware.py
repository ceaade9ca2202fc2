"""`casebook hardware`: measured ceilings beside the datasheet."""

from __future__ import annotations

import json

from rich.console import Console
from rich.table import Table


def main(remeasure: bool, json_out: bool = False) -> int:
    from casebook import hardware

    ident = hardware.identify()
    measured = hardware.ceilings(remeasure=remeasure)
    sheet = ident.get("datasheet") or {}
    if json_out:  # what a result stores under `hardware`: the machine, its datasheet, its measured ceilings
        print(json.dumps({**ident, "measured": measured}, indent=2, default=str))
        return 0
    t = Table(title=f"{ident['name']} ({ident['slug']})", title_justify="left", header_style="bold")
    for col in ("ceiling", "measured", "datasheet", "measured / datasheet"):
        t.add_column(col, justify="left" if col == "ceiling" else "right")

    def row(label: str, got: float | None, spec: float | None, unit: str) -> None:
        ratio = f"{got / spec:.0%}" if got and spec else "-"
        t.add_row(label, f"{got:,.1f} {unit}" if got else "-", f"{spec:,.1f} {unit}" if spec else "-", ratio)

    row("memory bandwidth (copy, read + write)", measured["copy_gbps"], sheet.get("bandwidth_gbps"), "GB/s")
    for dtype, v in measured["matmul_tflops"].items():
        row(f"dense matmul {dtype}", v, sheet.get("peak_tflops", {}).get(dtype), "TFLOP/s")
    row("one tiny launch", measured["launch_us"], None, "us")
    row("one kernel inside a CUDA graph", measured["graph_launch_us"], None, "us")
    console = Console()
    console.print(t)
    if sheet.get("source"):
        console.print(f"datasheet: {sheet['source']}", highlight=False)
    if measured.get("measure_s") is not None:
        console.print(f"measured in {measured['measure_s']:.1f} s (cached: `--remeasure` measures again)",
                      highlight=False)
    return 0
