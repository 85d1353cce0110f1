#include "common/sharding.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

namespace parasol {
namespace {

TEST(ShardingTest, KeysSpreadEvenlyOverTwoToSixteenShards) {
  constexpr uint64_t kKeys = 1000000;
  for (uint32_t shards = 2; shards <= 16; ++shards) {
    std::vector<uint64_t> count(shards, 0);
    // Sequential ids: the worst case for a weak hash.
    for (uint64_t k = 0; k < kKeys; ++k) ++count[ShardOfKey(k, shards)];
    const double even = static_cast<double>(kKeys) / shards;
    for (uint32_t s = 0; s < shards; ++s) {
      EXPECT_LT(std::abs(count[s] - even) / even, 0.02)
          << "shard " << s << " of " << shards << " holds " << count[s];
    }
  }
}

TEST(ShardingTest, PlacementIsStable) {
  // Golden values: placement must never change between builds or hosts, or a restarted job
  // would look for its rows on the wrong shard.
  std::vector<uint32_t> shard, engine;
  for (uint64_t k = 0; k < 8; ++k) shard.push_back(ShardOfKey(k * 1000003, 8));
  for (uint64_t k = 0; k < 8; ++k) engine.push_back(EngineOfKey(k * 1000003, 4));
  EXPECT_EQ(shard, (std::vector<uint32_t>{4, 4, 1, 5, 1, 5, 6, 3}));
  EXPECT_EQ(engine, (std::vector<uint32_t>{1, 1, 2, 0, 1, 2, 3, 1}));
  EXPECT_EQ(ShardOfKey(12345, 1), 0u);
}

TEST(ShardingTest, EngineOwnershipIsIndependentOfShardPlacement) {
  // Keys of one shard must still spread over that shard's engines.
  std::vector<uint64_t> per_engine(4, 0);
  for (uint64_t k = 0; k < 400000; ++k) {
    if (ShardOfKey(k, 4) == 2) ++per_engine[EngineOfKey(k, 4)];
  }
  const double even = 100000.0 / 4;
  for (uint64_t n : per_engine) EXPECT_LT(std::abs(n - even) / even, 0.03) << n;
}

TEST(ShardingTest, DenseSlicesAreContiguousAndCoverTheTensor) {
  for (uint64_t total : {0ull, 1ull, 7ull, 1000ull, 1000003ull}) {
    for (uint32_t shards = 1; shards <= 9; ++shards) {
      const auto slices = DenseSlices(total, shards);
      uint64_t next = 0;
      for (const SliceRange& s : slices) {
        EXPECT_EQ(s.begin, next);
        EXPECT_LE(s.size(), total / shards + 1);
        EXPECT_GE(s.size(), total / shards);
        next = s.end;
      }
      EXPECT_EQ(next, total);
    }
  }
}

}  // namespace
}  // namespace parasol
