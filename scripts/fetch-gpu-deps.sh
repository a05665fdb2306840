#!/usr/bin/env bash
# Downloads into .deps/debs (git-ignored) the Debian 12 packages a GPU machine without network
# needs to build and run HyScale against its PyTorch (scripts/build-with-pytorch.sh), the
# coordinator, worker agent and CLI included (HYSCALE_WITH_SERVICE=ON). Run it on a Debian 12
# machine with apt; carry .deps to the GPU machine and unpack it there:
#   for deb in .deps/debs/*.deb; do dpkg -x "$deb" /tmp/deps; done
#   HYSCALE_DEPS_PREFIX=/tmp/deps HYSCALE_WITH_SERVICE=ON scripts/build-with-pytorch.sh
# (scripts/gpu-service-check.sh unpacks it itself.) The GPU machine must have a C++ compiler,
# CMake, Ninja, zlib's headers, and PyTorch; everything else comes from here. Runtime libraries
# come along with their -dev packages even where Ubuntu has the same soname: the -dev packages'
# lib*.so links point at them.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
dest=$root/.deps/debs

packages=(
  # The trainer and the tests.
  libabsl-dev libabsl20220623 libcli11-dev libgtest-dev libgmock-dev
  libprotobuf-dev libprotobuf32 libprotoc32 protobuf-compiler
  libyaml-cpp-dev libyaml-cpp0.7 nlohmann-json3-dev
  # The service: gRPC (and what its CMake package finds: OpenSSL, c-ares, re2 through
  # pkg-config), SQLite for the coordinator's store, cpp-httplib for its web view and metrics.
  libgrpc++-dev libgrpc++1.51 libgrpc-dev libgrpc29 protobuf-compiler-grpc
  libre2-dev libre2-9 libc-ares-dev libc-ares2 libssl-dev libssl3
  pkgconf pkgconf-bin libpkgconf3
  libsqlite3-dev libsqlite3-0
  libcpp-httplib-dev libcpp-httplib0.11 libbrotli1
  # jq: the end-to-end scripts read the CLI's JSON with it.
  jq libjq1 libonig5
)

mkdir -p "$dest"
cd "$dest"
apt-get download "${packages[@]}"
du -sh "$dest"
