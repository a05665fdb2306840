#!/usr/bin/env bash
# The long-context measurements of issues #37, #39 and #40 on one GPU, after scripts/gpu-check.sh has
# built build-pytorch (or with HYSCALE_BUILD=1, building hyscale-train first): hyscale-train's
# step on the 2048x4 reference model
#   0. at 128K, whole: the sparse step of record (issue #37's 128K figure);
#   1. at 128K in query chunks of HYSCALE_LC_CHUNK (default 4096): memory a token beyond the
#      model state, against the planner's prediction;
#   2. at HYSCALE_LC_LONG_N (default 1,048,576) with the chunk the trainer picks: the million
#      tokens, its step and phase shares;
#   3. the dense warm-up (INDEXER_ONLY) at 128K with the chunks the trainer picks, beside run 1's
#      sparse step (issue #40: memory within 1.1x, time within 3x).
# Each run is bench/train_bench.py (its JSON and table under OUT) and is bounded by
# HYSCALE_LC_TIMEOUT_S (default 300 s a run, twice that for the long one); a run that times out or
# runs out of memory is reported and the next one still runs. HYSCALE_LC_RUNS picks runs (default
# "whole_128k chunked_128k long warmup_128k"; a device call of 10 minutes holds about two). Summary:
# OUT/summary.txt (appended to).
#   scripts/long-context-check.sh [OUT]   (default $OUT, else build-pytorch/long-context)
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${HYSCALE_BUILD_DIR:-$root/build-pytorch}
out=${1:-${OUT:-$build/long-context}}
mkdir -p "$out"
trainer=$build/worker/trainer/hyscale-train
if [[ ${HYSCALE_BUILD:-0} == 1 ]]; then
  HYSCALE_BUILD_DIR=$build HYSCALE_CUDA=ON HYSCALE_TARGETS="hyscale-train hyscale_ops" \
    "$root/scripts/build-with-pytorch.sh" >"$out/build.log" 2>&1 ||
    { tail -30 "$out/build.log"; echo "long-context-check: build failed"; exit 1; }
fi
[[ -x $trainer ]] || { echo "long-context-check: no $trainer: run scripts/gpu-check.sh first"; exit 1; }
model=$root/examples/train-ref-2048x4.yaml
timeout_s=${HYSCALE_LC_TIMEOUT_S:-300}
status=0

run() {  # name, seconds allowed, then train_bench.py's arguments
  local name=$1 limit=$2
  shift 2
  [[ " ${HYSCALE_LC_RUNS:-whole_128k chunked_128k long warmup_128k} " == *" $name "* ]] || return 0
  echo "== $name: train_bench.py $*" | tee -a "$out/summary.txt"
  python3 "$root/bench/train_bench.py" --trainer "$trainer" --models "$model" --device cuda \
    --timeout "$limit" --json "$out/$name.json" "$@" >"$out/$name.txt" 2>&1
  local rc=$?
  # The table's rows and the memory breakdown, or why there are none.
  grep -E "^train-ref|out of memory|MiB|error" "$out/$name.txt" | tail -8 | tee -a "$out/summary.txt"
  [[ $rc == 0 ]] || { echo "   $name: exit $rc" | tee -a "$out/summary.txt"; status=1; }
}

run whole_128k "$timeout_s" --sizes 131072 --steps 3 --warmup 1
run chunked_128k "$timeout_s" --sizes 131072 --steps 3 --warmup 1 \
  --query-chunk "${HYSCALE_LC_CHUNK:-4096}"
run long $((2 * timeout_s)) --sizes "${HYSCALE_LC_LONG_N:-1048576}" --steps 2 --warmup 1
run warmup_128k "$timeout_s" --stage warmup --sizes 131072 --steps 3 --warmup 1
exit $status
