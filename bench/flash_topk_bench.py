#!/usr/bin/env python3
"""FlashTopK beside the selection baselines of DESIGN.md section 4, in one process, on one GPU.

For each N (H_I = 64, d_I = 128, k = 2048 unless told otherwise) and each score distribution
(random = an untrained indexer, trained = a few strongly matching keys per query plus recency):
  hyscale  hyscale::flash_topk (sampled threshold, candidates, exact finish; no score table)
  fp8      the same with fp8=True: q and k quantized to e4m3 rows (per-row scales), scored on the
           fp8 tensor cores; exact top-k of the fp8 scores
  table    baseline (b): hyscale::index_score_table writes 8192-row fp32 blocks, then torch.topk
  scoring  the table baseline's scoring alone (no top-k): where its time goes
  naive    baseline (a), Megatron-style: fp32 einsum into [rows, H_I, N], ReLU, weighted sum,
           causal mask, torch.topk, rows chunked so it fits (only up to --naive-max)
Prints medians (CUDA events, after a warm-up), ratios, extra peak memory, scoring TFLOP/s and the
fraction of the bf16 floor (causal scoring FLOPs at --peak-tflops). Every HyScale result is checked
against a float64 reference on sampled rows (DESIGN.md section 3 exactness rule).

  python3 bench/flash_topk_bench.py --lib build-pytorch/kernels/torch/libhyscale_ops.so
"""
import argparse
import json
import statistics

import torch

TABLE_BLOCK_ROWS = 8192
# Relative error of fp8 tensor-core sums against their term magnitude that the exactness check
# allows (tests/kernels/flash_topk_cuda_test.cc measures the actual one).
FP8_ROUNDING = 1e-3


def make_inputs(n, heads, dim, kind, seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    k = torch.randn(n, dim, device="cuda", generator=g)
    if kind == "random":
        q = torch.randn(n, heads, dim, device="cuda", generator=g)
        w = torch.randn(n, heads, device="cuda", generator=g)
    else:
        # Each head of query t points at one earlier key: half anywhere in the causal window,
        # half among the last 256 (recency); positive weights. Scores: a few strong matches.
        t = torch.arange(n, device="cuda").unsqueeze(1).float()
        u = torch.rand(n, heads, device="cuda", generator=g)
        anywhere = (u * (t + 1)).long()
        recent = (t - (u * 256).floor()).clamp(min=0).long()
        anchor = torch.where(torch.arange(heads, device="cuda") % 2 == 0, anywhere, recent)
        q = 2 * k[anchor] + 0.5 * torch.randn(n, heads, dim, device="cuda", generator=g)
        w = torch.rand(n, heads, device="cuda", generator=g) + 0.1
    w = w * (heads * dim) ** -0.5
    return q.to(torch.bfloat16), k.to(torch.bfloat16), w.float()


def timed(fn, runs, warmup=1):
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(runs):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times), times


def peak_extra_bytes(fn):
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    out = fn()
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - base
    del out
    return peak


def hyscale_topk(q, k, w, topk, fp8=False):
    return torch.ops.hyscale.flash_topk(q, k, w, topk, fp8=fp8)


def fp8_problem(q, k, w):
    """What the fp8 path scores, in float64: e4m3 values (decoded by torch's own e4m3 type), the
    query rows' scales in the weights, and the keys' scales."""
    q_bits, q_scales = torch.ops.hyscale.quantize_e4m3(q)
    k_bits, k_scales = torch.ops.hyscale.quantize_e4m3(k)
    decode = lambda bits: bits.view(torch.float8_e4m3fn).double()
    return decode(q_bits), decode(k_bits), (w * q_scales).double(), k_scales.double()


def table_topk(q, k, w, topk):
    n = q.shape[0]
    indices = torch.empty(n, topk, dtype=torch.int32, device="cuda")
    scores = torch.empty(n, topk, dtype=torch.float32, device="cuda")
    for row in range(0, n, TABLE_BLOCK_ROWS):
        rows = min(TABLE_BLOCK_ROWS, n - row)
        table = torch.ops.hyscale.index_score_table(q, k, w, row, rows)
        s, i = torch.topk(table, min(topk, table.shape[1]), dim=1)
        scores[row:row + rows, :s.shape[1]] = s
        indices[row:row + rows, :i.shape[1]] = i.int()
        del table
    return indices, scores


def table_scores_only(q, k, w):
    n = q.shape[0]
    for row in range(0, n, TABLE_BLOCK_ROWS):
        table = torch.ops.hyscale.index_score_table(q, k, w, row, min(TABLE_BLOCK_ROWS, n - row))
        del table


def naive_topk(q, k, w, topk, chunk_bytes=8 << 30):
    n, heads, _ = q.shape
    m = k.shape[0]
    rows_per_chunk = max(1, chunk_bytes // (heads * m * 4))
    kf = k.float()
    indices = torch.empty(n, topk, dtype=torch.int64, device="cuda")
    keys = torch.arange(m, device="cuda")
    for row in range(0, n, rows_per_chunk):
        rows = min(rows_per_chunk, n - row)
        logits = torch.einsum("rhd,md->rhm", q[row:row + rows].float(), kf).relu_()
        scores = torch.einsum("rhm,rh->rm", logits, w[row:row + rows])
        del logits
        causal = keys.unsqueeze(0) > torch.arange(row, row + rows, device="cuda").unsqueeze(1)
        scores.masked_fill_(causal, float("-inf"))
        indices[row:row + rows] = torch.topk(scores, min(topk, m), dim=1).indices
    return indices


def check_exact(q, k, w, indices, topk, rows, key_scales=None, rounding=0.0):
    """DESIGN.md section 3 on the given rows, against float64 scores of the inputs (bf16, or the
    fp8 problem with key_scales); `rounding` > 0 widens eps by that relative error at the row's
    largest term magnitude (fp8 tensor cores accumulate coarser than eps)."""
    kd = k.double()
    for row in rows:
        visible = row + 1
        qr, wr = q[row].double(), w[row].double().unsqueeze(1)
        dots = torch.einsum("hd,md->hm", qr, kd[:visible]).clamp_min(0)
        ref = (wr * dots).sum(0)
        if key_scales is not None:
            ref = ref * key_scales[:visible]
        slack = 0.0
        if rounding > 0:  # the row's largest term magnitude (summed |w q k|), scaled like ref
            magnitude = (wr.abs() * torch.einsum("hd,md->hm", qr.abs(), kd[:visible].abs())).sum(0)
            if key_scales is not None:
                magnitude = magnitude * key_scales[:visible]
            slack = 2 * rounding * magnitude.max().item()
        selected = min(topk, visible)
        got = indices[row].long()
        assert bool((got[selected:] == -1).all()), f"row {row}: unused slots not -1"
        got = got[:selected]
        assert bool(((got >= 0) & (got < visible)).all()), f"row {row}: invalid or non-causal key"
        assert got.unique().numel() == selected, f"row {row}: duplicate keys"
        tau = torch.topk(ref, selected).values[-1].item()
        eps = 1e-4 * abs(tau) + slack
        assert bool((ref[got] >= tau - eps).all()), f"row {row}: selected a key below tau"
        chosen = torch.zeros(visible, dtype=torch.bool, device="cuda")
        chosen[got] = True
        assert bool((chosen | (ref <= tau + eps)).all()), f"row {row}: missed a key above tau"


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lib", required=True, help="path to libhyscale_ops.so")
    parser.add_argument("--sizes", default="16384,32768,65536,131072,262144")
    parser.add_argument("--heads", type=int, default=64)
    parser.add_argument("--dim", type=int, default=128)
    parser.add_argument("--topk", type=int, default=2048)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--naive-max", type=int, default=65536)
    parser.add_argument("--table-max", type=int, default=262144)
    parser.add_argument("--kinds", default="random,trained")
    parser.add_argument("--peak-tflops", type=float, default=790.0,
                        help="bf16 dense matmul rate taken as the floor (DESIGN.md: 790 measured)")
    parser.add_argument("--check-rows", type=int, default=24)
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args()
    torch.ops.load_library(args.lib)
    print(f"device: {torch.cuda.get_device_name()}  torch {torch.__version__}  "
          f"H_I={args.heads} d_I={args.dim} k={args.topk}")

    results = []
    header = (f"{'N':>7} {'inputs':>7} {'method':>7} {'median ms':>10} {'vs hyscale':>10} "
              f"{'TFLOP/s':>8} {'floor':>6} {'extra peak GiB':>14}")
    print(header)
    for n in [int(s) for s in args.sizes.split(",")]:
        flops = 2.0 * args.heads * args.dim * n * (n + 1) / 2
        floor_ms = flops / (args.peak_tflops * 1e12) * 1e3
        for kind in args.kinds.split(","):
            q, k, w = make_inputs(n, args.heads, args.dim, kind, seed=n)
            methods = {"hyscale": lambda: hyscale_topk(q, k, w, args.topk),
                       "fp8": lambda: hyscale_topk(q, k, w, args.topk, fp8=True)}
            if n <= args.table_max:
                methods["table"] = lambda: table_topk(q, k, w, args.topk)
                # Where the table baseline's time goes: its scoring alone (no top-k).
                methods["scoring"] = lambda: table_scores_only(q, k, w)
            if n <= args.naive_max:
                methods["naive"] = lambda: naive_topk(q, k, w, args.topk)

            indices, _ = hyscale_topk(q, k, w, args.topk)
            g = torch.Generator().manual_seed(n + 1)
            # Random rows plus the edges: the first, the last, and around t + 1 = k.
            sampled = torch.randint(0, n, (args.check_rows,), generator=g).tolist()
            rows = sorted(r for r in set(sampled) | {0, args.topk - 1, args.topk, n - 1} if r < n)
            check_exact(q, k, w, indices, args.topk, rows)
            indices, _ = hyscale_topk(q, k, w, args.topk, fp8=True)
            q8, k8, w8, k_scales = fp8_problem(q, k, w)
            check_exact(q8, k8, w8, indices, args.topk, rows, k_scales, rounding=FP8_ROUNDING)
            del indices, q8, k8, w8, k_scales

            base_ms = None
            for name, fn in methods.items():
                runs = args.runs if name != "naive" else max(2, args.runs // 2)
                median_ms, all_ms = timed(fn, runs)
                peak = peak_extra_bytes(fn)
                base_ms = base_ms or median_ms
                row = dict(n=n, inputs=kind, method=name, median_ms=median_ms, runs_ms=all_ms,
                           ratio_to_hyscale=median_ms / base_ms, tflops=flops / median_ms / 1e9,
                           floor_ms=floor_ms, fraction_of_floor=floor_ms / median_ms,
                           extra_peak_bytes=peak)
                results.append(row)
                print(f"{n:>7} {kind:>7} {name:>7} {median_ms:>10.2f} "
                      f"{median_ms / base_ms:>9.2f}x {row['tflops']:>8.1f} "
                      f"{row['fraction_of_floor']:>6.2f} {peak / 2**30:>14.2f}", flush=True)
            by_method = {r["method"]: r["median_ms"] for r in results
                         if r["n"] == n and r["inputs"] == kind}
            if "table" in by_method:
                print(f"{n:>7} {kind:>7} table / fp8 = {by_method['table'] / by_method['fp8']:.2f}x,"
                      f" table / hyscale = {by_method['table'] / by_method['hyscale']:.2f}x")
            del q, k, w
            torch.cuda.empty_cache()
        print(f"{n:>7} bf16 floor at {args.peak_tflops:.0f} TFLOP/s: {floor_ms:.1f} ms")
    print("exactness (DESIGN.md section 3) held on every checked row")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
