#!/usr/bin/env python3
"""Builds of libhyscale_ops.so on the same GPU, in turn: the dense warm-up's loss
(dense_indexer_kl with the frozen attention's lse, the trainer's path; with --no-lse, its last
frozen layer's, which makes the lse on the target's tiles; issue #40) at the 2048x4 reference
model's shape of bench/indexer_loss_bench.py part c (H = 64, d_qk 576, H_I 64 x 128),
whole and by kernel (torch.profiler, DENSE_PARTS).

As bench/sparse_attn_ab.py does for the attention: each library runs in its own process (all
register the same op names), round after round, so a change is judged against the build before it
in the same thermal state. The first library is the base; the table gives each one's medians over
the rounds and the base's time over it (above 1: faster), with the median SM clock. Correctness is
indexer_loss_cuda_test's and the main benchmark's business, not this script's.

  python3 bench/dense_loss_ab.py --libs base=/tmp/base.so,chunk=/tmp/chunk.so --n 32768 --rounds 2

scripts/ab-libs.sh builds the libraries: the tree as it is and with each patch applied, e.g.
  python3 bench/dense_loss_ab.py --n 32768 --libs $(scripts/ab-libs.sh /tmp/ab base= \
      w4=docs/results/dense_bwd_four_warpgroups.patch)
"""
import argparse
import json
import statistics
import subprocess
import sys

from indexer_loss_bench import DQK, dense_inputs, dense_output_pass, profiled_parts
from sparse_attn_ab import mhz
from sparse_attn_bench import timed_with_clock


def measure(lib, n, heads, runs, no_lse):
    """One library's loss at N: its median time, clock and kernels' times, as one JSON line."""
    import torch

    torch.ops.load_library(lib)
    ops = torch.ops.hyscale
    q, kv, q_i, k_i, w = dense_inputs(n, heads, n + 11)
    scale = DQK ** -0.5
    _, lse = (None, None) if no_lse else dense_output_pass(ops, q, kv, scale)
    loss = lambda: ops.dense_indexer_kl(q, kv, q_i, k_i, w, scale, 0, 1, lse)
    ms, clock = timed_with_clock(loss, runs)
    print(json.dumps(dict(ms=ms, clock=clock, parts=profiled_parts(loss))), flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--libs", help="name=libhyscale_ops.so, comma-separated; the first is the base")
    ap.add_argument("--n", type=int, default=32768)
    ap.add_argument("--heads", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--no-lse", action="store_true",
                    help="the loss without the attention's lse (the trainer's last frozen layer: "
                         "the op makes it on the target's tiles)")
    ap.add_argument("--child-timeout", type=float, default=300,
                    help="seconds a library's process may take; past them it is killed and skipped")
    ap.add_argument("--child", help=argparse.SUPPRESS)  # the library one process measures
    a = ap.parse_args()
    if a.child:
        measure(a.child, a.n, a.heads, a.runs, a.no_lse)
        return
    libs = [tuple(item.split("=", 1)) for item in (a.libs or "").split(",") if "=" in item]
    if len(libs) < 2:
        ap.error("--libs needs two name=path entries at least")
    rows = {name: [] for name, _ in libs}
    for r in range(a.rounds):
        for name, path in libs:
            cmd = [sys.executable, __file__, "--child", path, "--n", str(a.n), "--heads",
                   str(a.heads), "--runs", str(a.runs)] + (["--no-lse"] if a.no_lse else [])
            try:
                child = subprocess.run(cmd, check=True, capture_output=True, text=True,
                                       timeout=a.child_timeout)
            except subprocess.TimeoutExpired:
                print(f"round {r + 1} {name:>12} N {a.n}: killed after {a.child_timeout:.0f} s",
                      flush=True)
                continue
            row = json.loads(child.stdout.splitlines()[-1])
            rows[name].append(row)
            parts = ", ".join(f"{part} {ms:.2f}" for part, ms in
                              sorted(row["parts"].items(), key=lambda item: -item[1]))
            print(f"round {r + 1} {name:>12} N {a.n}: {row['ms']:8.2f} ms{mhz(row['clock'])} "
                  f"({parts})", flush=True)
    base = libs[0][0]
    median = lambda name, get: statistics.median(get(x) for x in rows[name])
    base_ms = median(base, lambda x: x["ms"])
    for name in (name for name, _ in libs if rows[name]):
        ms = median(name, lambda x: x["ms"])
        parts = {part: median(name, lambda x, p=part: x["parts"].get(p, 0.0))
                 for part in rows[name][0]["parts"]}
        clocks = [x["clock"]["sm_mhz"] for x in rows[name] if x["clock"]]
        clock = f" at {statistics.median(clocks):.0f} MHz" if clocks else ""
        detail = ", ".join(f"{part} {v:.2f}" for part, v in sorted(parts.items(),
                                                                   key=lambda item: -item[1]))
        print(f"{name:>12}: {ms:8.2f} ms{clock}, {base} / {name} "
              f"{base_ms / ms:.3f} ({detail})")


if __name__ == "__main__":
    main()
