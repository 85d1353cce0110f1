#!/usr/bin/env bash
# The main job: builds, generates Criteo-format data, and trains dlrm-small
# (examples/criteo-dlrm.yaml) through 2 server shards and 2 workers on this machine, each a
# separate process; prints their progress and the eval figures, and plots loss, eval AUC and
# samples/s into data/plots/.
#   scripts/demo.sh [--rows N]   (training rows, default 200000; eval rows are a tenth)
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

rows=200000
if [ "${1:-}" = "--rows" ] && [ -n "${2:-}" ]; then rows="$2"; fi

PARASOL_PACKAGES+=(python3-matplotlib)  # for the plots
parasol_install_deps
parasol_build Release
mkdir -p "$PARASOL_ROOT/data"
rm -f "$PARASOL_ROOT"/data/metrics.worker*.jsonl
"$PARASOL_BUILD/parasol" gen-data --rows "$rows" --seed 1 --out "$PARASOL_ROOT/data/synthetic-train.tsv"
"$PARASOL_BUILD/parasol" gen-data --rows "$((rows / 10))" --seed 2 --out "$PARASOL_ROOT/data/synthetic-eval.tsv"
"$PARASOL_BUILD/parasol" launch "$PARASOL_ROOT/examples/criteo-dlrm.yaml" \
  --summary "$PARASOL_ROOT/data/summary.json" --metrics-log "$PARASOL_ROOT/data/metrics"
echo "summary: $(cut -c1-200 "$PARASOL_ROOT/data/summary.json")..."
/usr/bin/python3 "$PARASOL_ROOT/scripts/plot.py" "$PARASOL_ROOT"/data/metrics.worker*.jsonl \
  --out "$PARASOL_ROOT/data/plots"
