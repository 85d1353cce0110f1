// Shard 0 names a leave at the clock a membership request asks for (its earliest clock), or at
// the next one it can name if that is later, and refuses one past the clocks the other shards
// would take from a worker's copy, naming nothing then. Driven in process through
// ShardServer::HandleMessage.
#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>

#include "common/protocol.hpp"
#include "server/checkpoint.hpp"
#include "tests/support/in_process_shard.hpp"
#include "tests/support/temp_dir.hpp"

namespace parasol {
namespace {

class ShardZero : public testing::InProcessShard {
 public:
  // `checkpoints`: the manifest's checkpoint section ("" for none).
  explicit ShardZero(const std::string& checkpoints = "")
      : InProcessShard("cluster:\n  servers: [127.0.0.1:1]\n  workers: 3\n  max_workers: 4\n"
                       "training: {consistency: bsp}\n" + checkpoints +
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

class NamedClockTest : public testing::TempDirTest {
 protected:
  std::string Checkpoints() const { return "checkpoint: {dir: " + dir_ + ", keep: 100}\n"; }
  // The leave clock shard `s`'s membership names for worker `w` (-1: none), as a worker that
  // knows nothing of it learns from a plain membership request.
  static int64_t LeaveOf(ShardZero& s, uint32_t w) {
    const Header h = s.Request(Op::Membership, 0, 0);
    s.Send(h);
    const Header reply = s.ReplyHeader(h.request_id);
    EXPECT_EQ(reply.status, StatusCode::kOk) << reply.message;
    for (const MemberEntry& e : reply.members) {
      if (e.worker == w) return e.leave;
    }
    return -1;
  }
};

// A named leave is kept before it is answered, in a file of a few hundred bytes, not a whole
// checkpoint (at 10^8 rows one stopped shard 0 for a minute); a restart of shard 0 from the
// checkpoint before it still knows the clock it named. Without the file, it does not.
TEST_F(NamedClockTest, ANamedClockIsKeptWithoutACheckpointAndARestartStillKnowsIt) {
  {
    ShardZero shard(Checkpoints());
    ASSERT_TRUE(shard.Restore().ok());
    ASSERT_TRUE(shard.Checkpoint("before the leave").ok());
    Header asked = shard.AskToLeave(2, 5);
    ASSERT_EQ(asked.status, StatusCode::kOk) << asked.message;
    EXPECT_EQ(MembershipClock(asked), 5);
    EXPECT_EQ(ListCheckpoints(dir_, 0).size(), 1u) << "the leave was kept by a checkpoint";
    EXPECT_TRUE(std::filesystem::exists(dir_ + "/shard-0/named"));
  }
  {
    ShardZero restarted(Checkpoints());
    ASSERT_TRUE(restarted.Restore().ok());
    EXPECT_EQ(LeaveOf(restarted, 2), 5);
  }
  // Damaged, the file stops the start with an error naming it (skipping it could name one of
  // its clocks again differently).
  const std::string named = dir_ + "/shard-0/named";
  {
    std::ofstream(named, std::ios::app) << "3 9 -1\n";
    ShardZero damaged(Checkpoints());
    const Status st = damaged.Restore();
    ASSERT_FALSE(st.ok());
    EXPECT_NE(st.message().find(named), std::string::npos) << st.ToString();
    EXPECT_NE(st.message().find("damaged"), std::string::npos) << st.ToString();
  }
  std::filesystem::remove(named);
  ShardZero forgetful(Checkpoints());
  ASSERT_TRUE(forgetful.Restore().ok());
  EXPECT_EQ(LeaveOf(forgetful, 2), -1);
}

// A worker that leaves the running job is done at its leave clock: its done tick is answered
// at once, with no checkpoint written first, and the checkpoint that holds the done (the one
// it waits for before it exits: Departure::SettleLog) is begun after that reply, in the
// background, with a count past the one the reply carried.
TEST_F(NamedClockTest, ALeaversDoneIsAnsweredAtOnceAndACheckpointPastItsCountFollows) {
  ShardZero shard(Checkpoints());
  shard.set_expect_ok(true);
  ASSERT_TRUE(shard.Restore().ok());
  Header asked = shard.AskToLeave(2, 2);
  ASSERT_EQ(asked.status, StatusCode::kOk) << asked.message;
  ASSERT_EQ(MembershipClock(asked), 2);
  for (int64_t c = 0; c < 2; ++c) {
    for (uint32_t w = 0; w < 3; ++w) {
      ASSERT_TRUE(shard.Answered(shard.Push(0, c, {1, 2, 3}, w)));
      ASSERT_TRUE(shard.Answered(shard.Tick(c + 1, w)));
    }
  }
  Header done = shard.Request(Op::Clock, 2, 2);
  done.done = true;
  shard.Send(done);
  ASSERT_TRUE(shard.Answered(done.request_id));
  const Header reply = shard.ReplyHeader(done.request_id);
  ASSERT_EQ(reply.status, StatusCode::kOk) << reply.message;
  EXPECT_TRUE(ListCheckpoints(dir_, 0).empty()) << "written before the done was answered";
  const uint64_t past = std::max(reply.checkpoint_count, reply.checkpoints_begun);
  uint64_t count = 0;
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (count <= past && std::chrono::steady_clock::now() < until) {
    shard.Periodic();
    const uint64_t id = shard.Stats();
    count = shard.ReplyHeader(id).checkpoint_count;
    if (count <= past) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  ASSERT_GT(count, past) << "no checkpoint after the done within 60 s";
  ASSERT_EQ(ListCheckpoints(dir_, 0).size(), 1u);
  // It holds worker 2 as done: a restart from it waits for no tick of worker 2.
  Result<CheckpointHeader> h = ReadCheckpointHeader(ListCheckpoints(dir_, 0)[0]);
  ASSERT_TRUE(h.ok()) << h.status().ToString();
  EXPECT_GE(h->clock, 2);
}

}  // namespace
}  // namespace parasol
