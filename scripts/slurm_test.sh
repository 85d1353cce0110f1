#!/usr/bin/env bash
# Real-Slurm test: a single-host Slurm cluster (munged, slurmctld and four slurmd, nodes n1-n4
# at the loopback addresses 127.0.0.2-5, each slurmd on its own port) runs the job that
# `parasol render slurm` writes for dlrm-small (2 servers, 2 workers, checkpoints), submitted
# unmodified with sbatch. Checks: the job ends COMPLETED; its output has the eval figures; each
# shard wrote its final checkpoint on the shutdown and logged a clean stop (with a real clock);
# the checkpoints are where the manifest says (not in the submit directory); the job's folder
# is gone. Then, with --kill-node, a second job whose shard 0 node's slurmd and shard are
# killed (kill -9) mid-training: it must end FAILED or NODE_FAIL, no worker may report finishing,
# and its output must name the shard that went away. Needs root and Slurm (slurm-wlm, munge); exits 77 (skipped) otherwise. Stops every
# daemon it started, by PID, however it ends.
#   scripts/slurm_test.sh [path/to/parasol] [--kill-node]
set -euo pipefail

PARASOL="$(realpath "${1:-$(dirname "$0")/../build/parasol}")"
KILL_NODE=0
[ "${2:-}" = "--kill-node" ] && KILL_NODE=1
SKIP=77
if [ "$(id -u)" -ne 0 ]; then
  echo "SKIP: the Slurm test runs Slurm's daemons, which needs root"
  exit $SKIP
fi
for tool in munged slurmctld slurmd sbatch scontrol squeue sinfo; do
  if ! command -v "$tool" >/dev/null 2>&1; then
    echo "SKIP: $tool is not installed (Debian packages slurm-wlm and munge)"
    exit $SKIP
  fi
done

work="$(mktemp -d /tmp/parasol-slurm-XXXXXX)"
chmod 700 "$work"
pids=()
cleanup() {
  local rc=$?
  for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
  sleep 0.5
  for p in "${pids[@]}"; do kill -KILL "$p" 2>/dev/null || true; done
  # What the jobs left behind (a killed node's slurmd leaves its steps running): every process
  # that inherited this cluster's SLURM_CONF (slurmstepd, batch scripts, srun, parasol), not
  # this script or its parent.
  for p in $(ls /proc | grep -E '^[0-9]+$'); do
    [ "$p" = $$ ] || [ "$p" = "$PPID" ] && continue
    if tr '\0' '\n' <"/proc/$p/environ" 2>/dev/null | grep -qxF "SLURM_CONF=$work/slurm.conf"; then
      kill -KILL "$p" 2>/dev/null || true
    fi
  done
  if [ "$rc" -ne 0 ] && [ "$rc" -ne $SKIP ]; then
    for f in "$work"/*.log "$work"/submit/*.out; do
      [ -f "$f" ] || continue
      echo "--- $f (last lines)"
      tail -25 "$f"
    done
  fi
  rm -rf "$work"
}
trap cleanup EXIT
fail() {
  echo "FAIL: $*"
  exit 1
}

# Ports: the controller's and one per slurmd, from a range no other test uses.
# Below the kernel's ephemeral range (32768-), where other tests pick their ports; each run
# takes 12 ports from its base.
base=$((21000 + ($$ % 900) * 12))
ctld_port=$base

export SLURM_CONF="$work/slurm.conf"
dd if=/dev/urandom of="$work/munge.key" bs=1024 count=1 status=none
chmod 400 "$work/munge.key"
mkdir -p "$work/state" "$work/submit" "$work"/spool/n{1,2,3,4}
{
  echo "ClusterName=parasoltest"
  echo "SlurmctldHost=localhost(127.0.0.1)"
  echo "SlurmctldPort=$ctld_port"
  echo "SlurmUser=root"
  echo "SlurmdUser=root"
  echo "AuthType=auth/munge"
  echo "CredType=cred/munge"
  echo "AuthInfo=socket=$work/munge.socket"
  echo "StateSaveLocation=$work/state"
  echo "SlurmdSpoolDir=$work/spool/%n"
  echo "SlurmctldPidFile=$work/slurmctld.pid"
  echo "SlurmdPidFile=$work/slurmd-%n.pid"
  echo "SlurmctldLogFile=$work/slurmctld.log"
  echo "SlurmdLogFile=$work/slurmd-%n.log"
  echo "ProctrackType=proctrack/linuxproc"
  echo "TaskPlugin=task/none"
  echo "JobAcctGatherType=jobacct_gather/none"
  echo "AccountingStorageType=accounting_storage/none"
  echo "JobCompType=jobcomp/none"
  echo "SelectType=select/cons_tres"
  echo "SelectTypeParameters=CR_CPU"
  echo "SchedulerType=sched/backfill"
  # The rendered job, a heterogeneous one (servers and workers), started only at a backfill
  # cycle, every 30 s by default (each job waited about 30 s): every second here.
  echo "SchedulerParameters=bf_interval=1"
  echo "MpiDefault=none"
  echo "ReturnToService=2"
  echo "SlurmdParameters=config_overrides"
  echo "MinJobAge=3600"
  echo "SlurmdTimeout=10"
  echo "KillWait=5"
  echo "InactiveLimit=0"
  echo "PropagateResourceLimits=NONE"
  for i in 1 2 3 4; do
    echo "NodeName=n$i NodeAddr=127.0.0.$((i + 1)) Port=$((base + i)) CPUs=2 RealMemory=2048 State=UNKNOWN"
  done
  echo "PartitionName=test Nodes=n[1-4] Default=YES MaxTime=INFINITE State=UP"
} >"$SLURM_CONF"

munged --foreground --force --socket="$work/munge.socket" --key-file="$work/munge.key" \
  --pid-file="$work/munged.pid" --log-file="$work/munged.log" --seed-file="$work/munged.seed" \
  >"$work/munged.out" 2>&1 &
pids+=($!)
for _ in $(seq 50); do [ -S "$work/munge.socket" ] && break; sleep 0.1; done
[ -S "$work/munge.socket" ] || fail "munged did not start"
slurmctld -D -i -f "$SLURM_CONF" >"$work/slurmctld.out" 2>&1 &
pids+=($!)
declare -A slurmd_pid
for i in 1 2 3 4; do
  slurmd -D -N "n$i" -f "$SLURM_CONF" >"$work/slurmd-n$i.out" 2>&1 &
  slurmd_pid[n$i]=$!
  pids+=($!)
done
# Bounded: the four nodes idle within 60 s.
idle=0
for _ in $(seq 120); do
  idle=$(sinfo -h -N -o '%T' 2>/dev/null | grep -c '^idle' || true)
  [ "$idle" -eq 4 ] && break
  sleep 0.5
done
[ "$idle" -eq 4 ] || fail "only $idle of 4 Slurm nodes came up ($(sinfo -h -N -o '%N %T' | tr '\n' ' '))"
echo "slurm: controller on port $ctld_port, nodes $(sinfo -h -N -o '%N' | tr '\n' ' ')"

"$PARASOL" gen-data --rows 40000 --seed 1 --out "$work/train.tsv" >/dev/null
"$PARASOL" gen-data --rows 8000 --seed 2 --out "$work/eval.tsv" >/dev/null

# The user's manifest: relative paths (from its folder), ports of its own.
manifest() {  # NAME EPOCHS
  cat >"$work/$1.yaml" <<EOF
job: {name: $1, seed: 3}
cluster:
  servers: [n1:$((base + 10)), n2:$((base + 11))]
  workers: 2
  connect_timeout: 20s
  request_timeout: 2s
  request_retries: 2
training: {consistency: bsp, batch_size: 256, epochs: $2, worker_timeout: 10s}
model: {kind: dlrm, embedding_dim: 8, bottom: [16, 8], top: [16, 1]}
data: {train: train.tsv, eval: eval.tsv}
checkpoint: {dir: $1-checkpoints, every_seconds: 2}
EOF
}

# Renders the job as a user would; submits it unmodified from the submit directory (prints the
# job id).
render() {  # NAME [more render options]
  local name=$1
  shift
  "$PARASOL" render slurm "$work/$name.yaml" --binary "$PARASOL" --server-cpus 1 --worker-cpus 1 \
    --server-memory 256Mi --worker-memory 0.25Gi --time 10 --output "$name-%j.out" \
    --sbatch "--comment=parasol-test" "$@" >"$work/$name.sbatch"
}
submit() {  # NAME
  (cd "$work/submit" && sbatch --parsable "$work/$1.sbatch")
}
wait_job() {  # ID SECONDS
  for _ in $(seq $(($2 * 2))); do
    squeue -h -j "$1" 2>/dev/null | grep -q . || return 0
    sleep 0.5
  done
  fail "job $1 still listed after $2 s: $(squeue -h -j "$1")"
}
state_of() { scontrol show job "$1" | grep -o 'JobState=[A-Z_]*' | head -1 | cut -d= -f2; }

# --- A clean run ------------------------------------------------------------------------------
# The clean run puts both shards on one node (--servers-per-node 2: ports of their own); the
# run that loses a node below has one shard per node.
manifest clean 1
render clean --servers-per-node 2
grep -q -- '--nodes=1 --ntasks=2 --ntasks-per-node=2' "$work/clean.sbatch" ||
  fail "the servers' component is not one node of two shards"
grep -q -- '--mem=512M' "$work/clean.sbatch" || fail "server memory not 2 x 256M for the node"
grep -q -- '--mem=256M' <(grep -A3 hetjob "$work/clean.sbatch") || fail "worker memory 0.25Gi not 256M"
job=$(submit clean)
echo "slurm: submitted job $job"
wait_job "$job" 300
state=$(state_of "$job")
out="$work/submit/clean-$job.out"
[ -f "$out" ] || fail "no output file $out"
[ "$state" = COMPLETED ] || { cat "$out"; fail "job $job ended $state, not COMPLETED"; }
grep -E 'eval over [0-9]+ samples: logloss [0-9.]+, AUC 0\.[0-9]+' "$out" ||
  fail "no eval figures in the job's output"
for r in 0 1; do
  grep -E "shard $r: checkpoint .*\(on shutdown\) at clock [0-9]+:" "$out" ||
    fail "shard $r wrote no final checkpoint on the shutdown"
  grep -E "shard $r stopping: \{" "$out" >/dev/null || fail "shard $r logged no clean stop"
  ls "$work/clean-checkpoints/shard-$r/"* >/dev/null 2>&1 ||
    fail "no checkpoint of shard $r in $work/clean-checkpoints"
done
if grep -q 'at clock 9223372036854775807' "$out"; then fail "a log line has the clock INT64_MAX"; fi
[ ! -e "$work/submit/clean-checkpoints" ] || fail "checkpoints landed in the submit directory"
if ls -d "$work"/submit/parasol-* 2>/dev/null; then fail "the job's folder was left behind"; fi
echo "slurm: job $job COMPLETED; eval, final checkpoints and clean stops found"

# --- A server node lost mid-job ---------------------------------------------------------------
if [ "$KILL_NODE" -eq 1 ]; then
  manifest lost 40
  render lost
  job=$(submit lost)
  out="$work/submit/lost-$job.out"
  echo "slurm: submitted job $job (its first server node will be killed)"
  # Bounded: training is under way (shard 0 checkpointed a clock past 0).
  for _ in $(seq 240); do
    grep -qE 'shard 0: checkpoint .* at clock [1-9]' "$out" 2>/dev/null && break
    sleep 0.5
  done
  grep -E 'shard 0: checkpoint .* at clock [1-9]' "$out" || fail "job $job never got training"
  # The node of shard 0 goes away: its slurmd and the shard.
  shard0=$(pgrep -f -- "server --manifest $work/submit/parasol-lost-$job/manifest.yaml --rank 0$" |
    head -1 || true)
  [ -n "$shard0" ] || fail "no shard 0 process"
  node=$(tr '\0' '\n' <"/proc/$shard0/environ" | grep '^SLURMD_NODENAME=' | cut -d= -f2)
  [ -n "${slurmd_pid[$node]:-}" ] || fail "shard 0 runs on '$node', not a node of this cluster"
  echo "slurm: killing node $node (its slurmd and shard 0)"
  kill -KILL "${slurmd_pid[$node]}"
  for i in "${!pids[@]}"; do [ "${pids[$i]}" = "${slurmd_pid[$node]}" ] && unset 'pids[i]'; done
  kill -KILL "$shard0"
  # The workers fail naming the shard; the job ends FAILED (the batch script ends first) or
  # NODE_FAIL (the controller declares the node down after SlurmdTimeout, 10 s here, first).
  wait_job "$job" 300
  state=$(state_of "$job")
  case "$state" in
    FAILED | NODE_FAIL) ;;
    *) cat "$out"; fail "job $job ended $state, not FAILED or NODE_FAIL" ;;
  esac
  grep -E 'shard 0 at [0-9.]+:[0-9]+ did not answer' "$out" | head -2 ||
    fail "the output does not name shard 0"
  if grep -E 'worker [01]: [0-9]+ steps' "$out"; then fail "a worker reported finishing"; fi
  echo "slurm: job $job ended $state and named the lost shard"
fi
echo "PASS"
