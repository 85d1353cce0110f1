// CURVE authentication and encryption, and the metrics endpoint, with real processes.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include <boost/asio/connect.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/read.hpp>
#include <boost/asio/write.hpp>
#include <limits>
#include <regex>
#include <thread>

#include "common/curve_keys.hpp"
#include "common/membership_macs.hpp"
#include "common/net.hpp"
#include "common/subprocess.hpp"
#include "common/transport.hpp"
#include "common/wire.hpp"
#include "worker/data_generator.hpp"
#include "tests/support/test_cluster.hpp"

namespace parasol {
namespace {

using testing::TestCluster;

constexpr const char* kTables =
    "  - name: emb\n    dim: 4\n    init: {kind: constant, value: 1.0}\n";

class CurveTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!CurveAvailable()) GTEST_SKIP() << "this libzmq has no CURVE support";
    keys_ = testing::MakeTempDir();
    for (const char* name : {"server0", "server1", "worker", "intruder"}) {
      auto k = GenerateCurveKeyPair();
      ASSERT_TRUE(k.ok());
      ASSERT_TRUE(WriteCurveKeyPair(keys_, name, *k).ok());
    }
    security_ = "security:\n  curve: true\n  server_keys: [" + keys_ + "/server0, " + keys_ +
                "/server1]\n  client_key: " + keys_ + "/worker\n  allowed_clients: [" + keys_ +
                "/worker.pub]\n";
  }
  void TearDown() override { testing::RemoveTree(keys_); }
  std::string keys_, security_;
};

TEST_F(CurveTest, AnAllowedWorkerTalksOverCurve) {
  TestCluster cluster(2, 1, kTables, security_);
  ASSERT_TRUE(cluster.Start());
  auto client = PsClient::Connect(cluster.manifest(), 0);
  ASSERT_TRUE(client.ok()) << client.status().ToString();
  for (uint32_t s = 0; s < 2; ++s) EXPECT_EQ((*client)->Mechanism(s), ZMQ_CURVE);
  std::vector<uint64_t> keys = {1, 2, 3};
  std::vector<float> rows(12);
  ASSERT_TRUE((*client)->PullSparse(0, keys, rows.data()).ok());
  EXPECT_EQ(rows, std::vector<float>(12, 1.0f));
}

// `parasol launch` trains a job of two servers and two workers with `security` (YAML), in `dir`.
void ExpectLaunchTrains(const std::string& dir, const std::string& security) {
  GeneratorOptions g;
  g.rows = 8000;
  ASSERT_TRUE(GenerateCriteo(dir + "/train.tsv", g).ok());
  g.rows = 2000;
  g.seed = 5;
  ASSERT_TRUE(GenerateCriteo(dir + "/eval.tsv", g).ok());
  const std::vector<uint16_t> ports = *PickFreePorts(2);
  std::string y = "cluster:\n  servers: [127.0.0.1:" + std::to_string(ports[0]) +
                  ", 127.0.0.1:" + std::to_string(ports[1]) + "]\n  workers: 2\n";
  y += security;
  y += "model: {kind: lr, sparse_optimizer: {kind: adagrad, lr: 0.3}}\n";
  y += "data: {train: " + dir + "/train.tsv, eval: " + dir + "/eval.tsv}\n";
  testing::WriteFile(dir + "/job.yaml", y);
  auto p = Subprocess::Spawn(
      {PARASOL_BINARY, "launch", dir + "/job.yaml", "--summary", dir + "/summary.json"},
      dir + "/launch.log");
  ASSERT_TRUE(p.ok());
  auto st = p->Wait(std::chrono::seconds(120));
  const std::string out = testing::ReadFile(dir + "/launch.log");
  ASSERT_TRUE(st && WIFEXITED(*st) && WEXITSTATUS(*st) == 0) << out;
  const std::string summary = testing::ReadFile(dir + "/summary.json");
  EXPECT_NE(summary.find("\"train_samples\": 8000"), std::string::npos) << summary;
  EXPECT_EQ(out.find("refused a connection"), std::string::npos) << out;
  EXPECT_EQ(out.find("refused: this connection"), std::string::npos) << out;
}

TEST_F(CurveTest, AJobWithSecurityOnTrains) { ExpectLaunchTrains(keys_, security_); }

TEST_F(CurveTest, UnknownAndMissingKeysGetNoAnswerAndAreLogged) {
  TestCluster cluster(2, 1, kTables, security_);
  ASSERT_TRUE(cluster.Start());
  Manifest m = cluster.manifest();
  m.cluster.connect_timeout_ms = 3000;
  // A client with a key pair the servers do not know. Refused at each handshake, it gives up
  // within its connect timeout (a connection refused at the handshake is no reconnection that
  // would stretch its deadline).
  const auto intruder_start = std::chrono::steady_clock::now();
  auto intruder = PsClient::Connect(m, 0, keys_ + "/intruder");
  const auto intruder_took = std::chrono::steady_clock::now() - intruder_start;
  ASSERT_FALSE(intruder.ok());
  EXPECT_EQ(intruder.status().code(), StatusCode::kTimeout) << intruder.status().ToString();
  EXPECT_LT(intruder_took, std::chrono::seconds(10));
  // A plain client with no key at all.
  Manifest plain = m;
  plain.security.curve = false;
  const auto plain_start = std::chrono::steady_clock::now();
  auto none = PsClient::Connect(plain, 0);
  const auto plain_took = std::chrono::steady_clock::now() - plain_start;
  ASSERT_FALSE(none.ok());
  EXPECT_EQ(none.status().code(), StatusCode::kTimeout) << none.status().ToString();
  EXPECT_LT(plain_took, std::chrono::seconds(10));
  // Both were refused by each shard they reached (the client connects to every shard at
  // once; under load one shard's handshake may not have come before the client gave up).
  std::string log;
  for (int i = 0; i < 500; ++i) {
    log = cluster.ServerLog(0) + cluster.ServerLog(1);
    if (log.find("unknown client key") != std::string::npos &&
        log.find("the handshake failed") != std::string::npos) {
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_NE(log.find("refused a connection from"), std::string::npos) << log;
  EXPECT_NE(log.find("unknown client key"), std::string::npos) << log;
  EXPECT_NE(log.find("the handshake failed"), std::string::npos) << log;  // the plain client
  // The allowed worker still gets in.
  auto worker = PsClient::Connect(cluster.manifest(), 0);
  EXPECT_TRUE(worker.ok()) << worker.status().ToString();
}

TEST_F(CurveTest, ASecretKeyOpenToOthersIsRefused) {
  ::chmod((keys_ + "/worker.key").c_str(), 0644);
  TestCluster cluster(2, 1, kTables, security_);
  ASSERT_TRUE(cluster.Start());
  auto client = PsClient::Connect(cluster.manifest(), 0);
  ASSERT_FALSE(client.ok());
  EXPECT_NE(client.status().message().find("is open to others (mode 0644); run chmod 600"),
            std::string::npos)
      << client.status().message();
}

// A job of two workers whose ranks are bound to their own key pairs (security.worker_keys); the
// tools' key is the only allowed_clients key.
class WorkerKeysTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!CurveAvailable()) GTEST_SKIP() << "this libzmq has no CURVE support";
    keys_ = testing::MakeTempDir();
    for (const char* name : {"server0", "tool", "worker0", "worker1"}) {
      auto k = GenerateCurveKeyPair();
      ASSERT_TRUE(k.ok());
      ASSERT_TRUE(WriteCurveKeyPair(keys_, name, *k).ok());
    }
    const std::string k = keys_ + "/";
    security_ = "security:\n  curve: true\n  server_keys: [" + k + "server0]\n  client_key: " + k +
                "tool\n  allowed_clients: [" + k + "tool.pub]\n  worker_keys: [" + k + "worker0, " +
                k + "worker1]\n";
  }
  void TearDown() override { testing::RemoveTree(keys_); }

  std::string keys_, security_;
};

// A DEALER socket speaking raw frames to one shard over CURVE with the key pair `key`, so that
// a test can claim any worker id.
class CurvePeer {
 public:
  CurvePeer(const Manifest& m, uint32_t shard, const std::string& key)
      : socket_(context_, zmq::socket_type::dealer) {
    Result<CurveKeyPair> mine = ReadCurveKeyPair(key);
    Result<std::string> server = ReadCurvePublicKey(m.security.server_keys[shard] + ".pub");
    EXPECT_TRUE(mine.ok() && server.ok());
    if (!mine.ok() || !server.ok()) return;
    socket_.set(zmq::sockopt::linger, 0);
    socket_.set(zmq::sockopt::curve_serverkey, *server);
    socket_.set(zmq::sockopt::curve_publickey, mine->public_key);
    socket_.set(zmq::sockopt::curve_secretkey, mine->secret_key);
    const ServerAddress& a = m.cluster.servers[shard];
    socket_.connect(TcpEndpoint(a.host, a.port));
  }

  // Sends `h` (and `payload`) and returns the reply's header, or a failed Result after 10 s.
  Result<Header> Call(const Header& h, std::vector<zmq::message_t> payload = {}) {
    std::vector<zmq::message_t> frames;
    frames.push_back(EncodeHeader(h));
    for (auto& f : payload) frames.push_back(std::move(f));
    PARASOL_RETURN_IF_ERROR(SendFrames(socket_, frames));
    zmq::pollitem_t item{socket_.handle(), 0, ZMQ_POLLIN, 0};
    zmq::poll(&item, 1, std::chrono::milliseconds(10000));
    if (!(item.revents & ZMQ_POLLIN)) return Timeout("no reply within 10 s");
    auto reply = RecvFrames(socket_, true);
    if (!reply.ok() || !reply->has_value()) return Internal("receive failed");
    return DecodeHeader((**reply)[0].data(), (**reply)[0].size());
  }

 private:
  zmq::context_t context_{1};
  zmq::socket_t socket_;
};

// The shard's "worker_clocks" array, e.g. "[0,0]".
std::string WorkerClocks(PsClient& observer) {
  auto stats = observer.Stats();
  if (!stats.ok() || stats->empty()) return "stats failed: " + stats.status().ToString();
  const std::string& s = (*stats)[0];
  const size_t at = s.find("\"worker_clocks\":");
  if (at == std::string::npos) return "no worker_clocks in " + s;
  const size_t open = s.find('[', at);
  return s.substr(open, s.find(']', open) - open + 1);
}

// The refusal every claim of worker 0 from worker 1's key gets.
void ExpectRefusedAsWorker0(const Result<Header>& reply, const std::string& op) {
  ASSERT_TRUE(reply.ok()) << reply.status().ToString();
  EXPECT_EQ(reply->status, StatusCode::kFailedPrecondition) << reply->message;
  EXPECT_EQ(reply->message, "shard 0: " + op +
                                " as worker 0 refused: this connection's CURVE "
                                "key is not worker 0's key (security.worker_keys[0]); it is worker "
                                "1's key");
}

TEST_F(WorkerKeysTest, WorkerOnesKeyClaimingWorkerZeroIsRefusedAndChangesNothing) {
  TestCluster cluster(1, 2, kTables, security_);
  ASSERT_TRUE(cluster.Start());
  auto worker0 = cluster.Connect(0);  // with its own key, worker_keys[0]
  ASSERT_NE(worker0, nullptr);
  auto observer = PsClient::Connect(cluster.manifest(), PsClient::kObserver);  // the tool key
  ASSERT_TRUE(observer.ok()) << observer.status().ToString();
  const std::vector<uint64_t> keys = {7, 8};
  std::vector<float> before(8), after(8);
  ASSERT_TRUE(worker0->PullSparse(0, keys, before.data()).ok());

  CurvePeer impostor(cluster.manifest(), 0, keys_ + "/worker1");
  Header push;
  push.op = Op::PushSparse;
  push.request_id = 1;
  push.worker_id = 0;
  push.incarnation = 99;
  push.seq = 1;
  push.table_id = 0;
  push.key_count = keys.size();
  push.value_dim = 4;
  push.rows_per_frame = keys.size();
  push.value_frames = 1;
  const std::vector<float> grads(8, 0.5f);
  std::vector<zmq::message_t> payload;
  payload.emplace_back(keys.data(), keys.size() * sizeof(uint64_t));
  payload.emplace_back(grads.data(), grads.size() * sizeof(float));
  ExpectRefusedAsWorker0(impostor.Call(push, std::move(payload)), "PushSparse");
  ASSERT_TRUE(worker0->PullSparse(0, keys, after.data()).ok());
  EXPECT_EQ(after, before) << "the refused push was applied";

  Header clock;
  clock.op = Op::Clock;
  clock.request_id = 2;
  clock.worker_id = 0;
  clock.clock = 1;
  ExpectRefusedAsWorker0(impostor.Call(clock), "Clock");
  EXPECT_EQ(WorkerClocks(**observer), "[0,0]");

  // A barrier that is refused is answered at once instead of being held for worker 1.
  Header barrier;
  barrier.op = Op::Barrier;
  barrier.request_id = 3;
  barrier.worker_id = 0;
  barrier.offset = 1;
  ExpectRefusedAsWorker0(impostor.Call(barrier), "Barrier");

  // The real worker 0 pushes and ticks with its own key.
  ASSERT_TRUE(worker0->PushSparse(0, keys, grads).ok());
  ASSERT_TRUE(worker0->PullSparse(0, keys, after.data()).ok());
  EXPECT_NE(after, before);
  ASSERT_TRUE(worker0->Tick().ok());
  EXPECT_EQ(WorkerClocks(**observer), "[1,0]");
  EXPECT_NE(cluster.ServerLog(0).find("PushSparse as worker 0 refused"), std::string::npos);
}

TEST_F(WorkerKeysTest, UnderCurveAWorkersOwnNonfiniteOrConflictingPushIsRefused) {
  // The guards hold whoever sends: here worker 0's own key, over CURVE.
  TestCluster cluster(1, 2, kTables, security_);
  ASSERT_TRUE(cluster.Start());
  CurvePeer w0(cluster.manifest(), 0, keys_ + "/worker0");
  auto push = [&](uint64_t seq, float value) {
    Header h;
    h.op = Op::PushSparse;
    h.worker_id = 0;
    h.request_id = seq;
    h.seq = seq;
    h.incarnation = 11;
    h.table_id = 0;
    h.key_count = 1;
    h.value_dim = 4;
    h.rows_per_frame = 1;
    h.value_frames = 1;
    const uint64_t key = 77;
    const float row[4] = {value, value, value, value};
    std::vector<zmq::message_t> payload;
    payload.emplace_back(&key, 8);
    payload.emplace_back(row, sizeof(row));
    return w0.Call(h, std::move(payload));
  };
  Result<Header> r = push(1, std::numeric_limits<float>::quiet_NaN());
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->status, StatusCode::kInvalidArgument);
  EXPECT_NE(r->message.find("the row of key 77, element 0 is not finite"), std::string::npos)
      << r->message;
  r = push(2, 0.5f);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->status, StatusCode::kOk) << r->message;
  r = push(2, -0.5f);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->status, StatusCode::kFailedPrecondition);
  EXPECT_NE(r->message.find("was applied before with another payload"), std::string::npos)
      << r->message;
  auto tool = PsClient::Connect(cluster.manifest(), PsClient::kObserver);
  ASSERT_TRUE(tool.ok()) << tool.status().ToString();
  auto stats = (*tool)->Stats();
  ASSERT_TRUE(stats.ok());
  EXPECT_NE((*stats)[0].find("\"nonfinite_pushes\":1"), std::string::npos) << (*stats)[0];
  EXPECT_NE((*stats)[0].find("\"conflicting_resends\":1"), std::string::npos) << (*stats)[0];
}

TEST_F(WorkerKeysTest, UnderCurveAdmittedPeersThatNeverReadGetTheirShareAndWorkersTrain) {
  TestCluster cluster(1, 2, kTables,
                      security_ + "training:\n  consistency: bsp\n  worker_timeout: 60s\n"
                                  "server:\n  max_request_bytes: 4MiB\n"
                                  "  max_queued_reply_bytes: 8MiB\n");
  ASSERT_TRUE(cluster.Start());
  auto w0 = cluster.Connect(0);
  auto w1 = cluster.Connect(1);
  ASSERT_NE(w0, nullptr);
  ASSERT_NE(w1, nullptr);
  // Three peers with the tools' admitted key ask for 128 KiB pulls and never read.
  const Manifest& m = cluster.manifest();
  Result<CurveKeyPair> tool = ReadCurveKeyPair(keys_ + "/tool");
  Result<std::string> server = ReadCurvePublicKey(m.security.server_keys[0] + ".pub");
  ASSERT_TRUE(tool.ok() && server.ok());
  zmq::context_t ctx(1);
  std::vector<zmq::socket_t> sinks;
  std::vector<uint64_t> keys(8192);
  for (size_t i = 0; i < keys.size(); ++i) keys[i] = i;
  for (int a = 0; a < 3; ++a) {
    zmq::socket_t sink(ctx, zmq::socket_type::dealer);
    sink.set(zmq::sockopt::rcvhwm, 1);
    sink.set(zmq::sockopt::rcvbuf, 4096);
    sink.set(zmq::sockopt::linger, 0);
    sink.set(zmq::sockopt::curve_serverkey, *server);
    sink.set(zmq::sockopt::curve_publickey, tool->public_key);
    sink.set(zmq::sockopt::curve_secretkey, tool->secret_key);
    sink.connect(TcpEndpoint(m.cluster.servers[0].host, m.cluster.servers[0].port));
    for (uint64_t i = 0; i < 200; ++i) {
      Header pull;
      pull.op = Op::PullSparse;
      pull.worker_id = PsClient::kObserver - a;
      pull.request_id = i;
      pull.table_id = 0;
      pull.key_count = keys.size();
      pull.value_dim = 4;
      std::vector<zmq::message_t> f;
      f.push_back(EncodeHeader(pull));
      f.emplace_back(keys.data(), keys.size() * 8);
      ASSERT_TRUE(SendFrames(sink, f).ok());
    }
    sinks.push_back(std::move(sink));
  }
  double seconds = 0;
  const Status trained = testing::TrainWorkersTogether({w0.get(), w1.get()}, 20, &seconds);
  ASSERT_TRUE(trained.ok()) << trained.ToString();
  EXPECT_LT(seconds, 30.0);
  auto observer = PsClient::Connect(m, PsClient::kObserver);
  ASSERT_TRUE(observer.ok()) << observer.status().ToString();
  std::string text;
  for (int i = 0; i < 100; ++i) {
    auto st = (*observer)->Stats();
    ASSERT_TRUE(st.ok());
    text = (*st)[0];
    if (text.find("\"peer_refusals\":0,") == std::string::npos) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  EXPECT_EQ(text.find("\"peer_refusals\":0,"), std::string::npos) << text;
  EXPECT_NE(text.find("\"members\":2"), std::string::npos) << text;
  EXPECT_NE(text.find("\"worker_clocks\":[20,20]"), std::string::npos) << text;
}

TEST(SignedMembershipTest, OnlyEntriesShardZeroSignedAreTakenFromAWorkersKey) {
  if (!CurveAvailable()) GTEST_SKIP() << "this libzmq has no CURVE support";
  const std::string keys = testing::MakeTempDir();
  for (const char* name : {"server0", "server1", "tool", "worker0", "worker1", "worker2"}) {
    auto k = GenerateCurveKeyPair();
    ASSERT_TRUE(k.ok());
    ASSERT_TRUE(WriteCurveKeyPair(keys, name, *k).ok());
  }
  const std::string k = keys + "/";
  TestCluster cluster(2, 2, kTables,
                      "security:\n  curve: true\n  server_keys: [" + k + "server0, " + k +
                          "server1]\n  client_key: " + k + "tool\n  allowed_clients: [" + k +
                          "tool.pub]\n  worker_keys: [" + k + "worker0, " + k + "worker1, " + k +
                          "worker2]\n",
                      {}, /*max_workers=*/3);
  ASSERT_TRUE(cluster.Start());
  auto w0 = cluster.Connect(0);
  auto w1 = cluster.Connect(1);
  ASSERT_NE(w0, nullptr);
  ASSERT_NE(w1, nullptr);
  const Manifest& m = cluster.manifest();
  // Worker 1's own key relays to shard 1 that worker 0 leaves at clock 3: shard 0 never named
  // it, so it is left out (before, it was taken, and worker 0 removed at that clock).
  CurvePeer forger(m, 1, k + "worker1");
  Header tick;
  tick.op = Op::Clock;
  tick.worker_id = 1;
  tick.clock = 0;
  tick.request_id = 77;
  tick.incarnation = 5;
  tick.caught_up = true;
  tick.members = {MemberEntry{0, -1, 3}};
  tick.membership_version = 1;
  tick.member_macs.assign(2 * MembershipMacs::kMacBytes, 0x5a);  // not shard 0's
  Result<Header> r = forger.Call(tick);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  auto observer = PsClient::Connect(m, PsClient::kObserver);
  ASSERT_TRUE(observer.ok()) << observer.status().ToString();
  auto stats = (*observer)->StatsOf(1);
  ASSERT_TRUE(stats.ok()) << stats.status().ToString();
  EXPECT_NE(stats->find("\"unsigned_member_entries\":1"), std::string::npos) << *stats;
  EXPECT_NE(stats->find("\"membership\":[]"), std::string::npos) << *stats;
  // What shard 0 names does travel: worker 2 joins (shard 0 names its clock), and shard 1
  // takes the entry its Hello relays, with shard 0's MAC.
  auto joiner = PsClient::Connect(m, 2, k + "worker2", {}, /*join=*/true);
  ASSERT_TRUE(joiner.ok()) << joiner.status().ToString();
  stats = (*observer)->StatsOf(1);
  ASSERT_TRUE(stats.ok());
  EXPECT_NE(stats->find("\"worker\":2"), std::string::npos) << *stats;
  EXPECT_NE(stats->find("\"unsigned_member_entries\":1"), std::string::npos) << *stats;
  testing::RemoveTree(keys);
}

TEST_F(WorkerKeysTest, AJobWhoseWorkersHaveTheirOwnKeysTrains) {
  auto server1 = GenerateCurveKeyPair();
  ASSERT_TRUE(server1.ok());
  ASSERT_TRUE(WriteCurveKeyPair(keys_, "server1", *server1).ok());
  const std::string k = keys_ + "/";
  ExpectLaunchTrains(keys_, "security:\n  curve: true\n  server_keys: [" + k + "server0, " + k +
                                "server1]\n  client_key: " + k + "tool\n  allowed_clients: [" + k +
                                "tool.pub]\n  worker_keys: [" + k + "worker0, " + k + "worker1]\n");
}

TEST_F(WorkerKeysTest, EachKeyActsOnlyAsItsOwnRole) {
  TestCluster cluster(1, 2, kTables, security_);
  ASSERT_TRUE(cluster.Start());
  // A worker started with another worker's key cannot even say Hello.
  auto wrong = PsClient::Connect(cluster.manifest(), 0, keys_ + "/worker1");
  ASSERT_FALSE(wrong.ok());
  EXPECT_NE(wrong.status().message().find(
                "Hello as worker 0 refused: this connection's CURVE key is not worker 0's key"),
            std::string::npos)
      << wrong.status().ToString();
  // The tools' key may not act as a worker.
  auto tool = PsClient::Connect(cluster.manifest(), 1, keys_ + "/tool");
  ASSERT_FALSE(tool.ok());
  EXPECT_NE(tool.status().message().find("it is a tool key (security.allowed_clients)"),
            std::string::npos)
      << tool.status().ToString();
  // A worker's key may not act as an observer (stats, checkpoint, shutdown).
  auto observer = PsClient::Connect(cluster.manifest(), PsClient::kObserver, keys_ + "/worker1");
  ASSERT_FALSE(observer.ok());
  EXPECT_NE(observer.status().message().find("which may act only as worker 1"), std::string::npos)
      << observer.status().ToString();
  // Each worker with its own key, and the tool as an observer, are served.
  for (uint32_t w : {0u, 1u}) EXPECT_NE(cluster.Connect(w), nullptr);
  auto stats = PsClient::Connect(cluster.manifest(), PsClient::kObserver);
  EXPECT_TRUE(stats.ok()) << stats.status().ToString();
}

TEST_F(CurveTest, WithOperatorKeysOnlyAnOperatorCheckpointsOrStopsTheJob) {
  auto k = GenerateCurveKeyPair();
  ASSERT_TRUE(k.ok());
  ASSERT_TRUE(WriteCurveKeyPair(keys_, "operator", *k).ok());
  TestCluster cluster(2, 1, kTables,
                      security_ + "  operator_keys: [" + keys_ + "/operator]\n" +
                          "checkpoint:\n  dir: ckpt\n");
  ASSERT_TRUE(cluster.Start());
  // The workers' key (also the tools' default): trains, reads stats, and controls nothing.
  auto worker = cluster.Connect(0);
  ASSERT_NE(worker, nullptr);
  auto tool = PsClient::Connect(cluster.manifest(), PsClient::kObserver);
  ASSERT_TRUE(tool.ok()) << tool.status().ToString();
  EXPECT_TRUE((*tool)->Stats().ok());
  for (const Status& st : {(*tool)->Checkpoint(), (*tool)->Shutdown()}) {
    EXPECT_EQ(st.code(), StatusCode::kFailedPrecondition) << st.ToString();
    EXPECT_NE(st.message().find("is an operator's request, and this connection's CURVE key is "
                                "not one of security.operator_keys"),
              std::string::npos)
        << st.ToString();
  }
  auto stats = (*tool)->Stats();
  ASSERT_TRUE(stats.ok());
  for (const std::string& shard : *stats) {
    EXPECT_NE(shard.find("\"checkpoints\":0"), std::string::npos) << shard;
  }
  // The operator's key does both.
  auto op = PsClient::Connect(cluster.manifest(), PsClient::kObserver, keys_ + "/operator");
  ASSERT_TRUE(op.ok()) << op.status().ToString();
  EXPECT_TRUE((*op)->Checkpoint().ok());
  stats = (*tool)->Stats();
  ASSERT_TRUE(stats.ok());
  for (const std::string& shard : *stats) {
    EXPECT_NE(shard.find("\"checkpoints\":1"), std::string::npos) << shard;
  }
  // ... but is no worker.
  auto as_worker = PsClient::Connect(cluster.manifest(), 0, keys_ + "/operator");
  ASSERT_FALSE(as_worker.ok());
  EXPECT_NE(as_worker.status().message().find("an operator key acts only as a tool"),
            std::string::npos)
      << as_worker.status().ToString();
}

TEST(ProtectedModeTest, AShardThatWouldServeOtherHostsWithoutKeysRefusesToStart) {
  const std::string dir = testing::MakeTempDir();
  const uint16_t port = PickFreePorts(1).value()[0];
  const std::string m = dir + "/m.yaml";
  testing::WriteFile(m, "cluster:\n  servers: [127.0.0.1:" + std::to_string(port) +
                            "]\n  workers: 1\n  bind: 0.0.0.0\n"
                            "tables:\n  - {name: emb, kind: sparse, dim: 8}\n");
  auto server = Subprocess::Spawn({PARASOL_BINARY, "server", "--manifest", m, "--rank", "0"},
                                  dir + "/server.log");
  ASSERT_TRUE(server.ok());
  auto status = server->Wait(std::chrono::seconds(30));
  const std::string log = testing::ReadFile(dir + "/server.log");
  ASSERT_TRUE(status.has_value()) << "the shard started: " << log;
  EXPECT_TRUE(WIFEXITED(*status) && WEXITSTATUS(*status) != 0) << log;
  EXPECT_NE(log.find("refusing to bind tcp://0.0.0.0:" + std::to_string(port) +
                     " without security"),
            std::string::npos)
      << log;
  EXPECT_NE(log.find("security.mode: insecure"), std::string::npos) << log;
  testing::RemoveTree(dir);
}

TEST_F(WorkerKeysTest, KeygenWritesOneKeyPairPerWorker) {
  auto p = Subprocess::Spawn(
      {PARASOL_BINARY, "keygen", "--out", keys_ + "/made", "--name", "worker", "--count", "2"},
      keys_ + "/keygen.log");
  ASSERT_TRUE(p.ok());
  auto st = p->Wait(std::chrono::seconds(30));
  ASSERT_TRUE(st && WIFEXITED(*st) && WEXITSTATUS(*st) == 0)
      << testing::ReadFile(keys_ + "/keygen.log");
  auto k0 = ReadCurveKeyPair(keys_ + "/made/worker0");
  auto k1 = ReadCurveKeyPair(keys_ + "/made/worker1");
  ASSERT_TRUE(k0.ok()) << k0.status().ToString();
  ASSERT_TRUE(k1.ok()) << k1.status().ToString();
  EXPECT_NE(k0->public_key, k1->public_key);
  EXPECT_EQ(*ReadCurvePublicKey(keys_ + "/made/worker1"), k1->public_key);
}

// GET `path` from 127.0.0.1:port: status line and body.
std::pair<std::string, std::string> HttpGet(uint16_t port, const std::string& path) {
  namespace asio = boost::asio;
  asio::io_context io;
  asio::ip::tcp::socket socket(io);
  boost::system::error_code ec;
  socket.connect({asio::ip::make_address("127.0.0.1"), port}, ec);
  if (ec) return {"", ""};
  const std::string req = "GET " + path + " HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n";
  asio::write(socket, asio::buffer(req), ec);
  std::string response;
  char buf[4096];
  while (true) {
    const size_t n = socket.read_some(asio::buffer(buf), ec);
    response.append(buf, n);
    if (ec) break;
  }
  const size_t head_end = response.find("\r\n\r\n");
  return {response.substr(0, response.find("\r\n")),
          head_end == std::string::npos ? "" : response.substr(head_end + 4)};
}

double MetricValue(const std::string& text, const std::string& sample) {
  const size_t p = text.find(sample + " ");
  return p == std::string::npos ? -1 : std::atof(text.c_str() + p + sample.size() + 1);
}

TEST(MetricsTest, ScrapesParseAsPrometheusTextAndCountersMove) {
  const std::vector<uint16_t> ports = *PickFreePorts(2);  // metrics, then the server
  const uint16_t port = ports[0];
  TestCluster cluster(1, 1, kTables,
                      "metrics:\n  enabled: true\n  port: " + std::to_string(port) + "\n",
                      {ports[1]});
  ASSERT_TRUE(cluster.Start());
  auto client = cluster.Connect(0);
  ASSERT_NE(client, nullptr);
  auto [status, health] = HttpGet(port, "/healthz");
  EXPECT_EQ(status, "HTTP/1.1 200 OK");
  EXPECT_EQ(health, "ok\n");
  std::vector<uint64_t> keys = {1, 2, 3, 4};
  std::vector<float> rows(16), grads(16, 0.5f);
  const std::string pulls = "parasol_requests_total{shard=\"0\",op=\"PullSparse\"}";
  // The shard publishes a snapshot every 250 ms: scrape until it shows `want` pulls (10 s).
  auto scrape_until = [&](double want) {
    std::string text;
    for (int i = 0; i < 200 && MetricValue(text, pulls) != want; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      text = HttpGet(port, "/metrics").second;
    }
    return text;
  };
  ASSERT_TRUE(client->PullSparse(0, keys, rows.data()).ok());
  const std::string before = scrape_until(1);
  ASSERT_TRUE(client->PushSparse(0, keys, grads).ok());
  ASSERT_TRUE(client->PullSparse(0, keys, rows.data()).ok());
  const std::string after = scrape_until(2);
  // Every line is a comment or `name{labels} value`.
  const std::regex sample(R"(^[a-zA-Z_:][a-zA-Z0-9_:]*(\{[^}]*\})? [-+0-9.eEInf]+$)");
  size_t samples = 0;
  std::istringstream lines(after);
  for (std::string line; std::getline(lines, line);) {
    if (line.rfind("# HELP ", 0) == 0 || line.rfind("# TYPE ", 0) == 0) continue;
    EXPECT_TRUE(std::regex_match(line, sample)) << "not Prometheus text: " << line;
    ++samples;
  }
  EXPECT_GT(samples, 20u);
  EXPECT_EQ(MetricValue(before, pulls), 1) << before;
  EXPECT_EQ(MetricValue(after, pulls), MetricValue(before, pulls) + 1) << after;
  const std::string pushes = "parasol_requests_total{shard=\"0\",op=\"PushSparse\"}";
  EXPECT_EQ(MetricValue(after, pushes), MetricValue(before, pushes) + 1);
  EXPECT_EQ(MetricValue(after, "parasol_table_rows{shard=\"0\",table=\"emb\"}"), 4);
  EXPECT_GT(MetricValue(after, "parasol_request_bytes_total{shard=\"0\",op=\"PushSparse\"}"), 0);
  EXPECT_NE(after.find("parasol_pull_wait_seconds_bucket{shard=\"0\",le=\"+Inf\"}"),
            std::string::npos);
  EXPECT_EQ(MetricValue(after, "parasol_checkpoint_age_seconds{shard=\"0\"}"), -1);
  // The two pulls of a worker of the job were never held: both in the first bucket.
  EXPECT_EQ(MetricValue(after, "parasol_pull_wait_seconds_bucket{shard=\"0\",le=\"0.001\"}"), 2);
  EXPECT_EQ(MetricValue(after, "parasol_pull_wait_seconds_count{shard=\"0\"}"), 2);
  EXPECT_GT(MetricValue(after, "process_resident_memory_bytes{shard=\"0\"}"), 1e6);
  EXPECT_GT(MetricValue(after, "process_cpu_seconds_total{shard=\"0\"}"), 0);
  EXPECT_EQ(HttpGet(port, "/nope").first, "HTTP/1.1 404 Not Found");
}

}  // namespace
}  // namespace parasol
