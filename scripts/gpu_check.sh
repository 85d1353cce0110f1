#!/usr/bin/env bash
# The GPU check, for a machine with an NVIDIA GPU: builds with CUDA, runs the `gpu` tests (the
# CUDA backend against the CPU backend), the compute benchmark (dlrm-small forward+backward at
# batch 4096 and 16384 with rows in host memory; cuBLAS TFLOP/s of the model's layer shapes
# against a large square product), and an end-to-end training run with 2 servers and a CUDA
# worker on this machine. Writes everything it prints to ${OUT:-build}/gpu_check.log too.
#   scripts/gpu_check.sh
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

out="${OUT:-$PARASOL_BUILD}"
mkdir -p "$out"
exec > >(tee "$out/gpu_check.log") 2>&1

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv || true
parasol_install_deps
parasol_build Release
(cd "$PARASOL_BUILD" && ctest -L gpu --output-on-failure)
"$PARASOL_BUILD/parasol_bench" --only compute --json "$out/compute.json"

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
"$PARASOL_BUILD/parasol" gen-data --rows 400000 --seed 1 --out "$work/train.tsv"
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
"$PARASOL_BUILD/parasol" launch "$work/job.yaml" --summary "$out/gpu_train.json"
echo "end to end (2 servers, 1 CUDA worker, batch 4096): $(cat "$out/gpu_train.json")"
