// Malformed and repeated messages sent straight to a real shard over a raw DEALER socket.
#include <gtest/gtest.h>

#include <atomic>
#include <fstream>
#include <functional>
#include <limits>
#include <optional>
#include <random>
#include <sstream>
#include <thread>

#include <csignal>
#include <sys/resource.h>


#include "common/initializer.hpp"
#include "common/net.hpp"
#include "common/subprocess.hpp"
#include "common/transport.hpp"
#include "common/wire.hpp"
#include "tests/support/json_figures.hpp"
#include "tests/support/test_cluster.hpp"

namespace parasol {
namespace {

using testing::JsonAt;
using testing::ResidentBytes;
using testing::TestCluster;

constexpr const char* kTables =
    "  - name: emb\n"
    "    kind: sparse\n"
    "    dim: 4\n"
    "    init: {kind: constant, value: 1.0}\n"
    "    optimizer: {kind: sgd, lr: 0.5}\n"
    "  - name: bias\n"
    "    kind: dense\n"
    "    shape: [10]\n"
    "    init: {kind: zeros}\n";

// A plain DEALER socket that speaks raw frames to one shard.
class RawPeer {
 public:
  explicit RawPeer(const ServerAddress& a) : socket_(context_, zmq::socket_type::dealer) {
    socket_.set(zmq::sockopt::linger, 0);
    socket_.connect(TcpEndpoint(a.host, a.port));
  }

  void Send(std::vector<zmq::message_t> frames) { ASSERT_TRUE(SendFrames(socket_, frames).ok()); }

  // The reply's header, or a failed Result after 10 s.
  Result<Header> Reply(std::vector<zmq::message_t>* payload = nullptr) {
    zmq::pollitem_t item{socket_.handle(), 0, ZMQ_POLLIN, 0};
    zmq::poll(&item, 1, std::chrono::milliseconds(10000));
    if (!(item.revents & ZMQ_POLLIN)) return Timeout("no reply within 10 s");
    auto frames = RecvFrames(socket_, true);
    if (!frames.ok() || !frames->has_value()) return Internal("receive failed");
    auto& f = **frames;
    Result<Header> h = DecodeHeader(f[0].data(), f[0].size());
    if (payload) {
      payload->clear();
      for (size_t i = 1; i < f.size(); ++i) payload->push_back(std::move(f[i]));
    }
    return h;
  }

  // Sends `frames` and returns the reply's header (a failed expectation, and an empty header,
  // when none comes).
  Header Call(std::vector<zmq::message_t> frames) {
    Send(std::move(frames));
    Result<Header> r = Reply();
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    return r.ok() ? *r : Header{};
  }

 private:
  zmq::context_t context_{1};
  zmq::socket_t socket_;
};

std::vector<zmq::message_t> Frames(const Header& h) {
  std::vector<zmq::message_t> f;
  f.push_back(EncodeHeader(h));
  return f;
}

zmq::message_t Bytes(const void* data, size_t n) { return zmq::message_t(data, n); }

Header Push(uint64_t seq, uint64_t keys) {
  Header h;
  h.op = Op::PushSparse;
  h.request_id = seq;
  h.seq = seq;
  h.incarnation = 77;
  h.table_id = 0;
  h.key_count = keys;
  h.value_dim = 4;
  h.rows_per_frame = keys;
  h.value_frames = keys ? 1 : 0;
  return h;
}

class HostileInputTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(cluster_.Start());
    client_ = cluster_.Connect(0);
    ASSERT_NE(client_, nullptr);
    peer_ = std::make_unique<RawPeer>(cluster_.manifest().cluster.servers[0]);
  }

  // The shard still answers a correct pull with correct values.
  // send(false) sends a push; send(true), the same push's name (worker, clock, index) with
  // another payload. The first is applied, the second refused as a resend with another payload,
  // the first again answered as a duplicate; `key`'s row (1.0 at first, SGD at 0.5, gradient
  // 1) holds the one update.
  void ExpectOneApplyOneConflictOneDuplicate(uint64_t key,
                                             const std::function<Result<Header>(bool)>& send) {
    Result<Header> r = send(false);
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    ASSERT_EQ(r->status, StatusCode::kOk) << r->message;
    r = send(true);
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    EXPECT_EQ(r->status, StatusCode::kFailedPrecondition) << r->message;
    EXPECT_FALSE(r->duplicate);
    EXPECT_NE(r->message.find("was applied before with another payload"), std::string::npos)
        << r->message;
    r = send(false);  // the very push again: a duplicate, answered as one
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    EXPECT_EQ(r->status, StatusCode::kOk) << r->message;
    EXPECT_TRUE(r->duplicate);
    std::vector<uint64_t> keys = {key};
    std::vector<float> row(4);
    ASSERT_TRUE(client_->PullSparse(0, keys, row.data()).ok());
    EXPECT_EQ(row, std::vector<float>(4, 0.5f));  // 1.0 - 0.5 x 1, once
    auto stats = client_->Stats();
    ASSERT_TRUE(stats.ok());
    EXPECT_EQ(JsonAt((*stats)[0], "/conflicting_resends", -1), 1) << (*stats)[0];
    EXPECT_EQ(JsonAt((*stats)[0], "/duplicate_pushes", -1), 1) << (*stats)[0];
  }

  void ExpectShardStillServes() {
    std::vector<uint64_t> keys = {424242};
    std::vector<float> row(4);
    Status st = client_->PullSparse(0, keys, row.data());
    ASSERT_TRUE(st.ok()) << st.ToString();
    EXPECT_EQ(row, std::vector<float>(4, 1.0f));
  }

  // Sends `frames` and expects an error reply whose message contains `needle`.
  void ExpectError(std::vector<zmq::message_t> frames, const std::string& needle) {
    peer_->Send(std::move(frames));
    Result<Header> r = peer_->Reply();
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    EXPECT_TRUE(r->is_reply);
    EXPECT_NE(r->status, StatusCode::kOk);
    EXPECT_NE(r->message.find(needle), std::string::npos)
        << "error '" << r->message << "' does not mention '" << needle << "'";
  }

  TestCluster cluster_{1, 1, kTables};
  std::unique_ptr<PsClient> client_;
  std::unique_ptr<RawPeer> peer_;
};

TEST_F(HostileInputTest, GarbageFrameGetsAnErrorReplyAndTheShardServesOn) {
  std::mt19937_64 rng(9);
  for (int i = 0; i < 20; ++i) {
    std::vector<uint8_t> junk(1 + rng() % 300);
    for (auto& b : junk) b = static_cast<uint8_t>(rng());
    std::vector<zmq::message_t> f;
    f.push_back(Bytes(junk.data(), junk.size()));
    ExpectError(std::move(f), "header frame");
  }
  ExpectShardStillServes();
}

TEST_F(HostileInputTest, TruncatedHeaderIsRefused) {
  zmq::message_t full = EncodeHeader(Push(1, 1));
  std::vector<zmq::message_t> f;
  f.push_back(Bytes(full.data(), full.size() / 2));
  ExpectError(std::move(f), "");
  ExpectShardStillServes();
}

TEST_F(HostileInputTest, WrongProtocolVersionIsRefused) {
  Header h;
  h.op = Op::Hello;
  h.version = kProtocolVersion + 1;
  ExpectError(Frames(h), "protocol version " + std::to_string(kProtocolVersion + 1));
}

TEST_F(HostileInputTest, PayloadShorterThanTheHeaderSaysIsRefused) {
  std::vector<zmq::message_t> f = Frames(Push(1, 3));
  const uint64_t keys[3] = {1, 2, 3};
  f.push_back(Bytes(keys, 16));  // two keys where the header says three
  const float vals[12] = {};
  f.push_back(Bytes(vals, sizeof(vals)));
  ExpectError(std::move(f), "keys frame has 16 bytes");
  ExpectShardStillServes();
}

TEST_F(HostileInputTest, MissingFramesAreRefused) {
  ExpectError(Frames(Push(1, 3)), "expected 2 payload frames, got 0");
}

TEST_F(HostileInputTest, OversizedCountsAreRefusedWithoutAllocating) {
  Header h = Push(1, 1);
  h.key_count = uint64_t{1} << 50;
  h.rows_per_frame = 1;
  h.value_frames = 1;
  std::vector<zmq::message_t> f = Frames(h);
  const uint64_t key = 1;
  f.push_back(Bytes(&key, 8));
  f.push_back(Bytes(&key, 8));
  ExpectError(std::move(f), "server.max_request_bytes");
  // A dense pull asking for 2^60 elements.
  Header pull;
  pull.op = Op::PullDense;
  pull.table_id = 1;
  pull.key_count = uint64_t{1} << 60;
  pull.value_dim = 1;
  ExpectError(Frames(pull), "outside this shard's slice");
  ExpectShardStillServes();
}

TEST(HostileReplyTest, APullWhoseReplyWouldExceedTheLimitIsRefused) {
  // Keys of 8 bytes ask for rows of 4 floats: a 16 KiB limit admits 2048 keys but only 1024
  // rows of reply.
  TestCluster cluster(1, 1, kTables, "server:\n  max_request_bytes: 16KiB\n");
  ASSERT_TRUE(cluster.Start());
  auto client = cluster.Connect(0);
  ASSERT_NE(client, nullptr);
  std::vector<uint64_t> keys(1500);
  for (size_t i = 0; i < keys.size(); ++i) keys[i] = i;
  std::vector<float> rows(keys.size() * 4);
  Status st = client->PullSparse(0, keys, rows.data());
  ASSERT_EQ(st.code(), StatusCode::kResourceExhausted) << st.ToString();
  EXPECT_NE(st.message().find("server.max_request_bytes"), std::string::npos);
  keys.resize(1000);  // within the limit
  EXPECT_TRUE(client->PullSparse(0, keys, rows.data()).ok());
}

TEST_F(HostileInputTest, UnknownTableAndWrongDimAreRefused) {
  Header h;
  h.op = Op::PullSparse;
  h.table_id = 9;
  h.key_count = 1;
  h.value_dim = 4;
  std::vector<zmq::message_t> f = Frames(h);
  const uint64_t key = 1;
  f.push_back(Bytes(&key, 8));
  ExpectError(std::move(f), "no table with id 9");
  h.table_id = 0;
  h.value_dim = 5;
  f = Frames(h);
  f.push_back(Bytes(&key, 8));
  ExpectError(std::move(f), "has dim 4, request says 5");
  ExpectShardStillServes();
}

TEST_F(HostileInputTest, AReplyOpSentAsARequestIsRefused) {
  Header h;
  h.op = Op::Stats;
  h.is_reply = true;
  ExpectError(Frames(h), "expected a request");
}

TEST_F(HostileInputTest, ARepeatedPushIsAppliedOnce) {
  const uint64_t key = 5150;
  const float grad[4] = {1.0f, 2.0f, -2.0f, 0.5f};
  for (int attempt = 0; attempt < 3; ++attempt) {
    std::vector<zmq::message_t> f = Frames(Push(/*seq=*/1, 1));
    f.push_back(Bytes(&key, 8));
    f.push_back(Bytes(grad, sizeof(grad)));
    peer_->Send(std::move(f));
    Result<Header> r = peer_->Reply();
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    ASSERT_EQ(r->status, StatusCode::kOk) << r->message;
    EXPECT_EQ(r->duplicate, attempt > 0);
  }
  std::vector<uint64_t> keys = {key};
  std::vector<float> row(4);
  ASSERT_TRUE(client_->PullSparse(0, keys, row.data()).ok());
  // 1.0 - 0.5 * grad, once.
  EXPECT_EQ(row, (std::vector<float>{0.5f, 0.0f, 2.0f, 0.75f}));
  // A new sequence number is a new push.
  std::vector<zmq::message_t> f = Frames(Push(/*seq=*/2, 1));
  f.push_back(Bytes(&key, 8));
  f.push_back(Bytes(grad, sizeof(grad)));
  peer_->Send(std::move(f));
  ASSERT_TRUE(peer_->Reply().ok());
  ASSERT_TRUE(client_->PullSparse(0, keys, row.data()).ok());
  EXPECT_EQ(row, (std::vector<float>{0.0f, -1.0f, 3.0f, 0.5f}));
  auto stats = client_->Stats();
  ASSERT_TRUE(stats.ok());
  EXPECT_NE((*stats)[0].find("\"duplicate_pushes\":2"), std::string::npos) << (*stats)[0];
}

TEST_F(HostileInputTest, APushWithANonfiniteValueIsRefusedWholeAndNamed) {
  // Two rows, the second with a NaN: neither is applied.
  const uint64_t keys[2] = {61, 62};
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float grads[8] = {1, 1, 1, 1, 2, 2, nan, 2};
  std::vector<zmq::message_t> f = Frames(Push(/*seq=*/1, 2));
  f.push_back(Bytes(keys, sizeof(keys)));
  f.push_back(Bytes(grads, sizeof(grads)));
  ExpectError(std::move(f), "table 'emb': the row of key 62, element 2 is not finite");
  // A dense push with an infinity, at element 3 of the slice.
  Header dense = Push(/*seq=*/2, 0);
  dense.op = Op::PushDense;
  dense.table_id = 1;
  dense.key_count = 4;
  dense.value_dim = 1;
  dense.rows_per_frame = 4;
  dense.value_frames = 1;
  dense.offset = 2;
  const float inf[4] = {0.5f, 0.5f, 0.5f, std::numeric_limits<float>::infinity()};
  f = Frames(dense);
  f.push_back(Bytes(inf, sizeof(inf)));
  ExpectError(std::move(f), "table 'bias': the element 5 is not finite");
  // Nothing of either was applied, and the same names with finite values are new pushes.
  std::vector<uint64_t> pulled = {61, 62};
  std::vector<float> rows(8);
  ASSERT_TRUE(client_->PullSparse(0, pulled, rows.data()).ok());
  EXPECT_EQ(rows, std::vector<float>(8, 1.0f));
  std::vector<float> bias(10, -1.0f);
  ASSERT_TRUE(client_->PullDense(1, bias.data()).ok());
  EXPECT_EQ(bias, std::vector<float>(10, 0.0f));
  const float fine[8] = {1, 1, 1, 1, 2, 2, 2, 2};
  f = Frames(Push(/*seq=*/1, 2));
  f.push_back(Bytes(keys, sizeof(keys)));
  f.push_back(Bytes(fine, sizeof(fine)));
  peer_->Send(std::move(f));
  Result<Header> r = peer_->Reply();
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->status, StatusCode::kOk) << r->message;
  EXPECT_FALSE(r->duplicate);
  ASSERT_TRUE(client_->PullSparse(0, pulled, rows.data()).ok());
  EXPECT_EQ(rows, (std::vector<float>{0.5f, 0.5f, 0.5f, 0.5f, 0, 0, 0, 0}));
  auto stats = client_->Stats();
  ASSERT_TRUE(stats.ok());
  EXPECT_EQ(JsonAt((*stats)[0], "/nonfinite_pushes", -1), 2) << (*stats)[0];
}

TEST_F(HostileInputTest, FinitePushesWhoseUpdateOverflowsLeaveTheRowAsItWas) {
  // Finite gradients of 3e38 at learning rate 0.5: the first two updates are finite (-1.5e38,
  // then -3e38); the third would be -4.5e38, past float's range, and is not made.
  const uint64_t key = 81;
  const float big[4] = {3e38f, 3e38f, 3e38f, 3e38f};
  for (uint64_t seq = 1; seq <= 3; ++seq) {
    std::vector<zmq::message_t> f = Frames(Push(seq, 1));
    f.push_back(Bytes(&key, 8));
    f.push_back(Bytes(big, sizeof(big)));
    peer_->Send(std::move(f));
    Result<Header> r = peer_->Reply();
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    ASSERT_EQ(r->status, StatusCode::kOk) << r->message;
  }
  std::vector<uint64_t> keys = {key};
  std::vector<float> row(4);
  ASSERT_TRUE(client_->PullSparse(0, keys, row.data()).ok());
  const float twice = static_cast<float>(static_cast<float>(1.0 - 0.5 * 3e38f) - 0.5 * 3e38f);
  EXPECT_EQ(row, std::vector<float>(4, twice));
  for (float v : row) EXPECT_TRUE(std::isfinite(v));
  auto stats = client_->Stats();
  ASSERT_TRUE(stats.ok());
  EXPECT_EQ(JsonAt((*stats)[0], "/nonfinite_updates_kept", -1), 4) << (*stats)[0];
  EXPECT_EQ(JsonAt((*stats)[0], "/nonfinite_pushes", -1), 0) << (*stats)[0];
}

TEST_F(HostileInputTest, AResendWithAnotherPayloadIsRefusedAndATrueDuplicateIsNot) {
  const uint64_t key = 71;
  const float first[4] = {1, 1, 1, 1};
  const float other[4] = {-8, -8, -8, -8};
  ExpectOneApplyOneConflictOneDuplicate(key, [&](bool another) {
    std::vector<zmq::message_t> f = Frames(Push(/*seq=*/4, 1));
    f.push_back(Bytes(&key, 8));
    f.push_back(Bytes(another ? other : first, 4 * sizeof(float)));
    peer_->Send(std::move(f));
    return peer_->Reply();
  });
}

// A push's name covers what its bytes mean: the same 16-bit values under another scale are
// another update, refused as a resend with another payload, not answered as a duplicate.
TEST_F(HostileInputTest, TheSameHalfBytesUnderAnotherScaleAreAnotherPayload) {
  const uint64_t key = 72;
  const uint16_t ones[4] = {0x3C00, 0x3C00, 0x3C00, 0x3C00};  // 1.0 in IEEE half precision
  ExpectOneApplyOneConflictOneDuplicate(key, [&](bool another) {
    Header h = Push(/*seq=*/6, 1);
    h.dtype = wire::DType::F16;
    h.value_scale = another ? 1 : 0;  // each value times 2^-scale: the same bytes, half as much
    std::vector<zmq::message_t> f = Frames(h);
    f.push_back(Bytes(&key, 8));
    f.push_back(Bytes(ones, sizeof(ones)));
    peer_->Send(std::move(f));
    return peer_->Reply();
  });
}

TEST_F(HostileInputTest, BadMessagesAreCounted) {
  std::vector<zmq::message_t> f;
  f.push_back(Bytes("nonsense", 8));
  ExpectError(std::move(f), "");
  auto stats = client_->Stats();
  ASSERT_TRUE(stats.ok());
  EXPECT_NE((*stats)[0].find("\"bad_messages\":1"), std::string::npos) << (*stats)[0];
}

// --- Hostile clients: protocol rules and limits, each attack against a real shard ----------

// A DEALER that takes at most one reply into its queue and never reads.
zmq::socket_t NonReadingPeer(zmq::context_t& ctx, const ServerAddress& a) {
  zmq::socket_t sink(ctx, zmq::socket_type::dealer);
  sink.set(zmq::sockopt::rcvhwm, 1);
  sink.set(zmq::sockopt::rcvbuf, 4096);
  sink.set(zmq::sockopt::linger, 0);
  sink.connect(TcpEndpoint(a.host, a.port));
  return sink;
}

// Shard 0's resident memory grew by less than `max_growth` from `baseline`, and it stops within
// 10 s of SIGTERM.
void ExpectGrewLessAndStops(TestCluster& cluster, uint64_t baseline, uint64_t max_growth) {
  const uint64_t rss = ResidentBytes(cluster.server(0).pid());
  EXPECT_GT(rss, 0u);
  EXPECT_LT(rss, baseline + max_growth)
      << "the shard's resident memory grew from " << baseline << " to " << rss
      << " bytes, past its limits";
  cluster.server(0).Signal(SIGTERM);
  EXPECT_TRUE(cluster.server(0).Wait(std::chrono::seconds(10)).has_value())
      << "the shard did not stop within 10 s of SIGTERM";
}

// worker_clocks from a shard's stats JSON.
std::vector<int64_t> WorkerClocks(const std::string& stats) {
  const Json j = testing::ParseJson(stats);
  if (j.is_discarded() || !j.contains("worker_clocks")) return {};
  return j["worker_clocks"].get<std::vector<int64_t>>();
}

Header Request(Op op, uint32_t worker, int64_t clock, uint64_t seq = 0) {
  Header h;
  h.op = op;
  h.worker_id = worker;
  h.clock = clock;
  h.seq = seq;
  h.request_id = seq;
  h.incarnation = 5;
  h.caught_up = op == Op::Clock;  // as a worker's ticks say
  return h;
}

// Two workers under BSP with small limits, spoken to over raw sockets as any client could.
class HostileClientTest : public ::testing::Test {
 protected:
  static constexpr const char* kLimits =
      "training:\n  consistency: bsp\n  worker_timeout: 60s\n"
      "server:\n  max_held_pulls: 8\n  max_held_bytes: 64KiB\n  max_pending_clocks: 2\n"
      "  max_pending_bytes: 1MiB\n  max_request_bytes: 4MiB\n  socket_hwm: 64\n"
      "  max_queued_reply_bytes: 8MiB\n";

  void SetUp() override {
    ASSERT_TRUE(cluster_.Start());
    peer_ = std::make_unique<RawPeer>(cluster_.manifest().cluster.servers[0]);
    Stats();
    baseline_rss_ = ResidentBytes(cluster_.server(0).pid());
    ASSERT_GT(baseline_rss_, 0u);
  }

  std::string Stats() {
    peer_->Send(Frames(Request(Op::Stats, 1000, 0)));
    Result<Header> r = peer_->Reply();
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    return r.ok() ? r->message : std::string();
  }

  // Sends one request and returns its reply (failing the test on none within 10 s).
  Header Call(std::vector<zmq::message_t> frames, std::vector<zmq::message_t>* payload = nullptr) {
    peer_->Send(std::move(frames));
    Result<Header> r = peer_->Reply(payload);
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    return r.ok() ? *r : Header{};
  }

  // The shard answers a correct pull with correct values, its memory grew by less than
  // `max_growth` since the start, and it stops within 10 s of SIGTERM.
  void ExpectShardServesAndStops(uint64_t max_growth) {
    Header pull = Request(Op::PullSparse, 1000, 0, 424242);
    pull.table_id = 0;
    pull.key_count = 1;
    pull.value_dim = 4;
    std::vector<zmq::message_t> f = Frames(pull);
    const uint64_t key = 424242;
    f.push_back(Bytes(&key, 8));
    std::vector<zmq::message_t> payload;
    Header r = Call(std::move(f), &payload);
    EXPECT_EQ(r.status, StatusCode::kOk) << r.message;
    ASSERT_EQ(payload.size(), 1u);
    ASSERT_EQ(payload[0].size(), 16u);
    float row[4];
    std::memcpy(row, payload[0].data(), 16);
    EXPECT_EQ(std::vector<float>(row, row + 4), std::vector<float>(4, 1.0f));
    ExpectGrewLessAndStops(cluster_, baseline_rss_, max_growth);
  }

  TestCluster cluster_{1, 2, kTables, kLimits};
  std::unique_ptr<RawPeer> peer_;
  uint64_t baseline_rss_ = 0;
};

// What the attacks below may add to a shard's resident memory: the limits above (held pulls
// 64 KiB, summed pushes 1 MiB, queued replies 8 MiB) and the allocator's slack.
constexpr uint64_t kShardRss = 48ull << 20;

TEST_F(HostileClientTest, AFrameCountThatWrapsIsRefusedAndTheShardLives) {
  Header h = Request(Op::PushSparse, 0, 0, 1);
  h.key_count = 2;
  h.value_dim = 16;
  h.value_frames = 0;
  h.rows_per_frame = ~uint64_t{0};
  std::vector<zmq::message_t> f = Frames(h);
  const uint64_t keys[2] = {1, 2};
  f.push_back(Bytes(keys, sizeof(keys)));
  Header r = Call(std::move(f));
  EXPECT_EQ(r.status, StatusCode::kBadMessage);
  EXPECT_NE(r.message.find("value frames"), std::string::npos) << r.message;
  EXPECT_TRUE(cluster_.server(0).running());
  ExpectShardServesAndStops(kShardRss);
}

// A push resent long after it was applied (its reply lost, the worker gone on by more clocks
// than the push record keeps) is acknowledged as a duplicate and not applied again: the worker's
// clock on the shard is past it, so every push before that clock is in. The row shows one
// update.
TEST(HostilePushRecordTest, APushResentAfterTheRecordMovedOnIsADuplicate) {
  TestCluster cluster(1, 1, kTables, "training:\n  consistency: asp\n");
  ASSERT_TRUE(cluster.Start());
  RawPeer peer(cluster.manifest().cluster.servers[0]);
  auto call = [&](const Header& h, std::vector<zmq::message_t> payload = {}) {
    std::vector<zmq::message_t> f = Frames(h);
    for (auto& m : payload) f.push_back(std::move(m));
    return peer.Call(std::move(f));
  };
  const uint64_t key = 31337;
  const float grad[4] = {1, 1, 1, 1};
  auto push = [&](int64_t clock, uint64_t seq) {
    Header h = Push(seq, 1);
    h.worker_id = 0;
    h.clock = clock;
    h.request_id = 1000 + static_cast<uint64_t>(clock) * 10 + seq;
    std::vector<zmq::message_t> payload;
    payload.push_back(Bytes(&key, sizeof(key)));
    payload.push_back(Bytes(grad, sizeof(grad)));
    return call(h, std::move(payload));
  };
  Header first = push(0, 0);
  ASSERT_EQ(first.status, StatusCode::kOk) << first.message;
  EXPECT_FALSE(first.duplicate);
  // 200 clocks on, each with a push of another key (the record keeps 64 clocks).
  for (int64_t c = 0; c < 200; ++c) {
    Header t = Request(Op::Clock, 0, c + 1, 5000 + static_cast<uint64_t>(c));
    ASSERT_EQ(call(t).status, StatusCode::kOk);
  }
  Header again = push(0, 0);
  EXPECT_EQ(again.status, StatusCode::kOk) << again.message;
  EXPECT_TRUE(again.duplicate);
  // A push of a clock the worker has not passed yet is still new.
  Header later = push(200, 0);
  EXPECT_EQ(later.status, StatusCode::kOk) << later.message;
  EXPECT_FALSE(later.duplicate);
  // The row: its initial 1.0, minus lr 0.5 x 1 for each of the two pushes applied.
  auto observer = PsClient::Connect(cluster.manifest(), PsClient::kObserver);
  ASSERT_TRUE(observer.ok());
  std::vector<float> row(4);
  const std::vector<uint64_t> keys = {key};
  ASSERT_TRUE((*observer)->PullSparseReadOnly(0, keys, row.data()).ok());
  EXPECT_FLOAT_EQ(row[0], 0.0f);
}

// The membership (which ranks join and leave at which clock) from raw sockets, as any client
// could send it: only shard 0 names clocks, a shard takes only clocks shard 0 could have named
// now, a list that contradicts itself is refused whole, and tools outside the job change
// nothing by sending one.
TEST(HostileMembershipTest, OnlyClocksShardZeroCouldNameAreTaken) {
  TestCluster cluster(2, 2, kTables, "training:\n  consistency: bsp\n  worker_timeout: 60s\n",
                      {}, /*max_workers=*/3);
  ASSERT_TRUE(cluster.Start());
  RawPeer zero(cluster.manifest().cluster.servers[0]);
  RawPeer one(cluster.manifest().cluster.servers[1]);
  auto call = [](RawPeer& peer, const Header& h) {
    peer.Send(Frames(h));
    Result<Header> r = peer.Reply();
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    return r.ok() ? *r : Header{};
  };
  auto stats = [&](RawPeer& peer) {
    return testing::ParseJson(call(peer, Request(Op::Stats, 1000, 0)).message);
  };
  auto tick = [](uint32_t worker, std::vector<MemberEntry> members, uint64_t seq) {
    Header h = Request(Op::Clock, worker, 1, seq);
    h.members = std::move(members);
    h.membership_version = 1;
    return h;
  };
  const std::vector<std::pair<std::vector<MemberEntry>, std::string>> forged = {
      {{{2, int64_t{1} << 40, -1}}, "which shard 0 could not have named now"},
      {{{1, -1, 500}}, "which shard 0 could not have named now"},
      {{{2, int64_t{1} << 50, -1}}, "beyond any job"},
      {{{2, 3, -1}, {2, 4, -1}}, "joined at clock 4, not 3"},
      {{{7, 2, -1}}, "beyond cluster.max_workers (3)"},
      {{{0, 2, -1}}, "one of the job's first cluster.workers"},
  };
  uint64_t seq = 1;
  for (const auto& [members, why] : forged) {
    const Header r = call(one, tick(0, members, seq++));
    EXPECT_NE(r.status, StatusCode::kOk);
    EXPECT_NE(r.message.find(why), std::string::npos) << r.message;
  }
  // A tool outside the job is not heard on membership (and may not tick).
  EXPECT_NE(call(one, tick(1000, {{2, 2, -1}}, seq++)).status, StatusCode::kOk);
  Json s1 = stats(one);
  EXPECT_TRUE(s1["membership"].empty()) << s1.dump();
  EXPECT_EQ(s1["worker_clocks"].get<std::vector<int64_t>>(), (std::vector<int64_t>{0, 0, 0}));
  // Only shard 0 names clocks; a joiner's Hello must run the job's manifest.
  Header join = Request(Op::Membership, 2, 0, seq++);
  join.join = true;
  join.manifest_hash = cluster.manifest().Fingerprint();
  Header r = call(one, join);
  EXPECT_NE(r.message.find("only shard 0 names the clocks"), std::string::npos) << r.message;
  Header hello = Request(Op::Hello, 2, 0, seq++);
  hello.join = true;
  hello.manifest_hash = cluster.manifest().Fingerprint() ^ 1;
  r = call(zero, hello);
  EXPECT_NE(r.message.find("manifest mismatch"), std::string::npos) << r.message;
  join.worker_id = 1000;
  r = call(zero, join);
  EXPECT_NE(r.message.find("cannot join: cluster.max_workers is 3"), std::string::npos)
      << r.message;
  // Shard 0 takes no entries from a tick: it names them itself.
  EXPECT_EQ(call(zero, tick(0, {{2, 2, -1}}, seq++)).status, StatusCode::kOk);
  EXPECT_TRUE(stats(zero)["membership"].empty());
  // A tool scales the job to one worker: rank 1 leaves at the clock shard 0 names.
  Header scale = Request(Op::Membership, 1000, 0, seq++);
  scale.key_count = 1;
  r = call(zero, scale);
  ASSERT_EQ(r.status, StatusCode::kOk) << r.message;
  EXPECT_EQ(r.key_count, 1u);
  ASSERT_EQ(r.members.size(), 1u);
  EXPECT_EQ(r.members[0], (MemberEntry{1, -1, 3}));  // newest clock 1, plus 2
  // What shard 0 named, passed on by a worker's tick, is taken by shard 1.
  EXPECT_EQ(call(one, tick(0, r.members, seq++)).status, StatusCode::kOk);
  s1 = stats(one);
  ASSERT_EQ(s1["membership"].size(), 1u) << s1.dump();
  EXPECT_EQ(s1["membership"][0]["leave"], 3);
}

TEST_F(HostileClientTest, AForgedClockIsRefusedAndTheClocksStayPut) {
  Header r = Call(Frames(Request(Op::Clock, 0, int64_t{1} << 62, 1)));
  EXPECT_NE(r.status, StatusCode::kOk);
  EXPECT_NE(r.message.find("moves forward by one"), std::string::npos) << r.message;
  EXPECT_EQ(WorkerClocks(Stats()), (std::vector<int64_t>{0, 0}));
  // Two ahead is refused too; the next clock is taken, and its resend changes nothing.
  EXPECT_NE(Call(Frames(Request(Op::Clock, 0, 2, 2))).status, StatusCode::kOk);
  EXPECT_EQ(Call(Frames(Request(Op::Clock, 0, 1, 3))).status, StatusCode::kOk);
  EXPECT_EQ(Call(Frames(Request(Op::Clock, 0, 1, 4))).status, StatusCode::kOk);
  EXPECT_EQ(Call(Frames(Request(Op::Clock, 0, 0, 5))).status, StatusCode::kOk);
  EXPECT_EQ(WorkerClocks(Stats()), (std::vector<int64_t>{1, 0}));
  ExpectShardServesAndStops(kShardRss);
}

TEST_F(HostileClientTest, RequestsAtClocksBspCouldNeverAdmitAreRefusedNotHeld) {
  Header pull = Request(Op::PullDense, 0, 7, 1);
  pull.table_id = 1;
  pull.key_count = 10;
  Header r = Call(Frames(pull));  // answered, not held: a held pull gets no reply here
  EXPECT_NE(r.status, StatusCode::kOk);
  EXPECT_NE(r.message.find("beyond its own next clock"), std::string::npos) << r.message;
  // Worker 0 may be two ahead of worker 1 (a tick of 1 may be on its way), never three, once
  // the shard knows where worker 1 is.
  ASSERT_EQ(Call(Frames(Request(Op::Clock, 1, 0, 20))).status, StatusCode::kOk);
  ASSERT_EQ(Call(Frames(Request(Op::Clock, 0, 1, 2))).status, StatusCode::kOk);
  ASSERT_EQ(Call(Frames(Request(Op::Clock, 0, 2, 3))).status, StatusCode::kOk);
  r = Call(Frames(Request(Op::Clock, 0, 3, 4)));
  EXPECT_NE(r.status, StatusCode::kOk);
  EXPECT_NE(r.message.find("could never reach"), std::string::npos) << r.message;
  // A push for clock 3 (its own next clock) could never be summed either.
  Header push = Push(4, 1);
  push.worker_id = 0;
  push.clock = 3;
  std::vector<zmq::message_t> f = Frames(push);
  const uint64_t key = 5;
  const float g[4] = {1, 1, 1, 1};
  f.push_back(Bytes(&key, 8));
  f.push_back(Bytes(g, sizeof(g)));
  r = Call(std::move(f));
  EXPECT_NE(r.status, StatusCode::kOk);
  EXPECT_NE(r.message.find("could never admit"), std::string::npos) << r.message;
  EXPECT_EQ(JsonAt(Stats(), "/pending_clocks", -1), 0);
  ExpectShardServesAndStops(kShardRss);
}

TEST_F(HostileClientTest, HeldPullsAreBoundedAndTheHeldOnesAreAnsweredLater) {
  ASSERT_EQ(Call(Frames(Request(Op::Clock, 0, 1, 1))).status, StatusCode::kOk);
  // Worker 0 at clock 1 waits for worker 1: its pulls are held, up to server.max_held_pulls.
  for (uint64_t i = 0; i < 20; ++i) {
    Header pull = Request(Op::PullDense, 0, 1, 10 + i);
    pull.table_id = 1;
    pull.key_count = 10;
    peer_->Send(Frames(pull));
  }
  int refused = 0;
  for (int i = 0; i < 12; ++i) {
    Result<Header> r = peer_->Reply();
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    EXPECT_EQ(r->status, StatusCode::kResourceExhausted);
    EXPECT_NE(r->message.find("server.max_held_pulls"), std::string::npos) << r->message;
    ++refused;
  }
  EXPECT_EQ(refused, 12);
  EXPECT_EQ(JsonAt(Stats(), "/held_pulls", -1), 8);
  // Worker 1 catches up: the eight held pulls are answered.
  peer_->Send(Frames(Request(Op::Clock, 1, 1, 100)));
  int answered = 0, clock_acks = 0;
  for (int i = 0; i < 9; ++i) {
    Result<Header> r = peer_->Reply();
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    EXPECT_EQ(r->status, StatusCode::kOk) << r->message;
    (r->op == Op::PullDense ? answered : clock_acks)++;
  }
  EXPECT_EQ(answered, 8);
  EXPECT_EQ(clock_acks, 1);
  EXPECT_EQ(JsonAt(Stats(), "/held_pulls", -1), 0);
  ExpectShardServesAndStops(kShardRss);
}

TEST_F(HostileClientTest, SummedPushesAreBoundedByTheirLimit) {
  // 3000 new keys per push: 3000 x (4 + 2) floats = 72 KB a push, from two workers whose sums
  // are held apart (server/clock_aggregate.hpp), each counted at its vectors' capacity: 1 MiB
  // admits 5.
  std::vector<uint64_t> keys(3000);
  std::vector<float> grads(keys.size() * 4, 0.5f);
  int accepted = 0, refused = 0;
  for (uint64_t p = 0; p < 40; ++p) {
    for (size_t i = 0; i < keys.size(); ++i) keys[i] = 1000000 + p * keys.size() + i;
    Header push = Push(p + 1, keys.size());
    push.worker_id = static_cast<uint32_t>(p % 2);
    std::vector<zmq::message_t> f = Frames(push);
    f.push_back(Bytes(keys.data(), keys.size() * 8));
    f.push_back(Bytes(grads.data(), grads.size() * 4));
    Header r = Call(std::move(f));
    if (r.status == StatusCode::kOk) {
      ++accepted;
    } else {
      ++refused;
      EXPECT_NE(r.message.find("server.max_pending_bytes"), std::string::npos) << r.message;
    }
  }
  EXPECT_GE(accepted, 4);
  EXPECT_GT(refused, 10);
  ExpectShardServesAndStops(kShardRss);
}

TEST_F(HostileClientTest, BarrierIdsMoveForwardAndAWorkerWaitsAtOneBarrier) {
  peer_->Send(Frames([] { Header h = Request(Op::Barrier, 0, 0, 1); h.offset = 5; return h; }()));
  // Worker 0 waiting at 5 may not open another barrier.
  Header other = Request(Op::Barrier, 0, 0, 2);
  other.offset = 6;
  Header r = Call(Frames(other));
  EXPECT_NE(r.status, StatusCode::kOk);
  EXPECT_NE(r.message.find("already waits at barrier 5"), std::string::npos) << r.message;
  Header last = Request(Op::Barrier, 1, 0, 3);
  last.offset = 5;
  peer_->Send(Frames(last));
  for (int i = 0; i < 2; ++i) {
    Result<Header> done = peer_->Reply();
    ASSERT_TRUE(done.ok()) << done.status().ToString();
    EXPECT_EQ(done->status, StatusCode::kOk) << done->message;
  }
  // Behind the last released barrier: refused; the released one again: answered at once.
  Header behind = Request(Op::Barrier, 0, 0, 4);
  behind.offset = 4;
  r = Call(Frames(behind));
  EXPECT_NE(r.message.find("only move forward"), std::string::npos) << r.message;
  Header again = Request(Op::Barrier, 0, 0, 5);
  again.offset = 5;
  EXPECT_EQ(Call(Frames(again)).status, StatusCode::kOk);
  EXPECT_EQ(JsonAt(Stats(), "/open_barriers", -1), 0);
  ExpectShardServesAndStops(kShardRss);
}

TEST_F(HostileClientTest, AnObserversPullCreatesNoRow) {
  Header pull = Request(Op::PullSparse, 1000, 0, 1);
  pull.table_id = 0;
  pull.key_count = 5000;
  pull.value_dim = 4;
  std::vector<uint64_t> keys(5000);
  for (size_t i = 0; i < keys.size(); ++i) keys[i] = 77 + i;
  std::vector<zmq::message_t> f = Frames(pull);
  f.push_back(Bytes(keys.data(), keys.size() * 8));
  std::vector<zmq::message_t> payload;
  ASSERT_EQ(Call(std::move(f), &payload).status, StatusCode::kOk);
  EXPECT_EQ(JsonAt(Stats(), "/tables/0/rows", -1), 0);
  ExpectShardServesAndStops(kShardRss);
}

TEST_F(HostileClientTest, AFloodOfBadMessagesIsLoggedAtARateAndCounted) {
  // In batches well within the queues: ZeroMQ sees a queue's room late (its reader reports in
  // steps of half the high-water mark), so a peer with 64 replies queued may find it full.
  for (int batch = 0; batch < 150; ++batch) {
    for (int i = 0; i < 20; ++i) {
      std::vector<zmq::message_t> f;
      f.push_back(Bytes("garbage!", 8));
      peer_->Send(std::move(f));
    }
    for (int i = 0; i < 20; ++i) {
      Result<Header> r = peer_->Reply();
      ASSERT_TRUE(r.ok()) << r.status().ToString();
      EXPECT_EQ(r->status, StatusCode::kBadMessage);
    }
  }
  const std::string log = cluster_.ServerLog(0);
  size_t lines = 0;
  for (size_t p = log.find("rejected a message"); p != std::string::npos;
       p = log.find("rejected a message", p + 1)) {
    ++lines;
  }
  EXPECT_GE(lines, 1u);
  EXPECT_LE(lines, 20u) << "every bad message was logged";
  EXPECT_GE(JsonAt(Stats(), "/warnings_not_logged", -1), 2900);
  ExpectShardServesAndStops(kShardRss);
}

TEST_F(HostileClientTest, APeerThatNeverReadsCannotStallTheShard) {
  // A DEALER that takes at most one reply into its queue and never reads: the shard's queue to
  // it fills (server.socket_hwm) and further replies to it are dropped, not waited for.
  zmq::context_t ctx(1);
  zmq::socket_t sink = NonReadingPeer(ctx, cluster_.manifest().cluster.servers[0]);
  std::vector<uint64_t> keys(8192);
  for (size_t i = 0; i < keys.size(); ++i) keys[i] = i;
  for (uint64_t i = 0; i < 600; ++i) {  // 600 replies of 128 KiB
    Header pull = Request(Op::PullSparse, 1000, 0, i);
    pull.table_id = 0;
    pull.key_count = keys.size();
    pull.value_dim = 4;
    std::vector<zmq::message_t> f = Frames(pull);
    f.push_back(Bytes(keys.data(), keys.size() * 8));
    ASSERT_TRUE(SendFrames(sink, f).ok());
  }
  // Everyone else is still served: the stats requests are answered while the shard works
  // through the 600 pulls.
  std::string stats;
  for (int i = 0; i < 50 && JsonAt(stats, "/requests", 0) < 600; ++i) {
    stats = Stats();
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  EXPECT_GE(JsonAt(stats, "/requests", 0), 600) << stats;
  // Its replies past its share are dropped, and its requests refused until it reads.
  EXPECT_GT(JsonAt(stats, "/replies_dropped", 0) + JsonAt(stats, "/peer_refusals", 0), 0)
      << stats;
  ExpectShardServesAndStops(kShardRss);
}

TEST(HostileFairShareTest, PeersThatNeverReadGetTheirShareAndTheWorkersKeepTraining) {
  // Three peers ask for 128 KiB pulls and never read; 200 more ask for stats and never read.
  // Two workers of the job train meanwhile, and each attacker holds at most its share.
  TestCluster cluster(1, 2, kTables,
                      "training:\n  consistency: bsp\n  worker_timeout: 60s\n"
                      "server:\n  socket_hwm: 1000\n  max_request_bytes: 4MiB\n"
                      "  max_queued_reply_bytes: 8MiB\n");
  ASSERT_TRUE(cluster.Start());
  auto w0 = cluster.Connect(0);
  auto w1 = cluster.Connect(1);
  ASSERT_NE(w0, nullptr);
  ASSERT_NE(w1, nullptr);
  RawPeer peer(cluster.manifest().cluster.servers[0]);
  auto stats = [&] { return peer.Call(Frames(Request(Op::Stats, 1000, 0))).message; };
  const uint64_t baseline = ResidentBytes(cluster.server(0).pid());
  zmq::context_t ctx(1);
  std::vector<zmq::socket_t> pullers, talkers;
  std::vector<uint64_t> keys(8192);
  for (size_t i = 0; i < keys.size(); ++i) keys[i] = i;
  for (int a = 0; a < 3; ++a) {
    pullers.push_back(NonReadingPeer(ctx, cluster.manifest().cluster.servers[0]));
    for (uint64_t i = 0; i < 300; ++i) {
      Header pull = Request(Op::PullSparse, 1000 + a, 0, i);
      pull.table_id = 0;
      pull.key_count = keys.size();
      pull.value_dim = 4;
      std::vector<zmq::message_t> f = Frames(pull);
      f.push_back(Bytes(keys.data(), keys.size() * 8));
      ASSERT_TRUE(SendFrames(pullers.back(), f).ok());
    }
  }
  for (int a = 0; a < 200; ++a) {
    talkers.push_back(NonReadingPeer(ctx, cluster.manifest().cluster.servers[0]));
    for (uint64_t i = 0; i < 50; ++i) {
      std::vector<zmq::message_t> f = Frames(Request(Op::Stats, 2000 + a, 0, i));
      ASSERT_TRUE(SendFrames(talkers.back(), f).ok());
    }
  }
  // The workers: 20 BSP steps each, a push and a pull of 64 rows and a tick.
  double seconds = 0;
  const Status trained = testing::TrainWorkersTogether({w0.get(), w1.get()}, 20, &seconds);
  ASSERT_TRUE(trained.ok()) << trained.ToString();
  EXPECT_LT(seconds, 30.0) << "the workers' 20 steps took " << seconds << " s";
  std::string text;
  for (int i = 0; i < 100 && JsonAt(text, "/requests", 0) < 3 * 300 + 200 * 50; ++i) {
    text = stats();
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  std::printf("workers' steps in %.2f s; %s\n", seconds, text.substr(0, 400).c_str());
  EXPECT_EQ(JsonAt(text, "/worker_clocks/0", -1), 20) << text;
  EXPECT_EQ(JsonAt(text, "/members", -1), 2) << text;
  // Peers outside the job hold at most a quarter of the 8 MiB (a sixteenth more for small
  // replies), plus the one reply that found nothing queued; each at most a sixteenth.
  EXPECT_LE(JsonAt(text, "/other_peers_queued_bytes", -1),
            (8 << 20) / 4 + (8 << 20) / 16 + (128 << 10))
      << text;
  EXPECT_GT(JsonAt(text, "/other_peers_queued_bytes", -1), 0) << text;
  EXPECT_GT(JsonAt(text, "/peer_refusals", 0), 0) << text;
  EXPECT_LT(ResidentBytes(cluster.server(0).pid()), baseline + (96u << 20));
  // Once they close, what they held is released.
  pullers.clear();
  talkers.clear();
  for (int i = 0; i < 100 && JsonAt(text, "/queued_reply_bytes", -1) > 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    text = stats();
  }
  EXPECT_EQ(JsonAt(text, "/queued_reply_bytes", -1), 0) << text;
}

// A `parasol server` of a one-shard job (kTables), started under `ulimit` (bash's ulimit
// arguments, such as "-n 1024"); `cluster` and `more` add lines to the manifest's cluster
// section and after it. Stopped (SIGTERM) and its folder removed when it goes.
class LimitedShard {
 public:
  LimitedShard(const std::string& ulimit, const std::string& cluster, const std::string& more)
      : dir_(testing::MakeTempDir()), port_(PickFreePorts(1).value()[0]) {
    const std::string path = dir_ + "/m.yaml";
    testing::WriteFile(path, "cluster:\n  servers: [127.0.0.1:" + std::to_string(port_) +
                                 "]\n" + cluster + "training: {consistency: asp}\n" + more +
                                 "tables:\n" + std::string(kTables));
    Result<Manifest> m = LoadManifest(path);
    if (m.ok()) manifest_ = std::move(*m);
    started_ = m.ok() ? Status::Ok() : m.status();
    if (!started_.ok()) return;
    auto server = Subprocess::Spawn(
        {"/bin/bash", "-c", "ulimit " + ulimit + " && exec \"$0\" server --manifest \"$1\" --rank 0",
         PARASOL_BINARY, path},
        dir_ + "/server.log");
    if (server.ok()) {
      server_.emplace(std::move(*server));
    } else {
      started_ = server.status();
    }
  }
  ~LimitedShard() {
    if (server_) {
      server_->Signal(SIGTERM);
      EXPECT_TRUE(server_->Wait(std::chrono::seconds(10)).has_value());
    }
    testing::RemoveTree(dir_);
  }
  const Status& started() const { return started_; }
  const Manifest& manifest() const { return manifest_; }
  uint16_t port() const { return port_; }
  std::string Log() const { return testing::ReadFile(dir_ + "/server.log"); }
  const std::string& dir() const { return dir_; }

 private:
  std::string dir_;
  uint16_t port_;
  Manifest manifest_;
  Status started_;
  std::optional<Subprocess> server_;
};

// Raises this process's soft open-file limit to hold `want` descriptors; false when it cannot.
bool RaiseOwnFileLimit(rlim_t want) {
  rlimit files{};
  if (::getrlimit(RLIMIT_NOFILE, &files) != 0) return false;
  if (files.rlim_cur >= want) return true;
  if (files.rlim_max < want) return false;
  files.rlim_cur = std::min<rlim_t>(files.rlim_max, std::max<rlim_t>(want, 4096));
  return ::setrlimit(RLIMIT_NOFILE, &files) == 0;
}

// `n` ZeroMQ DEALER sockets connected to `port` on loopback that send nothing; with
// `reconnect` false, one shut stays shut.
std::vector<zmq::socket_t> ConnectCrowd(zmq::context_t& ctx, uint16_t port, int n,
                                        bool reconnect) {
  ctx.set(zmq::ctxopt::max_sockets, 4096);
  std::vector<zmq::socket_t> crowd;
  for (int i = 0; i < n; ++i) {
    zmq::socket_t s(ctx, zmq::socket_type::dealer);
    s.set(zmq::sockopt::linger, 0);
    s.set(zmq::sockopt::sndhwm, 4);
    if (!reconnect) s.set(zmq::sockopt::reconnect_ivl, -1);
    s.connect(TcpEndpoint("127.0.0.1", port));
    crowd.push_back(std::move(s));
  }
  return crowd;
}

// Pushes 0.5 to keys 1-3 and reads them back as 0.75 (1.0 - 0.5 x 0.5).
void ExpectTrains(PsClient& worker) {
  std::vector<uint64_t> keys = {1, 2, 3};
  std::vector<float> grads(12, 0.5f), rows(12);
  EXPECT_TRUE(worker.PushSparse(0, keys, grads).ok());
  EXPECT_TRUE(worker.PullSparse(0, keys, rows.data()).ok());
  EXPECT_EQ(rows[0], 0.75f);
}

TEST(HostileIdlePeersTest, IdleConnectionsPastTheUsualFileLimitDoNotLockTheWorkersOut) {
  // The shard starts with a soft open-file limit of 1,024 (the usual default); 1,100 peers
  // connect and finish ZeroMQ's handshake, then do nothing. A worker still connects and trains.
  rlimit files{};
  ASSERT_EQ(::getrlimit(RLIMIT_NOFILE, &files), 0);
  if (files.rlim_max < 4096 || !RaiseOwnFileLimit(2048)) {
    GTEST_SKIP() << "the hard open-file limit is " << files.rlim_max
                 << ": a shard cannot keep descriptors past 1,100 idle peers here";
  }
  LimitedShard shard("-Sn 1024", "  workers: 1\n  connect_timeout: 20s\n", "");
  ASSERT_TRUE(shard.started().ok()) << shard.started().ToString();
  {
    // The shard is up before the crowd comes.
    auto first = PsClient::Connect(shard.manifest(), PsClient::kObserver);
    ASSERT_TRUE(first.ok()) << first.status().ToString() << shard.Log();
  }
  zmq::context_t ctx(1);
  std::vector<zmq::socket_t> idle = ConnectCrowd(ctx, shard.port(), 1100, /*reconnect=*/true);
  std::this_thread::sleep_for(std::chrono::seconds(2));  // their handshakes
  auto worker = PsClient::Connect(shard.manifest(), 0);
  ASSERT_TRUE(worker.ok()) << worker.status().ToString() << "\n" << shard.Log();
  ExpectTrains(**worker);
  const std::string log = shard.Log();
  EXPECT_NE(log.find("open-file limit raised from 1024 to"), std::string::npos) << log;
}

TEST(HostileIdlePeersTest, AtTheConnectionCapANewPeerTakesTheRoomOfOneNeverHeardFrom) {
  // A shard whose open-file limit is 1,024, hard and soft: its cap is 768 connections, the
  // rest kept for its own files. 900 idle peers come: past the cap each takes the room of an
  // older one that never sent a request, never the worker's or the tool's, which go on; a
  // checkpoint (files) is written, and once the crowd leaves, a new peer is accepted.
  if (!RaiseOwnFileLimit(2048)) GTEST_SKIP() << "this process cannot open 900 connections";
  LimitedShard shard("-n 1024", "  workers: 1\n  connect_timeout: 5s\n", "checkpoint: {dir: ckpt}\n");
  ASSERT_TRUE(shard.started().ok()) << shard.started().ToString();
  auto worker = PsClient::Connect(shard.manifest(), 0);
  ASSERT_TRUE(worker.ok()) << worker.status().ToString() << shard.Log();
  auto tool = PsClient::Connect(shard.manifest(), PsClient::kObserver);
  ASSERT_TRUE(tool.ok()) << tool.status().ToString();
  zmq::context_t ctx(1);
  std::vector<zmq::socket_t> idle = ConnectCrowd(ctx, shard.port(), 900, /*reconnect=*/true);
  std::string stats;
  for (int i = 0; i < 100; ++i) {
    auto st = (*tool)->Stats();
    ASSERT_TRUE(st.ok()) << st.status().ToString();
    stats = (*st)[0];
    if (JsonAt(stats, "/connections_evicted_over_cap", 0) > 0 &&
        JsonAt(stats, "/connections", 0) <= JsonAt(stats, "/connection_cap", 0)) {
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  EXPECT_EQ(JsonAt(stats, "/connection_cap", -1), 768) << stats;
  // At the cap each newcomer made room: an idle peer went (none of the worker's and the tool's
  // connections, which are in use below).
  EXPECT_GT(JsonAt(stats, "/connections_evicted_over_cap", 0), 0) << stats;
  EXPECT_EQ(JsonAt(stats, "/connections_refused_over_cap", -1), 0) << stats;
  EXPECT_LE(JsonAt(stats, "/connections", 0), 768) << stats;
  // The worker trains, and the tool's checkpoint finds descriptors for its files.
  ExpectTrains(**worker);
  const Status checkpointed = (*tool)->Checkpoint();
  EXPECT_TRUE(checkpointed.ok()) << checkpointed.ToString();
  const std::string log = shard.Log();
  EXPECT_NE(log.find("connections are open, its cap"), std::string::npos) << log;
  EXPECT_NE(log.find("no worker's and never heard from, is shut"), std::string::npos) << log;
  // The crowd leaves: a new peer is accepted again.
  idle.clear();
  auto later = PsClient::Connect(shard.manifest(), PsClient::kObserver);
  EXPECT_TRUE(later.ok()) << later.status().ToString();
}

TEST(HostileIdlePeersTest, IdlePeersAreShutAfterIdleTimeoutAndAWorkersConnectionIsNot) {
  // At a limit of 1,024 (cap 768), 900 peers connect, finish ZeroMQ's handshake (so they answer
  // its heartbeats) and then send nothing, and never reconnect once shut. A worker and a tool
  // are connected first; the worker then sends nothing for longer than server.idle_timeout.
  // Every idle peer is shut, the worker's connection is not, and a worker who comes later is
  // let in while the crowd's sockets are still open on their side.
  if (!RaiseOwnFileLimit(2048)) GTEST_SKIP() << "this process cannot open 900 connections";
  LimitedShard shard("-n 1024",
                     "  workers: 2\n  connect_timeout: 5s\n  request_timeout: 2s\n",
                     "server: {idle_timeout: 5s}\n");
  ASSERT_TRUE(shard.started().ok()) << shard.started().ToString();
  const Manifest* m = &shard.manifest();
  EXPECT_EQ(m->server.idle_timeout_ms, 5000);
  auto worker = PsClient::Connect(*m, 0);
  ASSERT_TRUE(worker.ok()) << worker.status().ToString() << shard.Log();
  auto tool = PsClient::Connect(*m, PsClient::kObserver);
  ASSERT_TRUE(tool.ok()) << tool.status().ToString();
  std::vector<uint64_t> keys = {1, 2, 3};
  std::vector<float> grads(12, 0.5f), rows(12);
  ASSERT_TRUE((*worker)->PushSparse(0, keys, grads).ok());
  zmq::context_t ctx(1);
  std::vector<zmq::socket_t> idle = ConnectCrowd(ctx, shard.port(), 900, /*reconnect=*/false);
  // The crowd fills the cap; then, with the tool asking for stats every 100 ms and the worker
  // silent, the idle ones are shut within the timeout and a sweep.
  std::string stats;
  int64_t peak = 0;
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < 200; ++i) {
    auto st = (*tool)->Stats();
    ASSERT_TRUE(st.ok()) << st.status().ToString();
    stats = (*st)[0];
    peak = std::max<int64_t>(peak, JsonAt(stats, "/connections", 0));
    if (JsonAt(stats, "/idle_connections_shut", 0) > 0 && JsonAt(stats, "/connections", 0) <= 2) {
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  const double waited =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("peak %lld connections; after %.1f s: %s\n", static_cast<long long>(peak), waited,
              stats.substr(0, 300).c_str());
  // The cap was reached: the case this is about. (Connections shut to make room count until
  // ZeroMQ has closed them, so the count may pass the cap by those few.)
  EXPECT_GE(peak, 768) << stats;
  EXPECT_LE(peak, 768 + 64) << stats;
  EXPECT_GT(JsonAt(stats, "/connections_evicted_over_cap", 0), 0) << stats;
  // Every one of the crowd was shut, at the cap or for being idle, and nothing more (had the
  // worker's or the tool's connection been shut, its socket would have connected again: a
  // new connection, counted).
  EXPECT_EQ(JsonAt(stats, "/connections", -1), 2) << stats;
  EXPECT_EQ(JsonAt(stats, "/idle_connections_shut", -1) +
                JsonAt(stats, "/connections_evicted_over_cap", -1) +
                JsonAt(stats, "/connections_refused_over_cap", -1),
            900)
      << stats;
  EXPECT_GT(JsonAt(stats, "/idle_connections_shut", -1), 700) << stats;
  EXPECT_GT(waited, 4.0);  // none was shut before its time (5 s, less the crowd's arrival)
  // The worker, silent all that time, is still connected and served over the same connection.
  EXPECT_TRUE((*worker)->PullSparse(0, keys, rows.data()).ok());
  EXPECT_EQ(rows[0], 0.75f);
  // A worker who comes now gets in, though the 900 sockets are still open on their side.
  auto late = PsClient::Connect(*m, 1);
  ASSERT_TRUE(late.ok()) << late.status().ToString();
  EXPECT_TRUE((*late)->PullSparse(0, keys, rows.data()).ok());
  EXPECT_EQ(rows[0], 0.75f);
  // The count comes from the socket monitor's events, read on the watch's own thread: it may
  // lag the late worker's first reply by a moment.
  std::string after;
  for (int i = 0; i < 50; ++i) {
    auto st = (*tool)->Stats();
    ASSERT_TRUE(st.ok()) << st.status().ToString();
    after = (*st)[0];
    if (JsonAt(after, "/connections", -1) == 3) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  EXPECT_EQ(JsonAt(after, "/connections", -1), 3) << after;
  EXPECT_EQ(JsonAt(after, "/members", -1), 2) << after;
  const std::string log = shard.Log();
  EXPECT_NE(log.find("that sent nothing for 5 s and are no worker's"), std::string::npos) << log;
}

TEST(HostileIdlePeersTest, PeersThatReconnectAndSendJunkAtTheCapDoNotLockOutATool) {
  // At a limit of 1,024 (cap 768), 800 ZeroMQ peers that reconnect whenever they are shut send
  // a byte of junk every second: junk is no request, so they are never heard from, and a tool
  // and a worker who come after them each take the room of one.
  if (!RaiseOwnFileLimit(2048)) GTEST_SKIP() << "this process cannot open 800 connections";
  LimitedShard shard("-n 1024", "  workers: 1\n  connect_timeout: 10s\n", "");
  ASSERT_TRUE(shard.started().ok()) << shard.started().ToString();
  // The shard is up; this observer stays (heard from, it is never shut for room) and watches
  // the crowd come in.
  auto first = PsClient::Connect(shard.manifest(), PsClient::kObserver);
  ASSERT_TRUE(first.ok()) << first.status().ToString() << shard.Log();
  zmq::context_t ctx(1);
  std::vector<zmq::socket_t> crowd = ConnectCrowd(ctx, shard.port(), 800, /*reconnect=*/true);
  std::atomic<bool> stop{false};
  std::atomic<uint64_t> junk{0};
  std::thread sender([&] {
    const char byte = 'x';
    for (int round = 0; round < 60 && !stop.load(); ++round) {  // a minute at most
      for (auto& s : crowd) {
        if (s.send(zmq::const_buffer(&byte, 1), zmq::send_flags::dontwait)) ++junk;
      }
      std::this_thread::sleep_for(std::chrono::seconds(1));
    }
  });
  // The crowd is in once the shard holds the cap's connections (on a loaded machine 800
  // connections take more than a second or two): waited for, at most 60 s.
  std::string seen;
  for (int i = 0; i < 600; ++i) {
    Result<std::vector<std::string>> st = (*first)->Stats();
    ASSERT_TRUE(st.ok()) << st.status().ToString();
    seen = (*st)[0];
    if (JsonAt(seen, "/connections", 0) >= 768) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  ASSERT_GE(JsonAt(seen, "/connections", 0), 768) << "the crowd never filled the cap: " << seen;
  auto tool = PsClient::Connect(shard.manifest(), PsClient::kObserver);
  auto worker = PsClient::Connect(shard.manifest(), 0);
  Result<std::vector<std::string>> stats = tool.ok() ? (*tool)->Stats()
                                                     : Result<std::vector<std::string>>(tool.status());
  if (worker.ok()) ExpectTrains(**worker);
  if (tool.ok()) stats = (*tool)->Stats();
  stop = true;
  sender.join();
  ASSERT_TRUE(tool.ok()) << tool.status().ToString();
  ASSERT_TRUE(worker.ok()) << worker.status().ToString();
  ASSERT_TRUE(stats.ok()) << stats.status().ToString();
  const std::string& text = (*stats)[0];
  std::printf("%llu junk messages sent; %s\n", (unsigned long long)junk.load(),
              text.substr(0, 300).c_str());
  EXPECT_GT(junk.load(), 800u);
  EXPECT_EQ(JsonAt(text, "/connection_cap", -1), 768) << text;
  EXPECT_GE(JsonAt(text, "/connections_evicted_over_cap", 0), 2) << text;
  // (Connections being shut to make room count until ZeroMQ has closed them.)
  EXPECT_LE(JsonAt(text, "/connections", 0), 768 + 64) << text;
  EXPECT_GT(JsonAt(text, "/bad_messages", 0), 0) << text;
}

TEST(HostileFairShareTest, AReplyLargerThanAnOutsidePeersShareIsRefusedNotQueued) {
  // server.max_queued_reply_bytes 32 MiB: a peer outside the job may have 2 MiB queued. Its
  // pull of 200,000 rows (3.2 MB of values) is refused in a few bytes, naming the bound; the
  // same pull from the job's worker is answered; a tool's stats still is.
  TestCluster cluster(1, 1, kTables, "training: {consistency: asp}\n"
                      "server:\n  max_queued_reply_bytes: 32MiB\n  max_request_bytes: 8MiB\n");
  ASSERT_TRUE(cluster.Start());
  auto worker = cluster.Connect(0);
  ASSERT_NE(worker, nullptr);
  std::vector<uint64_t> keys(200000);
  for (size_t i = 0; i < keys.size(); ++i) keys[i] = i;
  RawPeer peer(cluster.manifest().cluster.servers[0]);
  Header pull = Request(Op::PullSparse, 1000, 0, 1);
  pull.table_id = 0;
  pull.key_count = keys.size();
  pull.value_dim = 4;
  std::vector<zmq::message_t> f = Frames(pull);
  f.push_back(Bytes(keys.data(), keys.size() * 8));
  const Header r = peer.Call(std::move(f));
  EXPECT_EQ(r.status, StatusCode::kResourceExhausted) << r.message;
  EXPECT_NE(r.message.find("is more than a connection outside the job's workers may have queued "
                           "(2097152"),
            std::string::npos)
      << r.message;
  std::vector<float> rows(keys.size() * 4);
  ASSERT_TRUE(worker->PullSparse(0, keys, rows.data()).ok());
  EXPECT_EQ(rows[4 * 199999], 1.0f);
  const std::string stats = peer.Call(Frames(Request(Op::Stats, 1000, 0, 2))).message;
  EXPECT_EQ(JsonAt(stats, "/queued_reply_bytes", -1), 0) << stats;
  EXPECT_GE(JsonAt(stats, "/peer_refusals", -1), 1) << stats;
}

TEST(HostileDenseReplyTest, RepliesAPeerNeverTakesCannotPinCopiesOfADenseTable) {
  // 8 MB of dense values. A peer that never reads pulls all of it and pushes one element, over
  // and over: each queued reply would keep a copy of the whole slice alive after the push.
  TestCluster cluster(1, 1,
                      "  - name: big\n    kind: dense\n    shape: [2000000]\n"
                      "    init: {kind: zeros}\n    optimizer: {kind: sgd, lr: 0.1}\n",
                      "server:\n  max_request_bytes: 16MiB\n  max_queued_reply_bytes: 32MiB\n"
                      "  socket_hwm: 1000\n");
  ASSERT_TRUE(cluster.Start());
  RawPeer peer(cluster.manifest().cluster.servers[0]);
  peer.Send(Frames(Request(Op::Stats, 1000, 0)));
  ASSERT_TRUE(peer.Reply().ok());
  const uint64_t baseline = ResidentBytes(cluster.server(0).pid());
  zmq::context_t ctx(1);
  zmq::socket_t sink = NonReadingPeer(ctx, cluster.manifest().cluster.servers[0]);
  const float g = 1.0f;
  for (uint64_t i = 0; i < 150; ++i) {
    Header pull = Request(Op::PullDense, 1000, 0, 2 * i);
    pull.table_id = 0;
    pull.key_count = 2000000;
    pull.value_dim = 1;
    std::vector<zmq::message_t> f = Frames(pull);
    ASSERT_TRUE(SendFrames(sink, f).ok());
    Header push = Request(Op::PushDense, 0, 0, 2 * i + 1);
    push.table_id = 0;
    push.key_count = 1;
    push.value_dim = 1;
    push.rows_per_frame = 1;
    push.value_frames = 1;
    push.offset = i;
    f = Frames(push);
    f.push_back(Bytes(&g, sizeof(g)));
    ASSERT_TRUE(SendFrames(sink, f).ok());
  }
  std::string stats;
  for (int i = 0; i < 100 && JsonAt(stats, "/requests", 0) < 301; ++i) {
    peer.Send(Frames(Request(Op::Stats, 1000, 0)));
    Result<Header> r = peer.Reply();
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    stats = r->message;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  EXPECT_GE(JsonAt(stats, "/requests", 0), 301) << stats;
  EXPECT_GT(JsonAt(stats, "/replies_dropped", 0) + JsonAt(stats, "/peer_refusals", 0), 0)
      << stats;
  EXPECT_LE(JsonAt(stats, "/queued_reply_bytes", -1), 32 << 20) << stats;
  ExpectGrewLessAndStops(cluster, baseline, 96ull << 20);
}

TEST(HostileAdmissionTest, AdmissionCountsOfKeysPushedOnceExpireAndRespectMaxRows) {
  // Keys that need 3 pushes to be admitted, pushed once each: a client spraying new keys would
  // make the shard keep one count per key for ever. They expire after ttl_clocks and count
  // towards max_rows.
  TestCluster cluster(1, 1,
                      "  - name: emb\n    kind: sparse\n    dim: 4\n"
                      "    admission: {min_count: 3}\n"
                      "    eviction: {ttl_clocks: 2, max_rows: 5000}\n",
                      "server:\n  max_request_bytes: 16MiB\n");
  ASSERT_TRUE(cluster.Start());
  RawPeer peer(cluster.manifest().cluster.servers[0]);
  auto stats = [&] { return peer.Call(Frames(Request(Op::Stats, 1000, 0))).message; };
  stats();
  const uint64_t baseline = ResidentBytes(cluster.server(0).pid());
  std::vector<uint64_t> keys(100000);
  std::vector<float> grads(keys.size() * 4, 0.25f);
  uint64_t seq = 1;
  for (uint64_t round = 0; round < 10; ++round) {
    for (size_t i = 0; i < keys.size(); ++i) keys[i] = round * keys.size() + i + 1;
    Header push = Push(seq++, keys.size());
    push.worker_id = 0;
    std::vector<zmq::message_t> f = Frames(push);
    f.push_back(Bytes(keys.data(), keys.size() * 8));
    f.push_back(Bytes(grads.data(), grads.size() * 4));
    peer.Send(std::move(f));
    Result<Header> r = peer.Reply();
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    ASSERT_EQ(r->status, StatusCode::kOk) << r->message;
  }
  // A million keys counted once; the sweeps keep counts and rows within max_rows.
  std::string s;
  for (int i = 0; i < 100; ++i) {
    s = stats();
    if (JsonAt(s, "/tables/0/pending_keys", -1) <= 5000) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  EXPECT_LE(JsonAt(s, "/tables/0/pending_keys", -1), 5000) << s;
  EXPECT_GE(JsonAt(s, "/tables/0/pending_expired", -1), 995000) << s;
  EXPECT_EQ(JsonAt(s, "/tables/0/rows", -1), 0) << s;
  // Three clocks later every count has expired.
  for (int64_t c = 1; c <= 3; ++c) {
    peer.Send(Frames(Request(Op::Clock, 0, c, seq++)));
    Result<Header> r = peer.Reply();
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    ASSERT_EQ(r->status, StatusCode::kOk) << r->message;
  }
  for (int i = 0; i < 100; ++i) {
    s = stats();
    if (JsonAt(s, "/tables/0/pending_keys", -1) == 0) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  EXPECT_EQ(JsonAt(s, "/tables/0/pending_keys", -1), 0) << s;
  ExpectGrewLessAndStops(cluster, baseline, 160ull << 20);
}

TEST(HostileCheckpointTest, AFloodOfCheckpointRequestsWritesOnlyWhatChanged) {
  TestCluster cluster(1, 1, kTables, "checkpoint:\n  dir: ckpt\n  keep: 3\n");
  ASSERT_TRUE(cluster.Start());
  RawPeer peer(cluster.manifest().cluster.servers[0]);
  auto call = [&](Header h) {
    peer.Send(Frames(h));
    Result<Header> r = peer.Reply();
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    return r.ok() ? *r : Header{};
  };
  for (int i = 0; i < 20; ++i) {
    EXPECT_EQ(call(Request(Op::Checkpoint, 1000, 0, i)).status, StatusCode::kOk);
  }
  EXPECT_EQ(JsonAt(call(Request(Op::Stats, 1000, 0)).message, "/checkpoints", -1), 1);
  // A push changes the state: the next request writes again.
  Header push = Push(100, 1);
  std::vector<zmq::message_t> f = Frames(push);
  const uint64_t key = 9;
  const float g[4] = {1, 1, 1, 1};
  f.push_back(Bytes(&key, 8));
  f.push_back(Bytes(g, sizeof(g)));
  peer.Send(std::move(f));
  ASSERT_TRUE(peer.Reply().ok());
  EXPECT_EQ(call(Request(Op::Checkpoint, 1000, 0, 101)).status, StatusCode::kOk);
  EXPECT_EQ(call(Request(Op::Checkpoint, 1000, 0, 102)).status, StatusCode::kOk);
  EXPECT_EQ(JsonAt(call(Request(Op::Stats, 1000, 0)).message, "/checkpoints", -1), 2);
}

TEST(HostileCheckpointTest, RequestsAndRestartsCheckpointAtMostOncePerMinInterval) {
  // Each round changes the state (a push), claims a restart of worker 0 (a Hello of a new
  // process) and asks for a checkpoint: before, each round wrote two checkpoints.
  TestCluster cluster(1, 1, kTables, "checkpoint:\n  dir: ckpt\n  min_interval: 500ms\n");
  ASSERT_TRUE(cluster.Start());
  RawPeer peer(cluster.manifest().cluster.servers[0]);
  auto call = [&](std::vector<zmq::message_t> f) { return peer.Call(std::move(f)); };
  const uint64_t key = 9;
  const float g[4] = {1, 1, 1, 1};
  const auto start = std::chrono::steady_clock::now();
  uint64_t rounds = 0;
  // For 2 s, and at least 3 rounds (a loaded machine may take a second over one), at most 30 s.
  auto elapsed = [&] { return std::chrono::steady_clock::now() - start; };
  while ((elapsed() < std::chrono::seconds(2) || rounds < 3) &&
         elapsed() < std::chrono::seconds(30)) {
    std::vector<zmq::message_t> f = Frames(Push(1000 + rounds, 1));
    f.push_back(Bytes(&key, 8));
    f.push_back(Bytes(g, sizeof(g)));
    ASSERT_EQ(call(std::move(f)).status, StatusCode::kOk);
    Header hello = Request(Op::Hello, 0, 0, 2000 + rounds);
    hello.incarnation = 100 + rounds;
    hello.manifest_hash = cluster.manifest().Fingerprint();
    const Header hi = call(Frames(hello));
    ASSERT_EQ(hi.status, StatusCode::kOk) << hi.message;
    EXPECT_EQ(hi.op, Op::Hello);
    ASSERT_EQ(call(Frames(Request(Op::Checkpoint, 1000, 0, 3000 + rounds))).status,
              StatusCode::kOk);
    ++rounds;
  }
  const std::string stats = call(Frames(Request(Op::Stats, 1000, 0))).message;
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("%llu rounds in %.2f s: %.0f checkpoints\n", (unsigned long long)rounds, seconds,
              JsonAt(stats, "/checkpoints", -1));
  EXPECT_GE(rounds, 2u);
  EXPECT_EQ(JsonAt(stats, "/worker_restarts", -1), static_cast<double>(rounds)) << stats;
  // One per 0.5 s at most, the first at once.
  EXPECT_LE(JsonAt(stats, "/checkpoints", -1), seconds / 0.5 + 1) << stats;
  EXPECT_GE(JsonAt(stats, "/checkpoints", -1), 2) << stats;
  // Every request was answered once its checkpoint was durable: none is being written.
  EXPECT_NE(stats.find("\"checkpoint_writing\":false"), std::string::npos) << stats;
}

TEST(HostileCheckpointTest, PushLogBoundCheckpointsKeepToMinIntervalUntilTheLogIsNearlyFull) {
  // A worker's pushes here bound its push log: a checkpoint once it has pushed half its share
  // (4 MiB / 2) since the last one. Such checkpoints also come at most once per min_interval
  // (3 s), unless the share is nearly used up (room for one more 64 KiB push left). The
  // shard's log says when each began and how many bytes the worker had pushed by then.
  TestCluster cluster(1, 1, kTables,
                      "server:\n  max_request_bytes: 64KiB\n"
                      "checkpoint:\n  dir: ckpt\n  background: false\n  max_log_bytes: 4MiB\n"
                      "  min_interval: 3s\n");
  ASSERT_TRUE(cluster.Start());
  RawPeer peer(cluster.manifest().cluster.servers[0]);
  const uint64_t rows = 2000;  // 48,000 bytes a push (keys and values)
  std::vector<uint64_t> keys(rows);
  std::vector<float> grads(rows * 4, 0.001f);
  for (uint64_t i = 0; i < rows; ++i) keys[i] = i;
  uint64_t seq = 1;
  auto push = [&](int n) {
    for (int i = 0; i < n; ++i) {
      std::vector<zmq::message_t> f = Frames(Push(seq++, rows));
      f.push_back(Bytes(keys.data(), keys.size() * 8));
      f.push_back(Bytes(grads.data(), grads.size() * 4));
      const Header r = peer.Call(std::move(f));
      ASSERT_EQ(r.status, StatusCode::kOk) << r.message;
    }
  };
  auto checkpoints = [&] {
    return JsonAt(peer.Call(Frames(Request(Op::Stats, 1000, 0))).message, "/checkpoints", -1);
  };
  // The log-bound checkpoints so far: when each was written (seconds of the day) and the bytes
  // the worker had pushed since the one before.
  auto bound = [&] {
    std::vector<std::pair<double, uint64_t>> out;
    std::istringstream log(cluster.ServerLog(0));
    for (std::string line; std::getline(log, line);) {
      const size_t at = line.find(" bytes since the last one (checkpoint.max_log_bytes)");
      const size_t pushed = line.rfind("pushed ", at);
      if (at == std::string::npos || pushed == std::string::npos || line.size() < 13) continue;
      const double t = std::stoi(line.substr(1, 2)) * 3600.0 + std::stoi(line.substr(4, 2)) * 60 +
                       std::stod(line.substr(7, 6));
      out.emplace_back(t, std::stoull(line.substr(pushed + 7, at - pushed - 7)));
    }
    return out;
  };
  const double before = checkpoints();
  const uint64_t half = (4u << 20) / 2, full = (4u << 20) - (64u << 10);
  push(44);  // 2,112,000 bytes: half the share; the first such checkpoint comes at once
  ASSERT_EQ(checkpoints(), before + 1);
  // Nearly the whole share at once: past half of it, the checkpoint waits (min_interval);
  // at `full`, it does not.
  push(87);
  auto b = bound();
  ASSERT_EQ(b.size(), 2u) << cluster.ServerLog(0);
  if (b[1].first - b[0].first >= 3.0) {
    GTEST_SKIP() << "4 MB of pushes took " << b[1].first - b[0].first
                 << " s here, longer than min_interval: the case is not reached";
  }
  EXPECT_GE(b[0].second, half);
  EXPECT_LT(b[0].second, half + 48000);
  EXPECT_GE(b[1].second, full);  // not at half the share: it waited until the share was full
  EXPECT_LT(b[1].second, full + 48000);
  // Half the share again: it waits for min_interval, then comes without a push asking.
  push(44);
  double now = checkpoints();
  for (int i = 0; i < 100 && now < before + 3; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    now = checkpoints();
  }
  EXPECT_EQ(now, before + 3);
  b = bound();
  ASSERT_EQ(b.size(), 3u) << cluster.ServerLog(0);
  EXPECT_GE(b[2].first - b[1].first, 2.99) << "a log-bound checkpoint before min_interval";
  EXPECT_GE(b[2].second, half);
}

TEST(HostileCheckpointTest, AHelloOfAnotherManifestDoesNotLearnTheShardsFingerprint) {
  TestCluster cluster(1, 1, kTables);
  ASSERT_TRUE(cluster.Start());
  RawPeer peer(cluster.manifest().cluster.servers[0]);
  Header hello = Request(Op::Hello, 1000, 0, 1);
  hello.manifest_hash = 0x1234;
  peer.Send(Frames(hello));
  Result<Header> r = peer.Reply();
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->status, StatusCode::kFailedPrecondition);
  EXPECT_NE(r->message.find("manifest mismatch"), std::string::npos) << r->message;
  char hex[17];
  std::snprintf(hex, sizeof(hex), "%016llx",
                static_cast<unsigned long long>(cluster.manifest().Fingerprint()));
  EXPECT_EQ(r->message.find(hex), std::string::npos) << r->message;
  EXPECT_NE(r->manifest_hash, cluster.manifest().Fingerprint());
}

}  // namespace
}  // namespace parasol
