"""indexer_loss_backward fused (58fd7e5) against the composition before it (gather, torch's
elementwise KL, index_score_backward), CUDA events, medians of 7 after 2, 32K and 128K.

    python3 docs/results/fused_indexer_loss_probe.py $LIB
"""
import sys
import torch
sys.path.insert(0, "bench")
from flash_topk_bench import timed
from sparse_attn_bench import make_indices

torch.ops.load_library(sys.argv[1])
ops = torch.ops.hyscale
HI, DI, K = 64, 128, 2048

def composed(t, lse, g, q, k, w, idx):
    s = ops.index_score_gather(q, k, w, idx, 0, 1)
    invalid = idx.lt(0)
    log_p = s.sub_(lse.unsqueeze(-1))
    loss = t.log().sub_(log_p).mul_(t).masked_fill_(invalid | t.le(0), 0).sum(-1)
    gs = log_p.exp_().sub_(t).mul_(g.unsqueeze(-1)).masked_fill_(invalid, 0)
    return (loss,) + tuple(ops.index_score_backward(gs, q, k, w, idx, 0, 1))

for n in (32768, 131072):
    gen = torch.Generator(device="cuda").manual_seed(1)
    q = torch.randn(n, HI, DI, device="cuda", generator=gen).bfloat16()
    k = torch.randn(n, DI, device="cuda", generator=gen).bfloat16()
    w = torch.randn(n, HI, device="cuda", generator=gen) * HI ** -0.5
    for kind in ("random", "local_sorted"):
        idx = make_indices(n, K, kind, 3)
        t = torch.rand(n, K, device="cuda", generator=gen).masked_fill(idx < 0, 0)
        t = t / t.sum(-1, keepdim=True).clamp_min(1e-30)
        g = torch.randn(n, device="cuda", generator=gen) / n
        lse = ops.index_score_gather(q, k, w, idx, 0, 1).logsumexp(-1)
        fused = ops.indexer_loss_backward(t, lse, g, q, k, w, idx)
        ref = composed(t, lse, g, q, k, w, idx)
        errs = [((a.float() - b.float()).abs().max() / b.float().abs().max().clamp_min(1e-30)).item() for a, b in zip(fused, ref)]
        f_ms = timed(lambda: ops.indexer_loss_backward(t, lse, g, q, k, w, idx), 7, warmup=2)[0]
        c_ms = timed(lambda: composed(t, lse, g, q, k, w, idx), 7, warmup=2)[0]
        isb = timed(lambda: ops.index_score_backward(t, q, k, w, idx, 0, 1), 7, warmup=2)[0]
        print(f"N={n} {kind}: fused {f_ms:.2f} ms, composed {c_ms:.2f} ms ({c_ms / f_ms:.2f}x), index_score_backward alone {isb:.2f} ms; "
              f"max rel diff loss/q/k/w {errs[0]:.1e} {errs[1]:.1e} {errs[2]:.1e} {errs[3]:.1e}", flush=True)
        del t, g, lse, fused, ref
    del q, k, w
    torch.cuda.empty_cache()
