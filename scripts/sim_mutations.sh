#!/usr/bin/env bash
# Mutation checks of the deterministic simulation: each mutation below breaks one rule of the
# delivery protocol on purpose, in a copy of the source tree; the simulation must catch it
# (a seed fails) within the seeds CI runs (1..2000, without overlapping failures).
#   bash scripts/sim_mutations.sh [SEEDS] [SIM FLAGS...]     e.g. 2000 --ssp, or 2000 --asp
# Prints, per mutation, the seed that caught it and how many seeds that took; exits 1 when a
# mutation went uncaught. The replay sent in reverse order is caught by the simulation's check
# of a replay's order as it is sent (its Clocks go up one at a time): the shard itself would
# refuse for now a replayed tick that names pushes not applied yet and take them late, and the
# job would end in the same model.
set -euo pipefail
cd "$(dirname "$0")/.."
seeds=${1:-2000}
shift || true
flags=("$@")  # the jobs' mode: none (BSP), --ssp or --asp
work=$(mktemp -d)
trap 'git worktree remove --force "$work/src" >/dev/null 2>&1 || true; rm -rf "$work"' EXIT
git worktree add --detach "$work/src" HEAD >/dev/null
cmake -S "$work/src" -B "$work/build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DPARASOL_ENABLE_CUDA=OFF -DPARASOL_BUILD_PYTHON=OFF >/dev/null

# name|file|python expression that rewrites the file's text s
mutations=(
  "the push record's duplicate check removed|server/push_gate.cc|s.replace('return {Admission::kDuplicate, \"in the push record\"};', 'return {Admission::kNew, \"\"};')"
  "the replay sent in reverse order|worker/replay_sender.cc|s.replace('for (const ReplayStep& step : plan.steps) {', 'for (const ReplayStep& step : std::vector<ReplayStep>(plan.steps.rbegin(), plan.steps.rend())) {')"
  "the tick's check of the pushes it names dropped|server/shard_server.cc|s.replace('if (Status pushes = CheckTickPushes(req); !pushes.ok()) {', 'if (Status pushes = Status::Ok(); !pushes.ok()) {')"
  "a checkpoint's folder not synced after its rename (a host crash loses it)|server/checkpoint.cc|s.replace('return fs->SyncDir(ParentOf(path));', 'return Status::Ok();')"
)
uncaught=0
for m in "${mutations[@]}"; do
  IFS='|' read -r name file expr <<<"$m"
  git -C "$work/src" checkout -q -- .
  python3 - "$work/src/$file" "$expr" <<'PY'
import sys
path, expr = sys.argv[1], sys.argv[2]
s = open(path).read()
t = eval(expr, {"s": s})
if t == s:
    sys.exit("the mutation does not apply to " + path)
open(path, "w").write(t)
PY
  cmake --build "$work/build" --target parasol_sim -j2 >/dev/null
  out=$("$work/build/tests/parasol_sim" --seeds "$seeds" --no-overlap --cpu 0 --stop-at-failure "${flags[@]}" || true)
  first=$(grep -m1 '^FAIL seed' <<<"$out" || true)
  if [[ -n $first ]]; then
    seed=$(awk '{print $3}' <<<"$first")
    echo "caught: $name: at seed $seed ($((seed)) seeds): ${first#FAIL }"
  else
    echo "NOT CAUGHT: $name, in $seeds seeds"
    uncaught=$((uncaught + 1))
  fi
done
exit $((uncaught > 0))
