#!/usr/bin/env bash
# Chaos harness: the promise that whatever process dies, whenever, the job completes and no
# acknowledged update is lost or applied twice.
#
# Trains dlrm-small on generated data (2 servers, 2 workers, checkpoints every second,
# cluster.restart_servers and restart_workers) once undisturbed, then R times while sending
# kill -9 to K randomly chosen servers or workers at random moments (about a third of the
# server kills wait until that shard is writing a checkpoint). Each run's final model (from
# `parasol export`) is compared with the undisturbed one: under BSP it must be equal value for
# value; with --consistency ssp the eval AUC must be within 0.005 of the undisturbed run's.
# Kills come one at a time: the next is sent once the killed process is running again (a
# restarted shard once it has its replays), after a drawn pause; with --overlap they do not.
# Every run must make the K kills asked for: a run that made fewer fails, saying how many.
#
#   scripts/chaos.sh [--runs R] [--kills K] [--json FILE] [--seed S (0: from the clock)] [--rows N]
#                    [--batch B] [--consistency bsp|ssp] [--parasol PATH] [--keep DIR]
#                    [--tiered BYTES] [--wire bf16|f16] [--prefetch-depth K] [--servers 1|2]
#                    [--vocabulary V] [--full-every N] [--min-table-rows N]
#                    [--checkpoint-dtype bf16] [--workers 2|3|4] [--overlap] [--together]
#                    [--rollback] [--kill-launcher] [--compute-threads N]
# --compute-threads N: every run's workers (the undisturbed one's too) split their kernels over N
# threads, pinned (worker.compute_threads, worker.pin_compute_threads): a restarted worker must
# give the same bits as one that never stopped.
# --workers N: the job has N workers (BSP folds a clock's sums in rank order, so any number of
# workers ends in the same bits whatever the order their pushes arrive in).
# --overlap: the next kill does not wait for the job to recover from the one before: it comes a
# drawn 0 to 1 s later, so it may land during a restarted shard's replays or while a worker
# restarts. --together: each kill sends kill -9 to a server and a worker at the same moment.
# Two failures that overlap (a worker's push log dies with it while a shard it pushed to is
# down) lose the pushes only that log held: the shards count them (lost_replays) and the job
# goes on. Such a run is reported as LOST and not failed; a model that differs with no lost
# replay counted is a failure (a silent difference).
# --rollback: the job rolls back instead (training.on_overlapping_failure: rollback, with a
# checkpoint every 20 steps besides every second): every run must end equal to the undisturbed
# one, overlapping failures included; the table counts the rollbacks the shards made.
# --kill-launcher (with --rollback): each run's first kill is of `parasol launch` itself. Every
# role dies with it (a role outliving it fails the run), and the manifest is launched again, as
# an operator would: the shards restart from their checkpoints, the new workers' logs are empty,
# and the job rolls back to a checkpoint every shard holds.
# --vocabulary V: the generated data's largest field has V ids (gen-data --vocabulary), so the
# embedding table grows far larger than the data's rows; --min-table-rows N: the undisturbed
# run's table must end with at least N rows (over its shards), or the harness fails, saying so.
# --full-every N: checkpoints are incremental (checkpoint.full_every), so kills land on deltas
# and restarts load chains.
# --checkpoint-dtype bf16: every run writes its sparse rows' values and state as bf16
# (checkpoint.dtype), so a restarted shard goes on from rounded rows: its final model is no
# longer the undisturbed one value for value, and the run is judged as an ssp run is (eval AUC
# within 0.005 of the undisturbed run's, which never restores); the table shows what it costs.
# --wire: every run (the undisturbed one too) sends values in 16 bits (wire.compression), so
# replays after a kill resend compressed pushes; under BSP the models must still be equal.
# --tiered BYTES: the embedding table is tiered (model.sparse_storage) with that memory budget
# per shard, so rows cross between memory and disk throughout, kills included; the undisturbed
# run keeps it in memory, so each run is also compared with a memory table.
# --prefetch-depth K (with --consistency ssp, staleness 2: K is 1 or 2): workers pull rows K
# steps ahead (training.prefetch_depth), so kills land with prefetches in flight.
# --servers 1: the job has one shard (its workers send each step's tick right behind its
# pushes, before they are acknowledged); the kills pick that server or a worker.
# --reshard: the job lists 3 shards and starts on 2 (cluster.initial_servers); in every run but
# the undisturbed one, `parasol scale --servers 3` and later `--servers 2` change its shard count
# while it trains (rows copied ahead, then at the change's clock), and the kills land while a
# change is under way: on any of the 3 shards, a worker, or the scale tool itself (then run
# again, which finishes the change). Each run must complete both changes and end with the
# undisturbed (2-shard) model, value for value.
# Prints one line per kill (seed, moment, victim) and a table; exits 1 when a run failed.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
RUNS=5
KILLS=2
JSON=""
SEED=1
ROWS=""  # default: sized to the kills (below)
BATCH=64
CONSISTENCY=bsp
PARASOL="${PARASOL:-}"
KEEP=""
TIERED=""
WIRE=""
PREFETCH_DEPTH=""
RESHARD=""
SERVERS=2
VOCABULARY=2000000
FULL_EVERY=1
CKPT_DTYPE=""
MIN_TABLE_ROWS=0
WORKERS=2
OVERLAP=""
TOGETHER=""
ROLLBACK=""
KILL_LAUNCHER=""
COMPUTE_THREADS=""
while [ $# -gt 0 ]; do
  case "$1" in
    --runs) RUNS="$2"; shift 2 ;;
    --kills) KILLS="$2"; shift 2 ;;
    --json) JSON="$2"; shift 2 ;;
    --seed) SEED="$2"; shift 2 ;;
    --rows) ROWS="$2"; shift 2 ;;
    --batch) BATCH="$2"; shift 2 ;;
    --consistency) CONSISTENCY="$2"; shift 2 ;;
    --parasol) PARASOL="$2"; shift 2 ;;
    --keep) KEEP="$2"; shift 2 ;;
    --tiered) TIERED="$2"; shift 2 ;;
    --wire) WIRE="$2"; shift 2 ;;
    --prefetch-depth) PREFETCH_DEPTH="$2"; shift 2 ;;
    --servers) SERVERS="$2"; shift 2 ;;
    --reshard) RESHARD=1; shift ;;
    --vocabulary) VOCABULARY="$2"; shift 2 ;;
    --full-every) FULL_EVERY="$2"; shift 2 ;;
    --checkpoint-dtype) CKPT_DTYPE="$2"; shift 2 ;;
    --min-table-rows) MIN_TABLE_ROWS="$2"; shift 2 ;;
    --workers) WORKERS="$2"; shift 2 ;;
    --overlap) OVERLAP=1; shift ;;
    --compute-threads) COMPUTE_THREADS="$2"; shift 2 ;;
    --together) TOGETHER=1; shift ;;
    --rollback) ROLLBACK=1; shift ;;
    --kill-launcher) KILL_LAUNCHER=1; shift ;;
    *) echo "chaos.sh: unknown argument '$1'" >&2; exit 2 ;;
  esac
done
# The job must last long enough for the kills and their recoveries: 90,000 rows a kill, at
# least 120,000 (5 kills: 450,000 rows; 300,000 left a 5th kill no time in 1 run of 3).
if [ -z "$ROWS" ]; then ROWS=$(( KILLS * 90000 > 120000 ? KILLS * 90000 : 120000 )); fi
# Seed 0: one drawn from the clock (printed, so a failing run can be repeated).
if [ "$SEED" = 0 ]; then SEED=$(( $(date +%s%N) % 1000000 + 1 )); fi
case "$CONSISTENCY" in bsp|ssp) ;; *) echo "chaos.sh: --consistency bsp or ssp" >&2; exit 2 ;; esac
case "$WIRE" in ""|bf16|f16) ;; *) echo "chaos.sh: --wire bf16 or f16" >&2; exit 2 ;; esac
case "$CKPT_DTYPE" in ""|bf16) ;; *) echo "chaos.sh: --checkpoint-dtype bf16" >&2; exit 2 ;; esac
case "$WORKERS" in 2|3|4) ;; *) echo "chaos.sh: --workers 2, 3 or 4" >&2; exit 2 ;; esac
if [ -n "$ROLLBACK" ] && { [ "$CONSISTENCY" != bsp ] || [ -n "$RESHARD" ]; }; then
  echo "chaos.sh: --rollback is for bsp runs without --reshard" >&2
  exit 2
fi
if [ -n "$KILL_LAUNCHER" ] && { [ -z "$ROLLBACK" ] || [ -n "$RESHARD$TOGETHER" ]; }; then
  echo "chaos.sh: --kill-launcher needs --rollback (every process dies: only a rollback keeps" \
    "the updates the workers' logs held), without --reshard or --together" >&2
  exit 2
fi
if [ -n "$RESHARD" ] && [ -n "$OVERLAP$TOGETHER" ]; then
  echo "chaos.sh: --reshard draws its own kills; --overlap and --together are not for it" >&2
  exit 2
fi
case "$SERVERS,$RESHARD" in
  1,|2,|2,*) ;;
  *) echo "chaos.sh: --servers 1 or 2 (2 with --reshard)" >&2; exit 2 ;;
esac
case "$CONSISTENCY,$PREFETCH_DEPTH" in
  *,|ssp,1|ssp,2) ;;
  *) echo "chaos.sh: --prefetch-depth 1 or 2, with --consistency ssp" >&2; exit 2 ;;
esac
if [ -z "$PARASOL" ]; then
  source "$ROOT/scripts/lib.sh"
  parasol_install_deps
  parasol_build Release
  PARASOL="$PARASOL_BUILD/parasol"
fi
PARASOL="$(realpath "$PARASOL")"

work="$(mktemp -d /tmp/parasol-chaos-XXXXXX)"
launch_pid=""
cleanup() {
  if [ -n "$launch_pid" ]; then kill -TERM "$launch_pid" 2>/dev/null || true; fi
  # Anything of ours still running (a role of an aborted run).
  for pid in $(find_pids "$work/"); do kill -KILL "$pid" 2>/dev/null || true; done
  if [ -n "$KEEP" ]; then mkdir -p "$KEEP" && cp -r "$work"/. "$KEEP"/ 2>/dev/null || true; fi
  rm -rf "$work"
}
trap cleanup EXIT

now() { date +%s.%N; }
# Pids of the processes whose command line contains every argument, as a list.
find_pids() {
  # Without a process per /proc entry: a scan must stay quick while the machine is loaded (a
  # kill's victims are searched for again and again until both run).
  local p cmd needle ok args
  for p in /proc/[0-9]*; do
    args=()
    { mapfile -d '' -t args < "$p/cmdline"; } 2>/dev/null || continue
    cmd="${args[*]}"
    [ -n "$cmd" ] || continue
    ok=1
    for needle in "$@"; do
      case "$cmd" in *"$needle"*) ;; *) ok=0; break ;; esac
    done
    [ "$ok" -eq 1 ] && echo "${p#/proc/}"
  done
  return 0
}
# The pid of a role (server 0, worker 1, ...) of the job with manifest $1, or nothing.
# The first one found: a shard's checkpoint child has its parent's command line. Without a pipe
# into head, whose early exit would end the search with SIGPIPE, which (pipefail, set -e) ended
# the whole script where a caller assigns the pid.
role_pid() {
  local pids
  pids="$(find_pids "$PARASOL $2 --manifest $1 --rank $3")"
  echo "${pids%%$'\n'*}"
}
# A TCP port nothing listens on, below the kernel's range for outgoing connections' local ports
# (a port picked inside it could be taken by any connection before the shard binds it).
ephemeral_low="$(awk '{print $1}' /proc/sys/net/ipv4/ip_local_port_range 2>/dev/null || echo 32768)"
[ "${ephemeral_low:-0}" -gt 12000 ] 2>/dev/null || ephemeral_low=32768
free_port() {
  local port
  for _ in $(seq 1 200); do
    port=$((10000 + RANDOM % (ephemeral_low - 10000)))
    if ! (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then echo "$port"; return; fi
  done
  echo "chaos.sh: no free port" >&2
  exit 1
}

"$PARASOL" gen-data --rows "$ROWS" --seed 1 --vocabulary "$VOCABULARY" \
  --out "$work/train.tsv" >/dev/null
"$PARASOL" gen-data --rows 20000 --seed 2 --vocabulary "$VOCABULARY" \
  --out "$work/eval.tsv" >/dev/null

write_manifest() {  # NAME
  local p0 p1 p2 servers
  p0="$(free_port)"
  p1="$(free_port)"
  while [ "$p1" = "$p0" ]; do p1="$(free_port)"; done
  servers="[127.0.0.1:$p0, 127.0.0.1:$p1]"
  [ "$SERVERS" = 1 ] && servers="[127.0.0.1:$p0]"
  if [ -n "$RESHARD" ]; then
    p2="$(free_port)"
    while [ "$p2" = "$p0" ] || [ "$p2" = "$p1" ]; do p2="$(free_port)"; done
    servers="[127.0.0.1:$p0, 127.0.0.1:$p1, 127.0.0.1:$p2]
  initial_servers: 2"
  fi
  local consistency="$CONSISTENCY"
  [ "$CONSISTENCY" = ssp ] && consistency="ssp, staleness: 2"
  [ -n "$PREFETCH_DEPTH" ] && consistency="$consistency, prefetch_depth: $PREFETCH_DEPTH"
  local storage="" server=""
  # The undisturbed run keeps its table in memory: the tiered runs must end equal to it.
  if [ -n "$TIERED" ] && [ "$1" != ref ]; then
    storage=", sparse_storage: tiered"
    server="server: {memory_budget: $TIERED, disk_dir: $work/$1-disk}"
  fi
  cat > "$work/$1.yaml" <<YAML
job: {name: chaos, seed: 11}
cluster:
  servers: $servers
  workers: $WORKERS
  request_timeout: 1s
  request_retries: 60
  restart_servers: true
  restart_workers: true
training: {consistency: $consistency, batch_size: $BATCH, epochs: 1, worker_timeout: 120s, progress_every: 1s${ROLLBACK:+, on_overlapping_failure: rollback}}
model: {kind: dlrm, embedding_dim: 8, bottom: [32, 8], top: [32, 16, 1]$storage}
data: {train: $work/train.tsv, eval: $work/eval.tsv}
checkpoint: {dir: $work/$1-ckpt, every_seconds: 1${ROLLBACK:+, every_steps: 20}, keep: 3, full_every: $FULL_EVERY${CKPT_DTYPE:+, dtype: $CKPT_DTYPE}}
$server
${WIRE:+wire: {compression: $WIRE\}}
${COMPUTE_THREADS:+worker: {compute_threads: $COMPUTE_THREADS, pin_compute_threads: true\}}
YAML
}

# The pids of the job's workers running now (M: its manifest), space-separated.
worker_pids() {  # M
  local r
  for r in $(seq 0 $((WORKERS - 1))); do role_pid "$1" worker "$r"; done | tr '\n' ' '
}
# Whether any of the pids given runs.
any_running() {
  local p
  for p in "$@"; do kill -0 "$p" 2>/dev/null && return 0; done
  return 1
}

# Sends kill -9 to ROLE RANK (server, worker, or scale: the scale tool) of the job NAME (manifest
# M, started at START) now, and (unless --overlap) waits until the job has recovered. CKPT=1: a
# server is killed as soon as it writes a checkpoint (within 3 s). Returns 2 once no worker
# trains (the job is ending: nothing to kill), 1 when the victim is not running.
# PID (optional): the victim's pid and the workers' pids, found by the caller (so that two
# kills come at the same moment, without the search between them).
kill_now() {  # NAME M START ROLE RANK CKPT [PID WORKERS]
  local name="$1" m="$2" start="$3" role="$4" rank="$5" during=0 pid="${7:-}" workers="${8:-}"
  # The killable moments: while a worker still trains (after that, a dead server is not
  # started again, which is the end of the job, not a failure).
  [ -n "$pid" ] || workers="$(worker_pids "$m")"
  if [ -z "${workers// /}" ]; then return 2; fi
  if [ -n "$pid" ]; then
    :
  elif [ "$role" = scale ]; then
    pid="$(find_pids "$PARASOL scale --manifest $m")"
    pid="${pid%%$'\n'*}"
  else
    pid="$(role_pid "$m" "$role" "$rank")"
  fi
  [ -n "$pid" ] || return 1
  if [ "$role" = server ] && [ "$6" = 1 ]; then
    # While the shard writes a checkpoint: as soon as its temporary file appears (a write
    # with fsync takes tens of milliseconds here), for up to 3 s.
    local deadline
    deadline=$(( $(date +%s) + 3 ))
    while [ "$(date +%s)" -lt "$deadline" ]; do
      if compgen -G "$work/$name-ckpt/shard-$rank/*.tmp" > /dev/null 2>&1; then
        during=1
        break
      fi
      sleep 0.002
    done
  fi
  # Still while a worker trains (the wait for a checkpoint may have outlasted the job).
  # shellcheck disable=SC2086
  any_running $workers || return 2
  # What recovery from this kill will log, counted before the kill: a restarted worker's Hello
  # can reach a shard before this function reads the log again.
  # A victim killed before it had taken part (a worker before its first Hello, a shard before
  # any worker had pushed to it) logs none of that: then the job has recovered once its workers
  # train again, two progress lines each after the kill (one could be on its way from before).
  local pattern want progress="worker $([ "$role" = worker ] && echo "$rank" || echo '[0-9]*'): step [0-9]*, " trained
  if [ "$role" = worker ]; then
    pattern="worker $rank restarted at clock"  # one line per shard
    want=$(( $(grep -c -- "$pattern" "$work/$name.log" || true) + SERVERS ))
    trained=$(( $(grep -c -- "$progress" "$work/$name.log" || true) + 2 ))
  else
    # One line per worker: its replay, or the shard's word that it had nothing to replay.
    pattern="replaying .* to shard $rank\$|shard $rank: worker [0-9]* has nothing to replay"
    want=$(( $(grep -cE -- "$pattern" "$work/$name.log" || true) + WORKERS ))
    trained=$(( $(grep -c -- "$progress" "$work/$name.log" || true) + 2 * WORKERS ))
  fi
  # Or, where the failures overlapped (--rollback): every shard rolled back (nothing is replayed
  # then; the workers connect again and redo their steps).
  local redo=": rolled back to "
  local redone=$(( $(grep -c -- "$redo" "$work/$name.log" || true) + SERVERS ))
  kill -KILL "$pid" 2>/dev/null || return 1
  local at
  at="$(awk -v a="$(now)" -v b="$start" 'BEGIN { printf "%.2f", a - b }')"
  run_kills=$((run_kills + 1))
  run_victims+="$role $rank "
  echo "  kill $run_kills: $role $rank (pid $pid) at ${at}s$([ "$during" -eq 1 ] && echo ', once its checkpoint file had appeared')" |
    tee -a "$work/kills.txt"
  [ "$role" = scale ] && return 0  # its caller runs it again
  [ -n "$OVERLAP" ] && return 0     # the next kill may come before the job has recovered
  # Wait until the job has recovered (failures come one at a time): a restarted worker has
  # said Hello to every shard (each checkpoints what the dead one had pushed); a restarted
  # shard has had both workers' replays (or the job ended, or 20 s passed).
  local t
  for t in $(seq 1 400); do
    [ "$(grep -cE -- "$pattern" "$work/$name.log" || true)" -ge "$want" ] && break
    [ "$(grep -c -- "$progress" "$work/$name.log" || true)" -ge "$trained" ] && break
    [ -n "$ROLLBACK" ] && [ "$(grep -c -- "$redo" "$work/$name.log" || true)" -ge "$redone" ] && break
    kill -0 "$launch_pid" 2>/dev/null || break
    # A shard restarted after every worker had left gets no replay: nothing to wait for.
    workers="$(worker_pids "$m")"
    [ -z "${workers// /}" ] && break
    sleep 0.05
  done
  sleep 0.3
  return 0
}

# --kill-launcher: kill -9 of the job's `parasol launch` (NAME, manifest M, started at START);
# every role dies with it, and the manifest is launched again; then waits until every shard has
# rolled back (or 20 s passed). Sets run_orphans when a role outlived its launcher.
kill_launcher() {  # NAME M START
  local name="$1" m="$2" start="$3" t at left
  kill -KILL "$launch_pid" 2>/dev/null || return 1
  wait "$launch_pid" 2>/dev/null || true
  at="$(awk -v a="$(now)" -v b="$start" 'BEGIN { printf "%.2f", a - b }')"
  run_kills=$((run_kills + 1))
  run_victims+="launch "
  echo "  kill $run_kills: launch (pid $launch_pid) at ${at}s" | tee -a "$work/kills.txt"
  for t in $(seq 1 200); do
    left="$(find_pids "$PARASOL server --manifest $m"; find_pids "$PARASOL worker --manifest $m")"
    [ -z "$left" ] && break
    sleep 0.05
  done
  if [ -n "$left" ]; then
    echo "    roles outlived their launcher: $(echo $left)"
    run_orphans=1
    kill -KILL $left 2>/dev/null || true
  fi
  local redone=$(( $(grep -c -- ": rolled back to " "$work/$name.log" || true) + SERVERS ))
  "$PARASOL" launch --manifest "$m" --summary "$work/$name.json" >> "$work/$name.log" 2>&1 &
  launch_pid=$!
  for t in $(seq 1 400); do
    [ "$(grep -c -- ": rolled back to " "$work/$name.log" || true)" -ge "$redone" ] && break
    kill -0 "$launch_pid" 2>/dev/null || break
    sleep 0.05
  done
  sleep 0.3
  return 0
}

# --reshard: the shard count goes to 3 a drawn moment after the start, and back to 2 a drawn
# moment after that. While the first try of each change runs, a victim drawn among the 3
# shards, the 2 workers and the scale tool is killed a drawn moment (0 to 150 ms) after the tool
# started, so that kills land in every phase of the change (the copy ahead, the wait for the
# clock, the copy at it, the commits, the drops). A failed or killed tool is run again, as an
# operator would (it finishes the change). Logs "scaled to N" for each change that completed.
reshard_with_kills() {  # NAME M START KILLS
  local name="$1" m="$2" start="$3" kills="$4" log="$work/$1-scale.log" target attempt rc
  # Both well before the end: a change named after the last clock is finished only while the
  # workers still talk to the shards (they carry the change to them).
  sleep "$(awk -v r="$RANDOM" -v d="$undisturbed_seconds" 'BEGIN { printf "%.2f", 0.3 + (r / 32768.0) * d * 0.15 }')"
  for target in 3 2; do
    for attempt in 1 2 3 4 5 6; do
      kill -0 "$launch_pid" 2>/dev/null || return 0
      "$PARASOL" scale --manifest "$m" --servers "$target" --timeout 60 >> "$log" 2>&1 &
      local scale_pid=$!
      if [ "$attempt" -eq 1 ] && [ "$run_kills" -lt "$kills" ]; then
        sleep "$(awk -v r="$RANDOM" 'BEGIN { printf "%.3f", (r / 32768.0) * 0.15 }')"
        local victim=$((RANDOM % (4 + WORKERS))) role rank
        if [ "$victim" -lt 3 ]; then
          role=server; rank=$victim
        elif [ "$victim" -lt $((3 + WORKERS)) ]; then
          role=worker; rank=$((victim - 3))
        else
          role=scale; rank=""
        fi
        kill_now "$name" "$m" "$start" "$role" "$rank" 0 || true
      fi
      rc=0
      wait "$scale_pid" || rc=$?
      if [ "$rc" -eq 0 ]; then
        echo "scaled to $target" >> "$log"
        break
      fi
      echo "scale to $target: attempt $attempt failed (exit $rc)" >> "$log"
      sleep 0.3
    done
    sleep "$(awk -v r="$RANDOM" -v d="$undisturbed_seconds" 'BEGIN { printf "%.2f", 0.2 + (r / 32768.0) * d * 0.1 }')"
  done
}

# Runs the job NAME to the end; with kills, sends them as it goes. Sets run_status,
# run_seconds, run_kills (how many were sent), run_changes (--reshard: the changes of the shard
# count that completed) and appends to $work/kills.txt.
run_job() {  # NAME KILLS
  local name="$1" kills="$2" m="$work/$1.yaml"
  write_manifest "$name"
  local start
  start="$(now)"
  "$PARASOL" launch --manifest "$m" --summary "$work/$name.json" > "$work/$name.log" 2>&1 &
  launch_pid=$!
  run_kills=0
  run_orphans=""
  run_victims=" "  # "server 0 worker 1 ...": the roles this run killed
  run_changes="-"
  # The kills begin once every role runs (on a loaded machine the launcher may take seconds to
  # start them; until then "no worker runs" would read as the end of the job).
  if [ "$kills" -gt 0 ]; then
    local up
    for up in $(seq 1 600); do
      [ "$(worker_pids "$m" | wc -w)" -ge "$WORKERS" ] &&
        [ -n "$(role_pid "$m" server $((SERVERS - 1)))" ] && break
      kill -0 "$launch_pid" 2>/dev/null || break
      sleep 0.05
    done
  fi
  if [ -n "$RESHARD" ] && [ "$name" != ref ]; then
    reshard_with_kills "$name" "$m" "$start" "$kills"
    run_changes="$(grep -c '^scaled to ' "$work/$name-scale.log" || true)"
  else
    local k rc tries
    for k in $(seq 1 "$kills"); do
      # A moment: a random pause after the previous kill's recovery (with --overlap, after the
      # kill itself: 0 to 1 s), within the expected run.
      local pause
      if [ -n "$OVERLAP" ]; then
        pause="$(awk -v r="$RANDOM" 'BEGIN { printf "%.2f", (r / 32768.0) }')"
      else
        # Small enough that the K kills and their recoveries fit in the job: the pauses add up
        # to at most a third of the undisturbed run.
        pause="$(awk -v r="$RANDOM" -v d="$undisturbed_seconds" -v k="$kills" \
          'BEGIN { printf "%.2f", 0.2 + (r / 32768.0) * (d * 0.33 / k) }')"
      fi
      sleep "$pause"
      kill -0 "$launch_pid" 2>/dev/null || break
      if [ -n "$KILL_LAUNCHER" ] && [ "$k" -eq 1 ]; then
        kill_launcher "$name" "$m" "$start" || break
        continue
      fi
      # A victim that is not running (restarting after an earlier kill) is drawn again, a
      # few times at most.
      if [ -n "$TOGETHER" ]; then
        # A worker and a server at the same moment: both found first (each drawn again while
        # not running), then killed one right after the other; then the wait for the
        # server's recovery, unless --overlap.
        local wrank srank wpid="" spid="" workers
        # For up to 3 s: the one killed last time may still be starting again.
        for tries in $(seq 1 30); do
          workers="$(worker_pids "$m")"
          if [ -z "$wpid" ]; then
            wrank=$((RANDOM % WORKERS))
            wpid="$(role_pid "$m" worker "$wrank")"
          fi
          if [ -z "$spid" ]; then
            srank=$((RANDOM % SERVERS))
            spid="$(role_pid "$m" server "$srank")"
          fi
          [ -n "$wpid" ] && [ -n "$spid" ] && break
          [ -z "${workers// /}" ] && break
          sleep 0.1
        done
        rc=1
        if [ -n "$wpid" ] && [ -n "$spid" ]; then
          rc=0
          OVERLAP=1 kill_now "$name" "$m" "$start" worker "$wrank" 0 "$wpid" "$workers" || rc=$?
          if [ "$rc" -eq 0 ]; then
            kill_now "$name" "$m" "$start" server "$srank" 0 "$spid" "$workers" || rc=$?
          fi
        fi
      else
        for tries in 1 2 3 4 5 6 7 8; do
          local victim=$((RANDOM % (SERVERS + WORKERS))) role rank
          if [ "$victim" -lt "$SERVERS" ]; then
            role=server; rank=$victim
          else
            role=worker; rank=$((victim - SERVERS))
          fi
          rc=0
          kill_now "$name" "$m" "$start" "$role" "$rank" "$([ $((RANDOM % 3)) -eq 0 ] && echo 1 || echo 0)" || rc=$?
          [ "$rc" -eq 1 ] || break
          sleep 0.1
        done
      fi
      [ "$rc" -eq 2 ] && break
    done
  fi
  local s=0
  wait "$launch_pid" || s=$?
  launch_pid=""
  run_status=$s
  run_seconds="$(awk -v a="$(now)" -v b="$start" 'BEGIN { printf "%.1f", a - b }')"
}

echo "chaos: ${RUNS} runs x ${KILLS} kills, ${CONSISTENCY}, ${ROWS} rows, seed ${SEED}${RESHARD:+, shard count 2 -> 3 -> 2 while it trains}"
undisturbed_seconds=10
run_job ref 0
if [ "$run_status" -ne 0 ]; then
  echo "chaos: the undisturbed run failed (exit $run_status):"
  tail -n 30 "$work/ref.log"
  exit 1
fi
undisturbed_seconds="$run_seconds"
# The embedding table's rows at the end, over the shards (their last stats lines).
table_rows="$(grep -o 'stopping: {.*' "$work/ref.log" |
  grep -o '"name":"model.embeddings","kind":"sparse","rows":[0-9]*' |
  grep -o '[0-9]*$' | awk '{ s += $1 } END { print s + 0 }')"
echo "undisturbed: the embedding table ended with $table_rows rows"
if [ "$table_rows" -lt "$MIN_TABLE_ROWS" ]; then
  echo "chaos: FAIL: the table has $table_rows rows, fewer than the $MIN_TABLE_ROWS asked for"
  exit 1
fi
"$PARASOL" export --manifest "$work/ref.yaml" --out "$work/ref-model" >/dev/null
ref_auc="$(grep -o '"eval_auc": [0-9.e-]*' "$work/ref.json" | head -n 1 | awk '{print $2}')"
echo "undisturbed: ${undisturbed_seconds}s, eval AUC ${ref_auc}"

failed=0
lost_runs=0
total_lost=0
total_rollbacks=0
total_kills=0
max_diff=0
rows=()
for r in $(seq 1 "$RUNS"); do
  RANDOM=$((SEED * 1000 + r))
  echo "run $r (seed $((SEED * 1000 + r))):"
  run_job "run$r" "$KILLS"
  total_kills=$((total_kills + run_kills))
  result=ok
  diff="-"
  auc="-"
  # A server killed after every worker had finished (the check that a worker still trains
  # and the kill can straddle the last worker's exit): launch, with restart_servers, fails the
  # job only for a server that dies after the workers, while it stops the roles. The model is
  # then compared like any other; only that exit status is excused.
  late=""
  if [ "$run_status" -ne 0 ]; then
    late_rank="$(sed -n 's/.*launch: the job failed: server \([0-9]*\) killed by signal 9$/\1/p' \
      "$work/run$r.log")"
    summaries="$(grep -cE '^(\[worker [0-9]+\] )?worker [0-9]+: [0-9]+ steps, ' "$work/run$r.log" || true)"
    if [ -n "$late_rank" ] && [[ "$run_victims" == *" server $late_rank "* ]] &&
       [ "$summaries" -ge "$WORKERS" ]; then
      late=" (server $late_rank killed after the workers finished)"
      run_status=0
    fi
  fi
  if [ "$run_status" -ne 0 ]; then
    result="FAILED (exit $run_status)"
    tail -n 30 "$work/run$r.log" | sed 's/^/    /'
  elif ! "$PARASOL" export --manifest "$work/run$r.yaml" --out "$work/run$r-model" >/dev/null 2>"$work/run$r-export.log"; then
    result="FAILED (export)"
    sed 's/^/    /' "$work/run$r-export.log"
  else
    cmp_json="$("$PARASOL" compare-models --manifest "$work/run$r.yaml" "$work/run$r-model" "$work/ref-model" || true)"
    diff="$(echo "$cmp_json" | { grep -o '"max_relative_difference": "*[0-9a-z.e+-]*' || true; } |
      awk '{print $2}' | tr -d '"')"
    [ -n "$diff" ] || diff=1
    # A run excused for a server killed after the workers finished has no summary (launch
    # failed): its model is still compared, its AUC is unknown.
    if [ -f "$work/run$r.json" ]; then
      auc="$(grep -o '"eval_auc": [0-9.e-]*' "$work/run$r.json" | head -n 1 | awk '{print $2}')"
    fi
    [ -n "$auc" ] || auc="-"
    if [ "$diff" = inf ] || [ "$max_diff" = inf ]; then
      max_diff=inf
    else
      max_diff="$(awk -v a="$max_diff" -v b="$diff" 'BEGIN { print (b > a) ? b : a }')"
    fi
    # Replays the shards reported lost (overlapping failures: see --overlap), from their error
    # lines (a stats counter dies with a shard killed again).
    lost="$(grep -c 'restarted before its replay to this shard ended' "$work/run$r.log" || true)"
    total_lost=$((total_lost + lost))
    # Rollbacks shard 0 made (it goes first; --rollback).
    rolled="$(grep -c 'shard 0: rolled back to' "$work/run$r.log" || true)"
    total_rollbacks=$((total_rollbacks + rolled))
    if [ "$CONSISTENCY" = bsp ] && [ -z "$CKPT_DTYPE" ]; then
      if [ "$diff" = inf ] || awk -v d="$diff" 'BEGIN { exit !(d > 0) }'; then
        # Only where failures were made to overlap: one at a time, none may be lost.
        # With --rollback no loss is documented: the job rolls back instead, and must end equal.
        if [ "$lost" -gt 0 ] && [ -n "$OVERLAP$TOGETHER" ] && [ -z "$ROLLBACK" ]; then
          result="LOST"  # the documented outcome of overlapping failures, said by the shards
          lost_runs=$((lost_runs + 1))
        else
          result="DIFFERS"
        fi
        echo "    $cmp_json" | tr '\n' ' '
        echo
      fi
    else
      if [ "$auc" != - ] &&
         awk -v a="$auc" -v b="$ref_auc" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(d > 0.005) }'; then
        result="AUC OFF"
      fi
    fi
  fi
  # Every kill asked for was made (with --together, two processes each).
  want_kills=$KILLS
  [ -n "$TOGETHER" ] && want_kills=$((2 * KILLS))
  if [ "$result" = ok ] && [ -z "$RESHARD" ] && [ "$run_kills" -ne "$want_kills" ]; then
    result="FAILED (${run_kills} of ${want_kills} kills made: the job ended first, or no victim ran)"
  fi
  if [ "$result" = ok ] && [ -n "$run_orphans" ]; then
    result="FAILED (roles outlived their killed launcher)"
  fi
  if [ "$result" = ok ] && [ -n "$RESHARD" ] && [ "$run_changes" != 2 ]; then
    result="FAILED (${run_changes} of 2 shard count changes completed)"
    tail -n 20 "$work/run$r-scale.log" | sed 's/^/    /'
  fi
  [ "$result" = ok ] && result="ok$late"
  if [ "${result%%$late}" != ok ] && [ "$result" != LOST ]; then
    failed=$((failed + 1))
    kept="${TMPDIR:-/tmp}/parasol-chaos-failed-$((SEED * 1000 + r)).log"
    cp "$work/run$r.log" "$kept" && echo "    its output: $kept"
  fi
  rows+=("$(printf '%4s  %5s  %7ss  %-12s  %-8s  %-7s  %s' "$r" "$run_kills" "$run_seconds" "$diff" "$auc" "$run_changes" "$result")")
done

echo
echo " run  kills  seconds  max_rel_diff  eval_auc  changes  result"
for row in "${rows[@]}"; do echo "$row"; done
echo "total: $RUNS runs, $total_kills kills, $failed failed runs, largest relative difference $max_diff" \
  "(undisturbed: ${undisturbed_seconds}s, AUC $ref_auc)"
if [ -n "$ROLLBACK" ]; then
  echo "rollbacks: $total_rollbacks (shard 0's), $total_lost replays the shards found lost and rolled back"
fi
if [ "$lost_runs" -gt 0 ]; then
  echo "overlapping failures: $lost_runs runs ended with another model, $total_lost replays" \
    "counted as lost by the shards (documented; not failed)"
fi
if [ -n "$JSON" ]; then
  # A number, or the string "inf" (a NaN or infinity differed; JSON has no infinity).
  max_json="$max_diff"
  [ "$max_diff" = inf ] && max_json='"inf"'
  printf '{"runs": %d, "kills": %d, "failed_runs": %d, "lost_runs": %d, "lost_replays": %d, "rollbacks": %d, "max_relative_difference": %s, "consistency": "%s", "workers": %d, "prefetch_depth": %d}\n' \
    "$RUNS" "$total_kills" "$failed" "$lost_runs" "$total_lost" "$total_rollbacks" "$max_json" "$CONSISTENCY" "$WORKERS" "${PREFETCH_DEPTH:-1}" > "$JSON"
fi
[ "$failed" -eq 0 ]
