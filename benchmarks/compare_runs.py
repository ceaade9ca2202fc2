"""Kept for the commands in earlier notes: the comparison is `casebook compare A.json B.json` now.

    python benchmarks/compare_runs.py A.json B.json [--min-us 20] [--within 0.02]
"""

import sys

from casebook.cli import app

if __name__ == "__main__":
    sys.argv[0:1] = ["casebook", "compare"]
    app()
