#!/usr/bin/env bash
# Installs what is missing, builds, and runs every test through ctest.
# Tests labelled `gpu` skip themselves when no CUDA device is present.
#   scripts/test.sh [extra ctest arguments, e.g. -L unit or -R Cluster]
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

# The Python module's tests run pytest, and parasol.torch's need PyTorch.
PARASOL_PACKAGES+=(python3-pytest python3-torch)
parasol_install_deps
parasol_install_test_deps
parasol_build Release
# The fuzzers' own build folder (clang, ASan + UBSan); their ctest entries run them.
bash "$PARASOL_ROOT/scripts/fuzz.sh" build
cd "$PARASOL_BUILD"
ctest --output-on-failure -j "$(nproc)" --timeout 600 "$@"
