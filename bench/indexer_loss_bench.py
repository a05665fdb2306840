"""The indexer's loss path on one GPU (issue #38), at DeepSeek-V3.2's shape.

a) hyscale::index_score_backward alone (atomic and deterministic modes) in TFLOP/s, counting
   6 H_I d_I FLOPs per valid (query, key) pair, with its SM clock, beside Megatron's unfused path
   (gather k_I per row chunk, fp32 einsum, ReLU, weighted sum, autograd; DESIGN.md section 4,
   baseline 4 applied to the index scores) where it fits a time budget.
b) The whole indexer-loss path against the latent attention backward (H = 128, d_qk 576, d_v
   512) at the same N and selection (the issue asks for at most 15 %): as the trainer runs it,
   the target from the latent backward (sparse_attn_latent_backward_target: what it adds to the
   backward's time) and indexer_loss_backward (the scores, the KL and its gradient inside the
   index scores' backward); and composed from the standalone ops, the target apart
   (selected_attention_mass), indexer_kl forward and backward, index_score_backward.

c) The dense warm-up's loss (dense_indexer_kl, issue #40) at the 2048x4 reference model's shape
   (--dense-heads 64 heads of d_qk 576, H_I 64 x 128), with the lse of the frozen attention's
   output pass as the trainer passes it: its time and rate (2 H d_qk + 6 H_I d_I FLOPs a visible
   pair: the planner's dense_indexer_loss_tflops), its kernels' shares of the GPU time
   (torch.profiler), and the output pass itself as the trainer runs it (sparse_attn_latent over
   each row's whole prefix, 2048 rows at a time).

Correctness first: each size's gradients against a float64 reference on a sample of fresh rows.
Selections are causal, duplicate-free and in key order, as FlashTopK returns them (the "random"
kind of sparse_attn_bench.make_indices; before 2026-12-06 this benchmark took them in no order,
"shuffled", which costs the index-score backward 4 % more at 128K).

    python3 bench/indexer_loss_bench.py --lib build-pytorch/kernels/torch/libhyscale_ops.so \
        --sizes 32768,131072 [--json out.json]
"""
import argparse
import json

import torch

from sparse_attn_bench import DQK, DV, H, make_indices, timed_with_clock
from gpu_clock import describe

HEADS_I, DIM_I = 64, 128


def index_inputs(n, topk, seed, idx=None):
    """q_I, k_I, w, the selection (idx, else a random one in key order) and a gradient of its
    scores on its valid slots."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    q_i = torch.randn(n, HEADS_I, DIM_I, device="cuda", generator=g).bfloat16()
    k_i = torch.randn(n, DIM_I, device="cuda", generator=g).bfloat16()
    w = torch.randn(n, HEADS_I, device="cuda", generator=g) * HEADS_I ** -0.5
    if idx is None:
        idx = make_indices(n, topk, "random", seed)
    grad = torch.randn(n, topk, device="cuda", generator=g) * (idx >= 0)
    return q_i, k_i, w, idx, grad


def reference_backward(q_i, k_i, w, idx, grad, rows):
    """float64 gradients of sum(grad * score) for `rows`: (grad_q, grad_w, grad_k)."""
    q = q_i[rows].double().requires_grad_(True)
    k = k_i.double().requires_grad_(True)
    wd = w[rows].double().requires_grad_(True)
    sel = idx[rows].long()
    dots = torch.einsum("chd,ckd->chk", q, k[sel.clamp(min=0)])
    scores = (wd.unsqueeze(-1) * dots.relu()).sum(1)
    (scores * grad[rows].double() * (sel >= 0)).sum().backward()
    return q.grad, wd.grad, k.grad


def check(n, topk, seed):
    """Largest error of grad_q, grad_w, grad_k relative to the float64 reference's largest
    magnitude, on 256 rows (grad_k from those rows only)."""
    q_i, k_i, w, idx, grad = index_inputs(n, topk, seed + 1)
    rows = torch.randperm(n, device="cuda")[:256]
    only = torch.zeros_like(grad)
    only[rows] = grad[rows]
    gq, gk, gw = torch.ops.hyscale.index_score_backward(only, q_i, k_i, w, idx)
    wq, ww, wk = reference_backward(q_i, k_i, w, idx, grad, rows)
    rel = lambda got, want: float((got.double() - want).abs().max() / want.abs().max())
    return max(rel(gq[rows], wq), rel(gw[rows], ww), rel(gk, wk))


def megatron_backward(q_i, k_i, w, idx, grad, chunk):
    """The unfused path: per row chunk, gather the selected k_I, fp32 scores, autograd."""
    k = k_i.float().requires_grad_(True)
    for first in range(0, q_i.shape[0], chunk):
        c = slice(first, first + chunk)
        q = q_i[c].float().requires_grad_(True)
        wc = w[c].detach().requires_grad_(True)
        sel = idx[c].long()
        dots = torch.einsum("chd,ckd->chk", q, k[sel.clamp(min=0)])
        scores = (wc.unsqueeze(-1) * dots.relu()).sum(1)
        (scores * grad[c] * (sel >= 0)).sum().backward()
    return k.grad


# The dense loss's kernels by part: the first name fragment that matches a kernel's name.
DENSE_PARTS = (("backward: grad_k_I (key-major)", "dense_key_grad"),
               ("backward: grad_q_I, grad_w (rows)", "dense_query_grad"),
               ("target (fused)", "dense_target_kernel"),
               ("target from logits", "dense_attention_target"),
               ("attention lse (fused)", "dense_lse"),
               ("attention lse", "dense_attention_lse"),
               ("indexer scores", "score_rows"),
               ("KL and its gradient (fused)", "dense_indexer_kl_rows"),
               ("logits (cuBLAS)", "gemm"),
               ("logits (cuBLAS)", "xmma"), ("logits (cuBLAS)", "cutlass"))


def dense_output_pass(ops, q, kv, scale, chunk=2048):
    """The frozen attention's output and lse as frozen_dense_attention computes them: query
    chunks, each row's prefix as its key list (-1 past it)."""
    n = q.shape[0]
    outs, lses = [], []
    for first in range(0, n, chunk):
        rows = min(chunk, n - first)
        keys = torch.arange(first + rows, device="cuda", dtype=torch.int32)
        limit = torch.arange(first, first + rows, device="cuda").unsqueeze(1)
        lists = keys.unsqueeze(0).expand(rows, -1).masked_fill(keys.unsqueeze(0) > limit, -1)
        out, lse = ops.sparse_attn_latent(q[first:first + rows], kv, lists.contiguous(), scale, DV)
        outs.append(out)
        lses.append(lse)
    return torch.cat(outs), torch.cat(lses)


def dense_inputs(n, heads, seed):
    """The warm-up loss's inputs: q [n, heads, d_qk], the latent keys, q_I, k_I and w."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    q = torch.randn(n, heads, DQK, device="cuda", generator=g).bfloat16()
    kv = torch.randn(n, DQK, device="cuda", generator=g).bfloat16()
    q_i = torch.randn(n, HEADS_I, DIM_I, device="cuda", generator=g).bfloat16()
    k_i = torch.randn(n, DIM_I, device="cuda", generator=g).bfloat16()
    w = torch.randn(n, HEADS_I, device="cuda", generator=g) * HEADS_I ** -0.5
    return q, kv, q_i, k_i, w


def dense_warmup(ops, n, heads, runs, peak):
    q, kv, q_i, k_i, w = dense_inputs(n, heads, n + 11)
    scale = DQK ** -0.5
    r = dict(n=n, heads=heads)
    r["output_ms"], _ = timed_with_clock(lambda: dense_output_pass(ops, q, kv, scale), runs)
    _, lse = dense_output_pass(ops, q, kv, scale)
    loss = lambda: ops.dense_indexer_kl(q, kv, q_i, k_i, w, scale, 0, 1, lse)
    got = loss()
    # float64 on the CPU for three rows at the start, middle and end (q_offset places them).
    errors = []
    for first in (0, n // 2, n - 3):
        rows = slice(first, first + 3)
        keys = first + 3
        d = lambda t: t.double().cpu()
        want = ops.dense_indexer_kl(d(q[rows]), d(kv[:keys]), d(q_i[rows]), d(k_i[:keys]),
                                    d(w[rows]), scale, first)
        for i in (0, 1, 3):  # loss, grad_q_I, grad_w (grad_k_I sums over every row)
            ref = want[i]
            worst = (d(got[i][rows]) - ref).abs().max() / ref.abs().max().clamp(min=1e-30)
            errors.append(float(worst))
    r["rel_err_vs_float64"] = max(errors)
    r["loss_ms"], r["loss_clock"] = timed_with_clock(loss, runs)
    pairs = n * (n + 1) / 2
    flops = (2 * heads * DQK + 6 * HEADS_I * DIM_I) * pairs
    r["loss_tflops"] = flops / r["loss_ms"] / 1e9
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    r["loss_parts_ms"] = profiled_parts(loss)
    r["loss_extra_gib"] = (torch.cuda.max_memory_allocated() - base) / 2 ** 30
    # Without the lse the target comes from logits (the fused kernel needs the lse): the A/B of
    # the two targets, in the same process.
    r["loss_no_lse_parts_ms"] = profiled_parts(
        lambda: ops.dense_indexer_kl(q, kv, q_i, k_i, w, scale, 0, 1))
    print(f"c) N {n:>7}  dense_indexer_kl (H={heads}) {r['loss_ms']:9.2f} ms "
          f"{r['loss_tflops']:6.1f} TFLOP/s ({r['loss_tflops'] / peak:.2f} of {peak:.0f}) at "
          f"{describe(r['loss_clock'])}; +{r['loss_extra_gib']:.2f} GiB; rel err vs float64 "
          f"{r['rel_err_vs_float64']:.1e}; the output pass {r['output_ms']:.2f} ms")
    for label, parts in (("lse given", r["loss_parts_ms"]),
                         ("no lse (the lse by the target's tiles first)", r["loss_no_lse_parts_ms"])):
        total = sum(parts.values())
        print(f"   {label}: {total:.2f} ms of kernels")
        for part, ms in sorted(parts.items(), key=lambda item: -item[1]):
            print(f"     {part:<36} {ms:9.2f} ms  {100 * ms / total:5.1f} %")
    return r


def profiled_parts(fn):
    """GPU time (ms) of fn's kernels by DENSE_PARTS, one profiled call after a warm-up."""
    fn()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    parts = {}
    for e in prof.key_averages():
        us = e.device_time_total if hasattr(e, "device_time_total") else e.cuda_time_total
        if us <= 0:
            continue
        part = next((p for p, frag in DENSE_PARTS if frag in e.key), "the rest (torch)")
        parts[part] = parts.get(part, 0.0) + us / 1e3
    return parts


def loss_path_beside_attention(ops, r, q_i, k_i, w, idx, runs, rows):
    """b) The whole loss path beside the latent attention backward on the same selection, into r:
    queries `rows` at a time against all keys, as the trainer's query chunks run them, each
    measure the sum of its chunks' medians."""
    n = r["n"]
    g = torch.Generator(device="cuda").manual_seed(n + 7)
    kv = torch.randn(n, DQK, device="cuda", generator=g).bfloat16()
    scale = DQK ** -0.5
    r["loss_path_rows"] = rows
    times = dict(target_ms=0.0, kl_ms=0.0, loss_path_ms=0.0, loss_bwd_ms=0.0, latent_bwd_ms=0.0,
                 latent_bwd_target_ms=0.0)
    r["target_diff"] = 0.0
    for begin in range(0, n, rows):
        part = slice(begin, min(n, begin + rows))
        q = torch.randn(part.stop - begin, H, DQK, device="cuda", generator=g).bfloat16()
        grad_out = torch.randn(part.stop - begin, H, DV, device="cuda", generator=g).bfloat16()
        sel, qi, wi = idx[part], q_i[part], w[part]
        out, lse = ops.sparse_attn_latent(q, kv, sel, scale, DV)
        score = ops.index_score_gather(qi, k_i, wi, sel, begin)
        target = ops.selected_attention_mass(q, kv, sel, lse, scale)
        score_lse = score.logsumexp(-1)  # FlashTopK's, in the trainer
        ones = torch.ones(part.stop - begin, device="cuda")

        def loss_path():
            t = ops.selected_attention_mass(q, kv, sel, lse, scale)
            ops.indexer_kl(score, t)
            g_score = ops.indexer_kl_backward(ones, score, t)
            ops.index_score_backward(g_score, qi, k_i, wi, sel, begin)

        timings = dict(
            target_ms=lambda: ops.selected_attention_mass(q, kv, sel, lse, scale),
            kl_ms=lambda: (ops.indexer_kl(score, target),
                           ops.indexer_kl_backward(ones, score, target)),
            loss_path_ms=loss_path,
            loss_bwd_ms=lambda: ops.indexer_loss_backward(target, score_lse, ones, qi, k_i, wi, sel),
            latent_bwd_ms=lambda: ops.sparse_attn_latent_backward(
                grad_out, q, kv, sel, scale, DV, out, lse),
            # The target as the latent backward's by-product: its cost is what the backward adds.
            latent_bwd_target_ms=lambda: ops.sparse_attn_latent_backward_target(
                grad_out, q, kv, sel, scale, DV, out, lse))
        for name, fn in timings.items():
            ms, clock = timed_with_clock(fn, runs)
            times[name] += ms
            if name == "latent_bwd_ms":
                r["latent_bwd_clock"] = clock
        r["target_diff"] = max(r["target_diff"], float(
            (timings["latent_bwd_target_ms"]()[2] - target).abs().max()))
        del q, grad_out, out, lse, score, score_lse, target, timings
    r.update(times)
    r["loss_path_share"] = r["loss_path_ms"] / r["latent_bwd_ms"]
    r["target_in_bwd_ms"] = max(0.0, r["latent_bwd_target_ms"] - r["latent_bwd_ms"])
    r["trainer_loss_path_ms"] = r["target_in_bwd_ms"] + r["loss_bwd_ms"]
    r["trainer_loss_path_share"] = r["trainer_loss_path_ms"] / r["latent_bwd_ms"]
    chunks = "" if rows >= n else f", queries in {-(-n // rows)} chunks of {rows}"
    print(f"b) N {n:>7}  loss path, target apart: {r['loss_path_ms']:8.2f} ms (target "
          f"{r['target_ms']:.2f}, KL fwd+bwd {r['kl_ms']:.2f}, index_score_backward "
          f"{r['isb_ms']:.2f}) = {100 * r['loss_path_share']:.0f} % of the latent attention "
          f"backward {r['latent_bwd_ms']:.2f} ms{chunks}")
    print(f"   N {n:>7}  loss path as the trainer runs it: {r['trainer_loss_path_ms']:8.2f} ms "
          f"(backward {r['latent_bwd_ms']:.2f} -> {r['latent_bwd_target_ms']:.2f} ms with the "
          f"target, max |diff| vs selected_attention_mass {r['target_diff']:.1e}; "
          f"indexer_loss_backward {r['loss_bwd_ms']:.2f}) = "
          f"{100 * r['trainer_loss_path_share']:.0f} % (issue #38: at most 15 %)")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--lib", required=True)
    ap.add_argument("--sizes", default="32768,131072",
                    help="N of parts a and b; none: skip them")
    ap.add_argument("--topk", type=int, default=2048)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--peak-tflops", type=float, default=790.0)
    ap.add_argument("--baseline-max-n", type=int, default=32768,
                    help="largest N the unfused baseline runs at (it is ~100x slower)")
    ap.add_argument("--chunk", type=int, default=1024, help="the baseline's rows per chunk")
    ap.add_argument("--dense-sizes", default="32768",
                    help="N of the dense warm-up's loss (c); none: skip it")
    ap.add_argument("--dense-heads", type=int, default=64)
    ap.add_argument("--query-chunk", type=int, default=0,
                    help="b)'s queries at a time (0: all where the card holds them, else 32768)")
    ap.add_argument("--json")
    a = ap.parse_args()
    torch.ops.load_library(a.lib)
    ops = torch.ops.hyscale
    print(f"# {torch.cuda.get_device_name()}  H_I={HEADS_I} d_I={DIM_I} k={a.topk}; "
          f"H={H} d_qk={DQK} d_v={DV}; medians of {a.runs} runs, CUDA events")
    results = []
    for n in [int(x) for x in a.sizes.split(",") if a.sizes != "none"]:
        r = dict(n=n, topk=a.topk, rel_err_vs_float64=check(min(n, 8192), a.topk, n))
        q_i, k_i, w, idx, grad = index_inputs(n, a.topk, n)
        pairs = int((idx >= 0).sum())
        flops = 6.0 * HEADS_I * DIM_I * pairs
        backward = lambda: ops.index_score_backward(grad, q_i, k_i, w, idx)
        r["isb_ms"], r["isb_clock"] = timed_with_clock(backward, a.runs)
        r["isb_tflops"] = flops / r["isb_ms"] / 1e9
        torch.use_deterministic_algorithms(True)
        r["isb_det_ms"], _ = timed_with_clock(backward, a.runs)
        torch.use_deterministic_algorithms(False)
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        backward()
        torch.cuda.synchronize()
        r["isb_extra_gib"] = (torch.cuda.max_memory_allocated() - base) / 2 ** 30
        if n <= a.baseline_max_n:
            r["megatron_ms"], _ = timed_with_clock(
                lambda: megatron_backward(q_i, k_i, w, idx, grad, a.chunk), 1)
        print(f"a) N {n:>7}  index_score_backward {r['isb_ms']:8.2f} ms "
              f"{r['isb_tflops']:6.1f} TFLOP/s ({r['isb_tflops'] / a.peak_tflops:.2f} of "
              f"{a.peak_tflops:.0f}) at {describe(r['isb_clock'])}; deterministic "
              f"{r['isb_det_ms']:.2f} ms; +{r['isb_extra_gib']:.2f} GiB; "
              f"rel err vs float64 {r['rel_err_vs_float64']:.1e}"
              + (f"; unfused {r['megatron_ms']:.0f} ms ({r['megatron_ms'] / r['isb_ms']:.0f}x)"
                 if "megatron_ms" in r else ""))

        # q, grad_out and out at H = 128 take 54 GiB at 128K: beside (a)'s tensors only a
        # 141 GB card holds all queries at once.
        big_card = torch.cuda.get_device_properties(0).total_memory > 100 * 2 ** 30
        rows = a.query_chunk or (n if big_card else min(n, 32768))
        loss_path_beside_attention(ops, r, q_i, k_i, w, idx, a.runs, rows)
        results.append(r)
        del q_i, k_i, w, idx, grad
        torch.cuda.empty_cache()
    if a.dense_sizes != "none":
        for n in [int(x) for x in a.dense_sizes.split(",")]:
            results.append(dict(dense=dense_warmup(ops, n, a.dense_heads, a.runs,
                                                   a.peak_tflops)))
            torch.cuda.empty_cache()
    if a.json:
        with open(a.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
