// Under BSP a clock's sums are folded in worker rank order (server/clock_aggregate.hpp), so the
// model's bits do not depend on the order in which three or more workers' pushes arrive. The
// gradients are chosen so that float addition in arrival order would tell the orders apart:
// 1e8 + 1 rounds back to 1e8, so (1e8 + 1) - 1e8 is 0 while (1e8 - 1e8) + 1 is 1.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <string>
#include <tuple>
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

// Sums of `n` keys from `first` for worker `w` of `agg`, and 8 dense elements.
void PushSums(ClockAggregate& agg, uint32_t w, uint64_t first, uint64_t n, uint32_t engines) {
  constexpr uint32_t kDim = 4;
  for (uint64_t k = first; k < first + n; ++k) {
    float* sum = agg.PartOf(w).SparseSum(0, EngineOfKey(k, engines), k, kDim);
    for (uint32_t d = 0; d < kDim; ++d) sum[d] += static_cast<float>(k % 7 + d) * (w + 1.5f);
  }
  float* dense = agg.PartOf(w).DenseSum(1, 8);
  for (uint32_t i = 0; i < 8; ++i) dense[i] += static_cast<float>(i) * (w + 1.5f);
}

void Combine(ClockAggregate& agg, uint32_t engines) {
  agg.PrepareCombine();
  for (uint32_t e = 0; e < engines; ++e) agg.CombineOn(e);
  agg.EndCombine();
}

TEST(ClockAggregateTest, AnAppliedClocksPartsAreReusedClearedAndBounded) {
  constexpr uint32_t kEngines = 2, kDim = 4;
  SpareParts spares;
  spares.max_parts = 2;
  spares.max_bytes = 1ull << 30;
  std::vector<const float*> buffers(kEngines);
  {
    // Clock 0: two workers' sums of 2,000 keys each, 1,000 of them shared.
    ClockAggregate c0(2, kEngines, &spares);
    PushSums(c0, 0, 0, 2000, kEngines);
    PushSums(c0, 1, 1000, 2000, kEngines);
    Combine(c0, kEngines);
    ASSERT_EQ(c0.sums().SparseKeys(0, 0).size() + c0.sums().SparseKeys(0, 1).size(), 3000u);
    for (uint32_t e = 0; e < kEngines; ++e) buffers[e] = c0.sums().SparseSumsOf(0, e);
    // Worker 1's part went to the spares when it was folded in; the sums once applied.
    EXPECT_EQ(spares.parts.size(), 1u);
    c0.Recycle();
    EXPECT_FALSE(c0.combined());
    EXPECT_TRUE(c0.parts().empty());
    EXPECT_EQ(spares.parts.size(), 2u);
    EXPECT_GT(spares.bytes, 3000u * kDim * sizeof(float));
  }
  // Clock 1 takes them: cleared (no keys, no dense sums), with their buffers.
  ClockAggregate c1(2, kEngines, &spares);
  ClockAggregate fresh(2, kEngines);  // the same pushes, without spares
  ClockAggregate::Part& p0 = c1.PartOf(0);
  EXPECT_EQ(spares.reused, 1u);
  for (uint32_t e = 0; e < kEngines; ++e) {
    EXPECT_TRUE(p0.SparseKeys(0, e).empty());
    EXPECT_EQ(p0.FindSparse(0, e, 5), KeyIndex::kAbsent) << "a key of clock 0";
  }
  EXPECT_EQ(p0.DenseSumIfAny(1), nullptr);
  for (ClockAggregate* agg : {&c1, &fresh}) {
    PushSums(*agg, 0, 5000, 1500, kEngines);
    PushSums(*agg, 1, 1500, 1500, kEngines);  // some of clock 0's keys again
  }
  EXPECT_EQ(spares.reused, 2u);
  EXPECT_TRUE(spares.parts.empty());
  EXPECT_EQ(spares.bytes, 0u);
  Combine(c1, kEngines);
  Combine(fresh, kEngines);
  for (uint32_t e = 0; e < kEngines; ++e) {
    // The union of clock 1 fits in clock 0's union's buffers: nothing was allocated.
    EXPECT_EQ(c1.sums().SparseSumsOf(0, e), buffers[e]) << "engine " << e;
    const auto keys = c1.sums().SparseKeys(0, e), want = fresh.sums().SparseKeys(0, e);
    ASSERT_EQ(std::vector<uint64_t>(keys.begin(), keys.end()),
              std::vector<uint64_t>(want.begin(), want.end()));
    EXPECT_EQ(std::memcmp(c1.sums().SparseSumsOf(0, e), fresh.sums().SparseSumsOf(0, e),
                          keys.size() * kDim * sizeof(float)),
              0)
        << "engine " << e;
  }
  ASSERT_NE(c1.sums().DenseSumIfAny(1), nullptr);
  EXPECT_EQ(std::memcmp(c1.sums().DenseSumIfAny(1), fresh.sums().DenseSumIfAny(1), 8 * 4), 0);
  // The pending limits count the sums as a fresh part holds them, though the reused one holds
  // more (clock 0's union): a push is refused or not whichever part it lands in.
  EXPECT_EQ(c1.SumBytes(), fresh.SumBytes());
  EXPECT_GT(c1.MemoryBytes(), c1.SumBytes());

  // Clock 2, of one worker, sums 20 keys in the part sized for clock 0's 3,000: it is freed,
  // not kept (its every reuse would clear an index 100 times larger than what it holds). The
  // other spare, not taken, stays.
  c1.Recycle();
  ASSERT_EQ(spares.parts.size(), 2u);
  const uint64_t other = spares.parts[0].MemoryBytes();
  {
    ClockAggregate c2(2, kEngines, &spares);
    PushSums(c2, 0, 9000, 20, kEngines);
    Combine(c2, kEngines);
    c2.Recycle();
    EXPECT_EQ(spares.parts.size(), 1u) << "the large part summing 20 keys was kept";
    EXPECT_EQ(spares.bytes, other);
  }

  // The bounds: one part at most; and no part over the bytes.
  for (const auto& [max_parts, max_bytes, kept] :
       {std::tuple<size_t, uint64_t, size_t>{1, 1ull << 30, 1}, {4, 64, 0}}) {
    SpareParts few;
    few.max_parts = max_parts;
    few.max_bytes = max_bytes;
    ClockAggregate agg(2, kEngines, &few);
    PushSums(agg, 0, 0, 500, kEngines);
    PushSums(agg, 1, 0, 500, kEngines);
    Combine(agg, kEngines);
    agg.Recycle();
    EXPECT_EQ(few.parts.size(), kept) << max_parts << " parts, " << max_bytes << " bytes";
    EXPECT_LE(few.bytes, max_bytes);
  }
}

// A real shard, two workers, six clocks of pushes of changing keys: the rows are what the
// formula gives for each clock's own sums, though every clock after the first sums into the
// buffers of the one before.
TEST(BspOrderTest, EachClockAppliesItsOwnSumsInTheBuffersOfTheClockBefore) {
  const std::string manifest =
      "cluster:\n  servers: [127.0.0.1:1]\n  workers: 2\n"
      "server:\n  engine_threads: 2\n"
      "training: {consistency: bsp}\n"
      "tables:\n"
      "  - {name: e, kind: sparse, dim: 4, optimizer: {kind: sgd, lr: 1.0}}\n";
  constexpr uint32_t kDim = 4, kWorkers = 2;
  constexpr int64_t kClocks = 6;
  std::vector<uint64_t> keys;
  for (uint64_t i = 0; i < 300; ++i) keys.push_back((i + 1) * 0x9E3779B97F4A7C15ull);
  testing::InProcessShard shard(manifest, "bsp-reuse");
  const uint64_t before = shard.Pull(0, 0, keys);
  ASSERT_TRUE(shard.Answered(before));
  std::vector<float> want(keys.size() * kDim);
  std::memcpy(want.data(), shard.Reply(before).data(), want.size() * sizeof(float));
  for (int64_t clock = 0; clock < kClocks; ++clock) {
    std::vector<std::vector<float>> sums(keys.size());
    for (uint32_t w = 0; w < kWorkers; ++w) {
      // Each clock and worker leaves out another third of the keys.
      std::vector<uint64_t> mine;
      for (size_t i = 0; i < keys.size(); ++i) {
        if ((i + clock + w) % 3 == 0) continue;
        mine.push_back(keys[i]);
        // What InProcessShard::Push sends, summed in rank order from 0.
        if (sums[i].empty()) sums[i].assign(kDim, 0.0f);
        const float scale = static_cast<float>((clock + 1) * (w + 1));
        for (uint32_t d = 0; d < kDim; ++d) {
          sums[i][d] += scale * 0.01f * static_cast<float>(keys[i] % 13 + d);
        }
      }
      EXPECT_TRUE(shard.Answered(shard.Push(0, clock, mine, w, static_cast<float>((clock + 1) *
                                                                                  (w + 1)))));
    }
    for (uint32_t w = 0; w < kWorkers; ++w) EXPECT_TRUE(shard.Answered(shard.Tick(clock + 1, w)));
    // SGD at lr 1 on the average over the two workers (Optimizer::Apply's arithmetic).
    for (size_t i = 0; i < keys.size(); ++i) {
      if (sums[i].empty()) continue;
      for (uint32_t d = 0; d < kDim; ++d) {
        float& v = want[i * kDim + d];
        const double g = static_cast<double>(sums[i][d]) * (1.0 / kWorkers) + 0.0 * v;
        v = static_cast<float>(v - 1.0 * g);
      }
    }
  }
  EXPECT_EQ(shard.Stat("bsp_clocks_applied"), static_cast<uint64_t>(kClocks));
  // Both parts of each clock after the first took the buffers of the clock before.
  EXPECT_EQ(shard.Stat("bsp_sum_parts_reused"), static_cast<uint64_t>((kClocks - 1) * kWorkers));
  const uint64_t after = shard.Pull(0, kClocks, keys);
  ASSERT_TRUE(shard.Answered(after));
  ASSERT_EQ(shard.Reply(after).size(), want.size() * sizeof(float));
  std::vector<float> got(want.size());
  std::memcpy(got.data(), shard.Reply(after).data(), got.size() * sizeof(float));
  for (size_t j = 0; j < got.size(); ++j) {
    uint32_t a, b;
    std::memcpy(&a, &got[j], 4);
    std::memcpy(&b, &want[j], 4);
    ASSERT_EQ(a, b) << "key " << j / kDim << " element " << j % kDim << ": " << got[j]
                    << " against " << want[j];
  }
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
