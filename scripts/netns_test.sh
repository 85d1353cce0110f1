#!/usr/bin/env bash
# Multi-host test: a cluster of four hosts built from network namespaces (two server hosts,
# two worker hosts, veth pairs on a bridge in a fifth "switch" namespace, addresses 10.77.0.0/24
# that exist only inside the namespaces) trains dlrm-small on generated data with the same
# manifest on every host, and checks the result. Needs root and a working `ip netns`; exits 77
# (skipped) otherwise. Removes its namespaces and files however it ends.
# With --partition, worker host 1's link is cut for 5 s in the middle of training and then
# restored: the job must complete, the shards must have applied exactly the pushes the workers
# had acknowledged (resent pushes are counted as duplicates, not applied again), and the final
# model must equal an undisturbed run's on the same hosts, value for value. Then worker 1 is
# killed (in a third run) and started again by hand on its host: the model must be the same.
#   scripts/netns_test.sh [path/to/parasol] [--partition]
set -euo pipefail

PARASOL="$(realpath "${1:-$(dirname "$0")/../build/parasol}")"
PARTITION=0
[ "${2:-}" = "--partition" ] && PARTITION=1
ROWS=40000
[ "$PARTITION" -eq 1 ] && ROWS=150000
SKIP=77
if [ "$(id -u)" -ne 0 ]; then
  echo "SKIP: the multi-host test needs root (ip netns)"
  exit $SKIP
fi
tag="pn$$"
# Probe with the commands the test uses (namespaces, a bridge, a veth pair between two
# namespaces, addresses and links set inside them): some machines allow `ip netns add` but not
# `ip -n NS ...` or veth pairs.
probe() {
  ip netns add "$tag-pa" && ip netns add "$tag-pb" &&
    ip -n "$tag-pb" link add br0 type bridge &&
    ip link add eth0 netns "$tag-pa" type veth peer name pv netns "$tag-pb" &&
    ip -n "$tag-pb" link set pv master br0 up &&
    ip -n "$tag-pa" addr add 10.77.9.1/24 dev eth0 &&
    ip -n "$tag-pa" link set eth0 up && ip -n "$tag-pa" link set lo up
}
if ! probe_error=$(probe 2>&1); then
  ip netns del "$tag-pa" 2>/dev/null || true
  ip netns del "$tag-pb" 2>/dev/null || true
  echo "SKIP: network namespaces do not work here as the test needs them: $probe_error"
  exit $SKIP
fi
ip netns del "$tag-pa"
ip netns del "$tag-pb"

work="$(mktemp -d /tmp/parasol-netns-XXXXXX)"
hosts=(s0 s1 w0 w1)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
  sleep 0.2
  for p in "${pids[@]}"; do kill -KILL "$p" 2>/dev/null || true; done
  for h in "${hosts[@]}" sw; do ip netns del "$tag-$h" 2>/dev/null || true; done
  rm -rf "$work"
}
trap cleanup EXIT

# The switch, and one host per role, each with its own address.
ip netns add "$tag-sw"
ip -n "$tag-sw" link add br0 type bridge
ip -n "$tag-sw" link set br0 up
i=1
for h in "${hosts[@]}"; do
  ip netns add "$tag-$h"
  ip link add eth0 netns "$tag-$h" type veth peer name "$h" netns "$tag-sw"
  ip -n "$tag-sw" link set "$h" master br0 up
  ip -n "$tag-$h" addr add "10.77.0.$i/24" dev eth0
  ip -n "$tag-$h" link set eth0 up
  ip -n "$tag-$h" link set lo up
  i=$((i + 1))
done

"$PARASOL" gen-data --rows "$ROWS" --seed 1 --out "$work/train.tsv" >/dev/null
"$PARASOL" gen-data --rows 8000 --seed 2 --out "$work/eval.tsv" >/dev/null
# Shards reachable from other hosts run with CURVE keys (without them a shard bound to a
# non-loopback address refuses to start).
"$PARASOL" keygen --out "$work/keys" --name server --count 2 >/dev/null
"$PARASOL" keygen --out "$work/keys" --name client >/dev/null
write_manifest() {  # NAME [PROGRESS_EVERY]
  cat > "$work/$1.yaml" <<YAML
job: {name: netns, seed: 7}
cluster:
  servers: [10.77.0.1:7100, 10.77.0.2:7100]
  workers: 2
  worker_hosts: [10.77.0.3, 10.77.0.4]
  bind: listed            # each server binds the address listed for it
  connect_timeout: 30s
  request_timeout: 1s     # resend quickly across the partition
  request_retries: 60
training: {consistency: bsp, batch_size: 256, epochs: 1, progress_every: ${2:-1h}}
model:
  kind: dlrm
  embedding_dim: 16
  bottom: [64, 16]
  top: [64, 1]
  sparse_optimizer: {kind: adagrad, lr: 0.05, eps: 1e-8}
  dense_optimizer: {kind: adam, lr: 0.001}
data:
  train: $work/train.tsv
  eval: $work/eval.tsv
checkpoint: {dir: $work/$1-ckpt}   # the servers' last checkpoint, on SIGTERM, holds the model
security:
  curve: true
  server_keys: [$work/keys/server0, $work/keys/server1]
  client_key: $work/keys/client
  allowed_clients: [$work/keys/client.pub]
YAML
}

# Runs the job NAME to the end on the four hosts; with CUT=1, worker host 1's link is cut for
# 5 s in the middle of training.
run_job() {  # NAME CUT KILL
  local name="$1" cut="$2" kill_one="${3:-0}"
  # A run that kills worker 1 has it print its progress every 100 ms: the kill comes at its
  # first progress line, so from the worker's own progress, not from a guess of how long it
  # trains (one second was past the end of its share on a fast machine).
  write_manifest "$name" "$([ "$kill_one" -eq 1 ] && echo 100ms || echo 1h)"
  local server_pids=() worker_pids=() r
  for r in 0 1; do
    ip netns exec "$tag-s$r" "$PARASOL" server --manifest "$work/$name.yaml" --rank "$r" \
      > "$work/$name-server$r.log" 2>&1 &
    server_pids+=($!)
    pids+=($!)
  done
  for r in 0 1; do
    ip netns exec "$tag-w$r" timeout 300 "$PARASOL" worker --manifest "$work/$name.yaml" \
      --rank "$r" --summary "$work/$name-worker$r.json" > "$work/$name-worker$r.log" 2>&1 &
    worker_pids+=($!)
    pids+=($!)
  done
  if [ "$cut" -eq 1 ]; then
    sleep 1
    echo "cutting the link of worker host 10.77.0.4 for 5 s"
    ip -n "$tag-sw" link set w1 down
    sleep 5
    ip -n "$tag-sw" link set w1 up
    echo "link restored"
  fi
  if [ "$kill_one" -eq 1 ]; then
    # Worker 1 dies (kill -9) and is started again by hand on its host, as a person or a
    # scheduler would: it continues from the clock the shards know it at.
    local t
    for t in $(seq 1 600); do  # a minute at most
      grep -q "worker 1: step [1-9]" "$work/$name-worker1.log" 2>/dev/null && break
      kill -0 "${worker_pids[1]}" 2>/dev/null || break
      sleep 0.1
    done
    local victim=""
    for p in /proc/[0-9]*; do
      case "$(tr '\0' ' ' 2>/dev/null < "$p/cmdline")" in
        *"$PARASOL worker --manifest $work/$name.yaml --rank 1 "*) victim="${p#/proc/}" ;;
      esac
    done
    if [ -n "$victim" ] && ! kill -KILL "$victim" 2>/dev/null; then
      victim=""  # it ended between the search and the kill
    fi
    if [ -n "$victim" ]; then
      { grep -o "worker 1: step [0-9]*" "$work/$name-worker1.log" || echo "no step yet"; } |
        tail -n 1 | sed 's/^/killed at its progress line: /'
      wait "${worker_pids[1]}" 2>/dev/null || true
      echo "killed worker 1 (pid $victim); starting it again on 10.77.0.4"
      ip netns exec "$tag-w1" timeout 300 "$PARASOL" worker --manifest "$work/$name.yaml" \
        --rank 1 --summary "$work/$name-worker1.json" >> "$work/$name-worker1.log" 2>&1 &
      worker_pids[1]=$!
      pids+=($!)
    else
      echo "FAIL: worker 1 had finished before it could be killed (its log:)"
      tail -n 5 "$work/$name-worker1.log"
      exit 1
    fi
  fi
  local failed=0
  for r in 0 1; do
    if ! wait "${worker_pids[$r]}"; then
      echo "FAIL: $name: worker $r (host 10.77.0.$((r + 3))) failed:"
      tail -20 "$work/$name-worker$r.log"
      failed=1
    fi
  done
  # Stop the servers: each logs its counters and writes its last checkpoint as it stops.
  for p in "${server_pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
  for p in "${server_pids[@]}"; do wait "$p" 2>/dev/null || true; done
  for r in 0 1; do
    if ! grep -q "serving on tcp://10.77.0.$((r + 1)):7100" "$work/$name-server$r.log"; then
      echo "FAIL: $name: server $r did not serve on its own host's address"
      cat "$work/$name-server$r.log"
      failed=1
    fi
  done
  [ "$failed" -eq 0 ] || exit 1
  # The counters checked below are those of a run without a killed worker (a restarted worker's
  # summary counts its own samples and pushes only).
  if [ "$kill_one" -eq 0 ]; then
    for r in 0 1; do
      cp "$work/$name-worker$r.json" "$work/worker$r.json"
      cp "$work/$name-server$r.log" "$work/server$r.log"
    done
  fi
}

if [ "$PARTITION" -eq 1 ]; then
  # The same job undisturbed first: the partitioned run must end with its model, value for value.
  run_job calm 0
  "$PARASOL" export --manifest "$work/calm.yaml" --out "$work/calm-model" >/dev/null
  run_job cut 1
  "$PARASOL" export --manifest "$work/cut.yaml" --out "$work/cut-model" >/dev/null
  if ! diff_json="$("$PARASOL" compare-models --manifest "$work/cut.yaml" "$work/cut-model" "$work/calm-model")"; then
    echo "FAIL: the partitioned run's model differs from the undisturbed run's: $diff_json"
    exit 1
  fi
  echo "final model equal to the undisturbed run's: $diff_json"
  run_job killed 0 1
  "$PARASOL" export --manifest "$work/killed.yaml" --out "$work/killed-model" >/dev/null
  if ! diff_json="$("$PARASOL" compare-models --manifest "$work/killed.yaml" "$work/killed-model" "$work/calm-model")"; then
    echo "FAIL: with worker 1 killed and started again by hand, the model differs: $diff_json"
    exit 1
  fi
  echo "worker 1 killed and started again by hand: final model equal to the undisturbed run's"
else
  run_job job 0
fi

auc="$(sed -n 's/.*"eval_auc": \([0-9.]*\).*/\1/p' "$work/worker0.json")"
samples=0
for r in 0 1; do
  n="$(sed -n 's/.*"train_samples": \([0-9]*\).*/\1/p' "$work/worker$r.json")"
  samples=$((samples + n))
done
echo "multi-host job: 2 server hosts, 2 worker hosts, $samples samples trained, eval AUC $auc"
if [ "$samples" -ne "$ROWS" ]; then
  echo "FAIL: the workers trained $samples samples, expected $ROWS"
  exit 1
fi
# Exactly once: pushes applied by the shards == pushes the workers had acknowledged.
acked=0
for r in 0 1; do
  acked=$((acked + $(sed -n 's/.*"pushes": \([0-9]*\).*/\1/p' "$work/worker$r.json")))
done
applied=0
duplicates=0
for r in 0 1; do
  line="$(grep 'stopping: ' "$work/server$r.log" | tail -1)"
  ps="$(echo "$line" | sed -n 's/.*"PushSparse":\([0-9]*\).*/\1/p')"
  pd="$(echo "$line" | sed -n 's/.*"PushDense":\([0-9]*\).*/\1/p')"
  dup="$(echo "$line" | sed -n 's/.*"duplicate_pushes":\([0-9]*\).*/\1/p')"
  applied=$((applied + ps + pd - dup))
  duplicates=$((duplicates + dup))
done
echo "pushes acknowledged by the workers: $acked, applied by the shards: $applied, resends refused as duplicates: $duplicates"
if [ "$applied" -ne "$acked" ]; then
  echo "FAIL: the shards applied $applied pushes, the workers had $acked acknowledged"
  exit 1
fi
if ! awk -v a="$auc" 'BEGIN { exit !(a > 0.70) }'; then
  echo "FAIL: eval AUC $auc is not above 0.70"
  exit 1
fi
echo "PASS"
