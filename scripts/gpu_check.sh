#!/usr/bin/env bash
# The GPU check, for a machine with an NVIDIA GPU. It installs nothing and stops within its time
# limit whatever happens; a failing step is reported and the others still run. Steps:
#   1. the `gpu` tests (kernels_test: the CUDA backend against the CPU backend);
#   2. compute-sanitizer (memcheck, racecheck) over the kernels' own tests, where it is there;
#   3. the compute benchmark: dlrm-small steps of the backend alone at batch 4096 and 16384 (fp32
#      and TF32), each operation's device time per step, each of the model's products in TFLOP/s
#      against the fastest configuration an exhaustive cuBLASLt search finds for the same shape;
#   4. an end-to-end training run with 2 servers and a CUDA worker on this machine, then the same
#      from the data's binary copy without evaluation, with 1, 2, 4 and 8 servers, at prefetch
#      depth 0 (BSP) and 2 (SSP), and with 2 and 4 CUDA workers sharing the GPU in front of 8
#      servers; for each of these jobs the JSON keeps the workers' time split and the shards'
#      request threads' time (from the stats each shard logs as it stops), with the share of
#      the training time the shards spent serving;
#   5. the feed benchmark (parasol_bench --only feed) on this machine's cores.
# Writes gpu_check.log, gpu_check.json (every figure and result) and the step outputs to
# ${OUT:-build}. Exits non-zero if any step failed.
#
#   scripts/gpu_check.sh [--limit S]                  builds here (sm_90 only), then checks
#   scripts/gpu_check.sh --prebuilt DIR [--limit S]   checks binaries built elsewhere (a GPU
#                                                     machine without Debian's packages)
#   scripts/gpu_check.sh --bundle DIR [--from BUILD]  on the build machine: DIR/bundle.tar.gz
#                                                     with parasol, parasol_bench, kernels_test
#                                                     and their shared libraries (not CUDA's)
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

mode=build bin="" limit=420 from="$PARASOL_BUILD"
while [ $# -gt 0 ]; do
  case "$1" in
    --prebuilt) mode=prebuilt bin="$(realpath "${2:?--prebuilt DIR}")"; shift 2 ;;
    --bundle) mode=bundle bin="${2:?--bundle DIR}"; shift 2 ;;
    --from) from="$(realpath "${2:?--from BUILD}")"; shift 2 ;;
    --limit) limit="${2:?--limit SECONDS}"; shift 2 ;;
    *) echo "gpu_check.sh: unknown argument '$1'" >&2; exit 2 ;;
  esac
done

if [ "$mode" = bundle ]; then
  set -e
  mkdir -p "$bin/lib"
  cp "$from/parasol" "$from/parasol_bench" "$from/tests/kernels_test" "$bin/"
  # Every shared library they load except the C library's and CUDA's (the GPU machine has its
  # own driver and toolkit).
  libs="$(for b in parasol parasol_bench kernels_test; do ldd "$bin/$b"; done |
    awk '$3 ~ /^\// {print $3}' | sort -u |
    grep -v -E '/(libc|libm|libpthread|libdl|librt|libresolv)\.so|ld-linux|libcuda|libcublas')"
  cp -L -t "$bin/lib/" $libs
  tar -C "$bin" -czf "$bin/bundle.tar.gz" parasol parasol_bench kernels_test lib
  rm -rf "$bin/lib" "$bin/parasol" "$bin/parasol_bench" "$bin/kernels_test"
  echo "gpu_check: $bin/bundle.tar.gz ($(du -h "$bin/bundle.tar.gz" | cut -f1))"
  exit 0
fi

out="${OUT:-$PARASOL_BUILD}"
mkdir -p "$out"
exec > >(tee "$out/gpu_check.log") 2>&1
deadline=$((SECONDS + limit))
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

if [ "$mode" = prebuilt ]; then
  if [ -f "$bin/bundle.tar.gz" ]; then
    tar -C "$work" -xzf "$bin/bundle.tar.gz" || exit 1
    bin="$work"
  fi
  cuda_libs=""
  for d in /usr/local/cuda/lib64 /usr/local/cuda/lib /usr/local/cuda/targets/x86_64-linux/lib; do
    [ -e "$d/libcublasLt.so.13" ] && cuda_libs="$cuda_libs:$d"
  done
  if [ -z "$cuda_libs" ]; then  # CUDA's libraries from a Python wheel, if that is all there is
    lt="$(timeout 30 find / -xdev -name 'libcublasLt.so.13' -path '*nvidia*' 2>/dev/null | head -1)"
    [ -n "$lt" ] && cuda_libs=":$(dirname "$lt")"
    rt="$(timeout 30 find / -xdev -name 'libcudart.so.13' -path '*nvidia*' 2>/dev/null | head -1)"
    [ -n "$rt" ] && cuda_libs="$cuda_libs:$(dirname "$rt")"
  fi
  export LD_LIBRARY_PATH="$bin/lib$cuda_libs:${LD_LIBRARY_PATH:-}"
  kernels_test="$bin/kernels_test"
else
  missing="$(parasol_missing_packages "${PARASOL_PACKAGES[@]}" | tr '\n' ' ')"
  if [ -n "$missing" ]; then
    echo "gpu_check: missing Debian packages: $missing(install them, or build elsewhere and use --prebuilt)"
    exit 1
  fi
  cmake -S "$PARASOL_ROOT" -B "$PARASOL_BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DCMAKE_CUDA_ARCHITECTURES=90-real || exit 1
  left=$((deadline - SECONDS))
  if [ "$left" -le 0 ]; then echo "gpu_check: no time left to build"; exit 1; fi
  timeout "$left" cmake --build "$PARASOL_BUILD" -j "$(nproc)" || exit 1
  bin="$PARASOL_BUILD"
  kernels_test="$PARASOL_BUILD/tests/kernels_test"
fi

failed=()
results=()  # "name<TAB>exit code<TAB>seconds"
step() {  # step NAME SECONDS COMMAND...: at most SECONDS, and never past the deadline
  local name="$1" want="$2"
  shift 2
  local left=$((deadline - SECONDS - 5))
  local cap=$((want < left ? want : left))
  if [ "$cap" -le 0 ]; then
    echo "=== $name: skipped, no time left"
    failed+=("$name (no time left)")
    results+=("$name	skipped	0")
    return
  fi
  echo "=== $name (at most ${cap} s)"
  local t0=$SECONDS
  timeout -k 5 "$cap" "$@"
  local rc=$?
  results+=("$name	$rc	$((SECONDS - t0))")
  [ "$rc" -eq 0 ] || failed+=("$name (exit $rc)")
}

nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.max.sm --format=csv \
  > "$out/gpu.csv" 2>&1
cat "$out/gpu.csv"
step "gpu tests" 180 "$kernels_test" --gtest_color=no --gtest_output="json:$out/gpu_tests.json"
# Skipped GPU tests mean the device could not be used: that is a failure here.
if grep -q '"result": "SKIPPED"' "$out/gpu_tests.json" 2>/dev/null; then
  failed+=("gpu tests skipped (no usable device?)")
fi
if command -v compute-sanitizer >/dev/null 2>&1; then
  step "memcheck" 90 compute-sanitizer --tool memcheck --error-exitcode 1 "$kernels_test" \
    --gtest_color=no '--gtest_filter=*/fp32:EmbeddingPool*:-*LargeDlrm*'
  step "racecheck" 60 compute-sanitizer --tool racecheck --error-exitcode 1 "$kernels_test" \
    --gtest_color=no '--gtest_filter=*Interaction*/fp32:*RowGradients*/fp32:*FusedBias*/fp32:*SmallDlrm*/fp32'
else
  echo "=== compute-sanitizer: not on this machine, skipped"
fi
step "compute benchmark" 240 "$bin/parasol_bench" --only compute --json "$out/compute.json"

step "training data" 60 "$bin/parasol" gen-data --rows 1600000 --seed 1 --out "$work/train.tsv"
step "eval data" 30 "$bin/parasol" gen-data --rows 50000 --seed 2 --out "$work/eval.tsv"
# job_yaml FILE SERVERS TRAINING DATA [WORKERS]: a dlrm-small job with CUDA workers (one unless
# WORKERS says otherwise) at batch 4096.
job_yaml() {
  cat > "$1" <<YAML
cluster:
  servers: [$2]
  workers: ${5:-1}
training: {$3, batch_size: 4096, epochs: 1, progress_every: 1h}
worker: {device: cuda}
model:
  kind: dlrm
  embedding_dim: 16
  bottom: [64, 16]
  top: [64, 1]
  sparse_optimizer: {kind: adagrad, lr: 0.05, eps: 1e-8}
  dense_optimizer: {kind: adam, lr: 0.001}
data: {$4}
YAML
}
job_yaml "$work/job.yaml" "127.0.0.1:47410, 127.0.0.1:47411" "consistency: bsp" \
  "train: $work/train.tsv, eval: $work/eval.tsv"
step "end to end" 120 "$bin/parasol" launch "$work/job.yaml" --summary "$out/gpu_train.json"

# The same training with 1, 2, 4 and 8 shards on this machine's cores, from the data's binary
# copy (parasol convert) and without evaluation: BSP (prefetch depth 0), and SSP with staleness 2
# and two steps' pulls in flight (prefetch depth 2).
step "binary data" 60 "$bin/parasol" convert --in "$work/train.tsv" --out "$work/train.bin"
for n in 1 2 4 8; do
  for depth in 0 2; do
    servers=""
    for ((i = 0; i < n; ++i)); do servers+="${servers:+, }127.0.0.1:$((47420 + i))"; done
    if [ "$depth" -eq 0 ]; then
      training="consistency: bsp"
    else
      training="consistency: ssp, staleness: 2, prefetch_depth: 2"
    fi
    job_yaml "$work/job_${n}s_p${depth}.yaml" "$servers" "$training" "train: $work/train.bin"
    step "end to end ${n}s prefetch $depth" 60 "$bin/parasol" launch \
      "$work/job_${n}s_p${depth}.yaml" --summary "$work/gpu_e2e_${n}s_p${depth}.json"
  done
done

# Several workers on the one GPU, each with its own request path, in front of 8 shards.
for w in 2 4; do
  for depth in 0 2; do
    servers=""
    for ((i = 0; i < 8; ++i)); do servers+="${servers:+, }127.0.0.1:$((47440 + i))"; done
    if [ "$depth" -eq 0 ]; then
      training="consistency: bsp"
    else
      training="consistency: ssp, staleness: 2, prefetch_depth: 2"
    fi
    job_yaml "$work/job_8s_${w}w_p${depth}.yaml" "$servers" "$training" "train: $work/train.bin" "$w"
    step "end to end 8s ${w} workers prefetch $depth" 60 "$bin/parasol" launch \
      "$work/job_8s_${w}w_p${depth}.yaml" --summary "$work/gpu_e2e_8s_${w}w_p${depth}.json"
  done
done

# What the data and parameter-server path can feed the GPU here (the worker's step without the
# model's computation), with its in-process ceiling.
step "feed benchmark" 120 "$bin/parasol_bench" --only feed --json "$out/feed.json"

# One JSON of everything: the GPU, each step's exit code and time, the tests that failed, the
# benchmark rows and the training summary.
printf '%s\n' "${results[@]}" > "$out/steps.tsv"
python3 - "$out" "$work" <<'PY' || echo "gpu_check: could not write gpu_check.json"
import json, os, sys
out, work = sys.argv[1], sys.argv[2]
def load(name, folder=None):
    try:
        with open(os.path.join(folder or out, name)) as f:
            return json.load(f)
    except Exception as e:
        return {"missing": str(e)}
doc = {"gpu": open(os.path.join(out, "gpu.csv")).read().strip().splitlines()}
doc["steps"] = [dict(zip(("step", "exit", "seconds"), l.split("\t")))
                for l in open(os.path.join(out, "steps.tsv")).read().splitlines() if l]
tests = load("gpu_tests.json")
if "testsuites" in tests:
    cases = [(s["name"] + "." + c["name"], c) for s in tests["testsuites"] for c in s["testsuite"]]
    doc["gpu_tests"] = {
        "run": sum(1 for _, c in cases if c.get("result") == "COMPLETED"),
        "skipped": [n for n, c in cases if c.get("result") == "SKIPPED"],
        "failed": {n: [f["failure"][:400] for f in c["failures"]] for n, c in cases if c.get("failures")},
    }
doc["compute"] = load("compute.json")
doc["end_to_end"] = load("gpu_train.json")
# This log's lines by step ("=== NAME (at most ...)" begins a step's), for the shards' stats
# each job's shards log as they stop.
steps, name = {}, None
try:
    lines = open(os.path.join(out, "gpu_check.log"), errors="replace").read().splitlines()
except Exception:
    lines = []
for line in lines:
    if line.startswith("=== "):
        name = line[4:].split(" (at most")[0]
        steps[name] = []
    elif name is not None:
        steps[name].append(line)
SPLIT = ("seconds_waiting", "seconds_serving_pushes", "seconds_serving_ticks",
         "seconds_serving_pulls", "seconds_serving_other", "seconds_applying_clocks")
def job(step, summary):
    """A job's rate, its workers' time split, and its shards' request threads' time: summed
    over the shards, and the share of worker 0's training time they spent serving."""
    entry = {k: summary.get(k) for k in ("samples_per_second", "train_samples", "missing")
             if k in summary}
    workers = summary.get("workers") or []
    if not isinstance(workers, list):
        workers = []
    entry["worker_time_split"] = [w.get("time_split") if isinstance(w, dict) else None
                                  for w in workers]
    stats = []
    for line in steps.get(step, []):
        at = line.find(" stopping: {")
        if at < 0:
            continue
        try:
            stats.append(json.loads(line[at + len(" stopping: "):]))
        except ValueError:
            pass
    # Only whole stats count: a line cut short or from another build is left out, not a crash
    # that would lose the whole JSON.
    stats = [s for s in stats if isinstance(s, dict) and
             all(isinstance(s.get(k), (int, float)) for k in SPLIT)]
    entry["shards_reporting"] = len(stats)
    if stats:
        entry["shard_seconds"] = {k: round(sum(s[k] for s in stats), 4) for k in SPLIT}
        first = workers[0] if workers and isinstance(workers[0], dict) else {}
        train = first.get("train_seconds")
        if isinstance(train, (int, float)) and train > 0:
            serving = sum(s[k] for s in stats for k in SPLIT[1:5])
            entry["shard_busy_share"] = round(serving / (len(stats) * train), 3)
    return entry
doc["end_to_end_shards"] = {}
for n in (1, 2, 4, 8):
    for depth in (0, 2):
        summary = load("gpu_e2e_%ds_p%d.json" % (n, depth), work)
        doc["end_to_end_shards"]["gpu_e2e_b4096_%ds_p%d" % (n, depth)] = job(
            "end to end %ds prefetch %d" % (n, depth), summary)
for w in (2, 4):
    for depth in (0, 2):
        summary = load("gpu_e2e_8s_%dw_p%d.json" % (w, depth), work)
        doc["end_to_end_shards"]["gpu_e2e_b4096_8s_%dw_p%d" % (w, depth)] = job(
            "end to end 8s %d workers prefetch %d" % (w, depth), summary)
doc["feed"] = load("feed.json")
with open(os.path.join(out, "gpu_check.json"), "w") as f:
    json.dump(doc, f, indent=1)
rows = doc["compute"] if isinstance(doc["compute"], list) else doc["compute"].get("rows", [])
print("gpu_check.json:", len(rows), "benchmark rows")
PY
if [ "${#failed[@]}" -gt 0 ]; then
  echo "FAILED: ${failed[*]}"
  exit 1
fi
echo "gpu check: every step passed"
