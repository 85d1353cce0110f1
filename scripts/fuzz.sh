#!/usr/bin/env bash
# The libFuzzer targets (tests/fuzz/), built with clang, AddressSanitizer and UBSan in their own
# build folder, run from their committed seed corpora.
#   scripts/fuzz.sh build                      configure and build the fuzz build folder
#   scripts/fuzz.sh run NAME SECONDS [ARGS]    run fuzz_NAME for SECONDS (extra libFuzzer ARGS)
#   scripts/fuzz.sh list                       the targets
# Exits 77 (skipped) when clang's libFuzzer is not installed or the target is not built, and
# non-zero when the fuzzer finds a crash, a leak, a time-out or undefined behaviour; the input
# that did it is kept in the fuzz build folder's artifacts/ folder.
# Running for hours: scripts/fuzz.sh run request 36000 -jobs=2 -workers=2
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
fuzz_build="${PARASOL_FUZZ_BUILD:-$PARASOL_ROOT/build-fuzz}"

have_libfuzzer() {
  command -v clang++ >/dev/null 2>&1 &&
    ls /usr/lib/llvm-*/lib/clang/*/lib/linux/libclang_rt.fuzzer-x86_64.a >/dev/null 2>&1
}

case "${1:-}" in
  build)
    if ! have_libfuzzer; then
      echo "fuzz: clang with libFuzzer (clang, libclang-rt-14-dev) is not installed; skipped"
      exit 0
    fi
    # -O1 and line tables only, as OSS-Fuzz builds its fuzzers: the reports keep their file and
    # line, and the build takes about half the time of -O2 -g (CI builds it on 2 cores).
    cmake -S "$PARASOL_ROOT" -B "$fuzz_build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
      -DCMAKE_C_FLAGS_RELWITHDEBINFO="-O1 -gline-tables-only" \
      -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -gline-tables-only" \
      -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ -DPARASOL_FUZZ=ON \
      -DPARASOL_ENABLE_CUDA=OFF -DPARASOL_BUILD_TESTS=OFF -DPARASOL_BUILD_BENCH=OFF >/dev/null
    cmake --build "$fuzz_build" -j "$(nproc)" --target parasol_fuzzers
    ;;
  run)
    name="${2:?usage: fuzz.sh run NAME SECONDS}"
    seconds="${3:?usage: fuzz.sh run NAME SECONDS}"
    shift 3
    bin="$fuzz_build/tests/fuzz/fuzz_$name"
    if [ ! -x "$bin" ]; then
      echo "SKIP: $bin is not built (scripts/fuzz.sh build)"
      exit 77
    fi
    # New inputs go to a scratch copy; the committed corpus stays as it is.
    work="$(mktemp -d)"
    trap 'rm -rf "$work"' EXIT
    mkdir -p "$work/corpus" "$fuzz_build/artifacts"
    if [ -d "$PARASOL_ROOT/tests/fuzz/corpus/$name" ]; then
      cp -r "$PARASOL_ROOT/tests/fuzz/corpus/$name/." "$work/corpus/"
    fi
    cd "$work"
    export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1}"
    export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}"
    set +e
    # -error_exitcode=1: libFuzzer's own default, 77, is what ctest reads as "skipped".
    "$bin" -max_total_time="$seconds" -rss_limit_mb=2048 -timeout=20 -print_final_stats=1 \
      -error_exitcode=1 \
      -artifact_prefix="$fuzz_build/artifacts/$name-" "$@" "$work/corpus" >"$work/log" 2>&1
    rc=$?
    set -e
    tail -40 "$work/log"
    runs="$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$work/log" | grep -o '[0-9]*$' || true)"
    echo "fuzz_$name: ${runs:-0} inputs in $seconds s, exit $rc"
    if [ "$rc" -ne 0 ]; then exit "$rc"; fi
    if [ "${runs:-0}" -eq 0 ]; then
      echo "fuzz_$name ran no input"
      exit 1
    fi
    ;;
  list)
    ls "$fuzz_build/tests/fuzz" 2>/dev/null | grep '^fuzz_' | grep -v seeds || true
    ;;
  *)
    sed -n 2,12p "$0"
    exit 2
    ;;
esac
