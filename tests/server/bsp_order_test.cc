// Under BSP a clock's sums are folded in worker rank order (server/clock_aggregate.hpp), so the
// model's bits do not depend on the order in which three or more workers' pushes arrive. The
// gradients are chosen so that float addition in arrival order would tell the orders apart:
// 1e8 + 1 rounds back to 1e8, so (1e8 + 1) - 1e8 is 0 while (1e8 - 1e8) + 1 is 1.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <string>
#include <vector>

#include "common/sharding.hpp"
#include "server/clock_aggregate.hpp"
#include "tests/support/in_process_shard.hpp"

namespace parasol {
namespace {

constexpr std::array<float, 3> kScale = {1e8f, 1.0f, -1e8f};  // by worker rank

TEST(ClockAggregateTest, PartsAreFoldedInRankOrderWhateverOrderTheyArrivedIn) {
  // The case is one arrival order would get wrong.
  volatile float a = kScale[0], b = kScale[1], c = kScale[2];
  ASSERT_NE((a + b) + c, (c + a) + b);
  constexpr uint32_t kEngines = 2, kDim = 3;
  const std::vector<uint64_t> keys = {11, 12, 1ull << 40};
  std::array<uint32_t, 3> order = {0, 1, 2};
  std::vector<std::vector<uint32_t>> results;
  do {
    ClockAggregate agg(/*tables=*/2, kEngines);
    for (uint32_t w : order) {
      ClockAggregate::Part& part = agg.PartOf(w);
      for (uint64_t key : keys) {
        if (w == 1 && key == 12) continue;  // a key some workers do not push
        float* sum = part.SparseSum(0, EngineOfKey(key, kEngines), key, kDim);
        for (uint32_t d = 0; d < kDim; ++d) sum[d] += kScale[w] * static_cast<float>(d + 1);
      }
      float* dense = part.DenseSum(1, 5);
      for (uint32_t i = 0; i < 5; ++i) dense[i] += kScale[w] * static_cast<float>(i);
    }
    EXPECT_EQ(agg.parts().size(), 3u);
    agg.PrepareCombine();
    for (uint32_t e = 0; e < kEngines; ++e) agg.CombineOn(e);
    agg.EndCombine();
    ASSERT_TRUE(agg.combined());
    EXPECT_TRUE(agg.parts().empty());
    std::vector<uint32_t> bits;
    for (uint64_t key : keys) {
      const uint32_t e = EngineOfKey(key, kEngines);
      const uint32_t at = agg.sums().FindSparse(0, e, key);
      ASSERT_NE(at, KeyIndex::kAbsent);
      const float* sum = agg.sums().SparseSumsOf(0, e) + size_t{at} * kDim;
      for (uint32_t d = 0; d < kDim; ++d) {
        // Rank order: (s0 + s1) + s2, each times (d + 1); key 12 lacks worker 1's.
        const float want = key == 12 ? (0.0f + kScale[0] * (d + 1)) + kScale[2] * (d + 1)
                                     : ((0.0f + kScale[0] * (d + 1)) + kScale[1] * (d + 1)) +
                                           kScale[2] * (d + 1);
        EXPECT_EQ(sum[d], want) << "key " << key << " d " << d;
        uint32_t u;
        std::memcpy(&u, &sum[d], 4);
        bits.push_back(u);
      }
    }
    const float* dense = agg.sums().DenseSumIfAny(1);
    ASSERT_NE(dense, nullptr);
    for (uint32_t i = 0; i < 5; ++i) {
      EXPECT_EQ(dense[i], ((0.0f + kScale[0] * i) + kScale[1] * i) + kScale[2] * i) << i;
      uint32_t u;
      std::memcpy(&u, &dense[i], 4);
      bits.push_back(u);
    }
    results.push_back(bits);
  } while (std::next_permutation(order.begin(), order.end()));
  ASSERT_EQ(results.size(), 6u);
  for (size_t i = 1; i < results.size(); ++i) EXPECT_EQ(results[i], results[0]) << "order " << i;
}

TEST(ClockAggregateTest, AOneWorkerClockIsCombinedWithoutACopyAndAnEmptyOneHasNoSums) {
  ClockAggregate one(1, 2);
  float* sum = one.PartOf(4).SparseSum(0, 0, 7, 2);
  sum[0] = 1.5f;
  one.PrepareCombine();
  one.CombineOn(0);
  one.CombineOn(1);
  one.EndCombine();
  ASSERT_EQ(one.sums().SparseKeys(0, 0).size(), 1u);
  EXPECT_EQ(one.sums().SparseSumsOf(0, 0), sum);  // the part itself, moved
  ClockAggregate none(1, 2);
  none.PrepareCombine();
  EXPECT_TRUE(none.sums().SparseKeys(0, 0).empty());
  EXPECT_EQ(none.sums().DenseSumIfAny(0), nullptr);
}

// A real shard, three workers: every order of their pushes and ticks ends in the same rows and
// dense weights, bit for bit, and those moved.
TEST(BspOrderTest, ThreeWorkersPushesInAnyArrivalOrderGiveTheSameModelBits) {
  const std::string manifest =
      "cluster:\n  servers: [127.0.0.1:1]\n  workers: 3\n"
      "server:\n  engine_threads: 2\n"
      "training: {consistency: bsp}\n"
      "tables:\n"
      "  - {name: e, kind: sparse, dim: 4, optimizer: {kind: sgd, lr: 1.0}}\n"
      "  - name: w\n    kind: dense\n    shape: [64]\n    optimizer: {kind: sgd, lr: 1.0}\n";
  std::vector<uint64_t> keys;
  for (uint64_t i = 0; i < 40; ++i) keys.push_back((i + 1) * 0x9E3779B97F4A7C15ull);
  std::array<uint32_t, 3> order = {0, 1, 2};
  std::vector<std::string> first;
  int orders = 0;
  do {
    SCOPED_TRACE("arrival order " + std::to_string(order[0]) + std::to_string(order[1]) +
                 std::to_string(order[2]));
    testing::InProcessShard shard(manifest, "bsp-order");
    const uint64_t before_rows = shard.Pull(0, 0, keys);
    const uint64_t before_dense = shard.PullDense(1, 0, 0, 64);
    for (int64_t clock = 0; clock < 2; ++clock) {
      for (uint32_t w : order) {
        // Worker 1 leaves every fourth key out; every worker pushes the dense weights in two
        // pieces.
        std::vector<uint64_t> mine;
        for (size_t i = 0; i < keys.size(); ++i) {
          if (w != 1 || i % 4 != 0) mine.push_back(keys[i]);
        }
        // Clock 0's sums cancel in rank order (and differ by arrival order); clock 1's move
        // the weights.
        const float scale = clock == 0 ? kScale[w] : static_cast<float>(w + 1);
        EXPECT_TRUE(shard.Answered(shard.Push(0, clock, mine, w, scale)));
        std::vector<float> g(32);
        for (uint64_t piece : {1, 0}) {
          for (uint32_t i = 0; i < 32; ++i) g[i] = scale * 0.001f * (piece * 32 + i + 1);
          EXPECT_TRUE(shard.Answered(shard.PushDense(1, clock, piece * 32, g, w)));
        }
      }
      for (uint32_t w : order) EXPECT_TRUE(shard.Answered(shard.Tick(clock + 1, w)));
    }
    EXPECT_EQ(shard.Stat("bsp_clocks_applied"), 2u);
    const uint64_t rows = shard.Pull(0, 2, keys), dense = shard.PullDense(1, 2, 0, 64);
    ASSERT_TRUE(shard.Answered(rows) && shard.Answered(dense));
    ASSERT_EQ(shard.Reply(rows).size(), keys.size() * 4 * sizeof(float));
    ASSERT_EQ(shard.Reply(dense).size(), 64 * sizeof(float));
    // (Compared as bytes, not printed.)
    EXPECT_TRUE(shard.Reply(rows) != shard.Reply(before_rows)) << "the rows did not move";
    EXPECT_TRUE(shard.Reply(dense) != shard.Reply(before_dense)) << "the weights did not move";
    if (first.empty()) {
      first = {shard.Reply(rows), shard.Reply(dense)};
    } else {
      EXPECT_TRUE(shard.Reply(rows) == first[0]) << "rows differ from the first order's";
      EXPECT_TRUE(shard.Reply(dense) == first[1]) << "weights differ from the first order's";
    }
    ++orders;
  } while (std::next_permutation(order.begin(), order.end()));
  EXPECT_EQ(orders, 6);
}

}  // namespace
}  // namespace parasol
