#include "common/membership_macs.hpp"

#include <gtest/gtest.h>

#include "common/curve_keys.hpp"
#include "tests/support/temp_dir.hpp"

namespace parasol {
namespace {

using MembershipMacsTest = testing::TempDirTest;

TEST_F(MembershipMacsTest, OnlyShardZerosMacsForThisShardVerify) {
  if (!CurveAvailable()) GTEST_SKIP() << "this libzmq has no CURVE support";
  SecurityOptions sec;
  sec.curve = true;
  for (const char* name : {"s0", "s1", "s2", "w0"}) {
    auto k = GenerateCurveKeyPair();
    ASSERT_TRUE(k.ok());
    ASSERT_TRUE(WriteCurveKeyPair(dir_, name, *k).ok());
  }
  sec.server_keys = {dir_ + "/s0", dir_ + "/s1", dir_ + "/s2"};
  sec.worker_keys = {dir_ + "/w0"};
  auto zero = MembershipMacs::ForShard(sec, 0, 3, 42);
  auto one = MembershipMacs::ForShard(sec, 1, 3, 42);
  auto two = MembershipMacs::ForShard(sec, 2, 3, 42);
  auto other_job = MembershipMacs::ForShard(sec, 1, 3, 43);
  ASSERT_TRUE(zero.ok() && one.ok() && two.ok() && other_job.ok()) << zero.status().ToString();
  const std::vector<MemberEntry> entries = {{2, 5, -1}, {0, -1, 9}};
  const std::vector<uint8_t> macs = zero->Sign(entries);
  ASSERT_EQ(macs.size(), 2u * 3 * MembershipMacs::kMacBytes);
  for (const auto* m : {&*zero, &*one, &*two}) {
    EXPECT_TRUE(m->Verify(entries[0], 0, macs));
    EXPECT_TRUE(m->Verify(entries[1], 1, macs));
    EXPECT_FALSE(m->Verify(entries[1], 0, macs));        // another entry's MAC
    EXPECT_FALSE(m->Verify({0, -1, 8}, 1, macs));        // another clock
    EXPECT_FALSE(m->Verify(entries[0], 0, {}));          // none
    EXPECT_FALSE(m->Verify(entries[0], 2, macs));        // out of range
  }
  EXPECT_FALSE(other_job->Verify(entries[0], 0, macs));  // another job's fingerprint
  EXPECT_TRUE(one->Sign(entries).empty());               // only shard 0 signs
  // Shard 1's MAC is not shard 2's: a MAC for one shard does not pass at another.
  std::vector<uint8_t> moved = macs;
  std::copy(macs.begin() + MembershipMacs::kMacBytes, macs.begin() + 2 * MembershipMacs::kMacBytes,
            moved.begin() + 2 * MembershipMacs::kMacBytes);
  EXPECT_FALSE(two->Verify(entries[0], 0, moved));
  // Off without worker keys.
  sec.worker_keys.clear();
  auto off = MembershipMacs::ForShard(sec, 1, 3, 42);
  ASSERT_TRUE(off.ok());
  EXPECT_FALSE(off->enabled());
  EXPECT_TRUE(off->Verify(entries[0], 0, {}));
}

}  // namespace
}  // namespace parasol
