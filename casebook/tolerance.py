"""How far an output may be from the float64 reference, per dtype: over the whole output and over its worst
row. Pure numbers: `validate` reads them without torch; `run.check` judges by them."""

from __future__ import annotations

TOLERANCE = {
    "fp64": 1e-10, "fp32": 1e-5, "tf32": 2e-3, "bf16": 2e-2, "fp16": 4e-3,
    "fp8_e4m3": 1.5e-1, "fp8_e5m2": 2.5e-1, "int8": 0.0, "int32": 0.0, "int64": 0.0,
}
"""Bound on the normwise relative error ||out - ref|| / ||ref|| per input dtype (METHOD.md's ranges)."""


ROW_TOLERANCE = {
    "fp64": 1e-8, "fp32": 1e-4, "tf32": 1e-2, "bf16": 1.2e-2, "fp16": 4e-3,
    "fp8_e4m3": 1.5e-1, "fp8_e5m2": 2.5e-1, "int8": 0.0, "int32": 0.0, "int64": 0.0,
}
"""Bound on the worst row's normwise error, ||out - ref|| / ||ref|| over that row alone (rows: the last
dimension; a vector is one row), per dtype. A bound on the whole output alone lets through what spreads
thin: one row of zeros in thousands, or every output 1.5% off in bf16 (0.015, under bf16's 0.02). An
honest output rounded once to its dtype is off by about a third of a unit in the last place, root mean
square: 0.1-0.2% in bf16; a chain of layers each rounded to bf16 reached 0.8% on a row (decode_chain's
`fused` at 64 x 33, two layers; its `eager` 0.6%). Scaled by 1.015 a row is 1.5% off."""


OVERRIDE_FLAG = 10.0
"""A variant's own `tolerance` more than this many times its dtype's bound is flagged by `casebook check`
and shown on the page: it makes the check say little."""


ROW_FLOOR = 0.1
"""A row whose reference norm is under this fraction of the rows' root-mean-square norm is judged against
that instead: a row that cancels to almost nothing (a layer norm's input gradient over three columns) is
not divided by almost nothing. A row of zeros or a scaled row of ordinary norm is judged as it is."""


def bounds(dtype: str, tolerance: float | None = None) -> tuple[float, float]:
    """(normwise bound, row bound) for `dtype`; a variant's own `tolerance` replaces the normwise bound and
    scales the row bound alike."""
    tol, row = TOLERANCE[dtype], ROW_TOLERANCE[dtype]
    if tolerance is None:
        return tol, row
    return tolerance, row * tolerance / tol if tol else max(row, tolerance)


def overridden(dtype: str, tolerance: float | None) -> bool:
    """Whether a variant's own tolerance is far above its dtype's bound (`OVERRIDE_FLAG`)."""
    return tolerance is not None and tolerance > OVERRIDE_FLAG * max(TOLERANCE[dtype], 1e-12)
