// parasol_bench: push/pull throughput of real shards, each figure printed next to the
// machine's ceilings measured in the same run (memcpy bandwidth and a raw ZeroMQ round trip of
// the same bytes between two plain processes).
//
//   parasol_bench [--only GROUP] [--json FILE] [--quick]
//
// Groups: ceilings, dense, sparse. The figure of a row is a median over timed iterations.
#include <spdlog/spdlog.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <climits>
#include <csignal>
#include <cstdio>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <optional>
#include <random>

#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "bench/ceilings.hpp"
#include "common/manifest.hpp"
#include "common/model_tables.hpp"
#include "common/net.hpp"
#include "common/subprocess.hpp"
#include "common/transport.hpp"
#include "common/wire.hpp"
#include "common/zipf.hpp"
#include "common/json_text.hpp"
#include "common/key_index.hpp"
#include "server/checkpoint.hpp"
#include "server/optimizer.hpp"
#include "server/shard_server.hpp"
#include "kernels/gemm_probe.hpp"
#include "worker/backend.hpp"
#include "worker/batch.hpp"
#include "worker/binary_data.hpp"
#include "worker/data_generator.hpp"
#include "worker/data_reader.hpp"
#include "worker/model.hpp"
#include "worker/ps_client.hpp"
#include "worker/trainer.hpp"

namespace parasol::bench {
namespace {

// The number at `pointer` ("/tables/0/rows", "/workers/0/pull_bytes_per_step") in JSON text
// that Parasol wrote (a shard's stats, a job summary), or 0 when there is none.
double JsonFigure(const std::string& text, const std::string& pointer) {
  const Json j = Json::parse(text, nullptr, false);
  const Json::json_pointer at(pointer);
  if (j.is_discarded() || !j.contains(at) || !j.at(at).is_number()) return 0;
  return j.at(at).get<double>();
}

struct Row {
  std::string name;
  double value = 0;
  std::string unit;
  std::optional<double> ceiling;
  std::string ceiling_name;
  std::optional<double> memcpy_ratio;  // value in GB/s over memcpy GB/s, where it applies
};

struct Options {
  std::string only;
  std::string json;
  bool quick = false;
  bool capacity = false;
  uint64_t tiered_rows = 0;     // --tiered-rows (0: 10^7, --quick 10^6)
  uint64_t memory_budget = 0;   // --memory-budget (0: 64 MiB)
  uint64_t huge_rows = 100000000;  // --huge-rows
  std::string tiered_dtype = "f32";  // --tiered-dtype: the tiered table's values (f32, bf16, f16)
};

// Real `parasol server` processes for one benchmark configuration.
class BenchCluster {
 public:
  BenchCluster(const std::string& tables_yaml, int shards, const std::string& extra_yaml = "",
               int workers = 1) {
    char tmpl[] = "/tmp/parasol-bench-XXXXXX";
    dir_ = ::mkdtemp(tmpl) ? tmpl : "/tmp";
    std::string y = "cluster:\n  servers:\n";
    const std::vector<uint16_t> ports = *PickFreePorts(shards);
    for (int s = 0; s < shards; ++s) y += "    - 127.0.0.1:" + std::to_string(ports[s]) + "\n";
    y += "  workers: " + std::to_string(workers) + "\n  connect_timeout: 30s\n";
    y += "  request_timeout: 60s\n";
    y += extra_yaml.empty() ? "training:\n  consistency: asp\n" : extra_yaml;
    y += "tables:\n" + tables_yaml;
    path_ = dir_ + "/manifest.yaml";
    std::ofstream(path_) << y;
    manifest_ = *LoadManifest(path_);
    const std::string self = SelfDir() + "/parasol";
    for (int r = 0; r < shards; ++r) {
      auto p = Subprocess::Spawn(
          {self, "server", "--manifest", path_, "--rank", std::to_string(r)},
          dir_ + "/server" + std::to_string(r) + ".log");
      if (p.ok()) servers_.push_back(std::move(*p));
    }
  }
  ~BenchCluster() {
    servers_.clear();
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }
  const Manifest& manifest() const { return manifest_; }
  const std::string& dir() const { return dir_; }
  pid_t server_pid(int rank) const { return servers_.at(rank).pid(); }
  // Kills server `rank` (kill -9), waits for it, and starts it again (its log goes on).
  bool Restart(int rank) {
    servers_.at(rank).Signal(SIGKILL);
    if (!servers_.at(rank).Wait(std::chrono::seconds(60))) return false;
    auto p = Subprocess::Spawn({SelfDir() + "/parasol", "server", "--manifest", path_, "--rank",
                                std::to_string(rank)},
                               dir_ + "/server" + std::to_string(rank) + ".log");
    if (!p.ok()) return false;
    servers_.at(rank) = std::move(*p);
    return true;
  }

  static std::string SelfDir() {
    char buf[PATH_MAX];
    const ssize_t n = ::readlink("/proc/self/exe", buf, sizeof(buf) - 1);
    return std::filesystem::path(std::string(buf, n > 0 ? n : 0)).parent_path().string();
  }

 private:
  std::string dir_, path_;
  Manifest manifest_;
  std::vector<Subprocess> servers_;
};

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Seconds per call of `fn`: median over `iters` timed calls after `warmup` untimed ones.
double TimeIt(int warmup, int iters, const std::function<bool()>& fn) {
  for (int i = 0; i < warmup; ++i) {
    if (!fn()) return -1;
  }
  std::vector<double> t;
  for (int i = 0; i < iters; ++i) {
    const auto a = std::chrono::steady_clock::now();
    if (!fn()) return -1;
    t.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - a).count());
  }
  return Median(t);
}

std::string Mb(uint64_t bytes) { return std::to_string(bytes >> 20) + "MB"; }

void DenseRows(const Options& opt, RawEcho& echo, double memcpy_gbs, std::vector<Row>* rows) {
  const std::vector<uint64_t> sizes = opt.quick ? std::vector<uint64_t>{1 << 20, 16 << 20}
                                                : std::vector<uint64_t>{1 << 20, 16 << 20,
                                                                        64 << 20};
  for (uint64_t bytes : sizes) {
    const uint64_t n = bytes / sizeof(float);
    const int iters = bytes >= (64 << 20) ? 8 : (bytes >= (16 << 20) ? 20 : 100);
    const double echo_s = echo.RoundTrip(bytes, 3, iters);
    const double ceiling = 2.0 * bytes / echo_s / 1e9;
    for (int shards : {1, 2}) {
      BenchCluster cluster("  - {name: w, kind: dense, shape: [" + std::to_string(n) +
                               "], init: {kind: zeros}, optimizer: {kind: sgd, lr: 0.0}}\n",
                           shards);
      auto client = PsClient::Connect(cluster.manifest(), 0);
      if (!client.ok()) {
        spdlog::error("dense bench: {}", client.status().ToString());
        continue;
      }
      std::vector<float> grad(n, 1.0f), out(n);
      // The gradient goes up and the weights come down at once, chunk by chunk: the same
      // pattern as the echo ceiling's.
      const double s = TimeIt(3, iters, [&] {
        auto t = (*client)->PushPullDenseAsync(0, grad, out.data());
        return t.ok() && (*client)->Wait(*t).ok();
      });
      const double gbs = 2.0 * bytes / s / 1e9;
      rows->push_back({"dense_push_pull_" + Mb(bytes) + "_" + std::to_string(shards) + "shard",
                       gbs, "GB/s", ceiling, "zmq_roundtrip_" + Mb(bytes), gbs / memcpy_gbs});
    }
  }
}

void SparseRows(const Options& opt, RawEcho& echo, double memcpy_gbs, std::vector<Row>* rows) {
  constexpr uint64_t kKeys = 100000;
  constexpr uint32_t kDim = 16;
  const uint64_t push_bytes = kKeys * (8 + kDim * 4);  // keys + values out, same back on pull
  const int iters = opt.quick ? 10 : 30;
  const double echo_s = echo.RoundTrip(push_bytes, 3, iters);
  for (int shards : {1, 2}) {
    BenchCluster cluster("  - {name: emb, kind: sparse, dim: 16, optimizer: {kind: sgd, lr: 0.01}}\n",
                         shards);
    auto client = PsClient::Connect(cluster.manifest(), 0);
    if (!client.ok()) {
      spdlog::error("sparse bench: {}", client.status().ToString());
      continue;
    }
    std::mt19937_64 rng(1);
    std::vector<uint64_t> keys(kKeys);
    for (auto& k : keys) k = rng();
    std::vector<float> grad(kKeys * kDim, 0.001f), out(kKeys * kDim);
    const double s = TimeIt(3, iters, [&] {
      return (*client)->PushSparse(0, keys, grad).ok() &&
             (*client)->PullSparse(0, keys, out.data()).ok();
    });
    const std::string tag = "_" + std::to_string(shards) + "shard";
    const double gbs = 2.0 * push_bytes / s / 1e9;
    rows->push_back({"sparse_push_pull_1e5x16_rows" + tag, kKeys / s, "rows/s", kKeys / echo_s,
                     "zmq_roundtrip_7.2MB", std::nullopt});
    rows->push_back({"sparse_push_pull_1e5x16_bytes" + tag, gbs, "GB/s",
                     2.0 * push_bytes / echo_s / 1e9, "zmq_roundtrip_7.2MB", gbs / memcpy_gbs});
  }
}


// Creates rows [first, first + count) of table 0 through pulls of `batch` keys; rows/s.
double Fill(PsClient& client, uint64_t first, uint64_t count, uint32_t dim, uint64_t batch) {
  std::vector<uint64_t> keys(batch);
  std::vector<float> out(batch * dim);
  const auto start = std::chrono::steady_clock::now();
  for (uint64_t base = first; base < first + count; base += batch) {
    const uint64_t n = std::min(batch, first + count - base);
    keys.resize(n);
    for (uint64_t i = 0; i < n; ++i) keys[i] = base + i;
    if (!client.PullSparse(0, keys, out.data()).ok()) return -1;
  }
  return count / std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// `n` distinct keys drawn from `zipf` (as a worker sends them, deduplicated).
std::vector<uint64_t> DistinctZipfKeys(const ZipfSampler& zipf, std::mt19937_64& rng, uint64_t n) {
  std::vector<uint64_t> keys;
  KeyIndex seen(n);
  while (keys.size() < n) {
    bool inserted = false;
    const uint64_t k = zipf(rng) - 1;
    seen.FindOrInsert(k, 0, &inserted);
    if (inserted) keys.push_back(k);
  }
  return keys;
}

void OptimizerRows(const Options& opt, double memcpy_gbs, std::vector<Row>* rows) {
  const uint64_t table_rows = opt.quick ? 1000000 : 10000000;
  constexpr uint32_t kDim = 16;
  constexpr uint64_t kBatch = 100000;
  const std::string size = opt.quick ? "1e6" : "1e7";
  double f32_bytes_per_row = 0;  // adagrad_rowwise's, the bf16 table's ceiling
  for (const auto& [kind, dtype] : {std::pair<const char*, const char*>{"adagrad_rowwise", "f32"},
                                    {"adam", "f32"},
                                    {"adagrad_rowwise", "bf16"}}) {
    const bool bf16 = std::string(dtype) == "bf16";
    BenchCluster cluster("  - {name: emb, kind: sparse, dim: 16, dtype: " + std::string(dtype) +
                             ", optimizer: {kind: " + std::string(kind) + "}}\n",
                         1);
    auto client = PsClient::Connect(cluster.manifest(), 0);
    if (!client.ok()) {
      spdlog::error("optimizer bench: {}", client.status().ToString());
      continue;
    }
    if (Fill(**client, 0, table_rows, kDim, kBatch) < 0) continue;
    auto stats = (*client)->Stats();
    if (!stats.ok()) continue;
    const double bytes_per_row = JsonFigure((*stats)[0], "/tables/0/bytes_per_row");
    const double row_floats = JsonFigure((*stats)[0], "/tables/0/row_floats");
    const double raw = 8 + row_floats * 4;  // key + values + state
    if (bf16) {
      // Values in bf16 (state f32): next to the same table in f32, measured in this run.
      rows->push_back({"bytes_per_row_bf16_" + size + "x16", bytes_per_row, "B/row",
                       f32_bytes_per_row > 0 ? std::optional<double>(f32_bytes_per_row)
                                             : std::nullopt,
                       "bytes_per_row_adagrad_rowwise_f32", std::nullopt});
      continue;
    }
    if (std::string(kind) == "adagrad_rowwise") f32_bytes_per_row = bytes_per_row;
    // Pushes of Zipf-distributed keys over the whole table: kBatch distinct keys each (as a
    // worker sends them, deduplicated), drawn before the timed region.
    std::mt19937_64 rng(7);
    const ZipfSampler zipf(table_rows, 1.05);
    std::vector<float> grad(kBatch * kDim, 0.01f);
    const int iters = opt.quick ? 5 : 15;
    std::vector<std::vector<uint64_t>> batches;
    for (int b = 0; b < 2 + iters; ++b) batches.push_back(DistinctZipfKeys(zipf, rng, kBatch));
    size_t next = 0;
    const double s = TimeIt(2, iters, [&] {
      return (*client)->PushSparse(0, batches[next++ % batches.size()], grad).ok();
    });
    // An update reads and writes its row (values and state) once: a memcpy of the row.
    const double bound = memcpy_gbs * 1e9 / (row_floats * 4);
    rows->push_back({std::string("sparse_updates_") + kind + "_" + size + "x16_1shard",
                     kBatch / s, "rows/s", bound, "memcpy_bound_rows", std::nullopt});
    rows->push_back({std::string("bytes_per_row_") + kind + "_" + size + "x16", bytes_per_row,
                     "B/row", raw, "raw_key_value_state", std::nullopt});
  }
}

// The shard's sparse update path in process (decode, checks, split by engine, hash lookup, the
// optimizer; no transport): pushes of Zipf keys, built before the timed region, handed to
// ShardServer::HandleMessage. The ceiling: a plain loop applying the same optimizer to the same
// row layout (values then state) in one flat array, indexed by the same keys, in memory.
void InProcessUpdateRows(const Options& opt, std::vector<Row>* rows) {
  const uint64_t table_rows = opt.quick ? 1000000 : 10000000;
  constexpr uint32_t kDim = 16;
  constexpr uint64_t kBatch = 100000;
  const int batches = opt.quick ? 4 : 10;
  Result<Manifest> m = ParseManifest(
      "cluster:\n  servers: [127.0.0.1:1]\n  workers: 1\n"
      "server:\n  engine_threads: 1\n"
      "training: {consistency: asp}\n"
      "tables:\n  - {name: emb, kind: sparse, dim: 16, optimizer: {kind: adagrad_rowwise}}\n",
      "bench");
  if (!m.ok()) {
    spdlog::error("in-process bench: {}", m.status().ToString());
    return;
  }
  ShardServer shard(*m, 0);
  shard.set_reply_sink([](std::vector<zmq::message_t>&) {});
  uint64_t seq = 0;
  auto push = [&](const std::vector<uint64_t>& keys) {
    Header h;
    h.op = Op::PushSparse;
    h.request_id = seq + 1;
    h.worker_id = 0;
    h.seq = seq++;
    h.incarnation = 1;
    h.table_id = 0;
    h.clock = 0;
    h.key_count = keys.size();
    h.value_dim = kDim;
    const FramePlan plan = PlanValueFrames(keys.size(), kDim, m->server.frame_bytes);
    h.value_frames = plan.frames;
    h.rows_per_frame = plan.rows_per_frame;
    h.manifest_hash = m->Fingerprint();
    std::vector<zmq::message_t> frames;
    frames.emplace_back("w0", 2);
    frames.push_back(EncodeHeader(h));
    frames.emplace_back(keys.data(), keys.size() * sizeof(uint64_t));
    for (uint32_t f = 0; f < plan.frames; ++f) {
      const uint64_t n = plan.RowsInFrame(f, keys.size());
      std::vector<float> g(n * kDim, 0.01f);
      frames.emplace_back(g.data(), g.size() * sizeof(float));
    }
    return frames;
  };
  // Fill the table (not timed), then the Zipf batches (unique keys, as a worker sends them).
  for (uint64_t first = 0; first < table_rows; first += kBatch) {
    std::vector<uint64_t> keys(std::min(kBatch, table_rows - first));
    for (uint64_t i = 0; i < keys.size(); ++i) keys[i] = first + i;
    auto frames = push(keys);
    shard.HandleMessage(frames);
  }
  std::mt19937_64 rng(11);
  const ZipfSampler zipf(table_rows, 1.05);
  std::vector<std::vector<uint64_t>> batches_keys;
  for (int b = 0; b < batches; ++b) batches_keys.push_back(DistinctZipfKeys(zipf, rng, kBatch));
  std::vector<std::vector<zmq::message_t>> messages;
  for (const auto& keys : batches_keys) messages.push_back(push(keys));
  const auto a = std::chrono::steady_clock::now();
  for (auto& frames : messages) shard.HandleMessage(frames);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - a).count();
  const double rate = static_cast<double>(batches) * kBatch / s;

  // The ceiling: the same updates on a flat array of rows.
  const Optimizer optimizer(m->tables[0].optimizer);
  const uint32_t row_floats = kDim + optimizer.SparseStateFloats(kDim);
  std::vector<float> table(table_rows * row_floats, 0.01f);
  for (uint64_t r = 0; r < table_rows; ++r) {
    float* row = table.data() + r * row_floats;
    optimizer.InitState(row, optimizer.SparseState(row, kDim), kDim);
  }
  const std::vector<float> grad(kDim, 0.01f);
  const auto* g = reinterpret_cast<const std::byte*>(grad.data());
  const auto c0 = std::chrono::steady_clock::now();
  for (const auto& keys : batches_keys) {
    for (uint64_t k : keys) {
      float* row = table.data() + k * row_floats;
      optimizer.Apply(row, optimizer.SparseState(row, kDim), g, kDim, 1.0);
    }
  }
  const double cs = std::chrono::duration<double>(std::chrono::steady_clock::now() - c0).count();
  const double ceiling = static_cast<double>(batches) * kBatch / cs;
  rows->push_back({"sparse_update_inprocess_random_access_ceiling", ceiling, "rows/s",
                   std::nullopt, "", std::nullopt});
  rows->push_back({"sparse_update_inprocess_rows_per_s", rate, "rows/s", ceiling,
                   "sparse_update_inprocess_random_access_ceiling", std::nullopt});
}

void ConsistencyRows(const Options& opt, std::vector<Row>* rows) {
  constexpr int kWorkers = 4;
  const int steps = opt.quick ? 15 : 40;
  constexpr double kStepMs = 10.0, kSlowStepMs = 12.0;  // one worker 20% slower
  constexpr uint32_t kKeys = 2000;
  // With no waiting at all, each worker would run at its own pace.
  const double ideal = (kWorkers - 1) * 1000.0 / kStepMs + 1000.0 / kSlowStepMs;
  const std::vector<std::pair<std::string, std::string>> modes = {
      {"bsp", "  consistency: bsp\n"},
      {"ssp1", "  consistency: ssp\n  staleness: 1\n"},
      {"ssp4", "  consistency: ssp\n  staleness: 4\n"},
      {"asp", "  consistency: asp\n"}};
  for (const auto& [name, training] : modes) {
    BenchCluster cluster("  - {name: emb, kind: sparse, dim: 16}\n", 2, "training:\n" + training,
                         kWorkers);
    std::vector<std::thread> threads;
    std::atomic<int> failures{0};
    const auto start = std::chrono::steady_clock::now();
    for (int w = 0; w < kWorkers; ++w) {
      threads.emplace_back([&, w] {
        auto client = PsClient::Connect(cluster.manifest(), w);
        if (!client.ok()) {
          ++failures;
          return;
        }
        std::mt19937_64 rng(w);
        const ZipfSampler zipf(1000000, 1.05);
        std::vector<uint64_t> keys(kKeys);
        std::vector<float> rows(kKeys * 16), grads(kKeys * 16, 0.001f);
        const double step_ms = w == kWorkers - 1 ? kSlowStepMs : kStepMs;
        for (int t = 0; t < steps; ++t) {
          for (auto& k : keys) k = zipf(rng);
          if (!(*client)->PullSparse(0, keys, rows.data()).ok()) {
            ++failures;
            return;
          }
          // The step's computation, as time spent off the servers.
          std::this_thread::sleep_for(std::chrono::microseconds(int64_t(step_ms * 1000)));
          if (!(*client)->PushSparse(0, keys, grads).ok() || !(*client)->Tick().ok()) {
            ++failures;
            return;
          }
        }
      });
    }
    for (auto& t : threads) t.join();
    const double wall =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (failures > 0) {
      spdlog::error("consistency bench {}: {} workers failed", name, failures.load());
      continue;
    }
    auto observer = PsClient::Connect(cluster.manifest(), PsClient::kObserver);
    double wait_ms = 0, pulls = 0;
    if (observer.ok()) {
      auto stats = (*observer)->Stats();
      if (stats.ok()) {
        for (const std::string& st : *stats) {
          wait_ms += JsonFigure(st, "/pull_wait_ms_total");
          pulls += JsonFigure(st, "/ops/PullSparse");
        }
      }
    }
    rows->push_back({"steps_per_s_4workers_1slow_" + name, kWorkers * steps / wall, "steps/s",
                     ideal, "no_wait_steps", std::nullopt});
    rows->push_back({"mean_pull_wait_" + name, pulls > 0 ? wait_ms / pulls : 0.0, "ms",
                     std::nullopt, "", std::nullopt});
  }
}

// Trains dlrm-small through `parasol launch` (servers and workers as processes); the summary.
// `extra`: more manifest sections (e.g. a worker.command).
// `training`: the consistency fields of the manifest's training map (BSP by default).
std::string LaunchTraining(const std::string& data, int shards, int workers, int batch,
                           const std::string& extra = "",
                           const std::string& training = "consistency: bsp",
                           std::string* log = nullptr) {
  char tmpl[] = "/tmp/parasol-bench-train-XXXXXX";
  const std::string dir = ::mkdtemp(tmpl) ? tmpl : "/tmp";
  std::string y = "cluster:\n  servers:\n";
  const std::vector<uint16_t> ports = *PickFreePorts(shards);
  for (int s = 0; s < shards; ++s) y += "    - 127.0.0.1:" + std::to_string(ports[s]) + "\n";
  y += "  workers: " + std::to_string(workers) + "\n";
  y += "training: {" + training + ", batch_size: " + std::to_string(batch) +
       ", epochs: 1, progress_every: 1h}\n";
  y += "model:\n  kind: dlrm\n  embedding_dim: 16\n  bottom: [64, 16]\n  top: [64, 1]\n"
       "  sparse_optimizer: {kind: adagrad, lr: 0.05, eps: 1e-8}\n"
       "  dense_optimizer: {kind: adam, lr: 0.001}\n";
  y += "data:\n  train: " + data + "\n";
  y += extra;
  std::ofstream(dir + "/job.yaml") << y;
  auto p = Subprocess::Spawn({BenchCluster::SelfDir() + "/parasol", "launch", dir + "/job.yaml",
                              "--summary", dir + "/summary.json"},
                             dir + "/launch.log");
  std::string summary;
  if (p.ok() && p->Wait(std::chrono::minutes(10))) {
    std::ifstream in(dir + "/summary.json");
    std::stringstream s;
    s << in.rdbuf();
    summary = s.str();
  }
  if (log) {
    std::ifstream in(dir + "/launch.log");
    std::stringstream s;
    s << in.rdbuf();
    *log = s.str();
  }
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
  return summary;
}

// The share of a job's training time (the worker's train_seconds) the shards' request threads
// spent serving, averaged over the shards, from the stats each shard logs as it stops ("shard N
// stopping: {...}", in a launch's log): near 1, the shards' cores bound the job; well below, the
// shards wait for the workers or the network. The serving counted includes the little before
// and after the training (greetings, barriers), so a share a little above what the training
// alone had, never below. -1 unless the log holds the stats of `expected_shards` shards, each
// once.
double ShardBusyShare(const std::string& log, int expected_shards, double train_seconds) {
  double serving = 0;
  int shards = 0;
  const std::string mark = " stopping: {";
  for (size_t at = log.find(mark); at != std::string::npos; at = log.find(mark, at + 1)) {
    const size_t begin = at + mark.size() - 1;
    const size_t end = log.find('\n', begin);
    const Json j = Json::parse(log.substr(begin, end == std::string::npos ? end : end - begin),
                               nullptr, false);
    // Only whole stats count (a line cut short, or of another build, is not a shard's).
    constexpr const char* kKeys[] = {"seconds_serving_pushes", "seconds_serving_ticks",
                                     "seconds_serving_pulls", "seconds_serving_other"};
    if (j.is_discarded() || !j.is_object() || !j.contains("seconds_waiting") ||
        !std::all_of(std::begin(kKeys), std::end(kKeys), [&](const char* key) {
          return j.contains(key) && j[key].is_number();
        })) {
      continue;
    }
    ++shards;
    for (const char* key : kKeys) serving += j[key].get<double>();
  }
  // Every shard's once (a shard restarted, or one that logged none, would skew the mean).
  if (shards != expected_shards || train_seconds <= 0) return -1;
  return serving / (shards * train_seconds);
}


// The worker row cache under SSP (staleness 4) on Zipf data: pull bytes per step and eval AUC
// with and without it (2 workers, 1 server, dlrm with an SGD embedding: the worker's own pushes
// reach its cached rows by SGD's rule).
// The share of pulled row bytes a perfect cache bounded by `staleness` could save: each
// worker's batches as its reader hands them out, a batch's distinct keys, and a key counted as
// saved when this worker pulled it at most `staleness` batches before. A row read at clock c
// holds the updates of the clocks before c only, so it answers pulls up to clock c + staleness
// and no later, however often it was read from the cache in between: a key the batch reads
// after that is pulled again. This is the best case of every cache that keeps the bound (the
// pull reads at the clock of its own step, never earlier; a prefetch reads one clock earlier,
// and a worker ahead of another reads at the other's clock). `read_lag`: how many clocks before
// the step it is for a pull reads (1: a prefetch one step ahead), which shortens the bound.
// Every key costs the same bytes (key and row), so the share of keys is the share of bytes.
std::optional<double> PerfectCacheSavedShare(const std::string& file, uint32_t workers,
                                             uint32_t batch, uint32_t staleness,
                                             uint32_t read_lag = 0) {
  uint64_t keys = 0, saved = 0;
  for (uint32_t w = 0; w < workers; ++w) {
    ReaderOptions ro;
    ro.files = {file};
    ro.batch_size = batch;
    ro.rank = w;
    ro.workers = workers;
    BatchReader reader(ro);
    std::unordered_map<uint64_t, uint64_t> pulled_at;  // key -> the batch that last pulled it
    std::unordered_set<uint64_t> distinct;
    for (uint64_t step = 0;; ++step) {
      Result<std::optional<Batch>> b = reader.Next();
      if (!b.ok()) return std::nullopt;
      if (!*b) break;
      distinct.clear();
      distinct.insert((*b)->keys.begin(), (*b)->keys.end());
      keys += distinct.size();
      for (uint64_t k : distinct) {
        auto [it, first] = pulled_at.try_emplace(k, step);
        if (!first && step - it->second + read_lag <= staleness) {
          ++saved;
        } else {
          it->second = step;
        }
      }
    }
  }
  if (keys == 0) return std::nullopt;
  return static_cast<double>(saved) / static_cast<double>(keys);
}

void CacheRows(const Options& opt, std::vector<Row>* rows) {
  char tmpl[] = "/tmp/parasol-bench-cache-XXXXXX";
  const std::string dir = ::mkdtemp(tmpl) ? tmpl : "/tmp";
  GeneratorOptions g;
  g.rows = opt.quick ? 50000 : 200000;
  if (!GenerateCriteo(dir + "/train.tsv", g).ok()) return;
  g.rows = 20000;
  g.seed = 5;
  if (!GenerateCriteo(dir + "/eval.tsv", g).ok()) return;
  auto run = [&](uint64_t cache_rows) -> std::string {
    const std::vector<uint16_t> ports = *PickFreePorts(1);
    const std::string name = "cache" + std::to_string(cache_rows);
    std::ofstream(dir + "/" + name + ".yaml")
        << "cluster:\n  servers: [127.0.0.1:" << ports[0] << "]\n  workers: 2\n"
        << "training: {consistency: ssp, staleness: 4, batch_size: 256, epochs: 1, "
           "progress_every: 1h}\n"
        << "model:\n  kind: dlrm\n  embedding_dim: 16\n  bottom: [64, 16]\n  top: [64, 1]\n"
           "  sparse_optimizer: {kind: sgd, lr: 0.05}\n"
           "  dense_optimizer: {kind: adam, lr: 0.001}\n"
        << "data: {train: " << dir << "/train.tsv, eval: " << dir << "/eval.tsv}\n"
        << "worker: {cache_rows: " << cache_rows << "}\n";
    auto p = Subprocess::Spawn({BenchCluster::SelfDir() + "/parasol", "launch",
                                dir + "/" + name + ".yaml", "--summary",
                                dir + "/" + name + ".json"},
                               dir + "/" + name + ".log");
    if (!p.ok() || !p->Wait(std::chrono::minutes(10))) return "";
    std::ifstream in(dir + "/" + name + ".json");
    std::stringstream text;
    text << in.rdbuf();
    return text.str();
  };
  const std::string off = run(0), on = run(1000000);
  if (!off.empty() && !on.empty()) {
    const double off_bytes = JsonFigure(off, "/workers/0/pull_bytes_per_step");
    const double on_bytes = JsonFigure(on, "/workers/0/pull_bytes_per_step");
    rows->push_back({"pull_bytes_per_step_ssp4_nocache", off_bytes, "B", std::nullopt, "",
                     std::nullopt});
    rows->push_back({"pull_bytes_per_step_ssp4_cache", on_bytes, "B", std::nullopt, "",
                     std::nullopt});
    // What the cache saved, next to what a perfect cache within the same bound could.
    const std::optional<double> best = PerfectCacheSavedShare(dir + "/train.tsv", 2, 256, 4);
    rows->push_back({"pull_bytes_saved_ssp4_cache", off_bytes > 0 ? 1.0 - on_bytes / off_bytes : 0.0,
                     "share", best, best ? "perfect_cache_ssp4" : "", std::nullopt});
    // The same best case when each pull reads one clock before its step, as a prefetch does.
    const std::optional<double> prefetched =
        PerfectCacheSavedShare(dir + "/train.tsv", 2, 256, 4, /*read_lag=*/1);
    if (prefetched) {
      rows->push_back({"perfect_cache_ssp4_prefetch1", *prefetched, "share", std::nullopt, "",
                       std::nullopt});
    }
    rows->push_back({"eval_auc_ssp4_nocache", JsonFigure(off, "/eval_auc"), "", std::nullopt, "",
                     std::nullopt});
    rows->push_back({"eval_auc_ssp4_cache", JsonFigure(on, "/eval_auc"), "", std::nullopt, "",
                     std::nullopt});
  }
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
}

// The dlrm-small model of the elastic and reshard rows (a manifest's `model:` section).
constexpr const char* kSmallDlrmYaml =
    "model:\n  kind: dlrm\n  embedding_dim: 16\n  bottom: [64, 16]\n  top: [64, 1]\n"
    "  sparse_optimizer: {kind: adagrad, lr: 0.05, eps: 1e-8}\n"
    "  dense_optimizer: {kind: adam, lr: 0.001}\n";

// Each step's end time (steady clock seconds) from a worker's --step-times file.
std::map<int64_t, double> StepTimes(const std::string& path) {
  std::map<int64_t, double> t;
  std::ifstream in(path);
  int64_t step = 0;
  double at = 0;
  while (in >> step >> at) t[step] = at;
  return t;
}

// A job changing size (docs/operations.md, "Changing a job's size"): dlrm-small, batch 1024, BSP, one
// server, two workers (cluster.max_workers 3). Worker 2 joins once the job passes clock 40;
// worker 1 is sent SIGTERM 60 clocks after the join. From worker 0's step end times:
// the seconds lost to each change are what the 4 steps from its clock took beyond 4 ordinary
// steps of the new membership (the median of the steps 5 to 35 clocks after it); and how long
// the joining process took from its start to the end of its first step.
void ElasticRows(const Options& opt, std::vector<Row>* rows) {
  char tmpl[] = "/tmp/parasol-bench-elastic-XXXXXX";
  const std::string dir = ::mkdtemp(tmpl) ? tmpl : "/tmp";
  GeneratorOptions g;
  g.rows = opt.quick ? 50000 : 200000;
  if (!GenerateCriteo(dir + "/train.tsv", g).ok()) return;
  const uint64_t epochs = 1500000 / g.rows;  // about 600 steps of 2 workers
  const uint16_t port = PickFreePorts(1)->at(0);
  const std::string path = dir + "/job.yaml";
  std::ofstream(path) << "cluster:\n  servers: [127.0.0.1:" << port
                      << "]\n  workers: 2\n  max_workers: 3\n"
                      << "training: {consistency: bsp, batch_size: 1024, epochs: " << epochs
                      << ", progress_every: 1h}\n"
                      << kSmallDlrmYaml << "data:\n  train: " << dir << "/train.tsv\n";
  Result<Manifest> manifest = LoadManifest(path);
  if (!manifest.ok()) return;
  const std::string self = BenchCluster::SelfDir() + "/parasol";
  auto server = Subprocess::Spawn({self, "server", "--manifest", path, "--rank", "0"},
                                  dir + "/server.log");
  std::vector<Subprocess> workers;
  auto start_worker = [&](int rank) {
    const std::string r = std::to_string(rank);
    auto p = Subprocess::Spawn({self, "worker", "--manifest", path, "--rank", r, "--step-times",
                                dir + "/times" + r},
                               dir + "/worker" + r + ".log");
    if (p.ok()) workers.push_back(std::move(*p));
  };
  start_worker(0);
  start_worker(1);
  auto observer = PsClient::Connect(*manifest, PsClient::kObserver);
  if (!server.ok() || workers.size() != 2 || !observer.ok()) {
    spdlog::error("elastic bench: the job did not start");
    return;
  }
  auto newest = [&]() -> int64_t {
    auto stats = (*observer)->Stats();
    if (!stats.ok() || stats->empty()) return -1;
    const Json j = Json::parse((*stats)[0], nullptr, false);
    if (j.is_discarded() || !j.contains("worker_clocks")) return -1;
    int64_t m = -1;
    for (const auto& c : j["worker_clocks"]) m = std::max<int64_t>(m, c.get<int64_t>());
    return m;
  };
  auto wait_for = [&](int64_t clock) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::minutes(5);
    while (std::chrono::steady_clock::now() < deadline) {
      if (newest() >= clock) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    return false;
  };
  double started = 0;
  bool ok = wait_for(40);
  if (ok) {
    started = std::chrono::duration<double>(
                  std::chrono::steady_clock::now().time_since_epoch()).count();
    start_worker(2);
    ok = (*observer)->SyncMembership().ok();
    for (int i = 0; ok && i < 5000 && !(*observer)->membership().Joined(2); ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
      ok = (*observer)->SyncMembership().ok();
    }
  }
  ok = ok && (*observer)->membership().Joined(2) &&
       wait_for((*observer)->membership().join(2) + 60);
  if (ok && workers.size() == 3) workers[1].Signal(SIGTERM);
  for (Subprocess& w : workers) {
    auto st = w.Wait(std::chrono::minutes(5));
    ok = ok && st && WIFEXITED(*st) && WEXITSTATUS(*st) == 0;
  }
  ok = ok && (*observer)->SyncMembership().ok();
  const Membership m = (*observer)->membership();
  (void)(*observer)->Shutdown();
  if (server.ok()) (void)server->Wait(std::chrono::seconds(30));
  const int64_t join = m.join(2), leave = m.leave(1);
  const std::map<int64_t, double> t0 = StepTimes(dir + "/times0");
  const std::map<int64_t, double> t2 = StepTimes(dir + "/times2");
  std::error_code ec;
  if (!ok || join < 0 || leave < 0 || t2.empty()) {
    spdlog::error("elastic bench: the job with a join and a leave failed (logs in {})", dir);
    return;
  }
  // Beyond 4 ordinary steps, what the 4 steps from `clock` took (ordinary: the median of the
  // steps 5 to 35 clocks after it).
  auto lost = [&](int64_t clock) -> std::optional<double> {
    std::vector<double> after;
    for (int64_t c = clock + 5; c <= clock + 35; ++c) {
      if (t0.count(c) && t0.count(c - 1)) after.push_back(t0.at(c) - t0.at(c - 1));
    }
    if (after.size() < 10 || !t0.count(clock - 1) || !t0.count(clock + 3)) return std::nullopt;
    return (t0.at(clock + 3) - t0.at(clock - 1)) - 4 * Median(after);
  };
  const std::optional<double> join_lost = lost(join), leave_lost = lost(leave);
  if (join_lost) {
    rows->push_back({"elastic_join_lost_seconds", *join_lost, "s", std::nullopt, "", std::nullopt});
  }
  if (leave_lost) {
    rows->push_back({"elastic_leave_lost_seconds", *leave_lost, "s", std::nullopt, "",
                     std::nullopt});
  }
  rows->push_back({"elastic_join_first_step_seconds", t2.begin()->second - started, "s",
                   std::nullopt, "", std::nullopt});
  std::vector<double> before;
  for (int64_t c = join - 30; c < join - 2; ++c) {
    if (t0.count(c) && t0.count(c - 1)) before.push_back(t0.at(c) - t0.at(c - 1));
  }
  rows->push_back({"elastic_step_seconds_2w", Median(before), "s", std::nullopt, "",
                   std::nullopt});
  std::filesystem::remove_all(dir, ec);
}

// A shard added to a running job (docs/operations.md, "Changing a job's size"): dlrm-small, batch 1024,
// BSP, one worker, 3 shards listed and 2 holding keys, its embedding table filled with 10^7 rows
// (10^6 with --quick) before training starts. Once the job has trained a while, `parasol scale
// --servers 3` moves a third of the rows to the third shard while training goes on. Rows: the
// rows copied ahead per second, next to what the loopback allows (each row crosses it twice,
// shard to tool to shard: the raw ZeroMQ round trip of a 16 MiB page, the best of several),
// the seconds from the change's naming to the last commit (the pause of training's pulls), and
// the worker's samples/s during the change next to the 3 s before it.
void ReshardRows(const Options& opt, RawEcho& echo, std::vector<Row>* rows) {
  char tmpl[] = "/tmp/parasol-bench-reshard-XXXXXX";
  const std::string dir = ::mkdtemp(tmpl) ? tmpl : "/tmp";
  GeneratorOptions g;
  g.rows = 200000;
  if (!GenerateCriteo(dir + "/train.tsv", g).ok()) return;
  const uint64_t table_rows = opt.quick ? 1000000 : 10000000;
  const std::vector<uint16_t> ports = *PickFreePorts(3);
  const std::string path = dir + "/job.yaml";
  std::ofstream(path) << "cluster:\n  servers: [127.0.0.1:" << ports[0] << ", 127.0.0.1:"
                      << ports[1] << ", 127.0.0.1:" << ports[2]
                      << "]\n  initial_servers: 2\n  workers: 1\n"
                      << "training: {consistency: bsp, batch_size: 1024, epochs: 40"
                      << ", progress_every: 1h}\n"
                      << kSmallDlrmYaml << "data:\n  train: " << dir << "/train.tsv\n";
  Result<Manifest> manifest = LoadManifest(path);
  if (!manifest.ok()) return;
  const std::string self = BenchCluster::SelfDir() + "/parasol";
  std::vector<Subprocess> servers;
  for (int s = 0; s < 3; ++s) {
    auto p = Subprocess::Spawn({self, "server", "--manifest", path, "--rank", std::to_string(s)},
                               dir + "/server" + std::to_string(s) + ".log");
    if (p.ok()) servers.push_back(std::move(*p));
  }
  auto observer = PsClient::Connect(*manifest, PsClient::kObserver);
  const int table = manifest->FindTable(LayoutOf(manifest->model).sparse_table);
  if (servers.size() != 3 || !observer.ok() || table < 0) {
    spdlog::error("reshard bench: the shards did not start");
    return;
  }
  // The table's rows: keys outside the data's, created by reading them at clock 0 as worker 0
  // (only the job's workers' pulls create rows); the training worker then starts as rank 0.
  {
    auto filler = PsClient::Connect(*manifest, 0);
    if (!filler.ok()) {
      spdlog::error("reshard bench: {}", filler.status().ToString());
      return;
    }
    const uint64_t batch = 250000;
    const uint32_t dim = manifest->tables[table].dim;
    std::vector<uint64_t> keys(batch);
    std::vector<float> out(batch * dim);
    for (uint64_t first = 0; first < table_rows; first += batch) {
      for (uint64_t i = 0; i < batch; ++i) keys[i] = (uint64_t{1} << 60) + first + i;
      if (!(*filler)->PullSparse(table, keys, out.data()).ok()) {
        spdlog::error("reshard bench: filling the table failed");
        return;
      }
    }
  }
  auto worker = Subprocess::Spawn({self, "worker", "--manifest", path, "--rank", "0",
                                   "--step-times", dir + "/times0"},
                                  dir + "/worker0.log");
  if (!worker.ok()) return;
  auto now = [] {
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch())
        .count();
  };
  // Trains 4 s, then the change.
  std::this_thread::sleep_for(std::chrono::seconds(4));
  const double begin = now();
  auto tool = Subprocess::Spawn({self, "scale", "--manifest", path, "--servers", "3"},
                                dir + "/scale.log");
  std::optional<int> st;
  if (tool.ok()) st = tool->Wait(std::chrono::minutes(10));
  const double end = now();
  const bool ok = st && WIFEXITED(*st) && WEXITSTATUS(*st) == 0;
  std::this_thread::sleep_for(std::chrono::seconds(3));  // the "after" window
  worker->Signal(SIGKILL);
  (void)worker->Wait(std::chrono::seconds(10));
  (void)(*observer)->Shutdown();
  for (Subprocess& s : servers) (void)s.Wait(std::chrono::seconds(60));
  std::ifstream log(dir + "/scale.log");
  std::string line, report;
  while (std::getline(log, line)) {
    if (line.find("rows copied ahead") != std::string::npos) report = line;
  }
  double ahead_rows = 0, ahead_s = 0, moved = 0, elements = 0, copy_s = 0;
  const bool parsed =
      std::sscanf(report.c_str() + (report.find(':') == std::string::npos ? 0 : report.find(':') + 1),
                  " %lf rows copied ahead in %lf s (%*f rows/s) while training went on, then "
                  "%lf rows updated since and %lf dense elements in %lf s",
                  &ahead_rows, &ahead_s, &moved, &elements, &copy_s) == 5;
  if (!ok || !parsed) {
    spdlog::error("reshard bench: the change failed (logs in {})", dir);
    return;
  }
  // Samples a second from the worker's step end times within [from, to).
  const std::map<int64_t, double> times = StepTimes(dir + "/times0");
  auto rate = [&](double from, double to) {
    uint64_t steps = 0;
    for (const auto& [step, at] : times) steps += at >= from && at < to ? 1 : 0;
    return to > from ? steps * 1024.0 / (to - from) : 0.0;
  };
  const uint32_t floats = 1 + 16 + 16;  // the clock word, the values, adagrad's state
  const double row_bytes = sizeof(uint64_t) + sizeof(float) * floats;
  const uint64_t page = uint64_t{16} << 20;
  const double echo_s = echo.RoundTrip(page, 3, opt.quick ? 5 : 10);
  const double ceiling = (2.0 * page / echo_s) / (2.0 * row_bytes);
  rows->push_back({"reshard_rows_copied_ahead_per_s_" + std::to_string(table_rows) + "_rows",
                   ahead_rows / ahead_s, "rows/s", ceiling, "zmq_roundtrip_16MB_twice", std::nullopt});
  rows->push_back({"reshard_rows_copied_ahead", ahead_rows, "rows", std::nullopt, "",
                   std::nullopt});
  rows->push_back({"reshard_rows_copied_at_the_change", moved, "rows", std::nullopt, "",
                   std::nullopt});
  rows->push_back({"reshard_dense_elements_moved", elements, "elements", std::nullopt, "",
                   std::nullopt});
  rows->push_back({"reshard_change_pause_seconds", copy_s, "s", std::nullopt, "", std::nullopt});
  rows->push_back({"reshard_train_samples_per_s_during", rate(begin, end), "samples/s",
                   std::nullopt, "", std::nullopt});
  rows->push_back({"reshard_train_samples_per_s_before", rate(begin - 3, begin), "samples/s",
                   std::nullopt, "", std::nullopt});
  rows->push_back({"reshard_train_samples_per_s_after", rate(end, end + 3), "samples/s",
                   std::nullopt, "", std::nullopt});
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
}

std::string TrainingData(const Options& opt, const std::string& dir) {
  GeneratorOptions g;
  g.rows = opt.quick ? 50000 : 200000;
  const std::string path = dir + "/train.tsv";
  if (!GenerateCriteo(path, g).ok()) return "";
  return path;
}

void TrainingRows(const std::string& data, std::vector<Row>* rows) {
  for (auto [shards, workers] : {std::pair{1, 1}, std::pair{2, 2}}) {
    const std::string summary = LaunchTraining(data, shards, workers, 1024);
    if (summary.empty()) {
      spdlog::error("training bench: the job with {} servers and {} workers failed", shards,
                    workers);
      continue;
    }
    const std::string tag = std::to_string(shards) + "s" + std::to_string(workers) + "w";
    const double rate = JsonFigure(summary, "/samples_per_second");
    rows->push_back({"train_dlrm_small_b1024_" + tag, rate, "samples/s", std::nullopt, "",
                     std::nullopt});
    // Worker 0's time, by phase, as a share of all of it: its training time and its wait at
    // the end for the other workers (counted as wait; the job's train_seconds leaves it out,
    // so shares of that could add up to more than 100%).
    const char* phases[] = {"data", "pull", "compute", "push", "wait"};
    double total = 0;
    for (const std::string phase : phases) {
      total += JsonFigure(summary, "/workers/0/time_split/" + phase);
    }
    for (const std::string phase : phases) {
      const double spent = JsonFigure(summary, "/workers/0/time_split/" + phase);
      rows->push_back({"train_split_" + tag + "_" + phase, total > 0 ? 100.0 * spent / total : 0.0,
                       "%", std::nullopt, "", std::nullopt});
    }
  }
}

// Calls fn on each batch of `file` at `batch_size`, deduplicated as the trainer's reader does;
// the samples read, or -1 (logged under `what`) when the reader fails.
int64_t ForEachBatch(const std::string& file, uint32_t batch_size, const char* what,
                     const std::function<void(const Batch&)>& fn, uint32_t reader_threads = 1) {
  ReaderOptions ro;
  ro.files = {file};
  ro.batch_size = batch_size;
  ro.deduplicate = true;
  ro.reader_threads = reader_threads;
  BatchReader reader(ro);
  int64_t samples = 0;
  while (true) {
    Result<std::optional<Batch>> b = reader.Next();
    if (!b.ok()) {
      spdlog::error("{}: {}", what, b.status().ToString());
      return -1;
    }
    if (!b->has_value()) return samples;
    samples += (*b)->size;
    fn(**b);
    reader.Recycle(std::move(**b));
  }
}

// The feed ceiling: the rows and dense tensors a worker's steps pull and push, handled by one
// shard in this process (no sockets, no worker), with the job's server settings (its engine
// threads): dlrm-small's tables, each batch of `data` at `batch`, its distinct keys pulled and
// then pushed, every dense tensor pulled and pushed. ASP, so no clock holds a request, and each
// push is applied as it comes (BSP adds the sums' work). Samples/s over the whole pass, and
// over the batches after the first kRateWarmupSteps (handled first, untimed apart: the rows
// they create are there, as in the job's steady steps), the latter 0 when fewer than
// kSteadyBatches follow them; both 0 where the pass failed.
//
// kSteadyBatches: three times the reader's queue (data.queue_batches, 8). When the job's
// steady clock starts, its reader has read up to that many batches ahead, work the window
// does not count; over this many batches or more it is a small part of the window.
constexpr int64_t kSteadyBatches = 24;
struct FeedRate {
  double whole = 0;
  double steady = 0;
};
FeedRate InProcessFeedRate(const std::string& data, uint32_t batch) {
  Result<Manifest> m = ParseManifest(
      "cluster:\n  servers: [127.0.0.1:1]\n  workers: 1\n"
      "training: {consistency: asp}\n"
      "model:\n  kind: dlrm\n  embedding_dim: 16\n  bottom: [64, 16]\n  top: [64, 1]\n"
      "  sparse_optimizer: {kind: adagrad, lr: 0.05, eps: 1e-8}\n"
      "  dense_optimizer: {kind: adam, lr: 0.001}\n",
      "bench");
  if (!m.ok()) {
    spdlog::error("feed bench: {}", m.status().ToString());
    return {};
  }
  ShardServer shard(*m, 0);
  uint64_t replies = 0, refused = 0;
  std::string refusal;
  shard.set_reply_sink([&](std::vector<zmq::message_t>& frames) {
    ++replies;
    Result<Header> h = frames.size() < 2 ? Result<Header>(Internal("no header"))
                                         : DecodeHeader(frames[1].data(), frames[1].size());
    if (!h.ok() || h->status != StatusCode::kOk) {
      ++refused;
      refusal = h.ok() ? h->message : h.status().ToString();
    }
  });
  const uint32_t emb = static_cast<uint32_t>(m->FindTable(LayoutOf(m->model).sparse_table));
  const uint32_t dim = m->tables[emb].dim;
  uint64_t next = 0, pushes = 0;
  auto header = [&](Op op, uint32_t table, uint64_t count, uint32_t value_dim) {
    Header h;
    h.op = op;
    h.request_id = ++next;
    h.worker_id = 0;
    h.incarnation = 1;
    h.table_id = table;
    h.clock = 0;
    h.key_count = count;
    h.value_dim = value_dim;
    h.manifest_hash = m->Fingerprint();
    return h;
  };
  auto values = [&](Header& h, std::vector<zmq::message_t>& frames, uint64_t rows, uint32_t d) {
    const FramePlan plan = PlanValueFrames(rows, d, m->server.frame_bytes);
    h.seq = pushes++;  // a push's name: its index among clock 0's, from 0 without gaps
    h.value_frames = plan.frames;
    h.rows_per_frame = plan.rows_per_frame;
    frames[1] = EncodeHeader(h);
    for (uint32_t f = 0; f < plan.frames; ++f) {
      std::vector<float> g(plan.RowsInFrame(f, rows) * d, 1e-4f);
      frames.emplace_back(g.data(), g.size() * sizeof(float));
    }
  };
  // Every message first (not timed), from the batches as a worker reads them.
  std::vector<std::vector<zmq::message_t>> messages;
  size_t warm_messages = 0;  // the messages of the first kRateWarmupSteps batches
  int64_t warm_samples = 0, batches = 0;
  const int64_t samples = ForEachBatch(data, batch, "feed bench", [&](const Batch& b) {
    if (static_cast<uint64_t>(batches++) == kRateWarmupSteps) warm_messages = messages.size();
    if (static_cast<uint64_t>(batches) <= kRateWarmupSteps) warm_samples += b.size;
    const std::vector<uint64_t>& keys = b.distinct.unique;
    for (Op op : {Op::PullSparse, Op::PushSparse}) {
      std::vector<zmq::message_t> frames;
      frames.emplace_back("w0", 2);
      Header h = header(op, emb, keys.size(), dim);
      frames.push_back(EncodeHeader(h));
      frames.emplace_back(keys.data(), keys.size() * sizeof(uint64_t));
      if (op == Op::PushSparse) values(h, frames, keys.size(), dim);
      messages.push_back(std::move(frames));
    }
    for (uint32_t t = 0; t < m->tables.size(); ++t) {
      if (m->tables[t].kind != TableKind::kDense) continue;
      const uint64_t n = m->tables[t].NumElements();
      for (Op op : {Op::PullDense, Op::PushDense}) {
        std::vector<zmq::message_t> frames;
        frames.emplace_back("w0", 2);
        Header h = header(op, t, n, 1);
        frames.push_back(EncodeHeader(h));
        if (op == Op::PushDense) values(h, frames, n, 1);
        messages.push_back(std::move(frames));
      }
    }
  });
  if (samples <= 0) return {};
  const bool steady_too = batches - static_cast<int64_t>(kRateWarmupSteps) >= kSteadyBatches;
  if (!steady_too) warm_messages = messages.size();  // the whole pass, timed as one
  const auto a = std::chrono::steady_clock::now();
  for (size_t i = 0; i < warm_messages; ++i) shard.HandleMessage(messages[i]);
  const auto b = std::chrono::steady_clock::now();
  for (size_t i = warm_messages; i < messages.size(); ++i) shard.HandleMessage(messages[i]);
  const auto c = std::chrono::steady_clock::now();
  if (replies != messages.size() || refused > 0) {
    spdlog::error("feed bench: the shard answered {} of {} requests, {} refused ({})", replies,
                  messages.size(), refused, refusal);
    return {};
  }
  const double whole = std::chrono::duration<double>(c - a).count();
  const double steady = std::chrono::duration<double>(c - b).count();
  if (whole <= 0) return {};
  return {samples / whole, steady_too && steady > 0 ? (samples - warm_samples) / steady : 0};
}

// A worker's reader alone (batches of 4096, deduplicated as the trainer's reader does, with
// `threads` reader threads: data.reader_threads) over `file`: samples/s, or 0.
double ReaderRate(const std::string& file, uint32_t threads = 1) {
  const auto a = std::chrono::steady_clock::now();
  const int64_t samples =
      ForEachBatch(file, 4096, "reader bench", [](const Batch&) {}, threads);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - a).count();
  return samples > 0 && s > 0 ? samples / s : 0;
}

// The reader over text and over its binary copy (parasol convert), both in the page cache. The
// ceilings: reading the text file's bytes from the page cache, and copying the binary file's
// bytes in memory (memcpy), each per row.
void ReaderRows(const std::string& text, const std::string& dir, std::vector<Row>* rows) {
  const std::string bin = dir + "/reader.bin";
  Result<ConvertReport> converted = ConvertCriteo(text, bin, true, DataOptions::OnBadRow::kFail);
  if (!converted.ok() || converted->rows == 0) {
    spdlog::error("reader bench: {}", converted.status().ToString());
    return;
  }
  const double n = static_cast<double>(converted->rows);
  FileReadBandwidth(text);  // into the page cache
  FileReadBandwidth(bin);
  // The best of three passes: one pass slowed by other work would understate the ceiling.
  const double text_gbs =
      std::max({FileReadBandwidth(text), FileReadBandwidth(text), FileReadBandwidth(text)});
  const double memcpy_gbs = MemcpyBandwidth(256 << 20, 3);
  const double text_rate = ReaderRate(text), bin_rate = ReaderRate(bin);
  const double text_bytes = static_cast<double>(std::filesystem::file_size(text));
  const double bin_bytes = static_cast<double>(std::filesystem::file_size(bin));
  rows->push_back({"reader_samples_per_s_text", text_rate, "samples/s",
                   text_gbs * 1e9 / (text_bytes / n), "page_cache_read_per_row", std::nullopt});
  rows->push_back({"reader_samples_per_s_binary", bin_rate, "samples/s",
                   memcpy_gbs * 1e9 / (bin_bytes / n), "memcpy_per_row", std::nullopt});
  // Text with as many parsing threads as cores (data.reader_threads), beside the reading one.
  const uint32_t cores = std::max(1u, std::thread::hardware_concurrency());
  const double text_all = ReaderRate(text, cores);
  spdlog::info("reader bench: text with {} reader threads: {:.0f} samples/s", cores, text_all);
  rows->push_back({"reader_samples_per_s_text_all_cores", text_all, "samples/s",
                   text_gbs * 1e9 / (text_bytes / n), "page_cache_read_per_row", std::nullopt});
  std::error_code ec;
  std::filesystem::remove(bin, ec);
}

// The feed group's data: `tag`.tsv in `dir`, FeedDataRows generated rows over `vocabulary` ids.
// Its path, or "" (logged) where it could not be written.
constexpr uint64_t kDlrmSmallVocabulary = 2000000;
constexpr uint64_t kVocab1e8Vocabulary = 46000000;  // 26 fields log-spaced up to 4.6 x 10^7
uint64_t FeedDataRows(const Options& opt) { return opt.quick ? 100000 : 400000; }
std::string FeedData(const Options& opt, const std::string& dir, const std::string& tag,
                     uint64_t vocabulary) {
  GeneratorOptions g;
  g.rows = FeedDataRows(opt);
  g.vocabulary = vocabulary;
  const std::string data = dir + "/" + tag + ".tsv";
  if (Status st = GenerateCriteo(data, g); !st.ok()) {
    spdlog::error("feed bench: {}", st.ToString());
    return "";
  }
  return data;
}

// What the parameter-server path can feed a device: a worker's whole step with the model's
// computation left out (worker.compute: none), one worker at batch 4096, BSP, with 1 and 2
// shards, on dlrm-small's generated data and on a vocabulary of about 10^8 ids (the generator's
// 26 fields log-spaced up to 4.6 x 10^7); dlrm-small's binary copy under SSP with prefetch too.
// The ceiling: the shards' in-process rate for the same rows (InProcessFeedRate, one shard with
// its engine threads, the best of one pass before each job and at least three), times the
// shards that have engine-threads' cores of their own on this host (at least 1). Each row is
// the steady rate, the worker's after its first kRateWarmupSteps steps, against the passes'
// over the same batches (as a device is fed once the job runs; the torch rows leave the same
// warm-up out); its _whole_run row is the whole run's against the whole passes'.
void FeedRows(const Options& opt, std::vector<Row>* rows) {
  char tmpl[] = "/tmp/parasol-bench-feed-XXXXXX";
  const std::string dir = ::mkdtemp(tmpl) ? tmpl : "/tmp";
  const uint32_t cores = std::max(1u, std::thread::hardware_concurrency());
  for (auto [tag, vocabulary] :
       {std::pair<std::string, uint64_t>{"dlrm_small", kDlrmSmallVocabulary},
        std::pair<std::string, uint64_t>{"vocab1e8", kVocab1e8Vocabulary}}) {
    const std::string data = FeedData(opt, dir, tag, vocabulary);
    if (data.empty()) continue;
    if (tag == "dlrm_small") ReaderRows(data, dir, rows);
    // The ceiling: the best of the in-process passes, one run right before each job and at
    // least three, each with a new shard (so each creates its rows, as the job's one pass
    // does). One pass slowed by other work would understate it, and a slower minute of the
    // machine falls on passes and jobs alike.
    FeedRate one_shard;
    int passes = 0, tries = 0;  // passes that gave a figure, of those tried
    auto pass = [&] {
      ++tries;
      const FeedRate r = InProcessFeedRate(data, 4096);
      if (r.whole <= 0) {
        spdlog::error("feed bench: an in-process pass over the {} data failed", tag);
        return;
      }
      one_shard.whole = std::max(one_shard.whole, r.whole);
      one_shard.steady = std::max(one_shard.steady, r.steady);
      ++passes;
    };
    pass();
    if (one_shard.whole <= 0) continue;
    if (one_shard.steady <= 0) {
      spdlog::error("feed bench: {} rows of {} data leave fewer than {} batches of 4096 after "
                    "the {} warm-up steps: no steady rows, only the _whole_run ones",
                    FeedDataRows(opt), tag, kSteadyBatches, kRateWarmupSteps);
    }
    const uint32_t threads = ServerOptions().engine_threads;  // the job's (the default)
    // dlrm-small's data also from its binary copy (parasol convert): the same rows, unparsed.
    const std::string bin = dir + "/" + tag + ".bin";
    const bool binary =
        tag == "dlrm_small" && ConvertCriteo(data, bin, true, DataOptions::OnBadRow::kFail).ok();
    struct Job {
      std::string name;
      double rate;    // after the worker's first kRateWarmupSteps steps
      double whole;   // over the whole run
      uint32_t own;  // shards with engine-threads' cores of their own
      double busy;  // the shards' share of the training time spent serving (ShardBusyShare)
    };
    std::vector<Job> jobs;
    auto run = [&](const std::string& name, const std::string& file, int shards,
                   const std::string& training) {
      pass();
      std::string log;
      const std::string summary =
          LaunchTraining(file, shards, 1, 4096, "worker: {compute: none}\n", training, &log);
      if (summary.empty()) {
        spdlog::error("feed bench: the job {} failed", name);
        return;
      }
      jobs.push_back({name, JsonFigure(summary, "/workers/0/samples_per_second_after_warmup"),
                      JsonFigure(summary, "/samples_per_second"),
                      std::max(1u, std::min<uint32_t>(shards, cores / std::max(1u, threads))),
                      ShardBusyShare(log, shards, JsonFigure(summary, "/workers/0/train_seconds"))});
    };
    for (int shards : {1, 2}) {
      const std::string stem = "feed_" + tag + "_b4096_" + std::to_string(shards) + "s";
      run(stem, data, shards, "consistency: bsp");
      if (!binary) continue;
      run(stem + "_binary", bin, shards, "consistency: bsp");
      // The binary data under SSP with the next two steps' rows pulled during each step
      // (training.prefetch_depth: 2), as a GPU worker that may read two clocks behind runs: the
      // pulls overlap the pushes. The ceiling is the same (its pass is ASP: no clock holds a
      // request).
      run(stem + "_binary_ssp2_depth2", bin, shards,
          "consistency: ssp, staleness: 2, prefetch_depth: 2");
    }
    while (passes < 3 && tries < 6) pass();
    // The steady rate (after the worker's warm-up steps) against the passes' over the same
    // batches; the whole run's against the whole passes'. A figure the job did not give (no
    // step after its warm-up, a summary without it) is no row.
    for (const Job& j : jobs) {
      if (one_shard.steady <= 0) break;
      if (j.rate <= 0) {
        spdlog::error("feed bench: the job {} gave no rate after its warm-up", j.name);
        continue;
      }
      rows->push_back({j.name, j.rate, "samples/s", one_shard.steady * j.own,
                       "shards_in_process_steady_x" + std::to_string(j.own), std::nullopt});
    }
    for (const Job& j : jobs) {
      if (j.whole <= 0) {
        spdlog::error("feed bench: the job {} gave no rate", j.name);
        continue;
      }
      rows->push_back({j.name + "_whole_run", j.whole, "samples/s", one_shard.whole * j.own,
                       "shards_in_process_x" + std::to_string(j.own), std::nullopt});
    }
    // What bounds each job: the share of its training time its shards' request threads were
    // serving (the rest they waited for the worker's next message).
    for (const Job& j : jobs) {
      if (j.busy < 0) {
        spdlog::error("feed bench: the log of {} lacks a shard's stats", j.name);
        continue;
      }
      rows->push_back(
          {j.name + "_shard_busy_share", j.busy, "share", std::nullopt, "", std::nullopt});
    }
  }
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
}

// The feed group's reader rows alone, on the same generated data (no jobs, no passes): a
// look at the data path in seconds.
void ReaderOnlyRows(const Options& opt, std::vector<Row>* rows) {
  char tmpl[] = "/tmp/parasol-bench-reader-XXXXXX";
  if (!::mkdtemp(tmpl)) {
    spdlog::error("reader bench: no temporary folder: {}", std::strerror(errno));
    return;
  }
  const std::string dir = tmpl;
  const std::string data = FeedData(opt, dir, "dlrm_small", kDlrmSmallVocabulary);
  if (!data.empty()) ReaderRows(data, dir, rows);
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
}

// PyTorch (bench/torch_dlrm.py, 1 process, 2 threads, tuned: see its comment) on `data`:
// samples/s, or 0.
double TorchRate(const std::string& data) {
  const std::string script = std::string(PARASOL_SOURCE_DIR) + "/bench/torch_dlrm.py";
  char tmpl[] = "/tmp/parasol-bench-torch-XXXXXX";
  const std::string dir = ::mkdtemp(tmpl) ? tmpl : "/tmp";
  // As many warm-up steps as Parasol's worker leaves out of its rate after the warm-up.
  auto p = Subprocess::Spawn({"/usr/bin/python3", script, data, "--batch", "1024", "--threads",
                              "2", "--warmup", std::to_string(kRateWarmupSteps)},
                             dir + "/torch.log");
  double torch_rate = 0;
  std::string interaction;
  if (p.ok() && p->Wait(std::chrono::minutes(20))) {
    std::ifstream in(dir + "/torch.log");
    std::string word;
    while (in >> word) {
      if (word == "samples_per_second") in >> torch_rate;
      if (word == "interaction") in >> interaction;
    }
  }
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
  if (torch_rate <= 0) {
    spdlog::error("torch bench: no figure from {} (is python3-torch installed?)", script);
  } else {
    spdlog::info("torch bench: {:.0f} samples/s (interaction: {})", torch_rate, interaction);
  }
  return torch_rate;
}

// Five pairs of PyTorch and Parasol's 1 server + 1 worker on the same file, each side first in
// turn, so that a slower minute of the machine falls on both: the median and range of each side
// and of the pairs' ratios (a pair without both figures is left out; fewer than 3: no rows).
// Parsing and warm-up are left out on both sides: PyTorch's script parses the file and runs 20
// steps before its clock starts; Parasol's worker reads the file's binary copy (parasol
// convert, made before the pairs), and its rate is the one after its first 20 steps
// (TrainReport::samples_per_second_after_warmup; its whole run's is the _whole_run row).
// Threads as PyTorch's: the worker's kernels on 2 threads (worker.compute_threads), as
// PyTorch's run on its 2 intra-op threads, each kept to a core (the job's shard shares them).
void TorchRows(const std::string& data, std::vector<Row>* rows) {
  constexpr int kPairs = 5;
  const std::string worker = "worker: {compute_threads: 2, pin_compute_threads: true}\n";
  const std::string parsed = data + ".pairs.bin";
  Result<ConvertReport> converted =
      ConvertCriteo(data, parsed, true, DataOptions::OnBadRow::kSkip);
  if (!converted.ok() || converted->rows == 0) {
    spdlog::error("torch bench: {}", converted.status().ToString());
    return;
  }
  struct Remove {
    std::string path;
    ~Remove() {
      std::error_code ec;
      std::filesystem::remove(path, ec);
    }
  } remove_parsed{parsed};
  std::vector<double> torch_rates, ours, ours_whole, ratios;
  for (int i = 0; i < kPairs; ++i) {
    // Each side goes first in turn.
    double torch_rate = 0, rate = 0, whole = 0;
    for (int side = 0; side < 2; ++side) {
      if ((side == 0) == (i % 2 == 0)) {
        torch_rate = TorchRate(data);
      } else {
        // The worker's rate after its first 20 steps, as PyTorch's is after its 20 warm-up
        // steps; its whole run's is reported beside it.
        const std::string summary = LaunchTraining(parsed, 1, 1, 1024, worker);
        rate = summary.empty()
                   ? 0
                   : JsonFigure(summary, "/workers/0/samples_per_second_after_warmup");
        whole = summary.empty() ? 0 : JsonFigure(summary, "/samples_per_second");
      }
    }
    if (torch_rate <= 0 || rate <= 0 || whole <= 0) {
      spdlog::error("torch bench: pair {} has no figure (PyTorch {}, Parasol {}, {} over its "
                    "whole run); left out",
                    i + 1, torch_rate, rate, whole);
      continue;
    }
    spdlog::info("torch bench: pair {}: Parasol {:.0f} ({:.0f} over its whole run) against "
                 "PyTorch {:.0f} samples/s",
                 i + 1, rate, whole, torch_rate);
    torch_rates.push_back(torch_rate);
    ours.push_back(rate);
    ours_whole.push_back(whole);
    ratios.push_back(rate / torch_rate);
  }
  if (ratios.size() < 3) {
    spdlog::error("torch bench: {} of {} pairs have figures; no rows", ratios.size(), kPairs);
    return;
  }
  auto add = [&](const std::string& name, std::vector<double> v, const std::string& unit) {
    std::sort(v.begin(), v.end());
    rows->push_back({name, v[v.size() / 2], unit, std::nullopt, "", std::nullopt});
    rows->push_back({name + "_min", v.front(), unit, std::nullopt, "", std::nullopt});
    rows->push_back({name + "_max", v.back(), unit, std::nullopt, "", std::nullopt});
  };
  add("pytorch_tuned_1proc_2threads", torch_rates, "samples/s");
  add("train_dlrm_small_b1024_1s1w", ours, "samples/s");
  add("train_dlrm_small_b1024_1s1w_whole_run", ours_whole, "samples/s");
  add("train_dlrm_small_b1024_1s1w_over_pytorch_tuned", ratios, "x");
}

// The Python worker (examples/torch_dlrm.py: the model in PyTorch, one thread, its tables on
// the shard), the C++ worker and plain PyTorch on the same file: 1 server, 1 worker, batch 1024.
// The C++ worker's figure is the Python worker's ceiling (the same job and client; only the
// model's computation differs).
void PythonRows(const std::string& data, std::vector<Row>* rows) {
  const double torch_rate = TorchRate(data);
  if (torch_rate > 0) {
    rows->push_back({"pytorch_tuned_1proc_2threads", torch_rate, "samples/s",
                     std::nullopt, "", std::nullopt});
  }
  const std::string cpp = LaunchTraining(data, 1, 1, 1024);
  const std::string py = LaunchTraining(
      data, 1, 1, 1024,
      "worker:\n  command: [/usr/bin/python3, " + std::string(PARASOL_SOURCE_DIR) +
          "/examples/torch_dlrm.py]\n");
  if (cpp.empty() || py.empty()) {
    spdlog::error("python bench: the {} job failed", cpp.empty() ? "C++ worker's" : "Python worker's");
    return;
  }
  const double cpp_rate = JsonFigure(cpp, "/samples_per_second");
  rows->push_back({"train_dlrm_small_b1024_1s1w", cpp_rate, "samples/s", std::nullopt, "",
                   std::nullopt});
  rows->push_back({"train_python_dlrm_small_b1024_1s1w", JsonFigure(py, "/samples_per_second"),
                   "samples/s", cpp_rate, "train_dlrm_small_b1024_1s1w", std::nullopt});
}

// dlrm-small steps (forward + backward) on one backend, rows already in the model's host slots:
// each step makes its one upload, its kernels, its one download and its one synchronisation.
// Returns samples/s; with `ops`, each operation's device time per step (profiled steps, after
// the timed ones).
double ModelSamplesPerSecond(Backend* backend, uint32_t batch_size, int iters,
                             std::vector<OpTime>* ops = nullptr, double* profiled_wall = nullptr) {
  Result<Manifest> m = ParseManifest(
      "cluster:\n  servers: [127.0.0.1:1]\nmodel:\n  kind: dlrm\n  embedding_dim: 16\n"
      "  bottom: [64, 16]\n  top: [64, 1]\n",
      "bench");
  auto model = Model::Create(*m, backend, batch_size);
  if (!model.ok()) return -1;
  std::mt19937_64 rng(3);
  Batch batch;
  batch.Clear();
  const ZipfSampler zipf(100000, 1.05);
  for (uint32_t i = 0; i < batch_size; ++i) {
    batch.labels.push_back(static_cast<float>(rng() % 2));
    for (int d = 0; d < 13; ++d) batch.dense.push_back(static_cast<float>(rng() % 5));
    for (int c = 0; c < 26; ++c) {
      batch.keys.push_back(c * 1000003ULL + zipf(rng));
      batch.values.push_back(1.0f);
    }
    batch.offsets.push_back(static_cast<uint32_t>(batch.keys.size()));
    ++batch.size;
  }
  const BatchKeys keys = DeduplicateKeys(batch.keys);
  const auto unique = static_cast<uint32_t>(keys.unique.size());
  // Random weights and rows (never constants: they can run faster than real data).
  std::uniform_real_distribution<float> u(-0.05f, 0.05f);
  for (int slot = 0; slot < Model::kSlots; ++slot) {
    float* rows = (*model)->StepRows(slot, unique, static_cast<uint32_t>(batch.keys.size()));
    for (size_t i = 0; i < size_t{unique} * 16; ++i) rows[i] = u(rng);
    for (size_t t = 0; t < (*model)->dense_tables().size(); ++t) {
      for (float& v : (*model)->StepDense(slot, t)) v = u(rng);
    }
  }
  // Two steps in flight, one per slot (as a worker that has the next batch's rows does): a
  // step's upload and host work overlap the other slot's kernels.
  int slot = 0;
  bool in_flight = false;
  auto step = [&] {
    (*model)->Run(batch, slot, unique, keys.indices.data(), /*train=*/true);
    slot ^= 1;
    const bool ok = !in_flight || (*model)->Finish(slot).ok();
    in_flight = true;
    return ok;
  };
  const double s = TimeIt(2, iters, step);
  if (in_flight && !(*model)->Finish(slot ^ 1).ok()) return -1;
  if (ops) {
    const int profiled = std::max(3, iters / 4);
    backend->ClearOpTimes();
    backend->SetProfiling(true);
    const auto start = std::chrono::steady_clock::now();
    for (int i = 0; i < profiled; ++i) {
      (*model)->Run(batch, 0, unique, keys.indices.data(), /*train=*/true);
      if (!(*model)->Finish(0).ok()) return -1;
    }
    if (profiled_wall) {
      *profiled_wall =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() /
          profiled;
    }
    backend->SetProfiling(false);
    *ops = backend->OpTimes();
    for (OpTime& o : *ops) {
      o.seconds /= profiled;
      o.calls /= profiled;
    }
  }
  return s > 0 ? batch_size / s : -1;
}

// TFLOP/s of one row-major product of the given shape on `backend`, on random operands.
double GemmTflops(Backend* backend, int m, int n, int k, int iters) {
  DeviceBuffer a = backend->Allocate(size_t(m) * k), b = backend->Allocate(size_t(k) * n),
               c = backend->Allocate(size_t(m) * n);
  std::mt19937_64 rng(5);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> host(std::max(size_t(m) * k, size_t(k) * n));
  for (float& x : host) x = u(rng);
  backend->ToDevice(a.data(), host.data(), size_t(m) * k);
  backend->ToDevice(b.data(), host.data(), size_t(k) * n);
  const double s = TimeIt(2, iters, [&] {
    backend->Gemm(false, true, m, n, k, 1.0f, a.data(), b.data(), 0.0f, c.data());
    return backend->Sync().ok();
  });
  return s > 0 ? 2.0 * m * n * k / s / 1e12 : -1;
}

// A product the model runs: "gemm 4096x64x13 NT ld 16 13 64" (with " +bias" or " +bias_relu"
// when the epilogue adds them).
struct GemmOp {
  int m = 0, n = 0, k = 0;
  bool ta = false, tb = false;
  int lda = 0, ldb = 0, ldc = 0;
  GemmEpilogue epilogue = GemmEpilogue::kNone;
};

bool ParseGemmOp(const std::string& op, GemmOp* g) {
  char a = 0, b = 0;
  if (std::sscanf(op.c_str(), "gemm %dx%dx%d %c%c ld %d %d %d", &g->m, &g->n, &g->k, &a, &b,
                  &g->lda, &g->ldb, &g->ldc) != 8) {
    return false;
  }
  g->ta = a == 'T';
  g->tb = b == 'T';
  g->epilogue = op.find("+bias_relu") != std::string::npos ? GemmEpilogue::kBiasRelu
                : op.find("+bias") != std::string::npos    ? GemmEpilogue::kBias
                                                            : GemmEpilogue::kNone;
  return true;
}

// Seconds per product of the backend's own call for `g` (its leading dimensions too) on random
// operands, timed as the probe times cuBLAS's: products back to back between two device events.
double BackendGemmSeconds(Backend* backend, const GemmOp& g) {
  const size_t a_n = size_t(g.ta ? g.k : g.m) * g.lda, b_n = size_t(g.tb ? g.n : g.k) * g.ldb;
  DeviceBuffer a = backend->Allocate(a_n), b = backend->Allocate(b_n),
               c = backend->Allocate(size_t(g.m) * g.ldc), bias = backend->Allocate(g.n);
  std::mt19937_64 rng(7);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> host(std::max(a_n, b_n));
  for (float& x : host) x = u(rng);
  backend->ToDevice(a.data(), host.data(), a_n);
  backend->ToDevice(b.data(), host.data(), b_n);
  backend->ToDevice(bias.data(), host.data(), g.n);
  auto run = [&] {
    if (g.epilogue == GemmEpilogue::kNone) {
      backend->GemmStrided(g.ta, g.tb, g.m, g.n, g.k, 1.0f, a.data(), g.lda, b.data(), g.ldb,
                           0.0f, c.data(), g.ldc);
    } else {
      backend->GemmBiasActivation(g.ta, g.tb, g.m, g.n, g.k, a.data(), g.lda, b.data(), g.ldb,
                                  bias.data(), c.data(), g.ldc,
                                  g.epilogue == GemmEpilogue::kBiasRelu);
    }
  };
  for (int w = 0; w < 3; ++w) run();
  return backend->TimeDevice(run, 20, 20);
}

// "gemm 4096x64x13 NT ld 16 13 64 +bias_relu" -> "gemm_4096x64x13_NT_+bias_relu" (the row
// names stay those of earlier runs).
std::string RowName(std::string s) {
  if (const size_t ld = s.find(" ld "); ld != std::string::npos) {
    const size_t plus = s.find(" +", ld);
    s = s.substr(0, ld) + (plus == std::string::npos ? "" : s.substr(plus));
  }
  for (char& c : s) {
    if (c == ' ') c = '_';
  }
  return s;
}

// dlrm-small on each backend at batch 4096 and 16384: samples/s of the backend alone (one
// upload, the kernels, one download per step); on a GPU, each operation's device time per step,
// and each of the model's products in TFLOP/s against cuBLAS's best algorithm for the same
// shape (ProbeCublasGemm), with a large square product as the device's own ceiling.
void ComputeRows(const Options& opt, std::vector<Row>* rows) {
  std::vector<std::pair<std::string, std::unique_ptr<Backend>>> backends;
  backends.emplace_back("cpu", MakeCpuBackend(1));
  // The same with its kernels split over every core (worker.compute_threads).
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  if (cores > 1) {
    backends.emplace_back("cpu_" + std::to_string(cores) + "threads", MakeCpuBackend(1, cores, /*pin=*/true));
  }
  for (bool tf32 : {false, true}) {
    auto cuda = MakeCudaBackend(0, tf32);
    if (cuda.ok()) {
      backends.emplace_back(tf32 ? "cuda_tf32" : "cuda", std::move(*cuda));
    } else if (!tf32) {
      spdlog::warn("compute bench: no CUDA rows: {}", cuda.status().message());
    }
  }
  for (auto& [name, backend] : backends) {
    const bool gpu = name.rfind("cpu", 0) != 0;
    const bool tf32 = name == "cuda_tf32";
    const int big = gpu ? 8192 : 1024;
    const double peak = GemmTflops(backend.get(), big, big, big, gpu ? 10 : 3);
    std::string cube = "gemm_";
    cube += std::to_string(big);
    cube += "cube_";
    cube += name;
    rows->push_back({cube, peak, "TFLOP/s",
                     std::nullopt, "", std::nullopt});
    for (uint32_t batch : {1024u, 4096u, 16384u}) {
      if (gpu ? batch < 4096 : opt.quick && batch > 4096) continue;  // the CPU job's 1024 too
      // (Appended piece by piece: GCC 12 warns, wrongly, of an overlap in "b" + to_string(..).)
      std::string tag = "b";
      tag += std::to_string(batch);
      tag += '_';
      tag += name;
      std::vector<OpTime> ops;
      double profiled_wall = 0;
      const double rate =
          ModelSamplesPerSecond(backend.get(), batch, gpu ? 50 : 3, &ops, &profiled_wall);
      rows->push_back({"compute_dlrm_small_" + tag, rate, "samples/s", std::nullopt, "",
                       std::nullopt});
      double kernel_ms = 0;
      for (const OpTime& o : ops) {
        rows->push_back({"op_" + RowName(o.op) + "_" + tag, o.seconds * 1e3, "ms/step",
                         std::nullopt, "", std::nullopt});
        kernel_ms += o.seconds * 1e3;
        GemmOp g;
        if (!gpu || !ParseGemmOp(o.op, &g)) continue;
        const double ours = BackendGemmSeconds(backend.get(), g);
        auto best = ProbeCublasGemm(g.ta, g.tb, g.m, g.n, g.k, g.lda, g.ldb, g.ldc, tf32,
                                    g.epilogue, 20, /*budget_seconds=*/2.5);
        const double flops = 2.0 * g.m * g.n * g.k;
        // The ceiling: the fastest configuration an exhaustive search of cuBLASLt finds for the
        // shape, under the backend's restrictions; never our own time.
        std::optional<double> ceiling;
        if (best.ok()) {
          ceiling = flops / best->best_seconds / 1e12;
          std::fprintf(stderr,
                       "gemm search %s_%s: %d configurations checked, %d timed%s\n",
                       RowName(o.op).c_str(), tag.c_str(), best->configurations_checked,
                       best->algorithms, best->cut_short ? ", cut short by its time budget" : "");
        } else {
          std::fprintf(stderr, "gemm search %s_%s: %s\n", RowName(o.op).c_str(), tag.c_str(),
                       best.status().ToString().c_str());
        }
        rows->push_back({RowName(o.op) + "_" + tag, ours > 0 ? flops / ours / 1e12 : -1,
                         "TFLOP/s", ceiling, "cublas_best_algorithm", std::nullopt});
      }
      if (!ops.empty()) {
        // Device time of the operations of a profiled step (one at a time, no graph) against
        // the wall time of those same steps.
        rows->push_back({"ops_total_" + tag, kernel_ms, "ms/step",
                         profiled_wall > 0 ? std::optional<double>(profiled_wall * 1e3)
                                           : std::nullopt,
                         "profiled_step_wall_ms", std::nullopt});
      }
    }
  }
}

// Drops the file's pages from the page cache (they are clean once it is synced), so that the
// next read comes from the disk.
void DropFromCache(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return;
  ::fdatasync(fd);
  ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
  ::close(fd);
}

// Checkpoint write (through a server, in the background while an observer keeps asking the
// shard for its stats) and restore (in this process, from the page cache and from the disk)
// of one shard's table.
void CheckpointRows(const Options& opt, std::vector<Row>* rows) {
  const uint64_t table_rows = opt.quick ? 1000000 : 10000000;
  char tmpl[] = "/tmp/parasol-bench-ckpt-XXXXXX";
  const std::string dir = ::mkdtemp(tmpl) ? tmpl : "/tmp";
  const std::string size = opt.quick ? "1e6" : "1e7";
  double full_f32_per_row = 0;  // bytes per row of the full f32 checkpoint below
  {
    BenchCluster cluster("  - {name: emb, kind: sparse, dim: 16, optimizer: {kind: adagrad_rowwise}}\n",
                         1, "training:\n  consistency: asp\ncheckpoint:\n  dir: " + dir +
                                "\n  full_every: 10\n");
    auto client = PsClient::Connect(cluster.manifest(), 0);
    auto observer = PsClient::Connect(cluster.manifest(), PsClient::kObserver);
    if (!client.ok() || !observer.ok() || Fill(**client, 0, table_rows, 16, 100000) < 0) {
      spdlog::error("checkpoint bench: cannot fill the table");
      return;
    }
    // The longest gap between two answers to the observer's back-to-back Stats requests: for
    // a while with nothing else going on, then while a checkpoint is written.
    std::atomic<bool> stop{false};
    auto longest_gap_ms = [&](uint64_t* answered) {
      double longest = 0;
      auto last = std::chrono::steady_clock::now();
      while (!stop.load()) {
        if (!(*observer)->StatsOf(0).ok()) return -1.0;
        const auto now = std::chrono::steady_clock::now();
        longest = std::max(longest, std::chrono::duration<double, std::milli>(now - last).count());
        last = now;
        ++*answered;
      }
      return longest;
    };
    uint64_t idle_answers = 0, answers = 0;
    double idle_gap = 0, gap = 0;
    {
      std::thread t([&] { idle_gap = longest_gap_ms(&idle_answers); });
      std::this_thread::sleep_for(std::chrono::seconds(1));
      stop = true;
      t.join();
    }
    // A tick: the rows filled are of clock 0, what comes after the checkpoint of clock 1 on.
    if (!(*client)->Tick().ok()) return;
    stop = false;
    std::thread probe([&] { gap = longest_gap_ms(&answers); });
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    const auto start = std::chrono::steady_clock::now();
    const Status written = (*client)->Checkpoint();  // answered once the file is durable
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    stop = true;
    probe.join();
    if (!written.ok()) {
      spdlog::error("checkpoint bench: {}", written.ToString());
      return;
    }
    const auto files = ListCheckpoints(dir, 0);
    const double bytes = files.empty() ? 0 : std::filesystem::file_size(files[0]);
    rows->push_back({"stats_longest_gap_ms_idle", idle_gap, "ms", std::nullopt,
                     std::to_string(idle_answers) + "_answers", std::nullopt});
    // Lower is better; the row beside it is the same gap with no checkpoint running.
    rows->push_back({"checkpoint_longest_pause_ms_" + size + "x16", gap, "ms", std::nullopt,
                     std::to_string(answers) + "_answers_during_it", std::nullopt});
    // The disk's ceiling for the same bytes: one sequential write, then fsync (as a checkpoint
    // is written), measured now on the same folder.
    const double disk = DiskWriteBandwidth(dir, static_cast<uint64_t>(bytes));
    rows->push_back({"disk_write_fsync_" + Mb(static_cast<uint64_t>(bytes)), disk, "GB/s",
                     std::nullopt, "", std::nullopt});
    rows->push_back({"checkpoint_write_gbps_" + size + "x16", bytes / s / 1e9, "GB/s", disk,
                     "disk_write_fsync", std::nullopt});
    // Restore into a fresh shard of the same manifest, in this process, next to one sequential
    // read of the same file in the same cache state: first as it was just written (in the page
    // cache), then with its pages dropped (from the disk, as on a machine that restarted).
    for (const bool cold : {false, true}) {
      const std::string how = cold ? "_from_disk" : "_from_cache";
      if (cold && !files.empty()) DropFromCache(files[0]);
      const double read = files.empty() ? 0 : FileReadBandwidth(files[0]);
      const double read_rows = read > 0 ? table_rows / (bytes / (read * 1e9)) : 0;
      rows->push_back({"file_read" + how + "_" + Mb(static_cast<uint64_t>(bytes)), read, "GB/s",
                       std::nullopt, "", std::nullopt});
      if (cold && !files.empty()) DropFromCache(files[0]);
      ShardServer shard(cluster.manifest(), 0);
      const auto r0 = std::chrono::steady_clock::now();
      if (!shard.Restore().ok()) return;
      const double rs =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - r0).count();
      rows->push_back({"restore_rows_per_s_" + size + "x16" + how, table_rows / rs, "rows/s",
                       read_rows, "file_read" + how, std::nullopt});
    }
    // A delta after 1% of the rows changed (checkpoint.full_every: 10): its bytes per changed
    // row, next to the least a row can take (its key and stored floats: 8 + 4 x (1 + 16 + 1)).
    if (!(*client)->Tick().ok()) return;
    const uint64_t changed = table_rows / 100;
    {
      std::vector<uint64_t> keys(10000);
      std::vector<float> grads(keys.size() * 16, 0.01f);
      // Distinct rows spread over the table (7919 is prime, so coprime to its size).
      for (uint64_t done = 0; done < changed; done += keys.size()) {
        for (uint64_t i = 0; i < keys.size(); ++i) keys[i] = (done + i) * 7919 % table_rows;
        if (!(*client)->PushSparse(0, keys, grads).ok()) return;
      }
    }
    if (!(*client)->Checkpoint().ok()) return;
    auto stats = observer->get()->StatsOf(0);
    if (!stats.ok()) return;
    const auto json = nlohmann::json::parse(*stats, nullptr, false);
    const double delta = json.value("delta_checkpoint_bytes_last", 0.0);
    const double full = json.value("full_checkpoint_bytes_last", 0.0);
    rows->push_back({"incremental_checkpoint_bytes_per_changed_row", delta / changed, "B/row",
                     8.0 + 4.0 * 18, "key_and_stored_row", std::nullopt});
    rows->push_back({"full_checkpoint_bytes_per_row", full / table_rows, "B/row", std::nullopt,
                     "", std::nullopt});
    rows->push_back({"delta_vs_full_checkpoint_bytes_1pct_changed", full > 0 ? delta / full : 0,
                     "ratio", std::nullopt, "", std::nullopt});
    full_f32_per_row = full / table_rows;
  }
  // The same with checkpoint.dtype: bf16 (values and optimizer state rounded to bf16), on a
  // tenth of the rows: a full checkpoint, then a delta after 1% of them changed. The last row
  // is what a delta of bf16 rows writes against a full f32 checkpoint of the same table.
  {
    const uint64_t n = table_rows / 10;
    BenchCluster cluster("  - {name: emb, kind: sparse, dim: 16, optimizer: {kind: adagrad_rowwise}}\n",
                         1, "training:\n  consistency: asp\ncheckpoint:\n  dir: " + dir +
                                "/bf16\n  full_every: 10\n  dtype: bf16\n");
    auto client = PsClient::Connect(cluster.manifest(), 0);
    auto observer = PsClient::Connect(cluster.manifest(), PsClient::kObserver);
    if (!client.ok() || !observer.ok() || Fill(**client, 0, n, 16, 100000) < 0 ||
        !(*client)->Tick().ok() || !(*client)->Checkpoint().ok() || !(*client)->Tick().ok()) {
      spdlog::error("checkpoint bench: the bf16 checkpoint failed");
      return;
    }
    std::vector<uint64_t> keys(n / 100);
    std::vector<float> grads(keys.size() * 16, 0.01f);
    for (uint64_t i = 0; i < keys.size(); ++i) keys[i] = i * 7919 % n;
    if (!(*client)->PushSparse(0, keys, grads).ok() || !(*client)->Checkpoint().ok()) return;
    auto stats = observer->get()->StatsOf(0);
    if (!stats.ok()) return;
    const auto json = nlohmann::json::parse(*stats, nullptr, false);
    const double full = json.value("full_checkpoint_bytes_last", 0.0);
    const double delta = json.value("delta_checkpoint_bytes_last", 0.0);
    rows->push_back({"full_checkpoint_bytes_per_row_bf16", full / n, "B/row",
                     8.0 + 4 + 2.0 * 17, "key_clock_and_bf16_row", std::nullopt});
    rows->push_back({"incremental_checkpoint_bytes_per_changed_row_bf16",
                     delta / keys.size(), "B/row", 8.0 + 4 + 2.0 * 17, "key_clock_and_bf16_row",
                     std::nullopt});
    if (full_f32_per_row > 0 && delta > 0) {
      rows->push_back({"checkpoint_bytes_reduction_bf16_delta_1pct_vs_f32_full",
                       full_f32_per_row * n / delta, "x", std::nullopt, "", std::nullopt});
    }
  }
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
}

// Training time of a BSP job with one server, or one worker, killed (kill -9, at a random
// moment after its first checkpoint) and restarted by launch, against the same job left alone;
// and the push log's bytes per step (what a worker keeps for replays).
void RestartRows(const Options& opt, std::vector<Row>* rows) {
  char tmpl[] = "/tmp/parasol-bench-restart-XXXXXX";
  const std::string dir = ::mkdtemp(tmpl) ? tmpl : "/tmp";
  GeneratorOptions g;
  g.rows = opt.quick ? 60000 : 200000;
  if (!GenerateCriteo(dir + "/train.tsv", g).ok()) return;
  std::mt19937 rng(12345);
  auto run = [&](const std::string& name, const std::string& victim) -> double {
    const std::vector<uint16_t> ports = *PickFreePorts(2);
    const std::string manifest = dir + "/" + name + ".yaml";
    std::ofstream(manifest)
        << "cluster:\n  servers: [127.0.0.1:" << ports[0] << ", 127.0.0.1:" << ports[1]
        << "]\n  workers: 2\n  request_timeout: 1s\n  request_retries: 30\n"
        << "  restart_servers: true\n  restart_workers: true\n"
        << "training: {consistency: bsp, batch_size: 256, epochs: 1, progress_every: 1h}\n"
        << "model: {kind: dlrm, embedding_dim: 16, bottom: [64, 16], top: [64, 1]}\n"
        << "data: {train: " << dir << "/train.tsv}\n"
        << "checkpoint: {dir: " << dir << "/" << name << "-ckpt, every_seconds: 1}\n";
    const auto start = std::chrono::steady_clock::now();
    auto p = Subprocess::Spawn({BenchCluster::SelfDir() + "/parasol", "launch", manifest,
                                "--summary", dir + "/" + name + ".json"},
                               dir + "/" + name + ".log");
    if (!p.ok()) return -1;
    bool killed = victim.empty();
    const int delay_ms = std::uniform_int_distribution<int>(0, 500)(rng);
    auto first = std::chrono::steady_clock::time_point::max();
    for (int i = 0; i < 60000 && !killed && !p->Poll(); ++i) {
      if (first == std::chrono::steady_clock::time_point::max() &&
          !ListCheckpoints(dir + "/" + name + "-ckpt", 1).empty()) {
        first = std::chrono::steady_clock::now();
      }
      if (std::chrono::steady_clock::now() > first + std::chrono::milliseconds(delay_ms)) {
        for (const auto& e : std::filesystem::directory_iterator("/proc")) {
          std::ifstream in(e.path() / "cmdline");
          std::string cmd((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
          std::replace(cmd.begin(), cmd.end(), '\0', ' ');
          if (cmd.find(victim + " --manifest " + manifest + " --rank 1") != std::string::npos) {
            killed = ::kill(std::stol(e.path().filename().string()), SIGKILL) == 0;
          }
        }
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    auto status = p->Wait(std::chrono::minutes(10));
    if (!status || !killed || !WIFEXITED(*status) || WEXITSTATUS(*status) != 0) return -1;
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  };
  const double calm = run("calm", "");
  const double server = run("server", "server");
  const double worker = run("worker", "worker");
  if (calm > 0 && server > 0) {
    rows->push_back({"training_seconds_lost_per_server_restart", server - calm, "s",
                     std::nullopt, "", std::nullopt});
  }
  if (calm > 0 && worker > 0) {
    rows->push_back({"training_seconds_lost_per_worker_restart", worker - calm, "s",
                     std::nullopt, "", std::nullopt});
  }
  if (calm > 0) {
    std::ifstream in(dir + "/calm.json");
    const std::string summary((std::istreambuf_iterator<char>(in)),
                              std::istreambuf_iterator<char>());
    rows->push_back({"push_log_bytes_per_step_dlrm16",
                     JsonFigure(summary, "/workers/0/push_log_bytes_per_step"),
                     "B", std::nullopt, "", std::nullopt});
  }
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
}

// The `scale` group: dlrm-small whose 26 fields draw ids (Zipf, s = 1.1) from fields of up to
// 10^9 ids, on 2 shards whose embedding table is tiered under a memory budget, 2 workers, BSP.
// Checkpoints every 100 steps (30 with --quick; a full one every 4th, deltas between); shard 1
// is killed (kill -9) after its second checkpoint and started again by launch. An observer
// samples the slowest worker's clock five times a second, and whether a shard is writing a checkpoint or
// loading one, to give samples/s before the kill (outside and during checkpoints) and after
// the restart; the restart's seconds (the kill to the shard answering from its state); and the
// rows in each tier at the end.
void ScaleRows(const Options& opt, std::vector<Row>* rows) {
  char tmpl[] = "/tmp/parasol-bench-scale-XXXXXX";
  const std::string dir = ::mkdtemp(tmpl) ? tmpl : "/tmp";
  GeneratorOptions g;
  g.rows = opt.quick ? 300000 : 1500000;
  g.vocabulary = 1000000000;
  if (Status st = GenerateCriteo(dir + "/train.tsv", g); !st.ok()) {
    spdlog::error("scale bench: {}", st.ToString());
    return;
  }
  const std::vector<uint16_t> ports = *PickFreePorts(2);
  const uint64_t budget =
      opt.memory_budget ? opt.memory_budget : (opt.quick ? 32ull << 20 : 128ull << 20);
  const uint32_t batch = 1024, workers = 2;
  const std::string manifest = dir + "/scale.yaml";
  std::ofstream(manifest)
      << "cluster:\n  servers: [127.0.0.1:" << ports[0] << ", 127.0.0.1:" << ports[1]
      << "]\n  workers: " << workers << "\n  request_timeout: 5s\n  request_retries: 3\n"
      << "  restart_servers: true\n"
      << "server: {engine_threads: 2, memory_budget: " << budget << ", disk_dir: " << dir
      << "/disk}\n"
      << "training: {consistency: bsp, batch_size: " << batch
      << ", epochs: 1, progress_every: 1h}\n"
      << "model: {kind: dlrm, embedding_dim: 16, bottom: [64, 16], top: [64, 1], "
         "sparse_storage: tiered}\n"
      << "data: {train: " << dir << "/train.tsv}\n"
      << "checkpoint: {dir: " << dir << "/ckpt, every_steps: " << (opt.quick ? 30 : 100)
      << ", full_every: 4, keep: 2}\n";
  auto m = LoadManifest(manifest);
  if (!m.ok()) {
    spdlog::error("scale bench: {}", m.status().ToString());
    return;
  }
  auto job = Subprocess::Spawn({BenchCluster::SelfDir() + "/parasol", "launch", manifest,
                                "--summary", dir + "/scale.json"},
                               dir + "/scale.log");
  if (!job.ok()) {
    spdlog::error("scale bench: {}", job.status().ToString());
    return;
  }
  // Observers: of shard 0 (never killed) for the clock; of shard 1, giving up fast.
  Manifest quick_manifest = *m;
  quick_manifest.cluster.request_timeout_ms = 500;
  quick_manifest.cluster.request_retries = 0;
  std::unique_ptr<PsClient> observer, probe;
  struct Sample {
    double t;
    int64_t clock;
    int64_t checkpoints;  // written by both shards so far (a change: one was written between)
    bool down;            // shard 1 is dead or loading
  };
  std::vector<Sample> samples;
  const auto start = std::chrono::steady_clock::now();
  auto now_s = [&] {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  };
  double killed_at = -1, back_at = -1;
  for (int i = 0; i < 50000 && !job->Poll(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    if (!observer) {
      auto c = PsClient::Connect(quick_manifest, PsClient::kObserver);
      if (c.ok()) observer = std::move(*c);
      continue;
    }
    auto s0 = observer->StatsOf(0);
    if (!s0.ok()) continue;
    const auto j0 = nlohmann::json::parse(*s0, nullptr, false);
    if (j0.is_discarded()) continue;
    int64_t clock = INT64_MAX;
    for (const auto& c : j0.value("worker_clocks", nlohmann::json::array())) {
      clock = std::min<int64_t>(clock, c.get<int64_t>());
    }
    int64_t checkpoints = j0.value("checkpoints", int64_t{0});
    bool down = false;
    auto s1 = observer->StatsOf(1);
    if (s1.ok()) {
      const auto j1 = nlohmann::json::parse(*s1, nullptr, false);
      down = !j1.is_discarded() && j1.value("restoring", false);
      if (!j1.is_discarded()) checkpoints += j1.value("checkpoints", int64_t{0});
      if (!down && killed_at >= 0 && back_at < 0) back_at = now_s();
    } else {
      down = true;  // dead: the request timed out (its socket reconnects by itself)
    }
    samples.push_back({now_s(), clock == INT64_MAX ? 0 : clock, checkpoints, down});
    // The kill, once shard 1 has written two checkpoints.
    if (killed_at < 0 && ListCheckpoints(dir + "/ckpt", 1).size() >= 2) {
      for (const auto& e : std::filesystem::directory_iterator("/proc")) {
        std::ifstream in(e.path() / "cmdline");
        std::string cmd((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
        std::replace(cmd.begin(), cmd.end(), '\0', ' ');
        if (cmd.find("server --manifest " + manifest + " --rank 1") != std::string::npos &&
            ::kill(std::stol(e.path().filename().string()), SIGKILL) == 0) {
          killed_at = now_s();
        }
      }
    }
  }
  auto status = job->Wait(std::chrono::minutes(30));
  if (!status || !WIFEXITED(*status) || WEXITSTATUS(*status) != 0 || killed_at < 0) {
    spdlog::error("scale bench: the job failed or shard 1 was never killed (see {}/scale.log)",
                  dir);
    return;
  }
  // Samples/s over the intervals between samples in a window (`writing`: 1 those in which a
  // checkpoint was written, 0 the others, -1 all).
  auto rate = [&](double from, double to, int writing) {
    double seconds = 0, steps = 0;
    for (size_t i = 1; i < samples.size(); ++i) {
      const Sample& a = samples[i - 1];
      const Sample& b = samples[i];
      if (a.t < from || b.t > to || a.down || b.down) continue;
      const bool wrote = b.checkpoints != a.checkpoints;
      if (writing >= 0 && wrote != (writing == 1)) continue;
      seconds += b.t - a.t;
      steps += static_cast<double>(b.clock - a.clock);
    }
    return seconds > 0 ? steps * batch * workers / seconds : 0.0;
  };
  const double end = samples.empty() ? 0 : samples.back().t;
  rows->push_back({"scale_train_samples_per_s_before_kill", rate(0, killed_at, 0), "samples/s",
                   std::nullopt, "", std::nullopt});
  // Over the 200 ms intervals in which a shard wrote a checkpoint (tiered tables: in the
  // foreground, so the job waits for it).
  rows->push_back({"scale_train_samples_per_s_during_checkpoint", rate(0, killed_at, 1),
                   "samples/s", std::nullopt, "", std::nullopt});
  if (back_at > 0) {
    rows->push_back({"scale_shard_restart_seconds", back_at - killed_at, "s", std::nullopt, "",
                     std::nullopt});
    rows->push_back({"scale_train_samples_per_s_after_restart", rate(back_at, end, -1),
                     "samples/s", std::nullopt, "", std::nullopt});
  }
  std::ifstream log_in(dir + "/scale.log");
  const std::string log((std::istreambuf_iterator<char>(log_in)), std::istreambuf_iterator<char>());
  for (const std::string shard : {"0", "1"}) {
    // The final stats line of each shard ("shard N stopping: {...}").
    const size_t at = log.rfind("shard " + shard + " stopping: ");
    if (at == std::string::npos) continue;
    const size_t open = log.find('{', at);
    const size_t close = log.find('\n', open);
    const auto j = nlohmann::json::parse(log.substr(open, close - open), nullptr, false);
    if (j.is_discarded() || !j.contains("tables")) continue;
    rows->push_back({"scale_shard" + shard + "_checkpoint_pause_ms_max",
                     j.value("checkpoint_pause_ms_max", 0.0), "ms", std::nullopt, "",
                     std::nullopt});
    // The checkpoints taken while the job trained (every N steps), apart from the last ones of
    // the job's end (every worker finished, the stop), which are written in the foreground.
    double periodic = 0;
    uint64_t taken = 0;
    const std::string prefix = "shard " + shard + ": ";
    for (size_t line = log.find(prefix); line != std::string::npos;
         line = log.find(prefix, line + 1)) {
      const size_t end = log.find('\n', line);
      const std::string text = log.substr(line, end == std::string::npos ? end : end - line);
      const size_t every = text.find("(every ");
      if (text.find("checkpoint ") == std::string::npos || every == std::string::npos ||
          !std::isdigit(static_cast<unsigned char>(text[every + 7]))) {
        continue;  // not "(every N steps...": the end's, a restarted worker's, a request's
      }
      const size_t stopped = text.find("serving stopped for ");
      if (stopped == std::string::npos) continue;
      periodic = std::max(periodic, std::strtod(text.c_str() + stopped + 20, nullptr));
      ++taken;
    }
    rows->push_back({"scale_shard" + shard + "_periodic_checkpoint_pause_ms_max", periodic, "ms",
                     std::nullopt, std::to_string(taken) + "_checkpoints", std::nullopt});
    for (const auto& t : j["tables"]) {
      if (t.value("storage", "") != "tiered") continue;
      rows->push_back({"scale_shard" + shard + "_rows_in_memory", t.value("memory_rows", 0.0),
                       "rows", std::nullopt, "", std::nullopt});
      rows->push_back({"scale_shard" + shard + "_rows_on_disk", t.value("disk_rows", 0.0), "rows",
                       std::nullopt, "", std::nullopt});
    }
  }
  std::ifstream summary_in(dir + "/scale.json");
  const std::string summary((std::istreambuf_iterator<char>(summary_in)),
                            std::istreambuf_iterator<char>());
  rows->push_back({"scale_eval_free_job_samples_per_s", JsonFigure(summary, "/samples_per_second"),
                   "samples/s", std::nullopt, "", std::nullopt});
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
}

// A tiered table (adagrad_rowwise, dim 16) on one shard with 2 engine threads, through a real
// server process: the fill rate of N new rows (pushes of 100,000 keys), then the update rate of
// pushes of 100,000 distinct Zipf keys (s = 1.05, as the sparse rows) next to the same table in
// memory in the same run, the shard's peak resident memory over its size before any row next
// to the budget, and the disk tier's bytes per row.
void TieredRows(const Options& opt, std::vector<Row>* rows) {
  const uint64_t n = opt.tiered_rows ? opt.tiered_rows : (opt.quick ? 1000000 : 10000000);
  const uint64_t budget = opt.memory_budget ? opt.memory_budget : (64ull << 20);
  constexpr uint32_t kDim = 16;
  constexpr uint64_t kBatch = 100000;
  const int updates = opt.quick ? 10 : 30;
  const std::string tag = n >= 1000000 && n % 1000000 == 0
                              ? std::to_string(n / 1000000) + "e6"
                              : std::to_string(n);
  auto run = [&](bool tiered, double* fill_rate, double* update_rate, uint64_t* peak_growth,
                 double* disk_bytes_per_row) -> bool {
    char tmpl[] = "/tmp/parasol-bench-disk-XXXXXX";
    const std::string disk = ::mkdtemp(tmpl) ? tmpl : "/tmp";
    BenchCluster cluster(
        "  - {name: emb, kind: sparse, dim: 16, optimizer: {kind: adagrad_rowwise}, dtype: " +
            opt.tiered_dtype + std::string(tiered ? ", storage: tiered" : "") + "}\n",
        1,
        "training:\n  consistency: asp\nserver: {engine_threads: 2, memory_budget: " +
            std::to_string(budget) + ", disk_dir: " + disk + "}\n");
    auto client = PsClient::Connect(cluster.manifest(), 0);
    if (!client.ok()) {
      spdlog::error("tiered bench: {}", client.status().ToString());
      return false;
    }
    PsClient& c = **client;
    const pid_t pid = cluster.server_pid(0);
    const uint64_t base = ResidentBytes(pid);
    uint64_t peak = base;
    // Fill: pushes of new keys create their rows.
    std::vector<uint64_t> keys(kBatch);
    std::vector<float> grads(kBatch * kDim, 0.01f);
    auto start = std::chrono::steady_clock::now();
    auto last_report = start;
    for (uint64_t first = 0; first < n; first += kBatch) {
      const uint64_t m = std::min(kBatch, n - first);
      keys.resize(m);
      for (uint64_t i = 0; i < m; ++i) keys[i] = first + i;
      if (!c.PushSparse(0, keys, std::span<const float>(grads.data(), m * kDim)).ok()) return false;
      peak = std::max(peak, ResidentBytes(pid));
      const auto now = std::chrono::steady_clock::now();
      if (now - last_report > std::chrono::minutes(1)) {  // a long fill says how far it is
        last_report = now;
        std::fprintf(stderr, "tiered fill: %llu rows, %.0f rows/s, resident growth %.2f GB\n",
                     static_cast<unsigned long long>(first + m),
                     (first + m) / std::chrono::duration<double>(now - start).count(),
                     (ResidentBytes(pid) - base) / 1e9);
      }
    }
    *fill_rate = n / std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    // Updates: distinct Zipf keys over the filled rows (key generation untimed).
    ZipfSampler zipf(n, 1.05);
    std::mt19937_64 rng(7);
    std::vector<std::vector<uint64_t>> batches;
    for (int b = 0; b < updates; ++b) batches.push_back(DistinctZipfKeys(zipf, rng, kBatch));
    start = std::chrono::steady_clock::now();
    for (const auto& b : batches) {
      if (!c.PushSparse(0, b, grads).ok()) return false;
      peak = std::max(peak, ResidentBytes(pid));
    }
    *update_rate = updates * double(kBatch) /
                   std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    *peak_growth = peak - base;
    auto stats = c.Stats();
    if (stats.ok() && tiered) {
      const double disk_rows = JsonFigure((*stats)[0], "/tables/0/disk_rows");
      const double disk_bytes = JsonFigure((*stats)[0], "/disk_bytes");
      *disk_bytes_per_row = disk_rows > 0 ? disk_bytes / disk_rows : 0;
      std::fprintf(stderr, "tiered: %s\n", (*stats)[0].c_str());
    }
    std::error_code ec;
    std::filesystem::remove_all(disk, ec);
    return true;
  };
  double fill = 0, update = 0, disk_per_row = 0, mem_fill = 0, mem_update = 0, unused = 0;
  uint64_t growth = 0, mem_growth = 0;
  if (!run(true, &fill, &update, &growth, &disk_per_row)) return;
  // The same table in memory, when it fits (its rows need about 100 bytes each).
  const bool memory_fits = n <= 50000000;
  if (memory_fits && !run(false, &mem_fill, &mem_update, &mem_growth, &unused)) return;
  auto ceiling = [&](double v) { return memory_fits ? std::optional<double>(v) : std::nullopt; };
  rows->push_back({"tiered_fill_rows_per_s_" + tag + "x16", fill, "rows/s", ceiling(mem_fill),
                   memory_fits ? "memory_table_same_run" : "", std::nullopt});
  rows->push_back({"tiered_update_rows_per_s_zipf_" + tag + "x16", update, "rows/s",
                   ceiling(mem_update), memory_fits ? "memory_table_same_run" : "",
                   std::nullopt});
  rows->push_back({"tiered_peak_rss_bytes", static_cast<double>(growth), "B",
                   static_cast<double>(budget), "memory_budget", std::nullopt});
  if (memory_fits) {
    rows->push_back({"memory_table_peak_rss_bytes_" + tag + "x16", static_cast<double>(mem_growth),
                     "B", std::nullopt, "", std::nullopt});
  }
  // Raw: key, clock, 16 values of the table's dtype, the row's f32 accumulator.
  const double raw = 8 + 4 + 16 * (opt.tiered_dtype == "f32" ? 4 : 2) + 4;
  rows->push_back({"tiered_disk_bytes_per_row", disk_per_row, "B/row", raw,
                   "raw_key_clock_value_state", std::nullopt});
}

// The `huge` group (opt-in; --huge-rows N, default 10^8): one shard (2 engine threads) of N
// rows of dim 16 (adagrad_rowwise). A checkpoint written in the background while an observer
// sends Stats back to back (the longest gap: the pause), its write rate next to a sequential
// write with fsync of the same size; then the shard is killed (kill -9) and started again: the
// seconds until it answers from its state, and its restore rate (from its log) next to a
// sequential read of the file from the disk (its pages dropped first).
void HugeRows(const Options& opt, std::vector<Row>* rows) {
  const uint64_t n = opt.huge_rows;
  const std::string size = n == 100000000 ? "1e8" : std::to_string(n);
  char tmpl[] = "/tmp/parasol-bench-huge-XXXXXX";
  const std::string dir = ::mkdtemp(tmpl) ? tmpl : "/tmp";
  {
    BenchCluster cluster(
        "  - {name: emb, kind: sparse, dim: 16, optimizer: {kind: adagrad_rowwise}}\n", 1,
        "training:\n  consistency: asp\ncheckpoint:\n  dir: " + dir + "\n");
    auto client = PsClient::Connect(cluster.manifest(), 0);
    Manifest quick = cluster.manifest();
    quick.cluster.request_timeout_ms = 500;
    quick.cluster.request_retries = 0;
    quick.cluster.connect_timeout_ms = 600000;
    auto observer = PsClient::Connect(quick, PsClient::kObserver);
    if (!client.ok() || !observer.ok()) return;
    const double fill = Fill(**client, 0, n, 16, 100000);
    rows->push_back({"huge_fill_rows_per_s_" + size + "x16", fill, "rows/s", std::nullopt, "",
                     std::nullopt});
    std::atomic<bool> stop{false};
    double gap = 0;
    uint64_t answers = 0;
    std::thread probe([&] {
      auto last = std::chrono::steady_clock::now();
      while (!stop.load()) {
        if (!(*observer)->StatsOf(0).ok()) continue;
        const auto now = std::chrono::steady_clock::now();
        gap = std::max(gap, std::chrono::duration<double, std::milli>(now - last).count());
        last = now;
        ++answers;
      }
    });
    const auto start = std::chrono::steady_clock::now();
    const Status written = (*client)->Checkpoint();
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    stop = true;
    probe.join();
    if (!written.ok()) {
      spdlog::error("huge bench: {}", written.ToString());
      return;
    }
    const auto files = ListCheckpoints(dir, 0);
    const double bytes = files.empty() ? 0 : std::filesystem::file_size(files[0]);
    rows->push_back({"checkpoint_longest_pause_ms_" + size + "x16", gap, "ms", std::nullopt,
                     std::to_string(answers) + "_answers_during_it", std::nullopt});
    const double disk = DiskWriteBandwidth(dir, static_cast<uint64_t>(bytes));
    rows->push_back({"checkpoint_write_gbps_" + size + "x16", bytes / s / 1e9, "GB/s", disk,
                     "disk_write_fsync", std::nullopt});
    if (!files.empty()) DropFromCache(files[0]);
    const double read = files.empty() ? 0 : FileReadBandwidth(files[0]);
    if (!files.empty()) DropFromCache(files[0]);
    client->reset();
    const auto kill_at = std::chrono::steady_clock::now();
    if (!cluster.Restart(0)) return;
    // Until it answers Stats from its state (not its loading's progress).
    double restart = -1;
    for (int i = 0; i < 120000; ++i) {
      auto st = (*observer)->StatsOf(0);
      if (st.ok() && st->find("\"restoring\"") == std::string::npos) {
        restart = std::chrono::duration<double>(std::chrono::steady_clock::now() - kill_at).count();
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    rows->push_back({"shard_restart_seconds_" + size + "x16", restart, "s", std::nullopt, "",
                     std::nullopt});
    // The restore's own time, from the shard's log line.
    std::ifstream in(cluster.dir() + "/server0.log");
    const std::string log((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    const size_t at = log.rfind("rows, checked in ");
    if (at != std::string::npos) {
      const double checked = std::strtod(log.c_str() + at + 17, nullptr);
      const size_t applied_at = log.find("applied in ", at);
      const double applied =
          applied_at == std::string::npos ? 0 : std::strtod(log.c_str() + applied_at + 11, nullptr);
      const double seconds = checked + applied;
      // Its two phases: reading and placing the rows; then indexing them.
      rows->push_back({"restore_read_and_place_seconds_" + size + "x16", checked, "s",
                       std::nullopt, "", std::nullopt});
      rows->push_back({"restore_index_seconds_" + size + "x16", applied, "s", std::nullopt, "",
                       std::nullopt});
      rows->push_back({"restore_rows_per_s_" + size + "x16_from_disk", n / seconds, "rows/s",
                       read > 0 ? std::optional<double>(n / (bytes / (read * 1e9))) : std::nullopt,
                       "file_read_from_disk", std::nullopt});
    }
  }
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
}

void CapacityRows(std::vector<Row>* rows) {
  constexpr uint64_t kRows = 100000000;
  constexpr uint32_t kDim = 16;
  BenchCluster cluster(
      "  - {name: emb, kind: sparse, dim: 16, optimizer: {kind: adagrad_rowwise}}\n", 2);
  auto client = PsClient::Connect(cluster.manifest(), 0);
  if (!client.ok()) {
    spdlog::error("capacity bench: {}", client.status().ToString());
    return;
  }
  const uint64_t step = kRows / 10;
  for (uint64_t first = 0; first < kRows; first += step) {
    const double rate = Fill(**client, first, step, kDim, 100000);
    std::fprintf(stderr, "capacity: %llu rows, %.3g rows/s while filling\n",
                 static_cast<unsigned long long>(first + step), rate);
    if (first + step == kRows) {
      rows->push_back({"capacity_fill_1e8x16_2shard", rate, "rows/s", std::nullopt, "",
                       std::nullopt});
    }
  }
  auto stats = (*client)->Stats();
  if (!stats.ok()) return;
  double bytes = 0, n = 0;
  for (const std::string& s : *stats) {
    bytes += JsonFigure(s, "/tables/0/bytes");
    n += JsonFigure(s, "/tables/0/rows");
  }
  rows->push_back({"bytes_per_row_adagrad_rowwise_1e8x16", bytes / n, "B/row", 8 + 17 * 4,
                   "raw_key_value_state", std::nullopt});
}

std::string Num(double v) {
  char buf[64];
  if (v >= 1e6) {
    std::snprintf(buf, sizeof(buf), "%.3g", v);
  } else {
    std::snprintf(buf, sizeof(buf), "%.3f", v);
  }
  return buf;
}

void Print(const std::vector<Row>& rows) {
  std::printf("%-42s %12s %-7s %12s %-24s %7s %9s\n", "name", "value", "unit", "ceiling",
              "ceiling_name", "ratio", "/memcpy");
  for (const Row& r : rows) {
    std::printf("%-42s %12s %-7s %12s %-24s %7s %9s\n", r.name.c_str(), Num(r.value).c_str(),
                r.unit.c_str(), r.ceiling ? Num(*r.ceiling).c_str() : "-",
                r.ceiling ? r.ceiling_name.c_str() : "-",
                r.ceiling ? Num(r.value / *r.ceiling).c_str() : "-",
                r.memcpy_ratio ? Num(*r.memcpy_ratio).c_str() : "-");
  }
}

void WriteJson(const std::vector<Row>& rows, const std::string& path) {
  std::ofstream out(path);
  out << "[\n";
  for (size_t i = 0; i < rows.size(); ++i) {
    const Row& r = rows[i];
    Json j;
    j["name"] = r.name;
    j["value"] = r.value;
    j["unit"] = r.unit;
    j["ceiling"] = r.ceiling ? Json(*r.ceiling) : Json(nullptr);
    j["ceiling_name"] = r.ceiling ? Json(r.ceiling_name) : Json(nullptr);
    j["ratio"] = r.ceiling ? Json(r.value / *r.ceiling) : Json(nullptr);
    out << "  " << SpacedJson(j) << (i + 1 < rows.size() ? "," : "") << "\n";
  }
  out << "]\n";
}

int Main(int argc, char** argv) {
  Options opt;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--only" && i + 1 < argc) {
      opt.only = argv[++i];
    } else if (a == "--json" && i + 1 < argc) {
      opt.json = argv[++i];
    } else if (a == "--quick") {
      opt.quick = true;
    } else if (a == "--capacity") {
      opt.capacity = true;
    } else if (a == "--tiered-dtype" && i + 1 < argc) {
      opt.tiered_dtype = argv[++i];
      if (opt.tiered_dtype != "f32" && opt.tiered_dtype != "bf16" && opt.tiered_dtype != "f16") {
        std::fprintf(stderr, "--tiered-dtype: f32, bf16 or f16, not '%s'\n",
                     opt.tiered_dtype.c_str());
        return 2;
      }
    } else if (a == "--tiered-rows" && i + 1 < argc) {
      opt.tiered_rows = std::strtoull(argv[++i], nullptr, 10);
    } else if (a == "--memory-budget" && i + 1 < argc) {
      Result<uint64_t> b = ParseBytes(argv[++i]);
      if (!b.ok()) {
        std::fprintf(stderr, "--memory-budget: %s\n", b.status().ToString().c_str());
        return 2;
      }
      opt.memory_budget = *b;
    } else if (a == "--huge-rows" && i + 1 < argc) {
      opt.huge_rows = std::strtoull(argv[++i], nullptr, 10);
      if (opt.huge_rows == 0) {
        std::fprintf(stderr, "--huge-rows: a number of rows, at least 1\n");
        return 2;
      }
    } else {
      std::fprintf(stderr, "usage: parasol_bench [--only GROUP] "
                           "[--json FILE] [--quick] [--capacity] [--tiered-rows N] "
                           "[--memory-budget BYTES] [--tiered-dtype f32|bf16|f16] [--huge-rows N]\n");
      return 2;
    }
  }
  static const std::vector<std::string> kGroups = {"ceilings",    "dense",    "sparse",
                                                   "optimizer",   "consistency", "training",
                                                   "torch",       "compute",     "checkpoint",
                                                   "cache",       "python",   "tiered",
                                                   "capacity",    "elastic",  "reshard",
                                                   "scale",       "huge",     "feed",
                                                   "reader"};
  if (!opt.only.empty() && std::find(kGroups.begin(), kGroups.end(), opt.only) == kGroups.end()) {
    std::fprintf(stderr, "unknown group '%s' (ceilings, dense, sparse, optimizer, consistency, "
                         "training, torch, compute, checkpoint, cache, python, tiered, capacity, elastic, reshard, "
                         "scale, huge, feed, reader)\n",
                 opt.only.c_str());
    return 2;
  }
  spdlog::set_level(spdlog::level::warn);
  TuneAllocatorForLargeMessages();  // the echo child inherits it: both sides alike
  std::vector<Row> rows;
  const double memcpy_gbs = MemcpyBandwidth(256 << 20, opt.quick ? 3 : 8);
  rows.push_back({"memcpy_bandwidth_256MB", memcpy_gbs, "GB/s", std::nullopt, "", std::nullopt});
  auto echo = RawEcho::Start();
  if (!echo.ok()) {
    std::fprintf(stderr, "cannot start the raw ZeroMQ echo process: %s\n",
                 echo.status().ToString().c_str());
    return 1;
  }
  if (opt.only.empty() || opt.only == "ceilings") {
    for (uint64_t bytes : {uint64_t{1} << 20, uint64_t{16} << 20, uint64_t{64} << 20}) {
      const double s = (*echo)->RoundTrip(bytes, 3, 10);
      rows.push_back({"zmq_roundtrip_" + Mb(bytes), 2.0 * bytes / s / 1e9, "GB/s", std::nullopt,
                      "", std::nullopt});
    }
  }
  if (opt.only.empty() || opt.only == "dense") DenseRows(opt, **echo, memcpy_gbs, &rows);
  if (opt.only.empty() || opt.only == "sparse") SparseRows(opt, **echo, memcpy_gbs, &rows);
  if (opt.only.empty() || opt.only == "optimizer") {
    OptimizerRows(opt, memcpy_gbs, &rows);
    InProcessUpdateRows(opt, &rows);
  }
  if (opt.only.empty() || opt.only == "consistency") ConsistencyRows(opt, &rows);
  if (opt.only.empty() || opt.only == "training" || opt.only == "torch" ||
      opt.only == "python") {
    char tmpl[] = "/tmp/parasol-bench-data-XXXXXX";
    const std::string dir = ::mkdtemp(tmpl) ? tmpl : "/tmp";
    const std::string data = TrainingData(opt, dir);
    if (opt.only == "torch") {
      TorchRows(data, &rows);  // opt-in: needs python3-torch
    } else if (opt.only == "python") {
      PythonRows(data, &rows);  // opt-in: needs the Python module and python3-torch
    } else {
      TrainingRows(data, &rows);
    }
    std::error_code ec;
    std::filesystem::remove_all(dir, ec);
  }
  if (opt.only.empty() || opt.only == "feed") FeedRows(opt, &rows);
  if (opt.only == "reader") ReaderOnlyRows(opt, &rows);  // the feed group's reader rows alone
  if (opt.only.empty() || opt.only == "elastic") ElasticRows(opt, &rows);
  if (opt.only.empty() || opt.only == "reshard") ReshardRows(opt, **echo, &rows);
  if (opt.only.empty() || opt.only == "compute") ComputeRows(opt, &rows);
  if (opt.only.empty() || opt.only == "cache") CacheRows(opt, &rows);
  if (opt.only.empty() || opt.only == "checkpoint") {
    CheckpointRows(opt, &rows);
    RestartRows(opt, &rows);
  }
  if (opt.only == "tiered") TieredRows(opt, &rows);  // opt-in: minutes, and disk space
  if (opt.only == "scale") ScaleRows(opt, &rows);    // opt-in: minutes, and disk space
  if (opt.only == "huge") HugeRows(opt, &rows);      // opt-in: 10 GB of memory and of disk
  // A 10^8-row table (about 9 GB over two shards): in the full run, not the quick one.
  if (opt.capacity || opt.only == "capacity" || (opt.only.empty() && !opt.quick)) {
    CapacityRows(&rows);
  }
  Print(rows);
  if (!opt.json.empty()) WriteJson(rows, opt.json);
  return 0;
}

}  // namespace
}  // namespace parasol::bench

int main(int argc, char** argv) { return parasol::bench::Main(argc, argv); }
