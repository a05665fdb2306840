#!/usr/bin/env bash
# End-to-end tests of the service with real processes on loopback: hyscaled, hyscale-worker
# agents running the real hyscale-train, the hyscale CLI, and a real Prometheus server.
# One scenario per ctest:
#   lifecycle          2 workers, 3 jobs: one watched to SUCCEEDED, one cancelled, the third
#                      runs when a device frees; list shows the states; Prometheus scrapes
#                      /metrics and PromQL finds the job's phase series; promtool checks it
#   coordinator-crash  kill -9 hyscaled mid-job and restart it: the job is still there, is not
#                      restarted, and finishes
#   trainer-crash      kill -9 a trainer: the job restarts from its checkpoint and finishes
#   worker-loss        kill a worker (agent and trainer): within three heartbeat intervals its
#                      job is RESTARTING, then runs on the other worker and finishes
#   worker-drain       SIGTERM to the agent running a job with max_restarts 0 (a drained node, a
#                      replaced pod): the job is not failed but placed again, with a disruption and
#                      no restart used, and finishes on the other worker from its checkpoint
#   bad-input          malformed and oversized specs, unknown fields, wrong or missing token,
#                      unknown job id: each a clear error, and the server keeps serving
#   job-paths          (a script trainer) a relative data path is refused at submission; a job
#                      reading /etc/passwd, or a link in the data folder to /etc/shadow, fails as
#                      bad input naming the field (no restart, no file bytes in any error); one
#                      in the data folder runs, as nobody when the worker runs as root; reads
#                      without the token are refused
#   agent-restart      (a script trainer with a child) a second agent under a live worker's name is
#                      refused; kill -9 of the agent kills its trainer (parent-death signal); the
#                      restarted agent ends the trainer's leftover group, registers once the old
#                      one is lost, and the job's next attempt is the only trainer running
#   bounded            a 100 KB cancel reason is refused naming the field; a job name with terminal
#                      controls is listed escaped; a queued job exports no per-job series
#   out-of-memory      a job no device holds is refused at submission with the planner's reason;
#                      the real trainer held to 1.5 GB runs out of memory, exits 3, and the job
#                      fails without a restart
#   store              `hyscaled backup` while serving; a damaged job record is set aside (named
#                      in the log, the others served); the backup serves every job; a damaged
#                      file is refused (exit 1, "integrity check failed")
#   port-in-use        a second hyscaled on the first one's gRPC or metrics port, and `hyscale up`
#                      on a taken port, exit naming the port; the first keeps serving alone
#   replan             (a script trainer) the reference model at 64K, AUTO on a GPU, submitted before
#                      any worker: planned for the profile's H200 (no recomputation, over 80 GiB a
#                      rank), it waits; a worker with one 80 GiB GPU registers: the job is planned
#                      again (recomputation, within 95 % of the card), placed and run there, and
#                      `hyscale watch` shows the re-plan
# Usage: service_e2e.sh BUILD_DIR SCENARIO
set -euo pipefail

build=$(cd "$1" && pwd)
scenario=$2
hyscaled=$build/server/hyscaled
agent=$build/worker/agent/hyscale-worker
cli=$build/client/hyscale
trainer=$build/worker/trainer/hyscale-train
heartbeat_ms=250

work=$(mktemp -d "${TMPDIR:-/tmp}/hyscale-e2e-$scenario.XXXXXX")
# Trainers of a worker run as root run as nobody: they must reach what is in here.
chmod 755 "$work"
pids=()
cleanup() {
  local status=$?
  for pid in "${pids[@]}"; do kill -9 "$pid" 2>/dev/null || true; done
  # Trainers run in their own process groups; their command lines name files under $work.
  pkill -9 -f "$work" 2>/dev/null || true
  if ((status == 0)); then rm -rf "$work"; else echo "e2e: files kept in $work" >&2; fi
}
trap cleanup EXIT

tag=$scenario
# shellcheck source=tests/e2e/lib.sh
source "$(dirname "$0")/lib.sh"

echo "e2e-secret-$RANDOM$RANDOM" >"$work/token"
# The first start binds gRPC to port 0 and reads the port back; restarts take it again. The metrics
# port (0 would turn metrics off) is picked free in advance, which another process may take before
# hyscaled binds it (parallel tests): a first start that finds it taken picks again.
grpc_port=""
metrics_port=$(free_port)
starts=0

listening_or_gone() { grep -q "listening on" "$1" || ! kill -0 "$2" 2>/dev/null; }

start_coordinator() {
  local attempt log
  for attempt in 1 2 3 4 5; do
    starts=$((starts + 1))
    log="$work/hyscaled.$starts.log"
    "$hyscaled" --listen "127.0.0.1:${grpc_port:-0}" --data-dir "$work/data" \
      --metrics-listen "127.0.0.1:$metrics_port" --token-file "$work/token" \
      --heartbeat-interval-ms "$heartbeat_ms" --restart-backoff-ms 200 >"$log" 2>&1 &
    coordinator=$!
    pids+=("$coordinator")
    wait_for 30 "hyscaled to listen" listening_or_gone "$log" "$coordinator"
    if grep -q "listening on" "$log"; then
      [[ -n $grpc_port ]] || grpc_port=$(listening_port "$log")
      return
    fi
    [[ -z $grpc_port ]] && grep -q "cannot bind 127.0.0.1:$metrics_port" "$log" ||
      fail "hyscaled exited: $(tail -5 "$log")"
    echo "metrics port $metrics_port was taken before hyscaled bound it (attempt $attempt)"
    metrics_port=$(free_port)
  done
  fail "no free metrics port in 5 attempts"
}

declare -A workers
run_as=$(trainer_user "$trainer")
# start_worker NAME [WORK_DIR [LOG]]
start_worker() {
  local name=$1
  "$agent" --server "127.0.0.1:$grpc_port" --token-file "$work/token" --name "$name" \
    --devices "${devices:-cpu:1}" --work-dir "${2:-$work/$name}" --checkpoint-root "$work/data/checkpoints" \
    --trainer "$trainer" --run-as "$run_as" \
    --heartbeat-interval-ms "$heartbeat_ms" >"${3:-$work/$name.log}" 2>&1 &
  workers[$name]=$!
  pids+=("$!")
}

hs() { "$cli" --server "127.0.0.1:$grpc_port" --token-file "$work/token" --timeout 10 "$@"; }
job_field() { hs get "$1" -o json | jq -r "$2"; }
job_state() { job_field "$1" '.state'; }
state_is() { [[ $(job_state "$1") == "$2" ]]; }
step_at_least() { (($(job_field "$1" '.progress.step // 0') >= $2)); }
online_workers() { hs workers -o json | jq '[.workers[] | select(.state == "WORKER_STATE_ONLINE")] | length'; }
workers_online() { [[ $(online_workers) == "$1" ]]; }

# A tiny DSA model on associative recall; `steps` sets how long it runs (a few ms a step).
write_job() {
  local file=$1 name=$2 steps=$3
  cat >"$file" <<EOF
name: $name
seed: 7
model: {vocab_size: 64, d_model: 32, layers: 1, heads: 2, head_dim_qk: 16, rope_dim: 8,
        head_dim_v: 16, d_ff: 64, indexer: {heads: 2, dim: 16, rope_dim: 8, topk: 8}}
data: {seq_len: 64, batch_size: 4, recall: {pairs: 4, queries: 4, key_vocab: 16, value_vocab: 16}}
stages:
  - {name: dense, steps: $steps, lr: 0.003, warmup_steps: 5, attention: DENSE}
checkpoint: {every_steps: 10}
log_every: 1
threads: 1
EOF
}

submit() { hs submit -f "$1" "${@:2}" -o json | jq -r '.id'; }

expect_exit() {
  local want=$1 what=$2
  shift 2
  local got=0
  "$@" >"$work/last.out" 2>&1 || got=$?
  ((got == want)) || fail "$what: exit $got, want $want: $(cat "$work/last.out")"
}

# --------------------------------------------------------------------------------------------
lifecycle() {
  local prom_port
  prom_port=$(free_port)
  start_coordinator
  cat >"$work/prometheus.yml" <<EOF
global: {scrape_interval: 1s, scrape_timeout: 1s}
scrape_configs:
  - job_name: hyscaled
    static_configs: [{targets: ['127.0.0.1:$metrics_port']}]
EOF
  prometheus --config.file="$work/prometheus.yml" --storage.tsdb.path="$work/tsdb" \
    --web.listen-address="127.0.0.1:$prom_port" >"$work/prometheus.log" 2>&1 &
  pids+=("$!")
  start_worker w1
  start_worker w2
  wait_for 30 "2 workers online" workers_online 2

  write_job "$work/short.yaml" short 150
  write_job "$work/long.yaml" long 100000
  local short long third
  short=$(submit "$work/short.yaml")
  long=$(submit "$work/long.yaml")
  third=$(submit "$work/short.yaml" --request-id third-job)
  [[ $(submit "$work/short.yaml" --request-id third-job) == "$third" ]] ||
    fail "a repeated request id created a second job"

  wait_for 60 "the long job to run" state_is "$long" JOB_STATE_RUNNING
  expect_exit 0 "cancel" hs cancel "$long" --reason "e2e cancel"
  expect_exit 0 "watch the short job to SUCCEEDED" hs watch "$short"
  expect_exit 0 "watch the third job to SUCCEEDED" hs watch "$third"
  wait_for 30 "the cancelled job to be CANCELLED" state_is "$long" JOB_STATE_CANCELLED
  expect_exit 1 "watch of a cancelled job" hs watch "$long"

  local listed
  listed=$(hs list -o json | jq -r '.jobs[] | "\(.id) \(.state)"' | sort)
  grep -qx "$short JOB_STATE_SUCCEEDED" <<<"$listed" || fail "list: $listed"
  grep -qx "$third JOB_STATE_SUCCEEDED" <<<"$listed" || fail "list: $listed"
  grep -qx "$long JOB_STATE_CANCELLED" <<<"$listed" || fail "list: $listed"
  [[ $(wc -l <<<"$listed") == 3 ]] || fail "list shows other jobs: $listed"
  hs logs "$short" >"$work/short.out" || fail "logs of the short job"
  grep -q '"job_finished":' "$work/short.out" || fail "the short job's log has no job_finished"

  curl -sf "http://127.0.0.1:$metrics_port/metrics" >"$work/metrics.txt" || fail "GET /metrics"
  promtool check metrics <"$work/metrics.txt" >"$work/promtool.log" 2>&1 ||
    fail "promtool check metrics: $(cat "$work/promtool.log")"
  local query="count_over_time(hyscale_job_step_phase_seconds_count{job_id=\"$short\"}[10m])"
  phase_series() {
    curl -sf "http://127.0.0.1:$prom_port/api/v1/query" --data-urlencode "query=$query" |
      jq -e '.data.result | length > 0'
  }
  wait_for 30 "Prometheus to hold the job's phase series" phase_series
  echo "lifecycle: 3 jobs, states right; Prometheus has the phase series; promtool ok"
}

coordinator_crash() {
  start_coordinator
  start_worker w1
  wait_for 30 "the worker online" workers_online 1
  write_job "$work/job.yaml" crash 1500
  local job
  job=$(submit "$work/job.yaml")
  wait_for 60 "the job to reach step 20" step_at_least "$job" 20
  kill -9 "$coordinator"
  sleep 1
  start_coordinator
  [[ $(job_state "$job") =~ RUNNING|SUCCEEDED ]] || fail "after restart the job is $(job_state "$job")"
  expect_exit 0 "watch the job to SUCCEEDED after the restart" hs watch "$job"
  [[ $(job_field "$job" '.restarts // 0') == 0 ]] || fail "the job was restarted (ran twice)"
  echo "coordinator-crash: the job survived kill -9 of hyscaled and finished"
}

trainer_crash() {
  start_coordinator
  start_worker w1
  wait_for 30 "the worker online" workers_online 1
  write_job "$work/job.yaml" trainer-crash 400
  local job
  job=$(submit "$work/job.yaml" --max-restarts 2)
  wait_for 60 "the job to pass its first checkpoint" step_at_least "$job" 15
  pkill -9 -f "hyscale-train.*$work" || fail "no trainer process found"
  expect_exit 0 "watch the job to SUCCEEDED after the trainer crash" hs watch "$job"
  [[ $(job_field "$job" '.restarts') == 1 ]] || fail "restarts: $(job_field "$job" '.restarts')"
  hs logs "$job" >"$work/job.out" || fail "logs of the job"
  grep -q '"checkpoint_loaded":' "$work/job.out" ||
    fail "the restarted trainer did not resume from a checkpoint"
  echo "trainer-crash: restarted once from its checkpoint and finished"
}

worker_loss() {
  start_coordinator
  start_worker w1
  start_worker w2
  wait_for 30 "2 workers online" workers_online 2
  write_job "$work/job.yaml" worker-loss 600
  local job lost
  job=$(submit "$work/job.yaml" --max-restarts 2)
  wait_for 60 "the job to run" state_is "$job" JOB_STATE_RUNNING
  lost=$(job_field "$job" '.placement[0].worker_id')
  [[ -n ${workers[$lost]:-} ]] || fail "placed on unknown worker '$lost'"
  local killed_ns
  killed_ns=$(date +%s%N)
  kill -9 "${workers[$lost]}"
  pkill -9 -f "hyscale-train.*$work/$lost/" || true
  restarted_and_running() {  # one read of both fields, so they belong together
    [[ $(job_field "$job" '"\(.state) \(.restarts // 0)"') =~ ^JOB_STATE_RUNNING\ [1-9] ]]
  }
  wait_for 60 "the job to run again" restarted_and_running
  local moved
  moved=$(job_field "$job" '.placement[0].worker_id')
  [[ $moved != "$lost" ]] || fail "the job went back to the lost worker"
  expect_exit 0 "watch the job to SUCCEEDED on the other worker" hs watch "$job"
  # When the job went RESTARTING, from its persisted events (a replayed watch).
  hs watch "$job" -o json >"$work/events.json" || true
  local restarting elapsed_ms
  restarting=$(jq -r 'select(.state_change.to? == "JOB_STATE_RESTARTING") | .time' \
    "$work/events.json" | head -n 1)
  [[ -n $restarting ]] || fail "no RESTARTING event: $(head -c 2000 "$work/events.json")"
  elapsed_ms=$((($(date -d "$restarting" +%s%N) - killed_ns) / 1000000))
  # The last heartbeat came before the kill, so the timeout (three intervals) ends at most three
  # intervals after it; plus the coordinator's 100 ms liveness tick.
  ((elapsed_ms <= 3 * heartbeat_ms + 150)) ||
    fail "RESTARTING ${elapsed_ms} ms after the worker died: more than 3 heartbeat intervals"
  echo "worker-loss: RESTARTING ${elapsed_ms} ms after the worker died, finished on $moved"
}

worker_drain() {
  start_coordinator
  start_worker w1
  start_worker w2
  wait_for 30 "2 workers online" workers_online 2
  write_job "$work/job.yaml" worker-drain 600
  local job drained
  job=$(submit "$work/job.yaml")  # max_restarts 0: a counted restart would fail it
  wait_for 60 "the job to run" state_is "$job" JOB_STATE_RUNNING
  wait_for 60 "a checkpoint" step_at_least "$job" 20
  drained=$(job_field "$job" '.placement[0].worker_id')
  [[ -n ${workers[$drained]:-} ]] || fail "placed on unknown worker '$drained'"
  kill -TERM "${workers[$drained]}"
  wait_for 30 "the drained agent to exit" bash -c "! kill -0 ${workers[$drained]} 2>/dev/null"
  grep -q "worker shutting down" "$work/$drained.log" || fail "the agent did not stop its trainer"
  expect_exit 0 "watch the job to SUCCEEDED on the other worker" hs watch "$job"
  local summary
  summary=$(job_field "$job" '"\(.restarts) \(.disruptions) \(.placement[0].worker_id)"')
  [[ $summary == "1 1 "* && $summary != *" $drained" ]] ||
    fail "restarts, disruptions, worker: '$summary' (want 1 1 and not $drained)"
  hs watch "$job" -o json >"$work/events.json" || true
  grep -q "not counted against max_restarts" "$work/events.json" ||
    fail "no uncounted restart in the events: $(head -c 2000 "$work/events.json")"
  echo "worker-drain: the job moved off the drained worker $drained without using a restart"
}

bad_input() {
  start_coordinator
  write_job "$work/job.yaml" good 10
  printf 'name: [unclosed\n' >"$work/malformed.yaml"
  sed 's/^seed: 7/seed: 7\nnot_a_field: 1/' "$work/job.yaml" >"$work/unknown.yaml"
  sed 's/d_model: 32/d_model: 2000000000/' "$work/job.yaml" >"$work/oversized.yaml"
  expect_exit 2 "malformed YAML" hs submit -f "$work/malformed.yaml"
  grep -q "line" "$work/last.out" || fail "malformed YAML error names no line: $(cat "$work/last.out")"
  expect_exit 2 "unknown field" hs submit -f "$work/unknown.yaml"
  grep -q "not_a_field" "$work/last.out" || fail "unknown field not named: $(cat "$work/last.out")"
  expect_exit 2 "oversized d_model" hs submit -f "$work/oversized.yaml"
  grep -q "d_model" "$work/last.out" || fail "oversized field not named: $(cat "$work/last.out")"
  { printf 'name: '; head -c 1000000 /dev/zero | tr '\0' 'x'; echo; } >"$work/huge.yaml"
  expect_exit 2 "a 1 MB job name" hs submit -f "$work/huge.yaml"
  grep -q "name" "$work/last.out" || fail "oversized name not named: $(cat "$work/last.out")"
  expect_exit 4 "wrong token" "$cli" --server "127.0.0.1:$grpc_port" --token wrong \
    submit -f "$work/job.yaml"
  expect_exit 4 "no token" env -u HYSCALE_TOKEN "$cli" --server "127.0.0.1:$grpc_port" \
    submit -f "$work/job.yaml"
  expect_exit 3 "unknown job id" hs get no-such-job
  expect_exit 3 "cancel of an unknown job" hs cancel no-such-job
  expect_exit 0 "plan" hs plan -f "$work/job.yaml"
  # Still serving, and nothing was created by the bad requests.
  kill -0 "$coordinator" || fail "hyscaled died"
  [[ $(hs list -o json | jq '.jobs | length') == 0 ]] || fail "a bad request created a job"
  expect_exit 0 "a good submission after the bad ones" hs submit -f "$work/job.yaml"
  echo "bad-input: every bad request got a clear error; the server kept serving"
}

job_paths() {
  cat >"$work/id-train.sh" <<'SH'
#!/bin/sh
echo '{"time":1,"job_started":{"name":"paths","total_steps":1}}'
echo "trainer uid $(id -u)" >&2
echo '{"time":2,"job_finished":{"ok":true,"elapsed_seconds":1}}'
SH
  chmod +x "$work/id-train.sh"
  trainer=$work/id-train.sh
  start_coordinator
  start_worker w1
  wait_for 30 "the worker online" workers_online 1
  mkdir -p "$work/w1/data"
  echo "some text to train on" >"$work/w1/data/corpus.txt"
  ln -s /etc/shadow "$work/w1/data/shadow"
  text_job() {
    write_job "$work/$1.yaml" "$1" 5
    sed -i "s|recall: {[^}]*}|text_file: {path: $2}|; s/vocab_size: 64/vocab_size: 256/" \
      "$work/$1.yaml"
  }
  text_job relative data/corpus.txt
  expect_exit 2 "a relative data path" hs submit -f "$work/relative.yaml"
  grep -q "spec.data.text_file.path: must be an absolute path" "$work/last.out" ||
    fail "relative path: $(cat "$work/last.out")"
  local job reason
  for target in /etc/passwd "$work/w1/data/shadow"; do
    text_job outside "$target"
    job=$(submit "$work/outside.yaml" --max-restarts 2)
    expect_exit 1 "a job reading $target fails" hs watch "$job"
    reason=$(job_field "$job" '.reason')
    [[ $reason == *"spec.data.text_file.path: '$target' is outside"* ]] ||
      fail "reason of the job reading $target: $reason"
    [[ $(job_field "$job" '.restarts // 0') == 0 ]] || fail "a job reading $target was retried"
    hs logs "$job" >"$work/outside.out" 2>&1 || true
    ! grep -q "root:" "$work/outside.out" "$work/w1.log" || fail "file bytes of $target shown"
  done
  text_job inside "$work/w1/data/corpus.txt"
  job=$(submit "$work/inside.yaml")
  expect_exit 0 "a job reading its data folder" hs watch "$job"
  if [[ $run_as == nobody ]]; then
    hs logs "$job" | grep -q "trainer uid $(id -u nobody)" ||
      fail "the trainer did not run as nobody"
  fi
  local anonymous=(env -u HYSCALE_TOKEN "$cli" --server "127.0.0.1:$grpc_port")
  expect_exit 4 "get without the token" "${anonymous[@]}" get "$job"
  expect_exit 4 "logs without the token" "${anonymous[@]}" logs "$job"
  expect_exit 4 "list without the token" "${anonymous[@]}" list
  expect_exit 4 "workers without the token" "${anonymous[@]}" workers
  echo "job-paths: outside paths refused as bad input, the inside one ran; reads need the token"
}

agent_restart() {
  cat >"$work/long-train.sh" <<EOF
#!/bin/sh
echo '{"time":1,"job_started":{"name":"long","total_steps":1}}'
"$work/child.sh" &
wait
EOF
  printf '#!/bin/sh\nsleep 600\n' >"$work/child.sh"
  chmod +x "$work/long-train.sh" "$work/child.sh"
  trainer=$work/long-train.sh
  start_coordinator
  start_worker w1
  wait_for 30 "the worker online" workers_online 1
  write_job "$work/job.yaml" agent-restart 5
  local job first impostor
  job=$(submit "$work/job.yaml" --max-restarts 3)
  wait_for 30 "the job to run" state_is "$job" JOB_STATE_RUNNING
  # Processes whose command line starts with a shell running SCRIPT (the agent's names it too).
  count() { pgrep -fc "^/bin/sh $1" || true; }
  wait_for 10 "the trainer's child" pgrep -f "$work/child.sh"
  first=${workers[w1]}

  # An impostor under the live name: refused, and it runs nothing.
  start_worker w1 "$work/w1-impostor" "$work/impostor.log"
  impostor=${workers[w1]}
  wait_for 10 "the impostor's refusal" grep -q "held by another live agent" "$work/impostor.log"
  kill -9 "$impostor"
  [[ $(count "$work/long-train.sh") == 1 ]] ||
    fail "not one trainer: $(count "$work/long-train.sh")"

  kill -9 "$first"
  trainer_gone() { [[ $(count "$work/long-train.sh") == 0 ]]; }
  wait_for 5 "the trainer to die with its agent" trainer_gone
  pgrep -f "$work/child.sh" >/dev/null || fail "the trainer's child died too: nothing left to end"
  start_worker w1
  wait_for 30 "the leftover group ended" grep -q "left by a previous agent" "$work/w1.log"
  child_gone() { [[ $(count "$work/child.sh") == 0 ]]; }
  wait_for 5 "the leftover child to be gone" child_gone
  # One read of both fields: two would race with the loss of the old agent.
  second_attempt() {
    [[ $(job_field "$job" '"\(.state) \(.restarts // 0)"') == "JOB_STATE_RUNNING 1" ]]
  }
  wait_for 30 "the job's next attempt to run" second_attempt
  [[ $(count "$work/long-train.sh") == 1 ]] ||
    fail "not one trainer: $(count "$work/long-train.sh")"
  expect_exit 0 "cancel" hs cancel "$job"
  echo "agent-restart: the impostor was refused; one trainer per attempt throughout"
}

bounded() {
  start_coordinator
  write_job "$work/job.yaml" bounded 5
  local job
  job=$(submit "$work/job.yaml")
  # A 100 KB cancel reason is refused by name; the job stays as it was.
  expect_exit 2 "a 100 KB cancel reason" \
    hs cancel "$job" --reason "$(head -c 100000 /dev/zero | tr '\0' r)"
  grep -q "reason: 100000 bytes exceeds the limit of 4096" "$work/last.out" ||
    fail "oversized reason: $(head -c 300 "$work/last.out")"
  [[ $(job_state "$job") == JOB_STATE_PENDING ]] || fail "the job changed: $(job_state "$job")"
  # A name with terminal controls is shown escaped, never raw.
  sed -i "s/^name: bounded/name: \"evil\\\\e]0;pwned\\\\a\"/" "$work/job.yaml"
  job=$(submit "$work/job.yaml")
  hs list >"$work/list.out" || fail "hyscale list failed"
  grep -q 'evil\\x1b]0;pwned\\x07' "$work/list.out" ||
    fail "the name is not escaped: $(cat -v "$work/list.out")"
  ! grep -q $'\e' "$work/list.out" || fail "a raw escape reached the terminal"
  hs get "$job" | grep -q 'evil\\x1b' || fail "get does not escape the name"
  # Queued jobs add no per-job series.
  curl -sf "http://127.0.0.1:$metrics_port/metrics" >"$work/metrics.txt" || fail "GET /metrics"
  ! grep -q "job_id=\"$job\"" "$work/metrics.txt" || fail "a queued job has series"
  echo "bounded: oversized fields refused by name, names escaped, no series for queued jobs"
}

out_of_memory() {
  start_coordinator
  # Past what any device holds: refused at submission with the planner's reason.
  write_job "$work/huge.yaml" huge 5
  sed -i 's/vocab_size: 64/vocab_size: 16777216/; s/seq_len: 64/seq_len: 65536/' "$work/huge.yaml"
  expect_exit 2 "a job no device holds" hs submit -f "$work/huge.yaml"
  grep -q "spec: does not fit 1 cpu device(s): memory" "$work/last.out" ||
    fail "infeasible job: $(cat "$work/last.out")"
  # Fits the devices, but its trainer is held to 1.5 GB of address space: it runs out of memory,
  # exits 3, and the job fails without using its restarts.
  printf '#!/bin/sh\nulimit -v 1500000\nexec %s "$@"\n' "$build/worker/trainer/hyscale-train" \
    >"$work/small-train.sh"
  chmod +x "$work/small-train.sh"
  trainer=$work/small-train.sh
  start_worker w1
  wait_for 30 "the worker online" workers_online 1
  cat >"$work/big.yaml" <<EOF
name: big
model: {vocab_size: 64, d_model: 1024, layers: 8, heads: 8, head_dim_qk: 128, rope_dim: 64,
        head_dim_v: 128, d_ff: 4096, indexer: {heads: 4, dim: 64, rope_dim: 32, topk: 64}}
data: {seq_len: 1024, batch_size: 8, recall: {pairs: 4, queries: 4, key_vocab: 16, value_vocab: 16}}
stages: [{name: dense, steps: 2, lr: 0.003, warmup_steps: 1, attention: DENSE}]
threads: 1
EOF
  local job reason
  job=$(submit "$work/big.yaml" --max-restarts 2)
  expect_exit 1 "the out-of-memory job fails" hs watch "$job"
  reason=$(job_field "$job" '.reason')
  [[ $reason == *"exited with code 3"*"out of memory"* ]] || fail "reason: $reason"
  [[ $(job_field "$job" '.restarts // 0') == 0 ]] || fail "the out-of-memory job was restarted"
  echo "out-of-memory: the infeasible job was refused; the one out of memory failed once: $reason"
}

store() {
  start_coordinator
  write_job "$work/job.yaml" kept 5
  local first second third
  first=$(submit "$work/job.yaml")
  second=$(submit "$work/job.yaml")
  third=$(submit "$work/job.yaml")
  # A consistent snapshot while it serves.
  expect_exit 0 "backup while serving" "$hyscaled" backup --data-dir "$work/data" \
    --to "$work/backup.db"
  grep -q "backed up" "$work/last.out" || fail "backup: $(cat "$work/last.out")"
  # One damaged job record: set aside with a line naming it; the others are served.
  kill -9 "$coordinator"
  python3 - "$work/data/hyscale.db" "$second" <<'PY'
import sqlite3, sys
db = sqlite3.connect(sys.argv[1])
db.execute("UPDATE jobs SET job = x'ffffffff' WHERE id = ?", (sys.argv[2],))
db.commit()
PY
  start_coordinator
  grep -q "job $second: its stored record cannot be read; set aside" "$work/hyscaled.$starts.log" ||
    fail "the damaged record is not named: $(cat "$work/hyscaled.$starts.log")"
  [[ $(hs list -o json | jq -r '[.jobs[].id] | sort | join(" ")') == \
    "$(printf '%s\n' "$first" "$third" | sort | paste -sd ' ')" ]] || fail "list: $(hs list)"
  [[ $(python3 -c 'import sqlite3,sys; print(sqlite3.connect(sys.argv[1]).execute(
    "select id from jobs_set_aside").fetchone()[0])' "$work/data/hyscale.db") == "$second" ]] ||
    fail "the damaged record is not in jobs_set_aside"
  # The backup serves all three.
  mkdir -p "$work/restored"
  cp "$work/backup.db" "$work/restored/hyscale.db"
  local port
  port=$(free_port)
  "$hyscaled" --listen "127.0.0.1:$port" --data-dir "$work/restored" --metrics-listen 127.0.0.1:0 \
    --token-file "$work/token" >"$work/restored.log" 2>&1 &
  pids+=("$!")
  wait_for 30 "the restored coordinator to listen" grep -q "listening on" "$work/restored.log"
  [[ $("$cli" --server "127.0.0.1:$port" --token-file "$work/token" list -o json |
    jq '.jobs | length') == 3 ]] || fail "the backup does not hold the three jobs"
  # A damaged file is refused, saying so. (Stopped cleanly, so the write-ahead log is folded in
  # and every page but the header is in the file.)
  kill -TERM "$coordinator"
  wait_for 10 "hyscaled to stop" eval '! kill -0 "$coordinator"'
  python3 - "$work/data/hyscale.db" <<'PY'
import os, sys
with open(sys.argv[1], "r+b") as f:
    size = os.path.getsize(sys.argv[1])
    f.seek(4096)
    f.write(b"\x55" * (size - 4096))
PY
  expect_exit 1 "hyscaled on a damaged database" timeout 20 "$hyscaled" \
    --listen "127.0.0.1:$grpc_port" \
    --data-dir "$work/data" --metrics-listen 127.0.0.1:0 --token-file "$work/token"
  grep -q "integrity check failed" "$work/last.out" || fail "damaged: $(cat "$work/last.out")"
  echo "store: backup while serving, a damaged record set aside, a damaged file refused"
}

port_in_use() {
  start_coordinator
  local second=(--data-dir "$work/data2" --token-file "$work/token")
  expect_exit 1 "a second hyscaled on the gRPC port" "$hyscaled" "${second[@]}" \
    --listen "127.0.0.1:$grpc_port" --metrics-listen 127.0.0.1:0
  grep -q "127.0.0.1:$grpc_port" "$work/last.out" ||
    fail "port not named: $(cat "$work/last.out")"
  expect_exit 1 "a second hyscaled on the metrics port" "$hyscaled" "${second[@]}" \
    --listen "127.0.0.1:$(free_port)" --metrics-listen "127.0.0.1:$metrics_port"
  grep -q "127.0.0.1:$metrics_port" "$work/last.out" ||
    fail "port not named: $(cat "$work/last.out")"
  # `hyscale up` on a port another server holds: its hyscaled cannot bind, and up says where.
  expect_exit 7 "hyscale up on a taken port" "$cli" --server "127.0.0.1:$metrics_port" up \
    --data-dir "$work/up" --metrics-listen 127.0.0.1:0 --start-timeout 20
  grep -q "cannot serve on 127.0.0.1:$metrics_port" "$work/last.out" ||
    fail "hyscale up did not name the port: $(cat "$work/last.out")"
  # The first coordinator still answers every call (none went to a second one).
  for _ in {1..10}; do expect_exit 3 "get on the first coordinator" hs get no-such-job; done
  kill -0 "$coordinator" || fail "hyscaled died"
  echo "port-in-use: each second server refused its port, naming it"
}

replan() {
  cat >"$work/sleep-train.sh" <<'SH'
#!/bin/sh
echo '{"time":1,"job_started":{"name":"replan","total_steps":1}}'
exec sleep 60
SH
  chmod +x "$work/sleep-train.sh"
  trainer=$work/sleep-train.sh
  start_coordinator
  # (The script trainer reads nothing; the path is one the worker allows.)
  sed "s/seq_len: 32768/seq_len: 65536/; s|path: corpus.txt.*|path: $work/g1/data/corpus.txt|" \
    "$(dirname "$0")/../../examples/train-ref-2048x4.yaml" >"$work/ref.yaml"
  printf 'parallelism: {mode: AUTO}\n' >>"$work/ref.yaml"
  local job memory
  job=$(submit "$work/ref.yaml" --device gpu)
  state_is "$job" JOB_STATE_PENDING || fail "the job did not wait: $(job_state "$job")"
  [[ $(job_field "$job" '.spec.recompute.enabled // false') == false ]] ||
    fail "planned with recomputation for the profile's card"
  memory=$(job_field "$job" '.resources.memory_bytes_per_rank | tonumber')
  local card=$((80 << 30))  # the agent's gpu:1:80GB (its units are powers of 1024)
  ((memory > card)) || fail "the profile's plan takes $memory bytes a rank"
  devices=gpu:1:80GB start_worker g1
  wait_for 30 "the job placed on g1" state_is "$job" JOB_STATE_RUNNING
  [[ $(job_field "$job" '.spec.recompute.enabled // false') == true ]] ||
    fail "not planned again with recomputation"
  memory=$(job_field "$job" '.resources.memory_bytes_per_rank | tonumber')
  ((memory <= card * 95 / 100)) || fail "the new plan takes $memory bytes a rank"
  [[ $(job_field "$job" '.placement[0].worker_id') == g1 ]] || fail "not placed on g1"
  hs cancel "$job" >/dev/null || fail "cancel"
  hs watch "$job" >"$work/watch.out" 2>&1 || true
  grep -q "re-planned: planned again for the online workers' devices" "$work/watch.out" ||
    fail "watch shows no re-plan: $(cat "$work/watch.out")"
  echo "replan: planned for the profile ($(grep -o 'which could not hold its plan: [^;]*' \
    "$work/watch.out")), then again for g1's 80 GiB: $(grep -o 'now CP.*' "$work/watch.out")"
}

case $scenario in
  replan) replan ;;
  lifecycle) lifecycle ;;
  coordinator-crash) coordinator_crash ;;
  trainer-crash) trainer_crash ;;
  worker-loss) worker_loss ;;
  worker-drain) worker_drain ;;
  bad-input) bad_input ;;
  port-in-use) port_in_use ;;
  job-paths) job_paths ;;
  agent-restart) agent_restart ;;
  bounded) bounded ;;
  store) store ;;
  out-of-memory) out_of_memory ;;
  *) fail "unknown scenario $scenario" ;;
esac
