#!/usr/bin/env bash
# Configures and builds HyScale into ${HYSCALE_BUILD_DIR:-build} (Release, Ninja, ccache when
# present). Extra arguments go to CMake's configure step. Re-running only rebuilds what changed.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${HYSCALE_BUILD_DIR:-$root/build}
launcher=()
command -v ccache >/dev/null && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
if [[ ! -f $build/build.ninja ]] || (($# > 0)); then
  cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release "${launcher[@]}" "$@"
fi
# Torch translation units take ~1 GB each to compile: one job per 2 GB of memory, at most nproc.
mem_gb=$(awk '/MemAvailable/ {print int($2 / 1048576)}' /proc/meminfo)
jobs=$(( mem_gb / 2 )); (( jobs < 1 )) && jobs=1; (( jobs > $(nproc) )) && jobs=$(nproc)
cmake --build "$build" -j "$jobs"
