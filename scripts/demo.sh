#!/usr/bin/env bash
# The main job: builds, starts two server shards and two workers on this machine from
# examples/demo.yaml, pushes and pulls a generated Zipf workload through them, checks every value
# against the workers' own reference, and prints what happened.
#   scripts/demo.sh [extra `parasol launch` options, e.g. --steps 50]
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

parasol_install_deps
parasol_build Release
exec "$PARASOL_BUILD/parasol" launch --manifest "$PARASOL_ROOT/examples/demo.yaml" "$@"
