#!/usr/bin/env bash
# The service path on a GPU machine (issue #8): builds the coordinator, worker agent, CLI and
# trainer against the installed PyTorch, then runs tests/e2e/rendezvous_e2e.sh's cp-train: hyscaled
# and one hyscale-worker on loopback (token auth) place one context-parallel job (zigzag,
# context_parallel = every GPU the worker detects) over all the GPUs, rank 0 publishes its
# rendezvous address through the coordinator, the job must SUCCEED, and each rank must name a GPU
# of its own. The summary (job, ranks, GPUs, wall time, final loss and accuracy) goes to
# OUT/summary.txt, beside the job, the ranks' and daemons' logs and nvidia-smi samples.
# Usage: scripts/gpu-service-check.sh [OUT]   (default $OUT, else BUILD_DIR/gpu-service)
#   HYSCALE_DEPS_PREFIX  unpacked Debian packages (see scripts/build-with-pytorch.sh); without it,
#                        .deps/debs (scripts/fetch-gpu-deps.sh) is unpacked into BUILD_DIR/deps
#                        (and used from there when HYSCALE_BUILD=0)
#   HYSCALE_BUILD_DIR    build folder (default build-pytorch)
#   HYSCALE_BUILD=0      use the binaries already in HYSCALE_BUILD_DIR (e.g. a CPU build)
#   HYSCALE_DEVICES      the worker's --devices (default auto: its GPUs; cpu:2 runs the same job on
#                        two CPU ranks)
#   HYSCALE_STEPS        training steps (default 100); HYSCALE_TIMEOUT_S: the job's limit (300)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${HYSCALE_BUILD_DIR:-$root/build-pytorch}
out=${1:-${OUT:-$build/gpu-service}}
mkdir -p "$out"
out=$(cd "$out" && pwd)

if [[ -z ${HYSCALE_DEPS_PREFIX:-} ]]; then
  if [[ ${HYSCALE_BUILD:-1} != 0 && -d $root/.deps/debs ]]; then
    mkdir -p "$build/deps"
    for deb in "$root"/.deps/debs/*.deb; do dpkg -x "$deb" "$build/deps"; done
  fi
  if [[ -d $build/deps ]]; then export HYSCALE_DEPS_PREFIX=$build/deps; fi
fi
if [[ -n ${HYSCALE_DEPS_PREFIX:-} ]]; then
  # The daemons load gRPC and the rest from there; the e2e script runs its jq (first in PATH: a
  # system jq would load the prefix's libjq of another version).
  export LD_LIBRARY_PATH="$HYSCALE_DEPS_PREFIX/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  export PATH="$HYSCALE_DEPS_PREFIX/usr/bin:$PATH"
fi

if [[ ${HYSCALE_BUILD:-1} != 0 ]]; then
  HYSCALE_BUILD_DIR=$build HYSCALE_WITH_SERVICE=ON HYSCALE_CUDA=${HYSCALE_CUDA:-ON} \
    HYSCALE_TARGETS="hyscaled hyscale-worker hyscale hyscale-train" \
    "$root/scripts/build-with-pytorch.sh" >"$out/build.log" 2>&1 ||
    { tail -n 30 "$out/build.log"; echo "gpu-service-check: build failed (see $out/build.log)"; exit 1; }
fi
if command -v nvidia-smi >/dev/null; then nvidia-smi -L | tee "$out/gpus.txt"; fi
# The trainers inherit this through the worker: their small collectives need no NVLink multicast,
# which on shared hosts can take the GPUs out of service.
export NCCL_NVLS_ENABLE=${NCCL_NVLS_ENABLE:-0}

HYSCALE_E2E_DEVICES=${HYSCALE_DEVICES:-auto} HYSCALE_E2E_STEPS=${HYSCALE_STEPS:-100} \
  HYSCALE_E2E_TIMEOUT_S=${HYSCALE_TIMEOUT_S:-300} HYSCALE_E2E_OUT=$out \
  bash "$root/tests/e2e/rendezvous_e2e.sh" "$build" cp-train
echo "gpu-service-check: passed; summary in $out/summary.txt"
