// The consistency modes, enforced by real shards: BSP's equivalence with one large batch,
// SSP's staleness bound (exactly, not more strictly), ASP's freedom, and lost workers.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <thread>

#include "common/hash.hpp"
#include "tests/support/json_figures.hpp"
#include "tests/support/test_cluster.hpp"

namespace parasol {
namespace {

using testing::JsonAt;
using testing::TestCluster;

constexpr const char* kTables =
    "  - name: emb\n    dim: 4\n    init: {kind: uniform, scale: 0.5}\n"
    "    optimizer: {kind: sgd, lr: 0.5}\n"
    "  - name: w\n    kind: dense\n    shape: [8]\n    init: {kind: normal, stddev: 0.3}\n"
    "    optimizer: {kind: sgd, lr: 0.3}\n";

std::string Training(const std::string& body) { return "training:\n" + body; }

// Sample j of step t: a key among 30 (so workers share keys) and targets for its row and for
// the dense tensor.
uint64_t SampleKey(int t, int j) { return 100 + SplitMix64(t * 1000 + j) % 30; }
float Target(int t, int j, int d) {
  return static_cast<float>(static_cast<double>(SplitMix64(t * 7919 + j * 31 + d) >> 40) /
                                16777216.0 - 0.5);
}

// One step of least squares on samples [first, first + count) of step t, each gradient divided
// by `batch` (a mean over the worker's batch), then Tick.
Status Step(PsClient& c, int t, int first, int count, int batch) {
  std::vector<uint64_t> keys;
  for (int j = first; j < first + count; ++j) keys.push_back(SampleKey(t, j));
  std::vector<float> rows(keys.size() * 4), dense(8);
  PARASOL_RETURN_IF_ERROR(c.PullSparse(0, keys, rows.data()));
  PARASOL_RETURN_IF_ERROR(c.PullDense(1, dense.data()));
  std::vector<float> grads(keys.size() * 4), dgrad(8, 0.0f);
  for (int i = 0; i < count; ++i) {
    for (int d = 0; d < 4; ++d) {
      grads[i * 4 + d] = (rows[i * 4 + d] - Target(t, first + i, d)) / batch;
    }
    for (int d = 0; d < 8; ++d) dgrad[d] += (dense[d] - Target(t, first + i, 4 + d)) / batch;
  }
  PARASOL_RETURN_IF_ERROR(c.PushSparse(0, keys, grads));
  PARASOL_RETURN_IF_ERROR(c.PushDense(1, dgrad));
  return c.Tick();
}

// Every row of the 30 keys and the dense tensor, after training.
std::vector<float> FinalWeights(TestCluster& cluster) {
  auto c = PsClient::Connect(cluster.manifest(), PsClient::kObserver);
  EXPECT_TRUE(c.ok());
  if (!c.ok()) return {};
  std::vector<uint64_t> keys;
  for (uint64_t k = 100; k < 130; ++k) keys.push_back(k);
  std::vector<float> out(30 * 4 + 8);
  EXPECT_TRUE((*c)->PullSparse(0, keys, out.data()).ok());
  EXPECT_TRUE((*c)->PullDense(1, out.data() + 120).ok());
  return out;
}

TEST(ConsistencyTest, BspTwoWorkersOfBatchBEqualOneWorkerOfBatch2B) {
  constexpr int kSteps = 20, kB = 6;
  std::vector<float> one, two;
  {
    TestCluster cluster(2, 1, kTables, Training("  consistency: bsp\n"));
    ASSERT_TRUE(cluster.Start());
    auto c = cluster.Connect(0);
    ASSERT_NE(c, nullptr);
    for (int t = 0; t < kSteps; ++t) ASSERT_TRUE(Step(*c, t, 0, 2 * kB, 2 * kB).ok());
    one = FinalWeights(cluster);
  }
  {
    TestCluster cluster(2, 2, kTables, Training("  consistency: bsp\n"));
    ASSERT_TRUE(cluster.Start());
    std::vector<std::string> errors(2);
    auto worker = [&](uint32_t w) {
      auto c = cluster.Connect(w);
      if (!c) return;
      for (int t = 0; t < kSteps; ++t) {
        Status st = Step(*c, t, w * kB, kB, kB);
        if (!st.ok()) {
          errors[w] = st.ToString();
          return;
        }
      }
    };
    std::thread a(worker, 0), b(worker, 1);
    a.join();
    b.join();
    ASSERT_EQ(errors[0], "");
    ASSERT_EQ(errors[1], "");
    two = FinalWeights(cluster);
  }
  ASSERT_EQ(one.size(), two.size());
  double moved = 0;
  for (size_t i = 0; i < one.size(); ++i) {
    EXPECT_LE(std::abs(one[i] - two[i]), 1e-5 * std::abs(one[i]) + 1e-7) << "weight " << i;
    moved += std::abs(one[i]);
  }
  EXPECT_GT(moved, 0.0);
}

// A fast and a slow worker (it sleeps before each tick). Returns, for each pull the fast worker
// got answered, its clock minus the slow worker's clock (the slow worker publishes its new
// clock just before telling the shards, so the difference is never understated).
struct Race {
  std::vector<int64_t> leads;
  int64_t slow_clock_when_fast_done = -1;
  std::string error;
};

Race RunRace(const std::string& training, int fast_steps, int slow_sleep_ms) {
  Race race;
  TestCluster cluster(2, 2, kTables, training);
  if (!cluster.Start()) return race;
  std::atomic<int64_t> slow_clock{0};
  std::atomic<bool> fast_done{false};
  std::thread slow([&] {
    auto c = cluster.Connect(1);
    if (!c) return;
    std::vector<uint64_t> keys = {100, 101};
    std::vector<float> rows(8), grads(8, 0.01f);
    // Bounded: stops when the fast worker is done, or after 200 steps.
    for (int t = 0; t < 200 && !fast_done.load(); ++t) {
      if (!c->PullSparse(0, keys, rows.data()).ok()) return;
      if (!c->PushSparse(0, keys, grads).ok()) return;
      std::this_thread::sleep_for(std::chrono::milliseconds(slow_sleep_ms));
      slow_clock.store(c->clock() + 1);
      if (!c->Tick().ok()) return;
    }
  });
  {
    auto c = cluster.Connect(0);
    if (c) {
      std::vector<uint64_t> keys = {100, 102};
      std::vector<float> rows(8), grads(8, 0.01f);
      for (int t = 0; t < fast_steps; ++t) {
        Status st = c->PullSparse(0, keys, rows.data());
        if (!st.ok()) {
          race.error = st.ToString();
          break;
        }
        race.leads.push_back(c->clock() - slow_clock.load());
        if (!c->PushSparse(0, keys, grads).ok() || !c->Tick().ok()) break;
      }
      race.slow_clock_when_fast_done = slow_clock.load();
    }
  }
  fast_done.store(true);
  slow.join();
  return race;
}

TEST(ConsistencyTest, SspHoldsTheFastWorkerWithinStalenessAndNoTighter) {
  constexpr int64_t kStaleness = 2;
  Race r = RunRace(Training("  consistency: ssp\n  staleness: 2\n"), 15, 30);
  ASSERT_EQ(r.error, "");
  ASSERT_EQ(r.leads.size(), 15u);
  int64_t max_lead = 0;
  for (size_t i = 0; i < r.leads.size(); ++i) {
    EXPECT_LE(r.leads[i], kStaleness) << "pull " << i << " was answered " << r.leads[i]
                                      << " clocks ahead of the slow worker";
    max_lead = std::max(max_lead, r.leads[i]);
  }
  EXPECT_EQ(max_lead, kStaleness) << "the bound is stricter than asked";
}

TEST(ConsistencyTest, BspHoldsTheFastWorkerInLockstep) {
  Race r = RunRace(Training("  consistency: bsp\n"), 10, 20);
  ASSERT_EQ(r.error, "");
  for (int64_t lead : r.leads) EXPECT_LE(lead, 0);
}

TEST(ConsistencyTest, AspLetsTheFastWorkerFinishWhileTheSlowOneIsEarly) {
  Race r = RunRace(Training("  consistency: asp\n"), 20, 150);
  ASSERT_EQ(r.error, "");
  ASSERT_EQ(r.leads.size(), 20u);
  EXPECT_LT(r.slow_clock_when_fast_done, 5);
  EXPECT_GE(r.leads.back(), 15);
}

// Worker 1 does one step and goes silent; worker 0 keeps training.
struct LossRun {
  Status first_error;
  int steps_done = 0;
  std::string stats;
};

LossRun RunWithSilentWorker(const std::string& policy) {
  LossRun out;
  TestCluster cluster(2, 2, kTables,
                      Training("  consistency: bsp\n  worker_timeout: 800ms\n  on_worker_loss: " +
                               policy + "\n"));
  if (!cluster.Start()) return out;
  auto quiet = cluster.Connect(1);
  auto busy = cluster.Connect(0);
  if (!quiet || !busy) return out;
  std::thread one_step([&] { (void)Step(*quiet, 0, 0, 4, 4); });
  for (int t = 0; t < 6; ++t) {
    Status st = Step(*busy, t, 4, 4, 4);
    if (!st.ok()) {
      out.first_error = st;
      break;
    }
    ++out.steps_done;
  }
  one_step.join();
  auto observer = PsClient::Connect(cluster.manifest(), PsClient::kObserver);
  if (observer.ok()) {
    auto s = (*observer)->Stats();
    if (s.ok()) out.stats = (*s)[0];
  }
  return out;
}

TEST(ConsistencyTest, ALostWorkerFailsTheJobNamingIt) {
  LossRun r = RunWithSilentWorker("fail");
  ASSERT_FALSE(r.first_error.ok());
  EXPECT_NE(r.first_error.message().find("worker 1 lost"), std::string::npos)
      << r.first_error.ToString();
  EXPECT_NE(r.first_error.message().find("on_worker_loss: fail"), std::string::npos);
  EXPECT_LT(r.steps_done, 6);
  EXPECT_NE(r.stats.find("\"lost_workers\":[1]"), std::string::npos) << r.stats;
}

TEST(ConsistencyTest, WithContinueTheOtherWorkersFinish) {
  LossRun r = RunWithSilentWorker("continue");
  EXPECT_TRUE(r.first_error.ok()) << r.first_error.ToString();
  EXPECT_EQ(r.steps_done, 6);
  EXPECT_NE(r.stats.find("\"lost_workers\":[1]"), std::string::npos) << r.stats;
}

}  // namespace
}  // namespace parasol

namespace parasol {
namespace {

// Under SSP a prefetch for the next step carries that step's clock: with staleness 1, a worker
// at clock 1 may read now (the slowest is at 0), but its rows for clock 2 wait until the slowest
// reaches 1. Before, the prefetch carried clock 1 and read one clock staler than the bound.
TEST(ConsistencyTest, ASspPrefetchIsHeldToTheBoundOfTheStepItIsFor) {
  TestCluster cluster(1, 2, kTables, Training("  consistency: ssp\n  staleness: 1\n"));
  ASSERT_TRUE(cluster.Start());
  auto fast = cluster.Connect(0), slow = cluster.Connect(1);
  auto observer = cluster.Connect(PsClient::kObserver);
  ASSERT_TRUE(fast && slow && observer);
  ASSERT_TRUE(fast->Tick().ok());  // fast at 1, slow at 0
  const std::vector<uint64_t> keys = {101, 102, 103};
  std::vector<float> now(keys.size() * 4), next(keys.size() * 4);
  ASSERT_TRUE(fast->PullSparse(0, keys, now.data()).ok());  // clock 1: within the bound
  auto ticket = fast->PrefetchSparseAsync(0, keys, next.data());
  ASSERT_TRUE(ticket.ok());
  // The shard holds it: poll its stats (bounded) until the pull is counted as held.
  double held = 0;
  for (int i = 0; i < 100 && held < 1; ++i) {
    auto stats = observer->Stats();
    ASSERT_TRUE(stats.ok());
    held = JsonAt((*stats)[0], "/held_pulls");
    if (held < 1) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_EQ(held, 1) << "the prefetch for clock 2 was not held while the slowest was at 0";
  ASSERT_TRUE(slow->Tick().ok());  // slowest at 1: clock 2 may read
  ASSERT_TRUE(fast->Wait(*ticket).ok());
  EXPECT_EQ(next, now);  // nobody pushed in between
  auto stats = observer->Stats();
  ASSERT_TRUE(stats.ok());
  EXPECT_EQ(JsonAt((*stats)[0], "/held_pulls"), 0) << (*stats)[0];
}

}  // namespace
}  // namespace parasol

namespace parasol {
namespace {

// The worker row cache under SSP (staleness 2): a row is reused while the read bound allows
// it, the worker's own pushes reach its copy as the shard applies them (SGD), and a row another
// worker changed at clock 0 is seen by clock 0 + 2 + 1 at the latest.
TEST(ConsistencyTest, TheRowCacheKeepsTheSspBound) {
  TestCluster cluster(2, 2, kTables,
                      Training("  consistency: ssp\n  staleness: 2\n") +
                          "worker:\n  cache_rows: 1000\n");
  ASSERT_TRUE(cluster.Start());
  auto cached = cluster.Connect(0), other = cluster.Connect(1);
  auto observer = cluster.Connect(PsClient::kObserver);
  ASSERT_TRUE(cached && other && observer);
  cached->AssumeUniqueKeys(true);
  const std::vector<uint64_t> keys = {101, 102, 103};
  auto pull = [&](PsClient& c) {
    std::vector<float> rows(keys.size() * 4);
    EXPECT_TRUE(c.PullSparse(0, keys, rows.data()).ok());
    return rows;
  };
  const std::vector<float> first = pull(*cached);  // clock 0: pulled, valid until 0 + 2
  EXPECT_EQ(cached->cache_misses(), keys.size());
  // Its own push (SGD, lr 0.5) reaches its copy as the shard applies it.
  const std::vector<float> grads(keys.size() * 4, 0.25f);
  ASSERT_TRUE(cached->PushSparse(0, keys, grads).ok());
  const std::vector<float> own = pull(*cached);
  EXPECT_EQ(cached->cache_hits(), keys.size());
  EXPECT_EQ(own, pull(*observer));  // the same as the shards have, bit for bit
  // Another worker changes the rows at clock 0.
  ASSERT_TRUE(other->PushSparse(0, keys, grads).ok());
  ASSERT_TRUE(other->Tick().ok());
  ASSERT_TRUE(other->Tick().ok());
  ASSERT_TRUE(other->Tick().ok());  // the other worker at clock 3
  const std::vector<float> changed = pull(*observer);
  ASSERT_NE(changed, own);
  for (int c = 1; c <= 3; ++c) {
    ASSERT_TRUE(cached->Tick().ok());
    const std::vector<float> seen = pull(*cached);
    if (c <= 2) {
      EXPECT_EQ(seen, own) << "clock " << c << ": the copy is still within the bound";
    } else {
      EXPECT_EQ(seen, changed) << "clock " << c << ": past the bound, the row is pulled again";
    }
  }
  EXPECT_EQ(cached->cache_hits(), 3 * keys.size());
  EXPECT_EQ(cached->cache_misses(), 2 * keys.size());
}

}  // namespace
}  // namespace parasol

namespace parasol {
namespace {

// With staleness 0 (and under BSP) the cache is off: every pull reads the shards, so results
// are those of a worker without it.
TEST(ConsistencyTest, TheRowCacheIsOffWithoutStaleness) {
  for (const char* mode : {"  consistency: ssp\n  staleness: 0\n", "  consistency: bsp\n"}) {
    TestCluster cluster(1, 1, kTables, Training(mode) + "worker:\n  cache_rows: 1000\n");
    ASSERT_TRUE(cluster.Start());
    auto c = cluster.Connect(0);
    ASSERT_TRUE(c);
    c->AssumeUniqueKeys(true);
    const std::vector<uint64_t> keys = {5, 6};
    std::vector<float> rows(keys.size() * 4), grads(keys.size() * 4, 0.5f);
    for (int i = 0; i < 3; ++i) {
      ASSERT_TRUE(c->PullSparse(0, keys, rows.data()).ok());
      ASSERT_TRUE(c->PushSparse(0, keys, grads).ok());
      ASSERT_TRUE(c->Tick().ok());
    }
    EXPECT_EQ(c->cache_hits(), 0u) << mode;
    EXPECT_EQ(c->cache_misses(), 0u) << mode;
  }
}

}  // namespace
}  // namespace parasol

namespace parasol {
namespace {

// training.prefetch_depth 2 under SSP (staleness 2): a worker at clock 1 may prefetch for
// clocks 2 and 3, each held to its own step's bound (the slowest at 0 admits clock 2, not 3);
// the clock-3 rows, held while the slowest worker pushes at clock 0, include that push, which
// the bound of clock 3 requires; clock 4 (1 + 3) is refused, naming the depth.
TEST(ConsistencyTest, PrefetchesKStepsAheadAreEachHeldToTheirOwnBound) {
  TestCluster cluster(1, 2, kTables,
                      Training("  consistency: ssp\n  staleness: 2\n  prefetch_depth: 2\n"));
  ASSERT_TRUE(cluster.Start());
  auto fast = cluster.Connect(0), slow = cluster.Connect(1);
  auto observer = cluster.Connect(PsClient::kObserver);
  ASSERT_TRUE(fast && slow && observer);
  const std::vector<uint64_t> keys = {101, 102, 103};
  std::vector<float> before(keys.size() * 4), at2(keys.size() * 4), at3(keys.size() * 4);
  ASSERT_TRUE(observer->PullSparse(0, keys, before.data()).ok());
  ASSERT_TRUE(fast->Tick().ok());  // fast at 1, slow at 0
  auto held_pulls = [&] {
    auto stats = observer->Stats();
    EXPECT_TRUE(stats.ok());
    return stats.ok() ? JsonAt((*stats)[0], "/held_pulls") : -1.0;
  };
  auto t3 = fast->PrefetchSparseAsync(0, keys, at3.data(), 2);  // clock 3: needs slowest >= 1
  ASSERT_TRUE(t3.ok()) << t3.status().ToString();
  auto t2 = fast->PrefetchSparseAsync(0, keys, at2.data(), 1);  // clock 2: slowest 0 will do
  ASSERT_TRUE(t2.ok()) << t2.status().ToString();
  ASSERT_TRUE(fast->Wait(*t2).ok());
  EXPECT_EQ(at2, before);
  double held = 0;
  for (int i = 0; i < 100 && held < 1; ++i) {
    held = held_pulls();
    if (held < 1) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_EQ(held, 1) << "the prefetch for clock 3 was not held while the slowest was at 0";
  // Beyond the depth: refused.
  std::vector<float> at4(keys.size() * 4);
  auto t4 = fast->PrefetchSparseAsync(0, keys, at4.data(), 3);
  ASSERT_TRUE(t4.ok());
  const Status refused = fast->Wait(*t4);
  EXPECT_FALSE(refused.ok());
  EXPECT_NE(refused.ToString().find("training.prefetch_depth"), std::string::npos)
      << refused.ToString();
  // The slow worker pushes at clock 0 while the clock-3 pull is held, then moves to clock 1.
  const std::vector<float> grads(keys.size() * 4, 0.25f);
  ASSERT_TRUE(slow->PushSparse(0, keys, grads).ok());
  ASSERT_TRUE(slow->Tick().ok());  // slowest at 1: clock 3 may read
  ASSERT_TRUE(fast->Wait(*t3).ok());
  std::vector<float> after(keys.size() * 4);
  ASSERT_TRUE(observer->PullSparse(0, keys, after.data()).ok());
  ASSERT_NE(after, before);
  EXPECT_EQ(at3, after) << "the clock-3 rows miss the clock-0 push the bound requires";
  EXPECT_EQ(held_pulls(), 0);
}

}  // namespace
}  // namespace parasol
