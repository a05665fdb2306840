#!/usr/bin/env python3
"""The indexer loss's kernels at the shapes of bench/indexer_loss_bench.py, launched --launches
times for a profiler to pick launches from. Nothing is timed here.
  --op isb:   index_score_backward (issue #38), DeepSeek-V3.2's indexer, k = 2048;
  --op dense: dense_indexer_kl (issue #40's warm-up loss, the lse given as the trainer gives it;
              random here: the kernels' work does not depend on it), the 2048x4 reference
              model's H = 64, d_qk 576, H_I 64 x 128. Its kernels run once a chunk of rows.

  ncu --clock-control none -k regex:index_score_backward -s 1 -c 1 --section SpeedOfLight \\
      python3 bench/indexer_loss_profile.py --lib $LIB --n 32768
  ncu --clock-control none -k regex:dense_target_kernel -s 30 -c 1 --section SpeedOfLight \\
      python3 bench/indexer_loss_profile.py --lib $LIB --n 32768 --op dense
Where a kernel's warps wait, by SASS instruction (the report, then its source page as CSV):
  ncu --clock-control none -k regex:index_score_backward -s 1 -c 1 --import-source no \\
      --section WarpStateStats --section SourceCounters -o isb \\
      python3 bench/indexer_loss_profile.py --lib $LIB --n 32768
  ncu -i isb.ncu-rep --page source --csv --print-source sass > isb_sass.csv
"""
import argparse

import torch

from indexer_loss_bench import DQK, dense_inputs, index_inputs


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--lib", required=True, help="libhyscale_ops.so")
    ap.add_argument("--op", choices=("isb", "dense"), default="isb")
    ap.add_argument("--n", type=int, default=32768)
    ap.add_argument("--topk", type=int, default=2048)
    ap.add_argument("--dense-heads", type=int, default=64)
    ap.add_argument("--launches", type=int, default=2, help="the first warms up")
    a = ap.parse_args()
    torch.ops.load_library(a.lib)
    ops = torch.ops.hyscale
    if a.op == "isb":
        q_i, k_i, w, idx, grad = index_inputs(a.n, a.topk, a.n)
        launch = lambda: ops.index_score_backward(grad, q_i, k_i, w, idx)
    else:
        q, kv, q_i, k_i, w = dense_inputs(a.n, a.dense_heads, a.n)
        lse = torch.randn(a.n, a.dense_heads, device="cuda") + 12.0
        launch = lambda: ops.dense_indexer_kl(q, kv, q_i, k_i, w, DQK ** -0.5, 0, 1, lse)
    for _ in range(a.launches):
        launch()
    torch.cuda.synchronize()


if __name__ == "__main__":
    main()
