#!/usr/bin/env python3
"""Whether two of the sparse step's kernels overlap when issued on two CUDA streams: each alone,
then each pair one after the other and on two streams, at the 2048x4 reference model's shapes at
32K (H 64, d_qk 576, d_v 512, H_I 64 x 128, k 2048; the query projection 2048 -> 64 x 576). The
pairs are the indexer's work beside the main model's that a second stream could hide:
index_score_backward beside the query projection's backward and the latent attention backward,
FlashTopK and index_score_gather beside the projection's forward. "hidden" is what two streams
save on the pair, over the shorter kernel's time (100 %: the shorter one is free). CUDA events,
medians of 7 runs after 2.

  python3 bench/stream_overlap_probe.py --lib $LIB [--indices random|local_sorted] [--side-sms S]

--side-sms S: the second stream belongs to a green context of S SMs (torch.cuda.green_contexts),
so its kernels (the first of each pair) run on those SMs alone; "alone" then also times them there.

Measured (docs/performance.md section 14): on the whole GPU nothing hidden (its first form,
docs/results/indexer_stream_h100_b00f44a.txt); with the side stream on 66 or 33 of an H100's 132
SMs, 4 % of the index-score backward hidden beside the latent backward at most
(docs/results/stream_overlap_green_h100_1272e2f.txt).
"""
import argparse

import torch

from flash_topk_bench import timed as timed_runs  # (median, all) of CUDA-event timings
from sparse_attn_bench import make_indices

N, H, DQK, DV, HEADS_I, DIM_I, TOPK, D_MODEL = 32768, 64, 576, 512, 64, 128, 2048, 2048


def timed(fn):
    return timed_runs(fn, 7, warmup=2)[0]


def green_stream(sms):
    """A green context of `sms` SMs and a stream of it (PyTorch's beta API: Stream() where it has
    it, else a stream made while the context is current). The caller keeps the context: the
    stream dies with it."""
    from torch.cuda.green_contexts import GreenContext

    ctx = GreenContext.create(num_sms=sms, device_id=torch.cuda.current_device())
    if hasattr(ctx, "Stream"):
        return ctx, ctx.Stream()
    ctx.set_context()
    try:
        return ctx, torch.cuda.Stream()
    finally:
        ctx.pop_context()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--lib", required=True, help="libhyscale_ops.so")
    ap.add_argument("--indices", choices=("random", "local_sorted"), default="random")
    ap.add_argument("--side-sms", type=int, help="the second stream on a green context of this "
                    "many SMs (default: an ordinary stream on the whole GPU)")
    a = ap.parse_args()
    torch.ops.load_library(a.lib)
    ops = torch.ops.hyscale
    g = torch.Generator(device="cuda").manual_seed(1)
    idx = make_indices(N, TOPK, a.indices, 3)
    q_i = torch.randn(N, HEADS_I, DIM_I, device="cuda", generator=g).bfloat16()
    k_i = torch.randn(N, DIM_I, device="cuda", generator=g).bfloat16()
    w = torch.randn(N, HEADS_I, device="cuda", generator=g) * HEADS_I ** -0.5
    grad_scores = torch.randn(N, TOPK, device="cuda", generator=g) * (idx >= 0)
    q = torch.randn(N, H, DQK, device="cuda", generator=g).bfloat16()
    kv = torch.randn(N, DQK, device="cuda", generator=g).bfloat16()
    grad_out = torch.randn(N, H, DV, device="cuda", generator=g).bfloat16()
    scale = DQK ** -0.5
    out, lse = ops.sparse_attn_latent(q, kv, idx, scale, DV)
    x = torch.randn(N, D_MODEL, device="cuda", generator=g).bfloat16()
    wq = torch.randn(D_MODEL, H * DQK, device="cuda", generator=g).bfloat16()
    grad_y = torch.randn(N, H * DQK, device="cuda", generator=g).bfloat16()

    def proj_bwd():  # the query projection's backward: dx and dW
        grad_y @ wq.t()
        x.t() @ grad_y

    work = dict(
        isb=lambda: ops.index_score_backward(grad_scores, q_i, k_i, w, idx, 0),
        attn_bwd=lambda: ops.sparse_attn_latent_backward(grad_out, q, kv, idx, scale, DV, out, lse),
        proj_bwd=proj_bwd,
        proj_fwd=lambda: x @ wq,
        topk=lambda: ops.flash_topk(q_i, k_i, w, TOPK, 0, 1, False),
        gather=lambda: ops.index_score_gather(q_i, k_i, w, idx, 0, 1))
    # `green` holds the side stream's context for the run.
    green, side = green_stream(a.side_sms) if a.side_sms else (None, torch.cuda.Stream())

    def together(first, second):
        def run():
            main_stream = torch.cuda.current_stream()
            side.wait_stream(main_stream)
            with torch.cuda.stream(side):
                first()
            second()
            main_stream.wait_stream(side)
        return run

    alone = {name: timed(fn) for name, fn in work.items()}
    print(f"{torch.cuda.get_device_name()}, selections {a.indices}; alone, ms: "
          + ", ".join(f"{name} {ms:.2f}" for name, ms in alone.items()))
    if a.side_sms:
        print(f"alone on the side stream's {a.side_sms} SMs, ms: " + ", ".join(
            f"{name} {timed(together(work[name], lambda: None)):.2f}"
            for name in ("isb", "topk", "gather")))
    for first, second in (("isb", "proj_bwd"), ("isb", "attn_bwd"), ("topk", "proj_fwd"),
                          ("gather", "proj_fwd")):
        serial = timed(lambda: (work[first](), work[second]()))
        both = timed(together(work[first], work[second]))
        hidden = (serial - both) / min(alone[first], alone[second])
        print(f"{first} || {second}: one after the other {serial:.2f} ms, two streams {both:.2f} ms, "
              f"{100 * hidden:.0f} % of the shorter hidden")


if __name__ == "__main__":
    main()
