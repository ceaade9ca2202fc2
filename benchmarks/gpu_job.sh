#!/usr/bin/env bash
# One job of a book refresh on a GPU rented by the job: the same command in every job, back to back, each
# doing what is left. Run from the repository root of the device's copy:
#   bash benchmarks/gpu_job.sh
# - The wheels the image lacks (pydantic, liger-kernel, nvidia-ml-py), carried in $WHEELS (default .whl, an
#   ignored folder named in the call's carry; fill it here with ../shared/device/fetch-wheels pydantic and
#   `pip download --no-deps liger-kernel nvidia-ml-py`), installed without an index.
# - Once a machine (TESTS=0: never): the GPU-only tests, then the explorations waiting for a GPU (EXPLORE), and
#   with BOUND=1 the ncu readings of which resource binds (`gpu_session.sh bound`), each under its own deadline
#   (TESTS_S, EXPLORE_S, BOUND_S seconds).
# - Then the book (`gpu_session.sh book`) until END seconds from the start, its results kept outside the copy
#   (/tmp/cbresults), so the next job on the same warm machine leaves alone what this one stored. ORDER: the
#   cases first in line (the ones without a current result on this machine measure first); the rest follow
#   by --all, which leaves current ones alone.
# - With more than FORCE_MIN_S seconds left: FORCE's cases measured again (--force), each once a machine: a
#   stored result that ran picks this machine should not have had (an earlier machine's autotuning).
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
if [ "${TESTS:-1}" = 1 ] && [ ! -e /tmp/.gpu-job-tests ]; then
  touch /tmp/.gpu-job-tests
  step tests "${TESTS_S:-290}" gpu-tests
  EXPLORE=${EXPLORE-attention/fa3_gluon.py decode_chain/gemv_tiles.py} step explore $((SECONDS + ${EXPLORE_S:-200})) explore
  [ "${BOUND:-0}" = 1 ] && step bound $((SECONDS + ${BOUND_S:-200})) bound
fi
slug=$(python3 -c 'from casebook.run.hardware import identify; print(identify().slug)' 2>/dev/null)
if [ "$slug" = nvidia-h200 ]; then
  order=${ORDER-attention_decode linear_cross_entropy gemm_tiled gemm_epilogue gemm_grouped decode_chain}
else
  order=${ORDER-}
fi
cases=""
for name in $order; do cases="$cases cases/$name.yaml"; done
# the named cases first, then the rest of the book (a case named twice runs once: the second finds it current)
[ -n "$cases" ] && CASES="$cases" PACK=0 RESULTS=/tmp/cbresults step book-first $((end - 20)) book
[ $SECONDS -lt $((end - 120)) ] && PACK=0 RESULTS=/tmp/cbresults step book $((end - 20)) book
for name in ${FORCE-transpose attention_paged attention_prefix}; do
  [ -e "/tmp/.gpu-job-forced-$name" ] && continue
  [ $SECONDS -lt $((end - ${FORCE_MIN_S:-200})) ] || break
  touch "/tmp/.gpu-job-forced-$name"
  CASES="cases/$name.yaml" BOOK_FLAGS=--force PACK=0 RESULTS=/tmp/cbresults step "forced-$name" $((end - 20)) book
done
step cache "$end" pack
echo "job: $SECONDS s"
