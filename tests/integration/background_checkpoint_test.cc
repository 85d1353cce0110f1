// Checkpoints written in the background, and shards that answer while they load one.
//
// A checkpoint holds the shard's state at the moment it was begun, bit for bit, while another
// worker keeps changing the same rows and tensor as it is written (the writer is slowed by a
// fault point so that the changes land during the write; the test checks that they did). A
// worker waits through a slow restore, told of its progress, and goes on with no error.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <set>
#include <thread>
#include <vector>

#include "common/transport.hpp"
#include "common/wire.hpp"
#include "server/checkpoint.hpp"
#include "tests/support/small_shard.hpp"
#include "tests/support/test_cluster.hpp"
#include "tests/support/test_seed.hpp"

namespace parasol {
namespace {

using testing::TestCluster;

constexpr const char* kTables =
    "  - name: emb\n    dim: 8\n    optimizer: {kind: adagrad, lr: 0.1}\n"
    "  - name: w\n    kind: dense\n    shape: [3000]\n    optimizer: {kind: adam, lr: 0.01}\n";
constexpr uint32_t kDim = 8;
constexpr uint32_t kRowFloats = 2 * kDim;   // values, then adagrad's per-element state
constexpr uint64_t kDense = 3000;
constexpr uint32_t kDenseFloats = 1 + 3;    // value, then adam's m, v and step

std::vector<uint64_t> Seeds() {
  std::vector<uint64_t> seeds = {1, 2};
  seeds.push_back(testing::TestSeed() % 100000 + 3);
  return seeds;
}

// A field of a shard's stats line, as text (an integer or true/false).
std::string StatsField(const std::string& json, const std::string& name) {
  const std::string key = "\"" + name + "\":";
  const size_t at = json.find(key);
  if (at == std::string::npos) return "";
  const size_t end = json.find_first_of(",}", at + key.size());
  return json.substr(at + key.size(), end - at - key.size());
}

class BackgroundCheckpointTest : public ::testing::Test {
 protected:
  void SetUp() override { ckpt_ = testing::MakeTempDir(); }
  void TearDown() override { testing::RemoveTree(ckpt_); }

  std::string Extra() const {
    return "checkpoint:\n  dir: " + ckpt_ + "\n  keep: 100\n";
  }

  static void PushRandom(PsClient& c, const std::vector<uint64_t>& keys, std::mt19937_64& rng) {
    std::uniform_real_distribution<float> g(-1.0f, 1.0f);
    std::vector<float> grads(keys.size() * kDim);
    for (float& x : grads) x = g(rng);
    ASSERT_TRUE(c.PushSparse(0, keys, grads).ok());
    std::vector<float> dense(kDense);
    for (float& x : dense) x = g(rng);
    ASSERT_TRUE(c.PushDense(1, dense).ok());
  }

  // Kills shard 0 (kill -9) and starts it again with a slow restore (each block of its
  // checkpoint waits 500 ms).
  static void KillAndRestartSlowly(TestCluster& cluster) {
    cluster.server(0).Signal(SIGKILL);
    ASSERT_TRUE(cluster.server(0).Wait(std::chrono::seconds(10)).has_value());
    ASSERT_TRUE(cluster.Respawn(0, "shard.restore=slow"));
  }

  // Loads checkpoint `file` into `loaded` and checks that it holds `rows` (values and state)
  // of `keys`, bit for bit.
  static void LoadAndCheckRows(const std::string& file, const std::vector<uint64_t>& keys,
                               const std::vector<float>& rows, uint64_t seed,
                               testing::SmallShard& loaded) {
    std::ifstream in(file, std::ios::binary);
    CheckpointHeader h;
    const Status st = loaded.state().Load(in, file, &h);
    ASSERT_TRUE(st.ok()) << st.ToString();
    SparseTable& table = loaded.sparse(0);
    for (size_t i = 0; i < keys.size(); ++i) {
      const float* row = table.partition(EngineOfKey(keys[i], table.engines())).Find(keys[i]);
      ASSERT_NE(row, nullptr) << "key " << keys[i];
      ASSERT_EQ(std::memcmp(row, &rows[i * kRowFloats], kRowFloats * sizeof(float)), 0)
          << "key " << keys[i] << " (seed " << seed << ")";
    }
  }

  std::string ckpt_;
};

// Both ways a checkpoint is written in the background: this small shard's state copied and
// written by a thread (checkpoint.copy_below, the default for it), and a forked copy of the shard
// (copy_below: 0).
class BackgroundWriteTest : public BackgroundCheckpointTest,
                            public ::testing::WithParamInterface<bool> {};

INSTANTIATE_TEST_SUITE_P(Ways, BackgroundWriteTest, ::testing::Values(false, true),
                         [](const ::testing::TestParamInfo<bool>& p) {
                           return p.param ? "forked" : "copied";
                         });

TEST_P(BackgroundWriteTest, ACheckpointHoldsTheStateOfItsMomentWhileRowsKeepChanging) {
  const bool forked = GetParam();
  TestCluster cluster(1, 2, kTables, Extra() + (forked ? "  copy_below: 0\n" : ""));
  cluster.set_faults("checkpoint.write=slow");  // each write takes 500 ms more
  const auto started = std::chrono::steady_clock::now();
  ASSERT_TRUE(cluster.Start());
  auto a = cluster.Connect(0);
  // The shard's serve loop answered the connection's greeting: it is serving by now.
  const auto started_serving = std::chrono::steady_clock::now();
  auto b = cluster.Connect(1);
  auto observer = cluster.Connect(PsClient::kObserver);
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  ASSERT_NE(observer, nullptr);
  const std::string manifest_text = testing::ReadFile(cluster.manifest_path());
  uint64_t checkpoints = 0;
  for (uint64_t seed : Seeds()) {
    std::mt19937_64 rng(seed);
    std::set<uint64_t> drawn;
    const size_t n = 200 + rng() % 800;
    while (drawn.size() < n) drawn.insert(rng() % 5000);
    const std::vector<uint64_t> keys(drawn.begin(), drawn.end());
    const int before = 1 + static_cast<int>(rng() % 4), during = 1 + static_cast<int>(rng() % 4);
    std::printf("[ seed     ] %llu: %zu keys, %d pushes before the checkpoint, %d while it is "
                "written\n",
                (unsigned long long)seed, keys.size(), before, during);
    for (int i = 0; i < before; ++i) PushRandom(*a, keys, rng);
    // The state at the checkpoint's moment: rows and tensor with their optimizer state.
    std::vector<float> rows(keys.size() * kRowFloats), dense(kDense * kDenseFloats);
    auto t = a->PullSparseAsync(0, keys, rows.data(), /*with_state=*/true);
    ASSERT_TRUE(t.ok());
    ASSERT_TRUE(a->Wait(*t).ok());
    auto d = a->PullDenseAsync(1, dense.data(), /*with_state=*/true);
    ASSERT_TRUE(d.ok());
    ASSERT_TRUE(a->Wait(*d).ok());

    Status written;
    std::thread writer([&] { written = a->Checkpoint(); });  // answered once it is durable
    // Worker 1 changes the same rows once the write has begun, and before it has ended.
    bool began = false;
    for (int i = 0; i < 400 && !began; ++i) {
      auto s = observer->StatsOf(0);
      ASSERT_TRUE(s.ok());
      began = StatsField(*s, "checkpoint_writing") == "true";
      if (!began) std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    ASSERT_TRUE(began) << "the checkpoint was never seen being written";
    for (int i = 0; i < during; ++i) PushRandom(*b, keys, rng);
    auto s = observer->StatsOf(0);
    ASSERT_TRUE(s.ok());
    const bool still = StatsField(*s, "checkpoint_writing") == "true";
    writer.join();
    ASSERT_TRUE(written.ok()) << written.ToString();
    ASSERT_TRUE(still) << "worker 1's pushes did not all land while the checkpoint was written";
    ++checkpoints;

    // The newest file holds the state of the moment, not the later pushes.
    const std::vector<std::string> files = ListCheckpoints(ckpt_, 0);
    ASSERT_FALSE(files.empty());
    testing::SmallShard loaded(manifest_text.c_str());
    LoadAndCheckRows(files[0], keys, rows, seed, loaded);
    if (HasFatalFailure()) return;
    std::vector<float> saved(kDense * kDenseFloats);
    loaded.dense(1).ReadWithState(0, kDense, saved.data());
    ASSERT_EQ(std::memcmp(saved.data(), dense.data(), saved.size() * sizeof(float)), 0)
        << "seed " << seed;
  }
  const auto asked = std::chrono::steady_clock::now();
  auto stats = observer->StatsOf(0);
  ASSERT_TRUE(stats.ok());
  EXPECT_EQ(std::stoull(StatsField(*stats, "checkpoints")), checkpoints) << *stats;
  // The serve loop's request thread waited between the requests, and served pushes and the rest
  // (the periodic work that begins the checkpoints). Every moment of its loop goes to one kind:
  // together they cover at least the time from the first connection's greeting to the stats
  // request, and at most the time from before the shard's process began to the reply.
  const double lifetime = std::chrono::duration<double>(std::chrono::steady_clock::now() -
                                                        started).count();
  const double served_at_least =
      std::chrono::duration<double>(asked - started_serving).count();
  double accounted = 0;
  for (const char* key : {"seconds_waiting", "seconds_serving_pushes", "seconds_serving_pulls",
                          "seconds_serving_ticks", "seconds_serving_other"}) {
    const std::string text = StatsField(*stats, key);
    ASSERT_FALSE(text.empty()) << key << ": " << *stats;
    const double seconds = std::stod(text);
    EXPECT_GE(seconds, 0.0) << key;
    accounted += seconds;
  }
  EXPECT_GT(std::stod(StatsField(*stats, "seconds_waiting")), 0.0) << *stats;
  EXPECT_GT(std::stod(StatsField(*stats, "seconds_serving_pushes")), 0.0) << *stats;
  EXPECT_GT(std::stod(StatsField(*stats, "seconds_serving_other")), 0.0) << *stats;
  EXPECT_LE(accounted, lifetime) << *stats;
  EXPECT_GE(accounted, served_at_least) << *stats;
  const std::string log = cluster.ServerLog(0);
  EXPECT_NE(log.find("in the background"), std::string::npos);
  EXPECT_EQ(log.find("copied, in the background") == std::string::npos, forked) << log;
}

// A worker restarts: what it had pushed since the shard's last checkpoint is only in the
// shard's memory (its push log died with it), so the shard checkpoints before it answers the
// new process's Hello. That checkpoint is written in the background: the shard answers others
// while it is written (seen writing it while the Hello waits), and the Hello is answered once
// the file is durable. Worker 0's state is then in the newest checkpoint, bit for bit.
TEST_F(BackgroundCheckpointTest, ARestartedWorkersCheckpointIsWrittenWhileTheShardServes) {
  TestCluster cluster(1, 1, kTables, Extra());
  cluster.set_faults("checkpoint.write=slow");  // each write takes 500 ms more
  ASSERT_TRUE(cluster.Start());
  const uint64_t seed = Seeds().back();
  std::mt19937_64 rng(seed);
  std::printf("[ seed     ] %llu\n", (unsigned long long)seed);
  std::vector<uint64_t> keys(300 + rng() % 700);
  for (uint64_t i = 0; i < keys.size(); ++i) keys[i] = i * 7919 + rng() % 7;
  std::sort(keys.begin(), keys.end());
  keys.erase(std::unique(keys.begin(), keys.end()), keys.end());
  auto first = cluster.Connect(0);
  auto observer = cluster.Connect(PsClient::kObserver);
  ASSERT_NE(first, nullptr);
  ASSERT_NE(observer, nullptr);
  PushRandom(*first, keys, rng);
  std::vector<float> rows(keys.size() * kRowFloats);
  auto pulled = first->PullSparseAsync(0, keys, rows.data(), /*with_state=*/true);
  ASSERT_TRUE(pulled.ok());
  ASSERT_TRUE(first->Wait(*pulled).ok());
  auto before = observer->StatsOf(0);
  ASSERT_TRUE(before.ok());
  ASSERT_EQ(StatsField(*before, "checkpoints"), "0") << *before;

  // The worker's new process (a new incarnation of rank 0): its Hello waits for the checkpoint.
  // What the shard says the moment the Hello is answered: its checkpoint is durable by then.
  std::atomic<bool> connected{false};
  std::unique_ptr<PsClient> second;
  std::string at_answer;
  std::thread restart([&] {
    second = cluster.Connect(0);
    if (second) {
      if (auto s = second->StatsOf(0); s.ok()) at_answer = *s;
    }
    connected = true;
  });
  bool seen_writing = false;
  bool answered_while_waiting = false;
  Status observed;
  for (int i = 0; i < 2000 && !connected.load(); ++i) {
    auto s = observer->StatsOf(0);
    if (!s.ok()) {
      observed = s.status();
      break;
    }
    // Writing the restart's checkpoint (the restart is counted) while the Hello waits.
    if (StatsField(*s, "checkpoint_writing") == "true" &&
        StatsField(*s, "worker_restarts") == "1" && !connected.load()) {
      seen_writing = true;
      answered_while_waiting = StatsField(*s, "checkpoints") == "0";
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  restart.join();
  ASSERT_TRUE(observed.ok()) << observed.ToString();
  ASSERT_NE(second, nullptr);
  EXPECT_TRUE(seen_writing) << "the restarted worker's checkpoint was never seen being written";
  EXPECT_TRUE(answered_while_waiting)
      << "the shard did not answer while the restarted worker's Hello waited for its checkpoint";
  EXPECT_EQ(StatsField(at_answer, "checkpoints"), "1")
      << "the Hello was answered before its checkpoint was durable: " << at_answer;
  auto after = observer->StatsOf(0);
  ASSERT_TRUE(after.ok());
  EXPECT_EQ(StatsField(*after, "checkpoints"), "1") << *after;
  EXPECT_EQ(StatsField(*after, "checkpoint_writing"), "false") << *after;
  const std::string log = cluster.ServerLog(0);
  EXPECT_NE(log.find("(worker 0 restarted"), std::string::npos) << log;
  EXPECT_NE(log.find("in the background"), std::string::npos) << log;

  // Durable when the Hello was answered: the file holds worker 0's rows.
  const std::vector<std::string> files = ListCheckpoints(ckpt_, 0);
  ASSERT_EQ(files.size(), 1u);
  testing::SmallShard loaded(testing::ReadFile(cluster.manifest_path()).c_str());
  LoadAndCheckRows(files[0], keys, rows, seed, loaded);
}

// A worker's connection is its own at a restarted shard before any Hello of it is answered: its
// reconnection's Hello reaches the shard while it still loads its checkpoint (answered with the
// progress only), and the pull it resends then is answered once the shard has loaded, with more
// than a connection outside the job's workers may have queued (a sixteenth of
// server.max_queued_reply_bytes, 64 KiB here; the reply is 160 KB). The pull's request names
// the worker's process, which the checkpoint holds: its reply goes out whole.
TEST_F(BackgroundCheckpointTest, AWorkersBigReplyFromARestartedShardIsNotRefusedAsAnOutsiders) {
  TestCluster cluster(1, 1, kTables,
                      Extra() + "server: {max_request_bytes: 1MiB, max_queued_reply_bytes: 1MiB}\n");
  ASSERT_TRUE(cluster.Start());
  std::mt19937_64 rng(11);
  std::vector<uint64_t> keys(5000);
  for (uint64_t i = 0; i < keys.size(); ++i) keys[i] = i * 7919 + 1;
  auto c = cluster.Connect(0);
  ASSERT_NE(c, nullptr);
  PushRandom(*c, keys, rng);
  ASSERT_TRUE(c->Checkpoint().ok());
  std::vector<float> saved(keys.size() * kDim);
  ASSERT_TRUE(c->PullSparse(0, keys, saved.data()).ok());
  KillAndRestartSlowly(cluster);
  if (HasFatalFailure()) return;  // loading takes seconds
  std::vector<float> got(keys.size() * kDim);
  const Status pulled = c->PullSparse(0, keys, got.data());
  ASSERT_TRUE(pulled.ok()) << pulled.ToString();
  EXPECT_EQ(got, saved);
  const std::string log = cluster.ServerLog(0);
  EXPECT_NE(log.find("fault injected at shard.restore"), std::string::npos) << log;
  EXPECT_EQ(log.find("outside the job's workers may have queued"), std::string::npos) << log;
}

TEST_F(BackgroundCheckpointTest, AWorkerWaitsThroughASlowRestoreWithoutFailing) {
  // Requests are resent after 1 s, once: a shard silent for 2 s fails them. The shard is
  // killed and started again with a slow restore (each block of its checkpoint waits 500 ms);
  // it answers meanwhile with its progress, and the worker, connected all along, waits, then
  // replays what the checkpoint missed.
  TestCluster cluster(1, 1, kTables,
                      Extra() + "cluster:\n  request_timeout: 1s\n  request_retries: 1\n");
  ASSERT_TRUE(cluster.Start());
  std::mt19937_64 rng(7);
  std::vector<uint64_t> keys(2000);
  for (uint64_t i = 0; i < keys.size(); ++i) keys[i] = i * 7919;
  auto c = cluster.Connect(0);
  ASSERT_NE(c, nullptr);
  PushRandom(*c, keys, rng);
  ASSERT_TRUE(c->Checkpoint().ok());
  PushRandom(*c, keys, rng);  // after the checkpoint: replayed by the worker
  std::vector<float> saved(keys.size() * kDim);
  ASSERT_TRUE(c->PullSparse(0, keys, saved.data()).ok());
  KillAndRestartSlowly(cluster);
  if (HasFatalFailure()) return;
  const auto start = std::chrono::steady_clock::now();
  std::vector<float> got(keys.size() * kDim);
  const Status pulled = c->PullSparse(0, keys, got.data());
  const double waited =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  ASSERT_TRUE(pulled.ok()) << pulled.ToString();
  EXPECT_EQ(got, saved);  // the checkpoint, and the replay of what came after it
  // Longer than a silent shard is waited for: the progress kept the worker waiting.
  EXPECT_GT(waited, 2.5) << "the restore was not slow: nothing was tested";
  const std::string log = cluster.ServerLog(0);
  EXPECT_NE(log.find("fault injected at shard.restore"), std::string::npos) << log;
  EXPECT_NE(log.find("restored"), std::string::npos) << log;
}

// A plain DEALER socket speaking raw frames to one shard.
class RawPeer {
 public:
  explicit RawPeer(const ServerAddress& a) : socket_(context_, zmq::socket_type::dealer) {
    socket_.set(zmq::sockopt::linger, 0);
    socket_.connect(TcpEndpoint(a.host, a.port));
  }
  // The reply to `op`, or a failed Result after 10 s.
  Result<Header> Call(Op op, uint64_t id) {
    Header h;
    h.op = op;
    h.worker_id = PsClient::kObserver;
    h.request_id = id;
    std::vector<zmq::message_t> frames;
    frames.push_back(EncodeHeader(h));
    PARASOL_RETURN_IF_ERROR(SendFrames(socket_, frames));
    zmq::pollitem_t item{socket_.handle(), 0, ZMQ_POLLIN, 0};
    zmq::poll(&item, 1, std::chrono::milliseconds(10000));
    if (!(item.revents & ZMQ_POLLIN)) return Timeout("no reply within 10 s");
    auto got = RecvFrames(socket_, true);
    if (!got.ok() || !got->has_value()) return Internal("receive failed");
    return DecodeHeader((**got)[0].data(), (**got)[0].size());
  }

 private:
  zmq::context_t context_{1};
  zmq::socket_t socket_;
};

// Hello, asked until the shard says it is loading (the first answers may come before it has
// begun); the last answer.
Result<Header> HelloUntilLoading(RawPeer& peer) {
  Result<Header> hello = Timeout("not asked");
  for (uint64_t i = 1; i <= 50; ++i) {
    hello = peer.Call(Op::Hello, i);
    if (!hello.ok() || hello->restore_total > 0) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return hello;
}

TEST_F(BackgroundCheckpointTest, ARestoringShardAnswersHelloAndStatsWithItsProgress) {
  TestCluster cluster(1, 1, kTables, Extra());
  ASSERT_TRUE(cluster.Start());
  {
    auto c = cluster.Connect(0);
    ASSERT_NE(c, nullptr);
    std::mt19937_64 rng(3);
    std::vector<uint64_t> keys(500);
    for (uint64_t i = 0; i < keys.size(); ++i) keys[i] = i;
    PushRandom(*c, keys, rng);
    ASSERT_TRUE(c->Checkpoint().ok());
  }
  KillAndRestartSlowly(cluster);
  if (HasFatalFailure()) return;
  RawPeer peer(cluster.manifest().cluster.servers[0]);
  Result<Header> hello = HelloUntilLoading(peer);
  ASSERT_TRUE(hello.ok()) << hello.status().ToString();
  ASSERT_GT(hello->restore_total, 0u);
  EXPECT_EQ(hello->status, StatusCode::kUnavailable);
  EXPECT_NE(hello->message.find("loading its checkpoint"), std::string::npos) << hello->message;
  EXPECT_EQ(hello->server_epoch, 0u);  // no process to compare yet
  Result<Header> first = peer.Call(Op::Stats, 100);
  ASSERT_TRUE(first.ok());
  EXPECT_EQ(first->status, StatusCode::kOk);
  EXPECT_EQ(StatsField(first->message, "restoring"), "true") << first->message;
  std::this_thread::sleep_for(std::chrono::milliseconds(1200));  // two blocks or more
  Result<Header> later = peer.Call(Op::Stats, 101);
  ASSERT_TRUE(later.ok());
  const std::string done = StatsField(later->message, "restore_bytes_done");
  ASSERT_FALSE(done.empty()) << later->message;
  EXPECT_GT(std::stoull(done), std::stoull(StatsField(first->message, "restore_bytes_done")))
      << first->message << " then " << later->message;
  EXPECT_EQ(StatsField(later->message, "restore_bytes_total"),
            StatsField(first->message, "restore_bytes_total"));
  // Once loaded, it answers as itself.
  auto observer = cluster.Connect(PsClient::kObserver);
  ASSERT_NE(observer, nullptr);
  auto stats = observer->StatsOf(0);
  ASSERT_TRUE(stats.ok());
  EXPECT_EQ(StatsField(*stats, "restoring"), "");
  EXPECT_EQ(StatsField(*stats, "shard"), "0");
}

TEST_F(BackgroundCheckpointTest, AShardStoppedWhileLoadingStopsAtOnceAndWritesNothing) {
  TestCluster cluster(1, 1, kTables, Extra());
  ASSERT_TRUE(cluster.Start());
  std::vector<uint64_t> keys(500);
  for (uint64_t i = 0; i < keys.size(); ++i) keys[i] = i;
  std::vector<float> saved(keys.size() * kDim);
  {
    auto c = cluster.Connect(0);
    ASSERT_NE(c, nullptr);
    std::mt19937_64 rng(5);
    PushRandom(*c, keys, rng);
    ASSERT_TRUE(c->Checkpoint().ok());
    ASSERT_TRUE(c->PullSparse(0, keys, saved.data()).ok());
  }
  cluster.server(0).Signal(SIGKILL);
  ASSERT_TRUE(cluster.server(0).Wait(std::chrono::seconds(10)).has_value());
  // The checkpoints as they are before the slow load.
  auto listing = [&] {
    std::map<std::string, uintmax_t> files;
    for (const auto& e : std::filesystem::recursive_directory_iterator(ckpt_)) {
      if (e.is_regular_file()) files[e.path().string()] = e.file_size();
    }
    return files;
  };
  const auto before = listing();
  ASSERT_TRUE(cluster.Respawn(0, "shard.restore=slow"));
  RawPeer peer(cluster.manifest().cluster.servers[0]);
  Result<Header> hello = HelloUntilLoading(peer);
  ASSERT_TRUE(hello.ok()) << hello.status().ToString();
  ASSERT_GT(hello->restore_total, 0u) << "it never said it was loading";
  const auto asked = std::chrono::steady_clock::now();
  cluster.server(0).Signal(SIGTERM);
  auto status = cluster.server(0).Wait(std::chrono::seconds(20));
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - asked).count();
  const std::string log = cluster.ServerLog(0);
  ASSERT_TRUE(status.has_value()) << log;
  EXPECT_TRUE(WIFEXITED(*status) && WEXITSTATUS(*status) == 0) << log;
  // Within a block or two (each waits 500 ms twice), not the whole slow load.
  EXPECT_LT(seconds, 3.0) << log;
  EXPECT_NE(log.find("stopped while loading its checkpoint"), std::string::npos) << log;
  EXPECT_EQ(log.find("(on stop)"), std::string::npos) << log;
  EXPECT_EQ(listing(), before);
  // The next start loads the same checkpoint.
  ASSERT_TRUE(cluster.Respawn(0));
  auto c = cluster.Connect(PsClient::kObserver);
  ASSERT_NE(c, nullptr);
  std::vector<float> got(keys.size() * kDim);
  ASSERT_TRUE(c->PullSparseReadOnly(0, keys, got.data()).ok());
  EXPECT_EQ(got, saved);
}

}  // namespace
}  // namespace parasol
