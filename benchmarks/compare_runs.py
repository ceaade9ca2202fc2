"""Run-to-run agreement of two results of one case: every point timed in both, above a floor.

    python benchmarks/compare_runs.py A.json B.json [--min-us 20] [--within 0.02]

Exits 1 when any point above --min-us differs by more than --within (issue 3's criterion).
"""

import argparse
import json

from casebook.schema import shape_label


def medians(doc: dict) -> dict:
    """(level, variant, shape, dtype) -> median, for every timed point of levels 1 and 2."""
    return {(lvl, p["variant"], shape_label(p["shape"]), p["dtype"]): p["median_us"]
            for lvl, pts in (("kernel", doc["kernel_level"]), ("workload", doc["workload_level"]["points"]))
            for p in pts if p.get("median_us")}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("a")
    ap.add_argument("b")
    ap.add_argument("--min-us", type=float, default=20.0)
    ap.add_argument("--within", type=float, default=0.02)
    args = ap.parse_args()
    a, b = (medians(json.load(open(p))) for p in (args.a, args.b))
    rows = sorted(((abs(b[k] / a[k] - 1), k, a[k], b[k]) for k in a.keys() & b.keys() if min(a[k], b[k]) > args.min_us),
                  reverse=True)
    over = [r for r in rows if r[0] > args.within]
    print(f"{len(rows)} points above {args.min_us:g} us in both; {len(rows) - len(over)} within {args.within:.0%}")
    for d, k, ma, mb in over[:10]:
        print(f"  {d:6.2%}  {' '.join(k)}: {ma:.1f} vs {mb:.1f} us")
    return 1 if over else 0


if __name__ == "__main__":
    raise SystemExit(main())
