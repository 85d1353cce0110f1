#include "common/membership.hpp"

#include <gtest/gtest.h>

#include <cstdio>
#include <limits>
#include <random>
#include <vector>
#include "tests/support/test_seed.hpp"

namespace parasol {
namespace {

TEST(MembershipTest, RanksArePresentFromTheirJoinToBeforeTheirLeave) {
  Membership m(2, 4);
  EXPECT_EQ(m.version(), 0u);
  EXPECT_TRUE(m.Present(1, 0));
  EXPECT_FALSE(m.Joined(2));
  ASSERT_TRUE(m.SetJoin(2, 5).ok());
  ASSERT_TRUE(m.SetLeave(0, 8).ok());
  EXPECT_EQ(m.version(), 2u);
  EXPECT_EQ(m.CountAt(4), 2u);
  EXPECT_EQ(m.CountAt(5), 3u);
  EXPECT_EQ(m.CountAt(8), 2u);
  EXPECT_EQ(m.IndexAt(2, 5), 2);
  EXPECT_EQ(m.IndexAt(2, 8), 1);
  EXPECT_EQ(m.IndexAt(0, 8), -1);
  EXPECT_EQ(m.ChangeClocks(), (std::vector<int64_t>{5, 8}));
  // Named clocks never change; a leave comes after the join; ranks stay in range.
  EXPECT_TRUE(m.SetJoin(2, 5).ok());
  EXPECT_FALSE(m.SetJoin(2, 6).ok());
  EXPECT_FALSE(m.SetLeave(2, 5).ok());
  EXPECT_FALSE(m.SetJoin(4, 1).ok());
  EXPECT_FALSE(m.SetJoin(3, kMaxMemberClock + 1).ok());
  EXPECT_EQ(m.version(), 2u);
}

TEST(MembershipTest, MergeTakesWhatIsNewAndRefusesAContradictionWhole) {
  Membership a(2, 4), b(2, 4);
  ASSERT_TRUE(a.SetJoin(3, 10).ok());
  ASSERT_TRUE(a.SetLeave(1, 12).ok());
  int64_t changed = 0;
  ASSERT_TRUE(b.Merge(a.Entries(), &changed).ok());
  EXPECT_EQ(changed, 10);
  EXPECT_EQ(b, a);
  ASSERT_TRUE(b.Merge(a.Entries(), &changed).ok());  // again: nothing new
  EXPECT_EQ(changed, std::numeric_limits<int64_t>::max());
  // One good entry and one contradicting entry: nothing is taken.
  Membership c(2, 4);
  const std::vector<MemberEntry> mixed = {{2, 7, -1}, {3, 11, -1}};
  ASSERT_TRUE(c.Merge(std::vector<MemberEntry>{{3, 10, -1}}).ok());
  EXPECT_FALSE(c.Merge(mixed).ok());
  EXPECT_FALSE(c.Joined(2));
  // Out of range, an initial rank joining later, a leave before the join.
  EXPECT_FALSE(c.Merge(std::vector<MemberEntry>{{9, 1, -1}}).ok());
  EXPECT_FALSE(c.Merge(std::vector<MemberEntry>{{0, 3, -1}}).ok());
  EXPECT_FALSE(c.Merge(std::vector<MemberEntry>{{2, 7, 7}}).ok());
  EXPECT_FALSE(c.Merge(std::vector<MemberEntry>{{2, -5, -1}}).ok());
  EXPECT_EQ(c.version(), 1u);
}

TEST(MembershipTest, WithoutChangesEachRankTakesTheLinesOfItsRankModuloTheWorkers) {
  const Membership m(3, 3);
  for (int64_t step = 0; step < 50; ++step) {
    for (uint32_t r = 0; r < 3; ++r) {
      const StepChunk c = ChunkOf(m, r, step, 8);
      ASSERT_EQ(c.ranks, 3u);
      for (uint32_t j = 0; j < 8; ++j) {
        const uint64_t line = c.first + c.index + uint64_t{j} * c.ranks;
        EXPECT_EQ(line % 3, r);
        EXPECT_EQ(line / 3, uint64_t(step) * 8 + j);
      }
    }
  }
}

// Random schedules of joins and leaves: the ranks present at each clock take every line of
// the stream once, in order, with nothing skipped.
TEST(MembershipTest, EveryScheduleCoversEveryLineOnce) {
  const uint64_t seed = testing::TestSeed();
  std::mt19937_64 rng(seed);
  for (int trial = 0; trial < 50; ++trial) {
    Membership m(2, 6);
    int64_t clock = 0;
    for (uint32_t w = 2; w < 6; ++w) {
      clock += std::uniform_int_distribution<int64_t>(1, 20)(rng);
      ASSERT_TRUE(m.SetJoin(w, clock).ok());
      if (rng() % 2) {
        ASSERT_TRUE(m.SetLeave(w - 2, clock + std::uniform_int_distribution<int64_t>(1, 30)(rng))
                        .ok());
      }
    }
    const uint32_t batch = 1 + rng() % 7;
    uint64_t next = 0;
    for (int64_t step = 0; step < 150; ++step) {
      std::vector<uint64_t> lines;
      const uint32_t n = m.CountAt(step);
      for (uint32_t r = 0; r < 6; ++r) {
        const StepChunk c = ChunkOf(m, r, step, batch);
        ASSERT_EQ(c.ranks, n);
        ASSERT_EQ(c.first, next);
        if (c.index < 0) continue;
        for (uint32_t j = 0; j < batch; ++j) lines.push_back(c.first + c.index + uint64_t{j} * n);
      }
      std::sort(lines.begin(), lines.end());
      ASSERT_EQ(lines.size(), uint64_t{n} * batch);
      for (uint64_t l : lines) ASSERT_EQ(l, next++) << "step " << step << ", trial " << trial;
    }
  }
}

TEST(MembershipTest, FirstNewClockIsTheEarliestClockNamedSince) {
  Membership before(2, 4);
  Membership after = before;
  EXPECT_EQ(FirstNewClock(before, after), std::numeric_limits<int64_t>::max());
  ASSERT_TRUE(after.SetJoin(3, 20).ok());
  ASSERT_TRUE(after.SetLeave(0, 15).ok());
  EXPECT_EQ(FirstNewClock(before, after), 15);
}

}  // namespace
}  // namespace parasol
