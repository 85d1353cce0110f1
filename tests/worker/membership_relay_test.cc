// A worker's copy of the membership and what it carries between shards
// (worker/membership_relay.hpp).
#include "worker/membership_relay.hpp"

#include <gtest/gtest.h>

#include <vector>

namespace parasol {
namespace {

// A reply of `shard` naming `entries` (with `macs_per_entry` bytes of MACs each, 0: none) at
// membership version `version`.
Header Reply(uint32_t shard, std::vector<MemberEntry> entries, uint64_t version,
             size_t macs_per_entry = 0) {
  Header h;
  h.op = Op::Clock;
  h.shard_rank = shard;
  h.members = std::move(entries);
  h.membership_version = version;
  for (size_t i = 0; i < h.members.size() * macs_per_entry; ++i) {
    h.member_macs.push_back(static_cast<uint8_t>(i + 1));
  }
  return h;
}

Header Request(Op op) {
  Header h;
  h.op = op;
  return h;
}

// 2 ranks of at most 4, 3 shards. Worker 2 joins at clock 5 (one entry: version 1).
class MembershipRelayTest : public ::testing::Test {
 protected:
  MembershipRelay relay_{Membership(2, 4, 3, 3), 3, 0};
  const std::vector<MemberEntry> join_ = {MemberEntry{2, 5, -1}};
};

// Learned from shard 0, handed on to the shards that know less, on the requests that carry it,
// and to none once each has said it knows it.
TEST_F(MembershipRelayTest, WhatOneShardSaysTravelsToTheOthersThatKnowLess) {
  relay_.Note(0, Reply(0, join_, 1));
  ASSERT_TRUE(relay_.failure().ok());
  EXPECT_EQ(relay_.membership().join(2), 5);
  EXPECT_EQ(relay_.membership().version(), 1u);

  Header tick = Request(Op::Clock);
  relay_.Stamp(1, /*carries=*/true, /*job_rank=*/true, tick);
  EXPECT_EQ(tick.members, join_);
  EXPECT_EQ(tick.membership_version, 1u);
  EXPECT_TRUE(tick.member_macs.empty());  // shard 0 signs nothing here

  Header push = Request(Op::PushSparse);
  relay_.Stamp(1, /*carries=*/false, true, push);
  EXPECT_TRUE(push.members.empty());

  Header to_zero = Request(Op::Clock);
  relay_.Stamp(0, true, true, to_zero);
  EXPECT_TRUE(to_zero.members.empty());  // shard 0 said it knows version 1

  relay_.Note(1, Reply(1, {}, 1));  // shard 1 now knows it
  Header again = Request(Op::Clock);
  relay_.Stamp(1, true, true, again);
  EXPECT_TRUE(again.members.empty());
  // A shard restarted from an older checkpoint knows less again: its next tick carries it.
  relay_.Note(1, Reply(1, {}, 0));
  Header after_restart = Request(Op::Clock);
  relay_.Stamp(1, true, true, after_restart);
  EXPECT_EQ(after_restart.members, join_);
}

// Shard 0's MACs travel with their entries. An entry learned from another shard has none: a
// tick or Hello to shard 0 then says it knows nothing, so that shard 0 answers with every entry
// and its MACs.
TEST_F(MembershipRelayTest, ShardZerosMacsTravelWithTheirEntries) {
  relay_.Note(0, Reply(0, join_, 1, 16));
  Header tick = Request(Op::Clock);
  relay_.Stamp(2, true, true, tick);
  ASSERT_EQ(tick.member_macs.size(), 16u);
  EXPECT_EQ(tick.member_macs[0], 1);
  EXPECT_TRUE(relay_.AllSigned(relay_.membership().Entries()));

  // Worker 3 joins at clock 9, learned from shard 2 without MACs.
  relay_.Note(2, Reply(2, {MemberEntry{2, 5, -1}, MemberEntry{3, 9, -1}}, 2));
  ASSERT_EQ(relay_.membership().version(), 2u);
  EXPECT_FALSE(relay_.AllSigned(relay_.membership().Entries()));
  const std::vector<uint8_t> macs = relay_.MacsOf(relay_.membership().Entries());
  ASSERT_EQ(macs.size(), 32u);  // the one held, then zeros
  EXPECT_EQ(macs[0], 1);
  EXPECT_EQ(macs[16], 0);
  Header hello = Request(Op::Hello);
  relay_.Stamp(0, true, true, hello);
  EXPECT_EQ(hello.membership_version, 0u);
  // A tool (not a rank of the job) asks nothing of shard 0.
  Header tool = Request(Op::Clock);
  relay_.Stamp(0, true, /*job_rank=*/false, tool);
  EXPECT_EQ(tool.membership_version, 2u);
}

// Two copies that disagree on a named clock: the failure is kept (the first one), and the
// copy keeps what it had.
TEST_F(MembershipRelayTest, AContradictionIsAStickyFailure) {
  relay_.Note(0, Reply(0, join_, 1));
  relay_.Note(1, Reply(1, {MemberEntry{2, 6, -1}}, 1));
  ASSERT_FALSE(relay_.failure().ok());
  EXPECT_NE(relay_.failure().ToString().find("worker 0: shard 1 sent a membership that "
                                             "contradicts this worker's"),
            std::string::npos)
      << relay_.failure().ToString();
  EXPECT_EQ(relay_.membership().join(2), 5);
  const std::string first = relay_.failure().ToString();
  relay_.Note(2, Reply(2, {MemberEntry{2, 7, -1}}, 1));
  EXPECT_EQ(relay_.failure().ToString(), first);
}

}  // namespace
}  // namespace parasol
