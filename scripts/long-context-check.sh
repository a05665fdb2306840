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
#      sparse step (issue #40: memory within 1.1x, time within 3x);
#   4. recall_warmup: the warm-up doing its job end to end, examples/recall-warmup-gpu.yaml (the
#      recall task at 16K: the indexer's recall before and after the warm-up, the sparse stage's
#      accuracy beside the dense model's), bounded by HYSCALE_LC_RECALL_TIMEOUT_S (default 540 s);
#   5. recall_control: the same job without its warm-up stage (--skip-stage warmup): the sparse
#      stage's accuracy where the indexer never learned (not run by default);
#   6. dense_all: a DENSE stage that trains ALL weights (the table path) at 8K and 32K with the
#      chunks the trainer picks: how far that path reaches (not run by default).
# Runs 0-3 and 6 are bench/train_bench.py (its JSON and table under OUT) and are bounded by
# HYSCALE_LC_TIMEOUT_S (default 300 s a run, twice that for the long one); a run that times out or
# runs out of memory is reported and the next one still runs. HYSCALE_LC_RUNS picks runs (default
# "whole_128k chunked_128k long warmup_128k recall_warmup"; a device call of 10 minutes holds
# about two). Summary: OUT/summary.txt (appended to).
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

runs=${HYSCALE_LC_RUNS:-whole_128k chunked_128k long warmup_128k recall_warmup}
selected() { [[ " $runs " == *" $1 "* ]]; }

run() {  # name, seconds allowed, then train_bench.py's arguments
  local name=$1 limit=$2
  shift 2
  selected "$name" || return 0
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
run dense_all "$timeout_s" --stage dense --sizes 8192,32768 --steps 3 --warmup 1

recall() {  # name, then hyscale-train's extra arguments
  local name=$1
  shift
  selected "$name" || return 0
  echo "== $name: hyscale-train -c examples/recall-warmup-gpu.yaml $*" | tee -a "$out/summary.txt"
  rm -rf "$out/$name-checkpoints" "$out/$name.jsonl"
  timeout "${HYSCALE_LC_RECALL_TIMEOUT_S:-540}" "$trainer" -c "$root/examples/recall-warmup-gpu.yaml" \
    --device cuda --checkpoint-dir "$out/$name-checkpoints" --events "$out/$name.jsonl" "$@" \
    >"$out/$name.txt" 2>&1
  local rc=$?
  # Stage starts, the evaluations and the end, from the JSON-line events.
  python3 - "$out/$name.jsonl" <<'EOF' | tee -a "$out/summary.txt"
import json
import sys

for line in open(sys.argv[1]):
    event = json.loads(line)
    if "stage_started" in event:
        s = event["stage_started"]
        print(f"stage {s['stage']} {s['name']}: {s['trains']} {s['attention']}, {s['steps']} steps")
    elif "step" in event and "evaluation" in event["step"]:
        s, e = event["step"], event["step"]["evaluation"]
        print(f"  step {int(s['step']):>4}: accuracy {e.get('accuracy', 0):.3f}, indexer recall "
              f"{e.get('indexer_recall', 0):.3f}, {s.get('tokens_per_second', 0):.0f} tokens/s")
    elif "job_finished" in event:
        f = event["job_finished"]
        print(f"job finished ok={f.get('ok', False)} in {f.get('elapsed_seconds', 0):.0f} s "
              f"{f.get('reason', '')}")
EOF
  [[ $rc == 0 ]] || { echo "   $name: exit $rc" | tee -a "$out/summary.txt"; status=1; }
}

recall recall_warmup
recall recall_control --skip-stage warmup
exit $status

