#!/usr/bin/env bash
# The GPU runs behind the stored H200 results, each a full device call under a 10-minute limit: inputs
# made on the device, one tarball back (the device returns 8 files at most), a checkpoint per variant
# so a call cut short still returns what it measured.
#
# Run on the device from the repository root, after the wheel install line:
#   bash benchmarks/gpu_session.sh softmax        # GPU-only tests, full softmax ladder + ncu counters,
#                                                 # copy references
#   bash benchmarks/gpu_session.sh softmax-rerun  # after committing that result: a second full run and
#                                                 # `casebook compare` against it (run to run)
#   bash benchmarks/gpu_session.sh softmax-pair   # two consecutive full runs on one machine, compared
#   bash benchmarks/gpu_session.sh softmax-full   # the committed run (with ncu counters), then a second
#                                                 # full run on the same machine, compared (run to run)
#   bash benchmarks/gpu_session.sh softmax-run    # the committed run alone (with ncu counters)
#   bash benchmarks/gpu_session.sh softmax-persist  # cluster_softmax.py --persist, every GPU softmax test,
#                                                 # then the committed run
#   bash benchmarks/gpu_session.sh gemm-runs      # the ceilings, then the three GEMM cases
#   bash benchmarks/gpu_session.sh checks         # GPU-only softmax tests, harness against do_bench,
#                                                 # the epilogue-subtiling exploration
#   bash benchmarks/gpu_session.sh gemm           # all three GEMM cases
#   bash benchmarks/gpu_session.sh pingpong       # the Gluon ping-pong GEMM exploration
#   bash benchmarks/gpu_session.sh tma-rows       # the Gluon TMA-rows softmax exploration
#   bash benchmarks/gpu_session.sh epilogue       # the epilogue's clocks, the ping-pong timings, then
#                                                 # gemm_epilogue
#   bash benchmarks/gpu_session.sh epilogue-case  # the ping-pong kernel's check, then gemm_epilogue
#   bash benchmarks/gpu_session.sh grouped        # gemm_grouped alone
#   bash benchmarks/gpu_session.sh tiled          # gemm_tiled alone
#   bash benchmarks/gpu_session.sh transpose      # transpose's GPU tests, then its run with DRAM counters
#   bash benchmarks/gpu_session.sh transpose-sectors  # sectors per request, L2 sectors and bank conflicts
#                                                 # per transpose variant under ncu (the naive kernels' waste)
#   bash benchmarks/gpu_session.sh decode         # decode_chain's GPU tests (the grid barrier), then its run
#                                                 # with DRAM counters
#   bash benchmarks/gpu_session.sh layout         # transpose then decode_chain, with counters, in one call
#   bash benchmarks/gpu_session.sh transpose-run  # transpose's committed run alone (with counters)
#   bash benchmarks/gpu_session.sh decode-run     # decode_chain's committed run alone (with counters)
#   bash benchmarks/gpu_session.sh norms-xent     # rmsnorm then cross_entropy, with counters, in one call
#   bash benchmarks/gpu_session.sh decode-stage   # attention_decode, then attention_paged, with counters
#   bash benchmarks/gpu_session.sh paged-prefix   # attention_paged, then attention_prefix, with counters
#   bash benchmarks/gpu_session.sh norms-rms      # the norm family's GPU tests, then rmsnorm with counters
#   bash benchmarks/gpu_session.sh norms-fused    # rmsnorm_residual, rmsnorm_backward with counters
#   bash benchmarks/gpu_session.sh norms-layer    # layernorm, layernorm_backward with counters
#                                                 # (the norms' Liger rungs need the `peers` extra installed)
#   bash benchmarks/gpu_session.sh xent           # cross_entropy: GPU-only tests (the split rows' barrier),
#                                                 # then the committed run with ncu counters
#                                                 # (needs the peers extra: pip install -e '.[peers]')
#   bash benchmarks/gpu_session.sh xent-linear    # the LM head + loss: time and peak memory, logits
#                                                 # materialised or chunked, against Liger's fused one
#   bash benchmarks/gpu_session.sh linear-xent    # linear_cross_entropy: GPU-only tests (the in-place
#                                                 # split's barrier), then the committed run with counters
#                                                 # (needs the peers extra: pip install -e '.[peers]')
#   bash benchmarks/gpu_session.sh attention-prefill  # issue 25: prefill's GPU tests (bf16), then its run
#   bash benchmarks/gpu_session.sh attention-decode   # decode's GPU tests (the fused combine's counters),
#                                                 # then its run
#   bash benchmarks/gpu_session.sh attention-smoke    # the attention kernels beside SDPA, do_bench
#   bash benchmarks/gpu_session.sh attention-paged    # issue 26: paged decode's GPU tests (the fused combine
#                                                 # over pages), then its run with counters
#   bash benchmarks/gpu_session.sh attention-paged-sectors  # sectors per request and DRAM bytes per page
#                                                 # size under ncu (whether small pages break coalescing)
#   bash benchmarks/gpu_session.sh attention-prefix   # issue 26: the cascade's GPU tests, then its run with
#                                                 # counters
#   bash benchmarks/gpu_session.sh pace           # issue 43: the device crossing probed, the README's main
#                                                 # job on a fresh machine (ceilings included), each point's
#                                                 # harness cost, the job stopped at 60 s and resumed, the
#                                                 # quick ceilings against the thorough ones
#   bash benchmarks/gpu_session.sh book           # issue 44: the book refreshed, `casebook run --all --save
#                                                 # --resume` until DEADLINE, then every case's status; run
#                                                 # with CASEBOOK_CACHE=.cbcache and carry `.cbcache` from one
#                                                 # call to the next (compiled kernels, autotuning picks, the
#                                                 # runs cut short): it comes back as cache.tgz(.part-*), to
#                                                 # unpack into .cbcache here before the next call
#   bash benchmarks/gpu_session.sh pool           # on a host of several GPUs: the whole book side by side,
#                                                 # one worker a GPU (casebook run --all --save), the table
#                                                 # of what ran where, whether the GPUs' ceilings agree
#   bash benchmarks/gpu_session.sh allreduce      # issue 35, on an nvidia-h200-x2 machine: the topology,
#                                                 # the launcher's tests, then allreduce_norm on its two
#                                                 # ranks (results/nvidia-h200-x2/)
# Then, here: tar -xzf <files_at>/results.tgz, compare, commit results/nvidia-h200/<case>.json with its
# run's log beside it (logs/<case>.txt as <case>.run-log.txt, .err as .run-progress.txt). The script
# writes $OUT/results.tgz itself: a command that tars into the same name after it overwrites it.
set -uo pipefail
# DEADLINE (seconds from the start), where an entry honours it: when its last run must end, inside the
# call's limit, so that the tarball is still written.
out=${OUT:-/tmp/out}
mkdir -p "$out/results" "$out/logs"
# CASEBOOK_CACHE may name a folder outside $OUT, so that consecutive calls on one warm machine share the
# measured ceilings and Inductor's compiled kernels; the kept runs come back either way.
export CASEBOOK_CACHE="${CASEBOOK_CACHE:-$out/cache}" PYTHONUNBUFFERED=1

run_case() {  # run_case CASE SECONDS [ARGS...]
  local case=$1 limit=$2
  shift 2
  timeout "$limit" python3 -m casebook.cli run "cases/$case.yaml" --save --results "$out/results" "$@" \
    > "$out/logs/$case.txt" 2> "$out/logs/$case.err"
  echo "$case: exit $?"
  grep -A20 '^Claims' "$out/logs/$case.txt" | head -12
  grep -iE 'failed|crashed|timeout' "$out/logs/$case.txt" | grep -v '^  FAILED' | head -8
}

case "${1:-}" in
  softmax)  # the GPU-only tests (bf16), the full ladder with counters, copy references
    timeout 75 python3 -m pytest -q -x -k "bf16 or barriers" tests/kernels/test_softmax_fusion_gpu.py > "$out/logs/gpu_pytest.txt" 2>&1
    echo "gpu pytest: exit $?"; tail -2 "$out/logs/gpu_pytest.txt"
    run_case softmax_fusion 400 --counters
    timeout 40 python3 benchmarks/copy_reference.py "$out/logs/copy.json" > "$out/logs/copy.txt" 2>&1
    cat "$out/logs/copy.txt" ;;
  trust)  # issue 38: the split harness on a GPU (the child executes; outputs sampled on the device and
          # copied after timing; the reference in its own child), softmax and the tiled GEMM, each compared
          # with its committed result: the medians should agree within the usual run-to-run 2%
    mkdir -p "$out/rerun"
    for c in softmax_fusion gemm_tiled; do
      timeout 280 python3 -m casebook.cli run "cases/$c.yaml" --save --results "$out/rerun" \
        > "$out/logs/trust_$c.txt" 2>&1
      echo "$c (split harness): exit $?"
      python3 -m casebook.cli compare "results/nvidia-h200/$c.json" "$out/rerun/nvidia-h200/$c.json" \
        > "$out/logs/trust_compare_$c.txt" 2>&1; tail -8 "$out/logs/trust_compare_$c.txt"
    done ;;
  softmax-rerun)  # a second full run in a fresh process, compared with the committed result (run to run)
    mkdir -p "$out/rerun"
    timeout 400 python3 -m casebook.cli run cases/softmax_fusion.yaml --save --results "$out/rerun" \
      > "$out/logs/softmax_rerun.txt" 2>&1
    echo "softmax rerun: exit $?"
    python3 -m casebook.cli compare results/nvidia-h200/softmax_fusion.json \
      "$out/rerun/nvidia-h200/softmax_fusion.json" > "$out/logs/compare.txt" 2>&1; tail -15 "$out/logs/compare.txt" ;;
  softmax-pair)  # two consecutive full runs on one machine, sharing casebook's cache (as a user's two
                 # runs would), compared: the run-to-run figure
    mkdir -p "$out/rerun"
    for i in 1 2; do
      timeout 280 python3 -m casebook.cli run cases/softmax_fusion.yaml --save --results "$out/rerun/run$i" \
        > "$out/logs/softmax_run$i.txt" 2>&1
      echo "softmax run $i: exit $?"
    done
    python3 -m casebook.cli compare "$out/rerun/run1/nvidia-h200/softmax_fusion.json" \
      "$out/rerun/run2/nvidia-h200/softmax_fusion.json" > "$out/logs/compare.txt" 2>&1; tail -15 "$out/logs/compare.txt" ;;
  softmax-full)  # the result to commit (with counters), then a second run on this machine, compared
    mkdir -p "$out/rerun"
    run_case softmax_fusion 320 --counters
    timeout $((580 - SECONDS)) python3 -m casebook.cli run cases/softmax_fusion.yaml --save --results "$out/rerun" \
      > "$out/logs/softmax_run2.txt" 2>&1
    echo "softmax run 2: exit $?"
    python3 -m casebook.cli compare "$out/results/nvidia-h200/softmax_fusion.json" \
      "$out/rerun/nvidia-h200/softmax_fusion.json" > "$out/logs/compare.txt" 2>&1; tail -15 "$out/logs/compare.txt" ;;
  softmax-run)  # the result to commit alone (with counters)
    run_case softmax_fusion 420 --counters ;;
  softmax-persist)  # cluster_bulk's persistent schedule against one row per cluster, then every GPU-only
                    # softmax test, then the committed run
    timeout 100 python3 benchmarks/explore/softmax_fusion/cluster_softmax.py --persist > "$out/logs/cluster_persist.txt" 2>&1
    echo "persist: exit $?"; cat "$out/logs/cluster_persist.txt"
    timeout 120 python3 -m pytest -q -x tests/kernels/test_softmax_fusion_gpu.py > "$out/logs/gpu_pytest.txt" 2>&1
    echo "gpu pytest: exit $?"; tail -3 "$out/logs/gpu_pytest.txt"
    run_case softmax_fusion $((575 - SECONDS)) --counters ;;
  softmax-cluster)  # every GPU-only softmax test (cluster_bulk's CUDA kernel too), then the committed run
    timeout 120 python3 -m pytest -q -x tests/kernels/test_softmax_fusion_gpu.py > "$out/logs/gpu_pytest.txt" 2>&1
    echo "gpu pytest: exit $?"; tail -3 "$out/logs/gpu_pytest.txt"
    run_case softmax_fusion $((570 - SECONDS)) --counters ;;
  gemm-runs)  # the machine's ceilings (measured once, shared by the runs), then the three GEMM cases
    timeout 120 python3 -m casebook.cli hardware > "$out/logs/hardware.txt" 2>&1; echo "hardware: exit $?"; cat "$out/logs/hardware.txt"
    # measured: 128, 70 and 117 s before paired timings (run.pair_tasks: 6, 2 and 2 pairs of ~10 s
    # each, plus the compiles of a fresh process); the last case gets what is left of the 10 minutes.
    run_case gemm_epilogue 300
    run_case gemm_grouped 150
    run_case gemm_tiled $((580 - SECONDS)) ;;
  checks)  # quick checks before the long runs
    timeout 75 python3 -m pytest -q -x -k "bf16 or barriers" tests/kernels/test_softmax_fusion_gpu.py > "$out/logs/gpu_pytest.txt" 2>&1
    echo "gpu pytest: exit $?"; tail -2 "$out/logs/gpu_pytest.txt"
    timeout 60 python3 benchmarks/harness_vs_do_bench.py "$out/logs/do_bench.json" > "$out/logs/do_bench.txt" 2>&1
    cat "$out/logs/do_bench.txt" | head -8
    timeout 200 python3 benchmarks/explore/gemm_epilogue/epilogue_subtile.py > "$out/logs/epilogue_subtile.txt" 2>&1
    echo "subtile: exit $?"; cat "$out/logs/epilogue_subtile.txt" ;;
  gemm)  # the epilogue first (it changed most), the price of its epilogue, then the other two
    run_case gemm_epilogue 250
    timeout 60 python3 benchmarks/harness_vs_do_bench.py "$out/logs/do_bench.json" > "$out/logs/do_bench.txt" 2>&1; cat "$out/logs/do_bench.txt" | head -8
    timeout 60 python3 benchmarks/epilogue_cost.py "$out/logs/epilogue_cost.json" > "$out/logs/epilogue_cost.txt" 2>&1
    cat "$out/logs/epilogue_cost.txt"
    run_case gemm_grouped 110
    run_case gemm_tiled 200 ;;
  pingpong)  # the Gluon ping-pong GEMM exploration: correctness, then times beside cuBLAS and the TMA GEMM
    timeout 90 python3 benchmarks/explore/gemm_epilogue/pingpong_epilogue.py --check > "$out/logs/pingpong.txt" 2>&1 \
      && timeout 240 python3 benchmarks/explore/gemm_epilogue/pingpong_epilogue.py >> "$out/logs/pingpong.txt" 2>&1
    echo "pingpong: exit $?"; tail -40 "$out/logs/pingpong.txt" ;;
  tma-rows)  # the Gluon TMA-rows softmax exploration: correctness, then times beside a copy and triton_online
    timeout 90 python3 benchmarks/explore/softmax_fusion/tma_rows_softmax.py --check > "$out/logs/tma_rows.txt" 2>&1 \
      && timeout 200 python3 benchmarks/explore/softmax_fusion/tma_rows_softmax.py >> "$out/logs/tma_rows.txt" 2>&1
    echo "tma-rows: exit $?"; tail -30 "$out/logs/tma_rows.txt" ;;
  epilogue)  # why the erfc epilogue is not hidden (clocks), the ping-pong kernel's times, then the case
    timeout 60 python3 benchmarks/explore/gemm_epilogue/epilogue_clocks.py > "$out/logs/epilogue_clocks.txt" 2>&1
    echo "clocks: exit $?"; cat "$out/logs/epilogue_clocks.txt"
    timeout 150 python3 benchmarks/explore/gemm_epilogue/pingpong_epilogue.py > "$out/logs/pingpong.txt" 2>&1
    echo "pingpong: exit $?"; grep -v normwise "$out/logs/pingpong.txt"
    run_case gemm_epilogue 250 ;;
  epilogue-case)  # the ping-pong kernel checked at ragged shapes, then gemm_epilogue
    timeout 60 python3 benchmarks/explore/gemm_epilogue/pingpong_epilogue.py --check > "$out/logs/pingpong_check.txt" 2>&1
    echo "pingpong check: exit $?"; cat "$out/logs/pingpong_check.txt"
    run_case gemm_epilogue 280 ;;
  grouped)
    run_case gemm_grouped 280 ;;
  tiled)
    run_case gemm_tiled 280 ;;
  transpose)  # every variant compiled at awkward shapes (TMA and its fallback), then the committed run
    timeout 150 python3 -m pytest -q -x tests/kernels/test_transpose_gpu.py > "$out/logs/transpose_gpu_pytest.txt" 2>&1
    echo "transpose gpu pytest: exit $?"; tail -3 "$out/logs/transpose_gpu_pytest.txt"
    run_case transpose $((575 - SECONDS)) --counters ;;
  transpose-sectors)  # the counters beyond DRAM bytes, one ncu call per variant at 16384 x 16384 bf16
    timeout 560 bash benchmarks/transpose_sectors.sh "$out/logs/sectors" > "$out/logs/sectors.txt" 2>&1
    echo "sectors: exit $?"; cat "$out/logs/sectors.txt" ;;
  decode)  # the chain's variants compiled and the persistent kernel's barrier over every SM, then the
           # committed run (liger_norm runs where the image has liger-kernel, the `peers` extra; else skipped)
    timeout 180 python3 -m pytest -q -x tests/kernels/test_decode_chain_gpu.py > "$out/logs/decode_gpu_pytest.txt" 2>&1
    echo "decode gpu pytest: exit $?"; tail -3 "$out/logs/decode_gpu_pytest.txt"
    run_case decode_chain $((575 - SECONDS)) --counters ;;
  layout)  # issue 34 in one call: transpose, then decode_chain, each with DRAM counters (their GPU-only
           # tests are the `transpose` and `decode` entries; each run checks every variant at its shapes)
    run_case transpose 280 --counters
    run_case decode_chain $((580 - SECONDS)) --counters ;;
  transpose-run)  # the committed run alone, with DRAM counters (about 390 s on an H200)
    run_case transpose 585 --counters ;;
  decode-run)  # the committed run alone, with DRAM counters (about 450 s on an H200)
    run_case decode_chain 585 --counters ;;
  norms-xent)  # issue 31 in one call: rmsnorm, then cross_entropy, each with DRAM counters (Liger in both)
    python3 -c 'import liger_kernel' 2>/dev/null && echo "liger-kernel: installed" || echo "liger-kernel: MISSING"
    run_case rmsnorm 250 --counters
    run_case cross_entropy $((580 - SECONDS)) --counters ;;
  decode-stage)  # issues 32 and 33, the bandwidth-bound decode pair (small outputs: the trust boundary is cheap),
                 # each with DRAM counters: attention_decode, then attention_paged with what is left
    run_case attention_decode 330 --counters
    run_case attention_paged $((585 - SECONDS)) --counters ;;
  paged-prefix)  # issue 33 in one call: attention_paged (its page-size-specialised tiles), then attention_prefix
                 # (whose cascade uses those tiles), each with DRAM counters. Measured: the ceilings and the
                 # paged run's measurement ~200 s, its counters ~60 s more; the prefix run then ~4 min
    run_case attention_paged 290 --counters
    run_case attention_prefix $((${DEADLINE:-520} - SECONDS)) --counters ;;
  norms-rms)  # issue 23's cases, call 1: the norms' GPU tests, then rmsnorm (bf16 and fp32) with counters;
               # the Liger rungs skip, with the reason, where liger-kernel is not installed
    python3 -c 'import liger_kernel' 2>/dev/null && echo "liger-kernel: installed" || echo "liger-kernel: MISSING (pip install -e .[peers])"
    timeout 150 python3 -m pytest -q tests/kernels/test_norms_gpu.py > "$out/logs/norms_gpu_pytest.txt" 2>&1
    echo "norms gpu pytest: exit $?"; tail -3 "$out/logs/norms_gpu_pytest.txt"
    run_case rmsnorm $((590 - SECONDS)) --counters ;;
  norms-fused)  # call 2: the pre-norm block with its residual add, and the backward (bf16), with counters
    run_case rmsnorm_residual 290 --counters
    run_case rmsnorm_backward $((590 - SECONDS)) --counters ;;
  allreduce)  # issue 35: 2 H200s (nvidia-h200-x2); NCCL and symmetric memory need both GPUs visible
    nvidia-smi topo -m > "$out/logs/topology.txt" 2>&1; head -4 "$out/logs/topology.txt"
    python3 -c 'import torch; print("gpus:", torch.cuda.device_count())'
    timeout 120 python3 -m pytest -q tests/run/test_distributed.py > "$out/logs/distributed_pytest.txt" 2>&1
    echo "distributed pytest: exit $?"; tail -3 "$out/logs/distributed_pytest.txt"
    run_case allreduce_norm $((590 - SECONDS)) ;;
  norms-layer)  # call 3: layernorm and its backward (bf16), with counters
    run_case layernorm 290 --counters
    run_case layernorm_backward $((590 - SECONDS)) --counters ;;
  xent)  # issue 31: cross_entropy's GPU-only tests (split rows meeting at a barrier, Liger on the GPU),
         # then the committed run with counters. Predicted: ~1.5 min of tests, 5-7 min of run (16 points
         # a variant; torch.compile pays a compile per shape); the run gets what is left of ~9.5 min
    python3 -c 'import liger_kernel' 2>/dev/null || echo "liger-kernel missing: its rung will be skipped (pip install -e '.[peers]')"
    timeout 120 python3 -m pytest -q -x tests/kernels/test_cross_entropy_gpu.py > "$out/logs/gpu_pytest.txt" 2>&1
    echo "gpu pytest: exit $?"; tail -3 "$out/logs/gpu_pytest.txt"
    run_case cross_entropy $((575 - SECONDS)) --counters ;;
  xent-linear)  # the LM head and its loss without the harness (which records no peak memory): torch,
                # the split kernel on materialised logits, Liger's fused linear cross-entropy, chunked
                # split; Llama-3-8B's head at 8192 tokens, then Gemma-3's vocabulary. Predicted ~1 min
    timeout 150 python3 benchmarks/explore/cross_entropy/linear_cross_entropy.py > "$out/logs/linear_xent.txt" 2>&1
    echo "linear xent: exit $?"
    timeout 150 python3 benchmarks/explore/cross_entropy/linear_cross_entropy.py --tokens 4096 --hidden 3840 --vocab 262144 \
      >> "$out/logs/linear_xent.txt" 2>&1
    echo "linear xent (Gemma-3 12B head): exit $?"; cat "$out/logs/linear_xent.txt" ;;
  linear-xent)  # linear_cross_entropy: the in-place split kernel's GPU tests (rows at their barrier, the
                # gradient over the logits), then the committed run with counters. Predicted: ~1 min of
                # tests; ~6-8 min of run (5 shapes x 5 rungs of 2-43 ms calls, float64 references of up
                # to 26 TFLOP, torch.compile's compile per shape); the run gets what is left of ~9.6 min
    python3 -c 'import liger_kernel' 2>/dev/null || echo "liger-kernel missing: its rung will be skipped (pip install -e '.[peers]')"
    timeout 90 python3 -m pytest -q -x tests/kernels/test_linear_cross_entropy_gpu.py > "$out/logs/gpu_pytest.txt" 2>&1
    echo "gpu pytest: exit $?"; tail -3 "$out/logs/gpu_pytest.txt"
    run_case linear_cross_entropy $((580 - SECONDS)) --counters ;;
  attention-prefill)  # issue 25: every prefill rung compiled against float64 at ragged, GQA and seq_q < seq_kv
                      # shapes (bf16 here; the run checks fp16 too), then the committed run with counters.
                      # Predicted: ~2 min of tests (the autotuner's compiles), ~6 min of run (108 points)
    timeout 170 python3 -m pytest -q -x -k "prefill and bf16" tests/kernels/test_attention_gpu.py > "$out/logs/gpu_pytest.txt" 2>&1
    echo "gpu pytest: exit $?"; tail -3 "$out/logs/gpu_pytest.txt"
    run_case attention_prefill $((580 - SECONDS)) --counters ;;
  attention-decode)  # issue 25: every decode rung compiled, the fused combine's counters over 1000 launches,
                     # then the committed run with counters. Predicted: ~1 min of tests, ~4 min of run
    timeout 120 python3 -m pytest -q -x -k "decode or fused_combine" tests/kernels/test_attention_gpu.py > "$out/logs/gpu_pytest.txt" 2>&1
    echo "gpu pytest: exit $?"; tail -3 "$out/logs/gpu_pytest.txt"
    run_case attention_decode $((580 - SECONDS)) --counters ;;
  attention-paged)  # issue 26: every paged rung compiled against float64 (page sizes 8-128, ragged lengths), the
                    # fused combine and the cascade over 500 launches each, then the committed run with counters.
                    # Predicted: ~2 min of tests (autotuning per page size), ~5 min of run (8 shapes x 5 rungs)
    timeout 150 python3 -m pytest -q -x -k "paged_rung or many_launches" tests/kernels/test_attention_paged_gpu.py > "$out/logs/gpu_pytest.txt" 2>&1
    echo "gpu pytest: exit $?"; tail -3 "$out/logs/gpu_pytest.txt"
    run_case attention_paged $((580 - SECONDS)) --counters ;;
  attention-paged-sectors)  # the counters beyond DRAM bytes, one ncu call per (variant, page size), ~4 min
    timeout 560 bash benchmarks/attention_paged_sectors.sh "$out/logs/sectors" > "$out/logs/sectors.txt" 2>&1
    echo "sectors: exit $?"; cat "$out/logs/sectors.txt" ;;
  attention-prefix)  # issue 26: every prefix rung compiled against float64 (1-64 requests, prefixes of 10-32K
                     # tokens, group 8), then the committed run with counters. Predicted: ~2 min of tests (the
                     # float64 references of 64 contexts of 32K), ~6 min of run (per_request and gather_sdpa
                     # read 8.6 GB a call at the 64-request shapes)
    timeout 150 python3 -m pytest -q -x -k "prefix_rung" tests/kernels/test_attention_paged_gpu.py > "$out/logs/gpu_pytest.txt" 2>&1
    echo "gpu pytest: exit $?"; tail -3 "$out/logs/gpu_pytest.txt"
    run_case attention_prefix $((580 - SECONDS)) --counters ;;
  attention-smoke)  # the attention family's Triton kernels beside SDPA's backends outside the harness
                    # (do_bench, warm L2): compile, agreement with float64, a first rate. ~2 min
    timeout 300 python3 benchmarks/explore/attention/triton_smoke.py > "$out/logs/attention_smoke.txt" 2>&1
    echo "smoke: exit $?"; cat "$out/logs/attention_smoke.txt" ;;
  pace)  # issue 43: the harness at the GPU's pace, on a fresh machine: the device crossing probed; the README's
         # main job timed (ceilings included), each point's harness cost, against the committed result; the
         # job stopped by SIGTERM at 60 s and resumed; the quick ceilings against the thorough ones, as time
         # allows. Predicted: the ladder (6 rungs, 186 points) in 100-150 s with the ceilings
    end=${DEADLINE:-560}
    nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader -lms 500 > "$out/logs/gpu_memory.csv" &
    smi=$!
    timeout 90 python3 benchmarks/explore/method/crossing_probe.py > "$out/logs/probe.txt" 2>&1
    echo "probe: exit $?"; cat "$out/logs/probe.txt"
    start=$SECONDS
    timeout $((SECONDS + 300 < end ? 300 : end - SECONDS)) python3 -m casebook.cli run cases/softmax_fusion.yaml \
      > "$out/logs/softmax_run.txt" 2> "$out/logs/softmax_run.err"
    echo "softmax run: exit $? in $((SECONDS - start)) s"; grep -A1 -E "tasks in|crossing" "$out/logs/softmax_run.err"
    kept=$(ls -t "$CASEBOOK_CACHE"/runs/nvidia-h200/softmax_fusion/*.json* | head -1)
    python3 benchmarks/harness_overhead.py "$kept" --points > "$out/logs/overhead.txt" 2>&1; tail -1 "$out/logs/overhead.txt"
    python3 -m casebook.cli compare results/nvidia-h200/softmax_fusion.json "$kept" > "$out/logs/compare.txt" 2>&1
    tail -3 "$out/logs/compare.txt"
    if [ $SECONDS -lt $((end - 160)) ]; then
      timeout -s TERM 60 python3 -m casebook.cli run cases/softmax_fusion.yaml > "$out/logs/cut.txt" 2> "$out/logs/cut.err"
      echo "cut: exit $?"; tail -3 "$out/logs/cut.err"
      start=$SECONDS
      timeout $((end - SECONDS)) python3 -m casebook.cli run cases/softmax_fusion.yaml --resume \
        > "$out/logs/resumed.txt" 2> "$out/logs/resumed.err"
      echo "resumed: exit $? in $((SECONDS - start)) s"; grep -A1 -E "resum|tasks in" "$out/logs/resumed.err"
    fi
    if [ $SECONDS -lt $((end - 60)) ]; then
      timeout $((end + 25 - SECONDS)) python3 benchmarks/explore/method/ceilings_rested.py > "$out/logs/ceilings.txt" 2>&1
      echo "ceilings: exit $?"; cat "$out/logs/ceilings.txt"
    fi
    kill $smi ;;
  book)  # issue 44: the book's own refresh, one command run again in each call until nothing is left. It stores
          # into this copy's results/, so a case whose committed result is current is left alone; CASES names
          # cases in the order wanted (default --all); every results/nvidia-h200 file comes back in
          # results.tgz, the cache (compiled kernels, autotuning picks, the runs cut short) as cache.tgz(.part-*).
          # Carry the last call's cache compressed, as it came back: copy its cache.tgz* into .cbcache-in/ (ignored)
          # and name `.cbcache-in` in carry; unpacked here, a case measured before compiles and tunes nothing
          # (rmsnorm: 216 s with it, 325 s without, on an H200)
    end=${DEADLINE:-540}
    if ls .cbcache-in/cache.tgz* >/dev/null 2>&1; then
      mkdir -p "$CASEBOOK_CACHE" && cat .cbcache-in/cache.tgz* | tar -xz -C "$CASEBOOK_CACHE" && echo "cache: carried in"
    fi
    python3 -c 'import liger_kernel' 2>/dev/null || echo "liger-kernel missing: its rungs will be skipped"
    timeout -s TERM $((end - 45 - SECONDS)) python3 -m casebook.cli run ${CASES:---all} --save --resume --counters \
      > "$out/logs/book.txt" 2> "$out/logs/book.err"
    echo "book: exit $?"; grep -E "current \(|case\(s\) in|crashed|unplaced|kept in" "$out/logs/book.txt" "$out/logs/book.err" | tail -25
    timeout 30 python3 -m casebook.cli check > "$out/logs/check.txt" 2>&1; tail -1 "$out/logs/check.txt"
    cp -r results/nvidia-h200/. "$out/results/"
    tar -czf "$out/cache.tgz" -C "$CASEBOOK_CACHE" . 2>/dev/null  # whole: Triton recompiles a kernel missing any file
    if [ "$(stat -c %s "$out/cache.tgz")" -gt 15000000 ]; then
      split -b 15000000 "$out/cache.tgz" "$out/cache.tgz.part-" && rm "$out/cache.tgz"
    fi ;;
  pool)  # issue 30: every case over every GPU of the host, one worker a GPU pinned with CUDA_VISIBLE_DEVICES;
         # each result lands in $out/results as its case ends, so a call cut short keeps what finished. Each
         # GPU measures its own ceilings first (~1 min); the book is 14 cases of 3-7 min each on one H200
    nvidia-smi --query-gpu=index,uuid,pci.bus_id,clocks.max.sm --format=csv,noheader
    timeout 580 python3 -m casebook.cli run --all --save --results "$out/results" \
      > "$out/logs/pool.txt" 2> "$out/logs/pool.err"
    echo "pool: exit $?"; cat "$out/logs/pool.txt"
    grep -E "ceilings|case\(s\) in|crashed|trying it once more" "$out/logs/pool.err" | tail -20 ;;
  *) echo "usage: $0 pace|book|trust|softmax|softmax-rerun|softmax-pair|softmax-full|softmax-run|softmax-persist|softmax-cluster|checks|gemm|gemm-runs|pingpong|tma-rows|epilogue|epilogue-case|grouped|tiled|xent|xent-linear|transpose|transpose-sectors|decode|norms-rms|norms-fused|norms-layer|layout|transpose-run|decode-run|norms-xent|decode-stage|paged-prefix|attention-prefill|attention-decode|attention-paged|attention-paged-sectors|attention-prefix|attention-smoke|pool|allreduce" >&2; exit 2 ;;
esac
# The kept runs too ($CASEBOOK_CACHE/runs): a run that did not reach --save's store can be stored here
# with `casebook record`.
if [ "$CASEBOOK_CACHE" != "$out/cache" ] && [ -d "$CASEBOOK_CACHE/runs" ]; then
  mkdir -p "$out/cache" && mv "$CASEBOOK_CACHE/runs" "$out/cache/runs"
fi
tar -czf "$out/results.tgz" -C "$out" results logs $(test -d "$out/rerun" && echo rerun) \
  $(test -d "$out/cache/runs" && echo cache/runs)
rm -rf "$out/results" "$out/logs" "$out/rerun" "$out/cache"
ls -la "$out"
