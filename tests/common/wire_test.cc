#include "common/wire.hpp"

#include <flatbuffers/flatbuffers.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <limits>
#include <random>
#include <thread>

#include "common/half.hpp"
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
  h.value_scale = -9;
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
  EXPECT_EQ(d->value_scale, h.value_scale);
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
  {  // 16-bit values in frames sized for f32
    auto frames = PushFrames(10, 4);
    Header h = PushHeader(10, 4);
    h.dtype = wire::DType::BF16;
    auto v = PayloadView::Parse(h, frames, 1 << 20);
    ASSERT_FALSE(v.ok());
    EXPECT_NE(v.status().message().find("expected 32"), std::string::npos)
        << v.status().message();
  }
  {  // a dtype that does not exist
    auto frames = PushFrames(10, 4);
    Header h = PushHeader(10, 4);
    h.dtype = static_cast<wire::DType>(7);
    auto v = PayloadView::Parse(h, frames, 1 << 20);
    ASSERT_FALSE(v.ok());
    EXPECT_NE(v.status().message().find("dtype 7"), std::string::npos) << v.status().message();
  }
  {  // a scale on f32 values, and an f16 scale out of range
    auto frames = PushFrames(10, 4);
    Header h = PushHeader(10, 4);
    h.value_scale = 3;
    EXPECT_FALSE(PayloadView::Parse(h, frames, 1 << 20).ok());
    std::vector<zmq::message_t> half;
    half.emplace_back(10 * 8);
    for (uint64_t first = 0; first < 10; first += 4) half.emplace_back(std::min<uint64_t>(4, 10 - first) * 4 * 2);
    h.dtype = wire::DType::F16;
    h.value_scale = kMaxValueScale + 1;
    auto v = PayloadView::Parse(h, half, 1 << 20);
    ASSERT_FALSE(v.ok());
    EXPECT_NE(v.status().message().find("value_scale"), std::string::npos) << v.status().message();
    h.value_scale = -kMaxValueScale;
    EXPECT_TRUE(PayloadView::Parse(h, half, 1 << 20).ok());
  }
}

// Compressed values: bf16 and f16 frames are widened to f32 rows, equal to the values rounded
// to nearest even; an f16 message's scale keeps gradients far below f16's smallest normal
// (6e-5) from flushing to zero.
TEST(WireTest, SixteenBitValuesAreWidenedToTheRoundedValues) {
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  const uint64_t rows = 10, rpf = 4, dim = 4;
  std::vector<float> values(rows * dim);
  for (float& v : values) v = u(rng) * 1e-6f;  // small gradients
  values[5] = 0.0f;
  for (wire::DType dtype : {wire::DType::BF16, wire::DType::F16}) {
    float max_abs = 0;
    for (float v : values) max_abs = std::max(max_abs, std::abs(v));
    const int scale = dtype == wire::DType::F16 ? F16Scale(max_abs) : 0;
    std::vector<zmq::message_t> frames;
    frames.emplace_back(rows * 8);
    for (uint64_t first = 0; first < rows; first += rpf) {
      const uint64_t n = std::min(rpf, rows - first) * dim;
      frames.emplace_back(n * 2);
      NarrowValues(values.data() + first * dim, n, dtype, scale,
                   static_cast<std::byte*>(frames.back().data()));
    }
    Header h = PushHeader(rows, rpf);
    h.dtype = dtype;
    h.value_scale = static_cast<int16_t>(scale);
    Result<PayloadView> v = PayloadView::Parse(h, frames, 1 << 20);
    ASSERT_TRUE(v.ok()) << v.status().ToString();
    for (uint64_t r = 0; r < rows; ++r) {
      float got[4];
      std::memcpy(got, v->Row(r), sizeof got);
      for (uint64_t d = 0; d < dim; ++d) {
        const float want = values[r * dim + d];
        const float rounded = dtype == wire::DType::BF16
                                  ? Bf16ToF32(F32ToBf16(want))
                                  : F16ToF32(F32ToF16(std::ldexp(want, scale))) * std::ldexp(1.0f, -scale);
        EXPECT_EQ(got[d], rounded) << "row " << r << " column " << d;
        // bf16 keeps 8 bits, f16 (scaled) 11: nothing flushed to zero.
        const double rel = dtype == wire::DType::BF16 ? 1.0 / 256 : 1.0 / 2048;
        EXPECT_NEAR(got[d], want, std::abs(want) * rel) << "row " << r << " column " << d;
        if (want != 0) { EXPECT_NE(got[d], 0.0f); }
      }
    }
  }
  // Without the scale, f16 would have flushed most of them.
  int flushed = 0;
  for (float v : values) flushed += v != 0 && F16ToF32(F32ToF16(v)) == 0.0f;
  EXPECT_GT(flushed, 0);
  EXPECT_EQ(F16Scale(0.0f), 0);
  EXPECT_EQ(F16Scale(std::numeric_limits<float>::infinity()), 0);
  EXPECT_EQ(F16Scale(1.0f), 14);  // 1 x 2^14 in [2^14, 2^15)
  // Every finite value comes back finite: 1e30 is brought under f16's top, not to infinity.
  // (f32's very largest values round up to 2^128, infinity, in f16 as in bf16: 1e38 stays.)
  for (float big : {1e30f, 1e38f, 65504.0f, 1e5f}) {
    const int scale = F16Scale(big);
    EXPECT_LE(std::abs(scale), kMaxValueScale);
    std::byte narrow[2];
    float back = 0;
    NarrowValues(&big, 1, wire::DType::F16, scale, narrow);
    WidenValues(narrow, 1, wire::DType::F16, scale, &back);
    EXPECT_TRUE(std::isfinite(back)) << big;
    EXPECT_NEAR(back, big, big / 1024) << big;
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
