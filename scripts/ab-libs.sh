#!/usr/bin/env bash
# Builds libhyscale_ops.so once per variant of the working tree, for the A/B benchmarks that
# load each build in its own process on one GPU (bench/dense_loss_ab.py, bench/sparse_attn_ab.py):
#   scripts/ab-libs.sh OUT NAME=[PATCH]...
# NAME= is the tree as it is; NAME=PATCH applies PATCH (git apply) for that build and takes it
# back after, so the patches of docs/results (ideas tried) replay on a later tree. One build
# folder (HYSCALE_BUILD_DIR, default build-ab) serves every variant: each recompiles only what its
# patch touches. HYSCALE_AB_TARGETS adds targets to every build (e.g. indexer_loss_cuda_test, copied
# as OUT/NAME-indexer_loss_cuda_test). Builds against PyTorch as scripts/build-with-pytorch.sh
# does (HYSCALE_DEPS_PREFIX as there). Prints the --libs argument: NAME=OUT/NAME.so,...
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
(($# >= 2)) || { echo "usage: scripts/ab-libs.sh OUT NAME=[PATCH]..." >&2; exit 2; }
out=$(mkdir -p "$1" && cd "$1" && pwd)
shift
export HYSCALE_BUILD_DIR=${HYSCALE_BUILD_DIR:-$root/build-ab}
export HYSCALE_CUDA=${HYSCALE_CUDA:-ON}
extra=${HYSCALE_AB_TARGETS:-}
cd "$root"
for variant in "$@"; do  # every patch applies before anything is built
  [[ $variant == *=* ]] || { echo "ab-libs: '$variant' is not NAME=[PATCH]" >&2; exit 2; }
  patch=${variant#*=}
  [[ -z $patch ]] || git apply --check "$patch" ||
    { echo "ab-libs: $patch does not apply to this tree" >&2; exit 1; }
done
applied=""
trap '[[ -z $applied ]] || git apply -R "$applied"' EXIT
libs=()
for variant in "$@"; do
  name=${variant%%=*} patch=${variant#*=}
  [[ -z $patch ]] || { git apply "$patch"; applied=$patch; }
  start=$(date +%s)
  HYSCALE_TARGETS="hyscale_ops $extra" "$root/scripts/build-with-pytorch.sh" \
    >"$out/build-$name.log" 2>&1 ||
    { tail -30 "$out/build-$name.log"; echo "ab-libs: $name failed to build" >&2; exit 1; }
  echo "ab-libs: $name built in $(($(date +%s) - start)) s" >&2
  cp "$HYSCALE_BUILD_DIR/kernels/torch/libhyscale_ops.so" "$out/$name.so"
  for target in $extra; do
    found=$(find "$HYSCALE_BUILD_DIR" -type f -name "$target" -perm -u+x | head -1)
    [[ -z $found ]] || cp "$found" "$out/$name-$target"
  done
  [[ -z $patch ]] || { git apply -R "$patch"; applied=""; }
  libs+=("$name=$out/$name.so")
done
(IFS=,; echo "${libs[*]}")
