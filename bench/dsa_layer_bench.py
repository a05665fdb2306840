#!/usr/bin/env python3
"""One DSA layer's training step: HyScale beside the Megatron-style stack of DESIGN.md section 4.

DeepSeek-V3.2 shape (H = 128, d_qk = 576 with 64 RoPE, d_v = 512, H_I = 64, d_I = 128, k = 2048),
batch 1, bf16 inputs, N from --sizes. The layer here is its DSA-specific part: selection, sparse
attention and the indexer's KL loss (projections and the MLP are the same in both stacks and left
out); inputs are q [N, H, d_qk], key [N, d_qk], value [N, d_v], q_I [N, H_I, d_I], k_I [N, d_I],
w [N, H_I], and the step's loss is sum(out * grad_out) + lambda * mean_t KL_t.

  a) selection replay: what activation recomputation pays to get the selection back --
       replay     hyscale::index_score_gather at the kept indices: the scores at the selection,
                  which the trainer's replay no longer forms (the loss forms them in its
                  backward; an fp8 selection rescores with them in its forward)
       reselect   hyscale::flash_topk again
       naive      Megatron-naive re-selection: fp32 einsum score table + torch.topk, rows chunked
  b) one training step = forward (selection, attention, indexer loss; no autograd graph kept),
     recomputation of the layer with autograd, backward --
       hyscale    the trainer's: flash_topk (keeping its scores' log-sum-exp) + sparse_attn;
                  replay on recompute, the loss as indexer_loss + sparse_attn_indexer_loss (the
                  target from the attention backward, then indexer_loss_backward); recompute +
                  backward over chunks of --recompute-rows query rows
       megatron   naive selection, attention by gather in torch (fp32 softmax), torch target and
                  KL, re-selection on recompute; recompute + backward over chunks of --chunk rows
     medians of --runs (--baseline-runs) CUDA-event timings after a warm-up, per-phase times,
     peak memory (torch.cuda.max_memory_allocated, reset before each phase), and the longest N each
     trains on this GPU, to --longest-step tokens (longest_n: predicted from the measured peaks,
     decided by steps at the prediction and one beyond, bracketed and bisected where the
     prediction was off; at most --max-n; GPU only).
The gate runs on fp32 inputs holding bf16 values (fp64 on the CPU); the timings on bf16 (fp32 on
the CPU). At the default sizes the whole run takes about 6 minutes on an H200, mostly the
baseline (its gather backward alone is ~5 s at 32K, bench/sparse_attn_bench.py).
Useful FLOPs and the fewest bytes are counted as bench/sparse_attn_bench.py does (valid
(query, slot) pairs; causal scoring for selection); "floor" = the larger of FLOPs at --peak-tflops
and bytes at --peak-gbps, over the measured time.

Correctness gate first, at --gate-n: both selections follow the DESIGN.md section 3 rule against
float64 scores on sampled rows, and on one selection both stacks give the same layer output, lse,
indexer target and loss, and gradients of all six inputs (else no timings, exit status 1).

  python3 bench/dsa_layer_bench.py --lib build-pytorch/kernels/torch/libhyscale_ops.so
  /usr/bin/python3 bench/dsa_layer_bench.py --lib build/kernels/torch/libhyscale_ops.so \\
      --device cpu --sizes 256 --topk 32 --heads 4 --dqk 64 --dv 64 --heads-i 16 --dim-i 64
"""
import argparse
import gc
import json
import os
import statistics
import subprocess
import time

import torch

GiB = 2 ** 30


# ---- timing and memory ---------------------------------------------------------------------------

class Clock:
    """CUDA events on a GPU, perf_counter on the CPU; milliseconds."""

    def __init__(self, device):
        self.cuda = device.type == "cuda"

    def now(self):
        if self.cuda:
            e = torch.cuda.Event(enable_timing=True)
            e.record()
            return e
        return time.perf_counter()

    def ms(self, start, end):
        if self.cuda:
            end.synchronize()
            return start.elapsed_time(end)
        return (end - start) * 1e3

    def sync(self):
        if self.cuda:
            torch.cuda.synchronize()


def timed_step(clock, step, runs, warmup):
    """Median total and per-phase medians of `step(mark)`; mark(name) closes a phase (a name
    marked more than once in a step, as a phase of each row chunk, adds up)."""
    for _ in range(warmup):
        step(lambda name: None)
    clock.sync()
    totals, phases = [], {}
    for _ in range(runs):
        marks = [("start", clock.now())]
        step(lambda name: marks.append((name, clock.now())))
        run = {}
        for (_, a), (name, b) in zip(marks, marks[1:]):
            run[name] = run.get(name, 0.0) + clock.ms(a, b)
        for name, ms in run.items():
            phases.setdefault(name, []).append(ms)
        totals.append(clock.ms(marks[0][1], marks[-1][1]))
    return statistics.median(totals), {k: statistics.median(v) for k, v in phases.items()}


def timed(clock, fn, runs, warmup=1):
    return timed_step(clock, lambda mark: (fn(), mark("all")), runs, warmup)[0]


def phase_peaks_gib(device, step):
    """Peak allocated memory (inputs included) in each phase of `step(mark)`, in GiB; {} on the
    CPU. The step's peak is the largest; the phase holding it says what to shrink."""
    if device.type != "cuda":
        step(lambda name: None)
        return {}
    peaks = {}

    def mark(name):
        torch.cuda.synchronize()
        peaks[name] = max(peaks.get(name, 0.0), torch.cuda.max_memory_allocated() / GiB)
        torch.cuda.reset_peak_memory_stats()

    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    step(mark)
    return peaks


def is_oom(e):
    text = str(e)
    return "out of memory" in text or "can't allocate memory" in text


# ---- inputs ----------------------------------------------------------------------------------

def make_layer(cfg, n, dtype, device, seed):
    """Leaf tensors of the layer (requires_grad), inputs drawn in `dtype` directly."""
    g = torch.Generator(device=device).manual_seed(seed)

    def randn(*shape):
        return torch.randn(*shape, generator=g, device=device, dtype=dtype)

    t = dict(q=randn(n, cfg.heads, cfg.dqk), key=randn(n, cfg.dqk), value=randn(n, cfg.dv),
             q_i=randn(n, cfg.heads_i, cfg.dim_i), k_i=randn(n, cfg.dim_i),
             w=randn(n, cfg.heads_i) * (cfg.heads_i * cfg.dim_i) ** -0.5)
    if value_in_key(cfg):
        del t["value"]  # the keys' first d_v features: value_of
    grad_out = randn(n, cfg.heads, cfg.dv)
    return {k: v.requires_grad_(True) for k, v in t.items()}, grad_out


def value_in_key(cfg):
    """Absorbed MLA (--value-in-key): the values are the keys' first d_v features, one latent a
    token, as DeepSeek-V3.2's sparse attention (MQA mode) and the trainer's model.latent_kv."""
    return getattr(cfg, "value_in_key", False)


def value_of(cfg, key, value=None):
    """The values next to `key`: its first d_v features (a view, so gradients reach the key), or
    the layer's own."""
    return key[:, :cfg.dv] if value_in_key(cfg) else value


def acc(x):
    """The accumulation dtype of the torch baseline: fp32 for 16-bit inputs, else the input's."""
    return x.float() if x.dtype in (torch.bfloat16, torch.float16) else x


def bf16_valued(x):
    """fp32/fp64 tensors holding bf16 values: exact inputs for both stacks in the gate."""
    return x.detach().to(torch.bfloat16).to(x.dtype)


def by_piece(L, pieces, fn):
    """fn(rows, q_offset) over each run of consecutive query positions, results concatenated.
    `pieces`: (first row, rows, global position of that row) of the local queries; None: one
    run from position 0 (the whole sequence). Context parallelism passes its layout's runs."""
    pieces = pieces or [(0, L["q"].shape[0], 0)]
    parts = [fn(slice(lo, lo + m), offset) for lo, m, offset in pieces]
    if len(parts) == 1:
        return parts[0]
    if isinstance(parts[0], tuple):
        return tuple(torch.cat(p) for p in zip(*parts))
    return torch.cat(parts)


# ---- HyScale ---------------------------------------------------------------------------------

def hyscale_attention(cfg, q, key, value, idx, scale):
    """sparse_attn; for a latent sparse_attn_latent (one tensor, one gradient: its backward forms
    the key rows' whole gradient in one kernel)."""
    if value_in_key(cfg):
        return torch.ops.hyscale.sparse_attn_latent(q, key, idx, scale, cfg.dv)
    return torch.ops.hyscale.sparse_attn(q, key, value, idx, scale)


def row_chunks(n, rows):
    """Query rows [0, n) in chunks of `rows` (0: one chunk)."""
    rows = rows or n
    return [slice(lo, min(n, lo + rows)) for lo in range(0, n, rows)]


def chunk_pieces(pieces, n, rows):
    """`pieces` (as in by_piece) cut to the row chunk `rows`, row numbers relative to it."""
    cut = []
    for lo, m, offset in pieces or [(0, n, 0)]:
        a, b = max(lo, rows.start), min(lo + m, rows.stop)
        if a < b:
            cut.append((a - rows.start, b - a, offset + a - lo))
    return cut


def recompute_backward(cfg, L, grad_out, chunk_layer, rows, mark, done="backward"):
    """Activation recomputation and backward, query-row chunk by chunk: each chunk's graph is
    built by chunk_layer(c, leaves) -> (out, summed KL) and freed by its own backward, so one
    chunk's activations are alive at a time. The query side's chunks are leaves of their own, their
    gradients copied into place; the key side's leaves gather theirs over the chunks."""
    n = L["q"].shape[0]
    chunks = row_chunks(n, rows)
    key_side = {name: L[name].detach().requires_grad_(True) for name in ("key", "value", "k_i")
                if name in L}
    query_side = ("q", "q_i", "w")
    whole = len(chunks) == 1  # the chunk's gradients are the whole ones: no copy
    grads = {} if whole else {name: torch.empty_like(L[name]) for name in query_side}
    for c in chunks:
        leaves = dict(key_side, **{name: L[name][c].detach().requires_grad_(True)
                                   for name in query_side})
        out, kl = chunk_layer(c, leaves)
        torch.autograd.backward([out, kl * cfg.kl_weight / n], [grad_out[c], None])
        for name in query_side:
            if whole:
                grads[name] = leaves[name].grad
            else:
                grads[name][c] = leaves[name].grad
        mark(done)
    grads.update({name: leaf.grad for name, leaf in key_side.items()})
    for name, g in grads.items():
        L[name].grad = g.to(L[name].dtype)


def hyscale_step(cfg, L, grad_out, mark=lambda name: None, pieces=None):
    """The trainer's step (worker/model/model.cc): a forward with no indexer-loss work (FlashTopK
    keeps its scores' log-sum-exp, 4 bytes a row), then recomputation and backward over chunks of
    cfg.recompute_rows query rows (0: all) with the selection replayed. The loss is two autograd
    nodes: the attention backward forms the target, indexer_loss's backward
    (indexer_loss_backward) the KL, its value per row and the indexer's gradients."""
    ops, scale, n = torch.ops.hyscale, cfg.dqk ** -0.5, L["q"].shape[0]
    with torch.no_grad():
        idx, scores = by_piece(L, pieces, lambda r, off: ops.flash_topk(
            L["q_i"][r], L["k_i"], L["w"][r], cfg.topk, off))
        score_lse = scores.logsumexp(-1)
        del scores
        mark("fwd selection")
        value = value_of(cfg, L["key"], L.get("value"))
        out, lse = hyscale_attention(cfg, L["q"], L["key"], value, idx, scale)
        mark("fwd attention")
        mark("fwd indexer loss")  # none: the loss needs the attention backward's target
    loss_rows = torch.zeros(n, dtype=torch.float64 if L["q"].dtype == torch.float64
                            else torch.float32, device=L["q"].device)

    def chunk_layer(c, leaves):
        mark("recompute selection")  # replayed: nothing to select
        slots = ops.indexer_loss(leaves["q_i"], leaves["k_i"], leaves["w"], idx[c], score_lse[c],
                                 loss_rows[c])
        latent = value_in_key(cfg)
        o, _, loss = ops.sparse_attn_indexer_loss(
            leaves["q"], leaves["key"], None if latent else leaves["value"], idx[c], *slots, scale,
            cfg.dv if latent else 0)
        mark("recompute attention + loss")
        return o, loss.sum()

    recompute_backward(cfg, L, grad_out, chunk_layer, cfg.recompute_rows, mark)
    return dict(idx=idx, out=out, lse=lse, loss=loss_rows.mean())


# ---- Megatron-style (DESIGN.md section 4) ----------------------------------------------------

def naive_select(q_i, k_i, w, topk, chunk_bytes, q_offset=0):
    """fp32 einsum into [rows, H_I, M], ReLU, weighted sum, causal mask, torch.topk; unused slots
    (t + 1 < k) are -1; row r is at position q_offset + r. Returns (int32 indices, scores in the
    accumulation dtype)."""
    n, heads, _ = q_i.shape
    m = k_i.shape[0]
    rows_per_chunk = max(1, chunk_bytes // (heads * m * 4))
    kf = acc(k_i)
    k = min(topk, m)
    indices = torch.full((n, topk), -1, dtype=torch.int32, device=q_i.device)
    scores = torch.full((n, topk), float("-inf"), dtype=kf.dtype, device=q_i.device)
    keys = torch.arange(m, device=q_i.device)
    for row in range(0, n, rows_per_chunk):
        rows = min(rows_per_chunk, n - row)
        logits = torch.einsum("rhd,md->rhm", acc(q_i[row:row + rows]), kf).relu_()
        s = torch.einsum("rhm,rh->rm", logits, acc(w[row:row + rows]))
        del logits
        causal = keys.unsqueeze(0) > torch.arange(q_offset + row, q_offset + row + rows,
                                                  device=q_i.device).unsqueeze(1)
        s.masked_fill_(causal, float("-inf"))
        top = torch.topk(s, k, dim=1)
        valid = top.values > float("-inf")
        indices[row:row + rows, :k] = torch.where(valid, top.indices, -1).int()
        scores[row:row + rows, :k] = top.values
    return indices, scores


def gather_index(idx):
    """Selected slots as gather indices: an unused slot (-1, rows t + 1 < k) takes the row's first
    slot (always a visible key) instead of key 0; clamping every unused slot to key 0 made the
    baseline's backward pile millions of duplicate index-adds onto one key (seconds per sequence,
    paid by the rank holding the first tokens)."""
    idx = idx.long()
    return torch.where(idx >= 0, idx, idx[:, :1])


def torch_index_scores(q_i, k_i, w, idx):
    """Scores at the selected keys, differentiable: gather k_I, fp32 einsum, ReLU, weighted sum."""
    valid = idx >= 0
    kg = acc(k_i)[gather_index(idx)]  # [c, k, d_I]
    dots = torch.einsum("chd,ckd->chk", acc(q_i), kg).relu()
    s = torch.einsum("chk,ch->ck", dots, acc(w))
    return s.masked_fill(~valid, float("-inf"))


def gather_attention(q, key, value, idx, scale):
    """Megatron's unfused path: gather K/V per query, bmm, fp32 softmax, bmm. Returns out, lse."""
    valid = idx >= 0
    safe = gather_index(idx)
    kg, vg = key[safe], value[safe]  # [c, k, d]
    logits = acc(torch.bmm(q, kg.transpose(1, 2))) * scale  # [c, H, k]
    logits = logits.masked_fill(~valid.unsqueeze(1), float("-inf"))
    lse = torch.logsumexp(logits, -1)
    p = torch.exp(logits - lse.unsqueeze(-1)).to(q.dtype)
    return torch.bmm(p, vg), lse


def torch_target(q, key, idx, lse, scale):
    """Attention probabilities at the selected keys, summed over heads, L1-normalised."""
    valid = idx >= 0
    kg = key[gather_index(idx)]
    logits = torch.bmm(q, kg.transpose(1, 2)).to(lse.dtype) * scale
    p = torch.exp(logits - lse.unsqueeze(-1)).masked_fill(~valid.unsqueeze(1), 0).sum(1)
    total = p.sum(-1, keepdim=True)
    return torch.where(total > 0, p / total.clamp(min=torch.finfo(p.dtype).tiny), p)


def torch_kl(score, target):
    """Per-row KL(target || softmax(score)) over the valid (finite-score) slots."""
    valid = score > float("-inf")
    lse = torch.logsumexp(score, -1, keepdim=True)
    logp = torch.where(valid, score - lse, torch.zeros_like(score))
    t = target.to(score.dtype)
    safe_t = torch.where(t > 0, t, torch.ones_like(t))
    return torch.where(valid & (t > 0), t * (torch.log(safe_t) - logp), torch.zeros_like(t)).sum(-1)


def megatron_step(cfg, L, grad_out, mark=lambda name: None, select=None, pieces=None):
    """`select` replaces the selection (the gate runs both stacks on one selection); `pieces` as
    in by_piece."""
    scale, n, chunk = cfg.dqk ** -0.5, L["q"].shape[0], cfg.chunk
    select = select or (lambda: by_piece(L, pieces, lambda r, off: naive_select(
        L["q_i"][r], L["k_i"], L["w"][r], cfg.topk, cfg.naive_chunk_bytes, off)))
    with torch.no_grad():
        idx, scores = select()
        mark("fwd selection")
        outs, lses = [], []
        value = value_of(cfg, L["key"], L.get("value"))
        for lo in range(0, n, chunk):
            o, l = gather_attention(L["q"][lo:lo + chunk], L["key"], value, idx[lo:lo + chunk],
                                    scale)
            outs.append(o)
            lses.append(l)
        out, lse = torch.cat(outs), torch.cat(lses)
        del outs, lses
        mark("fwd attention")
        target = torch.cat([torch_target(L["q"][lo:lo + chunk], L["key"], idx[lo:lo + chunk],
                                         lse[lo:lo + chunk], scale) for lo in range(0, n, chunk)])
        loss = torch_kl(scores, target).mean()
        mark("fwd indexer loss")
    # Recomputation re-runs the selection, then the layer with autograd, chunk by chunk (each
    # chunk's graph is freed by its backward, so the baseline fits); the target is kept from the
    # forward, as in the HyScale step.
    with torch.no_grad():  # selection is not differentiated; with grad on, autograd would keep
        idx, _ = select()  # every chunk's score table
    mark("recompute selection")

    def chunk_layer(c, leaves):
        score = torch_index_scores(leaves["q_i"], leaves["k_i"], leaves["w"], idx[c])
        value = value_of(cfg, leaves["key"], leaves.get("value"))
        o, _ = gather_attention(leaves["q"], leaves["key"], value, idx[c], scale)
        return o, torch_kl(score, target[c]).sum()

    recompute_backward(cfg, L, grad_out, chunk_layer, chunk, mark, done="recompute + backward")
    return dict(idx=idx, out=out, lse=lse, loss=loss, target=target)


# ---- correctness gate ------------------------------------------------------------------------

def same_selection(q_i, k_i, w, got, topk, rows):
    """Rows whose selections differ beyond ties: DESIGN.md section 3 with the reference scores."""
    bad = 0
    kd = k_i.double()
    for row in rows:
        visible = row + 1
        ref = (w[row].double().unsqueeze(1) *
               torch.einsum("hd,md->hm", q_i[row].double(), kd[:visible]).clamp_min(0)).sum(0)
        selected = min(topk, visible)
        g = got[row].long()
        tau = torch.topk(ref, selected).values[-1].item()
        eps = 1e-4 * abs(tau) + 1e-12
        chosen = torch.zeros(visible, dtype=torch.bool, device=ref.device)
        sel = g[:selected]
        ok = bool((g[selected:] == -1).all()) and bool(((sel >= 0) & (sel < visible)).all())
        if ok:
            chosen[sel] = True
            ok = (sel.unique().numel() == selected and bool((ref[sel] >= tau - eps).all())
                  and bool((chosen | (ref <= tau + eps)).all()))
        bad += not ok
    return bad


def rel_err(got, want):
    g, w = got.detach().double(), want.detach().double()
    finite = torch.isfinite(w)
    scale = max(1e-12, float(w[finite].abs().max())) if bool(finite.any()) else 1.0
    return float((g[finite] - w[finite]).abs().max()) / scale if bool(finite.any()) else 0.0


def gate(cfg, device, dtype):
    """Both stacks on the same inputs; returns {quantity: relative error} and the tolerance."""
    n = cfg.gate_n
    L, grad_out = make_layer(cfg, n, torch.float32, device, seed=1)
    L = {k: bf16_valued(v).to(dtype).requires_grad_(True) for k, v in L.items()}
    grad_out = bf16_valued(grad_out).to(dtype)
    errors = {}
    idx_h, _ = torch.ops.hyscale.flash_topk(L["q_i"], L["k_i"], L["w"], cfg.topk)
    idx_m, _ = naive_select(L["q_i"], L["k_i"], L["w"], cfg.topk, cfg.naive_chunk_bytes)
    g = torch.Generator().manual_seed(2)
    rows = sorted({0, n - 1, min(n - 1, cfg.topk - 1), min(n - 1, cfg.topk)} |
                  set(torch.randint(0, n, (cfg.gate_rows,), generator=g).tolist()))
    errors["hyscale selection: rows off"] = same_selection(L["q_i"], L["k_i"], L["w"], idx_h,
                                                           cfg.topk, rows)
    errors["naive selection: rows off"] = same_selection(L["q_i"], L["k_i"], L["w"], idx_m,
                                                         cfg.topk, rows)
    h = hyscale_step(cfg, L, grad_out)
    grads_h = {k: v.grad.detach().clone() for k, v in L.items()}
    for v in L.values():
        v.grad = None
    # The Megatron stack on HyScale's selection (the selections were compared above, as sets),
    # with its own table scores at those keys.
    with torch.no_grad():
        naive_scores = torch_index_scores(L["q_i"], L["k_i"], L["w"], h["idx"])
    m = megatron_step(cfg, L, grad_out, select=lambda: (h["idx"], naive_scores))
    errors["out"] = rel_err(h["out"], m["out"])
    errors["lse"] = rel_err(h["lse"], m["lse"])
    # The step's target lives inside the attention backward (the loss and the indexer's gradients
    # check it); the standalone op's is compared here.
    with torch.no_grad():
        target = torch.ops.hyscale.selected_attention_mass(L["q"], L["key"], h["idx"], h["lse"],
                                                           cfg.dqk ** -0.5)
    errors["target"] = rel_err(target, m["target"])
    errors["indexer loss"] = rel_err(h["loss"].reshape(1), m["loss"].reshape(1))
    for k, v in L.items():
        errors[f"grad {k}"] = rel_err(grads_h[k], v.grad)
    # bf16 operands inside the CUDA kernels (P, dS in the attention); float64 all through on CPU.
    tol = 2e-2 if device.type == "cuda" else 1e-6
    return errors, tol


# ---- FLOPs and bytes -------------------------------------------------------------------------

def causal_pairs(n, topk):
    """Valid (query, slot) pairs of a causal selection: row t selects min(topk, t + 1) keys."""
    full = max(0, n - topk)
    short = n - full
    return short * (short + 1) // 2 + full * topk


def step_work(cfg, n, pairs):
    """Useful FLOPs and fewest bytes of one step as HyScale schedules it (selection once, attention
    forward twice, attention backward, the mass once, score replay and its backward); the same
    floor is applied to both stacks."""
    h, i = cfg.heads, cfg.heads_i * cfg.dim_i
    selection = 2.0 * i * n * (n + 1) / 2
    attn_fwd = 2.0 * pairs * h * (cfg.dqk + cfg.dv)
    attn_bwd = 2.0 * pairs * h * (3 * cfg.dqk + 2 * cfg.dv)
    mass = 2.0 * pairs * h * cfg.dqk
    scores = 2.0 * pairs * i
    flops = selection + 2 * attn_fwd + attn_bwd + mass + scores + 2 * scores
    # bf16 q, key, value, grad_out, q_I, k_I read; out and every gradient written; fp32 w and its
    # gradient; int32 indices written once and read back.
    key_side = cfg.dqk if value_in_key(cfg) else cfg.dqk + cfg.dv  # a latent's values are keys
    elems = n * (2 * h * cfg.dqk + 2 * key_side + 2 * h * cfg.dv +
                 2 * cfg.heads_i * cfg.dim_i + 2 * cfg.dim_i)
    nbytes = 2.0 * elems + 4.0 * 2 * n * cfg.heads_i + 4.0 * 2 * n * cfg.topk
    return flops, nbytes


def floor_ms(cfg, flops, nbytes):
    return max(flops / (cfg.peak_tflops * 1e9), nbytes / (cfg.peak_gbps * 1e6))


# ---- benchmarks ------------------------------------------------------------------------------

def free(device):
    gc.collect()  # an out-of-memory traceback's frames hold tensors in reference cycles
    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.empty_cache()


def bench_replay(cfg, device, dtype, clock, n):
    L, _ = make_layer(cfg, n, dtype, device, seed=n)
    q_i, k_i, w = (L[k].detach() for k in ("q_i", "k_i", "w"))
    del L
    ops = torch.ops.hyscale
    idx, _ = ops.flash_topk(q_i, k_i, w, cfg.topk)
    pairs = int((idx >= 0).sum())
    r = dict(n=n, pairs=pairs)
    with torch.no_grad():
        r["replay_ms"] = timed(clock, lambda: ops.index_score_gather(q_i, k_i, w, idx), cfg.runs)
        r["reselect_ms"] = timed(clock, lambda: ops.flash_topk(q_i, k_i, w, cfg.topk), cfg.runs)
        if n <= cfg.naive_max:
            r["naive_ms"] = timed(clock, lambda: naive_select(q_i, k_i, w, cfg.topk,
                                                              cfg.naive_chunk_bytes),
                                  max(1, cfg.runs // 2))
            r["naive_over_replay"] = r["naive_ms"] / r["replay_ms"]
    r["reselect_over_replay"] = r["reselect_ms"] / r["replay_ms"]
    r["replay_tflops"] = 2.0 * pairs * cfg.heads_i * cfg.dim_i / r["replay_ms"] / 1e9
    del q_i, k_i, w, idx
    free(device)
    return r


STEPS = {"hyscale": hyscale_step, "megatron": megatron_step}


def run_step(cfg, device, dtype, clock, stack, n, runs):
    """(result dict, None) or (None, error text) when the step runs out of memory."""
    L = grad_out = None
    try:
        L, grad_out = make_layer(cfg, n, dtype, device, seed=n)
        step = STEPS[stack]

        def one(mark):
            for v in L.values():
                v.grad = None
            return step(cfg, L, grad_out, mark)

        phase_peaks = phase_peaks_gib(device, one)  # also the warm-up
        peak = max(phase_peaks.values(), default=None)
        if runs == 0:
            return dict(n=n, stack=stack, peak_gib=peak, phase_peaks_gib=phase_peaks), None
        pairs = causal_pairs(n, cfg.topk)
        total, phases = timed_step(clock, one, runs, warmup=0)
        flops, nbytes = step_work(cfg, n, pairs)
        fwd = sum(v for k, v in phases.items() if k.startswith("fwd"))
        resel = phases.get("recompute selection", 0.0)
        return dict(n=n, stack=stack, step_ms=total, fwd_ms=fwd, recompute_selection_ms=resel,
                    recompute_backward_ms=total - fwd - resel, phases_ms=phases, pairs=pairs,
                    flops=flops, bytes=nbytes, tflops=flops / total / 1e9,
                    fraction_of_floor=floor_ms(cfg, flops, nbytes) / total, peak_gib=peak,
                    phase_peaks_gib=phase_peaks), None
    except RuntimeError as e:
        if not is_oom(e):
            raise
        # The allocator's own account (allocated by PyTorch / reserved) says what held the memory.
        return None, " ".join(str(e).split())[:400]
    finally:
        del L, grad_out
        free(device)


def affine_fit(points):
    """Least-squares (fixed, per N) of peak = fixed + per_n * N; one point: a line through 0."""
    if len(points) == 1:
        (n, peak), = points
        return 0.0, peak / n
    mean_n = statistics.fmean(n for n, _ in points)
    mean_p = statistics.fmean(p for _, p in points)
    per_n = (sum((n - mean_n) * (p - mean_p) for n, p in points) /
             sum((n - mean_n) ** 2 for n, _ in points))
    return mean_p - per_n * mean_n, per_n


def longest_n(cfg, device, dtype, clock, stack, peaks):
    """The longest N whose step fits on this GPU, to --longest-step tokens, at most --max-n.
    Every tensor of the step has N rows of a fixed width, so its peak memory is affine in N: the
    line through the measured (N, peak GiB) points predicts the limit, and steps at the prediction
    and one --longest-step beyond it usually decide. Where the line was off, the probes gallop
    away from it (1, 2, 4... steps) until they bracket the limit, then bisect: the baseline's step
    takes about a minute at 200K, so every probe counts."""
    free(device)
    available = torch.cuda.mem_get_info(device)[0] / GiB
    fixed, per_n = affine_fit(peaks)
    step = cfg.longest_step
    top = cfg.max_n // step * step
    predicted = int((available - fixed) / per_n) // step * step
    probes = []

    def fits(n):
        r, _ = run_step(cfg, device, dtype, clock, stack, n, runs=0)
        probes.append(dict(n=n, peak_gib=r["peak_gib"] if r else None))
        print(f"longest N, {stack}: N={n} " + (f"peak {r['peak_gib']:.2f} GiB" if r else
                                               "out of memory"), flush=True)
        return r is not None

    lo, hi, gap = None, None, step  # lo fits (0: nothing does), hi ran out of memory
    n = max(step, min(predicted, top))
    if fits(n):
        lo = n
        while hi is None and lo < top:
            n = min(lo + gap, top)
            lo, hi = (n, None) if fits(n) else (lo, n)
            gap *= 2
    else:
        hi = n
        while lo is None:
            n = hi - gap
            if n < step:
                lo = 0
            elif fits(n):
                lo = n
            else:
                hi, gap = n, gap * 2
    while hi is not None and hi - lo > step:
        n = (lo + hi) // 2 // step * step
        lo, hi = (n, hi) if fits(n) else (lo, n)
    return dict(stack=stack, longest_n=lo, first_oom_n=hi,
                bounded_by_max_n=hi is None, predicted_n=predicted, fixed_gib=fixed,
                kib_per_token=per_n * GiB / 1024, available_gib=available, probes=probes)


# ---- report ------------------------------------------------------------------------------------

DSA_PHASES = ("selection", "attention", "indexer_loss")


def layer_bench_command(cfg, sizes):
    """hyscale-layer-bench at this bench's shape, or None where it is not built."""
    if not cfg.layer_bench or not os.access(cfg.layer_bench, os.X_OK):
        return None
    return [cfg.layer_bench, "--device", cfg.device, "--sizes", ",".join(map(str, sizes)),
           "--heads", str(cfg.heads), "--dqk", str(cfg.dqk), "--dv", str(cfg.dv),
           "--heads-i", str(cfg.heads_i), "--dim-i", str(cfg.dim_i), "--topk", str(cfg.topk),
           # RoPE on 64 features (DeepSeek-V3.2's), fewer where the heads are narrower.
           "--rope", str(min(64, cfg.dqk - cfg.dv if cfg.value_in_key else cfg.dqk) // 2 * 2),
           "--rope-i", str(min(64, cfg.dim_i) // 2 * 2),
           "--latent", "true" if cfg.value_in_key else "false",
           "--runs", str(cfg.runs), "--query-chunk", str(cfg.layer_query_chunk)]


def layer_bench_rows(stdout):
    """hyscale-layer-bench's lines, each with step_ms, dsa_ms (the selection, attention and
    indexer-loss phases of every pass) and peak_gib added; out-of-memory lines as they are."""
    rows = []
    for line in stdout.splitlines():
        r = json.loads(line)
        if "oom" not in r:
            phases = r.get("phase_seconds", {})
            r["step_ms"] = r["step_seconds"]["median"] * 1e3
            r["dsa_ms"] = 1e3 * sum(v for k, v in phases.items() if k.startswith(DSA_PHASES))
            r["peak_gib"] = r["peak_memory_bytes"] / GiB if r["peak_memory_bytes"] else None
        rows.append(r)
    return rows


def trainer_layer(cfg, sizes):
    """The trainer's own layer (worker/model's DsaLayer, as hyscale-train runs it: recomputed with
    replay, bf16 autocast, phases timed on the device) at this bench's shape, by
    hyscale-layer-bench; one dict a size, or None without the binary."""
    cmd = layer_bench_command(cfg, sizes)
    if cmd is None:
        return None
    out = subprocess.run(cmd, capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({out.returncode}): {out.stderr.strip()}")
    return layer_bench_rows(out.stdout)


def summary(cfg, report):
    def num(x, width, prec, suffix=""):
        if isinstance(x, (int, float)):
            return f"{x:>{width}.{prec}f}{suffix}"
        return f"{'-':>{width + len(suffix)}}"

    lines = [f"== DSA layer summary: {report['device']}  H={cfg.heads} d_qk={cfg.dqk} d_v={cfg.dv} "
             f"H_I={cfg.heads_i} d_I={cfg.dim_i} k={cfg.topk} {cfg.dtype}; "
             f"medians of {cfg.runs} runs ({cfg.baseline_runs} for the baseline step) =="]
    g = report["gate"]
    worst = max(v for k, v in g["errors"].items() if "rows off" not in k)
    lines.append(f"gate at N={cfg.gate_n} ({g['dtype']}): {'ok' if g['ok'] else 'FAILED'}, "
                 f"max relative error {worst:.2e} (tolerance {g['tolerance']:.0e}), selection rows "
                 f"off: hyscale {g['errors']['hyscale selection: rows off']}, naive "
                 f"{g['errors']['naive selection: rows off']}")
    lines.append("a) selection on recompute (ms): replay = index_score_gather at the kept indices")
    lines.append(f"{'N':>8} {'replay':>9} {'reselect':>9} {'naive':>10} {'reselect/replay':>16} "
                 f"{'naive/replay':>13} (target >= 30x)")
    for r in report["replay"]:
        lines.append(f"{r['n']:>8} {num(r['replay_ms'], 9, 2)} {num(r['reselect_ms'], 9, 2)} "
                     f"{num(r.get('naive_ms'), 10, 1)} {num(r['reselect_over_replay'], 15, 1, 'x')} "
                     f"{num(r.get('naive_over_replay'), 12, 1, 'x')}")
    lines.append("b) one training step (ms): fwd | recompute selection | recompute + bwd")
    lines.append(f"{'N':>8} {'stack':>9} {'step':>10} {'fwd':>9} {'re-sel':>9} {'re+bwd':>10} "
                 f"{'TFLOP/s':>8} {'floor':>6} {'peak GiB':>9} {'vs hyscale':>10}")
    for n in sorted({r["n"] for r in report["step"]}):
        rows = {r["stack"]: r for r in report["step"] if r["n"] == n}
        base = rows.get("hyscale", {}).get("step_ms")
        for stack in ("hyscale", "megatron"):
            r = rows.get(stack)
            if r is None:
                continue
            if "oom" in r:
                lines.append(f"{n:>8} {stack:>9} {'OOM':>10}")
                continue
            ratio = r["step_ms"] / base if base else None
            lines.append(f"{n:>8} {stack:>9} {num(r['step_ms'], 10, 1)} {num(r['fwd_ms'], 9, 1)} "
                         f"{num(r['recompute_selection_ms'], 9, 1)} "
                         f"{num(r['recompute_backward_ms'], 10, 1)} {num(r['tflops'], 8, 1)} "
                         f"{num(r['fraction_of_floor'], 6, 3)} {num(r['peak_gib'], 9, 1)} "
                         f"{num(ratio, 9, 2, 'x')}")
    lines.append("megatron / hyscale step time (target >= 2.5x): " + ", ".join(
        f"N={r['n']}: {r['megatron_over_hyscale']:.2f}x" for r in report["speedups"]))
    if report.get("trainer_layer"):
        lines.append("c) the trainer's own layer (hyscale-layer-bench: worker/model, recomputed with "
                     "replay, phases on the device; d_model 2048, SwiGLU 5632) (ms)")
        lines.append(f"{'N':>8} {'step':>10} {'DSA part':>10} {'rest':>9} {'peak GiB':>9} "
                     f"{'megatron / DSA part':>20}")
        megatron = {r["n"]: r.get("step_ms") for r in report["step"] if r["stack"] == "megatron"}
        for r in report["trainer_layer"]:
            if "oom" in r:
                lines.append(f"{r['n']:>8} {'OOM':>10}")
                continue
            ratio = megatron.get(r["n"]) / r["dsa_ms"] if megatron.get(r["n"]) else None
            lines.append(f"{r['n']:>8} {num(r['step_ms'], 10, 1)} {num(r['dsa_ms'], 10, 1)} "
                         f"{num(r['step_ms'] - r['dsa_ms'], 9, 1)} {num(r['peak_gib'], 9, 1)} "
                         f"{num(ratio, 19, 2, 'x')}")
    for m in report["longest_n"]:
        bound = f"stopped at --max-n {cfg.max_n}" if m["bounded_by_max_n"] else \
            f"N={m['first_oom_n']} ran out of memory"
        lines.append(f"longest N that trains, {m['stack']}: {m['longest_n']} ({bound}; the peaks' "
                     f"line, {m['fixed_gib']:.2f} GiB + {m['kib_per_token']:.1f} KiB a token, "
                     f"predicted {m['predicted_n']} in {m['available_gib']:.1f} GiB free)")
    return "\n".join(lines)


def find_layer_bench(cfg):
    """--layer-bench's default: bench/layer/ of the build holding --lib."""
    if cfg.layer_bench is None:
        build = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(cfg.lib))))
        cfg.layer_bench = os.path.join(build, "bench", "layer", "hyscale-layer-bench")


def add_layer_args(ap, recompute_rows=8192):
    """The layer's shape, dtype and both stacks' chunking (shared with cp_layer_bench)."""
    ap.add_argument("--heads", type=int, default=128)
    ap.add_argument("--dqk", type=int, default=576)
    ap.add_argument("--dv", type=int, default=512)
    ap.add_argument("--heads-i", type=int, default=64)
    ap.add_argument("--dim-i", type=int, default=128)
    ap.add_argument("--topk", type=int, default=2048)
    ap.add_argument("--dtype", choices=["bf16", "fp32"], help="timing dtype (default: bf16 on "
                    "cuda, fp32 on cpu)")
    ap.add_argument("--kl-weight", type=float, default=0.01, help="lambda of the indexer loss")
    ap.add_argument("--chunk", type=int, default=256, help="query rows per gather chunk (baseline)")
    ap.add_argument("--recompute-rows", type=int, default=recompute_rows,
                    help="query rows per chunk of HyScale's recomputation + backward (0: all): "
                    "one chunk's output and gradients alive, not the sequence's")
    ap.add_argument("--naive-chunk-gib", type=float, default=8.0,
                    help="score-table chunk of the naive selection")
    ap.add_argument("--value-in-key", action="store_true",
                    help="absorbed MLA: value = key[:, :d_v], for both stacks")
    ap.add_argument("--layer-bench", help="hyscale-layer-bench, to time the trainer's own layer "
                    "too (default: bench/layer/ of the build holding --lib, if built)")
    ap.add_argument("--layer-query-chunk", type=int, default=0,
                    help="recompute.query_chunk of the trainer's layer (0: all queries at once)")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lib", required=True, help="path to libhyscale_ops.so")
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--sizes", default="32768,65536,131072")
    add_layer_args(ap)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--baseline-runs", type=int, default=2,
                    help="timed runs of the Megatron-style step (seconds each at 64K and up)")
    ap.add_argument("--naive-max", type=int, default=131072,
                    help="largest N for the naive re-selection in a)")
    ap.add_argument("--megatron-max", type=int, default=131072,
                    help="largest N for the baseline step in b)")
    ap.add_argument("--max-n", type=int, default=1048576, help="bound of the longest-N search")
    ap.add_argument("--longest-step", type=int, default=4096,
                    help="resolution of the longest-N search, in tokens")
    ap.add_argument("--longest-stacks", default="hyscale,megatron",
                    help="the stacks whose longest N is searched (the baseline's probes take "
                    "about a minute each near 200K)")
    ap.add_argument("--gate-n", type=int, default=3000)
    ap.add_argument("--gate-rows", type=int, default=48, help="sampled rows of the selection check")
    ap.add_argument("--peak-tflops", type=float, default=790.0, help="bf16 dense rate (DESIGN.md)")
    ap.add_argument("--peak-gbps", type=float, default=4000.0, help="device memory bandwidth")
    ap.add_argument("--json", help="write every figure here")
    cfg = ap.parse_args()
    find_layer_bench(cfg)
    cfg.dtype = cfg.dtype or ("bf16" if cfg.device == "cuda" else "fp32")
    cfg.naive_chunk_bytes = int(cfg.naive_chunk_gib * GiB)
    torch.ops.load_library(cfg.lib)
    device = torch.device(cfg.device)
    dtype = torch.bfloat16 if cfg.dtype == "bf16" else torch.float32
    clock = Clock(device)
    sizes = [int(x) for x in cfg.sizes.split(",")]
    name = torch.cuda.get_device_name() if device.type == "cuda" else "cpu"
    report = dict(device=name, torch=torch.__version__, config=vars(cfg))
    print(f"# {name}  torch {torch.__version__}", flush=True)

    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = False  # the gate compares fp32 math
    gate_dtype = torch.float32 if device.type == "cuda" else torch.float64
    errors, tol = gate(cfg, device, gate_dtype)
    ok = all((v == 0) if "rows off" in k else (v <= tol) for k, v in errors.items())
    report["gate"] = dict(n=cfg.gate_n, dtype=str(gate_dtype), errors=errors, tolerance=tol, ok=ok)
    for k, v in errors.items():
        print(f"gate {k:>32}: {v:.3e}" if isinstance(v, float) else f"gate {k:>32}: {v}")
    free(device)
    if not ok:
        print("gate FAILED: HyScale and the Megatron-style stack disagree; no timings")
        if cfg.json:
            with open(cfg.json, "w") as f:
                json.dump(report, f, indent=1)
        raise SystemExit(1)

    report["replay"] = []
    for n in sizes:
        r = bench_replay(cfg, device, dtype, clock, n)
        report["replay"].append(r)
        print(f"replay N={n}: {r}", flush=True)

    report["step"], report["speedups"] = [], []
    for n in sizes:
        for stack in ("hyscale", "megatron"):
            if stack == "megatron" and n > cfg.megatron_max:
                continue
            runs = cfg.runs if stack == "hyscale" else cfg.baseline_runs
            r, err = run_step(cfg, device, dtype, clock, stack, n, runs)
            if r is None:
                r = dict(n=n, stack=stack, oom=err)
            report["step"].append(r)
            print(f"step N={n} {stack}: " + ", ".join(
                f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in r.items()
                if k not in ("phases_ms", "phase_peaks_gib")), flush=True)
            if r.get("phase_peaks_gib"):
                print("  peak GiB by phase: " + ", ".join(
                    f"{k} {v:.2f}" for k, v in r["phase_peaks_gib"].items()), flush=True)
        both = {r["stack"]: r for r in report["step"] if r["n"] == n and "step_ms" in r}
        if len(both) == 2:
            report["speedups"].append(dict(n=n, megatron_over_hyscale=both["megatron"]["step_ms"] /
                                           both["hyscale"]["step_ms"]))

    report["trainer_layer"] = trainer_layer(cfg, sizes)
    for r in report["trainer_layer"] or []:
        print(f"trainer layer N={r['n']}: " + (f"out of memory ({r['oom']})" if "oom" in r else
              f"step {r['step_ms']:.1f} ms, DSA part {r['dsa_ms']:.1f} ms"), flush=True)

    report["longest_n"] = []
    for stack in ("hyscale", "megatron"):
        peaks = [(r["n"], r["peak_gib"]) for r in report["step"]
                 if r["stack"] == stack and r.get("peak_gib") is not None]
        if peaks and stack in cfg.longest_stacks.split(","):  # the CPU: no peaks, no limit
            report["longest_n"].append(longest_n(cfg, device, dtype, clock, stack, peaks))

    text = summary(cfg, report)
    print(text)
    if cfg.json:
        report["summary"] = text
        with open(cfg.json, "w") as f:
            json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
