"""Validate 1,000 cases (copies of softmax_fusion, new ids, one kernel module) in-process and via the CLI.

Run: python benchmarks/validate_1000.py  (exit status 1 if either takes longer than BUDGET_S)
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from casebook.validate import validate  # noqa: E402

CASES = 1000
BUDGET_S = 3.0
"""Wall-clock budget for each way of validating the 1,000 cases, on a 2-core machine."""


def make_book(root: Path, n: int) -> Path:
    """`root/cases/case_NNNN.yaml`: n copies of the softmax case, each with its own id."""
    text = (REPO / "cases" / "softmax_fusion.yaml").read_text()
    cases = root / "cases"
    cases.mkdir()
    for i in range(n):
        name = f"case_{i:04d}"
        (cases / f"{name}.yaml").write_text(text.replace("\nid: softmax_fusion\n", f"\nid: {name}\n"))
    return cases


def main() -> int:
    with tempfile.TemporaryDirectory() as tmp:
        cases = make_book(Path(tmp), CASES)

        start = time.perf_counter()
        report = validate([cases])
        in_process_s = time.perf_counter() - start
        assert len(report.cases) == CASES and not report.problems, report.problems[:3]

        start = time.perf_counter()
        proc = subprocess.run([sys.executable, "-m", "casebook.cli", "validate", str(cases)], cwd=REPO,
                              capture_output=True, text=True)
        cli_s = time.perf_counter() - start
        assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]

    print(f"validate, in-process:                  {CASES} cases in {in_process_s:.2f} s "
          f"({in_process_s / CASES * 1e3:.2f} ms per case)")
    print(f"casebook validate, subprocess:         {CASES} cases in {cli_s:.2f} s (start-up included)")
    ok = max(in_process_s, cli_s) < BUDGET_S
    print(f"budget {BUDGET_S:.0f} s: {'met' if ok else 'MISSED'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
