#!/usr/bin/env bash
# Builds and runs the benchmarks, printing one table: each figure beside the ceilings measured
# in the same run (memcpy bandwidth, raw ZeroMQ round trip of the same bytes).
#   scripts/bench.sh [--only ceilings|dense|sparse|optimizer|consistency|training|torch|compute|checkpoint|cache|python|tiered|capacity|elastic|reshard|scale|huge|feed]
#                    [--json FILE] [--quick] [--capacity]
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

parasol_install_deps
# The PyTorch baseline (`--only torch`) and the Python worker (`--only python`) run Debian's
# python3-torch.
if [[ " $* " == *" torch "* || " $* " == *" python "* ]]; then
  PARASOL_PACKAGES=(python3-torch)
  parasol_install_deps
fi
parasol_build Release >/dev/null
exec "$PARASOL_BUILD/parasol_bench" "$@"
