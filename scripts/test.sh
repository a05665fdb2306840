#!/usr/bin/env bash
# Quick start (2): install what is missing, build, fuzz the job-spec parser for a bounded time
# (HYSCALE_FUZZ_SECONDS, default 60), and run the whole test suite (unit, GPU where there is one,
# and the service's end-to-end scenarios with real processes).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
"$root/scripts/install-deps.sh"
"$root/scripts/build.sh"
"$root/tests/fuzz/run.sh" "${HYSCALE_FUZZ_SECONDS:-60}" 2>&1 | tail -n 12
build=${HYSCALE_BUILD_DIR:-$root/build}
cd "$build"
ctest --output-on-failure -j "$(nproc)" --timeout 900
