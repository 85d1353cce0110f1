#!/usr/bin/env bash
# Installs what is missing, builds, and runs every test through ctest.
# Tests labelled `gpu` skip themselves when no CUDA device is present.
#   scripts/test.sh [--long] [extra ctest arguments, e.g. -L unit or -R Cluster]
# Tests labelled `long` (chaos variants, two minutes of resharding) run only with --long; the
# default run is CI's (26-30 minutes on a fresh clone with 2 cores, about half of it building).
set -euo pipefail
skip_long=(-LE long)
if [[ ${1:-} == --long ]]; then
  skip_long=()
  shift
fi
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

# The Python module's tests run pytest, and parasol.torch's need PyTorch.
PARASOL_PACKAGES+=(python3-pytest python3-torch)
parasol_install_deps
parasol_install_test_deps
# Under CI (CI set), compiler warnings are errors.
if [ -n "${CI:-}" ]; then export PARASOL_WERROR=ON; fi
parasol_build Release
# The fuzzers' own build folder (clang, ASan + UBSan); their ctest entries run them.
bash "$PARASOL_ROOT/scripts/fuzz.sh" build
cd "$PARASOL_BUILD"
# ctest shows a skipped test only as "(Skipped)": its reason is printed after the run.
rc=0
mkdir -p Testing
ctest --output-on-failure -j "$(nproc)" --timeout 600 "${skip_long[@]}" "$@" 2>&1 |
  tee Testing/ctest-output.txt || rc=$?
/usr/bin/python3 "$PARASOL_ROOT/scripts/skip_reasons.py" . Testing/ctest-output.txt || true
exit "$rc"
