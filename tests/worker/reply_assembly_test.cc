// What a worker keeps of a shard's reply (worker/reply_assembly.hpp): a pull's reply is checked
// against its request before anything of it is used, a dense pull's chunk lands in its place,
// and a sparse pull's rows go back in the caller's key order, duplicates and cache hits
// included. The replies are built as a shard builds them: a header frame, then value frames of
// at most frame_bytes.
#include "worker/reply_assembly.hpp"

#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <string>
#include <vector>

#include "common/transport.hpp"
#include "worker/request_frames.hpp"

namespace parasol {
namespace {

using namespace std::chrono_literals;

constexpr uint64_t kMaxBytes = 1 << 20;

struct Reply {
  Header header;
  std::vector<zmq::message_t> frames;  // header first
};

// Shard's reply to a pull: `rows` rows of `dim` floats (`values`), cut as PlanValueFrames cuts
// them, and narrowed to `dtype` as a shard sends compressed rows.
Reply PullReply(Op op, uint64_t request_id, uint32_t dim, const std::vector<float>& values,
                uint64_t frame_bytes, uint64_t offset = 0, wire::DType dtype = wire::DType::F32) {
  Header request;
  request.op = op;
  request.request_id = request_id;
  Reply r;
  r.header = ReplyTo(request, Status::Ok());
  const uint64_t rows = values.size() / dim;
  const FramePlan plan = PlanValueFrames(rows, dim, frame_bytes);
  r.header.key_count = rows;
  r.header.value_dim = dim;
  r.header.offset = offset;
  r.header.value_frames = plan.frames;
  r.header.rows_per_frame = plan.rows_per_frame;
  std::vector<zmq::message_t> values_frames;
  for (uint32_t f = 0; f < plan.frames; ++f) {
    const uint64_t first = uint64_t{f} * plan.rows_per_frame;
    values_frames.emplace_back(values.data() + first * dim,
                               plan.RowsInFrame(f, rows) * dim * sizeof(float));
  }
  if (dtype != wire::DType::F32) {
    r.header.value_scale = static_cast<int16_t>(NarrowValueFrames(values_frames, dtype));
    r.header.dtype = dtype;
  }
  r.frames.push_back(EncodeHeader(r.header));
  for (auto& f : values_frames) r.frames.push_back(std::move(f));
  return r;
}

class ReplyAssemblyTest : public ::testing::Test {
 protected:
  // A pull ticket among `shards` shards, and its request to `shard` expecting these.
  TrackedRequest& Expect(Op op, uint32_t shard, uint64_t id, uint64_t rows, uint32_t dim,
                         uint64_t offset = 0) {
    Header h;
    h.op = op;
    h.request_id = id;
    TrackedRequest& r = tracker_.Track(ticket_, h, shard, 100ms, 1, RequestTracker::TimePoint{});
    r.expect_rows = rows;
    r.expect_dim = dim;
    r.expect_offset = offset;
    return r;
  }
  void Open(Op op) { ticket_ = tracker_.Open(op, /*table=*/3); }
  TicketState& ticket() { return tracker_.ticket(ticket_); }
  // A sparse pull's ticket of `inverse.size()` keys into `out` (filled with -1): key i is
  // unique key inverse[i], row unique_local[u] of shard unique_shard[u]'s reply.
  TicketState& SparsePull(uint32_t dim, std::vector<float>& out, std::vector<uint32_t> inverse,
                          std::vector<uint32_t> unique_shard, std::vector<uint32_t> unique_local) {
    Open(Op::PullSparse);
    TicketState& p = ticket();
    out.assign(inverse.size() * dim, -1.0f);
    p.out = out.data();
    p.dim = dim;
    p.inverse.assign(inverse.begin(), inverse.end());
    p.unique_shard.assign(unique_shard.begin(), unique_shard.end());
    p.unique_local.assign(unique_local.begin(), unique_local.end());
    return p;
  }
  // A dense pull's ticket into `out` (`floats` of -1), rows of `dim` floats.
  TicketState& DensePull(uint32_t dim, std::vector<float>& out, size_t floats) {
    Open(Op::PullDense);
    TicketState& p = ticket();
    out.assign(floats, -1.0f);
    p.out = out.data();
    p.dim = dim;
    return p;
  }
  Status Accept(Reply& reply, const TrackedRequest& r, uint32_t shard) {
    return AcceptReply(reply.header, r, ticket(), shard, reply.frames, kMaxBytes, tracker_);
  }

  RequestTracker tracker_{/*shards=*/2};
  RequestTracker::Ticket ticket_ = 0;
};

TEST_F(ReplyAssemblyTest, ASparsePullReplyWithTooFewRowsIsRefusedAndNotKept) {
  Open(Op::PullSparse);
  TicketState& p = ticket();
  p.read_clocks.assign(2, -1);
  const TrackedRequest& r = Expect(Op::PullSparse, 1, 7, /*rows=*/3, /*dim=*/2);
  const std::vector<float> values = {1, 2, 3, 4};  // two rows
  Reply reply = PullReply(Op::PullSparse, 7, 2, values, 1024);
  reply.header.read_clock = 9;
  reply.header.message = "two rows";
  const Status st = Accept(reply, r, 1);
  EXPECT_EQ(st.code(), StatusCode::kBadMessage);
  EXPECT_EQ(st.message(),
            "shard 1 reply to PullSparse: 2 rows of dim 2 at offset 0, expected 3 of dim 2 at "
            "offset 0");
  EXPECT_FALSE(p.views[1].has_value());
  EXPECT_FALSE(p.views[0].has_value());
  EXPECT_EQ(p.read_clocks[1], -1);
  EXPECT_EQ(p.messages[1], "");
}

TEST_F(ReplyAssemblyTest, ASparsePullReplyOfTheWrongDimIsRefused) {
  Open(Op::PullSparse);
  const TrackedRequest& r = Expect(Op::PullSparse, 0, 7, /*rows=*/2, /*dim=*/2);
  const std::vector<float> values = {1, 2, 3, 4, 5, 6};  // two rows of three
  Reply reply = PullReply(Op::PullSparse, 7, 3, values, 1024);
  const Status st = Accept(reply, r, 0);
  EXPECT_EQ(st.code(), StatusCode::kBadMessage);
  EXPECT_NE(st.message().find("shard 0 reply to PullSparse"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("2 rows of dim 3"), std::string::npos) << st.message();
  EXPECT_FALSE(ticket().views[0].has_value());
}

TEST_F(ReplyAssemblyTest, ADensePullReplyAtTheWrongOffsetIsRefusedAndNothingIsCopied) {
  Open(Op::PullDense);
  std::vector<float> out(10, -1.0f);
  ticket().out = out.data();
  ticket().dim = 1;
  const TrackedRequest& r = Expect(Op::PullDense, 1, 8, /*rows=*/3, /*dim=*/1, /*offset=*/4);
  const std::vector<float> values = {10, 11, 12};
  Reply reply = PullReply(Op::PullDense, 8, 1, values, 1024, /*offset=*/5);
  const Status st = Accept(reply, r, 1);
  EXPECT_EQ(st.code(), StatusCode::kBadMessage);
  EXPECT_EQ(st.message(),
            "shard 1 reply to PullDense: 3 rows of dim 1 at offset 5, expected 3 of dim 1 at "
            "offset 4");
  EXPECT_EQ(out, std::vector<float>(10, -1.0f));
  EXPECT_FALSE(ticket().views[1].has_value());
}

TEST_F(ReplyAssemblyTest, AReplyWhoseFramesDisagreeWithItsHeaderIsRefusedNamingShardAndOp) {
  Open(Op::PullSparse);
  const TrackedRequest& r = Expect(Op::PullSparse, 1, 7, /*rows=*/2, /*dim=*/2);
  const std::vector<float> values = {1, 2, 3, 4};
  Reply reply = PullReply(Op::PullSparse, 7, 2, values, 1024);
  reply.frames.back().rebuild(3 * sizeof(float));  // a row and a half
  const Status st = Accept(reply, r, 1);
  EXPECT_EQ(st.code(), StatusCode::kBadMessage);
  EXPECT_EQ(st.message().rfind("shard 1 reply to PullSparse: ", 0), 0u) << st.message();
  EXPECT_FALSE(ticket().views[1].has_value());
}

TEST_F(ReplyAssemblyTest, AReplyOverTheByteLimitIsRefused) {
  Open(Op::PullSparse);
  const TrackedRequest& r = Expect(Op::PullSparse, 0, 7, /*rows=*/4, /*dim=*/2);
  const std::vector<float> values(8, 1.0f);  // 32 bytes
  Reply reply = PullReply(Op::PullSparse, 7, 2, values, 1024);
  const Status st =
      AcceptReply(reply.header, r, ticket(), 0, reply.frames, /*max_bytes=*/31, tracker_);
  EXPECT_EQ(st.code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(st.message().rfind("shard 0 reply to PullSparse: ", 0), 0u) << st.message();
  EXPECT_FALSE(ticket().views[0].has_value());
}

TEST_F(ReplyAssemblyTest, AnAcceptedSparseReplyIsKeptWithItsReadClockAndMessage) {
  Open(Op::PullSparse);
  TicketState& p = ticket();
  p.read_clocks.assign(2, -1);
  const TrackedRequest& r = Expect(Op::PullSparse, 1, 7, /*rows=*/2, /*dim=*/2);
  const std::vector<float> values = {1, 2, 3, 4};
  Reply reply = PullReply(Op::PullSparse, 7, 2, values, 1024);
  reply.header.read_clock = 9;
  reply.header.message = "fine";
  std::vector<zmq::message_t>& frames = reply.frames;
  ASSERT_TRUE(Accept(reply, r, 1).ok());
  EXPECT_TRUE(frames.empty());  // swapped with the ticket's empty slot
  EXPECT_EQ(p.replies[1].size(), 2u);
  ASSERT_TRUE(p.views[1].has_value());
  EXPECT_EQ(p.views[1]->rows(), 2u);
  float row[2];
  std::memcpy(row, p.views[1]->Row(1), sizeof(row));
  EXPECT_EQ(row[0], 3.0f);
  EXPECT_EQ(row[1], 4.0f);
  EXPECT_EQ(p.read_clocks[1], 9);
  EXPECT_EQ(p.read_clocks[0], -1);
  EXPECT_EQ(p.messages[1], "fine");
}

TEST_F(ReplyAssemblyTest, ASparsePullFromTwoShardsAndTheCacheReturnsRowsInTheCallersOrder) {
  // keys {7, 8, 9, 7, 10, 8, 11, 9}, dim 2: 8 was a cache hit (hit_rows row 0), 7 and 10 are
  // shard 0's rows 0 and 1, 9 and 11 shard 1's rows 1 and 0.
  const uint32_t dim = 2;
  std::vector<float> out;
  TicketState& p =
      SparsePull(dim, out, {0, 1, 2, 0, 3, 1, 4, 2}, {0, kNoShard, 1, 0, 1}, {0, 0, 1, 1, 0});
  p.hit_rows = {80, 81};
  const TrackedRequest& r0 = Expect(Op::PullSparse, 0, 20, 2, dim);
  const TrackedRequest& r1 = Expect(Op::PullSparse, 1, 21, 2, dim);
  // Shard 1 answers first, its rows in frames of one row each.
  const std::vector<float> shard1 = {110, 111, 90, 91};  // keys 11, 9
  Reply reply1 = PullReply(Op::PullSparse, 21, dim, shard1, /*frame_bytes=*/8);
  ASSERT_EQ(reply1.header.value_frames, 2u);
  ASSERT_TRUE(Accept(reply1, r1, 1).ok());
  const std::vector<float> shard0 = {70, 71, 100, 101};  // keys 7, 10
  Reply reply0 = PullReply(Op::PullSparse, 20, dim, shard0, 1024);
  ASSERT_TRUE(Accept(reply0, r0, 0).ok());
  AssembleSparsePull(p);
  EXPECT_EQ(out, (std::vector<float>{70, 71, 80, 81, 90, 91, 70, 71, 100, 101, 80, 81, 110, 111, 90,
                                     91}));
}

TEST_F(ReplyAssemblyTest, ASparsePullOfCompressedRowsReadsThemWidened) {
  // Both keys from shard 0, the rows sent as bf16 (values that bf16 holds exactly).
  const uint32_t dim = 3;
  std::vector<float> out;
  TicketState& p = SparsePull(dim, out, {1, 0, 1}, {0, 0}, {0, 1});
  const TrackedRequest& r = Expect(Op::PullSparse, 0, 20, 2, dim);
  const std::vector<float> rows = {0.5f, -2.0f, 96.0f, 1.25f, 0.0f, -0.375f};
  Reply reply = PullReply(Op::PullSparse, 20, dim, rows, 1024, 0, wire::DType::BF16);
  ASSERT_TRUE(Accept(reply, r, 0).ok());
  AssembleSparsePull(p);
  EXPECT_EQ(out,
            (std::vector<float>{1.25f, 0.0f, -0.375f, 0.5f, -2.0f, 96.0f, 1.25f, 0.0f, -0.375f}));
}

TEST_F(ReplyAssemblyTest, ADensePullChunkIsCopiedIntoItsPlaceAndItsFramesReleased) {
  std::vector<float> out;
  TicketState& p = DensePull(/*dim=*/1, out, 10);
  // Shard 1's chunk [4, 7) in frames of two elements.
  const TrackedRequest& r = Expect(Op::PullDense, 1, 30, 3, 1, /*offset=*/4);
  Reply reply = PullReply(Op::PullDense, 30, 1, {40, 50, 60}, /*frame_bytes=*/8, 4);
  ASSERT_EQ(reply.header.value_frames, 2u);
  ASSERT_TRUE(Accept(reply, r, 1).ok());
  EXPECT_EQ(out, (std::vector<float>{-1, -1, -1, -1, 40, 50, 60, -1, -1, -1}));
  EXPECT_TRUE(p.replies[1].empty());
  EXPECT_FALSE(p.views[1].has_value());
  // Shard 0's chunk [0, 2), compressed to f16.
  const TrackedRequest& r0 = Expect(Op::PullDense, 0, 31, 2, 1, 0);
  Reply reply0 = PullReply(Op::PullDense, 31, 1, {0.5f, -3.0f}, 1024, 0, wire::DType::F16);
  ASSERT_TRUE(Accept(reply0, r0, 0).ok());
  EXPECT_EQ(out, (std::vector<float>{0.5f, -3.0f, -1, -1, 40, 50, 60, -1, -1, -1}));
}

TEST_F(ReplyAssemblyTest, ADensePullWithStateCopiesWholeRowsToTheirPlace) {
  // 4 elements, each a row of [value, state]: the chunk [1, 3) fills floats 2 .. 5.
  std::vector<float> out;
  DensePull(/*dim=*/2, out, 8);
  const TrackedRequest& r = Expect(Op::PullDense, 0, 40, 2, 2, /*offset=*/1);
  Reply reply = PullReply(Op::PullDense, 40, 2, {1, 10, 2, 20}, /*frame_bytes=*/8, 1);
  ASSERT_TRUE(Accept(reply, r, 0).ok());
  EXPECT_EQ(out, (std::vector<float>{-1, -1, 1, 10, 2, 20, -1, -1}));
}

}  // namespace
}  // namespace parasol
