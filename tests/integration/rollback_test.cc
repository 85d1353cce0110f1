// Rollbacks through real servers (training.on_overlapping_failure): a worker and a shard that
// die together lose the updates only the worker's push log held. Under `rollback` the job goes
// back to the newest checkpoint every shard holds, both workers redo their steps from there, and
// the final model is the undisturbed one, bit for bit (also when a shard restarts again after
// the rollback). Under `fail` the restarted worker stops, naming the loss.
#include <gtest/gtest.h>
#include <signal.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "tests/support/json_figures.hpp"
#include "tests/support/test_cluster.hpp"
#include "tests/support/test_seed.hpp"

namespace parasol {
namespace {

using testing::JsonAt;
using testing::TestCluster;

constexpr const char* kTables =
    "  - {name: e, dim: 4, optimizer: {kind: sgd, lr: 0.5}}\n"
    "  - {name: w, kind: dense, shape: [8], optimizer: {kind: sgd, lr: 0.25}}\n";
constexpr int kSteps = 8;
constexpr uint32_t kKeys = 12;  // per worker and step, from a pool both workers share

std::string Yaml(const std::string& ckpt, const std::string& on_overlap) {
  return "training: {consistency: bsp, worker_timeout: 60s, on_overlapping_failure: " +
         on_overlap + "}\ncheckpoint: {dir: " + ckpt + ", every_steps: 2, keep: 4}\n";
}

std::vector<uint64_t> KeysOf(uint32_t rank, int64_t step) {
  std::vector<uint64_t> keys;
  for (uint32_t i = 0; i < kKeys; ++i) keys.push_back(1 + (rank * 5 + step * 7 + i * 3) % 40);
  std::sort(keys.begin(), keys.end());
  keys.erase(std::unique(keys.begin(), keys.end()), keys.end());
  return keys;
}

// One BSP step of worker `rank`: its pulls, gradients made from everything pulled (so any
// difference in what it read shows in the model), its pushes and, with `tick`, its tick.
Status Step(PsClient& c, uint32_t rank, int64_t step, bool tick = true) {
  const std::vector<uint64_t> keys = KeysOf(rank, step);
  std::vector<float> rows(keys.size() * 4), dense(8);
  PARASOL_RETURN_IF_ERROR(c.PullSparse(0, keys, rows.data()));
  PARASOL_RETURN_IF_ERROR(c.PullDense(1, dense.data()));
  float dense_sum = 0;
  for (float v : dense) dense_sum += v;
  std::vector<float> g(rows.size()), dg(8);
  for (size_t i = 0; i < rows.size(); ++i) {
    g[i] = 0.1f * rows[i] + 0.01f * static_cast<float>((keys[i / 4] + i) % 5) + 0.01f * dense_sum;
  }
  for (uint32_t j = 0; j < 8; ++j) {
    dg[j] = 0.05f * dense[j] + 0.001f * static_cast<float>(j + rank + step);
  }
  PARASOL_RETURN_IF_ERROR(c.PushSparse(0, keys, g));
  PARASOL_RETURN_IF_ERROR(c.PushDense(1, dg));
  return tick ? c.Tick() : Status::Ok();
}

// Both workers run steps [from, to) together (BSP: each step's pulls wait for the other's
// tick); the first error.
Status RunSteps(PsClient& w0, PsClient& w1, int64_t from, int64_t to) {
  Status s0, s1;
  std::thread t0([&] {
    for (int64_t s = from; s < to && s0.ok(); ++s) s0 = Step(w0, 0, s);
  });
  std::thread t1([&] {
    for (int64_t s = from; s < to && s1.ok(); ++s) s1 = Step(w1, 1, s);
  });
  t0.join();
  t1.join();
  return s0.ok() ? s1 : s0;
}

// Every value and optimizer state of every key either worker touches, and the dense table.
std::vector<float> Model(PsClient& observer) {
  std::vector<uint64_t> keys;
  for (uint64_t k = 1; k <= 40; ++k) keys.push_back(k);
  std::vector<float> out(keys.size() * observer.RowFloats(0) + 8 * observer.RowFloats(1));
  EXPECT_TRUE(observer.PullSparseWithState(0, keys, out.data()).ok());
  EXPECT_TRUE(
      observer.PullDenseWithState(1, out.data() + keys.size() * observer.RowFloats(0)).ok());
  return out;
}

class RollbackTest : public ::testing::Test {
 protected:
  void SetUp() override { ckpt_ = testing::MakeTempDir(); }
  void TearDown() override { testing::RemoveTree(ckpt_); }

  // The undisturbed job's model.
  std::vector<float> Reference() {
    const std::string dir = ckpt_ + "/ref";
    TestCluster cluster(2, 2, kTables, Yaml(dir, "rollback"));
    EXPECT_TRUE(cluster.Start());
    auto w0 = cluster.Connect(0), w1 = cluster.Connect(1);
    EXPECT_TRUE(w0 && w1);
    if (!w0 || !w1) return {};
    const Status st = RunSteps(*w0, *w1, 0, kSteps);
    EXPECT_TRUE(st.ok()) << st.ToString();
    auto observer = cluster.Connect(PsClient::kObserver);
    return observer ? Model(*observer) : std::vector<float>{};
  }

  std::string ckpt_;
};

// Shard 1 and worker 1 die together in the middle of step `fail_step` (both workers' pushes
// acknowledged, no tick sent): shard 1 restarts from its checkpoint, and worker 1's log of what
// it pushed since then died with it.
void ExpectRollbackToReference(const std::string& dir, int64_t fail_step,
                               const std::vector<float>& reference) {
  TestCluster cluster(2, 2, kTables, Yaml(dir, "rollback"));
  ASSERT_TRUE(cluster.Start());
  std::unique_ptr<PsClient> w0 = cluster.Connect(0), w1 = cluster.Connect(1);
  ASSERT_TRUE(w0 && w1);
  // A checkpoint at clock 2 is durable on both shards, so the job has one to go back to: the
  // periodic ones are taken when the shard's loop sees the clock boundary, and one may be
  // skipped, or still be written in the background when the kill comes.
  ASSERT_TRUE(RunSteps(*w0, *w1, 0, 2).ok());
  {
    auto observer = cluster.Connect(PsClient::kObserver);
    ASSERT_NE(observer, nullptr);
    ASSERT_TRUE(observer->Checkpoint().ok());
  }
  ASSERT_TRUE(RunSteps(*w0, *w1, 2, fail_step).ok());
  {
    Status s0, s1;
    std::thread t0([&] { s0 = Step(*w0, 0, fail_step, /*tick=*/false); });
    std::thread t1([&] { s1 = Step(*w1, 1, fail_step, /*tick=*/false); });
    t0.join();
    t1.join();
    ASSERT_TRUE(s0.ok() && s1.ok()) << s0.ToString() << " " << s1.ToString();
  }
  cluster.server(1).Signal(SIGKILL);
  ASSERT_TRUE(cluster.server(1).Wait(std::chrono::seconds(10)).has_value());
  w1.reset();  // its process dies: its push log with it
  ASSERT_TRUE(cluster.Respawn(1));
  // The new worker 1 finds the loss at its Hello and rolls the job back.
  w1 = cluster.Connect(1);
  ASSERT_NE(w1, nullptr);
  EXPECT_EQ(w1->rollback_generation(), 1u);
  const int64_t back_to = w1->resumed_clock();
  EXPECT_GE(back_to, 2);
  EXPECT_LE(back_to, fail_step);
  EXPECT_EQ(back_to % 2, 0) << "a checkpoint every 2 steps";
  // Worker 0 learns it at its next request: the tick of its step is refused as undone.
  const Status tick = w0->Tick();
  ASSERT_EQ(tick.code(), StatusCode::kAborted) << tick.ToString();
  EXPECT_EQ(w0->rolled_back().code(), StatusCode::kAborted);
  w0 = cluster.Connect(0);
  ASSERT_NE(w0, nullptr);
  EXPECT_EQ(w0->resumed_clock(), back_to);
  // Shard 0 restarts once more after the rollback: it comes back in the rollback's history.
  cluster.server(0).Signal(SIGKILL);
  ASSERT_TRUE(cluster.server(0).Wait(std::chrono::seconds(10)).has_value());
  ASSERT_TRUE(cluster.Respawn(0));
  const Status redo = RunSteps(*w0, *w1, back_to, kSteps);
  ASSERT_TRUE(redo.ok()) << redo.ToString() << "\n" << cluster.ServerLog(0);
  auto observer = cluster.Connect(PsClient::kObserver);
  ASSERT_NE(observer, nullptr);
  const std::vector<float> model = Model(*observer);
  ASSERT_EQ(model.size(), reference.size());
  size_t differ = 0;
  for (size_t i = 0; i < model.size(); ++i) {
    // Bitwise: a NaN on either side differs too.
    if (std::memcmp(&model[i], &reference[i], sizeof(float)) != 0) ++differ;
  }
  EXPECT_EQ(differ, 0u) << "of " << model.size() << " values";
  // Both shards are in the rollback's generation (shard 0's restarted process from its mark);
  // shard 1's process made it.
  Result<std::vector<std::string>> stats = observer->Stats();
  ASSERT_TRUE(stats.ok()) << stats.status().ToString();
  EXPECT_EQ(JsonAt((*stats)[0], "/rollback_generation"), 1) << (*stats)[0];
  EXPECT_EQ(JsonAt((*stats)[1], "/rollback_generation"), 1) << (*stats)[1];
  EXPECT_EQ(JsonAt((*stats)[1], "/rollbacks"), 1) << (*stats)[1];
  EXPECT_NE(cluster.ServerLog(0).find("rolled back to"), std::string::npos);
  // And shard 0 restarts once more, from the checkpoint the redo ended with (numbered after
  // every file of the undone history): its part of the model is still the undisturbed one.
  // That checkpoint is taken now: the periodic one of the last clock may not have begun yet
  // when the kill comes, and the workers, whose logs would replay the rest, are idle here.
  ASSERT_TRUE(observer->Checkpoint().ok());
  observer.reset();
  cluster.server(0).Signal(SIGKILL);
  ASSERT_TRUE(cluster.server(0).Wait(std::chrono::seconds(10)).has_value());
  ASSERT_TRUE(cluster.Respawn(0));
  observer = cluster.Connect(PsClient::kObserver);
  ASSERT_NE(observer, nullptr);
  const std::vector<float> again = Model(*observer);
  ASSERT_EQ(again.size(), reference.size());
  EXPECT_EQ(std::memcmp(again.data(), reference.data(), again.size() * sizeof(float)), 0)
      << "after a restart from the redo's last checkpoint";
}

TEST_F(RollbackTest, AWorkerAndAShardDyingTogetherRollBackToTheUndisturbedModel) {
  const std::vector<float> reference = Reference();
  ASSERT_FALSE(reference.empty());
  // The failure's step, each of 3, 4 and 5 in an order drawn from a printed seed: after the
  // first checkpoint (clock 2), so the job goes back to a checkpoint, not to its start.
  const uint64_t seed = testing::TestSeed();
  for (int round = 0; round < 3; ++round) {
    const int64_t fail_step = 3 + static_cast<int64_t>((seed + round) % 3);
    std::printf("[ seed     ] %llu, round %d: shard 1 and worker 1 die in step %lld\n",
                static_cast<unsigned long long>(seed), round, static_cast<long long>(fail_step));
    SCOPED_TRACE("fail_step " + std::to_string(fail_step));
    ExpectRollbackToReference(ckpt_ + "/job" + std::to_string(round), fail_step, reference);
    if (HasFatalFailure()) return;
  }
}

TEST_F(RollbackTest, UnderFailTheRestartedWorkerStopsNamingTheLoss) {
  const std::string dir = ckpt_ + "/fail";
  TestCluster cluster(2, 2, kTables, Yaml(dir, "fail"));
  ASSERT_TRUE(cluster.Start());
  std::unique_ptr<PsClient> w0 = cluster.Connect(0), w1 = cluster.Connect(1);
  ASSERT_TRUE(w0 && w1);
  ASSERT_TRUE(RunSteps(*w0, *w1, 0, 3).ok());
  {
    Status s0, s1;
    std::thread t0([&] { s0 = Step(*w0, 0, 3, /*tick=*/false); });
    std::thread t1([&] { s1 = Step(*w1, 1, 3, /*tick=*/false); });
    t0.join();
    t1.join();
    ASSERT_TRUE(s0.ok() && s1.ok());
  }
  cluster.server(1).Signal(SIGKILL);
  ASSERT_TRUE(cluster.server(1).Wait(std::chrono::seconds(10)).has_value());
  w1.reset();
  ASSERT_TRUE(cluster.Respawn(1));
  Result<std::unique_ptr<PsClient>> again = PsClient::Connect(cluster.manifest(), 1);
  ASSERT_FALSE(again.ok());
  EXPECT_EQ(again.status().code(), StatusCode::kFailedPrecondition);
  // Found at its Hello either way: shard 1 lost its updates, or the shards disagree on its clock.
  EXPECT_NE(again.status().message().find("lost"), std::string::npos)
      << again.status().ToString();
  EXPECT_NE(again.status().message().find("on_overlapping_failure: fail"), std::string::npos);
  // Nothing rolled back: a Rollback is refused in such a job.
  Header h = w0->ToolRequest(Op::Rollback, 0);
  h.clock = 2;
  h.rollback_gen = 1;
  Result<PsClient::Reply> refused = w0->Call(0, h, {});
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("does not roll back"), std::string::npos)
      << refused.status().ToString();
}

}  // namespace
}  // namespace parasol
