// A job that changes size while it runs (common/membership.hpp): a BSP logistic-regression job
// of 2 shards and 2 workers (cluster.max_workers 3) in which a third worker joins once the job
// has passed a clock drawn from a printed seed, and worker 1 is sent SIGTERM once it has passed
// a later one; in every other run the joined worker is also killed (SIGKILL) at a clock drawn
// between the two and started again, and continues where the shards know it. Every line of every epoch must be trained exactly once (counted from each
// worker's --trace-rows), the membership must say what each worker did, and the shards' final
// weights must equal a reference computed here, in double precision, with the same membership:
// each clock's present workers each take their share of the clock's chunk, and the shards apply
// the average of their gradients with sgd.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <map>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/manifest.hpp"
#include "common/membership.hpp"
#include "common/model_tables.hpp"
#include "common/net.hpp"
#include "common/sharding.hpp"
#include "common/subprocess.hpp"
#include "server/dense_table.hpp"
#include "tests/support/test_cluster.hpp"
#include "tests/support/test_seed.hpp"
#include "worker/data_generator.hpp"
#include "worker/data_reader.hpp"
#include "worker/ps_client.hpp"
#include "worker/trainer.hpp"

namespace parasol {
namespace {

using testing::MakeTempDir;
using testing::ReadFile;
using testing::RemoveTree;
using testing::WriteFile;

constexpr uint32_t kRows = 4000;
constexpr uint32_t kEpochs = 60;
constexpr uint32_t kBatch = 16;
constexpr double kLr = 0.1;

struct Run {
  std::string dir;
  std::string manifest_path;
  std::vector<Subprocess> servers;
  std::vector<Subprocess> workers;
};


// The reference: logistic regression on the 13 dense features and the categorical keys, trained
// with the job's split and BSP average, in double precision.
struct Reference {
  std::map<uint64_t, double> w;  // sparse weights (zeros at first)
  std::vector<double> dense;     // 13 weights, then the bias
};

double Sigmoid(double z) { return 1.0 / (1.0 + std::exp(-z)); }

Reference Train(const Manifest& m, const Membership& members, const std::vector<Batch>& rows,
                std::vector<double> dense_init) {
  Reference ref;
  ref.dense = std::move(dense_init);
  const uint64_t total = uint64_t{kRows} * kEpochs;
  for (int64_t clock = 0;; ++clock) {
    const StepChunk chunk = ChunkOf(members, 0, clock, kBatch);
    if (chunk.first >= total || chunk.ranks == 0) break;
    std::map<uint64_t, double> sparse_sum;
    std::vector<double> dense_sum(ref.dense.size(), 0.0);
    uint32_t active = 0;
    for (uint32_t i = 0; i < chunk.ranks; ++i) {
      std::vector<uint64_t> lines;
      for (uint32_t j = 0; j < kBatch; ++j) {
        const uint64_t p = chunk.first + i + uint64_t{j} * chunk.ranks;
        if (p < total) lines.push_back(p);
      }
      if (lines.empty()) continue;  // its share ended: it has left
      ++active;
      for (uint64_t p : lines) {
        const Batch& b = rows[p % kRows];
        double z = ref.dense.back();
        for (int f = 0; f < 13; ++f) z += ref.dense[f] * b.dense[f];
        for (size_t k = 0; k < b.keys.size(); ++k) z += ref.w[b.keys[k]] * b.values[k];
        const double g = (Sigmoid(z) - b.labels[0]) / static_cast<double>(lines.size());
        for (int f = 0; f < 13; ++f) dense_sum[f] += g * b.dense[f];
        dense_sum.back() += g;
        for (size_t k = 0; k < b.keys.size(); ++k) sparse_sum[b.keys[k]] += g * b.values[k];
      }
    }
    if (active == 0) break;
    for (const auto& [key, g] : sparse_sum) ref.w[key] -= kLr * g / active;
    for (size_t e = 0; e < ref.dense.size(); ++e) ref.dense[e] -= kLr * dense_sum[e] / active;
  }
  (void)m;
  return ref;
}

void RunElasticJob(uint64_t seed, bool kill_joiner) {
  std::mt19937_64 rng(seed);
  const int64_t join_after = std::uniform_int_distribution<int64_t>(200, 1200)(rng);
  const int64_t leave_after =
      join_after + std::uniform_int_distribution<int64_t>(300, 1000)(rng);
  const int64_t kill_after =
      std::uniform_int_distribution<int64_t>(join_after + 100, leave_after - 100)(rng);
  std::printf("[ elastic  ] seed %llu: worker 2 joins after clock %lld, worker 1 leaves after "
              "clock %lld%s\n",
              static_cast<unsigned long long>(seed), static_cast<long long>(join_after),
              static_cast<long long>(leave_after),
              kill_joiner ? (", worker 2 is killed and restarted after clock " +
                             std::to_string(kill_after)).c_str()
                          : "");
  Run run;
  run.dir = MakeTempDir();
  GeneratorOptions g;
  g.rows = kRows;
  g.seed = seed;
  ASSERT_TRUE(GenerateCriteo(run.dir + "/train.tsv", g).ok());
  const std::vector<uint16_t> ports = *PickFreePorts(2);
  run.manifest_path = run.dir + "/job.yaml";
  WriteFile(run.manifest_path,
            "job: {name: elastic, seed: 3}\n"
            "cluster:\n  servers: [127.0.0.1:" + std::to_string(ports[0]) + ", 127.0.0.1:" +
                std::to_string(ports[1]) + "]\n  workers: 2\n  max_workers: 3\n"
                "training: {consistency: bsp, batch_size: " + std::to_string(kBatch) +
                ", epochs: " + std::to_string(kEpochs) + ", worker_timeout: 60s}\n"
                "model:\n  kind: lr\n  sparse_optimizer: {kind: sgd, lr: 0.1}\n"
                "  dense_optimizer: {kind: sgd, lr: 0.1}\n"
                "data: {train: " + run.dir + "/train.tsv}\n");
  Result<Manifest> manifest = LoadManifest(run.manifest_path);
  ASSERT_TRUE(manifest.ok()) << manifest.status().ToString();
  for (int s = 0; s < 2; ++s) {
    auto p = Subprocess::Spawn({PARASOL_BINARY, "server", "--manifest", run.manifest_path,
                                "--rank", std::to_string(s)},
                               run.dir + "/server" + std::to_string(s) + ".log");
    ASSERT_TRUE(p.ok()) << p.status().ToString();
    run.servers.push_back(std::move(*p));
  }
  auto start_worker = [&](int rank) {
    const std::string r = std::to_string(rank);
    auto p = Subprocess::Spawn({PARASOL_BINARY, "worker", "--manifest", run.manifest_path,
                                "--rank", r, "--trace-rows", run.dir + "/trace" + r,
                                "--summary", run.dir + "/summary" + r + ".json"},
                               run.dir + "/worker" + r + ".log");
    EXPECT_TRUE(p.ok()) << p.status().ToString();
    if (p.ok()) run.workers.push_back(std::move(*p));
  };
  start_worker(0);
  start_worker(1);
  auto observer = PsClient::Connect(*manifest, PsClient::kObserver);
  ASSERT_TRUE(observer.ok()) << observer.status().ToString();
  auto wait_for_clock = [&](int64_t clock) {
    return testing::WaitForWorkerClock(**observer, clock, std::chrono::seconds(60));
  };
  ASSERT_TRUE(wait_for_clock(join_after)) << "the job never reached clock " << join_after;
  start_worker(2);
  // Its join, named by shard 0 once the process has started (under load, many clocks later).
  int64_t joined = -1;
  for (int i = 0; i < 10000 && joined < 0; ++i) {
    ASSERT_TRUE((*observer)->SyncMembership().ok());
    joined = (*observer)->membership().join(2);
    if (joined < 0) std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  ASSERT_GE(joined, 0) << "worker 2 never joined";
  // The leave comes after the join (and after the joiner's kill): the drawn clock, or later.
  int64_t leave_at = std::max(leave_after, joined + 100);
  if (kill_joiner) {
    // Once it has joined and trained a while: the drawn clock, or 50 past its join.
    const int64_t at = std::max(kill_after, joined + 50);
    leave_at = std::max(leave_at, at + 50);
    ASSERT_TRUE(wait_for_clock(at)) << "the job never reached clock " << at;
    run.workers[2].Signal(SIGKILL);
    ASSERT_TRUE(run.workers[2].Wait(std::chrono::seconds(10)).has_value());
    run.workers.pop_back();
    start_worker(2);  // the same rank again: it continues where the shards know it
  }
  ASSERT_TRUE(wait_for_clock(leave_at)) << "the job never reached clock " << leave_at;
  run.workers[1].Signal(SIGTERM);
  for (size_t w = 0; w < run.workers.size(); ++w) {
    auto st = run.workers[w].Wait(std::chrono::seconds(120));
    ASSERT_TRUE(st.has_value()) << "worker " << w << " did not finish";
    EXPECT_TRUE(WIFEXITED(*st) && WEXITSTATUS(*st) == 0)
        << "worker " << w << " " << DescribeWaitStatus(*st) << "\n"
        << ReadFile(run.dir + "/worker" + std::to_string(w) + ".log");
  }

  // The membership as the shards know it.
  ASSERT_TRUE((*observer)->SyncMembership().ok());
  const Membership members = (*observer)->membership();
  std::printf("[ elastic  ] worker 2 joined at clock %lld, worker 1 left at clock %lld\n",
              static_cast<long long>(members.join(2)), static_cast<long long>(members.leave(1)));
  EXPECT_GT(members.join(2), join_after);
  EXPECT_GT(members.leave(1), leave_after);
  EXPECT_GT(members.leave(1), members.join(2));
  EXPECT_LT(members.leave(0), 0);
  EXPECT_LT(members.leave(2), 0);

  // Every line of every epoch, exactly once; each worker trained exactly its clocks. A step
  // redone by a restarted worker is reported again, with the same lines.
  std::vector<uint32_t> seen(uint64_t{kRows} * kEpochs, 0);
  std::vector<std::pair<int64_t, int64_t>> span(3, {-1, -1});
  uint64_t redone = 0;
  for (int w = 0; w < 3; ++w) {
    std::istringstream in(ReadFile(run.dir + "/trace" + std::to_string(w)));
    std::string line, last_line;
    while (std::getline(in, line)) {
      std::istringstream f(line);
      int64_t step = 0;
      uint32_t micro = 0;
      f >> step >> micro;
      EXPECT_EQ(micro, 0u);
      if (step == span[w].second) {  // redone after a restart: the same batch
        EXPECT_EQ(line, last_line) << "worker " << w << " redid step " << step << " otherwise";
        ++redone;
        continue;
      }
      last_line = line;
      if (span[w].first < 0) span[w].first = step;
      EXPECT_EQ(step, std::max<int64_t>(span[w].second + 1, span[w].first))
          << "worker " << w << " skipped a step";
      span[w].second = step;
      EXPECT_TRUE(members.Present(w, step)) << "worker " << w << " trained step " << step;
      uint64_t p = 0;
      while (f >> p) {
        ASSERT_LT(p, seen.size());
        ++seen[p];
      }
    }
  }
  if (!kill_joiner) { EXPECT_EQ(redone, 0u); }
  if (kill_joiner) {
    EXPECT_NE(ReadFile(run.dir + "/worker2.log").find("resuming at step"), std::string::npos)
        << ReadFile(run.dir + "/worker2.log");
  }
  // The joiner's (or its restart's) rate after its warm-up: timed from kRateWarmupSteps after
  // the step it started at, not from step kRateWarmupSteps of the job, which it never took.
  {
    const std::string text = ReadFile(run.dir + "/summary2.json");
    const nlohmann::json s2 = nlohmann::json::parse(text, nullptr, false);
    ASSERT_FALSE(s2.is_discarded()) << text;
    const int64_t first = s2.value("first_step", int64_t{-1});
    const int64_t steps = s2.value("steps", int64_t{-1});
    ASSERT_GT(first, 0) << text;
    ASSERT_GT(steps - first, static_cast<int64_t>(kRateWarmupSteps)) << text;
    EXPECT_GT(s2.value("samples_per_second_after_warmup", -1.0), 0.0) << text;
    EXPECT_GT(s2.value("seconds_after_warmup", 0.0), 0.0) << text;
    EXPECT_LT(s2.value("seconds_after_warmup", 0.0), s2.value("train_seconds", 0.0)) << text;
  }
  uint64_t wrong = 0, first_wrong = 0;
  for (uint64_t p = 0; p < seen.size(); ++p) {
    if (seen[p] != 1 && wrong++ == 0) first_wrong = p;
  }
  EXPECT_EQ(wrong, 0u) << "lines trained other than once; the first: " << first_wrong
                       << " (count " << seen[first_wrong] << ")";
  EXPECT_EQ(span[2].first, members.join(2));
  EXPECT_EQ(span[1].second + 1, members.leave(1));
  EXPECT_EQ(span[0].first, 0);

  // The final weights against the reference.
  Result<std::vector<Batch>> rows =
      ReadAll(DataOptions::Format::kCriteo, run.dir + "/train.tsv", 1, true, nullptr);
  ASSERT_TRUE(rows.ok());
  ASSERT_EQ(rows->size(), kRows);
  const ModelLayout layout = LayoutOf(manifest->model);
  const int sparse_id = manifest->FindTable(layout.sparse_table);
  const int weight_id = manifest->FindTable(layout.top[0].weight_table);
  const int bias_id = manifest->FindTable(layout.top[0].bias_table);
  ASSERT_GE(sparse_id, 0);
  ASSERT_GE(weight_id, 0);
  ASSERT_GE(bias_id, 0);
  std::vector<double> dense_init;
  {
    const TableOptions& t = manifest->tables[weight_id];
    DenseTable initial(t, DenseSlice(t.NumElements(), 0, 1));
    std::vector<float> v(t.NumElements());
    initial.ReadValues(0, v.size(), v.data());
    dense_init.assign(v.begin(), v.end());
    dense_init.push_back(0.0);  // the bias starts at zero
  }
  ASSERT_EQ(dense_init.size(), 14u);
  const Reference ref = Train(*manifest, members, *rows, dense_init);
  std::vector<uint64_t> keys;
  for (const auto& [k, v] : ref.w) keys.push_back(k);
  std::vector<float> got(keys.size());
  ASSERT_TRUE((*observer)->PullSparseReadOnly(sparse_id, keys, got.data()).ok());
  std::vector<float> weights(13), bias(1);
  ASSERT_TRUE((*observer)->PullDense(weight_id, weights.data()).ok());
  ASSERT_TRUE((*observer)->PullDense(bias_id, bias.data()).ok());
  double worst = 0, scale = 0;
  for (size_t i = 0; i < keys.size(); ++i) {
    worst = std::max(worst, std::abs(got[i] - ref.w.at(keys[i])));
    scale = std::max(scale, std::abs(ref.w.at(keys[i])));
  }
  for (int f = 0; f < 13; ++f) worst = std::max(worst, std::abs(weights[f] - ref.dense[f]));
  worst = std::max(worst, std::abs(bias[0] - ref.dense[13]));
  std::printf("[ elastic  ] %zu keys; largest difference from the reference %.3g (largest "
              "weight %.3g)\n",
              keys.size(), worst, scale);
  EXPECT_GT(keys.size(), 1000u);
  EXPECT_GT(scale, 0.1);
  EXPECT_LT(worst, 1e-3 * std::max(1.0, scale)) << "the shards' weights differ from the reference";
  (void)(*observer)->Shutdown();
  for (auto& s : run.servers) (void)s.Wait(std::chrono::seconds(20));
  RemoveTree(run.dir);
}

TEST(ElasticTest, AWorkerJoinsAnotherLeavesAndEveryLineIsTrainedOnceAsTheReferenceSays) {
  const uint64_t base = testing::TestSeed();
  for (uint64_t i = 0; i < 2; ++i) {
    SCOPED_TRACE("seed " + std::to_string(base + i));
    RunElasticJob(base + i, /*kill_joiner=*/i % 2 == 1);
    if (HasFatalFailure()) return;
  }
}

}  // namespace
}  // namespace parasol
