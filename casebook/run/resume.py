"""What of a run cut short a new run keeps (`casebook run --resume`): its points measured with the same
code, case, harness, machine and protocol."""

from __future__ import annotations

from casebook.case import Case
from casebook.result import Machine, Point, Result, shape_label
from casebook.run import hardware
from casebook.run.bench import Protocol

REUSED = ("ok", "checked", "failed", "skipped")
"""Statuses of a kept run's points that a resumed run keeps: each was measured, or told why it could not be;
a crash or a timeout is tried again."""


RESUME_PROTOCOL = ("warmup_ms", "min_reps", "max_reps", "target_ci", "time_cap_s")
"""What of the timing protocol a kept run must share (its cache and graph are the case's, which
`measurement_sha256` covers)."""


def resumable(kept: Result, case: Case, ident: Machine, protocol: Protocol,
              sources: dict) -> tuple[dict[tuple, Point], str | None]:
    """The points of `kept` a run of `case` here may keep, by `point_key`, as the judge made them (without what the
    run's levels add: speedup, weight, source); or why none: another case, kernel code, measured part of the case,
    harness, machine or timing protocol."""
    differs = [what for what, a, b in (
        ("case", kept.case_id, case.id),
        ("kernel code (kernel_sha256)", kept.kernel_sha256, sources["kernel_sha256"]),
        ("case's kernel, levels or claims (measurement_sha256)", kept.measurement_sha256,
         sources["measurement_sha256"]),
        ("harness (casebook_sha256)", kept.environment.casebook_sha256, hardware.source_sha256()),
        ("machine", kept.hardware.slug, ident.slug),
        ("timing protocol", [getattr(kept.protocol, k) for k in RESUME_PROTOCOL],
         [getattr(protocol, k) for k in RESUME_PROTOCOL])) if a != b]
    if differs:
        return {}, "another " + ", ".join(differs)
    out = {}
    for level, points in (("kernel", kept.kernel_level), ("workload", kept.workload_level.points)):
        for p in points:
            if p.status in REUSED:
                judged = {k: getattr(p, k) for k in p.model_fields_set - {"speedup", "weight", "source"}}
                out[point_key(level, p.variant, p.shape, p.dtype)] = Point(**judged)
    return out, None


def point_key(level: str, variant: str, shape: dict, dtype: str) -> tuple:
    return (level, variant, shape_label(shape), dtype)
