// Checkpoints through real servers: restart after kill -9, damaged files, the last checkpoint
// on SIGTERM.
#include <gtest/gtest.h>
#include <signal.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <thread>

#include "server/checkpoint.hpp"
#include "tests/support/json_figures.hpp"
#include "tests/support/test_cluster.hpp"

namespace parasol {
namespace {

using testing::JsonAt;
using testing::TestCluster;

constexpr const char* kTables =
    "  - name: emb\n    dim: 4\n    optimizer: {kind: adagrad, lr: 0.1}\n"
    "  - name: w\n    kind: dense\n    shape: [50]\n    optimizer: {kind: adam, lr: 0.01}\n";

std::string CheckpointYaml(const std::string& dir) {
  return "checkpoint:\n  dir: " + dir + "\n  keep: 5\n";
}

// Every value and optimizer state of the keys and of the dense table.
std::vector<float> Snapshot(PsClient& c, const std::vector<uint64_t>& keys) {
  std::vector<float> out(keys.size() * c.RowFloats(0) + 50 * c.RowFloats(1));
  EXPECT_TRUE(c.PullSparseWithState(0, keys, out.data()).ok());
  EXPECT_TRUE(c.PullDenseWithState(1, out.data() + keys.size() * c.RowFloats(0)).ok());
  return out;
}

void Push(PsClient& c, const std::vector<uint64_t>& keys, float g) {
  std::vector<float> grads(keys.size() * 4, g), dense(50, g);
  ASSERT_TRUE(c.PushSparse(0, keys, grads).ok());
  ASSERT_TRUE(c.PushDense(1, dense).ok());
}

class CheckpointTest : public ::testing::Test {
 protected:
  void SetUp() override { ckpt_ = testing::MakeTempDir(); }
  void TearDown() override { testing::RemoveTree(ckpt_); }
  std::string ckpt_;
  std::vector<uint64_t> keys_ = {1, 2, 3, 1000, 123456789};
};

TEST_F(CheckpointTest, AKilledShardRestartsFromItsCheckpoint) {
  TestCluster cluster(1, 1, kTables, CheckpointYaml(ckpt_));
  ASSERT_TRUE(cluster.Start());
  std::vector<float> saved;
  {
    auto c = cluster.Connect(0);
    ASSERT_NE(c, nullptr);
    Push(*c, keys_, 0.5f);
    Push(*c, keys_, -0.25f);
    ASSERT_TRUE(c->Checkpoint().ok());
    saved = Snapshot(*c, keys_);
    Push(*c, keys_, 1.0f);  // after the checkpoint: lost with the process
  }
  cluster.server(0).Signal(SIGKILL);
  ASSERT_TRUE(cluster.server(0).Wait(std::chrono::seconds(10)).has_value());
  ASSERT_TRUE(cluster.Respawn(0));
  auto c = cluster.Connect(0);
  ASSERT_NE(c, nullptr);
  EXPECT_EQ(Snapshot(*c, keys_), saved);  // bit for bit, values and optimizer state
  EXPECT_NE(cluster.ServerLog(0).find("restored"), std::string::npos) << cluster.ServerLog(0);
}

TEST_F(CheckpointTest, ADamagedCheckpointIsRefusedAndThePreviousOneLoads) {
  for (const char* damage : {"flip", "truncate"}) {
    SCOPED_TRACE(damage);
    testing::RemoveTree(ckpt_);
    TestCluster cluster(1, 1, kTables, CheckpointYaml(ckpt_));
    ASSERT_TRUE(cluster.Start());
    std::vector<float> first;
    {
      auto c = cluster.Connect(0);
      ASSERT_NE(c, nullptr);
      Push(*c, keys_, 0.5f);
      ASSERT_TRUE(c->Checkpoint().ok());
      first = Snapshot(*c, keys_);
      Push(*c, keys_, 0.75f);
      ASSERT_TRUE(c->Checkpoint().ok());
    }
    cluster.server(0).Signal(SIGKILL);
    ASSERT_TRUE(cluster.server(0).Wait(std::chrono::seconds(10)).has_value());
    const std::vector<std::string> files = ListCheckpoints(ckpt_, 0);
    ASSERT_EQ(files.size(), 2u);
    const auto size = std::filesystem::file_size(files[0]);
    if (std::string(damage) == "flip") {
      std::fstream f(files[0], std::ios::in | std::ios::out | std::ios::binary);
      f.seekg(static_cast<std::streamoff>(size / 2));
      char byte = 0;
      f.read(&byte, 1);
      byte ^= 0x10;
      f.seekp(static_cast<std::streamoff>(size / 2));
      f.write(&byte, 1);
    } else {
      std::filesystem::resize_file(files[0], size - 20);
    }
    ASSERT_TRUE(cluster.Respawn(0));
    auto c = cluster.Connect(0);
    ASSERT_NE(c, nullptr);
    EXPECT_EQ(Snapshot(*c, keys_), first);
    const std::string log = cluster.ServerLog(0);
    EXPECT_NE(log.find("refused checkpoint"), std::string::npos) << log;
    EXPECT_NE(log.find("is damaged"), std::string::npos) << log;
  }
}

// Two dense tables of one size: before block headers had a checksum, a table id flipped from
// one to the other swapped their values without a word.
constexpr const char* kTwinTables =
    "  - name: emb\n    dim: 4\n    optimizer: {kind: adagrad, lr: 0.1}\n"
    "  - name: w\n    kind: dense\n    shape: [50]\n    optimizer: {kind: adam, lr: 0.01}\n"
    "  - name: v\n    kind: dense\n    shape: [50]\n    optimizer: {kind: adam, lr: 0.01}\n";

// Every value and optimizer state of the keys and of both dense tables.
std::vector<float> TwinSnapshot(PsClient& c, const std::vector<uint64_t>& keys) {
  std::vector<float> out(keys.size() * c.RowFloats(0) + 50 * (c.RowFloats(1) + c.RowFloats(2)));
  EXPECT_TRUE(c.PullSparseWithState(0, keys, out.data()).ok());
  float* dense = out.data() + keys.size() * c.RowFloats(0);
  EXPECT_TRUE(c.PullDenseWithState(1, dense).ok());
  EXPECT_TRUE(c.PullDenseWithState(2, dense + 50 * c.RowFloats(1)).ok());
  return out;
}

void TwinPush(PsClient& c, const std::vector<uint64_t>& keys, float g) {
  std::vector<float> grads(keys.size() * 4, g), w(50, g), v(50, -2 * g);
  ASSERT_TRUE(c.PushSparse(0, keys, grads).ok());
  ASSERT_TRUE(c.PushDense(1, w).ok());
  ASSERT_TRUE(c.PushDense(2, v).ok());
}

// The offset of each block header in a checkpoint file (server/checkpoint.hpp's layout).
std::vector<size_t> BlockOffsets(const std::string& path) {
  const std::string f = testing::ReadFile(path);
  std::vector<size_t> out;
  uint64_t blocks = 0;
  std::memcpy(&blocks, f.data() + 48, 8);
  size_t at = kCheckpointHeaderBytes;
  for (uint64_t i = 0; i < blocks && at + kCheckpointBlockHeaderBytes <= f.size(); ++i) {
    out.push_back(at);
    uint64_t bytes = 0;
    std::memcpy(&bytes, f.data() + at + 16, 8);
    at += kCheckpointBlockHeaderBytes + bytes;
  }
  return out;
}

void XorByte(const std::string& path, size_t at, char mask) {
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  f.seekg(static_cast<std::streamoff>(at));
  char byte = 0;
  f.read(&byte, 1);
  byte ^= mask;
  f.seekp(static_cast<std::streamoff>(at));
  f.write(&byte, 1);
}

TEST_F(CheckpointTest, ADamagedBlockHeaderIsRefusedAndThePreviousOneLoads) {
  // "size": bit 38 of the first block's byte count, a 256 GiB allocation the version 1 reader
  // attempted (and died of: std::bad_alloc, so the shard crash-looped).
  // "table": the table ids of the two same-sized dense slices, swapped.
  for (const char* damage : {"size", "table"}) {
    SCOPED_TRACE(damage);
    testing::RemoveTree(ckpt_);
    TestCluster cluster(1, 2, kTwinTables, CheckpointYaml(ckpt_));
    ASSERT_TRUE(cluster.Start());
    std::vector<float> first;
    {
      auto c = cluster.Connect(0);
      ASSERT_NE(c, nullptr);
      TwinPush(*c, keys_, 0.5f);
      ASSERT_TRUE(c->Checkpoint().ok());
      first = TwinSnapshot(*c, keys_);
      TwinPush(*c, keys_, 0.75f);
      ASSERT_TRUE(c->Checkpoint().ok());
    }
    cluster.server(0).Signal(SIGKILL);
    ASSERT_TRUE(cluster.server(0).Wait(std::chrono::seconds(10)).has_value());
    const std::vector<std::string> files = ListCheckpoints(ckpt_, 0);
    ASSERT_EQ(files.size(), 2u);
    const std::vector<size_t> blocks = BlockOffsets(files[0]);
    ASSERT_GE(blocks.size(), 3u);
    if (std::string(damage) == "size") {
      XorByte(files[0], blocks[0] + 16 + 4, 0x40);
    } else {
      XorByte(files[0], blocks[1] + 4, 1 ^ 2);  // table 1 -> 2
      XorByte(files[0], blocks[2] + 4, 1 ^ 2);  // table 2 -> 1
    }
    ASSERT_TRUE(cluster.Respawn(0));
    auto c = cluster.Connect(0);
    ASSERT_NE(c, nullptr);
    EXPECT_EQ(TwinSnapshot(*c, keys_), first);  // the older checkpoint, bit for bit
    const std::string log = cluster.ServerLog(0);
    EXPECT_NE(log.find("refused checkpoint: IoError: checkpoint '" + files[0] + "' is damaged"),
              std::string::npos)
        << log;
    EXPECT_NE(log.find("header checksum (at byte"), std::string::npos) << log;
    EXPECT_NE(log.find("restored " + files[1]), std::string::npos) << log;
    // It serves: a push after the restore moves the values on from the restored ones. (From
    // worker 1: worker 0's pushes at clock 0 are named like the ones restored, so a new
    // worker 0 at clock 0 would be taken for a restarted one recomputing them.)
    auto w1 = cluster.Connect(1);
    ASSERT_NE(w1, nullptr);
    TwinPush(*w1, keys_, 0.125f);
    EXPECT_NE(TwinSnapshot(*c, keys_), first);
  }
}

TEST_F(CheckpointTest, SigtermWritesALastCheckpoint) {
  TestCluster cluster(1, 1, kTables, CheckpointYaml(ckpt_));
  ASSERT_TRUE(cluster.Start());
  std::vector<float> before;
  {
    auto c = cluster.Connect(0);
    ASSERT_NE(c, nullptr);
    Push(*c, keys_, 0.5f);
    before = Snapshot(*c, keys_);
  }
  cluster.server(0).Signal(SIGTERM);
  ASSERT_TRUE(cluster.server(0).Wait(std::chrono::seconds(10)).has_value());
  ASSERT_EQ(ListCheckpoints(ckpt_, 0).size(), 1u);
  ASSERT_TRUE(cluster.Respawn(0));
  auto c = cluster.Connect(0);
  ASSERT_NE(c, nullptr);
  EXPECT_EQ(Snapshot(*c, keys_), before);
}

// Under BSP a checkpoint taken inside a clock holds the pushes already summed for it: they are
// in its push record, so after a restart their replays are answered as duplicates, and only
// the restored sums keep them.
TEST_F(CheckpointTest, UnderBspACheckpointInsideAClockKeepsThePushesSummedForIt) {
  // Worker 0 pushes for clock 0 and ticks; a checkpoint; worker 1 pushes for clock 0 and
  // ticks; worker 0 reads at clock 1. With `restart`, the shard is killed after the checkpoint
  // and restarted from it, and worker 0 replays its push before worker 1 pushes.
  auto run = [&](bool restart) -> std::vector<float> {
    testing::RemoveTree(ckpt_);
    TestCluster cluster(1, 2, kTables, CheckpointYaml(ckpt_) + "training:\n  consistency: bsp\n");
    if (!cluster.Start()) return {};
    auto w0 = cluster.Connect(0), w1 = cluster.Connect(1);
    if (!w0 || !w1) return {};
    Push(*w0, keys_, 0.5f);
    EXPECT_TRUE(w0->Tick().ok());
    {
      auto observer = cluster.Connect(PsClient::kObserver);
      if (!observer) return {};
      EXPECT_TRUE(observer->Checkpoint().ok());
    }
    if (restart) {
      cluster.server(0).Signal(SIGKILL);
      EXPECT_TRUE(cluster.server(0).Wait(std::chrono::seconds(10)).has_value());
      if (!cluster.Respawn(0) || !cluster.Connect(PsClient::kObserver)) return {};
      EXPECT_TRUE(w0->Stats().ok());  // sees the new process: replays its push of clock 0
    }
    Push(*w1, keys_, -0.25f);
    EXPECT_TRUE(w1->Tick().ok());
    std::vector<float> after = Snapshot(*w0, keys_);  // once both workers passed clock 0
    if (restart) {
      EXPECT_NE(cluster.ServerLog(0).find("restored"), std::string::npos) << cluster.ServerLog(0);
      auto observer = cluster.Connect(PsClient::kObserver);
      if (!observer) return {};
      auto stats = observer->Stats();
      EXPECT_TRUE(stats.ok());
      // Worker 0's pushes were acknowledged before the checkpoint, so its log dropped them
      // once a reply said so; any that came back anyway were not applied again.
      if (stats.ok()) {
        EXPECT_EQ(JsonAt((*stats)[0], "/duplicate_pushes"),
                  JsonAt((*stats)[0], "/replayed_pushes"))
            << (*stats)[0];
        EXPECT_EQ(JsonAt((*stats)[0], "/refused_replays"), 0) << (*stats)[0];
      }
    }
    return after;
  };
  const std::vector<float> undisturbed = run(false);
  const std::vector<float> restarted = run(true);
  ASSERT_FALSE(undisturbed.empty());
  ASSERT_EQ(restarted.size(), undisturbed.size());
  for (size_t i = 0; i < undisturbed.size(); ++i) {
    EXPECT_NEAR(restarted[i], undisturbed[i], 1e-6) << "float " << i;
  }
  // The average of both pushes was applied: not worker 1's alone, halved.
  std::vector<float> fresh;
  {
    TestCluster cluster(1, 1, kTables);
    ASSERT_TRUE(cluster.Start());
    auto c = cluster.Connect(0);
    ASSERT_NE(c, nullptr);
    Push(*c, keys_, 0.125f);
    fresh = Snapshot(*c, keys_);
  }
  ASSERT_EQ(fresh.size(), undisturbed.size());
  for (size_t i = 0; i < undisturbed.size(); ++i) {
    EXPECT_NEAR(undisturbed[i], fresh[i], 1e-6) << "float " << i;
  }
}

TEST(CheckpointFileTest, EveryTruncationIsDetected) {
  const std::string dir = testing::MakeTempDir();
  CheckpointHeader h;
  h.shard = 1;
  h.shards = 2;
  h.fingerprint = 77;
  h.sequence = 3;
  CheckpointBlock b;
  b.kind = 1;
  b.count = 3;
  b.bytes.assign(100, 'x');
  const std::string path = dir + "/c.bin";
  ASSERT_TRUE(WriteCheckpointFile(path, h, {b, b}).ok());
  CheckpointHeader read;
  int blocks = 0;
  ASSERT_TRUE(ReadCheckpointFile(path, &read, [&](const CheckpointBlock& x) {
                ++blocks;
                EXPECT_EQ(x.bytes, b.bytes);
                return Status::Ok();
              }).ok());
  EXPECT_EQ(blocks, 2);
  EXPECT_EQ(read.fingerprint, 77u);
  const auto size = std::filesystem::file_size(path);
  for (uintmax_t n = 0; n < size; n += 7) {
    std::filesystem::copy_file(path, dir + "/t.bin", std::filesystem::copy_options::overwrite_existing);
    std::filesystem::resize_file(dir + "/t.bin", n);
    Status st = ReadCheckpointFile(dir + "/t.bin", &read, [](const CheckpointBlock&) { return Status::Ok(); });
    EXPECT_FALSE(st.ok()) << "a file cut to " << n << " of " << size << " bytes was accepted";
  }
  testing::RemoveTree(dir);
}

TEST_F(CheckpointTest, UnderBspAShardKilledBeforeItsFirstCheckpointGetsEveryPushReplayed) {
  // No checkpoint was written: the restarted shard starts from the initial values and knows no
  // clock; the worker replays its whole log (clock by clock) and the job ends where an
  // undisturbed run ends.
  auto run = [&](bool kill) {
    const std::string dir = ckpt_ + (kill ? "/killed" : "/undisturbed");
    TestCluster cluster(1, 1, kTables, CheckpointYaml(dir) + "training:\n  consistency: bsp\n");
    EXPECT_TRUE(cluster.Start());
    auto c = cluster.Connect(0);
    EXPECT_NE(c, nullptr);
    if (!c) return std::vector<float>{};
    for (int step = 0; step < 5; ++step) {
      Push(*c, keys_, 0.1f * static_cast<float>(step + 1));
      EXPECT_TRUE(c->Tick().ok());
      if (kill && step == 2) {
        cluster.server(0).Signal(SIGKILL);
        EXPECT_TRUE(cluster.server(0).Wait(std::chrono::seconds(10)).has_value());
        EXPECT_TRUE(cluster.Respawn(0));
      }
    }
    std::vector<float> out = Snapshot(*c, keys_);
    if (kill) {  // the shard's log shows both starts, and no checkpoint restored
      const std::string log = cluster.ServerLog(0);
      const size_t first = log.find("serving on");
      EXPECT_NE(first, std::string::npos);
      EXPECT_NE(log.find("serving on", first + 1), std::string::npos) << log;
      EXPECT_EQ(log.find("(worker clocks from it)"), std::string::npos) << log;  // a restore
      auto stats = c->Stats();
      EXPECT_TRUE(stats.ok());
      if (stats.ok()) {  // 3 steps of a sparse and a dense push, clocks 0..3
        EXPECT_EQ(JsonAt((*stats)[0], "/replayed_pushes", -1), 6) << (*stats)[0];
        EXPECT_EQ(JsonAt((*stats)[0], "/replayed_clocks", -1), 4) << (*stats)[0];
        EXPECT_EQ(JsonAt((*stats)[0], "/refused_replays", -1), 0) << (*stats)[0];
      }
    }
    return out;
  };
  const std::vector<float> undisturbed = run(false);
  const std::vector<float> restarted = run(true);
  ASSERT_EQ(undisturbed.size(), restarted.size());
  ASSERT_FALSE(undisturbed.empty());
  for (size_t i = 0; i < undisturbed.size(); ++i) {
    EXPECT_NEAR(restarted[i], undisturbed[i], 1e-6) << "value " << i;
  }
}

}  // namespace
}  // namespace parasol

namespace parasol {
namespace {

// checkpoint.max_log_bytes bounds a worker's push log by construction: with no periodic
// checkpoint at all, the shard checkpoints whenever the worker has pushed half the bound to it,
// and the worker's log, trimmed by the checkpoint count in the replies, stays under the bound.
TEST_F(CheckpointTest, ThePushLogStaysUnderItsBoundWithoutAnyCheckpointPeriod) {
  constexpr const char* kBig =
      "  - name: emb\n    dim: 4\n    optimizer: {kind: sgd, lr: 0.1}\n"
      "  - name: w\n    kind: dense\n    shape: [65536]\n    optimizer: {kind: sgd, lr: 0.01}\n";
  TestCluster cluster(1, 1, kBig,
                      "server:\n  max_request_bytes: 1MiB\n"
                      "checkpoint:\n  dir: " + ckpt_ + "\n  max_log_bytes: 2MiB\n");
  ASSERT_TRUE(cluster.Start());
  auto c = cluster.Connect(0);
  ASSERT_NE(c, nullptr);
  std::vector<float> dense(65536, 0.001f);  // 256 KiB a push
  uint64_t peak = 0;
  for (int step = 0; step < 40; ++step) {  // 10 MiB in all, five times the bound
    const Status pushed = c->PushDense(1, dense);
    ASSERT_TRUE(pushed.ok()) << step << ": " << pushed.ToString();
    const Status ticked = c->Tick();
    ASSERT_TRUE(ticked.ok()) << step << ": " << ticked.ToString();
    peak = std::max(peak, c->push_log_bytes());
  }
  EXPECT_LE(c->push_log_peak_bytes(), 2u << 20);
  EXPECT_GT(peak, 256u << 10);  // it did log
  auto stats = c->Stats();
  ASSERT_TRUE(stats.ok());
  // 10 MiB pushed, a checkpoint per 1 MiB (half the bound over one shard).
  EXPECT_GE(JsonAt((*stats)[0], "/checkpoints"), 8) << (*stats)[0];
  EXPECT_NE(cluster.ServerLog(0).find("(checkpoint.max_log_bytes)"), std::string::npos);
}

}  // namespace
}  // namespace parasol
