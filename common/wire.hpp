// Wire codec: the FlatBuffers header frame and the raw payload frames that follow it.
//
// A message is [header][keys]?[values...]? (a ROUTER socket sees the peer identity first).
// Which payload frames an op carries is fixed by PayloadLayoutOf(); their sizes are fixed by the
// header's counts, and PayloadView::Parse() refuses any message whose frames disagree.
// Keys are little-endian uint64; values are little-endian f32 rows of value_dim floats, split
// into frames of rows_per_frame rows (the last frame may be shorter) so that no single frame is
// large enough for the allocator to serve it with a fresh memory mapping.
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <vector>

#include <zmq.hpp>

#include "common/membership.hpp"
#include "common/status.hpp"
#include "protocols/message_generated.h"

namespace parasol {

static_assert(std::endian::native == std::endian::little, "the wire format is little-endian");

// 2: the Step op (a step's requests to one shard in one message). 3: f16/bf16 values
// (value_scale). 5: changes of the shard count (Op.Migrate). 6: dense tensors re-cut at them.
// 7: a tick names the pushes it follows (Clock key_count). 8: checkpoints written in the
// background (checkpoints_begun), and a restoring shard's progress (restore_*). 10: rollbacks
// (Op.Rollback, rollback_*; status Aborted). 11: restored_count is what the restored checkpoint
// holds every acknowledged push before, its sequence apart (restored_sequence, restored_writer).
inline constexpr uint16_t kProtocolVersion = 11;
inline constexpr size_t kMaxHeaderBytes = 64 * 1024;

using wire::Op;

const char* OpName(Op op);

// The decoded header: plain values, no pointers into the frame.
struct Header {
  uint16_t version = kProtocolVersion;
  Op op = Op::Hello;
  bool is_reply = false;
  uint64_t request_id = 0;
  uint32_t worker_id = 0;
  uint64_t seq = 0;
  uint64_t incarnation = 0;
  uint32_t table_id = 0;
  int64_t clock = 0;
  uint64_t key_count = 0;
  uint32_t value_dim = 0;
  uint64_t offset = 0;
  wire::DType dtype = wire::DType::F32;
  uint32_t value_frames = 0;
  uint64_t rows_per_frame = 0;
  StatusCode status = StatusCode::kOk;
  std::string message;
  uint64_t manifest_hash = 0;
  bool duplicate = false;
  uint32_t shard_rank = 0;
  uint32_t shard_count = 0;
  bool with_state = false;
  bool done = false;
  uint64_t server_epoch = 0;
  int64_t checkpoint_clock = -1;
  bool caught_up = false;
  bool replay = false;
  uint64_t checkpoint_count = 0;
  uint64_t restored_count = 0;
  int64_t worker_clock = -1;
  int64_t last_barrier = -1;
  bool read_only = false;
  uint64_t known_epoch = 0;
  int64_t read_clock = -1;
  int16_t value_scale = 0;
  uint64_t membership_version = 0;
  std::vector<MemberEntry> members;
  std::vector<uint8_t> member_macs;  // shard 0's MACs of `members` (common/membership_macs.hpp)
  bool join = false;
  uint64_t checkpoints_begun = 0;
  uint64_t restore_done = 0;
  uint64_t restore_total = 0;
  uint64_t restore_rows = 0;
  uint64_t restore_rows_total = 0;
  uint64_t rollback_gen = 0;
  int64_t rollback_clock = -1;
  bool rollback_needed = false;
  uint64_t restored_sequence = 0;
  uint64_t restored_writer = 0;
};
// The most membership entries one header may carry (cluster.max_workers beyond
// cluster.workers is bounded by it).
inline constexpr size_t kMaxMemberEntries = 2048 + kMaxServerChanges;

zmq::message_t EncodeHeader(const Header& h);

// Verifies the frame with the FlatBuffers verifier, its file identifier and its protocol
// version. Never reads outside [data, data + size).
Result<Header> DecodeHeader(const void* data, size_t size);

// A reply header for `request` carrying `status` (the message names the problem).
Header ReplyTo(const Header& request, const Status& status);

struct PayloadLayout {
  bool keys = false;
  bool values = false;
};
PayloadLayout PayloadLayoutOf(Op op, bool is_reply, StatusCode status);

// Payload frames that follow a header: the layout's keys frame and value frames. Not checked
// against sizes (PayloadView::Parse does that).
uint64_t PayloadFrameCount(const Header& h);

// A Step message's parts (see protocols/message.fbs): each part's decoded header and where its
// payload frames are in the frames after the Step header.
inline constexpr uint64_t kMaxStepParts = 4096;
struct StepPart {
  Header header;
  size_t header_frame = 0;  // index of the part's header frame; payload frames follow it
  size_t payload_frames = 0;
};
// Splits `frames` (everything after the Step header) into `step.key_count` parts. Each part
// must be of the Step's direction (request or reply), not a Step, and of the Step's worker.
Result<std::vector<StepPart>> SplitStep(const Header& step, std::span<const zmq::message_t> frames);
// The same into `parts` (cleared first, its capacity reused).
Status SplitStep(const Header& step, std::span<const zmq::message_t> frames,
                 std::vector<StepPart>* parts);

// How `rows` rows of `dim` floats are cut into frames of at most `frame_bytes` bytes.
struct FramePlan {
  uint64_t rows_per_frame = 0;
  uint32_t frames = 0;
  uint64_t RowsInFrame(uint32_t i, uint64_t rows) const {
    const uint64_t first = i * rows_per_frame;
    return std::min(rows_per_frame, rows - first);
  }
};
FramePlan PlanValueFrames(uint64_t rows, uint32_t dim, uint64_t frame_bytes);

// Values on the wire (manifest wire.compression): f32, or 16-bit with round-to-nearest-even.
// An f16 message scales its values by 2^value_scale first (F16Scale), so that the largest
// magnitude lands just under f16's top and small gradients do not flush to zero.
// Up to 2^126 either way: a normal float, so every finite value (up to 2^128) can be brought
// under f16's top.
inline constexpr int kMaxValueScale = 126;
size_t DTypeBytes(wire::DType dtype);
// The power of two that brings max_abs into [2^14, 2^15) (f16's largest finite value is 65504),
// within +-kMaxValueScale; 0 for 0, infinities and NaN.
int F16Scale(float max_abs);
// n f32 values to 16-bit `dtype` (F16 or BF16), times 2^scale first (F16).
void NarrowValues(const float* in, size_t n, wire::DType dtype, int scale, std::byte* out);
// n 16-bit values back to f32, divided by 2^scale (F16).
void WidenValues(const std::byte* in, size_t n, wire::DType dtype, int scale, float* out);

// A checked view of a message's payload frames. Holds pointers into the frames: it must not
// outlive them. Values that travelled as f16/bf16 are widened to f32 into the view's own buffer
// (at most twice the payload's bytes), so every reader sees f32 rows.
class PayloadView {
 public:
  PayloadView() = default;
  PayloadView(PayloadView&&) = default;
  PayloadView& operator=(PayloadView&&) = default;
  PayloadView(const PayloadView&) = delete;  // value_frames_ may point into widened_
  PayloadView& operator=(const PayloadView&) = delete;

  // Checks `frames` (everything after the header) against `h` and the op's layout: frame count,
  // each frame's size, dtype, and the total against `max_bytes`.
  static Result<PayloadView> Parse(const Header& h, std::span<zmq::message_t> frames,
                                   uint64_t max_bytes);
  // The same, the new view taking the buffers of `reuse`, a view no longer needed (no
  // allocation when they are large enough).
  static Result<PayloadView> Parse(const Header& h, std::span<zmq::message_t> frames,
                                   uint64_t max_bytes, PayloadView&& reuse);

  uint64_t rows() const { return rows_; }
  uint32_t dim() const { return dim_; }
  bool has_keys() const { return keys_ != nullptr; }

  uint64_t Key(uint64_t i) const {
    uint64_t k;
    std::memcpy(&k, keys_ + i * sizeof(uint64_t), sizeof(k));
    return k;
  }
  // The row's dim floats; may be unaligned, so read it through std::memcpy.
  const std::byte* Row(uint64_t i) const {
    const uint64_t f = i / rows_per_frame_;
    return value_frames_[f] + (i - f * rows_per_frame_) * dim_ * sizeof(float);
  }
  // The index (row x dim + element) of the first value that is NaN or infinite, or
  // kAllFinite. Reads the values once, as bits.
  static constexpr uint64_t kAllFinite = ~uint64_t{0};
  uint64_t FirstNonfinite() const;
  // Calls fn(first_row, bytes, row_count) for each value frame in order.
  template <typename Fn>
  void ForEachValueFrame(Fn&& fn) const {
    for (size_t f = 0; f < value_frames_.size(); ++f) {
      const uint64_t first = f * rows_per_frame_;
      fn(first, value_frames_[f], std::min(rows_per_frame_, rows_ - first));
    }
  }

 private:
  const std::byte* keys_ = nullptr;
  std::vector<const std::byte*> value_frames_;
  std::vector<float> widened_;  // the values, when they travelled as f16/bf16
  uint64_t rows_ = 0;
  uint64_t rows_per_frame_ = 1;
  uint32_t dim_ = 0;
};

}  // namespace parasol
