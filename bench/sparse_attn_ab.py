#!/usr/bin/env python3
"""Two builds of libhyscale_ops.so on the same GPU, in turn: the latent sparse attention's forward
(sparse_attn with value = key[:, :d_v]), with --backward sparse_attn_latent_backward, and with
--target sparse_attn_latent_backward_target (the backward with the indexer's target), with
--index-score the indexer's index_score_backward (H_I 64 x d_I 128, bench/indexer_loss_bench.py's
inputs) on the same selections, at the DeepSeek-V3.2 absorbed shape of bench/sparse_attn_bench.py
(H = 128, d_qk = 576, d_v = 512, k = 2048, its "local" and "random" selections).

A kernel change is judged against the build before it on the same machine and in the same thermal
state: the GPU's clock drifts by several percent between runs and machines, more than many changes
are worth. Each library runs in its own process (both register the same op names), round after
round, new then old; the table gives each round's medians (CUDA events after a warm-up) and the
ratio of the medians over all rounds, with the median SM clock of each timing (NVML,
bench/gpu_clock.py) to tell a change from the clock's drift. Correctness is
sparse_attn_cuda_test's and the main benchmark's business, not this script's.

  python3 bench/sparse_attn_ab.py --new build-gpu/kernels/torch/libhyscale_ops.so \\
      --old /tmp/old/build-gpu/kernels/torch/libhyscale_ops.so --cases 32768:local,131072:random \\
      --backward --target --rounds 2
"""
import argparse
import itertools
import json
import statistics
import subprocess
import sys

from indexer_loss_bench import DIM_I, HEADS_I, index_inputs
from sparse_attn_bench import DQK, DV, make_indices, make_inputs, timed_with_clock, useful_flops


def measure(lib, cases, backward, target, index_score, fwd_runs, bwd_runs):
    """One library's medians: a dict per case."""
    import torch

    torch.ops.load_library(lib)
    scale = DQK ** -0.5
    for n, kind in cases:
        q, kv, values, grad_out = make_inputs(n, value_in_key=True)
        idx = make_indices(n, 2048, kind, seed=n + 1)
        fwd_flops, bwd_flops = useful_flops(idx)
        fwd = lambda: torch.ops.hyscale.sparse_attn_grouped(q, kv, values, idx, scale, 1)
        fwd_ms, fwd_clock = timed_with_clock(fwd, fwd_runs)
        row = dict(n=n, kind=kind, fwd_ms=fwd_ms, fwd_flops=fwd_flops, fwd_clock=fwd_clock)
        if backward or target:
            out, lse = fwd()
        if backward:
            bwd = lambda: torch.ops.hyscale.sparse_attn_latent_backward(
                grad_out, q, kv, idx, scale, DV, out, lse)
            row["bwd_ms"], row["bwd_clock"] = timed_with_clock(bwd, bwd_runs)
            row["bwd_flops"] = bwd_flops
        if target:
            row["tgt_ms"], row["tgt_clock"] = timed_with_clock(
                lambda: torch.ops.hyscale.sparse_attn_latent_backward_target(
                    grad_out, q, kv, idx, scale, DV, out, lse), bwd_runs)
            row["tgt_flops"] = bwd_flops
        if index_score:
            q_i, k_i, w, _, grad = index_inputs(n, 2048, n, idx)
            row["isb_ms"], row["isb_clock"] = timed_with_clock(
                lambda: torch.ops.hyscale.index_score_backward(grad, q_i, k_i, w, idx), bwd_runs)
            row["isb_flops"] = 6 * HEADS_I * DIM_I * int((idx >= 0).sum())
            del q_i, k_i, w, grad
        print(json.dumps(row), flush=True)
        del q, kv, values, grad_out, idx
        torch.cuda.empty_cache()


def mhz(clock):
    return "" if clock is None else f" {clock['sm_mhz']:5.0f} MHz"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--new", help="libhyscale_ops.so of the change")
    ap.add_argument("--old", help="libhyscale_ops.so of the build before it")
    ap.add_argument("--cases", default="32768:local,32768:random,131072:local,131072:random",
                    help="N:kind, comma-separated (kind: local, local_sorted, random or shuffled)")
    ap.add_argument("--backward", action="store_true", help="also time the latent backward")
    ap.add_argument("--target", action="store_true",
                    help="also time the latent backward that emits the indexer's target")
    ap.add_argument("--index-score", action="store_true",
                    help="also time index_score_backward on the same selections")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--fwd-runs", type=int, default=5)
    ap.add_argument("--bwd-runs", type=int, default=3)
    ap.add_argument("--child", help=argparse.SUPPRESS)  # the library one process measures
    a = ap.parse_args()
    cases = [(int(c.split(":")[0]), c.split(":")[1]) for c in a.cases.split(",")]
    if a.child:
        measure(a.child, cases, a.backward, a.target, a.index_score, a.fwd_runs, a.bwd_runs)
        return
    if not a.new or not a.old:
        ap.error("--new and --old are required")
    rows = {"new": [], "old": []}
    # A process a case: two 128K cases in one process do not fit an 80 GB card.
    for r, case, name in itertools.product(range(a.rounds), a.cases.split(","), ("new", "old")):
        cmd = [sys.executable, __file__, "--child", getattr(a, name), "--cases", case,
               "--fwd-runs", str(a.fwd_runs), "--bwd-runs", str(a.bwd_runs)]
        cmd += ["--backward"] if a.backward else []
        cmd += ["--target"] if a.target else []
        cmd += ["--index-score"] if a.index_score else []
        child = subprocess.run(cmd, capture_output=True, text=True)
        if child.returncode != 0:
            sys.exit(f"{case} with {name} ({getattr(a, name)}) failed:\n{child.stderr}")
        for row in map(json.loads, child.stdout.splitlines()):
            rows[name].append(row)
            line = (f"round {r + 1} {name:>3} {row['n']:>7} {row['kind']:>6}  fwd "
                    f"{row['fwd_ms']:8.2f} ms {row['fwd_flops'] / row['fwd_ms'] / 1e9:6.1f} TF/s"
                    f"{mhz(row['fwd_clock'])}")
            if "bwd_ms" in row:
                line += (f"  latent bwd {row['bwd_ms']:8.2f} ms "
                         f"{row['bwd_flops'] / row['bwd_ms'] / 1e9:6.1f} TF/s"
                         f"{mhz(row['bwd_clock'])}")
            if "tgt_ms" in row:
                line += f"  with target {row['tgt_ms']:8.2f} ms{mhz(row['tgt_clock'])}"
            if "isb_ms" in row:
                line += (f"  index-score bwd {row['isb_ms']:8.2f} ms "
                         f"{row['isb_flops'] / row['isb_ms'] / 1e9:6.1f} TF/s"
                         f"{mhz(row['isb_clock'])}")
            print(line, flush=True)
    for n, kind in cases:
        pick = {name: [x for x in rows[name] if x["n"] == n and x["kind"] == kind]
                for name in rows}
        phases = (["fwd"] + (["bwd"] if a.backward else []) + (["tgt"] if a.target else []) +
                  (["isb"] if a.index_score else []))
        for phase in phases:
            new = statistics.median(x[f"{phase}_ms"] for x in pick["new"])
            old = statistics.median(x[f"{phase}_ms"] for x in pick["old"])
            print(f"{n:>7} {kind:>6} {phase}: new {new:8.2f} ms, old {old:8.2f} ms, "
                  f"old / new {old / new:.3f}")


if __name__ == "__main__":
    main()
