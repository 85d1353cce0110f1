#!/usr/bin/env bash
# The GPU check, for a machine with an NVIDIA GPU: the `gpu` tests (the CUDA backend against the
# CPU backend), the compute benchmark (dlrm-small forward+backward at batch 4096 and 16384 with
# rows in host memory; cuBLAS TFLOP/s of the model's layer shapes against a large square
# product), and an end-to-end training run with 2 servers and a CUDA worker on this machine.
# Every step runs under its own time limit and a failing step does not stop the others; the
# script exits non-zero if any failed. Writes everything it prints to ${OUT:-build}/gpu_check.log.
#   scripts/gpu_check.sh                   installs what is missing, builds with CUDA, checks
#   scripts/gpu_check.sh --prebuilt DIR    checks binaries built elsewhere: DIR holds parasol,
#                                          parasol_bench, kernels_test and lib/ (their shared
#                                          libraries other than CUDA's), for a GPU machine
#                                          without Debian's packages or a network
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

out="${OUT:-$PARASOL_BUILD}"
mkdir -p "$out"
exec > >(tee "$out/gpu_check.log") 2>&1

if [ "${1:-}" = "--prebuilt" ]; then
  bin="$(realpath "${2:?--prebuilt DIR}")"
  export LD_LIBRARY_PATH="$bin/lib:/usr/local/cuda/lib64:/usr/local/cuda/lib:${LD_LIBRARY_PATH:-}"
  kernels_test="$bin/kernels_test"
else
  parasol_install_deps && parasol_build Release || exit 1
  bin="$PARASOL_BUILD"
  kernels_test="$PARASOL_BUILD/tests/kernels_test"
fi

failed=()
step() {  # step NAME SECONDS COMMAND...
  local name="$1" limit="$2"
  shift 2
  echo "=== $name (at most ${limit} s)"
  timeout "$limit" "$@"
  local rc=$?
  [ "$rc" -eq 0 ] || failed+=("$name (exit $rc)")
}

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
step "gpu tests" 120 "$kernels_test" --gtest_color=no
step "compute benchmark" 150 "$bin/parasol_bench" --only compute --json "$out/compute.json"

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
step "training data" 60 "$bin/parasol" gen-data --rows 400000 --seed 1 --out "$work/train.tsv"
ports=(47410 47411)
cat > "$work/job.yaml" <<YAML
cluster:
  servers: [127.0.0.1:${ports[0]}, 127.0.0.1:${ports[1]}]
  workers: 1
training: {consistency: bsp, batch_size: 4096, epochs: 1, progress_every: 1h}
worker: {device: cuda}
model:
  kind: dlrm
  embedding_dim: 16
  bottom: [64, 16]
  top: [64, 1]
  sparse_optimizer: {kind: adagrad, lr: 0.05, eps: 1e-8}
  dense_optimizer: {kind: adam, lr: 0.001}
data: {train: $work/train.tsv}
YAML
step "end to end" 150 "$bin/parasol" launch "$work/job.yaml" --summary "$out/gpu_train.json"
[ -f "$out/gpu_train.json" ] &&
  echo "end to end (2 servers, 1 CUDA worker, batch 4096): $(cat "$out/gpu_train.json")"
[ -f "$out/compute.json" ] && echo "compute: $(cat "$out/compute.json")"
if [ "${#failed[@]}" -gt 0 ]; then
  echo "FAILED: ${failed[*]}"
  exit 1
fi
echo "gpu check: every step passed"
