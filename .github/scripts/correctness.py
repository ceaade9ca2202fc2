"""Read the results of a CPU run and fail on wrong answers only: the pull-request job's verdict.

    python .github/scripts/correctness.py RESULTS_DIR CASE_ID...

On a machine without a GPU, `casebook run` checks the Triton variants through the interpreter and
times the CPU ones. This job asks one question of it: is every variant correct? A wrong answer, a
crash, a timeout or a failed end-to-end scenario fails the job (a GitHub error annotation on the case
file). Timings on a shared CPU runner prove nothing, so a failed claim or a time under the roofline
floor is a warning here; the GPU run and `casebook check` on the committed results judge those.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def verdict(doc: dict) -> tuple[list[str], list[str]]:
    """(errors, warnings) for one result document."""
    errors, warnings = [], []
    points = doc.get("kernel_level", []) + doc.get("workload_level", {}).get("points", [])
    for p in points:
        where = f"{p.get('variant')} {'x'.join(map(str, p.get('shape', {}).values()))} {p.get('dtype')}"
        if p.get("correct") is False or p.get("status") in ("crashed", "timeout"):
            errors.append(f"{where}: {p.get('status')}: {p.get('error')}")
        elif p.get("status") == "failed":
            warnings.append(f"{where}: {p.get('error')}")
    e2e = doc.get("end_to_end", {})
    if e2e.get("status") == "failed":
        errors.append(f"end to end: {e2e.get('error')}")
    for c in doc.get("claims", []):
        if c.get("held") is False:
            warnings.append(f"claim {c.get('text')!r} failed on this CPU runner: {c.get('detail')}")
    return errors, warnings


def main(argv: list[str]) -> int:
    if len(argv) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    results, ids = Path(argv[0]), argv[1:]
    failed = False
    for case_id in ids:
        where = f"file=cases/{case_id}.yaml"
        found = sorted(results.glob(f"*/{case_id}.json"))
        if not found:
            print(f"::error {where}::{case_id}: no result: the run did not finish (see its log above)")
            failed = True
            continue
        for path in found:
            errors, warnings = verdict(json.loads(path.read_text()))
            for w in warnings:
                print(f"::warning {where}::{case_id}: {w}")
            for e in errors:
                print(f"::error {where}::{case_id}: {e}")
            failed |= bool(errors)
            print(f"{case_id}: {'WRONG' if errors else 'correct'} ({path})")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
