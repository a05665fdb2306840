#!/usr/bin/env python3
"""The latent sparse attention's kernels (sparse_attn with value = key[:, :d_v], and
sparse_attn_latent_backward) at the DeepSeek-V3.2 absorbed shape of bench/sparse_attn_bench.py,
each launched --launches times, for a profiler to pick launches from. Nothing is timed here.

  ncu --clock-control none -k regex:fwd_latent -s 1 -c 1 --section SpeedOfLight \\
      python3 bench/sparse_attn_profile.py --lib $LIB --n 16384 --kind local
"""
import argparse

import torch

from sparse_attn_bench import DQK, DV, make_indices, make_inputs


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--lib", required=True, help="libhyscale_ops.so")
    ap.add_argument("--n", type=int, default=16384)
    ap.add_argument("--kind", default="local", choices=["local", "random"])
    ap.add_argument("--launches", type=int, default=2, help="of each kernel (the first warms up)")
    ap.add_argument("--forward-only", action="store_true")
    a = ap.parse_args()
    torch.ops.load_library(a.lib)
    q, kv, values, grad_out = make_inputs(a.n, value_in_key=True)
    idx = make_indices(a.n, 2048, a.kind, seed=a.n + 1)
    scale = DQK ** -0.5
    for _ in range(a.launches):
        out, lse = torch.ops.hyscale.sparse_attn_grouped(q, kv, values, idx, scale, 1)
    if not a.forward_only:
        for _ in range(a.launches):
            torch.ops.hyscale.sparse_attn_latent_backward(grad_out, q, kv, idx, scale, DV, out, lse)
    torch.cuda.synchronize()


if __name__ == "__main__":
    main()
