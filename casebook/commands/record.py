"""`casebook record RUN.json` (and `casebook run --save`): store a run as `results/<hardware>/<case>.json`.

The one act that changes the repository's results. A stored result that is current (measured from the
case and kernel as they are) is replaced by a slower or noisier run only with `--force`: a newcomer's
first run on a busy or slower machine must not silently overwrite the book's measurement.
"""

from __future__ import annotations

from pathlib import Path

from rich.console import Console

from casebook.result import Result

SLOWER = 0.02
"""A run whose medians are, by geometric mean over the points timed in both, more than this much slower
than the stored result's counts as slower (the 2% that `casebook compare` tolerates as noise)."""


def unstable_count(result: Result) -> int:
    return sum(1 for p in result.kernel_level + result.workload_level.points if p.unstable)


def refusal(new: Result, stored: Result, stored_current: bool) -> str | None:
    """Why `new` may not replace `stored` without --force (None: it may)."""
    from casebook.commands.compare import agreement

    if not stored_current:
        return None
    if unstable_count(new) < unstable_count(stored):  # the stored one is not publishable: a steadier run replaces it
        return None
    why = []
    ratio = agreement(stored, new, min_us=0.0).geomean_ratio
    if ratio is not None and ratio > 1 + SLOWER:
        why.append(f"its medians are {ratio:.2f}x the stored ones (geometric mean over the points timed in both)")
    if unstable_count(new) > unstable_count(stored):
        why.append(f"it has {unstable_count(new)} unstable point(s), the stored result {unstable_count(stored)}")
    return "; ".join(why) or None


def is_current(stored: Result, case_path: Path) -> bool:
    """Whether a stored result was measured from the case file and kernel module as they are now."""
    from casebook import provenance
    from casebook.load import CaseError, load_case

    try:
        case = load_case(case_path)
    except (CaseError, OSError):
        return False
    return not provenance.stale_reasons(stored, case_path, case)


def store(result: Result, results_dir: Path, case_path: Path, force: bool, out: Console) -> int:
    """Write `result` to `results_dir`, unless it would replace a current, better stored result without `force`."""
    from casebook import results

    target = results.result_path(results_dir, result.hardware.slug, result.case_id)
    if target.exists() and not force:
        stored = results.load(target)
        why = refusal(result, stored, is_current(stored, case_path))
        if why:
            out.print(f"not stored: {target} is current and this run is worse ({why}); "
                      "pass --force to replace it", highlight=False)
            return 1
    out.print(f"stored [bold]{results.save(result, results_dir)}[/bold]", highlight=False)
    for why in unpublished(result, case_path):
        out.print(f"  `casebook check` will refuse it: it {why}", highlight=False)
    return 0


def unpublished(result: Result, case_path: Path) -> list[str]:
    """Why `casebook check` will refuse the stored `result` (empty: it will not, for these reasons): stored as asked,
    it is said at once, not found at the next check."""
    from casebook.load import CaseError, load_case
    from casebook.validate import unpublishable

    try:
        return unpublishable(load_case(case_path), result)
    except (CaseError, OSError):
        return []


def main(run: Path, results_dir: Path, force: bool, case: Path | None = None) -> int:
    """Record one run's JSON; its case file defaults to `<results_dir>/../cases/<case-id>.yaml`."""
    from casebook import results

    out = Console(highlight=False)
    try:
        result = results.load(run)
    except ValueError as e:  # unreadable, newer than this casebook, or not a result
        out.print(f"cannot record: {e}")
        return 2
    if result.complete is False:
        out.print(f"cannot record: {run} is a checkpoint of a run cut short, not a whole run")
        return 2
    case = case or Path(results_dir).absolute().parent / "cases" / f"{result.case_id}.yaml"
    return store(result, Path(results_dir), case, force, out)
