#!/usr/bin/env bash
# The GPU check, for a machine with an NVIDIA GPU and PyTorch (CUDA): builds HyScale against
# PyTorch's libtorch with the CUDA kernels, runs the whole test suite (GPU tests included), then
# the kernel benchmarks, and prints a summary table. Results (JSON, logs) go to HYSCALE_GPU_OUT
# (default build-pytorch/gpu-check).
#   HYSCALE_DEPS_PREFIX    as for scripts/build-with-pytorch.sh
#   HYSCALE_BENCH_SIZES    N values for the FlashTopK benchmark (default 16K..256K)
#   HYSCALE_SA_BENCH_SIZES   N values for the sparse attention benchmark (default 32K, 64K)
#   HYSCALE_SA_BENCH_GROUPS  query-group sizes G it runs (default 1, 4, 16)
#   HYSCALE_INDEXER_BENCH_SIZES  N values for the indexer-loss benchmark (default 32K, 128K)
#   HYSCALE_DENSE_BENCH_SIZES    N values of its dense warm-up loss (default 32K; none: skip)
#   HYSCALE_DSA_BENCH_SIZES  N values for the DSA layer benchmark (default 32K, 64K, 128K)
#   HYSCALE_DSA_BENCH_MAX_N  bound of its longest-trainable-N search (default 1M)
#   HYSCALE_TRAIN_BENCH_SIZES  N values for the trainer's benchmark (default 32K, 128K)
#   HYSCALE_TRAIN_BENCH_MODELS its reference models (default both in examples/train-ref-*.yaml)
#   HYSCALE_CHUNK_BENCH_SIZES  N values of the 2048x4 model with queries in chunks of 8192 and of
#                              its dense warm-up in the trainer's chunks (default 32K; none: skip)
#   HYSCALE_TEST_TIMEOUT_S bound on each test (default 240 s)
#   HYSCALE_SANITIZE=1     also run the small GPU tests (FlashTopK, sparse attention, the dense
#                          warm-up's loss) under compute-sanitizer memcheck
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${HYSCALE_BUILD_DIR:-$root/build-pytorch}
out=${HYSCALE_GPU_OUT:-$build/gpu-check}
mkdir -p "$out"
# The deps' libraries load others of theirs (absl), which the binaries' run paths do not reach.
if [[ -n ${HYSCALE_DEPS_PREFIX:-} ]]; then
  export LD_LIBRARY_PATH="$HYSCALE_DEPS_PREFIX/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$out/gpu.txt"

# A test's time is bounded well inside a device call (a kernel that waits forever must not take
# the whole call; the whole suite ran in about two minutes on the H200).
HYSCALE_BUILD_DIR=$build HYSCALE_CUDA=ON "$root/scripts/build-with-pytorch.sh" \
  --timeout "${HYSCALE_TEST_TIMEOUT_S:-240}" 2>&1 | tee "$out/tests.log" | grep -E "tests passed|tests failed|Failed|SKIPPED|\*\*\*" || true
grep -q "100% tests passed" "$out/tests.log" || { echo "gpu-check: tests failed (see $out/tests.log)"; exit 1; }
"$build/tests/kernels/flash_topk_cuda_test" 2>&1 | tail -3
if [[ ${HYSCALE_SANITIZE:-0} == 1 ]]; then
  compute-sanitizer --tool memcheck --error-exitcode 1 \
    "$build/tests/kernels/flash_topk_cuda_test" --gtest_filter='*Gather*:*Ties*:*Rejects*:*Fp8*:*Quantization*' \
    >"$out/memcheck.log" 2>&1 && echo "memcheck: clean" || { echo "memcheck: FAILED"; tail -30 "$out/memcheck.log"; }
  grep -E "ERROR SUMMARY|PASSED|FAILED" "$out/memcheck.log" | tail -3
  # The sparse attention kernels: every forward, and the wgmma backward (values inside the keys).
  compute-sanitizer --tool memcheck --error-exitcode 1 \
    "$build/tests/kernels/sparse_attn_cuda_test" --gtest_filter='*Forward*:*ValuesInsideKeys*' \
    >"$out/memcheck_sparse_attn.log" 2>&1 && echo "memcheck (sparse attention): clean" ||
    { echo "memcheck (sparse attention): FAILED"; tail -30 "$out/memcheck_sparse_attn.log"; }
  # The dense warm-up's kernels (fused target, index-score backward by rows and by keys).
  compute-sanitizer --tool memcheck --error-exitcode 1 \
    "$build/tests/kernels/indexer_loss_cuda_test" \
    --gtest_filter='*DenseIndexerKlMatchesTheFloat64CpuOp:*DeterministicDenseIndexerKl*' \
    >"$out/memcheck_dense.log" 2>&1 && echo "memcheck (dense warm-up): clean" ||
    { echo "memcheck (dense warm-up): FAILED"; tail -30 "$out/memcheck_dense.log"; }
fi

python3 "$root/bench/flash_topk_bench.py" --lib "$build/kernels/torch/libhyscale_ops.so" \
  --sizes "${HYSCALE_BENCH_SIZES:-16384,32768,65536,131072,262144}" \
  --json "$out/flash_topk.json" 2>&1 | tee "$out/flash_topk.txt"

"$build/tests/kernels/sparse_attn_cuda_test" 2>&1 | tail -3
python3 "$root/bench/sparse_attn_bench.py" --lib "$build/kernels/torch/libhyscale_ops.so" \
  --sizes "${HYSCALE_SA_BENCH_SIZES:-32768,65536}" --groups "${HYSCALE_SA_BENCH_GROUPS:-1,4,16}" \
  --json "$out/sparse_attn.json" 2>&1 | tee "$out/sparse_attn.txt"

"$build/tests/kernels/indexer_loss_cuda_test" 2>&1 | tail -3
python3 "$root/bench/indexer_loss_bench.py" --lib "$build/kernels/torch/libhyscale_ops.so" \
  --sizes "${HYSCALE_INDEXER_BENCH_SIZES:-32768,131072}" \
  --dense-sizes "${HYSCALE_DENSE_BENCH_SIZES:-32768}" --json "$out/indexer_loss.json" 2>&1 | tee "$out/indexer_loss.txt"
python3 "$root/bench/dsa_layer_bench.py" --lib "$build/kernels/torch/libhyscale_ops.so" \
  --sizes "${HYSCALE_DSA_BENCH_SIZES:-32768,65536,131072}" \
  --max-n "${HYSCALE_DSA_BENCH_MAX_N:-1048576}" \
  --json "$out/dsa_layer.json" 2>&1 | tee "$out/dsa_layer.txt"

# The trainer's benchmark of record: hyscale-train's whole step on the reference models.
python3 "$root/bench/train_bench.py" --trainer "$build/worker/trainer/hyscale-train" \
  --models "${HYSCALE_TRAIN_BENCH_MODELS:-$root/examples/train-ref-2048x4.yaml,$root/examples/train-ref-4096x2.yaml}" \
  --sizes "${HYSCALE_TRAIN_BENCH_SIZES:-32768,131072}" --device cuda \
  --json "$out/train_bench.json" 2>&1 | tee "$out/train_bench.txt"

# Query-chunked layers (issue #39) against the whole-sequence runs above, and the dense warm-up
# stage (issue #40) with the chunks the trainer picks.
chunk_sizes=${HYSCALE_CHUNK_BENCH_SIZES:-32768}
[[ $chunk_sizes == none ]] && exit 0
python3 "$root/bench/train_bench.py" --trainer "$build/worker/trainer/hyscale-train" \
  --models "$root/examples/train-ref-2048x4.yaml" --query-chunk 8192 \
  --sizes "$chunk_sizes" --device cuda \
  --json "$out/train_bench_chunked.json" 2>&1 | tee "$out/train_bench_chunked.txt"
python3 "$root/bench/train_bench.py" --trainer "$build/worker/trainer/hyscale-train" \
  --models "$root/examples/train-ref-2048x4.yaml" --stage warmup --steps 4 --warmup 1 \
  --sizes "$chunk_sizes" --device cuda \
  --json "$out/train_bench_warmup.json" 2>&1 | tee "$out/train_bench_warmup.txt"
