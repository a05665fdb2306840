#!/usr/bin/env bash
# The coordinator's web view (server/web_ui.h) end to end: hyscaled with a token on loopback, a
# hyscale-worker running a fake trainer that reports 40 steps with phase times, one job through
# the CLI. Then:
#   - the JSON API: 401 without the token, the job in /api/v1/jobs, its steps in /api/v1/job,
#     400 naming a malformed `after`, 404 JSON for an unknown job;
#   - /metrics passes `promtool check metrics` and has the job's running/plan series;
#   - headless Chromium loads the page (token in the URL fragment), its script runs, and the
#     dumped DOM has the job's row, a stacked area per phase and the loss line; without the token
#     the page shows the 401 error, and for an unknown job the 404 error and no detail. A
#     screenshot goes to BUILD_DIR/web_ui.png.
# Usage: web_ui_test.sh BUILD_DIR
set -euo pipefail

build=$(cd "$1" && pwd)
hyscaled=$build/server/hyscaled
agent=$build/worker/agent/hyscale-worker
cli=$build/client/hyscale
chromium=$(command -v chromium || true)
[[ -n $chromium ]] || { echo "FAIL: chromium not found (scripts/install-deps.sh installs it)" >&2; exit 1; }

work=$(mktemp -d "${TMPDIR:-/tmp}/hyscale-web-ui.XXXXXX")
# Trainers of a worker run as root run as nobody: they must reach what is in here.
chmod 755 "$work"
pids=()
cleanup() {
  local status=$?
  for pid in "${pids[@]}"; do
    kill -9 "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
  done
  if ((status == 0)); then rm -rf "$work"; else echo "web-ui: files kept in $work" >&2; fi
}
trap cleanup EXIT

tag=web-ui
# shellcheck source=tests/e2e/lib.sh
source "$(dirname "$0")/lib.sh"

# --metrics-listen port 0 turns the HTTP server off, so pick a free port (retried on a clash).
http_port() {
  local port=$((20000 + RANDOM % 30000))
  while (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; do port=$((port + 1)); done
  echo "$port"
}

token="web-secret-$RANDOM$RANDOM"
echo "$token" >"$work/token"
"$hyscaled" --listen 127.0.0.1:0 --metrics-listen "127.0.0.1:$(http_port)" --data-dir "$work/data" \
  --token-file "$work/token" --heartbeat-interval-ms 250 >"$work/hyscaled.log" 2>&1 &
pids+=("$!")
wait_for 30 "hyscaled to listen" grep -q "listening on" "$work/hyscaled.log"
grpc=$(sed -n 's/^hyscaled: listening on \(.*\)$/\1/p' "$work/hyscaled.log")
web=$(sed -n 's|^hyscaled: metrics on http://\([^/]*\)/metrics.*|\1|p' "$work/hyscaled.log")
[[ -n $grpc && -n $web ]] || fail "no addresses in the log"

# 40 steps with a breakdown into phases, a falling loss and one evaluation.
cat >"$work/fake-train.sh" <<'SH'
#!/bin/sh
echo '{"time":1,"job_started":{"name":"web","total_steps":40}}'
i=1
while [ $i -le 40 ]; do
  loss=$(awk "BEGIN { printf \"%.4f\", 0.5 + 4 / ($i + 1) }")
  sel=$(awk "BEGIN { printf \"%.4f\", 0.02 + $i * 0.0005 }")
  eval=""
  [ $i -eq 20 ] && eval=',"evaluation":{"accuracy":0.5,"indexer_recall":0.8}'
  echo "{\"time\":1,\"step\":{\"step\":$i,\"total_steps\":40,\"loss\":$loss,\"step_seconds\":0.1,\"tokens_per_second\":5000,\"phase_seconds\":{\"data\":0.01,\"selection_fwd\":$sel,\"attention_fwd\":0.02,\"attention_bwd\":0.03,\"comm_fwd\":0.01}$eval}}"
  i=$((i + 1))
done
echo '{"time":2,"job_finished":{"ok":true,"elapsed_seconds":1}}'
SH
chmod +x "$work/fake-train.sh"
"$agent" --server "$grpc" --token-file "$work/token" --name w1 --devices cpu:1 \
  --work-dir "$work/w1" --checkpoint-root "$work/data/checkpoints" --trainer "$work/fake-train.sh" \
  --heartbeat-interval-ms 250 \
  >"$work/worker.log" 2>&1 &
pids+=("$!")

cat >"$work/job.yaml" <<'YAML'
name: web-demo
model: {vocab_size: 64, d_model: 32, layers: 1, heads: 2, head_dim_qk: 16, rope_dim: 8,
        head_dim_v: 16, d_ff: 64, indexer: {heads: 2, dim: 16, rope_dim: 8, topk: 8}}
data: {seq_len: 64, batch_size: 4, recall: {pairs: 4, queries: 4, key_vocab: 16, value_vocab: 16}}
stages:
  - {name: dense, steps: 40, lr: 0.003, warmup_steps: 5, attention: DENSE}
YAML
hs() { "$cli" --server "$grpc" --token-file "$work/token" --timeout 10 "$@"; }
job=$(hs submit -f "$work/job.yaml" -o json | jq -r '.id')
[[ -n $job && $job != null ]] || fail "submit gave no job id"
succeeded() { [[ $(hs get "$job" -o json | jq -r '.state') == JOB_STATE_SUCCEEDED ]]; }
wait_for 60 "the job to succeed" succeeded

# --- the JSON API
api() { curl -s -o "$work/body.json" -w '%{http_code}' "$@"; }
[[ $(api "http://$web/api/v1/jobs") == 401 ]] || fail "jobs without the token: not 401"
[[ $(api -H "Authorization: Bearer wrong" "http://$web/api/v1/jobs") == 401 ]] ||
  fail "jobs with a wrong token: not 401"
auth=(-H "Authorization: Bearer $token")
[[ $(api "${auth[@]}" "http://$web/api/v1/jobs") == 200 ]] || fail "jobs: $(cat "$work/body.json")"
jq -e --arg id "$job" '.jobs[] | select(.id == $id and .state == "succeeded" and .step == 40)' \
  "$work/body.json" >/dev/null || fail "jobs: $(cat "$work/body.json")"
[[ $(api "${auth[@]}" "http://$web/api/v1/job?id=$job") == 200 ]] || fail "job detail"
jq -e '(.steps | length) == 40 and .steps[0].phases.selection_fwd > 0 and
       ([.states[].state] | index("succeeded")) != null and .more == false' \
  "$work/body.json" >/dev/null || fail "job detail: $(cat "$work/body.json")"
last=$(jq '.after' "$work/body.json")
api "${auth[@]}" "http://$web/api/v1/job?id=$job&after=$last" >/dev/null
jq -e '(.steps | length) == 0 and .after == '"$last" "$work/body.json" >/dev/null ||
  fail "polling after the last event: $(cat "$work/body.json")"
[[ $(api "${auth[@]}" "http://$web/api/v1/job?id=$job&after=-1") == 400 ]] &&
  jq -e '.error | startswith("after:")' "$work/body.json" >/dev/null || fail "after=-1: not 400"
[[ $(api "${auth[@]}" "http://$web/api/v1/job?id=$job&after=x") == 400 ]] || fail "after=x: not 400"
[[ $(api "${auth[@]}" "http://$web/api/v1/job?id=no-such-job") == 404 ]] &&
  jq -e '.error | test("not found")' "$work/body.json" >/dev/null || fail "unknown job: not 404 JSON"
[[ $(api "${auth[@]}" "http://$web/api/v1/job") == 400 ]] || fail "missing id: not 400"
[[ $(api -D "$work/headers.txt" "http://$web/") == 200 ]] || fail "the page is not served"
grep -qi "^Content-Security-Policy: default-src 'self'" "$work/headers.txt" ||
  fail "the page has no Content-Security-Policy: $(cat "$work/headers.txt")"

# --- metrics
curl -sf "http://$web/metrics" >"$work/metrics.txt" || fail "GET /metrics"
promtool check metrics <"$work/metrics.txt" >"$work/promtool.log" 2>&1 ||
  fail "promtool check metrics: $(cat "$work/promtool.log")"
for series in "hyscale_job_running{job_id=\"$job\"} 0" "hyscale_job_predicted_memory_bytes{job_id=\"$job\"}" \
  "hyscale_job_step_phase_seconds_count{job_id=\"$job\",phase=\"comm_fwd\"} 40"; do
  grep -qF "$series" "$work/metrics.txt" || fail "/metrics lacks $series"
done

# --- the page in headless Chromium
browse() {
  "$chromium" --headless --disable-gpu --no-sandbox --no-first-run --user-data-dir="$work/chromium" \
    --window-size=1280,900 --virtual-time-budget=5000 "$@" 2>>"$work/chromium.log"
}
url="http://$web/#job=$job&token=$token"
browse --dump-dom "$url" >"$work/dom.html" || fail "chromium --dump-dom"
grep -q "<tr class=\"job-row selected\" data-id=\"$job\">" "$work/dom.html" ||
  fail "no selected row for $job in the DOM"
grep -q '<span class="state succeeded">succeeded</span>' "$work/dom.html" || fail "no succeeded state"
areas=$(grep -o 'class="phase-area" data-phase="[a-z_]*"' "$work/dom.html" | sort -u | wc -l)
((areas == 5)) || fail "$areas phase areas in the chart, want 5"
grep -q 'class="loss-line"' "$work/dom.html" || fail "no loss line"
grep -q 'id="status" class="">updated' "$work/dom.html" || fail "the page reports an error"
grep -q "$token" "$work/dom.html" && fail "the token is in the DOM"
browse --screenshot="$build/web_ui.png" "$url" >/dev/null || fail "chromium --screenshot"
[[ -s $build/web_ui.png ]] || fail "no screenshot"

browse --dump-dom "http://$web/#job=$job" >"$work/dom-no-token.html" || fail "chromium without token"
grep -q 'class="error">authorization: bearer token required' "$work/dom-no-token.html" ||
  fail "without the token the page shows no 401 error"
browse --dump-dom "http://$web/#job=no-such-job&token=$token" >"$work/dom-bad-job.html" ||
  fail "chromium with an unknown job"
grep -q 'class="error">job not found: no-such-job' "$work/dom-bad-job.html" &&
  grep -q '<section id="detail" hidden=' "$work/dom-bad-job.html" ||
  fail "an unknown job in the URL does not show the 404 error alone"
echo "web-ui: API, metrics and the page in Chromium ok; screenshot $build/web_ui.png"
