#include "common/placement.hpp"

#include <gtest/gtest.h>

#include <cstdio>
#include <random>
#include <vector>

#include "common/membership.hpp"
#include "common/sharding.hpp"
#include "tests/support/test_seed.hpp"

namespace parasol {
namespace {

// Keys drawn from a printed seed (sequential keys would hash alike anyway; drawn ones also
// reach the ends of the hash space).
std::vector<uint64_t> DrawKeys(size_t n, uint64_t* seed_out) {
  const uint64_t seed = testing::TestSeed();
  *seed_out = seed;
  std::mt19937_64 rng(seed);
  std::vector<uint64_t> keys(n);
  for (auto& k : keys) k = rng();
  keys[0] = 0;
  keys[1] = ~uint64_t{0};
  return keys;
}

TEST(PlacementTest, TheFirstPlacementIsShardOfKeys) {
  uint64_t seed = 0;
  const std::vector<uint64_t> keys = DrawKeys(200000, &seed);
  for (uint32_t n = 1; n <= 9; ++n) {
    const Placement p(n);
    EXPECT_TRUE(p.uniform());
    EXPECT_EQ(p.ranges(), n);
    for (uint64_t k : keys) {
      const uint32_t s = ShardOfKey(k, n);
      ASSERT_EQ(p.ShardOfHash(HashKey(k, kShardSalt)), s) << "key " << k << " of " << n << ", seed " << seed;
      ASSERT_EQ(p.ShardOf(k), s);
    }
    // The boundaries themselves: the first hash of each range is its shard's, the one before
    // it the previous shard's.
    for (uint32_t r = 1; r < n; ++r) {
      EXPECT_EQ(ReduceRange(p.begin(r), n), r);
      EXPECT_EQ(ReduceRange(p.begin(r) - 1, n), r - 1);
    }
  }
}

TEST(PlacementTest, GrowingMovesAboutOneInNPlusOneKeysAllToTheNewShard) {
  uint64_t seed = 0;
  const std::vector<uint64_t> keys = DrawKeys(300000, &seed);
  Placement p(2);
  for (uint32_t n = 2; n < 8; ++n) {
    const Placement q = p.Grown();
    ASSERT_EQ(q.count(), n + 1);
    EXPECT_FALSE(q.uniform());
    uint64_t moved = 0;
    std::vector<uint64_t> per(n + 1, 0);
    for (uint64_t k : keys) {
      const uint32_t a = p.ShardOf(k), b = q.ShardOf(k);
      ++per[b];
      if (a == b) continue;
      ++moved;
      ASSERT_EQ(b, n) << "key " << k << " moved from shard " << a << " to " << b << ", seed " << seed;
    }
    const double share = static_cast<double>(moved) / keys.size();
    EXPECT_NEAR(share, 1.0 / (n + 1), 0.01) << n << " -> " << n + 1 << ", seed " << seed;
    EXPECT_NEAR(q.Share(n), 1.0 / (n + 1), 1e-9);
    // Every shard holds about its share.
    for (uint32_t s = 0; s <= n; ++s) {
      EXPECT_NEAR(static_cast<double>(per[s]) / keys.size(), 1.0 / (n + 1), 0.01) << "shard " << s;
    }
    p = q;
  }
}

TEST(PlacementTest, ShrinkingMovesOnlyTheRemovedShardsKeysAndSpreadsThem) {
  uint64_t seed = 0;
  const std::vector<uint64_t> keys = DrawKeys(300000, &seed);
  for (const Placement& start : {Placement(5), Placement(3).Grown().Grown()}) {
    Placement p = start;
    for (uint32_t n = p.count(); n > 1; --n) {
      const Placement q = p.Shrunk();
      ASSERT_EQ(q.count(), n - 1);
      std::vector<uint64_t> got(n - 1, 0);
      uint64_t moved = 0;
      for (uint64_t k : keys) {
        const uint32_t a = p.ShardOf(k), b = q.ShardOf(k);
        ASSERT_LT(b, n - 1);
        if (a == b) continue;
        ASSERT_EQ(a, n - 1) << "key " << k << " of shard " << a << " moved, seed " << seed;
        ++moved;
        ++got[b];
      }
      // Each remaining shard takes about an equal part of what the removed one held.
      for (uint32_t s = 0; s + 1 < n; ++s) {
        EXPECT_NEAR(static_cast<double>(got[s]) / std::max<uint64_t>(moved, 1), 1.0 / (n - 1), 0.02);
      }
      double total = 0;
      for (uint32_t s = 0; s + 1 < n; ++s) total += q.Share(s);
      EXPECT_NEAR(total, 1.0, 1e-9);
      for (size_t i = 1; i < q.ranges(); ++i) {
        EXPECT_LT(q.begin(i - 1), q.begin(i));
        EXPECT_NE(q.shard(i - 1), q.shard(i));  // adjacent ranges of one shard are merged
      }
      p = q;
    }
    EXPECT_EQ(p.ranges(), 1u);
  }
}

TEST(PlacementTest, ResizedIsTheSameStepsAndRangesStayFewAcrossManyChanges) {
  const Placement p = Placement(2).Resized(4).Resized(3);
  EXPECT_EQ(p, Placement(2).Grown().Grown().Shrunk());
  // 2 -> 3 -> 2, 32 times (the most changes a job may name): each change adds at most as many
  // ranges as it has shards.
  Placement q(2);
  for (int i = 0; i < 32; ++i) {
    q = q.Grown();
    EXPECT_LE(q.ranges(), 2u + 3u * (2 * i + 1)) << "grow " << i;
    q = q.Shrunk();
    EXPECT_LE(q.ranges(), 2u + 3u * (2 * i + 2)) << "shrink " << i;
  }
  double total = 0;
  for (uint32_t s = 0; s < 2; ++s) {
    EXPECT_NEAR(q.Share(s), 0.5, 1e-9);
    total += q.Share(s);
  }
  EXPECT_NEAR(total, 1.0, 1e-12);
  // A jump from 4 to 64 shards: at most 4 + 5 + ... + 63 new ranges.
  const Placement wide = Placement(4).Resized(64);
  EXPECT_LE(wide.ranges(), 64u * 65u / 2u);
  for (uint32_t s = 0; s < 64; ++s) EXPECT_NEAR(wide.Share(s), 1.0 / 64, 1e-9);
}

TEST(MembershipTest, ShardCountChangesAreNamedInOrderAndMergeLikeTheRest) {
  Membership m(2, 2, /*servers=*/2, /*listed=*/3);
  EXPECT_EQ(m.LastPlacement().count(), 2u);
  EXPECT_FALSE(m.SetServers(10, 2).ok());  // no change
  EXPECT_FALSE(m.SetServers(10, 4).ok());  // beyond the listed shards
  EXPECT_FALSE(m.SetServers(0, 3).ok());   // clock 0 is the start
  ASSERT_TRUE(m.SetServers(10, 3).ok());
  EXPECT_TRUE(m.SetServers(10, 3).ok());   // named again: the same
  EXPECT_FALSE(m.SetServers(10, 1).ok());  // a named clock never changes
  EXPECT_FALSE(m.SetServers(9, 1).ok());   // changes come in clock order
  ASSERT_TRUE(m.SetServers(20, 1).ok());
  EXPECT_EQ(m.version(), 2u);
  EXPECT_EQ(m.PlacementAt(9).count(), 2u);
  EXPECT_EQ(m.PlacementAt(10).count(), 3u);
  EXPECT_EQ(m.PlacementAt(19), Placement(2).Grown());
  EXPECT_EQ(m.PlacementAt(20), Placement(2).Grown().Shrunk().Shrunk());
  // Shard 2 serves from clock 10 to 20; shard 1 from the start to 20; shard 0 throughout.
  EXPECT_EQ(m.ServingFrom(2), 10);
  EXPECT_EQ(m.RemovedAt(2), 20);
  EXPECT_EQ(m.ServingFrom(1), 0);
  EXPECT_EQ(m.RemovedAt(1), 20);
  EXPECT_EQ(m.ServingFrom(0), 0);
  EXPECT_EQ(m.RemovedAt(0), -1);
  // The worker ranks' data split ignores them.
  EXPECT_TRUE(m.ChangeClocks().empty());

  // A copy learns them from the entries; a contradicting copy is refused whole.
  Membership copy(2, 2, 2, 3);
  int64_t changed = 0;
  ASSERT_TRUE(copy.Merge(m.Entries(), &changed).ok());
  EXPECT_EQ(changed, 10);
  EXPECT_EQ(copy, m);
  Membership other(2, 2, 2, 3);
  ASSERT_TRUE(other.SetServers(10, 1).ok());
  EXPECT_FALSE(other.Merge(m.Entries()).ok());
  EXPECT_EQ(other.server_changes().size(), 1u);
  // A count beyond the listed shards, or a change with a leave clock, is refused.
  Membership fresh(2, 2, 2, 3);
  EXPECT_FALSE(fresh.Merge(std::vector<MemberEntry>{{kServerEntry | 4, 5, -1}}).ok());
  EXPECT_FALSE(fresh.Merge(std::vector<MemberEntry>{{kServerEntry | 3, 5, 7}}).ok());
  EXPECT_EQ(fresh.version(), 0u);
}

}  // namespace
}  // namespace parasol
