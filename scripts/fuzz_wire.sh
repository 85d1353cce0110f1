#!/usr/bin/env bash
# Builds the wire decoder's libFuzzer target with clang (AddressSanitizer on) and runs it for a
# bounded time from a seed corpus of valid messages. Exits non-zero on a crash or a leak.
#   scripts/fuzz_wire.sh [BUILD_DIR] [SECONDS]
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="$(realpath "${1:-$root/build}")"
seconds="${2:-30}"
if ! command -v clang++ >/dev/null 2>&1 || ! ls /usr/lib/llvm-*/lib/clang/*/lib/linux/libclang_rt.fuzzer-x86_64.a >/dev/null 2>&1; then
  echo "SKIP: clang++ with libFuzzer (clang, libclang-rt-14-dev) is not installed"
  exit 77
fi
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
clang++ -std=c++20 -O1 -g -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined \
  -I"$root" -I"$build/generated" \
  "$root/tests/fuzz/wire_fuzzer.cc" "$root/common/wire.cc" "$root/common/status.cc" \
  -lzmq -o "$work/wire_fuzzer"
# Seeds: real messages, in the fuzzer's framing.
clang++ -std=c++20 -O1 -I"$root" -I"$build/generated" "$root/tests/fuzz/wire_seeds.cc" \
  "$root/common/wire.cc" "$root/common/status.cc" -lzmq -o "$work/wire_seeds"
mkdir -p "$work/corpus"
"$work/wire_seeds" "$work/corpus"
"$work/wire_fuzzer" -max_total_time="$seconds" -rss_limit_mb=1024 -print_final_stats=1 \
  "$work/corpus" 2>&1 | tail -20
