#!/usr/bin/env bash
# hyscale-layer-bench under context parallelism on the CPU: two ranks (Gloo over loopback) time
# the trainer's layer with its key exchange and each prints its line with its rank and comm times.
#   layer_bench_cp.sh HYSCALE_LAYER_BENCH
set -euo pipefail
bench=$1
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
for rank in 0 1; do
  HYSCALE_WORLD_SIZE=2 HYSCALE_RANK=$rank HYSCALE_RENDEZVOUS=127.0.0.1:$port \
    HYSCALE_RENDEZVOUS_TIMEOUT_S=60 HYSCALE_COMM_TIMEOUT_S=60 \
    timeout 120 "$bench" --device cpu --sizes 256 --d-model 64 --d-ff 128 --heads 4 --dqk 48 \
    --dv 32 --rope 16 --heads-i 4 --dim-i 32 --rope-i 16 --topk 32 --runs 2 --warmup 1 \
    --query-chunk 50 --cp-layout zigzag >"$out/rank$rank.json" 2>"$out/rank$rank.log" &
done
status=0
wait %1 || status=$?
wait %2 || status=$?
for rank in 0 1; do
  if ! grep -q "\"rank\":$rank" "$out/rank$rank.json" || ! grep -q '"comm":{"exposed"' "$out/rank$rank.json"; then
    echo "rank $rank printed no step line:"; cat "$out/rank$rank.json" "$out/rank$rank.log"; status=1
  fi
done
cat "$out/rank0.json"
exit $status
