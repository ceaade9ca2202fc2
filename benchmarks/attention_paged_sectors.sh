#!/usr/bin/env bash
# attention_paged's access order beyond DRAM bytes, by page size: sectors per request of the global loads (a
# warp's coalesced 16-byte loads of a 256-byte K/V row fill whole 32-byte sectors), L2 sectors read and DRAM
# bytes against the model, for the contiguous kernel and the paged ones at B = 8, L = 32K, pages shuffled.
# One call per (variant, page size) under ncu, through casebook.run.counters' child (warm-up, then one call
# between profiler marks). Run on a GPU from the repository root:
#   bash benchmarks/attention_paged_sectors.sh OUT_DIR
set -uo pipefail
out=${1:-/tmp/attention_paged_sectors}
mkdir -p "$out"
ncu=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
[ -n "$ncu" ] || { echo "ncu not found" >&2; exit 2; }
metrics=dram__bytes_read.sum,l1tex__t_requests_pipe_lsu_mem_global_op_ld.sum,\
l1tex__t_sectors_pipe_lsu_mem_global_op_ld.sum,lts__t_sectors_srcunit_tex_op_read.sum,gpu__time_duration.sum
for run in contiguous:16 triton_paged_static:8 triton_paged_static:16 triton_paged_static:32 \
           triton_paged_static:64 triton_paged_static:128 triton_paged_split:8 triton_paged_split:16; do
  v=${run%%:*} page=${run##*:}
  spec="{\"module\": \"attention_paged\", \"fn\": \"$v\", \"inputs\": \"make_inputs\", \"traffic\": \"traffic\",
         \"shape\": {\"batch\": 8, \"heads\": 32, \"kv_heads\": 8, \"seq_kv\": 32768, \"head_dim\": 128,
                    \"page_size\": $page, \"order\": 3}, \"dtype\": \"bf16\"}"
  timeout 100 "$ncu" --clock-control none --profile-from-start off --csv --metrics "$metrics" \
    python3 -m casebook.run.counters "$spec" > "$out/$v-$page.csv" 2> "$out/$v-$page.err"
  echo "$v, $page-token pages: exit $?"
  python3 - "$out/$v-$page.csv" <<'PY'
import csv, io, sys
rows = csv.DictReader(io.StringIO("\n".join(l for l in open(sys.argv[1]) if l.startswith('"'))))
tot = {}
for r in rows:  # every kernel of the call summed (the gather's copies, a split's merge)
    scale = {"kbyte": 1e3, "mbyte": 1e6, "gbyte": 1e9, "usecond": 1e-3, "msecond": 1}.get(r.get("Metric Unit", "").lower(), 1)
    tot[r["Metric Name"]] = tot.get(r["Metric Name"], 0.0) + scale * float(r["Metric Value"].replace(",", ""))
g = lambda k: tot.get(k, 0.0)
ld = g("l1tex__t_sectors_pipe_lsu_mem_global_op_ld.sum") / max(g("l1tex__t_requests_pipe_lsu_mem_global_op_ld.sum"), 1)
print(f"  sectors/request (loads) {ld:.2f}; L2 sectors read {g('lts__t_sectors_srcunit_tex_op_read.sum'):.4g};"
      f" DRAM read {g('dram__bytes_read.sum'):.4g} B (model 1.074e9 + the table); kernel time"
      f" {g('gpu__time_duration.sum'):.4g} (ncu's unit)")
PY
done
