// Malformed and repeated messages sent straight to a real shard over a raw DEALER socket.
#include <gtest/gtest.h>

#include <random>

#include "common/initializer.hpp"
#include "common/transport.hpp"
#include "common/wire.hpp"
#include "tests/support/test_cluster.hpp"

namespace parasol {
namespace {

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
  h.version = 9;
  ExpectError(Frames(h), "protocol version 9");
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
  ExpectError(std::move(f), "exceed the limit");
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

TEST_F(HostileInputTest, BadMessagesAreCounted) {
  std::vector<zmq::message_t> f;
  f.push_back(Bytes("nonsense", 8));
  ExpectError(std::move(f), "");
  auto stats = client_->Stats();
  ASSERT_TRUE(stats.ok());
  EXPECT_NE((*stats)[0].find("\"bad_messages\":1"), std::string::npos) << (*stats)[0];
}

}  // namespace
}  // namespace parasol
