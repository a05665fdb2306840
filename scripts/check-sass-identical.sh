#!/usr/bin/env bash
# Whether a change keeps the CUDA kernels' machine code, checked without a GPU: compiles every .cu
# file under kernels/cuda at BASE and in the working tree with the flags of kernels/CMakeLists.txt
# (one nvcc at a time), then compares each kernel by name: its SASS bytes, relocations, attributes
# and ptxas resources (scripts/kernel_code_diff.py says what it compares and reports).
# For refactors that should not change the code: moving kernels between files, splitting helpers.
#   usage: scripts/check-sass-identical.sh BASE [--rename FROM=TO ...]
#   (--rename maps demangled names, e.g. "(anonymous namespace)=attn" for code moved out of an
#   anonymous namespace.) Exit status 1 when the code differs.
#   CUDA_HOME          the toolkit (default /usr/local/cuda)
#   HYSCALE_SASS_OUT   where the two builds go (default a new temporary folder)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
base=$1
shift
nvcc=${CUDA_HOME:-/usr/local/cuda}/bin/nvcc
out=${HYSCALE_SASS_OUT:-$(mktemp -d)}
# The CUDA flags of the hyscale_kernels_cuda target, and -v for ptxas' resources.
flags=(-std=c++17 -O3 -Xcompiler -fPIC "-gencode=arch=compute_90a,code=sm_90a"
       "-gencode=arch=compute_90,code=sm_90" -Xptxas=-warn-spills -Xptxas -v --threads 1)

# build SOURCE_ROOT OUT: each .cu's cubins (nvcc --keep) and ptxas report in OUT/<its path>/.
build() {
  local src=$1 dst=$2 file name
  for file in $(cd "$src" && find kernels/cuda -name '*.cu' | sort); do
    name=$dst/${file%.cu}
    mkdir -p "$name"
    echo "  $file"
    if ! "$nvcc" "${flags[@]}" -I"$src" --keep --keep-dir "$name" -c "$src/$file" \
        -o "$name/object.o" > "$name/ptxas.ptxas.txt" 2>&1; then
      cat "$name/ptxas.ptxas.txt"
      exit 1
    fi
  done
}

mkdir -p "$out/base-src"
git -C "$root" archive "$base" kernels | tar -x -C "$out/base-src"
echo "$base:"
build "$out/base-src" "$out/base"
echo "working tree:"
build "$root" "$out/head"
python3 "$root/scripts/kernel_code_diff.py" "$out/base" "$out/head" "$@"
