#!/usr/bin/env bash
# Builds the fuzz targets with clang and fuzzes each for a bounded time (job specs, then the
# API's request messages):
#   tests/fuzz/run.sh [seconds]          (default 60, per target)
# Build dir: ${HYSCALE_FUZZ_BUILD_DIR:-<repo>/build-fuzz}. Exits non-zero on a crash, leak,
# sanitizer report, hang (> 10 s on one input) or broken contract; the input is saved in
# <build>/artifacts/ and replays with `<build>/job_spec_fuzz <file>` (or request_fuzz).
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
seconds=${1:-60}
build=${HYSCALE_FUZZ_BUILD_DIR:-$root/build-fuzz}

launcher=()
command -v ccache >/dev/null && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
if [[ ! -f $build/build.ninja ]]; then
  CC=clang CXX=clang++ cmake -S "$root/tests/fuzz" -B "$build" -G Ninja \
    -DCMAKE_BUILD_TYPE=RelWithDebInfo "${launcher[@]}"
fi
cmake --build "$build" -j "$(nproc)"

# New inputs go to the first directory; the checked-in seeds and the examples only seed it.
mkdir -p "$build/corpus" "$build/request-corpus" "$build/seeds" "$build/artifacts"
cp "$root"/examples/*.yaml "$build/seeds/"
common=(-max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -max_len=16384
  -artifact_prefix="$build/artifacts/" -print_final_stats=1)
"$build/job_spec_fuzz" "$build/corpus" "$root/tests/fuzz/corpus" "$build/seeds" \
  -dict="$root/tests/fuzz/job_spec.dict" "${common[@]}"
"$build/request_fuzz" "$build/request-corpus" "$root/tests/fuzz/request_corpus" "${common[@]}"
