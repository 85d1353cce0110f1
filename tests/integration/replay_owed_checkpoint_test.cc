// A checkpoint a restarted shard takes while a worker's replay to it is still owed lacks the
// pushes that worker's earlier acknowledgements stand for: they are only in its push log. Its
// count must not tell the worker to drop them (parasol_sim --elastic --seed 7053: such a
// checkpoint, restored after the shard died again, made a worker drop pushes it had never
// replayed, and the model differed with nothing reported).
//
// Driven in process: a real ShardServer (three processes of it, one after the other, on one
// checkpoint folder) and the worker's real ShardRecovery, fed the shard's own replies.
#include <gtest/gtest.h>

#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "common/membership.hpp"
#include "common/sharding.hpp"
#include "server/checkpoint.hpp"
#include "tests/support/in_process_shard.hpp"
#include "tests/support/temp_dir.hpp"
#include "worker/shard_recovery.hpp"

namespace parasol {
namespace {

class ReplayOwedCheckpointTest : public testing::TempDirTest {
 protected:
  std::string Manifest(const std::string& dir) const {
    return "cluster:\n  servers: [127.0.0.1:1]\n  workers: 2\n"
           "training: {consistency: bsp}\n"
           "checkpoint: {dir: " + dir + ", keep: 10}\n"
           "tables:\n"
           "  - {name: e, kind: sparse, dim: 4, optimizer: {kind: sgd, lr: 1.0}}\n";
  }
  const std::vector<uint64_t> keys_ = {1, 2, 3, 40};
};

TEST_F(ReplayOwedCheckpointTest, ItsCountKeepsTheUnreplayedPushesInTheWorkersLog) {
  // Worker 1's log of shard 0, as its PsClient keeps it.
  ShardRecovery recovery(/*shards=*/1, /*max_log_bytes=*/0, /*log_pushes=*/true, /*worker=*/1);
  auto log_push = [&](const Header& reply) {
    std::vector<zmq::message_t> frames;
    frames.emplace_back("push", 4);
    recovery.LogPush(0, reply.clock, reply, frames);
  };

  // The first process: clock 0 of both workers, a checkpoint (1) at clock 1, then worker 1's
  // push of clock 1, acknowledged and logged.
  {
    testing::InProcessShard a(Manifest(dir_), "first");
    ASSERT_TRUE(a.Restore().ok());
    for (uint32_t w = 0; w < 2; ++w) {
      ASSERT_TRUE(a.Answered(a.Push(0, 0, keys_, w)));
      ASSERT_TRUE(a.Answered(a.Tick(1, w)));
    }
    ASSERT_TRUE(a.Checkpoint("clock 1").ok());
    const uint64_t pushed = a.Push(0, 1, keys_, 1, 2.0f);
    ASSERT_TRUE(a.Answered(pushed));
    const Header acked = a.ReplyHeader(pushed);
    EXPECT_EQ(acked.checkpoint_count, 1u);
    EXPECT_TRUE(recovery.NoteReply(0, acked).lost.ok());
    log_push(acked);
  }  // killed: no checkpoint as it goes

  // The second process restored checkpoint 1 and owes both workers their replays; it takes
  // checkpoint 2 before any arrives (a restarted worker's, a requested one: any). Worker 1
  // never reaches this process.
  {
    testing::InProcessShard b(Manifest(dir_), "second");
    ASSERT_TRUE(b.Restore().ok());
    ASSERT_TRUE(b.Checkpoint("while the replays are owed").ok());
    ASSERT_TRUE(std::filesystem::exists(CheckpointPath(dir_, 0, 2)));
    const uint64_t stats = b.Stats();
    ASSERT_TRUE(b.Answered(stats));
    // Its own acknowledgements are in checkpoint 2; it restored 1, which holds every push
    // acknowledged before it.
    EXPECT_EQ(b.ReplyHeader(stats).checkpoint_count, 2u);
    EXPECT_EQ(b.ReplyHeader(stats).restored_count, 1u);
    EXPECT_EQ(b.ReplyHeader(stats).restored_sequence, 1u);
  }

  // The third process restored checkpoint 2. Worker 1's first reply from it tells of the
  // restart; its log must still hold the push of clock 1, which checkpoint 2 lacks.
  testing::InProcessShard c(Manifest(dir_), "third");
  ASSERT_TRUE(c.Restore().ok());
  EXPECT_NE(c.server().restored_from().find("2.bin"), std::string::npos)
      << c.server().restored_from();
  const uint64_t stats = c.Stats(1);
  ASSERT_TRUE(c.Answered(stats));
  const Header restarted = c.ReplyHeader(stats);
  // Restored checkpoint 2, which holds every acknowledged push before 1 only.
  EXPECT_EQ(restarted.restored_sequence, 2u);
  EXPECT_EQ(restarted.restored_count, 1u);
  const ShardRecovery::Noted noted = recovery.NoteReply(0, restarted);
  EXPECT_TRUE(noted.restarted);
  EXPECT_TRUE(noted.lost.ok()) << noted.lost.ToString();
  const std::deque<PushLog::Entry> replay = recovery.StartReplay(0);
  ASSERT_EQ(replay.size(), 1u) << "worker 1 dropped a push no checkpoint holds";
  EXPECT_EQ(replay.front().clock, 1);

  // The replays, as the workers send them: worker 0 has nothing since the checkpoint's clock;
  // worker 1 its clock, then what its log kept.
  c.set_request_edit([&](Header& h) {
    h.replay = true;
    h.known_epoch = restarted.server_epoch;
    h.caught_up = h.op == Op::Clock;
  });
  for (uint32_t w = 0; w < 2; ++w) ASSERT_TRUE(c.Answered(c.Tick(1, w)));
  for (const PushLog::Entry& e : replay) {
    ASSERT_TRUE(c.Answered(c.Push(0, e.clock, keys_, 1, 2.0f)));
  }
  c.set_request_edit({});
  // Once every replay is in, a checkpoint holds everything again.
  ASSERT_TRUE(c.Checkpoint("after the replays").ok());
  const uint64_t after = c.Stats();
  ASSERT_TRUE(c.Answered(after));
  EXPECT_EQ(c.ReplyHeader(after).checkpoint_count, 3u);

  // The model equals an undisturbed shard's, bit for bit.
  std::filesystem::create_directories(dir_ + "/undisturbed");
  testing::InProcessShard d(Manifest(dir_ + "/undisturbed"), "undisturbed");
  for (uint32_t w = 0; w < 2; ++w) {
    ASSERT_TRUE(d.Answered(d.Push(0, 0, keys_, w)));
    ASSERT_TRUE(d.Answered(d.Tick(1, w)));
  }
  ASSERT_TRUE(d.Answered(d.Push(0, 1, keys_, 1, 2.0f)));
  for (testing::InProcessShard* s : {&c, &d}) {
    for (uint32_t w = 0; w < 2; ++w) ASSERT_TRUE(s->Answered(s->Tick(2, w)));
  }
  const uint64_t got = c.Pull(0, 2, keys_);
  const uint64_t want = d.Pull(0, 2, keys_);
  ASSERT_TRUE(c.Answered(got));
  ASSERT_TRUE(d.Answered(want));
  ASSERT_FALSE(d.Reply(want).empty());
  EXPECT_EQ(c.Reply(got), d.Reply(want)) << "the restarted shard's rows differ";
}

// A shard other than shard 0 learns of a join from the workers' copies of the membership. One
// that restarted from a checkpoint older than the join learns of it from a request; it does
// not wait for that rank's replay, but a checkpoint it takes before the replay (or the rank's
// word that it holds nothing for this shard) must not claim the pushes only the rank's log
// holds.
TEST_F(ReplayOwedCheckpointTest, AJoinerLearnedOfAfterTheRestoreKeepsItsPushesInItsLog) {
  const std::string manifest =
      "cluster:\n  servers: [127.0.0.1:1, 127.0.0.1:2]\n  workers: 1\n  max_workers: 2\n"
      "training: {consistency: bsp}\n"
      "checkpoint: {dir: " + dir_ + ", keep: 10}\n"
      "tables:\n"
      "  - {name: e, kind: sparse, dim: 4, optimizer: {kind: sgd, lr: 1.0}}\n";
  std::vector<uint64_t> keys;  // shard 1's
  for (uint64_t k = 1; keys.size() < 4; ++k) {
    if (ShardOfKey(k, 2) == 1) keys.push_back(k);
  }
  const std::vector<MemberEntry> joined = {MemberEntry{1, 1, -1}};  // rank 1 joins at clock 1
  ShardRecovery joiner(/*shards=*/2, 0, /*log_pushes=*/true, /*worker=*/1);
  {
    // Checkpoint 1 at clock 1, before this shard hears of the join; then the joiner's Hello
    // (its join in its copy) and its push of clock 1, acknowledged and logged.
    testing::InProcessShard a(manifest, "first", 1);
    ASSERT_TRUE(a.Restore().ok());
    ASSERT_TRUE(a.Answered(a.Push(0, 0, keys, 0)));
    ASSERT_TRUE(a.Answered(a.Tick(1, 0)));
    ASSERT_TRUE(a.Checkpoint("before the join").ok());
    a.set_request_edit([&](Header& h) { h.members = joined; });
    Header hello = a.Request(Op::Hello, 1, 1);
    hello.join = true;
    a.Send(hello);
    ASSERT_TRUE(a.Answered(hello.request_id));
    EXPECT_TRUE(joiner.NoteReply(1, a.ReplyHeader(hello.request_id)).lost.ok());
    const uint64_t pushed = a.Push(0, 1, keys, 1, 3.0f);
    ASSERT_TRUE(a.Answered(pushed));
    EXPECT_EQ(a.ReplyHeader(pushed).checkpoint_count, 1u);
    const ShardRecovery::Noted noted = joiner.NoteReply(1, a.ReplyHeader(pushed));
    ASSERT_TRUE(noted.lost.ok());
    std::vector<zmq::message_t> frames;
    frames.emplace_back("push", 4);
    joiner.LogPush(1, 1, a.ReplyHeader(pushed), frames);
  }
  {
    // Restored checkpoint 1 (no join in it). Worker 0 replays and so owes nothing; its next
    // request's copy tells of the join. The checkpoint taken then lacks the joiner's push.
    testing::InProcessShard b(manifest, "second", 1);
    ASSERT_TRUE(b.Restore().ok());
    const uint64_t probe = b.Stats();
    ASSERT_TRUE(b.Answered(probe));
    b.set_request_edit([&](Header& h) {
      h.replay = true;
      h.caught_up = true;
      h.known_epoch = b.ReplyHeader(probe).server_epoch;
    });
    ASSERT_TRUE(b.Answered(b.Tick(1, 0)));
    b.set_request_edit([&](Header& h) { h.members = joined; });
    ASSERT_TRUE(b.Answered(b.Stats(0)));
    ASSERT_TRUE(b.Checkpoint("before the joiner's replay").ok());
    const uint64_t stats = b.Stats();
    ASSERT_TRUE(b.Answered(stats));
    EXPECT_EQ(b.ReplyHeader(stats).checkpoint_count, 2u);
  }
  testing::InProcessShard c(manifest, "third", 1);
  ASSERT_TRUE(c.Restore().ok());
  const uint64_t stats = c.Stats(1);
  ASSERT_TRUE(c.Answered(stats));
  EXPECT_EQ(c.ReplyHeader(stats).restored_sequence, 2u);
  EXPECT_EQ(c.ReplyHeader(stats).restored_count, 1u);
  const ShardRecovery::Noted noted = joiner.NoteReply(1, c.ReplyHeader(stats));
  EXPECT_TRUE(noted.restarted);
  EXPECT_TRUE(noted.lost.ok()) << noted.lost.ToString();
  const std::deque<PushLog::Entry> replay = joiner.StartReplay(1);
  ASSERT_EQ(replay.size(), 1u) << "the joiner dropped a push no checkpoint holds";
  EXPECT_EQ(replay.front().clock, 1);
}

}  // namespace
}  // namespace parasol
