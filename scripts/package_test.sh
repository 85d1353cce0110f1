#!/usr/bin/env bash
# Installs the build into a temporary prefix, builds tests/package (a program outside the tree
# that uses find_package(Parasol) and Parasol::client) against it, and runs it against a shard
# started from the installed `parasol`; then imports the installed Python package and reads the
# same row through it.
#   scripts/package_test.sh BUILD_DIR
set -euo pipefail
build="$1"
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
tmp="$(mktemp -d /tmp/parasol-package-XXXXXX)"
server_pid=""
cleanup() {
  if [ -n "$server_pid" ]; then kill "$server_pid" 2>/dev/null || true; wait "$server_pid" 2>/dev/null || true; fi
  rm -rf "$tmp"
}
trap cleanup EXIT

cmake --install "$build" --prefix "$tmp/prefix" >"$tmp/install.log"
for f in bin/parasol include/parasol/worker/ps_client.hpp include/parasol/protocols/message_generated.h \
         lib/cmake/Parasol/ParasolConfig.cmake; do
  [ -e "$tmp/prefix/$f" ] || { echo "FAIL: $f was not installed"; cat "$tmp/install.log"; exit 1; }
done
# Without CUDA's toolkit, as on a machine that only talks to shards: Parasol::client needs none
# (from a build with CUDA too).
cmake -S "$root/tests/package" -B "$tmp/consumer" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_PREFIX_PATH="$tmp/prefix" -DCMAKE_DISABLE_FIND_PACKAGE_CUDAToolkit=TRUE \
  >"$tmp/configure.log" 2>&1 ||
  { echo "FAIL: the consumer does not configure"; cat "$tmp/configure.log"; exit 1; }
cmake --build "$tmp/consumer" -j 2 >"$tmp/build.log" 2>&1 ||
  { echo "FAIL: the consumer does not build"; cat "$tmp/build.log"; exit 1; }

port="$(/usr/bin/python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
cat >"$tmp/job.yaml" <<YAML
cluster: {servers: ["127.0.0.1:$port"], workers: 1, connect_timeout: 20s}
tables:
  - {name: emb, dim: 4, optimizer: {kind: sgd, lr: 0.5}}
YAML
"$tmp/prefix/bin/parasol" server --manifest "$tmp/job.yaml" --rank 0 >"$tmp/server.log" 2>&1 &
server_pid=$!
out="$(timeout 60 "$tmp/consumer/consumer" "$tmp/job.yaml" 2>&1)" ||
  { echo "FAIL: the consumer failed: $out"; cat "$tmp/server.log"; exit 1; }
echo "consumer: $out"
# SGD with lr 0.5 moves the row by 0.5 x the gradient (1 2 3 4).
[ "$out" = "moved: 0.500000 1.000000 1.500000 2.000000" ] || { echo "FAIL: unexpected output"; exit 1; }

module="$(find "$tmp/prefix" -name '_parasol*.so' | head -1)"
if [ -n "$module" ]; then
  PYTHONPATH="$(dirname "$(dirname "$module")")" PARASOL_BIN="$tmp/prefix/bin/parasol" \
    timeout 60 /usr/bin/python3 - "$tmp/job.yaml" <<'PY'
import sys
import numpy as np
import parasol
assert parasol.__file__.startswith("/tmp/parasol-package-"), parasol.__file__
m = parasol.load_manifest(sys.argv[1])
with parasol.Client(m, parasol.Client.OBSERVER) as c:
    row = c.pull_sparse("emb", np.array([42], dtype=np.uint64))
print("python: installed package reads row 42:", row[0])
PY
else
  echo "the Python module was not built: its install is not checked"
fi
echo "package: installed, consumer built and ran"
