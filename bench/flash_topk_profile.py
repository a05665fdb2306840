#!/usr/bin/env python3
"""Where one hyscale::flash_topk call spends its time, per CUDA kernel, bf16 and fp8 scoring.

Random (untrained-indexer) inputs of one causal sequence; one warm-up call, then one call under
torch.profiler. The per-kernel table of docs/flash_topk.md and docs/performance.md section 5.

  python3 bench/flash_topk_profile.py --lib build-pytorch/kernels/torch/libhyscale_ops.so --n 131072
"""
import argparse

import torch
from torch.profiler import ProfilerActivity, profile


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lib", required=True, help="path to libhyscale_ops.so")
    parser.add_argument("--n", type=int, default=131072)
    parser.add_argument("--heads", type=int, default=64)
    parser.add_argument("--dim", type=int, default=128)
    parser.add_argument("--topk", type=int, default=2048)
    args = parser.parse_args()
    torch.ops.load_library(args.lib)
    g = torch.Generator(device="cuda").manual_seed(1)
    q = torch.randn(args.n, args.heads, args.dim, device="cuda", generator=g).bfloat16()
    k = torch.randn(args.n, args.dim, device="cuda", generator=g).bfloat16()
    w = torch.randn(args.n, args.heads, device="cuda", generator=g) * (args.heads * args.dim) ** -0.5
    print(f"device: {torch.cuda.get_device_name()}  N={args.n} H_I={args.heads} d_I={args.dim} "
          f"k={args.topk}")
    for fp8 in (False, True):
        torch.ops.hyscale.flash_topk(q, k, w, args.topk, fp8=fp8)
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            torch.ops.hyscale.flash_topk(q, k, w, args.topk, fp8=fp8)
            torch.cuda.synchronize()
        print("fp8" if fp8 else "bf16")
        kernels = [e for e in prof.key_averages() if e.device_time_total > 0]
        for e in sorted(kernels, key=lambda e: -e.device_time_total):
            print(f"  {e.device_time_total / 1e3:9.2f} ms  x{e.count:<4} {e.key[:100]}")


if __name__ == "__main__":
    main()
