#!/usr/bin/env python3
"""What a block of the latent sparse attention forward (or, with --backward, the latent backward)
pays once, against what its loop costs: sparse_attn (value = key[:, :d_v]) at the DeepSeek-V3.2
absorbed shape (H = 128, d_qk = 576, d_v = 512) with a fixed number of queries and keys and every
slot valid, timed for several k. Time grows by the loop's cost per slot; a least-squares line
through the larger k gives that cost (per 2048 slots) and the intercept, which every block pays
whatever k is: its launch, its first indices, Q (and dO) and first key blocks, the last products
with nothing behind them, the output (dq); for the backward also the op's other kernels, chiefly
the one forming D = rowsum(dO * O). Each point gives the median SM clock it ran at
(bench/gpu_clock.py): a line through points at different clocks mixes two effects.
Correctness is sparse_attn_cuda_test's and sparse_attn_bench.py's business.

  python3 bench/sparse_attn_kscan.py --lib build-gpu/kernels/torch/libhyscale_ops.so [--backward]

Selections: "local" is a window of k consecutive keys sliding with the query (neighbouring
queries share most of it, as in a trained model's recent-token selections), "random" k
distinct keys drawn uniformly from all N.
"""
import argparse
import json
import statistics

import torch

from sparse_attn_bench import DQK, DV, H, timed_with_clock


def selections(kind, m, n, k, generator):
    if kind == "random":
        return torch.rand(m, n, device="cuda", generator=generator).topk(k, dim=1).indices.int()
    first = (torch.arange(m, device="cuda") * (n - k) // m).unsqueeze(1)
    return (first + torch.arange(k, device="cuda").unsqueeze(0)).int()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--lib", required=True, help="libhyscale_ops.so")
    ap.add_argument("--queries", type=int, default=8192)
    ap.add_argument("--keys", type=int, default=65536)
    ap.add_argument("--ks", default="128,256,512,1024,2048,4096,8192")
    ap.add_argument("--kinds", default="local,random")
    ap.add_argument("--fit-from", type=int, default=1024, help="smallest k in the line's fit")
    ap.add_argument("--runs", type=int, default=7)
    ap.add_argument("--backward", action="store_true", help="time the latent backward instead")
    a = ap.parse_args()
    torch.ops.load_library(a.lib)
    ks = [int(k) for k in a.ks.split(",")]
    if max(ks) > a.keys:
        ap.error("every k must be at most --keys")
    g = torch.Generator(device="cuda").manual_seed(1)
    q = torch.randn(a.queries, H, DQK, device="cuda", generator=g).bfloat16()
    kv = torch.randn(a.keys, DQK, device="cuda", generator=g).bfloat16()
    if a.backward:
        grad_out = torch.randn(a.queries, H, DV, device="cuda", generator=g).bfloat16()
    scale = DQK ** -0.5
    flops_per_slot = 2.0 * a.queries * H * ((3 * DQK + 2 * DV) if a.backward else (DQK + DV))
    for kind in a.kinds.split(","):
        points = []
        for k in ks:
            idx = selections(kind, a.queries, a.keys, k, g)
            run = lambda: torch.ops.hyscale.sparse_attn_grouped(q, kv, kv[:, :DV], idx, scale, 1)
            if a.backward:
                out, lse = run()
                run = lambda: torch.ops.hyscale.sparse_attn_latent_backward(
                    grad_out, q, kv, idx, scale, DV, out, lse)
            ms, clock = timed_with_clock(run, a.runs)
            points.append((k, ms))
            print(json.dumps(dict(kind=kind, k=k, ms=ms, tflops=flops_per_slot * k / ms / 1e9,
                                  sm_mhz=clock and clock["sm_mhz"])), flush=True)
            del idx
            torch.cuda.empty_cache()
        used = [(k, ms) for k, ms in points if k >= a.fit_from]
        if len(used) < 2:
            continue
        slope, intercept = statistics.linear_regression([k for k, _ in used],
                                                        [ms for _, ms in used])
        at_2048 = dict(points).get(2048, intercept + slope * 2048)  # measured where it was
        print(f"{kind}: intercept {intercept:.3f} ms, {slope * 2048:.3f} ms per 2048 slots, "
              f"intercept {100 * intercept / at_2048:.1f} % of the time at k = 2048, "
              f"loop alone {flops_per_slot / slope / 1e9:.0f} TFLOP/s", flush=True)


if __name__ == "__main__":
    main()
