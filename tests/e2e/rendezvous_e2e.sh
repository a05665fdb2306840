#!/usr/bin/env bash
# The rendezvous of a context-parallel job through the service, with real processes on loopback:
# hyscaled, one hyscale-worker with two CPU devices, the hyscale CLI. One scenario per ctest:
#   cp-train  the REAL hyscale-train runs a 2-rank job (parallelism MANUAL, context_parallel 2,
#             zigzag): rank 0 alone first, with port 0; it publishes its store's address; the
#             coordinator stores it with the job and sends rank 1 with it; the job SUCCEEDS
#             without a restart
#   timeout   a trainer that never publishes (a script): the attempt fails after
#             --rendezvous-timeout-ms, with the reason saying so, and rank 1 never runs
# Usage: rendezvous_e2e.sh BUILD_DIR SCENARIO [TRAINER]
#   TRAINER: the hyscale-train for cp-train (default BUILD_DIR/worker/trainer/hyscale-train)
set -euo pipefail

build=$(cd "$1" && pwd)
scenario=$2
hyscaled=$build/server/hyscaled
agent=$build/worker/agent/hyscale-worker
cli=$build/client/hyscale
trainer=${3:-$build/worker/trainer/hyscale-train}
heartbeat_ms=250

work=$(mktemp -d "${TMPDIR:-/tmp}/hyscale-rdv-$scenario.XXXXXX")
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

echo "e2e-secret-$RANDOM$RANDOM" >"$work/token"
grpc_port=$(free_port)

# start TIMEOUT_MS TRAINER: hyscaled with that rendezvous timeout, one worker with 2 CPUs.
start() {
  "$hyscaled" --listen "127.0.0.1:$grpc_port" --data-dir "$work/data" --metrics-listen 127.0.0.1:0 \
    --token-file "$work/token" --heartbeat-interval-ms "$heartbeat_ms" --restart-backoff-ms 200 \
    --rendezvous-timeout-ms "$1" >"$work/hyscaled.log" 2>&1 &
  pids+=("$!")
  wait_for 30 "hyscaled to listen" grep -q "listening on" "$work/hyscaled.log"
  # Trainers inherit the agent's environment: their rendezvous and collectives give up after 60 s,
  # so a broken rendezvous fails the job instead of hanging the test.
  HYSCALE_COMM_TIMEOUT_S=60 "$agent" --server "127.0.0.1:$grpc_port" --token-file "$work/token" --name w1 \
    --address 127.0.0.1 --devices cpu:2 --work-dir "$work/w1" --trainer "$2" \
    --heartbeat-interval-ms "$heartbeat_ms" --stop-grace-ms 2000 >"$work/w1.log" 2>&1 &
  pids+=("$!")
  wait_for 30 "the worker online" workers_online
}

hs() { "$cli" --server "127.0.0.1:$grpc_port" --token-file "$work/token" --timeout 10 "$@"; }
job_field() { hs get "$1" -o json | jq -r "$2"; }
state_is() { [[ $(job_field "$1" '.state') == "$2" ]]; }
workers_online() {
  [[ $(hs workers -o json | jq '[.workers[] | select(.state == "WORKER_STATE_ONLINE")] | length') == 1 ]]
}

# A tiny DSA model on associative recall, split over 2 context-parallel ranks.
write_job() {
  cat >"$1" <<EOF
name: cp-rendezvous
seed: 7
model: {vocab_size: 64, d_model: 32, layers: 1, heads: 2, head_dim_qk: 16, rope_dim: 8,
        head_dim_v: 16, d_ff: 64, indexer: {heads: 2, dim: 16, rope_dim: 8, topk: 8}}
data: {seq_len: 64, batch_size: 2, recall: {pairs: 4, queries: 4, key_vocab: 16, value_vocab: 16}}
stages:
  - {name: dense, steps: 10, lr: 0.003, warmup_steps: 2, attention: DENSE}
parallelism: {mode: MANUAL, context_parallel: 2, cp_layout: zigzag}
checkpoint: {every_steps: 5}
log_every: 1
threads: 1
EOF
}

submit() {
  hs submit -f "$work/job.yaml" --ranks 2 --device cpu --max-restarts 0 -o json | jq -r '.id'
}

# The worker's log line for a rank's start, as its line number (0: none).
started_line() {
  grep -n "job $1 rank $2 attempt 0: started" "$work/w1.log" | head -n 1 | cut -d: -f1 || true
}

# --------------------------------------------------------------------------------------------
cp_train() {
  [[ -x $trainer ]] || fail "no trainer at $trainer (a torch build's hyscale-train)"
  start 60000 "$trainer"
  write_job "$work/job.yaml"
  local job
  job=$(submit)
  [[ -n $job && $job != null ]] || fail "submit gave no job id"
  hs watch "$job" >"$work/watch.log" 2>&1 ||
    fail "the job did not succeed: $(job_field "$job" '.state'): $(job_field "$job" '.reason')"
  local address
  address=$(job_field "$job" '.rendezvous // ""')
  [[ $address =~ ^127\.0\.0\.1:[1-9][0-9]*$ ]] || fail "the job's rendezvous is '$address'"
  [[ $(job_field "$job" '.restarts // 0') == 0 ]] || fail "the job restarted"
  hs logs "$job" --rank 0 >"$work/rank0.out" || fail "logs of rank 0"
  grep '"event":"rendezvous"' "$work/rank0.out" >"$work/published.out" || true
  grep -qF "\"address\":\"$address\"" "$work/published.out" ||
    fail "rank 0's log has no rendezvous event with $address"
  hs logs "$job" --rank 1 >"$work/rank1.out" || fail "logs of rank 1"
  grep -q '"event":"job_finished"' "$work/rank1.out" || fail "rank 1 did not finish"
  # Rank 1 started only after rank 0 (it needed the address rank 0 published).
  local first second
  first=$(started_line "$job" 0)
  second=$(started_line "$job" 1)
  if [[ -z $first || -z $second ]] || ((first >= second)); then
    fail "rank 0 started at worker log line '$first', rank 1 at '$second'"
  fi
  echo "cp-train: rank 0 published $address, then rank 1 started; the 2-rank job succeeded"
}

timeout_scenario() {
  # Starts, never publishes, sleeps until it is stopped.
  cat >"$work/silent-train.sh" <<'EOF'
#!/bin/sh
echo '{"event":"job_started","time":1,"name":"silent","total_steps":10}'
exec sleep 1000
EOF
  chmod +x "$work/silent-train.sh"
  start 2000 "$work/silent-train.sh"
  write_job "$work/job.yaml"
  local job
  job=$(submit)
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
  *) fail "unknown scenario $scenario" ;;
esac
