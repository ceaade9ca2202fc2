#!/usr/bin/env bash
# One job of a book refresh on a GPU rented by the job: the same command in every job, back to back, each
# doing what is left. Run from the repository root of the device's copy:
#   bash benchmarks/gpu_job.sh
# - The wheels the image lacks (pydantic, liger-kernel, nvidia-ml-py), carried in $WHEELS (default .whl, an
#   ignored folder named in the call's carry; fill it here with ../shared/device/fetch-wheels pydantic and
#   `pip download --no-deps liger-kernel nvidia-ml-py`), installed without an index.
# - The explorations waiting for a GPU (EXPLORE, default gpu_session.sh's list; EXPLORE= none), each once a
#   machine, up to EXPLORE_S seconds a job: the next job on the same warm machine goes on with those left. Then,
#   once a machine, the ncu readings of which resource binds (`gpu_session.sh bound`, up to BOUND_S seconds;
#   BOUND=0: not; BOUND_ONLY: which), which issues 46 and 47 ask for: on the H200 by default, elsewhere with
#   BOUND=1 (an H100 has read every kernel of the list).
# - On the machine the claims name (nvidia-h200): the book (`gpu_session.sh book`) until END seconds from the
#   start, its results kept outside the copy (/tmp/cbresults), so the next job on the same warm machine leaves
#   alone what this one stored. ORDER: the cases first in line (the ones without a current result on this
#   machine measure first), before anything else: a stored result is what the issues' "done" asks for, and an
#   H200 may be taken back or not lent again. Then the explorations, then the rest of the book by --all, which
#   leaves current ones alone. Then, with more than FORCE_MIN_S seconds left, FORCE's cases measured again
#   (--force), each once a machine: a stored result that ran picks this machine should not have had (an
#   earlier machine's autotuning). Then, once a machine and with more than TESTS_MIN_S seconds left, the
#   GPU-only tests (TESTS=0: never).
# - On any other card (a call for an H200 may get an H100): no book, whose claims name the H200; the
#   explorations first (not the DRAM counters `explore` reads under ncu after them, which wait for the H200's
#   reading: EXPLORE_NCU names some there), then the GPU-only tests, once a machine (they judge correctness, which
#   any Hopper card shows); BOOK_ANY=1 runs the book there too, after the explorations.
# Each step's files come back as $OUT/<step>/results.tgz (results/, logs/, the kept runs); the compile cache as
# $OUT/cache/cache.tgz*, to carry into the next fresh machine as .cbcache-in/cache.tgz*.
set -uo pipefail
out=${OUT:-/tmp/out}
end=${END:-560}
wheels=${WHEELS:-.whl}
if ls "$wheels"/*.whl > /dev/null 2>&1; then
  python3 -m pip install -q --no-deps --no-index "$wheels"/*.whl > /dev/null 2>&1 && echo "wheels: installed" \
    || echo "wheels: install failed"
fi
export CASEBOOK_CACHE=${CASEBOOK_CACHE:-/tmp/cbcache}
step() {  # step NAME UNTIL ARGS...: one gpu_session.sh entry with its own $OUT, ending by UNTIL seconds from the
          # job's start (gpu_session.sh's DEADLINE counts from its own)
  local name=$1 until=$2
  shift 2
  OUT="$out/$name" DEADLINE=$((until - SECONDS)) bash benchmarks/gpu_session.sh "$@" 2>&1 \
    | grep -v -E '^(total [0-9]+|[-d][-rwx]{9} )' | sed "s/^/$name: /"
}
explore() {  # the explorations not yet run on this machine, up to EXPLORE_S seconds; the bound readings once
  local until=$((SECONDS + ${EXPLORE_S:-300}))
  [ $until -gt $((end - 60)) ] && until=$((end - 60))
  [ $SECONDS -lt $((until - 30)) ] || return 0
  [ -n "${EXPLORE-default}" ] && step explore $until explore  # unset: gpu_session.sh's list
  until=$((SECONDS + ${BOUND_S:-200})); [ $until -gt $((end - 30)) ] && until=$((end - 30))
  if [ "${BOUND:-1}" = 1 ] && [ ! -e /tmp/.gpu-job-bound ] && [ $SECONDS -lt $((until - 60)) ]; then
    touch /tmp/.gpu-job-bound
    step bound $until bound
  fi
}
tests() {  # the GPU-only tests, once a machine, until the job's end
  [ "${TESTS:-1}" = 1 ] && [ ! -e /tmp/.gpu-job-tests ] && [ $SECONDS -lt $((end - ${TESTS_MIN_S:-150})) ] || return 0
  touch /tmp/.gpu-job-tests
  step tests $((end - 20)) gpu-tests
}
slug=$(python3 -c 'from casebook.run.hardware import identify; print(identify().slug)' 2>/dev/null)
echo "job: on $slug"
if [ "$slug" = nvidia-h200 ]; then
  order=${ORDER-attention_decode linear_cross_entropy attention_prefill gemm_tiled gemm_epilogue gemm_grouped decode_chain}
else
  export EXPLORE_NCU=${EXPLORE_NCU-}  # the counters the explorations read under ncu wait for the H200's reading
  BOUND=${BOUND:-0}  # every kernel of the bound list has an H100's reading in its notebook
  explore
  if [ "${BOOK_ANY:-0}" = 1 ]; then
    order=${ORDER-}
  else
    tests
    step cache "$end" pack
    echo "job: $SECONDS s (no book on $slug: BOOK_ANY=1 runs it)"
    exit 0
  fi
fi
cases=""
for name in $order; do cases="$cases cases/$name.yaml"; done
# the named cases first (a later job finds those stored current and goes straight on), then what is left of the
# explorations, then the rest of the book (a case named twice runs once: the second finds it current)
[ -n "$cases" ] && CASES="$cases" PACK=0 RESULTS=/tmp/cbresults step book-first $((end - 20)) book
explore
[ $SECONDS -lt $((end - 120)) ] && PACK=0 RESULTS=/tmp/cbresults step book $((end - 20)) book
for name in ${FORCE-transpose attention_paged attention_prefix}; do
  [ -e "/tmp/.gpu-job-forced-$name" ] && continue
  [ $SECONDS -lt $((end - ${FORCE_MIN_S:-200})) ] || break
  touch "/tmp/.gpu-job-forced-$name"
  CASES="cases/$name.yaml" BOOK_FLAGS=--force PACK=0 RESULTS=/tmp/cbresults step "forced-$name" $((end - 20)) book
done
tests
step cache "$end" pack
echo "job: $SECONDS s"
