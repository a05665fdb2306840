#!/usr/bin/env python3
"""One DSA layer's training step under context parallelism: scaling over P ranks (issue #8).

One sequence of N tokens over P ranks (one process each, launched here: NCCL with rank r on GPU r,
or Gloo on the CPU), in the layouts of worker/parallel/layout.h: contiguous (rank r holds
[rN/P, (r+1)N/P)) or zigzag (2P chunks, rank r holds chunks r and 2P-1-r). The layer, its shape
and both stacks are bench/dsa_layer_bench.py's (imported, not copied): HyScale = flash_topk +
sparse_attn + selection replay, Megatron-style = naive selection + gather attention + re-selection.
Each rank holds its own rows of all six inputs and, per step:
  - all-gathers the key side (indexer keys k_I [N, d_I] first, then key [N, d_qk] and value
    [N, d_v]) asynchronously; waits for k_I, runs its selection (flash_topk with each run's global
    position as q_offset), and only then waits for key/value: their gather overlaps the selection;
  - after the forward, gathers the key side again for the recomputation (the layer does not keep
    it), k_I waited for at once, key/value behind the selection replay (or re-selection);
  - after the backward, reduce-scatters the key-side gradients (all-reduce + slice on Gloo).
--value-in-key: absorbed-MLA values (the keys' first d_v features, dsa_layer_bench's option):
only k_I and the keys travel, HyScale attends with sparse_attn_latent, and the planner's job has
model.latent_kv.
Every wait is its own timed phase ("wait ..."): CUDA events before and after the stream's wait,
so the phase is the time the compute stream stood still (exposed communication, which includes
waiting for a slower rank: contiguous shards are causally imbalanced). The same
collectives alone, without compute, give the total communication time; overlapped = total -
exposed. The loss is the global mean, so each rank weights its KL by 1/P.

Reported per (P, layout, N, stack), max over ranks: step ms (median of --runs after --warmup;
at N >= --long-n no warm-up and --long-runs), tokens/s per GPU = N / P / step, exposed
communication share, peak GiB (torch.cuda.max_memory_allocated), the one-GPU step at the same N
where it fits (up to --single-max; scaling efficiency = tokens/s/GPU at P over tokens/s at P=1),
and the planner's prediction for the same (N, P, layout, G=1) (`hyscale plan --json` of a
one-layer DeepSeek-V3.2 job, --calibration applied): its layer terms beside the measured phases.
The comparison leaves out the planner's dense terms (the layer here has no projections).

Correctness gate first, at --gate-n: for every layout and stack, the CP step's output, lse, loss
and the gradients of all six inputs, gathered to rank 0, equal the one-rank step on the same
inputs (fp32 inputs holding bf16 values on the GPU, fp64 on the CPU); else exit status 1.

Then, where hyscale-layer-bench is built (--layer-bench, default bench/layer/ of --lib's build),
the trainer's own layer (worker/model with worker/parallel's key exchange) runs over the same
ranks, layouts and sizes, one process a rank as hyscale-train's: its slowest rank's step and DSA
part (selection, attention and indexer-loss phases) and its exposed communication.

--budget-s bounds the run: rows whose estimated time (from the last measured step of the stack,
scaled by N^1.5) would pass it are reported as skipped. Order: HyScale rows, the one-GPU HyScale
rows, then the Megatron-style ones.

  python3 bench/cp_layer_bench.py --lib build-pytorch/kernels/torch/libhyscale_ops.so --world 2 \\
      --hyscale build/client/hyscale --calibration docs/results/calibration_h200.json \\
      --json cp_layer_2xh200.json
  /usr/bin/python3 bench/cp_layer_bench.py --lib build/kernels/torch/libhyscale_ops.so \\
      --device cpu --world 2 --sizes 512 --topk 32 --heads 4 --dqk 64 --dv 64 --heads-i 16 \\
      --dim-i 64 --runs 2 --gate-n 256
"""
import argparse
import copy
import datetime
import json
import os
import socket
import subprocess
import sys
import tempfile
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import dsa_layer_bench as dsa  # noqa: E402

GiB = 2 ** 30
QUERY_SIDE = ("q", "q_i", "w")


def attention_keys(cfg):
    """The attention's key-side inputs: the keys, and the values unless they are the keys' first
    features (--value-in-key: then only the keys travel, as in the trainer's model.latent_kv)."""
    return ["key"] if dsa.value_in_key(cfg) else ["key", "value"]


# ---- layouts (worker/parallel/layout.cc ShardPositions) --------------------------------------

def pieces_of(layout, n_total, world, rank):
    """(first local row, rows, global position) of each run of consecutive positions."""
    if layout == "contiguous":
        n = n_total // world
        return [(0, n, rank * n)]
    c = n_total // (2 * world)
    return [(0, c, rank * c), (c, c, (2 * world - 1 - rank) * c)]


def positions(layout, n_total, world, rank, device):
    return torch.cat([torch.arange(off, off + m, device=device)
                      for _, m, off in pieces_of(layout, n_total, world, rank)])


# ---- the key-side exchange ------------------------------------------------------------------

class KeyExchange:
    """Gathers each rank's key-side rows into global order and reduces the gradients back.
    `full[name]` is the gathered tensor the layer reads (a leaf: its .grad is the [N, d]
    gradient of this rank's queries)."""

    def __init__(self, cfg, layout, n_total, world, rank, device, dtype):
        self.world, self.rank, self.nccl = world, rank, device.type == "cuda"
        self.n = n_total // world
        width = dict(k_i=cfg.dim_i, key=cfg.dqk, value=cfg.dv)
        self.attention = attention_keys(cfg)
        width = {k: width[k] for k in ["k_i"] + self.attention}
        self.full = {k: torch.empty(n_total, d, device=device, dtype=dtype).requires_grad_(True)
                     for k, d in width.items()}
        # Global position of each rank-major row; None where rank-major already is global order.
        self.order = None
        if layout != "contiguous":
            self.order = torch.cat([positions(layout, n_total, world, r, device)
                                    for r in range(world)])
        self.buf = {k: (v.detach() if self.order is None else torch.empty_like(v.detach()))
                    for k, v in self.full.items()}

    def gather(self, local, names):
        works = []
        for name in names:
            out, src = self.buf[name], local[name].detach()
            if self.nccl:
                works.append((name, dist.all_gather_into_tensor(out, src, async_op=True)))
            else:  # Gloo has no all_gather_into_tensor: the same buffer as P views
                works.append((name, dist.all_gather(list(out.chunk(self.world)), src,
                                                    async_op=True)))
        return works

    def finish(self, works, mark, what):
        """Waits (a phase of its own), then puts rank-major rows in global order."""
        for _, w in works:
            w.wait()
        mark(f"wait {what}")
        if self.order is not None:
            with torch.no_grad():
                for name, _ in works:
                    self.full[name].index_copy_(0, self.order, self.buf[name])
            mark(f"reorder {what}")

    def reduce(self, mark):
        """This rank's rows of the key-side gradients summed over ranks; [n, d] per name."""
        out, works = {}, []
        for name in self.full:
            g = self.full[name].grad
            g = g if self.order is None else g.index_select(0, self.order)
            if self.nccl:
                out[name] = torch.empty(self.n, g.shape[1], device=g.device, dtype=g.dtype)
                works.append(dist.reduce_scatter_tensor(out[name], g, async_op=True))
            else:  # Gloo has no reduce-scatter
                g = g.contiguous()
                works.append(dist.all_reduce(g, async_op=True))
                out[name] = g[self.rank * self.n:(self.rank + 1) * self.n]
        for w in works:
            w.wait()
        mark("wait reduce-scatter")
        return out


def cp_step(cfg, stack, ex, local, grad_out, pieces, mark):
    """One training step of this rank's queries; returns the stack's result and sets
    local[name].grad for all six inputs (key side: this rank's rows, summed over ranks)."""
    for t in list(local.values()) + list(ex.full.values()):
        t.grad = None
    L = {name: local[name] for name in QUERY_SIDE}
    L.update(ex.full)
    first = ex.gather(local, ["k_i"])
    rest = ex.gather(local, ex.attention)
    ex.finish(first, mark, "k_i")
    pending = {}

    def stack_mark(name):
        mark(name)
        if name == "fwd selection":
            ex.finish(rest, mark, "key/value")
        elif name == "fwd indexer loss":  # recomputation: the key side again
            again = ex.gather(local, ["k_i"])
            pending["kv"] = ex.gather(local, ex.attention)
            ex.finish(again, mark, "k_i (recompute)")
        elif name == "recompute selection" and "kv" in pending:  # the first row chunk
            ex.finish(pending.pop("kv"), mark, "key/value (recompute)")

    r = dsa.STEPS[stack](cfg, L, grad_out, stack_mark, pieces=pieces)
    for name, g in ex.reduce(mark).items():
        local[name].grad = g
    return r


def comm_only(ex, local, mark):
    """The step's collectives without compute: the total communication time."""
    for _ in range(2):  # forward and recomputation
        ex.finish(ex.gather(local, ["k_i"]), mark, "k_i")
        ex.finish(ex.gather(local, ex.attention), mark, "key/value")
    ex.reduce(mark)  # of the gradients the caller left in ex.full


def local_cfg(cfg, world):
    """The layer's loss is the mean over all N queries: each rank's local mean weighs 1/P."""
    c = copy.copy(cfg)
    c.kl_weight = cfg.kl_weight / world
    return c


# ---- correctness gate -----------------------------------------------------------------------

def gather_rows(t, pos, world, n_total):
    """The [n, ...] rows of every rank put back in global order (on every rank)."""
    t = t.detach().contiguous()
    parts = [torch.empty_like(t) for _ in range(world)]
    dist.all_gather(parts, t)
    ps = [torch.empty_like(pos) for _ in range(world)]
    dist.all_gather(ps, pos)
    out = torch.empty((n_total,) + tuple(t.shape[1:]), dtype=t.dtype, device=t.device)
    for p, part in zip(ps, parts):
        out[p] = part
    return out


def gate(cfg, layout, stack, rank, world, device, dtype):
    n = cfg.gate_n
    L, grad_out = dsa.make_layer(cfg, n, torch.float32, device, seed=1)
    L = {k: dsa.bf16_valued(v).to(dtype).requires_grad_(True) for k, v in L.items()}
    grad_out = dsa.bf16_valued(grad_out).to(dtype)
    ref = dsa.STEPS[stack](cfg, L, grad_out)
    pos = positions(layout, n, world, rank, device)
    local = {k: v.detach()[pos].clone().requires_grad_(True) for k, v in L.items()}
    ex = KeyExchange(cfg, layout, n, world, rank, device, dtype)
    got = cp_step(local_cfg(cfg, world), stack, ex, local, grad_out[pos],
                  pieces_of(layout, n, world, rank), lambda name: None)
    errors = {}
    for q in ("out", "lse", "idx"):
        full = gather_rows(got[q], pos, world, n)
        if q == "idx":  # sets per row (the kernels may order them differently)
            errors["selection: rows off"] = int(
                (full.sort(1).values != ref[q].sort(1).values).any(1).sum())
        else:
            errors[q] = dsa.rel_err(full, ref[q])
    losses = [torch.zeros(1, dtype=torch.float64, device=device) for _ in range(world)]
    dist.all_gather(losses, got["loss"].detach().double().reshape(1))
    errors["loss"] = dsa.rel_err(torch.cat(losses).mean().reshape(1), ref["loss"].reshape(1))
    for k in L:
        errors[f"grad {k}"] = dsa.rel_err(gather_rows(local[k].grad, pos, world, n), L[k].grad)
    tol = 2e-2 if device.type == "cuda" else 1e-6
    ok = all((v == 0) if "rows off" in k else (v <= tol) for k, v in errors.items())
    return dict(layout=layout, stack=stack, n=n, dtype=str(dtype), errors=errors, tolerance=tol,
                ok=ok)


# ---- timings --------------------------------------------------------------------------------

def max_over_ranks(value):
    out = [None] * dist.get_world_size()
    dist.all_gather_object(out, value)
    return out


def run_cp(cfg, stack, layout, n, rank, world, device, dtype, clock, warmup, runs):
    ex = local = grad_out = None
    try:
        # This rank's rows only, random: the global inputs need not exist (q alone is 151 GB at
        # 1M tokens).
        local, grad_out = dsa.make_layer(cfg, n // world, dtype, device, seed=n + rank)
        ex = KeyExchange(cfg, layout, n, world, rank, device, dtype)
        pieces = pieces_of(layout, n, world, rank)
        lcfg = local_cfg(cfg, world)
        if device.type == "cuda":
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        total, phases = dsa.timed_step(
            clock, lambda mark: cp_step(lcfg, stack, ex, local, grad_out, pieces, mark), runs,
            warmup)
        peak = torch.cuda.max_memory_allocated() / GiB if device.type == "cuda" else None
        for name in ex.full:
            ex.full[name].grad = torch.zeros_like(ex.full[name].detach())
        comm_total, comm_phases = dsa.timed_step(clock, lambda mark: comm_only(ex, local, mark),
                                                 max(2, runs), 1)
        exposed = sum(v for k, v in phases.items() if k.startswith("wait"))
        mine = dict(step_ms=total, phases_ms=phases, exposed_ms=exposed, comm_ms=comm_total,
                    comm_phases_ms=comm_phases, peak_gib=peak, oom=None)
    except RuntimeError as e:
        if not dsa.is_oom(e):
            raise
        mine = dict(oom=" ".join(str(e).split())[:300])
    finally:
        del ex, local, grad_out
        dsa.free(device)
    ranks = max_over_ranks(mine)
    if any(r["oom"] for r in ranks):
        return dict(oom=next(r["oom"] for r in ranks if r["oom"]))
    step = max(r["step_ms"] for r in ranks)
    exposed = max(r["exposed_ms"] for r in ranks)
    comm = max(r["comm_ms"] for r in ranks)
    return dict(step_ms=step, exposed_ms=exposed, comm_ms=comm,
                overlapped_ms=max(0.0, comm - exposed), exposed_share=exposed / step,
                tokens_per_s_per_gpu=n / world / (step / 1e3),
                peak_gib=max(r["peak_gib"] for r in ranks) if ranks[0]["peak_gib"] else None,
                phases_ms={k: max(r["phases_ms"][k] for r in ranks) for k in ranks[0]["phases_ms"]},
                comm_phases_ms={k: max(r["comm_phases_ms"][k] for r in ranks)
                                for k in ranks[0]["comm_phases_ms"]},
                per_rank_step_ms=[r["step_ms"] for r in ranks],
                per_rank_exposed_ms=[r["exposed_ms"] for r in ranks])


# ---- the planner's prediction ---------------------------------------------------------------

JOB = """name: cp-layer-bench
model: {{vocab_size: 256, d_model: 1024, layers: 1, heads: {heads}, head_dim_qk: {dqk},
        rope_dim: {rope}, head_dim_v: {dv}, d_ff: 4096, latent_kv: {latent},
        indexer: {{heads: {heads_i}, dim: {dim_i}, rope_dim: {rope_i}, topk: {topk}}}}}
data: {{seq_len: {n}, batch_size: 1, text_file: {{path: /dev/null}}}}
stages: [{{steps: 1, lr: 1.0e-4, attention: SPARSE}}]
"""


def predict(cfg, n, world, layout, stack):
    """The planner's one-layer terms (ms) for cp=world, layout, shared group, G=1, replay
    (re-selection for the Megatron stack), and their sum without the dense terms."""
    if not cfg.hyscale:
        return None
    with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as f:
        # A latent's RoPE takes the features after its values (job spec: d_v + rope <= d_qk).
        latent = dsa.value_in_key(cfg)
        rope = min(64, cfg.dqk - cfg.dv if latent else cfg.dqk // 2)
        f.write(JOB.format(n=n, heads=cfg.heads, dqk=cfg.dqk, dv=cfg.dv, heads_i=cfg.heads_i,
                           dim_i=cfg.dim_i, topk=cfg.topk, rope=rope,
                           rope_i=min(32, cfg.dim_i // 2), latent=str(latent).lower()))
    # This benchmark's Megatron-style stack selects like Megatron-naive (whole rows).
    planner_stack = "megatron-naive" if stack == "megatron" else stack
    cmd = [cfg.hyscale, "-o", "json", "plan", f.name, "--gpus", str(world), "--gpu", "h200",
           "--stack", planner_stack, "--top", "0"]
    if cfg.calibration:
        cmd += ["--calibration", cfg.calibration]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    os.unlink(f.name)
    if not proc.stdout.strip():
        return dict(error=proc.stderr.strip()[:300])
    recompute = "replay" if stack == "hyscale" else "reselect"
    layout = layout if world > 1 else "contiguous"
    for c in json.loads(proc.stdout)["candidates"]:
        if (c["context_parallel"], c["cp_layout"], c["indexer_group"], c["query_group"],
                c["recompute"]) == (world, layout, "shared", 1, recompute):
            t = {k: v * 1e3 for k, v in c["layer_seconds"].items()}
            # The Megatron-style loss forms the scores at the kept keys twice (planner/cost_model.h);
            # HyScale's inside its backward.
            gathers = 0 if stack == "hyscale" else 2
            step = (t["selection"] + gathers * t["score_gather"] + t["indexer_loss_fwd"] +
                    t["indexer_loss_bwd"] + t["attention_fwd"] +
                    t["attention_bwd"] + t["recompute"] - t["dense_fwd"] + t["launches"] +
                    t["gather_exposed"] + t["recompute_gather_exposed"] + t["reduce_scatter"])
            return dict(step_ms=step, terms_ms=t, rejected=c.get("rejected"))
    return dict(error=f"no candidate cp {world} {layout} shared G=1 {recompute}")


# ---- report ---------------------------------------------------------------------------------

def fmt(x, spec, width):
    return f"{x:>{width}{spec}}" if isinstance(x, (int, float)) else f"{'-':>{width}}"


def summary(cfg, report):
    lines = [f"== DSA layer under context parallelism: {report['device']} x {cfg.world}, "
             f"H={cfg.heads} d_qk={cfg.dqk} d_v={cfg.dv} H_I={cfg.heads_i} d_I={cfg.dim_i} "
             f"k={cfg.topk} {cfg.dtype}"
             f"{' value = key[:, :d_v]' if dsa.value_in_key(cfg) else ''} =="]
    for g in report["gate"]:
        worst = max(v for k, v in g["errors"].items() if "rows off" not in k)
        lines.append(f"gate {g['stack']} {g['layout']} N={g['n']} ({g['dtype']}): "
                     f"{'ok' if g['ok'] else 'FAILED'}, max relative error {worst:.2e} "
                     f"(tolerance {g['tolerance']:.0e}), selection rows off "
                     f"{g['errors']['selection: rows off']}")
    lines.append(f"{'P':>2} {'layout':>10} {'N':>8} {'stack':>8} {'step ms':>10} {'tok/s/GPU':>10} "
                 f"{'exposed':>8} {'comm ms':>8} {'peak GiB':>8} {'P=1 tok/s':>10} {'eff':>6} "
                 f"{'pred ms':>10} {'meas/pred':>9}")
    single = {(r["n"], r["stack"]): r for r in report["single"] if "step_ms" in r}
    for r in report["rows"]:
        head = f"{r['world']:>2} {r['layout']:>10} {r['n']:>8} {r['stack']:>8}"
        if "step_ms" not in r:
            lines.append(f"{head} {r.get('oom') and 'OOM' or r.get('skipped', '-')}")
            continue
        one = single.get((r["n"], r["stack"]))
        one_tps = one["tokens_per_s"] if one else None
        eff = r["tokens_per_s_per_gpu"] / one_tps if one_tps else None
        pred = (r.get("predicted") or {}).get("step_ms")
        lines.append(f"{head} {fmt(r['step_ms'], '.1f', 10)} "
                     f"{fmt(r['tokens_per_s_per_gpu'], '.0f', 10)} "
                     f"{fmt(100 * r['exposed_share'], '.1f', 7)}% {fmt(r['comm_ms'], '.1f', 8)} "
                     f"{fmt(r['peak_gib'], '.1f', 8)} {fmt(one_tps, '.0f', 10)} "
                     f"{fmt(eff, '.2f', 6)} {fmt(pred, '.1f', 10)} "
                     f"{fmt(r['step_ms'] / pred if pred else None, '.2f', 9)}")
    lines.append("one GPU (P=1):")
    for r in report["single"]:
        lines.append(f"   N={r['n']} {r['stack']}: " + (
            f"{r['step_ms']:.1f} ms, {r['tokens_per_s']:.0f} tok/s, peak "
            f"{fmt(r.get('peak_gib'), '.1f', 0)} GiB, predicted "
            f"{fmt((r.get('predicted') or {}).get('step_ms'), '.1f', 0)} ms"
            if "step_ms" in r else r.get("skipped") or f"OOM ({r.get('oom', '')[:80]})"))
    lines.append("measured phases (ms, max over ranks) | planner's layer terms (ms):")
    for r in report["rows"] + report["single"]:
        if "step_ms" not in r:
            continue
        meas = ", ".join(f"{k} {v:.1f}" for k, v in r["phases_ms"].items())
        p = r.get("predicted") or {}
        pred = ", ".join(f"{k} {v:.1f}" for k, v in p.get("terms_ms", {}).items()) or \
            p.get("error", "no --hyscale")
        lines.append(f"  P={r.get('world', 1)} {r.get('layout', '-')} N={r['n']} {r['stack']}: "
                     f"{meas} | {pred}")
    return "\n".join(lines)


# ---- driver ---------------------------------------------------------------------------------

class Budget:
    """Skips rows that would pass --budget-s or device memory, estimated from the stack's last
    row: time scaled by N^1.5, peak memory by the local queries (the query side dominates it:
    ~0.64 MiB a query at the default shape)."""

    def __init__(self, cfg, memory_gib):
        self.end, self.memory_gib, self.last = time.monotonic() + cfg.budget_s, memory_gib, {}

    def why_not(self, stack, n, n_local, steps, scale=1.0):
        if stack not in self.last:
            return None
        n0, local0, ms, peak = self.last[stack]
        est = ms / 1e3 * (n / n0) ** 1.5 * scale * steps
        if time.monotonic() + est > self.end:
            return f"skipped: ~{est:.0f} s would pass --budget-s"
        if peak and self.memory_gib and peak * n_local / local0 > self.memory_gib:
            return (f"skipped: ~{peak * n_local / local0:.0f} GiB would not fit "
                    f"({self.memory_gib:.0f} GiB)")
        return None

    def record(self, stack, n, n_local, ms, peak):
        self.last[stack] = (n, n_local, ms, peak)


def worker(rank, cfg, port):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    device = torch.device(cfg.device, rank) if cfg.device == "cuda" else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
        torch.backends.cuda.matmul.allow_tf32 = False  # the gate compares fp32 math
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo", rank=rank,
                            world_size=cfg.world, timeout=datetime.timedelta(minutes=30))
    torch.ops.load_library(cfg.lib)
    dtype = torch.bfloat16 if cfg.dtype == "bf16" else torch.float32
    clock = dsa.Clock(device)
    world, lead = cfg.world, rank == 0
    say = (lambda text: print(text, flush=True)) if lead else (lambda text: None)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    report = dict(device=name, torch=torch.__version__, config=vars(cfg), gate=[], rows=[],
                  single=[])
    say(f"# {name} x {world}  torch {torch.__version__}")

    gate_dtype = torch.float32 if device.type == "cuda" else torch.float64
    for layout in cfg.layouts:
        for stack in cfg.stack_list:
            g = gate(cfg, layout, stack, rank, world, device, gate_dtype)
            report["gate"].append(g)
            say(f"gate {stack} {layout}: " + ", ".join(
                f"{k} {v:.2e}" if isinstance(v, float) else f"{k} {v}"
                for k, v in g["errors"].items()))
            dsa.free(device)
    ok = all(g["ok"] for g in report["gate"])

    def finish(status):
        if lead:
            report["summary"] = summary(cfg, report)
            print(report["summary"], flush=True)
            if cfg.json:
                with open(cfg.json, "w") as f:
                    json.dump(report, f, indent=1)
        dist.destroy_process_group()
        if status:
            sys.exit(status)

    if not ok:
        say("gate FAILED: the context-parallel step differs from the one-rank step; no timings")
        finish(1)

    memory = None
    if device.type == "cuda":
        memory = cfg.memory_fraction * torch.cuda.get_device_properties(device).total_memory / GiB
    budget = Budget(cfg, memory)
    warmed = set()

    def counts(stack, n):
        if stack == "megatron":
            return (0 if stack in warmed else cfg.warmup), cfg.megatron_runs
        if n >= cfg.long_n:
            return 0, cfg.long_runs
        return cfg.warmup, cfg.runs

    def cp_rows(stack):
        for n in cfg.size_list:
            if stack == "megatron" and n > cfg.megatron_max:
                continue
            for layout in cfg.layouts:
                row = dict(world=world, layout=layout, n=n, stack=stack)
                warmup, runs = counts(stack, n)
                why = max_over_ranks(budget.why_not(stack, n, n // world, warmup + runs + 1))[0]
                if why:  # rank 0 decides for everyone
                    row["skipped"] = why
                else:
                    row.update(run_cp(cfg, stack, layout, n, rank, world, device, dtype, clock,
                                      warmup, runs))
                    warmed.add(stack)
                    if "step_ms" in row:
                        budget.record(stack, n, n // world, row["step_ms"], row["peak_gib"])
                if lead:
                    row["predicted"] = predict(cfg, n, world, layout, stack)
                report["rows"].append(row)
                say(f"P={world} {layout} N={n} {stack}: " + ", ".join(
                    f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}"
                    for k, v in row.items() if k not in ("phases_ms", "comm_phases_ms",
                                                          "predicted")))

    def single_rows(stack):
        for n in cfg.size_list:
            if n > cfg.single_max or (stack == "megatron" and n > cfg.megatron_max):
                continue
            warmup, runs = counts(stack, n)
            why = max_over_ranks(budget.why_not(stack, n, n, warmup + runs + 1, scale=world))[0]
            row = dict(n=n, stack=stack)
            if why:
                row["skipped"] = why
            elif lead:  # the other ranks wait at the next collective
                r, err = dsa.run_step(cfg, device, dtype, clock, stack, n, runs)
                if r is None:
                    row["oom"] = err
                else:
                    row.update(step_ms=r["step_ms"], phases_ms=r["phases_ms"],
                               peak_gib=r["peak_gib"], tokens_per_s=n / (r["step_ms"] / 1e3))
                row["predicted"] = predict(cfg, n, 1, "contiguous", stack)
            report["single"].append(row)
            say(f"P=1 N={n} {stack}: " + ", ".join(
                f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}"
                for k, v in row.items() if k not in ("phases_ms", "predicted")))
            dist.barrier()

    for stack in cfg.stack_list:
        cp_rows(stack)
        if cfg.single_max > 0:
            single_rows(stack)
    finish(0)


def trainer_layer_cp(cfg):
    """The trainer's own layer under context parallelism: hyscale-layer-bench as hyscale-train's
    ranks run (one process a rank, worker/parallel's key exchange in each layout, the replicated
    gradients summed). Per (layout, N) the slowest rank's step and DSA part, the most exposed
    communication and the highest peak; None where the binary is not built."""
    base = dsa.layer_bench_command(cfg, cfg.size_list)
    if base is None:
        return None
    rows = []
    for layout in cfg.layouts:
        port = free_port()
        ranks = []
        for rank in range(cfg.world):
            env = dict(os.environ, HYSCALE_WORLD_SIZE=str(cfg.world), HYSCALE_RANK=str(rank),
                       HYSCALE_RENDEZVOUS=f"127.0.0.1:{port}")
            cmd = base + ["--cp-layout", layout, "--warmup", str(cfg.warmup)]
            ranks.append(subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE,
                                          stderr=subprocess.PIPE, text=True))
        outs = [r.communicate() for r in ranks]
        for r, (_, err) in zip(ranks, outs):
            if r.returncode != 0:
                raise SystemExit(f"{' '.join(base)} (a rank of {cfg.world}, {layout}) failed "
                                 f"({r.returncode}): {err.strip()}")
        by_n = {}
        for out, _ in outs:
            for r in dsa.layer_bench_rows(out):
                by_n.setdefault(r["n"], []).append(r)
        for n, per_rank in sorted(by_n.items()):
            if any("oom" in r for r in per_rank):
                rows.append(dict(layout=layout, n=n, oom=True))
                continue
            peaks = [r["peak_gib"] for r in per_rank if r["peak_gib"] is not None]
            rows.append(dict(layout=layout, n=n,
                             step_ms=max(r["step_ms"] for r in per_rank),
                             dsa_ms=max(r["dsa_ms"] for r in per_rank),
                             exposed_ms=1e3 * max(r["comm"]["exposed"] for r in per_rank),
                             peak_gib=max(peaks) if peaks else None))
    return rows


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lib", required=True, help="path to libhyscale_ops.so")
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--world", type=int, help="ranks P (default: every visible GPU; 2 on cpu)")
    ap.add_argument("--layout", choices=["zigzag", "contiguous"],
                    help="one layout (default: zigzag, then contiguous)")
    ap.add_argument("--sizes", default="131072,262144,524288,1048576")
    ap.add_argument("--stacks", default="hyscale,megatron")
    ap.add_argument("--megatron-max", type=int, default=262144,
                    help="largest N for the Megatron-style stack (it is slow)")
    ap.add_argument("--single-max", type=int, default=131072,
                    help="largest N for the one-GPU reference step (262144 does not fit an "
                    "H200, docs/performance.md section 9); 0: none")
    dsa.add_layer_args(ap, recompute_rows=0)  # as section 12 measured: a rank's rows at once
    ap.add_argument("--warmup", type=int, default=1, help="untimed steps before the runs")
    ap.add_argument("--runs", type=int, default=2, help="timed HyScale steps (median)")
    ap.add_argument("--long-n", type=int, default=524288,
                    help="from this N on: no warm-up (smaller N warmed the kernels and NCCL) "
                    "and --long-runs")
    ap.add_argument("--long-runs", type=int, default=2)
    ap.add_argument("--megatron-runs", type=int, default=1,
                    help="timed Megatron-style steps (warm-up only before its first row)")
    ap.add_argument("--peak-tflops", type=float, default=790.0,
                    help="bf16 dense rate (the one-GPU step's floor, as dsa_layer_bench)")
    ap.add_argument("--peak-gbps", type=float, default=4000.0, help="device memory bandwidth")
    ap.add_argument("--gate-n", type=int, default=4096)
    ap.add_argument("--budget-s", type=float, default=330.0,
                    help="skip rows estimated to end after this many seconds of timings")
    ap.add_argument("--memory-fraction", type=float, default=0.95,
                    help="skip rows whose estimated peak passes this share of device memory")
    ap.add_argument("--hyscale", help="the hyscale CLI (for `hyscale plan`): predicted steps")
    ap.add_argument("--calibration", help="calibration JSON for the planner "
                    "(docs/results/calibration_h200.json)")
    ap.add_argument("--json", help="write every figure here")
    cfg = ap.parse_args()
    cfg.dtype = cfg.dtype or ("bf16" if cfg.device == "cuda" else "fp32")
    cfg.naive_chunk_bytes = int(cfg.naive_chunk_gib * GiB)
    if cfg.world is None:
        cfg.world = torch.cuda.device_count() if cfg.device == "cuda" else 2
    cfg.layouts = [cfg.layout] if cfg.layout else ["zigzag", "contiguous"]
    cfg.size_list = [int(x) for x in cfg.sizes.split(",")]
    cfg.stack_list = [s for s in cfg.stacks.split(",") if s]
    for s in cfg.stack_list:
        if s not in dsa.STEPS:
            ap.error(f"--stacks: unknown stack {s!r} (hyscale, megatron)")
    for n in cfg.size_list + [cfg.gate_n]:
        if n % (2 * cfg.world):
            ap.error(f"--sizes/--gate-n: {n} does not split into {2 * cfg.world} equal chunks")
    if cfg.world < 2:
        ap.error("--world: at least 2 ranks")
    if cfg.hyscale and not os.access(cfg.hyscale, os.X_OK):
        ap.error(f"--hyscale: {cfg.hyscale} is not an executable")
    dsa.find_layer_bench(cfg)
    try:
        mp.spawn(worker, args=(cfg, free_port()), nprocs=cfg.world)
    except mp.ProcessExitedException as e:
        print(f"rank {e.error_index} exited with status {e.exit_code}", file=sys.stderr)
        sys.exit(1)
    rows = trainer_layer_cp(cfg)
    if rows:
        print(f"the trainer's own layer over {cfg.world} ranks (hyscale-layer-bench: worker/model "
              f"with worker/parallel's exchange, recomputed with replay; slowest rank), ms:")
        for r in rows:
            print(f"  {r['layout']:>10} N={r['n']:>8}: " + (
                "out of memory" if r.get("oom") else
                f"step {r['step_ms']:.1f}, DSA part {r['dsa_ms']:.1f}, exposed communication "
                f"{r['exposed_ms']:.1f}" + (f", peak {r['peak_gib']:.1f} GiB"
                                            if r["peak_gib"] else "")), flush=True)
        if cfg.json and os.path.exists(cfg.json):
            with open(cfg.json) as f:
                report = json.load(f)
            report["trainer_layer"] = rows
            with open(cfg.json, "w") as f:
                json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
