#include "common/wire.hpp"

#include <flatbuffers/flatbuffers.h>
#include <gtest/gtest.h>

#include <atomic>
#include <random>
#include <thread>

#include "common/transport.hpp"

namespace parasol {
namespace {

Header FullHeader() {
  Header h;
  h.op = Op::PushSparse;
  h.request_id = 0x1122334455667788ULL;
  h.worker_id = 7;
  h.seq = 42;
  h.incarnation = 0xabcdef;
  h.table_id = 3;
  h.clock = -5;
  h.key_count = 1000;
  h.value_dim = 16;
  h.offset = 123456789;
  h.value_frames = 2;
  h.rows_per_frame = 600;
  h.status = StatusCode::kNotFound;
  h.message = "no such table";
  h.manifest_hash = 0xfeedULL;
  h.duplicate = true;
  h.shard_rank = 1;
  h.shard_count = 4;
  return h;
}

TEST(WireTest, HeaderRoundTripKeepsEveryField) {
  const Header h = FullHeader();
  zmq::message_t frame = EncodeHeader(h);
  Result<Header> d = DecodeHeader(frame.data(), frame.size());
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  EXPECT_EQ(d->op, h.op);
  EXPECT_EQ(d->request_id, h.request_id);
  EXPECT_EQ(d->worker_id, h.worker_id);
  EXPECT_EQ(d->seq, h.seq);
  EXPECT_EQ(d->incarnation, h.incarnation);
  EXPECT_EQ(d->table_id, h.table_id);
  EXPECT_EQ(d->clock, h.clock);
  EXPECT_EQ(d->key_count, h.key_count);
  EXPECT_EQ(d->value_dim, h.value_dim);
  EXPECT_EQ(d->offset, h.offset);
  EXPECT_EQ(d->value_frames, h.value_frames);
  EXPECT_EQ(d->rows_per_frame, h.rows_per_frame);
  EXPECT_EQ(d->status, h.status);
  EXPECT_EQ(d->message, h.message);
  EXPECT_EQ(d->manifest_hash, h.manifest_hash);
  EXPECT_EQ(d->duplicate, h.duplicate);
  EXPECT_EQ(d->shard_rank, h.shard_rank);
  EXPECT_EQ(d->shard_count, h.shard_count);
}

TEST(WireTest, TruncatedHeaderIsRejectedAtEveryLength) {
  zmq::message_t frame = EncodeHeader(FullHeader());
  for (size_t n = 0; n < frame.size(); ++n) {
    Result<Header> d = DecodeHeader(frame.data(), n);
    EXPECT_FALSE(d.ok()) << "accepted a header cut to " << n << " of " << frame.size();
  }
}

TEST(WireTest, GarbageIsRejected) {
  std::mt19937_64 rng(1);
  std::vector<uint8_t> junk(200);
  for (int trial = 0; trial < 2000; ++trial) {
    for (auto& b : junk) b = static_cast<uint8_t>(rng());
    const size_t n = rng() % junk.size();
    Result<Header> d = DecodeHeader(junk.data(), n);
    EXPECT_FALSE(d.ok());
  }
  const std::string text = "GET / HTTP/1.1\r\nHost: x\r\n\r\n";
  Result<Header> d = DecodeHeader(text.data(), text.size());
  ASSERT_FALSE(d.ok());
  EXPECT_EQ(d.status().code(), StatusCode::kBadMessage);
}

TEST(WireTest, CorruptedOffsetsInsideAValidFrameAreCaughtByTheVerifier) {
  zmq::message_t frame = EncodeHeader(FullHeader());
  std::vector<uint8_t> bytes(static_cast<uint8_t*>(frame.data()),
                             static_cast<uint8_t*>(frame.data()) + frame.size());
  // Point the root offset (after the 4-byte size prefix) far outside the buffer, keeping the
  // identifier and the size.
  bytes[4] = 0xff;
  bytes[5] = 0xff;
  bytes[6] = 0x00;
  bytes[7] = 0x00;
  Result<Header> d = DecodeHeader(bytes.data(), bytes.size());
  ASSERT_FALSE(d.ok());
  EXPECT_NE(d.status().message().find("verification"), std::string::npos);
}

TEST(WireTest, WrongVersionIsRejectedWithVersionMismatch) {
  Header h = FullHeader();
  h.version = kProtocolVersion + 1;
  zmq::message_t frame = EncodeHeader(h);
  Result<Header> d = DecodeHeader(frame.data(), frame.size());
  ASSERT_FALSE(d.ok());
  EXPECT_EQ(d.status().code(), StatusCode::kVersionMismatch);
  EXPECT_NE(d.status().message().find("protocol version " + std::to_string(kProtocolVersion + 1)),
            std::string::npos);
  // A peer of the version before (no Step op) is refused too.
  h.version = kProtocolVersion - 1;
  frame = EncodeHeader(h);
  d = DecodeHeader(frame.data(), frame.size());
  ASSERT_FALSE(d.ok());
  EXPECT_EQ(d.status().code(), StatusCode::kVersionMismatch);
}

TEST(WireTest, OversizedHeaderIsRejected) {
  Header h = FullHeader();
  h.message.assign(kMaxHeaderBytes, 'x');
  zmq::message_t frame = EncodeHeader(h);
  Result<Header> d = DecodeHeader(frame.data(), frame.size());
  ASSERT_FALSE(d.ok());
  EXPECT_NE(d.status().message().find("exceeds"), std::string::npos);
}

// Frames for a PushSparse of `rows` rows of dim 4 in frames of `rpf` rows.
std::vector<zmq::message_t> PushFrames(uint64_t rows, uint64_t rpf) {
  std::vector<zmq::message_t> f;
  f.emplace_back(rows * 8);
  for (uint64_t first = 0; first < rows; first += rpf) {
    f.emplace_back(std::min(rpf, rows - first) * 4 * sizeof(float));
  }
  return f;
}

Header PushHeader(uint64_t rows, uint64_t rpf) {
  Header h;
  h.op = Op::PushSparse;
  h.key_count = rows;
  h.value_dim = 4;
  h.rows_per_frame = rpf;
  h.value_frames = static_cast<uint32_t>((rows + rpf - 1) / rpf);
  return h;
}

TEST(WireTest, PayloadMatchingTheHeaderIsAccepted) {
  auto frames = PushFrames(10, 4);
  Result<PayloadView> v = PayloadView::Parse(PushHeader(10, 4), frames, 1 << 20);
  ASSERT_TRUE(v.ok()) << v.status().ToString();
  EXPECT_EQ(v->rows(), 10u);
  // Row 9 lives in the third frame, at its second row.
  EXPECT_EQ(v->Row(9), static_cast<const std::byte*>(frames[3].data()) + 1 * 16);
}

TEST(WireTest, PayloadSizeMismatchesAreRejected) {
  {  // keys frame one byte short
    auto frames = PushFrames(10, 4);
    frames[0].rebuild(10 * 8 - 1);
    auto v = PayloadView::Parse(PushHeader(10, 4), frames, 1 << 20);
    ASSERT_FALSE(v.ok());
    EXPECT_NE(v.status().message().find("keys frame has 79 bytes"), std::string::npos)
        << v.status().message();
  }
  {  // a value frame too long
    auto frames = PushFrames(10, 4);
    frames[2].rebuild(4 * 16 + 4);
    auto v = PayloadView::Parse(PushHeader(10, 4), frames, 1 << 20);
    ASSERT_FALSE(v.ok());
    EXPECT_NE(v.status().message().find("value frame 1"), std::string::npos);
  }
  {  // a frame missing
    auto frames = PushFrames(10, 4);
    frames.pop_back();
    EXPECT_FALSE(PayloadView::Parse(PushHeader(10, 4), frames, 1 << 20).ok());
  }
  {  // an extra frame
    auto frames = PushFrames(10, 4);
    frames.emplace_back(16);
    EXPECT_FALSE(PayloadView::Parse(PushHeader(10, 4), frames, 1 << 20).ok());
  }
  {  // frame count in the header inconsistent with rows_per_frame
    auto frames = PushFrames(10, 4);
    Header h = PushHeader(10, 4);
    h.value_frames = 2;
    EXPECT_FALSE(PayloadView::Parse(h, frames, 1 << 20).ok());
  }
  {  // zero dim
    auto frames = PushFrames(10, 4);
    Header h = PushHeader(10, 4);
    h.value_dim = 0;
    EXPECT_FALSE(PayloadView::Parse(h, frames, 1 << 20).ok());
  }
  {  // unsupported dtype
    auto frames = PushFrames(10, 4);
    Header h = PushHeader(10, 4);
    h.dtype = wire::DType::BF16;
    auto v = PayloadView::Parse(h, frames, 1 << 20);
    ASSERT_FALSE(v.ok());
    EXPECT_NE(v.status().message().find("BF16"), std::string::npos);
  }
}

TEST(WireTest, OversizedCountsAreRefusedBeforeAnyAllocation) {
  std::vector<zmq::message_t> frames;
  frames.emplace_back(8);
  Header h = PushHeader(10, 4);
  h.key_count = uint64_t{1} << 40;
  h.rows_per_frame = 1;
  h.value_frames = 1;
  auto v = PayloadView::Parse(h, frames, 1 << 20);
  ASSERT_FALSE(v.ok());
  EXPECT_EQ(v.status().code(), StatusCode::kResourceExhausted);
  EXPECT_NE(v.status().message().find("server.max_request_bytes"), std::string::npos);
}

TEST(WireTest, CountsWhoseByteSizeWrapsAreRefusedNamingTheField) {
  std::vector<zmq::message_t> frames;
  frames.emplace_back(8);
  frames.emplace_back(8);
  Header h = PushHeader(10, 4);
  h.key_count = uint64_t{1} << 62;  // x 16 bytes per row wraps to 0
  h.rows_per_frame = 1;
  h.value_frames = 1;
  auto v = PayloadView::Parse(h, frames, ~uint64_t{0});
  ASSERT_FALSE(v.ok());
  EXPECT_EQ(v.status().code(), StatusCode::kBadMessage);
  EXPECT_NE(v.status().message().find("key_count"), std::string::npos) << v.status().ToString();
}

TEST(WireTest, AFrameCountThatWrapsToZeroIsRefused) {
  // rows_per_frame 2^64-1 made (key_count + rpf - 1) / rpf wrap to 0 frames: accepted with no
  // value frame, the handler then read a row that was not there.
  std::vector<zmq::message_t> frames;
  frames.emplace_back(16);  // 2 keys, and no value frame
  Header h = PushHeader(2, 16);
  h.rows_per_frame = ~uint64_t{0};
  h.value_frames = 0;
  auto v = PayloadView::Parse(h, frames, 1 << 20);
  ASSERT_FALSE(v.ok());
  EXPECT_EQ(v.status().code(), StatusCode::kBadMessage);
  EXPECT_NE(v.status().message().find("need 1"), std::string::npos) << v.status().ToString();
}

TEST(WireTest, FramePlanKeepsFramesUnderTheLimit) {
  const FramePlan p = PlanValueFrames(1000, 16, 4096);  // 64-byte rows, 64 rows per frame
  EXPECT_EQ(p.rows_per_frame, 64u);
  EXPECT_EQ(p.frames, 16u);
  EXPECT_EQ(p.RowsInFrame(15, 1000), 1000u - 15 * 64);
  const FramePlan wide = PlanValueFrames(3, 4096, 1024);  // a row larger than a frame
  EXPECT_EQ(wide.rows_per_frame, 1u);
  EXPECT_EQ(wide.frames, 3u);
  EXPECT_EQ(PlanValueFrames(0, 4, 4096).frames, 0u);
}

TEST(TransportTest, OwnedBufferTravelsWithoutACopy) {
  OwnedBuffer b = OwnedBuffer::Allocate(1 << 20);
  std::byte* p = b.data();
  zmq::message_t m = std::move(b).ToMessage();
  EXPECT_EQ(m.data(), p);
  EXPECT_EQ(m.size(), 1u << 20);
  EXPECT_EQ(b.size(), 0u);
}

TEST(TransportTest, BorrowTrackerWaitsForEveryCopyToBeReleased) {
  std::vector<float> data(1024, 1.0f);
  BorrowTracker tracker;
  auto a = std::make_unique<zmq::message_t>(BorrowedMessage(data.data(), data.size() * 4, &tracker));
  zmq::message_t b;
  b.copy(*a);
  EXPECT_EQ(b.data(), data.data());  // shared, not copied
  std::atomic<bool> released{false};
  std::thread waiter([&] {
    tracker.WaitReleased();
    released = true;
  });
  a.reset();  // one copy left: the wait must go on
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_FALSE(released.load());
  b = zmq::message_t();  // the last copy goes
  waiter.join();
  EXPECT_TRUE(released.load());
}

}  // namespace
}  // namespace parasol
