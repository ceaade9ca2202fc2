#!/usr/bin/env bash
# The GPU work of a session in a few full device calls (each under the 10-minute limit), with what
# earlier sessions learned: inputs on the device, one tarball back (the device returns 8 files at most),
# a checkpoint per variant so a call cut short still returns what it measured.
#
# Run on the device from the repository root, after the wheel install line:
#   bash benchmarks/gpu_session.sh softmax     # full softmax ladder + ncu counters + do_bench cross-check
#   bash benchmarks/gpu_session.sh gemm        # gemm_tiled and gemm_epilogue
#   bash benchmarks/gpu_session.sh grouped     # gemm_grouped, then softmax again (run-to-run agreement)
# Then, here: tar -xzf <files_at>/results.tgz, compare, commit results/nvidia-h200/*.json.
set -uo pipefail
out=${OUT:-/tmp/out}
mkdir -p "$out/results" "$out/logs"
export CASEBOOK_CACHE="$out/cache" PYTHONUNBUFFERED=1

run_case() {  # run_case CASE SECONDS [ARGS...]
  local case=$1 limit=$2
  shift 2
  timeout "$limit" python3 -m casebook.cli run "cases/$case.yaml" --results "$out/results" "$@" \
    > "$out/logs/$case.txt" 2> "$out/logs/$case.err"
  echo "$case: exit $?"
  grep -A20 '^Claims' "$out/logs/$case.txt" | head -12
}

case "${1:-}" in
  softmax)
    run_case softmax_fusion 480 --counters
    timeout 60 python3 benchmarks/harness_vs_do_bench.py "$out/logs/dobench.json" > "$out/logs/dobench.txt" 2>&1
    tail -6 "$out/logs/dobench.txt" ;;
  gemm)
    run_case gemm_tiled 280
    run_case gemm_epilogue 280 ;;
  grouped)
    run_case gemm_grouped 280
    mkdir -p "$out/rerun"
    timeout 260 python3 -m casebook.cli run cases/softmax_fusion.yaml --results "$out/rerun" \
      > "$out/logs/softmax_rerun.txt" 2>&1
    echo "softmax rerun: exit $?" ;;
  *) echo "usage: $0 softmax|gemm|grouped" >&2; exit 2 ;;
esac
tar -czf "$out/results.tgz" -C "$out" results logs $(test -d "$out/rerun" && echo rerun)
rm -rf "$out/results" "$out/logs" "$out/rerun" "$out/cache"
ls -la "$out"
