#!/usr/bin/env bash
# Quick start (1): install what is missing, build, and train the demo DSA model on synthetic
# associative recall (examples/recall-demo.yaml). Extra arguments go to hyscale-train, e.g.
# `scripts/demo.sh --attention dense` for the dense-attention comparison.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
"$root/scripts/install-deps.sh"
"$root/scripts/build.sh"
build=${HYSCALE_BUILD_DIR:-$root/build}
run_dir=${HYSCALE_RUN_DIR:-$root/runs/recall-demo}
mkdir -p "$run_dir"
exec "$build/worker/trainer/hyscale-train" --config "$root/examples/recall-demo.yaml" \
  --checkpoint-dir "$run_dir/checkpoints" --events "$run_dir/events.jsonl" "$@"
