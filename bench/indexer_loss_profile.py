#!/usr/bin/env python3
"""index_score_backward (issue #38) at the DeepSeek-V3.2 indexer shape of
bench/indexer_loss_bench.py, launched --launches times for a profiler to pick launches from.
Nothing is timed here.

  ncu --clock-control none -k regex:index_score_backward -s 1 -c 1 --section SpeedOfLight \\
      python3 bench/indexer_loss_profile.py --lib $LIB --n 32768
"""
import argparse

import torch

from indexer_loss_bench import index_inputs


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--lib", required=True, help="libhyscale_ops.so")
    ap.add_argument("--n", type=int, default=32768)
    ap.add_argument("--topk", type=int, default=2048)
    ap.add_argument("--launches", type=int, default=2, help="the first warms up")
    a = ap.parse_args()
    torch.ops.load_library(a.lib)
    q_i, k_i, w, idx, grad = index_inputs(a.n, a.topk, a.n)
    for _ in range(a.launches):
        torch.ops.hyscale.index_score_backward(grad, q_i, k_i, w, idx)
    torch.cuda.synchronize()


if __name__ == "__main__":
    main()
