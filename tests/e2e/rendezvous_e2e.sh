#!/usr/bin/env bash
# The rendezvous of a context-parallel job through the service, with real processes on loopback:
# hyscaled, one hyscale-worker with two CPU devices, the hyscale CLI. One scenario per ctest:
#   cp-train  the REAL hyscale-train runs a job over all the worker's devices (parallelism MANUAL,
#             context_parallel = their count, zigzag): rank 0 alone first, with port 0; it
#             publishes its store's address; the coordinator stores it with the job and sends the
#             other ranks with it; the job SUCCEEDS without a restart. On GPUs each rank must
#             name a GPU of its own (its PCI bus id, which nvidia-smi lists) when it starts.
#   timeout   a trainer that never publishes (a script): the attempt fails after
#             --rendezvous-timeout-ms, with the reason saying so, and rank 1 never runs
#   fake-gpus cp-train's GPU path with a fake nvidia-smi (two GPUs, which the worker detects) and
#             a trainer script that names the GPU it was given
# Usage: rendezvous_e2e.sh BUILD_DIR SCENARIO [TRAINER]
#   TRAINER: the hyscale-train for cp-train (default BUILD_DIR/worker/trainer/hyscale-train)
# cp-train elsewhere (scripts/gpu-service-check.sh sets these):
#   HYSCALE_E2E_DEVICES    the worker's --devices (default cpu:2); auto: what it detects (its GPUs)
#   HYSCALE_E2E_STEPS      training steps (default 10)
#   HYSCALE_E2E_TIMEOUT_S  how long the job may take, submit to end (default 240)
#   HYSCALE_E2E_OUT        a folder for the run's record: summary.txt, the job, the ranks' and the
#                          worker's logs, and on GPUs nvidia-smi samples taken during the run
set -euo pipefail

build=$(cd "$1" && pwd)
scenario=$2
hyscaled=$build/server/hyscaled
agent=$build/worker/agent/hyscale-worker
cli=$build/client/hyscale
trainer=${3:-$build/worker/trainer/hyscale-train}
heartbeat_ms=250

work=$(mktemp -d "${TMPDIR:-/tmp}/hyscale-rdv-$scenario.XXXXXX")
# Trainers of a worker run as root run as nobody: they must reach what is in here.
chmod 755 "$work"
pids=()
cleanup() {
  local status=$?
  # SIGTERM: the agent stops its trainers (in their own process groups) before it exits.
  for pid in "${pids[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  for pid in "${pids[@]}"; do
    for _ in {1..50}; do
      kill -0 "$pid" 2>/dev/null || break
      sleep 0.1
    done
    kill -9 "$pid" 2>/dev/null || true
  done
  wait 2>/dev/null || true
  if ((status == 0)); then rm -rf "$work"; else echo "e2e: files kept in $work" >&2; fi
}
trap cleanup EXIT

# shellcheck disable=SC2034 # lib.sh's fail names it
tag=rendezvous-$scenario
# shellcheck source=tests/e2e/lib.sh
source "$(dirname "$0")/lib.sh"

cp_devices=${HYSCALE_E2E_DEVICES:-cpu:2}
echo "e2e-secret-$RANDOM$RANDOM" >"$work/token"
grpc_port=""  # hyscaled's, once start has run

# start TIMEOUT_MS TRAINER DEVICES: hyscaled with that rendezvous timeout, one worker with those
# --devices (auto: none given, the worker detects them).
start() {
  local device_flags=(--devices "$3")
  [[ $3 == auto ]] && device_flags=()
  # Port 0: hyscaled binds a free one and logs it (a port chosen free here could be taken by a
  # parallel test before hyscaled binds it).
  "$hyscaled" --listen 127.0.0.1:0 --data-dir "$work/data" --metrics-listen 127.0.0.1:0 \
    --token-file "$work/token" --heartbeat-interval-ms "$heartbeat_ms" --restart-backoff-ms 200 \
    --rendezvous-timeout-ms "$1" >"$work/hyscaled.log" 2>&1 &
  pids+=("$!")
  wait_for 30 "hyscaled to listen" grep -q "listening on" "$work/hyscaled.log"
  grpc_port=$(listening_port "$work/hyscaled.log")
  # Trainers inherit the agent's environment: their rendezvous and collectives give up after 60 s,
  # so a broken rendezvous fails the job instead of hanging the test.
  HYSCALE_COMM_TIMEOUT_S=60 "$agent" --server "127.0.0.1:$grpc_port" --token-file "$work/token" --name w1 \
    --address 127.0.0.1 "${device_flags[@]}" --work-dir "$work/w1" \
    --checkpoint-root "$work/data/checkpoints" --trainer "$2" --run-as "$run_as" \
    --heartbeat-interval-ms "$heartbeat_ms" --stop-grace-ms 2000 >"$work/w1.log" 2>&1 &
  pids+=("$!")
  wait_for 30 "the worker online" workers_online
}

# The script trainers live in $work, open to nobody; the real one wherever the build is.
run_as=$(trainer_user "$build/worker/trainer/hyscale-train")

hs() { "$cli" --server "127.0.0.1:$grpc_port" --token-file "$work/token" --timeout 10 "$@"; }
job_field() { hs get "$1" -o json | jq -r "$2"; }
state_is() { [[ $(job_field "$1" '.state') == "$2" ]]; }
workers_online() {
  [[ $(hs workers -o json | jq '[.workers[] | select(.state == "WORKER_STATE_ONLINE")] | length') == 1 ]]
}

# The worker's device slots: how many, and their kind as the CLI names it (cpu or gpu).
slot_count() { hs workers -o json | jq '[.workers[0].devices[].count] | add'; }
slot_kind() {
  hs workers -o json |
    jq -r 'if .workers[0].devices[0].kind == "DEVICE_KIND_GPU" then "gpu" else "cpu" end'
}

# write_job FILE RANKS [STEPS [KIND]]: a tiny DSA model on associative recall, split over RANKS
# context-parallel ranks. On GPUs (KIND gpu) the head shapes are ones the CUDA kernels take.
write_job() {
  local model="{vocab_size: 64, d_model: 32, layers: 1, heads: 2, head_dim_qk: 16, rope_dim: 8,
        head_dim_v: 16, d_ff: 64, indexer: {heads: 2, dim: 16, rope_dim: 8, topk: 8}}"
  if [[ ${4:-cpu} == gpu ]]; then
    model="{vocab_size: 64, d_model: 64, layers: 1, heads: 2, head_dim_qk: 64, rope_dim: 16,
        head_dim_v: 64, d_ff: 128, indexer: {heads: 16, dim: 64, rope_dim: 16, topk: 8}}"
  fi
  cat >"$1" <<EOF
name: cp-rendezvous
seed: 7
model: $model
data: {seq_len: 64, batch_size: 2, recall: {pairs: 4, queries: 4, key_vocab: 16, value_vocab: 16}}
stages:
  - {name: dense, steps: ${3:-10}, lr: 0.003, warmup_steps: 2, attention: DENSE}
parallelism: {mode: MANUAL, context_parallel: $2, cp_layout: zigzag}
checkpoint: {every_steps: 5}
log_every: 1
threads: 1
EOF
}

# submit RANKS KIND
submit() {
  hs submit -f "$work/job.yaml" --ranks "$1" --device "$2" --max-restarts 0 -o json | jq -r '.id'
}

# The worker's log line for a rank's start, as its line number (0: none).
started_line() {
  grep -n "job $1 rank $2 attempt 0: started" "$work/w1.log" | head -n 1 | cut -d: -f1 || true
}

# --------------------------------------------------------------------------------------------
# The first job_started event's device in a rank's log ("" when the trainer names none).
rank_device() {
  grep '"job_started":' "$1" | head -n 1 | jq -r '.job_started.device // ""' || true
}

# sample_gpus: nvidia-smi's view of every GPU twice a second until the test ends.
sample_gpus() {
  nvidia-smi --query-gpu=timestamp,index,pci.bus_id,utilization.gpu,memory.used \
    --format=csv,noheader,nounits -lms 500 >"$work/gpu-samples.csv" 2>&1 &
  pids+=("$!")
}

# check_gpus RANKS: each rank trained on a GPU of its own, one nvidia-smi lists.
check_gpus() {
  local bus_ids seen=() rank device id
  bus_ids=$(nvidia-smi --query-gpu=pci.bus_id --format=csv,noheader | tr '[:lower:]' '[:upper:]')
  for ((rank = 0; rank < $1; rank++)); do
    device=$(rank_device "$work/rank$rank.out")
    [[ $device =~ pci\ ([0-9A-Fa-f:.]+) ]] || fail "rank $rank names no GPU: '$device'"
    id=${BASH_REMATCH[1]^^}
    grep -qxF "$id" <<<"$bus_ids" || fail "rank $rank's GPU $id is not one nvidia-smi lists"
    [[ " ${seen[*]} " != *" $id "* ]] || fail "rank $rank shares GPU $id with another rank"
    seen+=("$id")
  done
}

# summarize JOB RANKS KIND WALL_SECONDS: what ran where, and how it ended.
summarize() {
  local job=$1 ranks=$2 rank last
  echo "job $job: $(job_field "$job" '.state'), $ranks ranks on $3 ($cp_devices), ${4} s submit to end"
  echo "rendezvous $(job_field "$job" '.rendezvous')"
  for ((rank = 0; rank < ranks; rank++)); do
    echo "rank $rank: worker $(job_field "$job" ".placement[] | select((.rank // 0) == $rank) |
      \"\(.worker_id) slot \(.device_index // 0)\"") device $(rank_device "$work/rank$rank.out" | sed 's/^$/(not reported)/')"
  done
  last=$(grep '"step":{' "$work/rank0.out" | tail -n 1 | jq -c '.step')
  echo "final step $(jq -r '.step' <<<"$last"): loss $(jq -r '.loss' <<<"$last"), accuracy" \
    "$(jq -r '.evaluation.accuracy // "n/a"' <<<"$last")," \
    "$(jq -r '.tokens_per_second | floor' <<<"$last") tokens/s; trainer time" \
    "$(grep '"job_finished":' "$work/rank0.out" | jq -r '.job_finished.elapsed_seconds') s"
  if [[ -f $work/gpu-samples.csv ]]; then
    # Per GPU: the highest utilization and memory nvidia-smi saw during the run.
    awk -F', ' 'NF == 5 { if ($4 > util[$3]) util[$3] = $4; if ($5 > mem[$3]) mem[$3] = $5 }
      END { for (g in util) printf "GPU %s: peak utilization %s%%, peak memory %s MiB\n", g, util[g], mem[g] }' \
      "$work/gpu-samples.csv" | sort
  fi
}

# record JOB: the run's files into HYSCALE_E2E_OUT.
record() {
  local out=$HYSCALE_E2E_OUT
  mkdir -p "$out"
  hs get "$1" -o json >"$out/job.json"
  cp "$work"/rank*.out "$work/w1.log" "$work/hyscaled.log" "$work/job.yaml" "$out/"
  if [[ -f $work/gpu-samples.csv ]]; then cp "$work/gpu-samples.csv" "$out/"; fi
  cp "$work/summary.txt" "$out/"
}

cp_train() {
  [[ -x $trainer ]] || fail "no trainer at $trainer (a torch build's hyscale-train)"
  start 60000 "$trainer" "$cp_devices"
  local ranks kind
  ranks=$(slot_count)
  kind=$(slot_kind)
  ((ranks >= 2)) || fail "the worker has $ranks device slot(s); context parallelism needs 2"
  write_job "$work/job.yaml" "$ranks" "${HYSCALE_E2E_STEPS:-10}" "$kind"
  if [[ $kind == gpu ]]; then sample_gpus; fi
  local job begin=$SECONDS
  job=$(submit "$ranks" "$kind")
  [[ -n $job && $job != null ]] || fail "submit gave no job id"
  timeout "${HYSCALE_E2E_TIMEOUT_S:-240}" \
    "$cli" --server "127.0.0.1:$grpc_port" --token-file "$work/token" watch "$job" \
    >"$work/watch.log" 2>&1 ||
    fail "the job did not succeed: $(job_field "$job" '.state'): $(job_field "$job" '.reason')"
  local wall=$((SECONDS - begin))
  local address
  address=$(job_field "$job" '.rendezvous // ""')
  [[ $address =~ ^127\.0\.0\.1:[1-9][0-9]*$ ]] || fail "the job's rendezvous is '$address'"
  [[ $(job_field "$job" '.restarts // 0') == 0 ]] || fail "the job restarted"
  hs logs "$job" --rank 0 >"$work/rank0.out" || fail "logs of rank 0"
  grep '"rendezvous":{' "$work/rank0.out" >"$work/published.out" || true
  grep -qF "\"address\":\"$address\"" "$work/published.out" ||
    fail "rank 0's log has no rendezvous event with $address"
  # The other ranks started only after rank 0 (they needed the address rank 0 published).
  local rank first later
  first=$(started_line "$job" 0)
  for ((rank = 1; rank < ranks; rank++)); do
    hs logs "$job" --rank "$rank" >"$work/rank$rank.out" || fail "logs of rank $rank"
    grep -q '"job_finished":' "$work/rank$rank.out" || fail "rank $rank did not finish"
    later=$(started_line "$job" "$rank")
    if [[ -z $first || -z $later ]] || ((first >= later)); then
      fail "rank 0 started at worker log line '$first', rank $rank at '$later'"
    fi
  done
  if [[ $kind == gpu ]]; then check_gpus "$ranks"; fi
  summarize "$job" "$ranks" "$kind" "$wall" >"$work/summary.txt"
  if [[ -n ${HYSCALE_E2E_OUT:-} ]]; then record "$job"; fi
  cat "$work/summary.txt"
  echo "cp-train: rank 0 published $address, then ranks 1..$((ranks - 1)) started; the $ranks-rank" \
    "job succeeded"
}

# The GPU path without GPUs: an nvidia-smi that lists two H200s (the worker detects them, the test
# checks against them) and a trainer script that names the GPU CUDA_VISIBLE_DEVICES gives it.
fake_gpus() {
  mkdir -p "$work/bin"
  cat >"$work/bin/nvidia-smi" <<'SH'
#!/bin/sh
case "$*" in
  *name,memory.total*) printf 'NVIDIA H200, 143771\nNVIDIA H200, 143771\n' ;;
  *timestamp*) exec sleep 1000 ;;
  *pci.bus_id*) printf '00000000:18:00.0\n00000000:2A:00.0\n' ;;
  *) exit 1 ;;
esac
SH
  cat >"$work/bin/gpu-train.sh" <<'SH'
#!/bin/bash
[[ " $* " == *" --device cuda "* ]] || { echo "not run with --device cuda: $*" >&2; exit 2; }
bus=(18 2A)
echo "{\"time\":1,\"job_started\":{\"name\":\"fake\",\"total_steps\":1,\"device\":\"cuda:0 NVIDIA H200 pci 00000000:${bus[$CUDA_VISIBLE_DEVICES]}:00.0\"}}"
if [[ $HYSCALE_RANK == 0 ]]; then
  echo '{"time":1,"rendezvous":{"address":"127.0.0.1:4242","world_size":2}}'
fi
echo '{"time":1,"step":{"step":1,"total_steps":1,"loss":1.5,"tokens_per_second":1000}}'
echo '{"time":2,"job_finished":{"ok":true,"elapsed_seconds":1}}'
SH
  chmod +x "$work/bin/nvidia-smi" "$work/bin/gpu-train.sh"
  PATH="$work/bin:$PATH"
  trainer=$work/bin/gpu-train.sh
  cp_devices=auto
  cp_train
}

timeout_scenario() {
  # Starts, never publishes, sleeps until it is stopped.
  cat >"$work/silent-train.sh" <<'EOF'
#!/bin/sh
echo '{"time":1,"job_started":{"name":"silent","total_steps":10}}'
exec sleep 1000
EOF
  chmod +x "$work/silent-train.sh"
  start 2000 "$work/silent-train.sh" cpu:2
  write_job "$work/job.yaml" 2
  local job
  job=$(submit 2 cpu)
  wait_for 30 "the job to fail" state_is "$job" JOB_STATE_FAILED
  local reason
  reason=$(job_field "$job" '.reason')
  [[ $reason == "rank 0 did not publish its rendezvous address within 2 s (max_restarts is 0)" ]] ||
    fail "reason: $reason"
  [[ -z $(started_line "$job" 1) ]] || fail "rank 1 was started without an address"
  [[ $(job_field "$job" '.rendezvous // ""') == "" ]] || fail "the failed job has an address"
  echo "timeout: the attempt failed after 2 s with the reason; rank 1 never ran"
}

case $scenario in
  cp-train) cp_train ;;
  timeout) timeout_scenario ;;
  fake-gpus) fake_gpus ;;
  *) fail "unknown scenario $scenario" ;;
esac
