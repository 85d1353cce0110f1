#!/usr/bin/env bash
# The main job: builds, generates Criteo-format data, and trains dlrm-small
# (examples/criteo-dlrm.yaml) through 2 server shards and 2 workers on this machine, each a
# separate process; prints their progress and the eval figures.
#   scripts/demo.sh [--rows N]   (training rows, default 200000; eval rows are a tenth)
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

rows=200000
if [ "${1:-}" = "--rows" ] && [ -n "${2:-}" ]; then rows="$2"; fi

parasol_install_deps
parasol_build Release
mkdir -p "$PARASOL_ROOT/data"
"$PARASOL_BUILD/parasol" gen-data --rows "$rows" --seed 1 --out "$PARASOL_ROOT/data/synthetic-train.tsv"
"$PARASOL_BUILD/parasol" gen-data --rows "$((rows / 10))" --seed 2 --out "$PARASOL_ROOT/data/synthetic-eval.tsv"
"$PARASOL_BUILD/parasol" launch "$PARASOL_ROOT/examples/criteo-dlrm.yaml" \
  --summary "$PARASOL_ROOT/data/summary.json"
echo "summary: $(cat "$PARASOL_ROOT/data/summary.json" | cut -c1-200)..."
