#!/usr/bin/env python3
"""Context-parallel training with the real hyscale-train, one process per rank on loopback.

  train_cp_test.py HYSCALE_TRAIN CASE

CASE is one of:
  equal-<layout>-<world>  every step's losses, the evaluation and the final weights of a world-rank
                          run equal the single-process run (layouts contiguous, zigzag,
                          round-robin; recomputation with selection replay, dense then sparse
                          stages, the indexer on its own group)
  killed-rank             a rank killed mid-job makes the other fail with an error, not hang
  stuck-rank              a rank stopped mid-job (SIGSTOP) makes the other fail at the
                          collective timeout (HYSCALE_COMM_TIMEOUT_S, 3 s here; joining may
                          take longer, HYSCALE_RENDEZVOUS_TIMEOUT_S)
  bad-environment         a wrong HYSCALE_* variable or a world size the spec does not ask for:
                          exit 2 naming it
  gpu-equal-<layout>-<world>  as equal-*, on CUDA with NCCL (one GPU per rank; run by hand on a
                          machine with several GPUs): head shapes the CUDA kernels take, bf16
                          autocast, so losses agree to 2e-2 rather than 1e-5 and weights are not
                          compared
Rank 0 serves its store on a free port and publishes it as a `rendezvous` event, which is how
the other ranks learn it (as the coordinator forwards it).
"""
import json
import os
import signal
import struct
import subprocess
import sys
import tempfile
import time

SPEC = """
name: cp-check
seed: 7
threads: 1
model: {{vocab_size: 305, d_model: 32, layers: 2, heads: 2, head_dim_qk: 16, rope_dim: 8,
        head_dim_v: 16, d_ff: 64, indexer: {{heads: 2, dim: 16, rope_dim: 8, topk: 16}}}}
data: {{seq_len: 128, batch_size: 2, eval_batches: 1,
       recall: {{pairs: 4, queries: 4, key_vocab: 16, value_vocab: 16, pair_tokens: true}}}}
optimizer: {{grad_clip: 1.0}}
recompute: {{enabled: true, selection_replay: true}}
checkpoint: {{dir: {checkpoints}}}
stages:
  - {{name: dense, steps: {dense_steps}, lr: 1.0e-3, attention: DENSE, trains: ALL,
     indexer_loss_weight: 1.0}}
  - {{name: sparse, steps: 3, lr: 1.0e-3, attention: SPARSE, trains: ALL, indexer_loss_weight: 1.0}}
log_every: 1
{parallelism}
"""
RENDEZVOUS_WAIT_S = 30
RUN_TIMEOUT_S = 120


def fail(message):
    print("FAIL: " + message)
    sys.exit(1)


GPU_SHAPES = {"head_dim_qk: 16": "head_dim_qk: 64", "head_dim_v: 16": "head_dim_v: 64",
              "heads: 2, dim: 16": "heads: 16, dim: 64", "topk: 16": "topk: 64",
              "seq_len: 128": "seq_len: 512"}


def write_spec(directory, name, world=1, layout="zigzag", dense_steps=3, gpu=False):
    parallelism = ""
    if world > 1:
        parallelism = ("parallelism: {{mode: MANUAL, context_parallel: {}, cp_layout: {}, "
                       "separate_indexer_group: true}}".format(world, layout))
    path = os.path.join(directory, name + ".yaml")
    with open(path, "w") as f:
        text = SPEC.format(checkpoints=os.path.join(directory, name + "-ckpt"),
                           dense_steps=dense_steps, parallelism=parallelism)
        for cpu_shape, gpu_shape in (GPU_SHAPES.items() if gpu else ()):
            text = text.replace(cpu_shape, gpu_shape)
        f.write(text)
    return path


def rank_env(world, rank, address, timeout_s):
    env = dict(os.environ)
    env.update({"HYSCALE_WORLD_SIZE": str(world), "HYSCALE_RANK": str(rank),
                "HYSCALE_RENDEZVOUS": address, "HYSCALE_RENDEZVOUS_TIMEOUT_S": "60",
                "HYSCALE_COMM_TIMEOUT_S": str(timeout_s)})
    return env


def wait_for_rendezvous(events_path, process):
    deadline = time.time() + RENDEZVOUS_WAIT_S
    while time.time() < deadline:
        if process.poll() is not None:
            fail("rank 0 exited ({}) before publishing its address".format(process.returncode))
        for event in read_events(events_path):
            if "rendezvous" in event:
                return event["rendezvous"]["address"]
        time.sleep(0.05)
    fail("rank 0 published no rendezvous event within {} s".format(RENDEZVOUS_WAIT_S))


def read_events(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def start_group(trainer, spec, world, directory, tag, timeout_s=20):
    """Rank 0 on a free port, then the others at the address it publishes."""
    ranks = []
    out = os.path.join(directory, "{}-rank0.jsonl".format(tag))
    ranks.append(subprocess.Popen([trainer, "-c", spec], env=rank_env(world, 0, "127.0.0.1:0",
                                                                     timeout_s),
                                  stdout=open(out, "w"), stderr=subprocess.PIPE, text=True))
    address = wait_for_rendezvous(out, ranks[0])
    for rank in range(1, world):
        out_r = os.path.join(directory, "{}-rank{}.jsonl".format(tag, rank))
        ranks.append(subprocess.Popen([trainer, "-c", spec],
                                      env=rank_env(world, rank, address, timeout_s),
                                      stdout=open(out_r, "w"), stderr=subprocess.PIPE, text=True))
    return ranks


def steps(events):
    """The step events' figures (proto/hyscale/v1/events.proto: one kind a line)."""
    return [e["step"] for e in events if "step" in e]


def compared(step):
    """The losses of a step (no lm_loss in a stage that trains the indexer alone) and, after an
    evaluation, its accuracy and indexer recall."""
    figures = {key: step[key] for key in ("loss", "lm_loss", "indexer_loss") if key in step}
    figures.update(step.get("evaluation", {}))
    return figures


def read_safetensors(path):
    with open(path, "rb") as f:
        data = f.read()
    (header_len,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + header_len])
    body = data[8 + header_len:]
    tensors = {}
    for name, info in header.items():
        if name == "__metadata__" or info["dtype"] != "F32":
            continue
        begin, end = info["data_offsets"]
        tensors[name] = struct.unpack("<{}f".format((end - begin) // 4), body[begin:end])
    return tensors


def final_weights(checkpoints):
    newest = sorted(d for d in os.listdir(checkpoints) if d.startswith("step-"))[-1]
    return read_safetensors(os.path.join(checkpoints, newest, "model.safetensors"))


def close(a, b, tolerance):
    return abs(a - b) <= tolerance * max(1.0, abs(a), abs(b))


def case_equal(trainer, layout, world, directory, gpu=False):
    tolerance = 2e-2 if gpu else 1e-5
    single_spec = write_spec(directory, "single", gpu=gpu)
    single = subprocess.run([trainer, "-c", single_spec], capture_output=True, text=True,
                            timeout=RUN_TIMEOUT_S)
    if single.returncode != 0:
        fail("single-process run exited {}: {}".format(single.returncode, single.stderr))
    expected = steps([json.loads(l) for l in single.stdout.splitlines() if l.strip()])

    spec = write_spec(directory, "cp", world, layout, gpu=gpu)
    ranks = start_group(trainer, spec, world, directory, "cp")
    for rank, process in enumerate(ranks):
        _, err = process.communicate(timeout=RUN_TIMEOUT_S)
        if process.returncode != 0:
            fail("rank {} exited {}: {}".format(rank, process.returncode, err))
    for rank in range(world):
        got = steps(read_events(os.path.join(directory, "cp-rank{}.jsonl".format(rank))))
        if len(got) != len(expected):
            fail("rank {}: {} step events, single run {}".format(rank, len(got), len(expected)))
        for g, e in zip(got, expected):
            have, want = compared(g), compared(e)
            for key in ("loss", "lm_loss", "indexer_loss", "accuracy", "indexer_recall"):
                if (key in have) != (key in want) or (key in want and
                                                      not close(have[key], want[key], tolerance)):
                    fail("rank {} step {}: {} {} vs single {}".format(
                        rank, e["step"], key, have.get(key), want.get(key)))
            if "comm" not in g:
                fail("rank {} step {}: no communication times".format(rank, e["step"]))
    if gpu:
        print("{} x{} on CUDA: {} steps equal within {}".format(layout, world, len(expected),
                                                                tolerance))
        return
    want = final_weights(os.path.join(directory, "single-ckpt"))
    have = final_weights(os.path.join(directory, "cp-ckpt"))
    if sorted(want) != sorted(have):
        fail("checkpoints hold different tensors")
    worst = max(abs(a - b) for name in want for a, b in zip(want[name], have[name]))
    if worst > 1e-5:
        fail("final weights differ by up to {}".format(worst))
    print("{} x{}: {} steps equal, final weights within {:.2e}".format(
        layout, world, len(expected), worst))


def case_lost_rank(trainer, directory, how):
    spec = write_spec(directory, "long", 2, "zigzag", dense_steps=100000)
    ranks = start_group(trainer, spec, 2, directory, "long", timeout_s=3)
    deadline = time.time() + RUN_TIMEOUT_S
    while not steps(read_events(os.path.join(directory, "long-rank0.jsonl"))):
        if time.time() > deadline or ranks[0].poll() is not None:
            fail("rank 0 never trained a step")
        time.sleep(0.05)
    ranks[1].send_signal(how)
    lost_at = time.time()
    try:
        _, err = ranks[0].communicate(timeout=30)
    except subprocess.TimeoutExpired:
        ranks[0].kill()
        fail("rank 0 still runs 30 s after its peer got signal {}".format(how))
    finally:
        ranks[1].kill()
    waited = time.time() - lost_at
    if ranks[0].returncode != 1:
        fail("rank 0 exited {} (want 1): {}".format(ranks[0].returncode, err))
    events = read_events(os.path.join(directory, "long-rank0.jsonl"))
    finished = [e["job_finished"] for e in events if "job_finished" in e]
    if not finished or finished[-1]["ok"]:
        fail("rank 0 wrote no failing job_finished event")
    print("rank 0 failed {:.2f} s after rank 1 got signal {}: {}".format(
        waited, how, finished[-1]["reason"]))


def case_bad_environment(trainer, directory):
    cp_spec = write_spec(directory, "cp", 2, "zigzag")
    single_spec = write_spec(directory, "single")
    cases = [
        (cp_spec, {"HYSCALE_WORLD_SIZE": "2", "HYSCALE_RANK": "0"}, "HYSCALE_RENDEZVOUS"),
        (cp_spec, {"HYSCALE_WORLD_SIZE": "2", "HYSCALE_RANK": "1",
                   "HYSCALE_RENDEZVOUS": "127.0.0.1:0"}, "HYSCALE_RENDEZVOUS"),
        (cp_spec, {"HYSCALE_WORLD_SIZE": "2", "HYSCALE_RANK": "2",
                   "HYSCALE_RENDEZVOUS": "127.0.0.1:1"}, "HYSCALE_RANK"),
        (cp_spec, {"HYSCALE_WORLD_SIZE": "x"}, "HYSCALE_WORLD_SIZE"),
        (cp_spec, {}, "context_parallel"),
        (single_spec, {"HYSCALE_WORLD_SIZE": "2", "HYSCALE_RANK": "0",
                       "HYSCALE_RENDEZVOUS": "127.0.0.1:0"}, "context_parallel"),
    ]
    for spec, variables, named in cases:
        env = {k: v for k, v in os.environ.items() if not k.startswith("HYSCALE_")}
        env.update(variables)
        result = subprocess.run([trainer, "-c", spec], env=env, capture_output=True, text=True,
                                timeout=RUN_TIMEOUT_S)
        if result.returncode != 2 or named not in result.stderr:
            fail("{}: exit {} (want 2, naming {}): {}".format(variables, result.returncode, named,
                                                             result.stderr.strip()))
        print("{} -> {}".format(variables, result.stderr.strip()))


def main():
    trainer, case = sys.argv[1], sys.argv[2]
    with tempfile.TemporaryDirectory(prefix="hyscale-cp-") as directory:
        if case.startswith("equal-") or case.startswith("gpu-equal-"):
            layout_and_world = case.split("equal-", 1)[1]
            layout, world = layout_and_world.rsplit("-", 1)
            case_equal(trainer, layout, int(world), directory, gpu=case.startswith("gpu-"))
        elif case == "killed-rank":
            case_lost_rank(trainer, directory, signal.SIGKILL)
        elif case == "stuck-rank":
            case_lost_rank(trainer, directory, signal.SIGSTOP)
        elif case == "bad-environment":
            case_bad_environment(trainer, directory)
        else:
            fail("unknown case " + case)


if __name__ == "__main__":
    main()
