// Shard 0 names a leave at the clock a membership request asks for (its earliest clock), or at
// the next one it can name if that is later, and refuses one past the clocks the other shards
// would take from a worker's copy, naming nothing then. Driven in process through
// ShardServer::HandleMessage.
#include <gtest/gtest.h>

#include <string>

#include "common/protocol.hpp"
#include "tests/support/in_process_shard.hpp"

namespace parasol {
namespace {

class ShardZero : public testing::InProcessShard {
 public:
  ShardZero()
      : InProcessShard("cluster:\n  servers: [127.0.0.1:1]\n  workers: 3\n  max_workers: 4\n"
                       "training: {consistency: bsp}\n"
                       "tables:\n  - {name: e, kind: sparse, dim: 4}\n",
                       "membership-clock") {
    set_expect_ok(false);
  }
  // Worker `w` asks to leave, not before `not_before`; the reply's header.
  Header AskToLeave(uint32_t w, int64_t not_before) {
    Header h = Request(Op::Membership, 0, w);
    h.done = true;  // MembershipAsksToLeave
    SetMembershipNotBefore(h, not_before);
    Send(h);
    EXPECT_TRUE(Answered(h.request_id));
    return ReplyHeader(h.request_id);
  }
};

TEST(MembershipClockTest, ALeaveIsNamedAtTheClockAskedForWithinReachAndNeverBeyond) {
  ShardZero shard;
  // Every worker at clock 0: the next clock shard 0 can name is 2, and it names none past 7
  // (8 clocks past the newest and the prefetch depth, 1, less 2 for shards whose newest clock
  // is behind).
  Header asked = shard.AskToLeave(2, 5);
  ASSERT_EQ(asked.status, StatusCode::kOk) << asked.message;
  EXPECT_EQ(MembershipClock(asked), 5);
  Header early = shard.AskToLeave(1, 0);  // earlier than it can name: the next it can
  ASSERT_EQ(early.status, StatusCode::kOk) << early.message;
  EXPECT_EQ(MembershipClock(early), 2);
  Header far = shard.AskToLeave(0, 8);
  EXPECT_EQ(far.status, StatusCode::kInvalidArgument) << "named at " << MembershipClock(far);
  EXPECT_NE(far.message.find("clock 8 is further ahead"), std::string::npos) << far.message;
  EXPECT_NE(far.message.find("at most 7"), std::string::npos) << far.message;
  // Refused, it named nothing: asked again within reach, worker 0 leaves there.
  Header again = shard.AskToLeave(0, 7);
  ASSERT_EQ(again.status, StatusCode::kOk) << again.message;
  EXPECT_EQ(MembershipClock(again), 7);
}

}  // namespace
}  // namespace parasol
