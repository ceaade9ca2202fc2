"""Move stored results from the first measurement-hash rule to the rule by meaning, where the first held.

The first rule hashed the kernel, levels and claims as `model_dump` wrote them (every default included,
a variant's `reference` left out while unset); the rule by meaning (`provenance.measurement_sha256`)
omits every field at its default. A result whose recorded hash equals the first rule's hash of its case
as it stands was current then; it is re-stamped with the new hash, and nothing else in it changes. A
result that was stale under the first rule is left stale, and one already on the new rule is left alone.

    python benchmarks/restamp_measurement_sha256.py [results-dir] [cases-dir]
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

from casebook import load, provenance


def first_rule_sha256(case) -> str:
    """The measurement hash as results recorded it before the rule by meaning (verbatim)."""
    kernel = case.kernel.model_dump(mode="json")
    for variant in kernel["variants"]:
        if variant.get("reference") is None:
            variant.pop("reference", None)
    spec = {"kernel": kernel, "levels": case.levels.model_dump(mode="json"),
            "claims": [c.model_dump(mode="json") for c in case.claims]}
    return hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()


def restamp(result_path: Path, cases_dir: Path) -> str:
    """Re-stamp one stored result if the first rule held for it; say what was done."""
    text = result_path.read_text()
    recorded = json.loads(text).get("measurement_sha256")
    case_path = cases_dir / f"{json.loads(text)['case_id']}.yaml"
    if recorded is None or not case_path.is_file():
        return "left alone (no measurement hash, or no case)"
    case = load.load_case(case_path)
    new = provenance.measurement_sha256(case)
    if recorded == new:
        return "already on the rule by meaning"
    if recorded != first_rule_sha256(case):
        return "left stale (stale under the first rule too)"
    line = f'"measurement_sha256": "{recorded}"'
    assert text.count(line) == 1, f"{result_path}: expected one {line}"
    result_path.write_text(text.replace(line, f'"measurement_sha256": "{new}"'))
    return f"re-stamped {recorded[:12]} -> {new[:12]}"


def main() -> None:
    results_dir = Path(sys.argv[1] if len(sys.argv) > 1 else "results")
    cases_dir = Path(sys.argv[2] if len(sys.argv) > 2 else "cases")
    for path in sorted(results_dir.glob("*/*.json")):
        print(f"{path}: {restamp(path, cases_dir)}")


if __name__ == "__main__":
    main()
