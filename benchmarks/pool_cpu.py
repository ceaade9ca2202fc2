"""The whole book's CPU run, serial against the pool of two workers (issue 30's benchmark; not a timed test).

Serial is `casebook run --all --devices 0`: one worker, on every core, one case after another. The pool is
`--devices 0,1`: two workers side by side, each pinned to its half of the cores. Each gets a cache of its
own (Inductor compiles afresh in both), seeded with the same measured ceilings, and keeps its runs there;
results/ is untouched. The load average is printed before and after each, since on a shared machine the
ratio means little without it.

    python benchmarks/pool_cpu.py                  # every case under cases/
    python benchmarks/pool_cpu.py cases/rmsnorm.yaml cases/layernorm.yaml
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def load() -> str:
    return " ".join(f"{v:.2f}" for v in os.getloadavg())


def run(cases: list[str], devices: str, cache: Path) -> dict:
    cmd = [sys.executable, "-m", "casebook.cli", "run", *(cases or ["--all"]), "--devices", devices, "--json"]
    env = {**os.environ, "CASEBOOK_CACHE": str(cache)}
    env.pop("CASEBOOK_FAKE_DEVICES", None)
    before, start = load(), time.monotonic()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    wall = time.monotonic() - start
    out = proc.stdout
    rows = json.loads(out[out.index("["):out.rindex("]") + 1]) if "[" in out else []
    return {"devices": devices, "wall_s": wall, "exit": proc.returncode, "load_before": before, "load_after": load(),
            "cases": [(Path(r["case"]).stem, r["status"], r["where"], r["seconds"]) for r in rows],
            "stderr_tail": proc.stderr[-2000:] if proc.returncode not in (0, 1) else ""}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("cases", nargs="*", help="case YAMLs (default: --all)")
    args = ap.parse_args()
    root = Path(tempfile.mkdtemp(prefix="pool-cpu-"))
    seed = root / "seed"
    seed.mkdir()
    subprocess.run([sys.executable, "-m", "casebook.cli", "hardware"], env={**os.environ, "CASEBOOK_CACHE": str(seed)},
                   check=True, capture_output=True)
    if not list(seed.glob("ceilings-*.json")):  # measured on a busy machine: never cached, so measured in each run
        print("the ceilings were measured busy and not cached: each run measures its own, once, before its cases")
    uptime = subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    print(f"cores {len(os.sched_getaffinity(0))}; uptime: {uptime}")
    runs = []
    for devices in ("0", "0,1"):
        cache = root / f"cache-{devices.replace(',', '-')}"
        shutil.copytree(seed, cache, dirs_exist_ok=True)
        r = run(args.cases, devices, cache)
        runs.append(r)
        print(f"--devices {devices}: {r['wall_s']:.0f} s wall, exit {r['exit']}, load {r['load_before']} -> "
              f"{r['load_after']}")
        for name, status, where, seconds in r["cases"]:
            print(f"  {name:22s} {status:8s} {where:12s} {seconds:7.1f} s")
        if r["stderr_tail"]:
            print(r["stderr_tail"])
    serial, pool = runs
    print(f"serial {serial['wall_s']:.0f} s, pool of two {pool['wall_s']:.0f} s: "
          f"{serial['wall_s'] / pool['wall_s']:.2f}x")
    shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
