#!/usr/bin/env bash
# Builds the job-spec fuzz target with clang and fuzzes it for a bounded time:
#   tests/fuzz/run.sh [seconds]          (default 60)
# Build dir: ${HYSCALE_FUZZ_BUILD_DIR:-<repo>/build-fuzz}. Exits non-zero on a crash, leak,
# sanitizer report, hang (> 10 s on one input) or broken contract; the input is saved in
# <build>/artifacts/ and replays with `<build>/job_spec_fuzz <file>`.
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
mkdir -p "$build/corpus" "$build/seeds" "$build/artifacts"
cp "$root"/examples/*.yaml "$build/seeds/"
"$build/job_spec_fuzz" "$build/corpus" "$root/tests/fuzz/corpus" "$build/seeds" \
  -dict="$root/tests/fuzz/job_spec.dict" -max_total_time="$seconds" -timeout=10 \
  -rss_limit_mb=2048 -max_len=16384 -artifact_prefix="$build/artifacts/" -print_final_stats=1
