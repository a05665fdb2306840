# A/B at 32K: HEAD (the dense backward's lookahead generalized, 3 stages) against a 4-stage ring,
# each with indexer_loss_cuda_test; then HEAD's loss parts at 128K (one run).
set -uo pipefail
source ab/env.sh
t0=$(date +%s)
S=$OUT/summary39.txt
mkdir -p /tmp/libs
build() { HYSCALE_BUILD_DIR=$root/build-ab HYSCALE_TARGETS="hyscale_ops indexer_loss_cuda_test" scripts/build-with-pytorch.sh > $OUT/build_$1.log 2>&1 || { echo "build $1 failed"; tail -30 $OUT/build_$1.log; } | tee -a $S
  cp build-ab/kernels/torch/libhyscale_ops.so /tmp/libs/$1.so; echo "built $1 $(( $(date +%s) - t0 )) s" | tee -a $S
  timeout 90 build-ab/tests/kernels/indexer_loss_cuda_test > $OUT/$1_tests.log 2>&1; echo "$1 indexer_loss_cuda_test rc $?" | tee -a $S; grep -E "PASSED|FAILED" $OUT/$1_tests.log | tee -a $S; }
rm -rf /tmp/pristine_kernels && cp -a kernels /tmp/pristine_kernels
restore() { rm -rf kernels && cp -a /tmp/pristine_kernels kernels; touch kernels/cuda/*.cu; }
{ git apply ab/dense_bwd_4stage.patch 2>/dev/null || patch -p1 < ab/dense_bwd_4stage.patch > /dev/null; } || echo "patch failed" | tee -a $S
touch kernels/cuda/*.cu; build stage4; restore
build base
cd bench
timeout 200 python3 dense_loss_ab.py --libs base=/tmp/libs/base.so,stage4=/tmp/libs/stage4.so --child-timeout 40 --n 32768 --rounds 2 --runs 3 2>&1 | tee -a $S
timeout $(( 590 - ($(date +%s) - t0) )) python3 dense_loss_ab.py --libs base=/tmp/libs/base.so --child-timeout 120 --n 131072 --rounds 1 --runs 2 2>&1 | tee -a $S
echo "done $(( $(date +%s) - t0 )) s" | tee -a $S
