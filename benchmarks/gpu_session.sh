#!/usr/bin/env bash
# What a GPU rented by the job runs that the book's own command does not: a case with its GPU-only tests, the
# GPU-only tests in one job, the harness's pace measured, and the book refreshed over several jobs, each a call
# under a 10-minute limit whose files come back as one tarball. Explorations are plain scripts
# (`python3 benchmarks/explore/<case>/<script>.py`, `bash benchmarks/transpose_sectors.sh OUT`), run as they are.
#
# Run on the device from the repository root, the wheels the image lacks installed (gpu_job.sh does both):
#   bash benchmarks/gpu_session.sh case CASE [TESTS [K]]  # TESTS (a tests/kernels/*_gpu.py file, -k K), then
#                                                 # `casebook run cases/CASE.yaml --save --counters`
#   bash benchmarks/gpu_session.sh gpu-tests      # every tests/kernels/*_gpu.py file (FILES: which) in one
#                                                 # pytest over WORKERS processes, what failed and why at the end
#   bash benchmarks/gpu_session.sh book           # issue 44: `casebook run --all --save --resume --counters`
#                                                 # until DEADLINE (CASES: an order), the cache carried in and back
#   bash benchmarks/gpu_session.sh bound          # issues 45-47: which resource binds the kernels they name (ncu)
#   bash benchmarks/gpu_session.sh pack           # the cache alone, as `book` packs it (a job of several steps)
#   bash benchmarks/gpu_session.sh explore        # the explorations waiting for a GPU (EXPLORE: which), timed,
#                                                 # then under ncu where they offer --once
#   bash benchmarks/gpu_session.sh pace           # issue 43: the device crossing probed, the README's main job
#                                                 # timed fresh (profiled where py-spy is installed) and cached,
#                                                 # each point's harness cost, a run cut at 60 s and resumed, the
#                                                 # quick ceilings against the thorough ones
#   bash benchmarks/gpu_session.sh pool           # on a host of several GPUs: the book side by side, one worker
#                                                 # a GPU, the table of what ran where
#   bash benchmarks/gpu_session.sh allreduce      # issue 35, on an nvidia-h200-x2 machine: the topology, the
#                                                 # launcher's tests, then allreduce_norm on its two ranks
# Then, here: tar -xzf <files_at>/results.tgz, compare, commit results/<slug>/<case>.json with its run's
# log beside it (logs/<case>.txt as <case>.run-log.txt, .err as .run-progress.txt).
set -uo pipefail
# DEADLINE (seconds from the start), where an entry honours it: when its last run must end, inside the call's
# limit, so that the tarball is still written.
out=${OUT:-/tmp/out}
mkdir -p "$out/results" "$out/logs"
# CASEBOOK_CACHE may name a folder outside $OUT, so that consecutive calls on one warm machine share the
# measured ceilings and the compiled kernels; the kept runs come back either way.
export CASEBOOK_CACHE="${CASEBOOK_CACHE:-$out/cache}" PYTHONUNBUFFERED=1
# The copy's casebook importable from every script (the image does not install it): an exploration runs as
# `python3 benchmarks/explore/<case>/<script>.py`, whose own folder, not the copy's root, starts its path
case ":${PYTHONPATH:-}:" in *":$PWD:"*) ;; *) export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" ;; esac
# Bytecode compiled once, here: the image writes none (PYTHONDONTWRITEBYTECODE, which the run's children inherit
# as -B), and each child compiled casebook and the carried wheels from source, 2.5 s a child on an H200 host
python3 -m compileall -q -j 0 casebook $(tr ':' '\n' <<< "${PYTHONPATH:-}" | grep -vx "$PWD") > /dev/null 2>&1 || true

sync_git() {  # the copy's git metadata brought to the commit its files are: the device gets today's working tree
              # beside a .git of an older commit, so `git status` compared the files with that commit and every
              # run recorded casebook_dirty. .cbcache-in/head.bundle (made here: `git bundle create
              # .cbcache-in/head.bundle BASE..HEAD`, BASE the commit the copy's .git is at, which this prints) holds
              # the commits since; the index is reset to the bundle's head and the files are left as they are, so a
              # file that differs from that commit still makes a run dirty
  [ -f .cbcache-in/head.bundle ] || return 0
  local head
  head=$(git bundle list-heads .cbcache-in/head.bundle | awk 'NR == 1 {print $1}')
  # only forward: run where the copy's commit is already the bundle's or later (a dry run here), it moves nothing
  if git fetch -q .cbcache-in/head.bundle 2>/dev/null && git merge-base --is-ancestor HEAD "$head" \
    && git reset -q "$head"; then
    echo "git: at ${head:0:12}; measured files changed since: $(git status --porcelain --untracked-files=no -- \
      casebook cases pyproject.toml | wc -l)"
  else
    echo "git: the bundle does not apply to this copy's $(git rev-parse --short HEAD 2>/dev/null); runs record it"
  fi
}
sync_git
# the machine's hardware name (nvidia-h200, nvidia-h100-sxm, ...): a call named for one kind may get another
slug=$(python3 -c 'from casebook.run.hardware import identify; print(identify().slug)' 2>/dev/null || echo unknown)
echo "machine: $slug"

run_case() {  # run_case CASE SECONDS [ARGS...]
  local case=$1 limit=$2
  shift 2
  timeout "$limit" python3 -m casebook.cli run "cases/$case.yaml" --save --results "$out/results" "$@" \
    > "$out/logs/$case.txt" 2> "$out/logs/$case.err"
  echo "$case: exit $?"
  grep -A20 '^Claims' "$out/logs/$case.txt" | head -12
  grep -iE 'failed|crashed|timeout|unstable' "$out/logs/$case.txt" | grep -v '^  FAILED' | head -8
}

carry_in() {  # carry_in NAME...: each .cbcache-in/NAME.tgz(.part-*) a call brought back, whole, into the cache,
              # once a machine: a later call on the same warm machine keeps the runs it has carried on since
  local name
  for name in "$@"; do
    ls .cbcache-in/"$name".tgz* >/dev/null 2>&1 || continue
    [ -e "$CASEBOOK_CACHE/.carried-$name" ] && continue
    mkdir -p "$CASEBOOK_CACHE" && cat .cbcache-in/"$name".tgz* | tar -xz -C "$CASEBOOK_CACHE" \
      && touch "$CASEBOOK_CACHE/.carried-$name" && echo "cache: $name carried in"
  done
}

pack_cache() {  # the cache, whole (Triton recompiles a kernel missing any file), in parts small enough to come back;
                # of the kept runs only those cut short (`--resume` continues them): the complete ones come back in
                # results.tgz, where `casebook record` can store one the call's limit ended before its save
  tar -czf "$out/cache.tgz" -C "$CASEBOOK_CACHE" --exclude='./runs/*/*/*.json' . 2>/dev/null
  if [ "$(stat -c %s "$out/cache.tgz")" -gt 15000000 ]; then
    split -b 15000000 "$out/cache.tgz" "$out/cache.tgz.part-" && rm "$out/cache.tgz"
  fi
}

marked() {  # marked NAME: whether `run_once NAME` ended on this machine already
  [ -e "/tmp/.explored-$1" ]
}
run_once() {  # run_once NAME LOG CMD...: CMD into LOG until $end, its exit code in $code; once a machine: one that
              # ended (however it ended) is marked in /tmp, so the next call on the same warm machine goes on with
              # the rest; one the call's time cut (timeout's 124) is not, and runs again from its start
  local name=$1 log=$2
  shift 2
  timeout $((end - SECONDS)) "$@" > "$log" 2>&1
  code=$?
  [ $code = 124 ] || touch "/tmp/.explored-$name"
}
cost_of_kept() {  # cost_of_kept NAME: the softmax run kept last, its harness cost a point and its medians against
                  # the committed result
  local kept
  kept=$(ls -t "$CASEBOOK_CACHE/runs/$slug"/softmax_fusion/*.json* | head -1)
  python3 benchmarks/harness_overhead.py "$kept" --points > "$out/logs/overhead_$1.txt" 2>&1
  tail -1 "$out/logs/overhead_$1.txt"
  if [ -f "results/$slug/softmax_fusion.json" ]; then
    python3 -m casebook.cli compare "results/$slug/softmax_fusion.json" "$kept" > "$out/logs/compare_$1.txt" 2>&1
    tail -3 "$out/logs/compare_$1.txt"
  else
    echo "compare: no committed softmax result for $slug"
  fi
}

case "${1:-}" in
  case)  # a case: its GPU-only tests first where named (they compile what the run will time), then the run
    name=${2:?usage: $0 case CASE [TESTS [K]]}
    if [ -n "${3:-}" ]; then
      timeout 180 python3 -m pytest -q -x ${4:+-k "$4"} "$3" > "$out/logs/gpu_pytest.txt" 2>&1
      echo "gpu pytest: exit $?"; tail -3 "$out/logs/gpu_pytest.txt"
    fi
    python3 -c 'import liger_kernel' 2>/dev/null || echo "liger-kernel missing: its rungs will be skipped"
    run_case "$name" $((${DEADLINE:-580} - SECONDS)) --counters ;;
  gpu-tests)  # every GPU-only test file (FILES: which) in one pytest spread over WORKERS processes (pytest-xdist,
             # which the image has): compiling, not the GPU, takes their time, and one file after another took
             # the ~970 tests past a 10-minute job on an H100 (72-82 s a file cut six files of eight; spread, all
             # ran in 151 s). Each verdict is printed as it ends (-v), so a call's limit still names what failed
    end=${DEADLINE:-570}
    files=(${FILES:-tests/kernels/*_gpu.py})
    spread=(); python3 -c 'import xdist' 2>/dev/null && spread=(-n "${WORKERS:-8}" --dist loadgroup)
    start=$SECONDS
    CASEBOOK_TEST_MEMORY="$out/logs/memory" timeout $((end - SECONDS)) python3 -m pytest -v --tb=short \
      -p no:cacheprovider -rfE --durations=25 "${spread[@]}" "${files[@]}" > "$out/logs/gpu_tests.txt" 2>&1
    echo "gpu-tests (${spread[*]:-one process}): exit $? in $((SECONDS - start)) s: $(tail -1 "$out/logs/gpu_tests.txt")"
    # where the card's memory went (tests/conftest.py): the largest peaks, and what a process held after a test
    cat "$out"/logs/memory.* 2>/dev/null | sort -t$'\t' -k2 -nr | head -12 | awk -F'\t' '{printf "peak %.1f GB, held after %.1f GB: %s\n", $2/1e9, $3/1e9, $1}'
    cat "$out"/logs/memory.* 2>/dev/null | awk -F'\t' '$3 > 1e9' | head -8 | awk -F'\t' '{printf "held after %.1f GB (reserved %.1f): %s\n", $3/1e9, $4/1e9, $1}'
    grep -h -E '^(FAILED|ERROR) ' "$out/logs/gpu_tests.txt" | cut -c1-300 | head -40
    grep -q '^FAILED ' "$out/logs/gpu_tests.txt" || grep -E '(FAILED|ERROR) +tests/' "$out/logs/gpu_tests.txt" | head -20 ;;
  book)  # issue 44: the book's own refresh, one command run again in each call until nothing is left. It stores
          # into this copy's results/, so a case whose committed result is current is left alone; CASES names
          # cases in the order wanted (default --all), BOOK_FLAGS more flags (--force: measured again even where
          # current); every results/<slug> file comes back in
          # results.tgz, the cache (compiled kernels, autotuning picks, the runs cut short) as cache.tgz(.part-*).
          # Carry the last call's cache compressed, as it came back: copy its cache.tgz* into .cbcache-in/ (ignored)
          # (a `pace` call's too) and name `.cbcache-in` in carry; unpacked here, a case measured before compiles
          # and tunes nothing
          # (rmsnorm: 216 s with it, 325 s without, on an H200)
    end=${DEADLINE:-540}
    carry_in cache pace
    python3 -c 'import liger_kernel' 2>/dev/null || echo "liger-kernel missing: its rungs will be skipped"
    # RESULTS: where the book stores (default this copy's results/): a folder outside the copy, e.g. under /tmp,
    # outlives the copy's refresh between calls on one warm machine, so the next call leaves alone what this one
    # stored; the copy's committed results are put there first, to be compared with and left alone where current
    stored=${RESULTS:-results}
    if [ "$stored" != results ] && [ -d "results/$slug" ]; then
      mkdir -p "$stored/$slug"
      for f in "results/$slug/"*; do [ -e "$stored/$slug/${f##*/}" ] || cp "$f" "$stored/$slug/"; done
    fi
    timeout -s TERM $((end - 45 - SECONDS)) python3 -m casebook.cli run ${CASES:---all} --save --resume --counters \
      ${BOOK_FLAGS:-} --results "$stored" >> "$out/logs/book.txt" 2>> "$out/logs/book.err"
    echo "book: exit $?"; grep -E "current \(|case\(s\) in|crashed|unplaced|kept in" "$out/logs/book.txt" "$out/logs/book.err" | tail -25
    timeout 30 python3 -m casebook.cli check > "$out/logs/check.txt" 2>&1; tail -1 "$out/logs/check.txt"
    [ -d "$stored/$slug" ] && cp -r "$stored/$slug/." "$out/results/"
    # the machine time of every case stored here so far, from the results' own records (issue 44's table)
    python3 benchmarks/harness_overhead.py "$stored/$slug"/*.json --table > "$out/logs/book_time.md" 2>&1
    cat "$out/logs/book_time.md"
    [ "${PACK:-1}" = 0 ] || pack_cache ;;  # PACK=0: a later step of the same call packs it (`pack`)
  pack) pack_cache ;;  # the cache alone, as `book` packs it
  pace)  # issue 43: the harness at the GPU's pace, on a fresh machine: the device crossing probed; the README's
         # main job timed fresh (under py-spy, every process sampled, where it is installed: where the wall time
         # goes) and again with its compiled kernels and ceilings cached; each point's harness cost, against the
         # committed result; then, as time allows, the job stopped by SIGTERM at 60 s and resumed, and the quick
         # ceilings against the thorough ones. The compile cache comes back as cache.tgz (carry it as for `book`)
    end=${DEADLINE:-560}
    nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader -lms 500 > "$out/logs/gpu_memory.csv" &
    smi=$!
    python3 -c 'import pynvml; pynvml.nvmlInit(); print("nvml: yes")' 2>/dev/null || echo "nvml: no (nvidia-smi a point)"
    if [ "${PACE_PROBE:-1}" = 1 ]; then  # PACE_PROBE=0: the crossing known, the run's own time alone wanted
      timeout 90 python3 benchmarks/explore/method/crossing_probe.py > "$out/logs/probe.txt" 2>&1
      echo "probe: exit $?"; tail -4 "$out/logs/probe.txt"
    fi
    runs=${PACE_RUNS-fresh cached}  # `cached` alone (or nothing: the cut run and its resumption alone): with the
                                    # cache a `pace` call brought back, carried in as .cbcache-in/pace.tgz*
    [ "${runs%% *}" = fresh ] || carry_in pace
    spy=(); command -v py-spy >/dev/null && spy=(py-spy record --subprocesses --idle --nonblocking --rate 20 --format raw
                                              -o "$out/logs/profile_${runs%% *}.txt" --)
    for run in $runs; do
      start=$SECONDS
      timeout $((SECONDS + 330 < end ? 330 : end - SECONDS)) "${spy[@]}" python3 -m casebook.cli run \
        cases/softmax_fusion.yaml > "$out/logs/softmax_$run.txt" 2> "$out/logs/softmax_$run.err"
      echo "softmax run ($run): exit $? in $((SECONDS - start)) s"; grep -A1 -E "tasks in|crossing" "$out/logs/softmax_$run.err"
      cost_of_kept "$run"
      spy=()
      [ $SECONDS -lt $((end - ${PACE_NEXT_S:-150})) ] || break  # PACE_NEXT_S: the least time worth a next run
    done
    if [ $SECONDS -lt $((end - 160)) ]; then
      timeout -s TERM 60 python3 -m casebook.cli run cases/softmax_fusion.yaml > "$out/logs/cut.txt" 2> "$out/logs/cut.err"
      echo "cut: exit $?"; tail -3 "$out/logs/cut.err"
      start=$SECONDS
      timeout $((end - SECONDS)) python3 -m casebook.cli run cases/softmax_fusion.yaml --resume \
        > "$out/logs/resumed.txt" 2> "$out/logs/resumed.err"
      echo "resumed: exit $? in $((SECONDS - start)) s"; grep -A1 -E "resum|tasks in" "$out/logs/resumed.err"
      cost_of_kept resumed
    fi
    if [ "${PACE_CEILINGS:-1}" = 1 ] && [ $SECONDS -lt $((end - 60)) ]; then
      timeout $((end + 25 - SECONDS)) python3 benchmarks/explore/method/ceilings_rested.py > "$out/logs/ceilings.txt" 2>&1
      echo "ceilings: exit $?"; cat "$out/logs/ceilings.txt"
    fi
    kill $smi
    pack_cache ;;
  explore)  # the explorations that wait for a GPU, in one call: each script's timings (logs/explore_<name>.txt),
            # then, where ncu is installed, the DRAM and L2 counters of those that offer `--once`; EXPLORE names
            # other scripts (paths under benchmarks/explore, a script's arguments after colons:
            # attention/decode_splits.py:--tiles), DEADLINE as for `book`
    end=${DEADLINE:-560}
    ncu_bin=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
    metrics=dram__bytes_read.sum,dram__bytes_write.sum,lts__t_sectors_op_read.sum,lts__t_sectors_op_write.sum
    metrics=$metrics,l1tex__t_sectors_pipe_lsu_mem_local_op_ld.sum,l1tex__t_sectors_pipe_lsu_mem_local_op_st.sum
    metrics=$metrics,l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_st.sum,smsp__inst_executed_op_shared_st.sum
    # Each entry once a machine (`marked`, `run_once`). The default: those whose next reading is the H200's (the rest ran on an H100 and are in the notebooks), and
    # the decode split sweep, whose claim shape (8 x 32K) any Hopper card reads before the split count changes, and
    # the norms' streamed one-pass forward and rmsnorm's lean backward (any Hopper card, in proportion to its copy)
    for entry in ${EXPLORE:-norm_backward/wide_rows.py cross_entropy/cluster_lean.py attention/decode_splits.py \
                   rmsnorm/rows_stream.py norm_backward/lean_rows.py}; do
      script=${entry%%:*}
      args=(); [ "$entry" != "$script" ] && IFS=: read -r -a args <<< "${entry#*:}"
      name=$(basename "$script" .py)$(printf '%s' "${args[@]}" | tr -c 'A-Za-z0-9_' '_')
      marked "$name" && continue
      [ $SECONDS -lt $((end - 30)) ] || { echo "$name: not run (the call's time is spent)"; continue; }
      run_once "$name" "$out/logs/explore_$name.txt" python3 "benchmarks/explore/$script" "${args[@]}"
      echo "$name: exit $code"; tail -4 "$out/logs/explore_$name.txt"
    done
    if [ -n "$ncu_bin" ]; then
      # EXPLORE_NCU: which (default the three whose reading waits for the H200; gpu_job.sh passes none elsewhere)
      for script in ${EXPLORE_NCU-norm_backward/wide_rows.py rmsnorm/onepass_warps.py transpose/tma_boxes.py}; do
        [ $SECONDS -lt $((end - 60)) ] || break
        name=$(basename "$script" .py)
        marked "ncu-$name" && continue
        run_once "ncu-$name" "$out/logs/ncu_$name.csv" "$ncu_bin" --clock-control none --metrics "$metrics" --csv \
          python3 "benchmarks/explore/$script" --once
        echo "ncu $name: exit $code"
      done
    fi ;;
  bound)  # which resource binds the kernels the issues name, under ncu (benchmarks/bound.sh), as time allows: the
          # prefix cascade at its claim shape, the TMA transpose, the persistent decode chain, CE's cluster kernel,
          # and batch-1 decode at 8K, SDPA's kernels beside the fused split's (the gap neither tile nor combine is)
    end=${DEADLINE:-560}
    while read -r module fn shape; do
      [[ "$module.$fn" =~ ${BOUND_ONLY:-.} ]] || continue  # BOUND_ONLY: a regex of module.fn, those read (default all)
      [ $SECONDS -lt $((end - 60)) ] || { echo "$module.$fn: not run (the call's time is spent)"; continue; }
      BOUND_S=$((end - SECONDS)) bash benchmarks/bound.sh "$out/logs/bound" "$module" "$fn" "$shape"
    done <<'LIST'
attention_prefix triton_cascade_fused {"batch": 64, "heads": 32, "kv_heads": 8, "prefix": 32768, "suffix": 256, "head_dim": 128}
transpose tma {"batch": 1, "rows": 16384, "cols": 16384, "inner": 1}
decode_chain persistent {"batch": 1, "hidden": 4096, "layers": 8}
cross_entropy cluster_bulk {"tokens": 4096, "vocab": 128256}
attention_decode sdpa {"batch": 1, "heads": 32, "kv_heads": 8, "seq_q": 1, "seq_kv": 8192, "head_dim": 128}
attention_decode triton_split_fused {"batch": 1, "heads": 32, "kv_heads": 8, "seq_q": 1, "seq_kv": 8192, "head_dim": 128}
LIST
    ;;
  pool)  # issue 30: every case over every GPU of the host, one worker a GPU pinned with CUDA_VISIBLE_DEVICES;
         # each result lands in $out/results as its case ends, so a call cut short keeps what finished. Each
         # GPU measures its own ceilings first (~1 min); the book is 14 cases of 3-7 min each on one H200
    nvidia-smi --query-gpu=index,uuid,pci.bus_id,clocks.max.sm --format=csv,noheader
    timeout 580 python3 -m casebook.cli run --all --save --results "$out/results" \
      > "$out/logs/pool.txt" 2> "$out/logs/pool.err"
    echo "pool: exit $?"; cat "$out/logs/pool.txt"
    grep -E "ceilings|case\(s\) in|crashed|trying it once more" "$out/logs/pool.err" | tail -20 ;;
  allreduce)  # issue 35: 2 H200s (nvidia-h200-x2); NCCL and symmetric memory need both GPUs visible
    nvidia-smi topo -m > "$out/logs/topology.txt" 2>&1; head -4 "$out/logs/topology.txt"
    python3 -c 'import torch; print("gpus:", torch.cuda.device_count())'
    timeout 120 python3 -m pytest -q tests/run/test_distributed.py > "$out/logs/distributed_pytest.txt" 2>&1
    echo "distributed pytest: exit $?"; tail -3 "$out/logs/distributed_pytest.txt"
    run_case allreduce_norm $((590 - SECONDS)) ;;
  *) echo "usage: $0 case CASE [TESTS [K]] | gpu-tests | book | pack | explore | bound | pace | pool | allreduce" >&2
     exit 2 ;;
esac
# The kept runs too ($CASEBOOK_CACHE/runs): a run that did not reach --save's store can be stored here
# with `casebook record`.
if [ "$CASEBOOK_CACHE" != "$out/cache" ] && [ -d "$CASEBOOK_CACHE/runs" ]; then
  mkdir -p "$out/cache" && cp -r "$CASEBOOK_CACHE/runs" "$out/cache/runs"  # copied: a next call on this warm machine resumes from them
fi
tar -czf "$out/results.tgz" -C "$out" results logs $(test -d "$out/cache/runs" && echo cache/runs)
rm -rf "$out/results" "$out/logs" "$out/cache"
ls -la "$out"
