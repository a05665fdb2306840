#!/usr/bin/env bash
# Installs the Debian 12 packages HyScale builds, tests and runs with — only those missing, so a
# second run does nothing. The README, .ci/run and the container files all call this script.
set -euo pipefail

packages=(
  # toolchain
  build-essential cmake ninja-build ccache
  # trainer and kernels
  libtorch-dev protobuf-compiler libprotobuf-dev libabsl-dev libyaml-cpp-dev nlohmann-json3-dev
  libcli11-dev zlib1g-dev
  # context parallelism on CPU: c10d's Gloo process group needs the Gloo headers
  libgloo-dev
  # libtorch-dev pulls in the reference BLAS; OpenBLAS (OpenMP build, like libtorch) is ~10x faster
  libopenblas0-openmp
  # reusing freed pages instead of page-faulting fresh ones: see worker/trainer/allocator.cc
  libjemalloc-dev
  # the service: coordinator, worker agent, CLI
  libgrpc++-dev protobuf-compiler-grpc libsqlite3-dev libcpp-httplib-dev
  # tests: a real Prometheus server and promtool, clang's libFuzzer for the spec fuzz target
  libgtest-dev libgmock-dev prometheus clang libclang-rt-14-dev
  # the end-to-end tests drive the CLI and Prometheus from bash
  jq curl procps openssl
  # the web view's test (headless Chromium) and the deploy/ checks (python3 with YAML)
  chromium python3-yaml
  # the Python client (client/python/hyscale) and its test
  python3-grpcio python3-protobuf
  # the benchmarks' CPU smoke tests (bench/dsa_layer_bench.py, bench/cp_layer_bench.py under
  # ctest): Debian's PyTorch for /usr/bin/python3, on the same libtorch 1.13 as the ops library
  python3-torch
)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]} == 0)); then
  echo "install-deps: all ${#packages[@]} packages present"
  exit 0
fi
echo "install-deps: installing ${missing[*]}"
sudo=""
[[ $(id -u) -eq 0 ]] || sudo="sudo"
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq
$sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
