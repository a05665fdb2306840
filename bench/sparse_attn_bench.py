#!/usr/bin/env python3
"""hyscale::sparse_attn (CUDA) beside the gather baseline of DESIGN.md section 4, in one process.

DeepSeek-V3.2 absorbed shape (H = 128, d_qk = 576, d_v = 512, k = 2048, M = N keys), causal
selections of two kinds: "random" (each query's k keys spread uniformly over its causal window:
an untrained indexer, adjacent queries share few keys) and "local" (half the slots the most recent
k/2 keys, half spread over the rest with one draw per block of 16 queries: adjacent queries share
most keys, as with a trained indexer); "shuffled" is the random kind's keys in no order per row.
FlashTopK returns rows in key order, as random's are; local's recent half runs backwards from
t, its older half in key order; "local_sorted" is local's keys in key order (-1 last). For each
N, kind and G:
  fwd / bwd   medians of CUDA-event timings after a warm-up; TFLOP/s counted as useful work on the
              valid (query, slot) pairs: fwd 2 H (d_qk + d_v), bwd 2 H (3 d_qk + 2 d_v) per pair;
              fraction of the bf16 floor (that work at --peak-tflops)
  dedup       measured key de-duplication of the group union: valid slots / union entries
  det         the deterministic backward (fixed-point accumulation), G = 1
  gather      baseline: torch gathers K/V per query chunk, bf16 bmm, fp32 softmax, bmm; bwd by
              autograd, chunk by chunk (fwd+bwd minus fwd)
--value-in-key runs the absorbed-MLA layout, value = key[:, :d_v] (the latent is both), which the
wgmma forward gathers once per key row; at G = 1 it also times sparse_attn_latent_backward (one
kernel for dq and the latent's whole gradient; "latent bwd"), checked against the separate
backward's key gradient plus its value gradient (max difference over max magnitude). Peak memory
is the allocator's peak above the inputs during the call. The HyScale output is checked against
the baseline on every run (max abs difference). Beside each HyScale figure: the median SM clock
and board power while it was timed, and how often the power cap held the clock down (NVML,
bench/gpu_clock.py): the H200 reaches its 700 W limit within tens of milliseconds here.

  python3 bench/sparse_attn_bench.py --lib build-pytorch/kernels/torch/libhyscale_ops.so
"""
import argparse
import json

import torch

from flash_topk_bench import timed as timed_runs  # (median, all) of CUDA-event timings
from gpu_clock import ClockMonitor, describe


def timed(fn, runs):
    return timed_runs(fn, runs)[0]


def timed_with_clock(fn, runs):
    """(median ms, the SM clock and power while the runs and their warm-up ran)."""
    with ClockMonitor() as clock:
        ms = timed(fn, runs)
    return ms, clock.summary()


H, DQK, DV = 128, 576, 512


def strata(u, width, parts):
    """One key per stratum [floor(j w / parts), floor((j + 1) w / parts)) of [0, w), w >= parts:
    strata are disjoint and non-empty, so the keys are distinct."""
    j = torch.arange(parts, device=u.device).unsqueeze(0)
    w = width.clamp(min=parts)
    lo, hi = j * w // parts, (j + 1) * w // parts
    return lo + (u * (hi - lo)).long().minimum(hi - lo - 1)


def make_indices(n, topk, kind, seed):
    """Causal, duplicate-free selections; rows with t + 1 <= k take every earlier key."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    t = torch.arange(n, device="cuda").unsqueeze(1)  # [n, 1]
    i = torch.arange(topk, device="cuda").unsqueeze(0)  # [1, k]
    if kind in ("random", "shuffled"):
        # one key per stratum of the window [0, t] (stride (t + 1) / k >= 1: distinct)
        u = torch.rand(n, topk, device="cuda", generator=g)
        idx = strata(u, t + 1, topk)
        if kind == "shuffled":  # the same keys in no order, as a score-ordered selection has them
            order = torch.rand(n, topk, device="cuda", generator=g).argsort(dim=1)
            idx = idx.gather(1, order)
    else:
        half = topk // 2
        recent = t - i[:, :half]  # keys t - half + 1 .. t
        parts = topk - half
        u = torch.rand((n + 15) // 16, parts, device="cuda", generator=g).repeat_interleave(16, 0)[:n]
        older = strata(u, t + 1 - half, parts)  # keys 0 .. t - half, one per stratum
        idx = torch.cat([recent, older], 1)
    short = torch.where(i <= t, i, torch.full_like(i, -1))
    idx = torch.where(t + 1 <= topk, short, idx)
    if kind == "local_sorted":  # key order, as FlashTopK returns rows; -1 (short rows) last
        idx = torch.where(idx >= 0, idx, n).sort(dim=1).values
        idx = torch.where(idx == n, -1, idx)
    return idx.int()


def make_inputs(n, value_in_key):
    """q, key, value, grad_out (bf16, seeded by n); value = key[:, :DV] when value_in_key."""
    g = torch.Generator(device="cuda").manual_seed(n)
    q = torch.randn(n, H, DQK, device="cuda", generator=g).bfloat16()
    key = torch.randn(n, DQK, device="cuda", generator=g).bfloat16()
    value = (key[:, :DV] if value_in_key
             else torch.randn(n, DV, device="cuda", generator=g).bfloat16())
    grad_out = torch.randn(n, H, DV, device="cuda", generator=g).bfloat16()
    return q, key, value, grad_out


def useful_flops(idx):
    """Forward and backward FLOPs of useful work: 2 H (d_qk + d_v) and 2 H (3 d_qk + 2 d_v) per
    valid (query, slot) pair."""
    pairs = int((idx >= 0).sum())
    return 2.0 * pairs * H * (DQK + DV), 2.0 * pairs * H * (3 * DQK + 2 * DV)


def dedup_factor(idx, group):
    if group == 1:
        return 1.0
    n, k = idx.shape
    pad = (-n) % group
    x = torch.cat([idx, torch.full((pad, k), -1, device=idx.device, dtype=idx.dtype)])
    x = x.view(-1, group * k)
    valid, union = 0, 0
    for part in x.split(1024):
        s, _ = part.sort(dim=1)
        first = torch.ones_like(s, dtype=torch.bool)
        first[:, 1:] = s[:, 1:] != s[:, :-1]
        union += int((first & (s >= 0)).sum())
        valid += int((part >= 0).sum())
    return valid / max(union, 1)


def peak_extra(fn):
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    fn()
    torch.cuda.synchronize()
    return (torch.cuda.max_memory_allocated() - base) / 2**30


def gather_attn(q, key, value, idx, scale, chunk):
    outs = []
    for lo in range(0, q.shape[0], chunk):
        qi, ii = q[lo : lo + chunk], idx[lo : lo + chunk].long()
        valid = ii >= 0
        safe = torch.where(valid, ii, ii[:, :1])  # unused slots: the row's first key, not key 0
        kg, vg = key[safe], value[safe]  # [c, k, d]
        logits = torch.bmm(qi, kg.transpose(1, 2)).float() * scale  # [c, H, k]
        logits = logits.masked_fill(~valid.unsqueeze(1), float("-inf"))
        p = torch.softmax(logits, -1).to(q.dtype)
        outs.append(torch.bmm(p, vg))
    return torch.cat(outs)


def gather_fwd_bwd(q, key, value, idx, scale, grad_out, chunk):
    key = key.detach().requires_grad_(True)
    value = value.detach().requires_grad_(True)
    for lo in range(0, q.shape[0], chunk):
        qi = q[lo : lo + chunk].detach().requires_grad_(True)
        o = gather_attn(qi, key, value, idx[lo : lo + chunk], scale, chunk)
        o.backward(grad_out[lo : lo + chunk])
    return key.grad


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--lib", required=True)
    ap.add_argument("--sizes", default="32768,65536")
    ap.add_argument("--groups", default="1,2,4,8,16")
    ap.add_argument("--kinds", default="random,local")
    ap.add_argument("--topk", type=int, default=2048)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--chunk", type=int, default=256)
    ap.add_argument("--peak-tflops", type=float, default=790.0)
    ap.add_argument("--no-baseline", action="store_true")
    ap.add_argument("--value-in-key", action="store_true",
                    help="absorbed MLA: value = key[:, :d_v] (a view), for both stacks")
    ap.add_argument("--forward-only", action="store_true", help="time the forward kernels only")
    ap.add_argument("--json")
    a = ap.parse_args()
    torch.ops.load_library(a.lib)
    fwd_op, bwd_op = torch.ops.hyscale.sparse_attn_grouped, torch.ops.hyscale.sparse_attn_backward_grouped
    scale = DQK ** -0.5
    rows, results = [], []
    values = "value = key[:, :d_v]" if a.value_in_key else "separate value"
    print(f"# {torch.cuda.get_device_name()}  H={H} d_qk={DQK} d_v={DV} k={a.topk} {values}  "
          f"medians of {a.runs} runs, CUDA events; floor = useful FLOPs at {a.peak_tflops} TFLOP/s")
    hdr = (f"{'N':>7} {'kind':>6} {'G':>2} {'dedup':>5} | {'fwd ms':>8} {'TF/s':>6} {'floor':>5} "
           f"{'GiB':>5} | {'bwd ms':>8} {'TF/s':>6} {'floor':>5} {'GiB':>5} | {'max|d|':>7}")
    print(hdr)
    for n in [int(x) for x in a.sizes.split(",")]:
        q, key, value, grad_out = make_inputs(n, a.value_in_key)
        for kind in a.kinds.split(","):
            idx = make_indices(n, a.topk, kind, seed=n + 1)
            f_fwd, f_bwd = useful_flops(idx)
            base = None
            if not a.no_baseline:
                ref = gather_attn(q, key, value, idx, scale, a.chunk)
                t_f = timed(lambda: gather_attn(q, key, value, idx, scale, a.chunk), a.runs)
                m_f = peak_extra(lambda: gather_attn(q, key, value, idx, scale, a.chunk))
                t_fb = timed(lambda: gather_fwd_bwd(q, key, value, idx, scale, grad_out, a.chunk),
                             max(1, a.runs - 1))
                m_b = peak_extra(lambda: gather_fwd_bwd(q, key, value, idx, scale, grad_out, a.chunk))
                t_b = max(t_fb - t_f, 1e-3)
                base = dict(n=n, kind=kind, impl="gather", value_in_key=a.value_in_key,
                            fwd_ms=t_f, bwd_ms=t_b,
                            fwd_tflops=f_fwd / t_f / 1e9, bwd_tflops=f_bwd / t_b / 1e9,
                            fwd_gib=m_f, bwd_gib=m_b)
                results.append(base)
                print(f"{n:>7} {kind:>6} {'-':>2} {'':>5} | {t_f:8.2f} {f_fwd / t_f / 1e9:6.1f} "
                      f"{f_fwd / a.peak_tflops / 1e9 / t_f:5.2f} {m_f:5.1f} | {t_b:8.2f} "
                      f"{f_bwd / t_b / 1e9:6.1f} {f_bwd / a.peak_tflops / 1e9 / t_b:5.2f} "
                      f"{m_b:5.1f} | gather baseline")
                del ref
            for group in [int(x) for x in a.groups.split(",")]:
                if group * a.topk > 32768:
                    continue
                out, lse = fwd_op(q, key, value, idx, scale, group)
                check = float("nan")
                if base is not None:
                    sample = torch.randperm(n, device="cuda")[:512]
                    want = gather_attn(q[sample], key, value, idx[sample], scale, a.chunk)
                    check = float((out[sample].float() - want.float()).abs().max())
                t_f, clock_f = timed_with_clock(lambda: fwd_op(q, key, value, idx, scale, group),
                                                a.runs)
                m_f = peak_extra(lambda: fwd_op(q, key, value, idx, scale, group))
                bwd = lambda det=False: bwd_op(grad_out, q, key, value, idx, scale, out, lse, group, det)
                t_b, clock_b, m_b = float("nan"), None, float("nan")
                if not a.forward_only:
                    t_b, clock_b = timed_with_clock(bwd, a.runs)
                    m_b = peak_extra(bwd)
                dd = dedup_factor(idx, group)
                r = dict(n=n, kind=kind, impl="hyscale", value_in_key=a.value_in_key, group=group,
                         dedup=dd, fwd_ms=t_f,
                         bwd_ms=t_b, fwd_tflops=f_fwd / t_f / 1e9, bwd_tflops=f_bwd / t_b / 1e9,
                         fwd_floor=f_fwd / a.peak_tflops / 1e9 / t_f,
                         bwd_floor=f_bwd / a.peak_tflops / 1e9 / t_b, fwd_gib=m_f, bwd_gib=m_b,
                         max_abs_diff_vs_gather=check, fwd_clock=clock_f, bwd_clock=clock_b)
                if base is not None:
                    r["fwd_speedup"] = base["fwd_ms"] / t_f
                    r["bwd_speedup"] = base["bwd_ms"] / t_b
                if group == 1 and a.value_in_key and not a.forward_only:
                    latent = lambda: torch.ops.hyscale.sparse_attn_latent_backward(
                        grad_out, q, key, idx, scale, DV, out, lse)
                    _, grad_kv = latent()
                    _, grad_key, grad_value = bwd()
                    want = grad_key.float()
                    want[:, :DV] += grad_value.float()
                    r["latent_bwd_rel_diff"] = float((grad_kv.float() - want).abs().max() /
                                                     want.abs().max())
                    del grad_kv, grad_key, grad_value, want
                    t_l, r["latent_bwd_clock"] = timed_with_clock(latent, a.runs)
                    r["latent_bwd_ms"], r["latent_bwd_gib"] = t_l, peak_extra(latent)
                    r["latent_bwd_tflops"] = f_bwd / t_l / 1e9
                    r["latent_bwd_floor"] = f_bwd / a.peak_tflops / 1e9 / t_l
                    if base is not None:
                        r["latent_bwd_speedup"] = base["bwd_ms"] / t_l
                if group == 1 and not a.forward_only:
                    t_d = timed(lambda: bwd(True), a.runs)
                    r["bwd_det_ms"] = t_d
                    r["bwd_det_tflops"] = f_bwd / t_d / 1e9
                results.append(r)
                extra = ""
                if base is not None:
                    extra = f"  x{r['fwd_speedup']:.2f} fwd x{r['bwd_speedup']:.2f} bwd vs gather"
                if "bwd_det_ms" in r:
                    extra += f"  det bwd {r['bwd_det_ms']:.2f} ms ({r['bwd_det_tflops']:.1f} TF/s)"
                if "latent_bwd_ms" in r:
                    extra += (f"\n{'':>25} latent bwd {r['latent_bwd_ms']:8.2f} ms "
                              f"{r['latent_bwd_tflops']:6.1f} TF/s {r['latent_bwd_floor']:5.2f} floor "
                              f"{r['latent_bwd_gib']:5.1f} GiB  rel diff vs separate "
                              f"{r['latent_bwd_rel_diff']:.1e}")
                    if "latent_bwd_speedup" in r:
                        extra += f"  x{r['latent_bwd_speedup']:.2f} vs gather"
                extra += f"\n{'':>25} fwd at {describe(clock_f)}"
                if clock_b is not None:
                    extra += f"; bwd at {describe(clock_b)}"
                if "latent_bwd_clock" in r:
                    extra += f"\n{'':>25} latent bwd at {describe(r['latent_bwd_clock'])}"
                print(f"{n:>7} {kind:>6} {group:>2} {dd:5.2f} | {t_f:8.2f} {r['fwd_tflops']:6.1f} "
                      f"{r['fwd_floor']:5.2f} {m_f:5.1f} | {t_b:8.2f} {r['bwd_tflops']:6.1f} "
                      f"{r['bwd_floor']:5.2f} {m_b:5.1f} | {check:7.4f}{extra}", flush=True)
                del out, lse
        del q, key, value, grad_out
        torch.cuda.empty_cache()
    if a.json:
        with open(a.json, "w") as f:
            json.dump(dict(device=torch.cuda.get_device_name(), results=results), f, indent=1)


if __name__ == "__main__":
    main()
