#!/usr/bin/env bash
# The transpose's memory efficiency beyond DRAM bytes, per variant, at 16384 x 16384 bf16 (the claim's
# shape): sectors per request of global loads and stores (4 is a warp's coalesced 4-byte access; a
# naive strided 2-byte write reads up to 32), L2 sectors written, DRAM bytes, and shared-memory bank
# conflicts of the tiled kernels' turn. One call per variant under ncu, through casebook.run.counters'
# child (warm-up, then one call between profiler marks). Run on a GPU from the repository root:
#   bash benchmarks/transpose_sectors.sh OUT_DIR
set -uo pipefail
out=${1:-/tmp/transpose_sectors}
mkdir -p "$out"
ncu=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
[ -n "$ncu" ] || { echo "ncu not found" >&2; exit 2; }
metrics=dram__bytes_read.sum,dram__bytes_write.sum,\
l1tex__t_requests_pipe_lsu_mem_global_op_ld.sum,l1tex__t_sectors_pipe_lsu_mem_global_op_ld.sum,\
l1tex__t_requests_pipe_lsu_mem_global_op_st.sum,l1tex__t_sectors_pipe_lsu_mem_global_op_st.sum,\
lts__t_sectors_srcunit_tex_op_write.sum,lts__t_sectors_srcunit_tex_op_read.sum,\
l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum,l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_st.sum,\
gpu__time_duration.sum
for v in copy torch_contiguous naive_write_strided naive_read_strided tiled tiled_tuned tma; do
  spec="{\"module\": \"transpose\", \"fn\": \"$v\", \"inputs\": \"make_inputs\", \"traffic\": \"traffic\",
         \"shape\": {\"batch\": 1, \"rows\": 16384, \"cols\": 16384, \"inner\": 1}, \"dtype\": \"bf16\"}"
  timeout 120 "$ncu" --clock-control none --profile-from-start off --csv --metrics "$metrics" \
    python3 -m casebook.run.counters "$spec" > "$out/$v.csv" 2> "$out/$v.err"
  echo "$v: exit $?"
  python3 - "$out/$v.csv" <<'PY'
import csv, io, sys
rows = [r for r in csv.DictReader(io.StringIO("\n".join(l for l in open(sys.argv[1]) if l.startswith('"'))))]
tot = {}
for r in rows:
    scale = {"kbyte": 1e3, "mbyte": 1e6, "gbyte": 1e9}.get(r.get("Metric Unit", "").lower(), 1)
    tot[r["Metric Name"]] = tot.get(r["Metric Name"], 0.0) + scale * float(r["Metric Value"].replace(",", ""))
g = lambda k: tot.get(k, 0.0)
ld = g("l1tex__t_sectors_pipe_lsu_mem_global_op_ld.sum") / max(g("l1tex__t_requests_pipe_lsu_mem_global_op_ld.sum"), 1)
st = g("l1tex__t_sectors_pipe_lsu_mem_global_op_st.sum") / max(g("l1tex__t_requests_pipe_lsu_mem_global_op_st.sum"), 1)
print(f"  sectors/request: load {ld:.1f}, store {st:.1f}; L2 sectors written {g('lts__t_sectors_srcunit_tex_op_write.sum'):.3g},"
      f" read {g('lts__t_sectors_srcunit_tex_op_read.sum'):.3g}; DRAM read {g('dram__bytes_read.sum'):.3g} B,"
      f" write {g('dram__bytes_write.sum'):.3g} B (model 5.37e8 each); shared bank conflicts ld"
      f" {g('l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum'):.3g}, st"
      f" {g('l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_st.sum'):.3g}")
PY
done
