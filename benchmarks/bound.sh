#!/usr/bin/env bash
# Which resource binds a kernel that sits under both roofs: Nsight Compute's speed of light (SM, memory, DRAM, L2,
# L1), the busiest pipes, occupancy and what limits it, and the warp-stall reasons, for each kernel of one call of
# a case's variant at one shape (warmed up, then one call between profiler marks: casebook.run.counters' child).
# Run on a GPU from the repository root:
#   bash benchmarks/bound.sh OUT MODULE FN 'SHAPE_JSON' [DTYPE]
#   bash benchmarks/bound.sh /tmp/bound attention_prefix triton_cascade_fused \
#     '{"batch": 64, "heads": 32, "kv_heads": 8, "prefix": 32768, "suffix": 256, "head_dim": 128}'
# OUT/<FN>.csv keeps ncu's raw page (every metric the sections collected); the summary is printed.
set -uo pipefail
out=${1:?usage: $0 OUT MODULE FN SHAPE_JSON [DTYPE]}
module=${2:?module}
fn=${3:?variant function}
shape=${4:?shape as JSON}
dtype=${5:-bf16}
mkdir -p "$out"
ncu=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
[ -n "$ncu" ] || { echo "ncu not found" >&2; exit 2; }
spec="{\"module\": \"$module\", \"fn\": \"$fn\", \"inputs\": \"make_inputs\", \"traffic\": \"traffic\",
       \"shape\": $shape, \"dtype\": \"$dtype\"}"
sections=()
for s in SpeedOfLight Occupancy LaunchStats WarpStateStats ComputeWorkloadAnalysis MemoryWorkloadAnalysis; do
  sections+=(--section "$s")
done
timeout "${BOUND_S:-240}" "$ncu" --clock-control none --profile-from-start off --csv --page raw "${sections[@]}" \
  python3 -m casebook.run.counters "$spec" > "$out/$fn.csv" 2> "$out/$fn.err"
echo "$module.$fn: exit $?"
python3 - "$out/$fn.csv" <<'PY'
import csv, io, re, sys

lines = [line for line in open(sys.argv[1]) if line.startswith('"')]
rows = list(csv.reader(io.StringIO("".join(lines))))
if not rows:
    sys.exit("  no kernel profiled (see the .err file)")
head = rows[0]
units = next((dict(zip(head, r)) for r in rows[1:] if r and not r[0].strip()), {})  # the units row has no ID
rows = [r for r in rows[1:] if r and r[0].strip()]
TO_US = {"nsecond": 1e-3, "usecond": 1.0, "msecond": 1e3, "second": 1e6}


def num(v):
    try:
        return float(v.replace(",", ""))
    except ValueError:
        return None


SOL = {"SM": "sm__throughput.avg.pct_of_peak_sustained_elapsed",
       "memory": "gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed",
       "DRAM": "dram__throughput.avg.pct_of_peak_sustained_elapsed",
       "L2": "lts__throughput.avg.pct_of_peak_sustained_elapsed",
       "L1": "l1tex__throughput.avg.pct_of_peak_sustained_active"}
for r in rows:
    m = dict(zip(head, r))
    name = m.get("Kernel Name", "?")[:70]
    dur = (num(m.get("gpu__time_duration.sum", "")) or 0.0) * TO_US.get(units.get("gpu__time_duration.sum"), 1e-3)
    sol = ", ".join(f"{k} {num(m[v]):.0f}%" for k, v in SOL.items() if v in m and num(m[v]) is not None)
    print(f"  {name}: {dur:.1f} us; speed of light: {sol or 'not collected'}")
    pipes = sorted(((num(v), re.sub(r"\.avg\.pct.*|sm__(inst_executed_)?pipe_", "", k)) for k, v in m.items()
                    if re.match(r"sm__(inst_executed_)?pipe_\w+.*pct_of_peak_sustained_active$", k)
                    and num(v) is not None), reverse=True)[:4]
    print("    busiest pipes: " + (", ".join(f"{n} {v:.0f}%" for v, n in pipes) or "not collected"))
    occ = [(k, m[v]) for k, v in (("achieved", "sm__warps_active.avg.pct_of_peak_sustained_active"),
                                  ("theoretical", "sm__maximum_warps_per_active_cycle_pct"),
                                  ("registers/thread", "launch__registers_per_thread"),
                                  ("shared/block", "launch__shared_mem_per_block_dynamic")) if v in m]
    limits = [(k.replace("launch__occupancy_limit_", ""), num(v)) for k, v in m.items()
              if k.startswith("launch__occupancy_limit_") and num(v) is not None]
    low = min((v for _, v in limits), default=None)
    print("    occupancy: " + ", ".join(f"{k} {v}" for k, v in occ)
          + (f"; blocks an SM limited by {', '.join(k for k, v in limits if v == low)} ({low:g})" if limits else ""))
    stalls = sorted(((num(v), re.search(r"issue_stalled_(\w+?)(_per_warp_active|_per_issue_active)?\.", k).group(1))
                     for k, v in m.items()
                     if re.match(r"smsp__average_warps?_(latency_)?issue_stalled_\w+\.(ratio|pct)", k)
                     and num(v) is not None), reverse=True)[:5]
    print("    warp stalls (cycles an issue): " + (", ".join(f"{n} {v:.2f}" for v, n in stalls) or "not collected"))
PY
