// How a worker's requests are cut into frames (worker/request_frames.hpp): a sparse push's keys
// and summed gradient rows by shard, a sparse pull's key frames, a dense tensor's chunks, and
// value frames narrowed to the wire dtype. Pure: no sockets.
#include "worker/request_frames.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <map>
#include <utility>
#include <vector>

#include "common/key_index.hpp"

namespace parasol {
namespace {

std::vector<uint64_t> KeysIn(const zmq::message_t& frame) {
  std::vector<uint64_t> keys(frame.size() / sizeof(uint64_t));
  std::memcpy(keys.data(), frame.data(), keys.size() * sizeof(uint64_t));
  return keys;
}

std::vector<float> FloatsIn(const zmq::message_t& frame) {
  std::vector<float> v(frame.size() / sizeof(float));
  std::memcpy(v.data(), frame.data(), v.size() * sizeof(float));
  return v;
}

// A shard's value frames, concatenated.
std::vector<float> RowsIn(const std::vector<zmq::message_t>& frames) {
  std::vector<float> rows;
  for (const zmq::message_t& f : frames) {
    const std::vector<float> v = FloatsIn(f);
    rows.insert(rows.end(), v.begin(), v.end());
  }
  return rows;
}

zmq::message_t FloatFrame(const std::vector<float>& v) {
  return zmq::message_t(v.data(), v.size() * sizeof(float));
}

// keys {10, 20, 10, 30, 10} between two shards, split by hand: 10 and 30 to shard 1 (rows 0
// and 1 there), 20 to shard 0.
KeySplit HandSplit() {
  KeySplit split;
  split.inverse = {0, 1, 0, 2, 0};
  split.unique_shard = {1, 0, 1};
  split.unique_local = {0, 0, 1};
  split.counts = {1, 2};
  return split;
}

TEST(RequestFramesTest, AKeyGivenThriceTravelsOnceWithItsRowsSummedInTheCallersOrder) {
  const std::vector<uint64_t> keys = {10, 20, 10, 30, 10};
  // Key 10's first elements sum to 0 in the caller's order ((1 + 1e8) - 1e8: the 1 is lost to
  // rounding) and to 1 in any order that adds the 1 last.
  const std::vector<float> grads = {1.0f,  0.5f,   // 10
                                    7.0f,  8.0f,   // 20
                                    1e8f,  0.25f,  // 10
                                    -3.0f, 4.5f,   // 30
                                    -1e8f, 2.0f};  // 10
  PushFrames out;
  BuildPushFrames(keys, grads, /*dim=*/2, HandSplit(), /*shards=*/2, /*frame_bytes=*/1024, out);
  ASSERT_EQ(out.keys.size(), 2u);
  EXPECT_EQ(KeysIn(out.keys[0]), (std::vector<uint64_t>{20}));
  EXPECT_EQ(KeysIn(out.keys[1]), (std::vector<uint64_t>{10, 30}));
  EXPECT_EQ(RowsIn(out.values[0]), (std::vector<float>{7.0f, 8.0f}));
  EXPECT_EQ(RowsIn(out.values[1]), (std::vector<float>{0.0f, 2.75f, -3.0f, 4.5f}));
}

TEST(RequestFramesTest, KeysLandInTheirShardsFrameAndValueFramesHoldExactlyTheRows) {
  const Placement placement(3);
  const uint32_t dim = 3;
  std::vector<uint64_t> keys;
  for (uint64_t k = 0; k < 60; ++k) keys.push_back(1000 + k * 7919);
  for (uint64_t k = 0; k < 20; ++k) keys.push_back(1000 + k * 3 * 7919);  // repeats
  std::vector<float> grads(keys.size() * dim);
  for (size_t i = 0; i < grads.size(); ++i) grads[i] = static_cast<float>(i % 97) * 0.125f - 3;
  // The expected row of each distinct key, summed in the caller's order; its first position.
  std::map<uint64_t, std::vector<float>> sum;
  std::vector<uint64_t> first_seen;
  for (size_t i = 0; i < keys.size(); ++i) {
    auto [it, inserted] =
        sum.try_emplace(keys[i], grads.begin() + i * dim, grads.begin() + (i + 1) * dim);
    if (inserted) {
      first_seen.push_back(keys[i]);
    } else {
      for (uint32_t d = 0; d < dim; ++d) it->second[d] += grads[i * dim + d];
    }
  }
  KeyIndex index;
  KeySplit split;
  SplitKeys(keys, placement, 3, index, split);
  const uint64_t frame_bytes = 2 * dim * sizeof(float) + 4;  // two rows, not three
  PushFrames out;
  BuildPushFrames(keys, grads, dim, split, 3, frame_bytes, out);

  size_t total_keys = 0;
  for (uint32_t s = 0; s < 3; ++s) {
    SCOPED_TRACE("shard " + std::to_string(s));
    std::vector<uint64_t> want_keys;
    for (uint64_t k : first_seen) {
      if (placement.ShardOf(k) == s) want_keys.push_back(k);
    }
    ASSERT_GE(want_keys.size(), 3u) << "the keys should give each shard several frames";
    EXPECT_EQ(KeysIn(out.keys[s]), want_keys);
    EXPECT_EQ(out.plans[s].rows_per_frame, 2u);
    EXPECT_EQ(out.plans[s].frames, (want_keys.size() + 1) / 2);
    ASSERT_EQ(out.values[s].size(), out.plans[s].frames);
    for (const zmq::message_t& f : out.values[s]) EXPECT_LE(f.size(), frame_bytes);
    std::vector<float> want_rows;
    for (uint64_t k : want_keys) want_rows.insert(want_rows.end(), sum[k].begin(), sum[k].end());
    EXPECT_EQ(RowsIn(out.values[s]), want_rows);
    total_keys += want_keys.size();
  }
  EXPECT_EQ(total_keys, first_seen.size());
}

TEST(RequestFramesTest, ARowLargerThanFrameBytesTravelsAloneInItsFrame) {
  const std::vector<uint64_t> keys = {10, 20, 10, 30, 10};
  std::vector<float> grads(keys.size() * 4);
  for (size_t i = 0; i < grads.size(); ++i) grads[i] = static_cast<float>(i);
  PushFrames out;
  BuildPushFrames(keys, grads, /*dim=*/4, HandSplit(), 2, /*frame_bytes=*/8, out);
  EXPECT_EQ(out.plans[1].rows_per_frame, 1u);
  ASSERT_EQ(out.values[1].size(), 2u);
  // Key 10: rows 0, 2 and 4 summed; key 30: row 3.
  EXPECT_EQ(FloatsIn(out.values[1][0]), (std::vector<float>{24, 27, 30, 33}));
  EXPECT_EQ(FloatsIn(out.values[1][1]), (std::vector<float>{12, 13, 14, 15}));
}

TEST(RequestFramesTest, ASecondBuildReplacesTheFramesOfTheFirst) {
  PushFrames out;
  {
    const std::vector<uint64_t> keys = {10, 20, 10, 30, 10};
    const std::vector<float> grads(keys.size(), 1.0f);
    BuildPushFrames(keys, grads, 1, HandSplit(), 2, /*frame_bytes=*/4, out);
    ASSERT_EQ(out.values[1].size(), 2u);
  }
  // Now only one key, to shard 0: shard 1 gets an empty key frame and no value frames.
  KeySplit split;
  split.inverse = {0};
  split.unique_shard = {0};
  split.unique_local = {0};
  split.counts = {1, 0};
  const std::vector<uint64_t> keys = {5};
  const std::vector<float> grads = {-2.5f};
  BuildPushFrames(keys, grads, 1, split, 2, 4, out);
  EXPECT_EQ(KeysIn(out.keys[0]), (std::vector<uint64_t>{5}));
  EXPECT_EQ(RowsIn(out.values[0]), (std::vector<float>{-2.5f}));
  EXPECT_EQ(out.keys[1].size(), 0u);
  EXPECT_EQ(out.plans[1].frames, 0u);
  EXPECT_TRUE(out.values[1].empty());
}

TEST(RequestFramesTest, PullKeyFramesHoldEachShardsKeysAtTheirRowsAndLeaveCacheHitsOut) {
  // keys {7, 8, 9, 7, 10, 8, 11}: 8 was answered by the row cache (kNoShard); 7 and 11 go to
  // shard 1 (rows 1 and 0), 9 and 10 to shard 2 (rows 0 and 1), nothing to shard 0.
  const std::vector<uint64_t> keys = {7, 8, 9, 7, 10, 8, 11};
  KeySplit split;
  split.inverse = {0, 1, 2, 0, 3, 1, 4};
  split.unique_shard = {1, kNoShard, 2, 2, 1};
  split.unique_local = {1, 0, 0, 1, 0};
  split.counts = {0, 2, 2};
  std::vector<zmq::message_t> key_bufs(1);  // resized, and each frame rebuilt
  key_bufs[0].rebuild(64);
  PullKeyFrames(keys, split, 3, key_bufs);
  ASSERT_EQ(key_bufs.size(), 3u);
  EXPECT_EQ(key_bufs[0].size(), 0u);
  EXPECT_EQ(KeysIn(key_bufs[1]), (std::vector<uint64_t>{11, 7}));
  EXPECT_EQ(KeysIn(key_bufs[2]), (std::vector<uint64_t>{9, 10}));
  for (uint32_t s = 1; s < 3; ++s) {
    EXPECT_EQ(reinterpret_cast<uintptr_t>(key_bufs[s].data()) % alignof(uint64_t), 0u)
        << "shard " << s;
  }
}

TEST(RequestFramesTest, PullKeyFramesFollowTheSplitOfARealPlacement) {
  const Placement placement = Placement(2).Grown();  // three shards, not uniform
  std::vector<uint64_t> keys;
  for (uint64_t k = 0; k < 50; ++k) keys.push_back(k * k + 3);
  keys.push_back(3);  // a repeat
  KeyIndex index;
  KeySplit split;
  SplitKeys(keys, placement, 3, index, split);
  std::vector<zmq::message_t> key_bufs;
  PullKeyFrames(keys, split, 3, key_bufs);
  ASSERT_EQ(key_bufs.size(), 3u);
  size_t total = 0;
  for (uint32_t s = 0; s < 3; ++s) {
    std::vector<uint64_t> want;
    for (size_t i = 0; i + 1 < keys.size(); ++i) {  // the repeat travels once
      if (placement.ShardOf(keys[i]) == s) want.push_back(keys[i]);
    }
    EXPECT_EQ(KeysIn(key_bufs[s]), want) << "shard " << s;
    total += want.size();
  }
  EXPECT_EQ(total, 50u);
}

// Every chunk ForEachDenseChunk gives, in order.
std::vector<std::pair<uint32_t, SliceRange>> Chunks(uint64_t total, const Placement& placement,
                                                    uint64_t frame_bytes) {
  std::vector<std::pair<uint32_t, SliceRange>> chunks;
  ForEachDenseChunk(total, placement, frame_bytes, [&](uint32_t shard, SliceRange c) {
    chunks.push_back({shard, c});
  });
  return chunks;
}

std::vector<std::vector<uint64_t>> AsLists(
    const std::vector<std::pair<uint32_t, SliceRange>>& chunks) {
  std::vector<std::vector<uint64_t>> out;
  for (const auto& [shard, c] : chunks) out.push_back({shard, c.begin, c.end});
  return out;
}

TEST(RequestFramesTest, DenseChunksCutEachShardsSliceInFrameSizedPieces) {
  // 10 elements among 3 shards: [0, 4), [4, 7), [7, 10); two floats a chunk.
  EXPECT_EQ(AsLists(Chunks(10, Placement(3), 8)),
            (std::vector<std::vector<uint64_t>>{
                {0, 0, 2}, {0, 2, 4}, {1, 4, 6}, {1, 6, 7}, {2, 7, 9}, {2, 9, 10}}));
  // A frame_bytes that is not a multiple of a float rounds down.
  EXPECT_EQ(AsLists(Chunks(4, Placement(1), 11)),
            (std::vector<std::vector<uint64_t>>{{0, 0, 2}, {0, 2, 4}}));
  EXPECT_TRUE(Chunks(0, Placement(3), 8).empty());
}

TEST(RequestFramesTest, DenseChunksCoverEveryElementOnceInOrderWithinFrameBytes) {
  for (uint32_t shards : {1u, 2u, 3u, 5u}) {
    for (uint64_t total : {0ull, 1ull, 4ull, 17ull, 1000ull}) {
      for (uint64_t frame_bytes : {0ull, 1ull, 3ull, 4ull, 12ull, 4096ull}) {
        SCOPED_TRACE(std::to_string(shards) + " shards, " + std::to_string(total) +
                     " elements, frame_bytes " + std::to_string(frame_bytes));
        const Placement placement(shards);
        const uint64_t most = std::max<uint64_t>(1, frame_bytes / sizeof(float));
        uint64_t next = 0;
        uint32_t last_shard = 0;
        for (const auto& [shard, c] : Chunks(total, placement, frame_bytes)) {
          ASSERT_EQ(c.begin, next);  // in order, no gap, no overlap
          ASSERT_GT(c.end, c.begin);
          ASSERT_LE(c.size(), most);
          if (frame_bytes < sizeof(float)) {
            ASSERT_EQ(c.size(), 1u);
          }
          ASSERT_GE(shard, last_shard);
          const SliceRange slice = placement.DenseSliceOf(total, shard);
          ASSERT_TRUE(slice.Contains(c.begin, c.end));
          // Full chunks, but for the last of a slice.
          if (c.end != slice.end) {
            ASSERT_EQ(c.size(), most);
          }
          next = c.end;
          last_shard = shard;
        }
        EXPECT_EQ(next, total);
      }
    }
  }
}

TEST(RequestFramesTest, WireDTypeOfMapsTheManifestsCompression) {
  WireOptions wire;
  wire.compression = WireOptions::Compression::kNone;
  EXPECT_EQ(WireDTypeOf(wire), wire::DType::F32);
  wire.compression = WireOptions::Compression::kF16;
  EXPECT_EQ(WireDTypeOf(wire), wire::DType::F16);
  wire.compression = WireOptions::Compression::kBf16;
  EXPECT_EQ(WireDTypeOf(wire), wire::DType::BF16);
}

// A push's payload: a keys frame, then two value frames.
std::vector<zmq::message_t> Payload(const std::vector<float>& a, const std::vector<float>& b) {
  std::vector<zmq::message_t> payload;
  const std::vector<uint64_t> keys = {1, 2, 3};
  payload.emplace_back(keys.data(), keys.size() * sizeof(uint64_t));
  payload.push_back(FloatFrame(a));
  payload.push_back(FloatFrame(b));
  return payload;
}

// The payload's value frames widened back to f32, as a reader of the header would.
std::vector<float> Widened(const Header& h, const std::vector<zmq::message_t>& payload) {
  std::vector<float> out;
  for (size_t f = 1; f < payload.size(); ++f) {
    const size_t n = payload[f].size() / DTypeBytes(h.dtype);
    const size_t at = out.size();
    out.resize(at + n);
    WidenValues(static_cast<const std::byte*>(payload[f].data()), n, h.dtype, h.value_scale,
                out.data() + at);
  }
  return out;
}

TEST(RequestFramesTest, CompressingToF32ChangesNothing) {
  const std::vector<float> a = {0.1f, -2.0f, 3.5f}, b = {1e-7f, 65536.0f};
  std::vector<zmq::message_t> payload = Payload(a, b);
  std::vector<const void*> data;
  for (const zmq::message_t& m : payload) data.push_back(m.data());
  Header h;
  h.op = Op::PushSparse;
  CompressValueFrames(wire::DType::F32, &h, &payload, 1);
  EXPECT_EQ(h.dtype, wire::DType::F32);
  EXPECT_EQ(h.value_scale, 0);
  ASSERT_EQ(payload.size(), 3u);
  for (size_t f = 0; f < payload.size(); ++f) EXPECT_EQ(payload[f].data(), data[f]);
  EXPECT_EQ(KeysIn(payload[0]), (std::vector<uint64_t>{1, 2, 3}));
  EXPECT_EQ(FloatsIn(payload[1]), a);
  EXPECT_EQ(FloatsIn(payload[2]), b);
}

// Checks that `payload` narrowed to `dtype` reads back as `want`, each value within `rel` of
// its magnitude; values that are small powers of two (or their small multiples) come back
// exactly.
void ExpectRoundTrip(wire::DType dtype, const std::vector<float>& a, const std::vector<float>& b,
                     float rel) {
  std::vector<zmq::message_t> payload = Payload(a, b);
  Header h;
  h.op = Op::PushSparse;
  CompressValueFrames(dtype, &h, &payload, 1);
  EXPECT_EQ(h.dtype, dtype);
  ASSERT_EQ(payload.size(), 3u);
  // The keys frame is not a value frame: untouched.
  EXPECT_EQ(KeysIn(payload[0]), (std::vector<uint64_t>{1, 2, 3}));
  EXPECT_EQ(payload[1].size(), a.size() * 2);
  EXPECT_EQ(payload[2].size(), b.size() * 2);
  std::vector<float> want = a;
  want.insert(want.end(), b.begin(), b.end());
  const std::vector<float> got = Widened(h, payload);
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_NEAR(got[i], want[i], std::abs(want[i]) * rel) << "value " << i;
    EXPECT_EQ(std::signbit(got[i]), std::signbit(want[i])) << "value " << i;
  }
}

TEST(RequestFramesTest, CompressingToF16SetsTheDTypeAndOneScaleAndRoundTrips) {
  // The largest magnitude is in the second frame: the scale is the whole message's.
  const std::vector<float> a = {0.5f, -1.25f, 0.1f, 3e-3f}, b = {-1000.0f, 7.0f, 0.0f};
  ExpectRoundTrip(wire::DType::F16, a, b, 1.0f / 2048);  // f16: 11 significant bits
  std::vector<zmq::message_t> payload = Payload(a, b);
  Header h;
  CompressValueFrames(wire::DType::F16, &h, &payload, 1);
  EXPECT_EQ(h.value_scale, F16Scale(1000.0f));
  EXPECT_EQ(h.value_scale, 5);  // 1000 * 2^5 in [2^14, 2^15)
  const std::vector<float> got = Widened(h, payload);
  EXPECT_EQ(got[0], 0.5f);
  EXPECT_EQ(got[1], -1.25f);
  EXPECT_EQ(got[4], -1000.0f);
}

TEST(RequestFramesTest, CompressingTinyGradientsToF16ScalesThemUpRatherThanFlushingThem) {
  // Unscaled, 1e-8 is below f16's smallest subnormal (6e-8) and would read back as 0.
  ExpectRoundTrip(wire::DType::F16, {1e-8f, -3e-8f}, {2.5e-8f}, 1.0f / 2048);
}

TEST(RequestFramesTest, CompressingToBf16SetsTheDTypeAndRoundTrips) {
  const std::vector<float> a = {0.5f, -1.25f, 0.1f, 3e-3f}, b = {-1e30f, 7.0f, 1e-30f};
  ExpectRoundTrip(wire::DType::BF16, a, b, 1.0f / 256);  // bf16: 8 significant bits
  std::vector<zmq::message_t> payload = Payload(a, b);
  Header h;
  CompressValueFrames(wire::DType::BF16, &h, &payload, 1);
  EXPECT_EQ(h.value_scale, 0);
  const std::vector<float> got = Widened(h, payload);
  EXPECT_EQ(got[0], 0.5f);
  EXPECT_EQ(got[1], -1.25f);
  EXPECT_EQ(got[5], 7.0f);
}

TEST(RequestFramesTest, ANarrowedFrameNoLongerBorrowsTheCallersMemory) {
  std::vector<float> caller = {1.0f, 2.0f, 3.0f};
  std::vector<zmq::message_t> payload;
  payload.emplace_back(caller.data(), caller.size() * sizeof(float), nullptr, nullptr);
  Header h;
  CompressValueFrames(wire::DType::BF16, &h, &payload, 0);
  caller = {9.0f, 9.0f, 9.0f};  // the caller reuses its buffer
  EXPECT_NE(payload[0].data(), static_cast<const void*>(caller.data()));
  ASSERT_EQ(payload[0].size(), 3 * 2u);
  std::vector<float> got(3);
  WidenValues(static_cast<const std::byte*>(payload[0].data()), 3, h.dtype, h.value_scale,
              got.data());
  EXPECT_EQ(got, (std::vector<float>{1.0f, 2.0f, 3.0f}));
}

}  // namespace
}  // namespace parasol
