"""How `casebook build` scales with the number of cases: 10, 100 and 300 copies of softmax_fusion.

Each copy gets a new id and a copy of the fixture results (an H200 and a CPU result, hashed so that
they are fresh), in a temporary folder; the real cases/ and results/ are untouched. Cold: no plot
cache. Warm: the same build again, every plot from the cache (what `casebook serve` sees on an edit).

    python benchmarks/build_scaling.py             # 10 100 300
    python benchmarks/build_scaling.py 10 50 --workers 1
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "tests")]

from site_helpers import build_site, copy_results, env  # noqa: E402

SOURCE = REPO / "cases" / "softmax_fusion.yaml"


def make_book(root: Path, n: int) -> tuple[Path, Path]:
    cases, results = root / "cases", root / "results"
    cases.mkdir(parents=True)
    text = SOURCE.read_text()
    for i in range(n):
        case_id = f"softmax_copy_{i:03d}"
        (cases / f"{case_id}.yaml").write_text(text.replace("\nid: softmax_fusion\n", f"\nid: {case_id}\n"))
        copy_results(results, cases, case_id="softmax_fusion", as_id=case_id)
    return cases, results


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("sizes", nargs="*", type=int, default=[10, 100, 300])
    ap.add_argument("--workers", type=int, default=0, help="plot worker processes (0: min(2, cores))")
    args = ap.parse_args()
    print(f"{'cases':>6} {'pages':>6} {'images':>7} {'cold s':>8} {'warm s':>8}")
    for n in args.sizes:
        with tempfile.TemporaryDirectory() as tmp:
            root = Path(tmp)
            cases, results = make_book(root, n)
            cache = root / "plot-cache"
            with env(CASEBOOK_WORKERS=str(args.workers)):
                times = []
                for _ in range(2):  # cold (empty cache), then warm
                    start = time.perf_counter()
                    if build_site(cases, results, root / "site", cache) != 0:
                        raise SystemExit(f"build of {n} cases failed")
                    times.append(time.perf_counter() - start)
            pages = len(list((root / "site").rglob("index.html")))
            images = len(list((root / "site" / "img").rglob("*.svg")))
            print(f"{n:>6} {pages:>6} {images:>7} {times[0]:>8.1f} {times[1]:>8.1f}", flush=True)


if __name__ == "__main__":
    main()
