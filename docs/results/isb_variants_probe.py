"""index_score_backward (the op, CUDA events), one machine, variants by environment:
  base     one row a block, grad_q written fp32 and converted (the kernel of record)
  bf16_q   one row a block, grad_q bf16 from the kernel
  merged   three rows a block, their shared keys merged before the reductions (bf16 grad_q)
  no_red   one row, no bulk reductions (exp 1: what the reductions cost)
  no_stage one row, no staging stores nor reductions (exp 2)
grad_k / grad_q / grad_w of bf16_q and merged against base: max |diff| / max |base|."""
import os, sys, statistics, torch
sys.path.insert(0, "bench")  # run from the repository root
from sparse_attn_bench import make_indices
torch.ops.load_library(sys.argv[1])
ops = torch.ops.hyscale
HI, DI, K = 64, 128, 2048
VARIANTS = dict(base=dict(HYSCALE_ISB_ROWS="1", HYSCALE_ISB_FP32_Q="1"),
                bf16_q=dict(HYSCALE_ISB_ROWS="1"), merged=dict(),
                no_red=dict(HYSCALE_ISB_ROWS="1", HYSCALE_ISB_EXPERIMENT="1"),
                no_stage=dict(HYSCALE_ISB_ROWS="1", HYSCALE_ISB_EXPERIMENT="2"))
KEYS = ("HYSCALE_ISB_ROWS", "HYSCALE_ISB_FP32_Q", "HYSCALE_ISB_EXPERIMENT")

def setenv(v):
    for k in KEYS: os.environ.pop(k, None)
    os.environ.update(v)

def timed(fn, runs=9):
    ts = []
    for r in range(runs + 2):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize(); s.record(); fn(); e.record(); torch.cuda.synchronize()
        if r >= 2: ts.append(s.elapsed_time(e))
    return statistics.median(ts)

sizes = [int(x) for x in (sys.argv[2] if len(sys.argv) > 2 else "32768,131072").split(",")]
for n in sizes:
    for kind in ("random", "local_sorted"):
        g = torch.Generator(device="cuda").manual_seed(1)
        idx = make_indices(n, K, kind, 3)
        q_i = torch.randn(n, HI, DI, device="cuda", generator=g).bfloat16()
        k_i = torch.randn(n, DI, device="cuda", generator=g).bfloat16()
        w = torch.randn(n, HI, device="cuda", generator=g) * HI ** -0.5
        gs = torch.randn(n, K, device="cuda", generator=g) * (idx >= 0)
        pairs = int((idx >= 0).sum())
        run = lambda: ops.index_score_backward(gs, q_i, k_i, w, idx, 0)
        line, ref = f"N {n} {kind:>12}:", None
        for name, env in VARIANTS.items():
            setenv(env)
            out = [t.float() for t in run()]
            if name == "base": ref = out
            elif name in ("bf16_q", "merged"):
                errs = [float((o - r).abs().max() / r.abs().max()) for o, r in zip(out, ref)]
                line += f" [{name} err q {errs[0]:.1e} k {errs[1]:.1e} w {errs[2]:.1e}]"
            del out
            ms = timed(run)
            line += f"  {name} {ms:.2f} ms ({6 * HI * DI * pairs / ms / 1e9:.1f} TFLOP/s)"
        print(line, flush=True)
        del idx, q_i, k_i, w, gs, ref
        torch.cuda.empty_cache()
