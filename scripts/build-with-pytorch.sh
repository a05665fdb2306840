#!/usr/bin/env bash
# Builds HyScale against the libtorch of the installed PyTorch (e.g. PyTorch 2.11 + CUDA 13 on a
# GPU machine) instead of Debian's libtorch, then runs the test suite.
#   HYSCALE_DEPS_PREFIX  a folder holding Debian packages unpacked with `dpkg -x` (for machines
#                        without absl, yaml-cpp, CLI11, GoogleTest or protobuf installed)
#                        (scripts/fetch-gpu-deps.sh downloads the ones .deps/debs holds)
#   HYSCALE_BUILD_DIR    build folder (default build-pytorch)
#   HYSCALE_WITH_SERVICE ON to build the coordinator, agent and CLI too (needs gRPC; default OFF:
#                        GPU images rarely carry gRPC, and the service never links torch anyway)
#   HYSCALE_TARGETS      build only these targets (space-separated) and run no tests
# Extra arguments go to ctest (e.g. -R Kernel).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${HYSCALE_BUILD_DIR:-$root/build-pytorch}
torch_prefix=$(python3 -c 'import torch; print(torch.utils.cmake_prefix_path)')
prefixes="$torch_prefix"
extra=()
if [[ -n ${HYSCALE_DEPS_PREFIX:-} ]]; then
  deps=$HYSCALE_DEPS_PREFIX
  prefixes="$prefixes;$deps/usr;$deps/usr/lib/x86_64-linux-gnu/cmake;$deps/usr/share/cmake"
  export LD_LIBRARY_PATH="$deps/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  # gRPC finds re2 through pkg-config; the .pc files name /usr, so they are read from the prefix
  # only and their paths moved into it.
  export PKG_CONFIG_LIBDIR="$deps/usr/lib/x86_64-linux-gnu/pkgconfig:$deps/usr/share/pkgconfig"
  export PKG_CONFIG_SYSROOT_DIR="$deps"
  extra+=(-DProtobuf_PROTOC_EXECUTABLE="$deps/usr/bin/protoc"
          -DProtobuf_INCLUDE_DIR="$deps/usr/include"
          -DProtobuf_LIBRARY="$deps/usr/lib/x86_64-linux-gnu/libprotobuf.so")
fi
export TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-9.0a}
if ! command -v nvcc >/dev/null && [[ -x /usr/local/cuda/bin/nvcc ]]; then
  export CUDACXX=/usr/local/cuda/bin/nvcc
fi
cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DHYSCALE_WITH_SERVICE="${HYSCALE_WITH_SERVICE:-OFF}" -DHYSCALE_CUDA="${HYSCALE_CUDA:-AUTO}" -DCMAKE_PREFIX_PATH="$prefixes" "${extra[@]}"
if [[ -n ${HYSCALE_TARGETS:-} ]]; then
  # shellcheck disable=SC2086 # a list of target names
  cmake --build "$build" -j "$(nproc)" --target $HYSCALE_TARGETS
  exit
fi
cmake --build "$build" -j "$(nproc)"
cd "$build"
ctest --output-on-failure -j 4 --timeout 900 "$@"
