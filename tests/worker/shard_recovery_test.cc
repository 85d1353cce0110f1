// A worker's shard recovery state (worker/shard_recovery.hpp), reply by reply, without a socket:
// restarts found from the epochs, the push log trimmed by checkpoint counts, and a restart from
// an older checkpoint than the log was trimmed by reported as lost updates.
#include "worker/shard_recovery.hpp"

#include <gtest/gtest.h>

#include <vector>

namespace parasol {
namespace {

// `restored`: the restored checkpoint's sequence, and the count it holds every acknowledged
// push before unless `complete` says another (one taken while a replay was owed).
Header Reply(uint64_t epoch, uint64_t count, uint64_t restored = 0, int64_t ckpt_clock = -1,
             int64_t complete = -1, uint64_t writer = 0) {
  Header h;
  h.is_reply = true;
  h.server_epoch = epoch;
  h.checkpoint_count = count;
  h.checkpoints_begun = count;
  h.restored_sequence = restored;
  h.restored_count = complete < 0 ? restored : static_cast<uint64_t>(complete);
  h.restored_writer = writer;
  h.checkpoint_clock = ckpt_clock;
  return h;
}

// A push's frames (an lvalue: LogPush takes them only when it logs).
struct Frames {
  explicit Frames(size_t bytes) { f.emplace_back(bytes); }
  operator std::vector<zmq::message_t>&() { return f; }
  std::vector<zmq::message_t> f;
};

TEST(ShardRecoveryTest, ANewEpochOfAShardHeardFromBeforeIsARestartWithAReplayDue) {
  ShardRecovery r(/*shards=*/2, /*max_log_bytes=*/1 << 20, /*log_pushes=*/true, /*worker=*/3);
  EXPECT_FALSE(r.NoteReply(0, Reply(11, 0)).restarted);  // the first process heard from
  EXPECT_FALSE(r.NoteReply(0, Reply(11, 0)).restarted);
  EXPECT_EQ(r.epoch(0), 11u);
  EXPECT_EQ(r.epoch(1), 0u);
  EXPECT_FALSE(r.any_replay_due());
  r.LogPush(0, /*clock=*/4, Reply(11, 0), Frames(8));
  r.LogPush(0, /*clock=*/5, Reply(11, 0), Frames(8));
  EXPECT_EQ(r.log().entries(0), 2u);
  const ShardRecovery::Noted noted = r.NoteReply(0, Reply(22, 0, 0, /*ckpt_clock=*/3));
  EXPECT_TRUE(noted.restarted);
  EXPECT_TRUE(noted.lost.ok());
  EXPECT_TRUE(r.replay_due(0));
  EXPECT_FALSE(r.replay_due(1));
  EXPECT_TRUE(r.any_replay_due());
  EXPECT_EQ(r.restored_clock(0), 3);
  EXPECT_EQ(r.restored_clock(1), -1);
  const std::deque<PushLog::Entry> replay = r.StartReplay(0);
  ASSERT_EQ(replay.size(), 2u);
  EXPECT_EQ(replay[0].clock, 4);
  EXPECT_EQ(replay[1].clock, 5);
  EXPECT_FALSE(r.replay_due(0));
  EXPECT_EQ(r.log().entries(0), 0u);
  // After a rollback every process is learned afresh: a new epoch then is no restart.
  r.ForgetEpochs();
  EXPECT_FALSE(r.NoteReply(0, Reply(33, 0)).restarted);
}

TEST(ShardRecoveryTest, APushLeavesTheLogOnceAReplySaysACheckpointHoldsIt) {
  ShardRecovery r(1, 1 << 20, true, 0);
  r.NoteReply(0, Reply(7, 2));
  r.LogPush(0, 1, Reply(7, 2), Frames(16));  // acknowledged at count 2: in checkpoint 3
  r.NoteReply(0, Reply(7, 2));
  EXPECT_EQ(r.log().entries(0), 1u);
  r.NoteReply(0, Reply(7, 3));
  EXPECT_EQ(r.log().entries(0), 0u);
  EXPECT_TRUE(r.CheckLog().ok());
}

TEST(ShardRecoveryTest, ARestartFromAnOlderCheckpointThanTheLogWasTrimmedByLosesUpdates) {
  ShardRecovery r(1, 1 << 20, true, 5);
  r.NoteReply(0, Reply(7, 3));
  r.LogPush(0, 1, Reply(7, 3), Frames(8));  // acknowledged at count 3: in checkpoint 4
  r.NoteReply(0, Reply(7, 4));  // dropped from the log by checkpoint 4
  EXPECT_EQ(r.log().entries(0), 0u);
  const ShardRecovery::Noted noted = r.NoteReply(0, Reply(8, 3, /*restored=*/3, 6));
  EXPECT_TRUE(noted.restarted);
  ASSERT_FALSE(noted.lost.ok());
  EXPECT_NE(noted.lost.message().find("worker 5: shard 0 restarted from checkpoint 3"),
            std::string::npos)
      << noted.lost.ToString();
  // From the checkpoint it was trimmed by, nothing is lost.
  ShardRecovery fine(1, 1 << 20, true, 5);
  fine.NoteReply(0, Reply(7, 3));
  fine.LogPush(0, 1, Reply(7, 3), Frames(8));
  fine.NoteReply(0, Reply(7, 4));
  EXPECT_TRUE(fine.NoteReply(0, Reply(8, 4, 4, 6)).lost.ok());
  // A worker whose log held nothing lost nothing, whatever count it heard.
  ShardRecovery idle(1, 1 << 20, true, 5);
  idle.NoteReply(0, Reply(7, 4));
  EXPECT_TRUE(idle.NoteReply(0, Reply(8, 3, 3, 6)).lost.ok());
  // A client that logs no pushes (a tool) lost none: the same restart is only a restart.
  ShardRecovery tool(1, 1 << 20, /*log_pushes=*/false, 5);
  tool.NoteReply(0, Reply(7, 4));
  const ShardRecovery::Noted seen = tool.NoteReply(0, Reply(8, 3, 3, 6));
  EXPECT_TRUE(seen.restarted);
  EXPECT_TRUE(seen.lost.ok()) << seen.lost.ToString();
}

// Shard process 7 wrote checkpoint 1; process 8 restored it and wrote checkpoint 2 while a
// replay was owed (it holds every acknowledged push before 1 only); process 9 restored 2.
// Worker X never reached process 8: its push acknowledged by process 7 at count 1 stays for
// the replay. Worker Y trimmed its log by process 8's count 2: a restart from checkpoint 2
// loses nothing of it, so none is reported.
TEST(ShardRecoveryTest, ACheckpointTakenWhileAReplayWasOwedKeepsTheEarlierPushesAndLosesNone) {
  ShardRecovery x(1, 1 << 20, true, 1);
  x.NoteReply(0, Reply(7, 1));
  x.LogPush(0, 1, Reply(7, 1), Frames(8));
  const ShardRecovery::Noted restarted = x.NoteReply(0, Reply(9, 2, 2, 1, /*complete=*/1, 8));
  EXPECT_TRUE(restarted.restarted);
  EXPECT_TRUE(restarted.lost.ok()) << restarted.lost.ToString();
  EXPECT_EQ(x.StartReplay(0).size(), 1u);

  ShardRecovery y(1, 1 << 20, true, 2);
  y.NoteReply(0, Reply(7, 1));
  y.NoteReply(0, Reply(8, 1, 1, 1));  // process 8 restored 1
  y.LogPush(0, 1, Reply(8, 1, 1, 1), Frames(8));  // acknowledged by it at count 1
  y.NoteReply(0, Reply(8, 2, 1, 1));  // its checkpoint 2 holds it: dropped
  EXPECT_EQ(y.log().entries(0), 0u);
  const ShardRecovery::Noted again = y.NoteReply(0, Reply(9, 2, 2, 1, /*complete=*/1, 8));
  EXPECT_TRUE(again.restarted);
  EXPECT_TRUE(again.lost.ok()) << again.lost.ToString();
  // Restored from checkpoint 1 instead (2 was damaged): Y had dropped what 2 held.
  ShardRecovery z(1, 1 << 20, true, 3);
  z.NoteReply(0, Reply(7, 1));
  z.NoteReply(0, Reply(8, 1, 1, 1));
  z.LogPush(0, 1, Reply(8, 1, 1, 1), Frames(8));
  z.NoteReply(0, Reply(8, 2, 1, 1));
  EXPECT_FALSE(z.NoteReply(0, Reply(9, 1, 1, 1)).lost.ok());
  // Process 7 wrote checkpoints 1 and 2, and W trimmed by 2; 2 was damaged, so process 8
  // restored 1 and took checkpoint 3 before any replay (it holds what was acknowledged before
  // 1 only); process 9 restored 3. W never reached process 8: what checkpoint 2 held is lost,
  // and said so, although 3 is past 2.
  ShardRecovery w(1, 1 << 20, true, 4);
  w.NoteReply(0, Reply(7, 1));
  w.LogPush(0, 1, Reply(7, 1), Frames(8));  // acknowledged at count 1: in checkpoint 2
  w.NoteReply(0, Reply(7, 2));
  const ShardRecovery::Noted lost = w.NoteReply(0, Reply(9, 3, 3, 1, /*complete=*/1, 8));
  ASSERT_FALSE(lost.lost.ok());
  EXPECT_NE(lost.lost.message().find("restarted from checkpoint 3 (which holds the pushes "
                                     "acknowledged before 1)"),
            std::string::npos)
      << lost.lost.ToString();
}

TEST(ShardRecoveryTest, WithoutCheckpointsNothingIsLoggedAndALogPastItsBoundIsAnError) {
  ShardRecovery off(1, 1 << 20, /*log_pushes=*/false, 0);
  off.NoteReply(0, Reply(7, 0));
  Frames kept(64);
  off.LogPush(0, 1, Reply(7, 0), kept);
  EXPECT_EQ(off.log().entries(0), 0u);
  EXPECT_EQ(kept.f.size(), 1u);  // left with the request, its buffer reused by the next one
  EXPECT_FALSE(off.logs_pushes());
  ShardRecovery small(1, /*max_log_bytes=*/100, true, 9);
  small.NoteReply(0, Reply(7, 0));
  for (int i = 0; i < 4; ++i) small.LogPush(0, i, Reply(7, 0), Frames(64));
  const Status st = small.CheckLog();
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.ToString().find("worker 9"), std::string::npos) << st.ToString();
}

}  // namespace
}  // namespace parasol
