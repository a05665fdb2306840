#!/usr/bin/env bash
# Quick start (1): install what is missing, build, and run the demo job end to end on the
# embedded default service. `hyscale up` starts a coordinator (hyscaled, its SQLite store under
# runs/hyscale) and a local worker agent, submits examples/recall-demo.yaml, follows it to the end
# (progress bar, per-phase breakdown), then stops both; it exits 0 when the job SUCCEEDED.
# Extra arguments go to `hyscale up` (e.g. -f another-job.yaml).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
"$root/scripts/install-deps.sh"
"$root/scripts/build.sh"
build=${HYSCALE_BUILD_DIR:-$root/build}
data_dir=${HYSCALE_RUN_DIR:-$root/runs/hyscale}
exec "$build/client/hyscale" up --data-dir "$data_dir" -f "$root/examples/recall-demo.yaml" "$@"
