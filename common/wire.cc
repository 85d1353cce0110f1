#include "common/wire.hpp"

#include <flatbuffers/flatbuffers.h>

#include <algorithm>
#include <cmath>

#include "common/checked_math.hpp"
#include "common/half.hpp"
#include "common/manifest.hpp"

namespace parasol {

const char* OpName(Op op) {
  const char* name = wire::EnumNameOp(op);
  return (name && *name) ? name : "UnknownOp";
}

// Every StatusCode travels: a code past Code::MAX would make the reply undecodable.
static_assert(static_cast<int>(wire::Code::MAX) == static_cast<int>(StatusCode::kAborted),
              "protocols/message.fbs: Code must list every StatusCode");

zmq::message_t EncodeHeader(const Header& h) {
  // One builder per thread, its buffer kept from one header to the next.
  thread_local flatbuffers::FlatBufferBuilder fbb(256);
  fbb.Clear();
  auto message = h.message.empty() ? 0 : fbb.CreateString(h.message);
  flatbuffers::Offset<flatbuffers::Vector<const wire::Member*>> members = 0;
  if (!h.members.empty()) {
    wire::Member* out = nullptr;
    members = fbb.CreateUninitializedVectorOfStructs(h.members.size(), &out);
    for (const MemberEntry& e : h.members) *out++ = wire::Member(e.worker, e.join, e.leave);
  }
  const auto macs = h.member_macs.empty() ? 0 : fbb.CreateVector(h.member_macs);
  wire::HeaderBuilder b(fbb);
  b.add_version(h.version);
  b.add_op(h.op);
  b.add_is_reply(h.is_reply);
  b.add_request_id(h.request_id);
  b.add_worker_id(h.worker_id);
  b.add_seq(h.seq);
  b.add_incarnation(h.incarnation);
  b.add_table_id(h.table_id);
  b.add_clock(h.clock);
  b.add_key_count(h.key_count);
  b.add_value_dim(h.value_dim);
  b.add_offset(h.offset);
  b.add_dtype(h.dtype);
  b.add_value_frames(h.value_frames);
  b.add_rows_per_frame(h.rows_per_frame);
  b.add_status(static_cast<wire::Code>(h.status));
  if (!h.message.empty()) b.add_message(message);
  b.add_manifest_hash(h.manifest_hash);
  b.add_duplicate(h.duplicate);
  b.add_shard_rank(h.shard_rank);
  b.add_shard_count(h.shard_count);
  b.add_with_state(h.with_state);
  b.add_done(h.done);
  b.add_server_epoch(h.server_epoch);
  b.add_checkpoint_clock(h.checkpoint_clock);
  b.add_caught_up(h.caught_up);
  b.add_replay(h.replay);
  b.add_checkpoint_count(h.checkpoint_count);
  b.add_restored_count(h.restored_count);
  b.add_checkpoints_begun(h.checkpoints_begun);
  b.add_restore_done(h.restore_done);
  b.add_restore_total(h.restore_total);
  b.add_restore_rows(h.restore_rows);
  b.add_restore_rows_total(h.restore_rows_total);
  b.add_worker_clock(h.worker_clock);
  b.add_last_barrier(h.last_barrier);
  b.add_read_only(h.read_only);
  b.add_known_epoch(h.known_epoch);
  b.add_read_clock(h.read_clock);
  b.add_value_scale(h.value_scale);
  b.add_membership_version(h.membership_version);
  if (!h.members.empty()) b.add_members(members);
  if (!h.member_macs.empty()) b.add_member_macs(macs);
  b.add_join(h.join);
  b.add_rollback_gen(h.rollback_gen);
  b.add_rollback_clock(h.rollback_clock);
  b.add_rollback_needed(h.rollback_needed);
  b.add_restored_sequence(h.restored_sequence);
  b.add_restored_writer(h.restored_writer);
  // Size-prefixed, so that a frame cut anywhere (even in trailing padding) is detected.
  wire::FinishSizePrefixedHeaderBuffer(fbb, b.Finish());
  return zmq::message_t(fbb.GetBufferPointer(), fbb.GetSize());
}

Result<Header> DecodeHeader(const void* data, size_t size) {
  if (size < 8) return BadMessage("header frame of " + std::to_string(size) + " bytes is truncated");
  if (size > kMaxHeaderBytes) {
    return BadMessage("header frame of " + std::to_string(size) + " bytes exceeds " +
                      std::to_string(kMaxHeaderBytes));
  }
  // The verifier reads scalars in place; give it an aligned copy of the (small) frame.
  alignas(8) std::byte local[512];
  std::vector<std::byte> heap;
  std::byte* buf = local;
  if (size > sizeof(local)) {
    heap.resize(size);
    buf = heap.data();
  }
  std::memcpy(buf, data, size);
  const auto* bytes = reinterpret_cast<const uint8_t*>(buf);
  if (!wire::SizePrefixedHeaderBufferHasIdentifier(bytes)) {
    return BadMessage("header frame lacks the PSOL identifier (not a Parasol message)");
  }
  const size_t prefixed = flatbuffers::GetPrefixedSize(bytes);
  if (prefixed != size - sizeof(flatbuffers::uoffset_t)) {
    return BadMessage("header frame is " + std::to_string(size) + " bytes but its size prefix says " +
                      std::to_string(prefixed + sizeof(flatbuffers::uoffset_t)) +
                      " (truncated or padded)");
  }
  flatbuffers::Verifier verifier(bytes, size, /*max_depth=*/8, /*max_tables=*/16);
  if (!wire::VerifySizePrefixedHeaderBuffer(verifier)) {
    return BadMessage("header frame failed FlatBuffers verification");
  }
  const wire::Header* fb = wire::GetSizePrefixedHeader(bytes);
  if (fb->version() != kProtocolVersion) {
    return Status(StatusCode::kVersionMismatch,
                  "protocol version " + std::to_string(fb->version()) + " is not supported (this " +
                      "build speaks version " + std::to_string(kProtocolVersion) + ")");
  }
  if (fb->op() > wire::Op::MAX) {
    return BadMessage("unknown op " + std::to_string(static_cast<int>(fb->op())));
  }
  if (static_cast<uint8_t>(fb->status()) > static_cast<uint8_t>(wire::Code::MAX)) {
    return BadMessage("unknown status code " + std::to_string(static_cast<int>(fb->status())));
  }
  Header h;
  h.version = fb->version();
  h.op = fb->op();
  h.is_reply = fb->is_reply();
  h.request_id = fb->request_id();
  h.worker_id = fb->worker_id();
  h.seq = fb->seq();
  h.incarnation = fb->incarnation();
  h.table_id = fb->table_id();
  h.clock = fb->clock();
  h.key_count = fb->key_count();
  h.value_dim = fb->value_dim();
  h.offset = fb->offset();
  h.dtype = fb->dtype();
  h.value_frames = fb->value_frames();
  h.rows_per_frame = fb->rows_per_frame();
  h.status = static_cast<StatusCode>(fb->status());
  if (fb->message()) h.message = fb->message()->str();
  h.manifest_hash = fb->manifest_hash();
  h.duplicate = fb->duplicate();
  h.shard_rank = fb->shard_rank();
  h.shard_count = fb->shard_count();
  h.with_state = fb->with_state();
  h.done = fb->done();
  h.server_epoch = fb->server_epoch();
  h.checkpoint_clock = fb->checkpoint_clock();
  h.checkpoint_count = fb->checkpoint_count();
  h.restored_count = fb->restored_count();
  h.checkpoints_begun = fb->checkpoints_begun();
  h.restore_done = fb->restore_done();
  h.restore_total = fb->restore_total();
  h.restore_rows = fb->restore_rows();
  h.restore_rows_total = fb->restore_rows_total();
  h.worker_clock = fb->worker_clock();
  h.last_barrier = fb->last_barrier();
  h.read_only = fb->read_only();
  h.known_epoch = fb->known_epoch();
  h.read_clock = fb->read_clock();
  h.value_scale = fb->value_scale();
  h.caught_up = fb->caught_up();
  h.replay = fb->replay();
  h.membership_version = fb->membership_version();
  h.join = fb->join();
  h.rollback_gen = fb->rollback_gen();
  h.rollback_clock = fb->rollback_clock();
  h.rollback_needed = fb->rollback_needed();
  h.restored_sequence = fb->restored_sequence();
  h.restored_writer = fb->restored_writer();
  if (const auto* members = fb->members()) {
    if (members->size() > kMaxMemberEntries) {
      return BadMessage("header carries " + std::to_string(members->size()) +
                        " membership entries, more than " + std::to_string(kMaxMemberEntries));
    }
    h.members.reserve(members->size());
    for (const wire::Member* e : *members) {
      h.members.push_back(MemberEntry{e->worker(), e->join(), e->leave()});
    }
  }
  if (const auto* macs = fb->member_macs()) {
    // At most 16 bytes per entry and listed shard (kMaxShards).
    if (macs->size() % 16 != 0 || macs->size() > h.members.size() * kMaxShards * 16) {
      return BadMessage("header carries " + std::to_string(macs->size()) +
                        " bytes of membership MACs for " + std::to_string(h.members.size()) +
                        " entries");
    }
    h.member_macs.assign(macs->begin(), macs->end());
  }
  return h;
}

Header ReplyTo(const Header& request, const Status& status) {
  Header r;
  r.op = request.op;
  r.is_reply = true;
  r.request_id = request.request_id;
  r.worker_id = request.worker_id;
  r.seq = request.seq;
  r.incarnation = request.incarnation;
  r.table_id = request.table_id;
  r.clock = request.clock;
  r.with_state = request.with_state;
  r.status = status.code();
  r.message = status.message();
  return r;
}

PayloadLayout PayloadLayoutOf(Op op, bool is_reply, StatusCode status) {
  if (status != StatusCode::kOk) return {};
  switch (op) {
    case Op::PullSparse: return is_reply ? PayloadLayout{false, true} : PayloadLayout{true, false};
    case Op::PushSparse: return is_reply ? PayloadLayout{} : PayloadLayout{true, true};
    case Op::PullDense: return is_reply ? PayloadLayout{false, true} : PayloadLayout{};
    case Op::PushDense: return is_reply ? PayloadLayout{} : PayloadLayout{false, true};
    case Op::Migrate: return PayloadLayout{true, true};
    default: return {};
  }
}

uint64_t PayloadFrameCount(const Header& h) {
  const PayloadLayout layout = PayloadLayoutOf(h.op, h.is_reply, h.status);
  return (layout.keys ? 1 : 0) + (layout.values ? uint64_t{h.value_frames} : 0);
}

Result<std::vector<StepPart>> SplitStep(const Header& step,
                                        std::span<const zmq::message_t> frames) {
  std::vector<StepPart> parts;
  PARASOL_RETURN_IF_ERROR(SplitStep(step, frames, &parts));
  return parts;
}

Status SplitStep(const Header& step, std::span<const zmq::message_t> frames,
                 std::vector<StepPart>* out) {
  std::vector<StepPart>& parts = *out;
  parts.clear();
  // Built only for an error.
  auto what = [&step] { return std::string("Step") + (step.is_reply ? " reply" : " request"); };
  if (step.key_count == 0 || step.key_count > kMaxStepParts) {
    return BadMessage(what() + ": " + std::to_string(step.key_count) + " parts (1 to " +
                      std::to_string(kMaxStepParts) + " allowed)");
  }
  size_t next = 0;
  for (uint64_t i = 0; i < step.key_count; ++i) {
    auto where = [&] { return what() + ", part " + std::to_string(i); };
    if (next >= frames.size()) {
      return BadMessage(where() + ": missing (" + std::to_string(frames.size()) +
                        " frames for " + std::to_string(step.key_count) + " parts)");
    }
    Result<Header> h = DecodeHeader(frames[next].data(), frames[next].size());
    if (!h.ok()) return h.status().WithContext(where());
    if (h->op == Op::Step) return BadMessage(where() + ": a Step inside a Step");
    if (h->is_reply != step.is_reply) {
      return BadMessage(where() + ": a " + (h->is_reply ? "reply" : "request") + " inside a " +
                        what());
    }
    if (h->worker_id != step.worker_id) {
      return BadMessage(where() + ": worker " + std::to_string(h->worker_id) +
                        " inside a Step of worker " + std::to_string(step.worker_id));
    }
    const uint64_t payload = PayloadFrameCount(*h);
    if (payload > frames.size() - next - 1) {
      return BadMessage(where() + ": its header needs " + std::to_string(payload) +
                        " payload frames, only " + std::to_string(frames.size() - next - 1) +
                        " follow");
    }
    parts.push_back({std::move(*h), next, static_cast<size_t>(payload)});
    next += 1 + payload;
  }
  if (next != frames.size()) {
    return BadMessage(what() + ": " + std::to_string(frames.size() - next) +
                      " frames after its last part");
  }
  return Status::Ok();
}

FramePlan PlanValueFrames(uint64_t rows, uint32_t dim, uint64_t frame_bytes) {
  FramePlan plan;
  const uint64_t row_bytes = uint64_t{dim} * sizeof(float);
  plan.rows_per_frame = std::max<uint64_t>(1, frame_bytes / std::max<uint64_t>(1, row_bytes));
  plan.frames = static_cast<uint32_t>(CeilDiv(rows, plan.rows_per_frame));
  return plan;
}

uint64_t PayloadView::FirstNonfinite() const {
  const uint64_t dim = dim_;
  for (size_t f = 0; f < value_frames_.size(); ++f) {
    const uint64_t first = f * rows_per_frame_;
    const uint64_t n = std::min(rows_per_frame_, rows_ - first) * dim;
    const std::byte* bytes = value_frames_[f];
    // A float is NaN or infinite when its exponent bits are all set. Blocks of 1,024 are tested
    // with a branch-free OR (it vectorizes); only a block with one is searched.
    for (uint64_t at = 0; at < n; at += 1024) {
      const uint64_t len = std::min<uint64_t>(1024, n - at);
      uint32_t any = 0;
      for (uint64_t i = 0; i < len; ++i) {
        uint32_t b;
        std::memcpy(&b, bytes + (at + i) * sizeof(float), sizeof(b));
        any |= static_cast<uint32_t>((b & 0x7f800000u) == 0x7f800000u);
      }
      if (any == 0) continue;
      for (uint64_t i = 0; i < len; ++i) {
        uint32_t b;
        std::memcpy(&b, bytes + (at + i) * sizeof(float), sizeof(b));
        if ((b & 0x7f800000u) == 0x7f800000u) return first * dim + at + i;
      }
    }
  }
  return kAllFinite;
}

Result<PayloadView> PayloadView::Parse(const Header& h, std::span<zmq::message_t> frames,
                                       uint64_t max_bytes) {
  return Parse(h, frames, max_bytes, PayloadView());
}

Result<PayloadView> PayloadView::Parse(const Header& h, std::span<zmq::message_t> frames,
                                       uint64_t max_bytes, PayloadView&& reuse) {
  const PayloadLayout layout = PayloadLayoutOf(h.op, h.is_reply, h.status);
  // Built only for an error: a request that parses allocates nothing here.
  auto what = [&h] { return std::string(OpName(h.op)) + (h.is_reply ? " reply" : " request"); };
  PayloadView view;
  view.value_frames_ = std::move(reuse.value_frames_);
  view.value_frames_.clear();
  view.widened_ = std::move(reuse.widened_);
  view.widened_.clear();
  view.rows_ = h.key_count;
  view.dim_ = h.value_dim;
  uint64_t expected = 0;
  uint64_t total = 0;  // payload bytes the header implies
  if (layout.keys) {
    ++expected;
    Result<uint64_t> key_bytes = CheckedMul(h.key_count, sizeof(uint64_t), "key_count");
    if (!key_bytes.ok()) return key_bytes.status().WithContext(what());
    total = *key_bytes;
  }
  uint64_t row_bytes = 0;
  if (layout.values) {
    if (h.dtype != wire::DType::F32 && h.dtype != wire::DType::F16 &&
        h.dtype != wire::DType::BF16) {
      return BadMessage(what() + ": dtype " + std::to_string(static_cast<int>(h.dtype)) +
                        " is not one of f32, f16, bf16");
    }
    if (h.dtype == wire::DType::F16 ? std::abs(int{h.value_scale}) > kMaxValueScale
                                    : h.value_scale != 0) {
      return BadMessage(what() + ": value_scale " + std::to_string(h.value_scale) + " for dtype " +
                        wire::EnumNameDType(h.dtype) + " (f16: at most " +
                        std::to_string(kMaxValueScale) + " either way; otherwise 0)");
    }
    if (h.value_dim == 0) return BadMessage(what() + ": value_dim is 0");
    row_bytes = uint64_t{h.value_dim} * DTypeBytes(h.dtype);
    // Against the limit as f32 (what 16-bit values are widened to): a compressed request is
    // accepted exactly when the same request in f32 would be.
    Result<uint64_t> value_bytes =
        CheckedMul(h.key_count, uint64_t{h.value_dim} * sizeof(float), "key_count x value_dim");
    if (!value_bytes.ok()) return value_bytes.status().WithContext(what());
    Result<uint64_t> sum = CheckedAdd(total, *value_bytes, "payload size");
    if (!sum.ok()) return sum.status().WithContext(what());
    total = *sum;
  }
  if (total > max_bytes) {
    return ResourceExhausted(what() + ": " + std::to_string(h.key_count) + " rows need " +
                             std::to_string(total) + " payload bytes, over the limit of " +
                             std::to_string(max_bytes) + " bytes (server.max_request_bytes)");
  }
  if (layout.values) {
    if (h.key_count > 0 && h.rows_per_frame == 0) return BadMessage(what() + ": rows_per_frame is 0");
    const uint64_t rpf = std::max<uint64_t>(1, h.rows_per_frame);
    const uint64_t need_frames = CeilDiv(h.key_count, rpf);
    if (h.value_frames != need_frames) {
      return BadMessage(what() + ": header says " + std::to_string(h.value_frames) +
                        " value frames, but " + std::to_string(h.key_count) + " rows at " +
                        std::to_string(rpf) + " per frame need " + std::to_string(need_frames));
    }
    view.rows_per_frame_ = rpf;
    expected += h.value_frames;
  }
  if (frames.size() != expected) {
    return BadMessage(what() + ": expected " + std::to_string(expected) + " payload frames, got " +
                      std::to_string(frames.size()));
  }
  size_t next = 0;
  if (layout.keys) {
    const uint64_t want = h.key_count * sizeof(uint64_t);  // checked above
    if (frames[next].size() != want) {
      return BadMessage(what() + ": keys frame has " + std::to_string(frames[next].size()) +
                        " bytes, header's key_count " + std::to_string(h.key_count) + " needs " +
                        std::to_string(want));
    }
    view.keys_ = static_cast<const std::byte*>(frames[next].data());
    ++next;
  }
  if (layout.values) {
    view.value_frames_.reserve(h.value_frames);
    for (uint32_t f = 0; f < h.value_frames; ++f, ++next) {
      // f * rows_per_frame < key_count, and rows * row_bytes <= total: neither wraps.
      const uint64_t rows =
          std::min(view.rows_per_frame_, h.key_count - uint64_t{f} * view.rows_per_frame_);
      if (frames[next].size() != rows * row_bytes) {
        return BadMessage(what() + ": value frame " + std::to_string(f) + " has " +
                          std::to_string(frames[next].size()) + " bytes, expected " +
                          std::to_string(rows * row_bytes));
      }
      view.value_frames_.push_back(static_cast<const std::byte*>(frames[next].data()));
    }
    if (h.dtype != wire::DType::F32) {
      // Widen into the view's own f32 buffer: rows x dim floats (checked against max_bytes
      // above, as f32).
      const uint64_t dim = h.value_dim;
      view.widened_.resize(h.key_count * dim);
      for (uint32_t f = 0; f < h.value_frames; ++f) {
        const uint64_t first = uint64_t{f} * view.rows_per_frame_;
        const uint64_t rows = std::min(view.rows_per_frame_, h.key_count - first);
        float* out = view.widened_.data() + first * dim;
        WidenValues(view.value_frames_[f], rows * dim, h.dtype, h.value_scale, out);
        view.value_frames_[f] = reinterpret_cast<const std::byte*>(out);
      }
    }
  }
  return view;
}

size_t DTypeBytes(wire::DType dtype) { return dtype == wire::DType::F32 ? 4 : 2; }

int F16Scale(float max_abs) {
  if (!(max_abs > 0.0f) || std::isinf(max_abs)) return 0;
  int e = 0;
  std::frexp(max_abs, &e);  // max_abs in [2^(e-1), 2^e)
  return std::clamp(15 - e, -kMaxValueScale, kMaxValueScale);
}

void NarrowValues(const float* in, size_t n, wire::DType dtype, int scale, std::byte* out) {
  uint16_t* o = reinterpret_cast<uint16_t*>(out);  // out may be unaligned: write through memcpy
  if (dtype == wire::DType::BF16) {
    for (size_t i = 0; i < n; ++i) {
      const uint16_t h = F32ToBf16(in[i]);
      std::memcpy(o + i, &h, sizeof h);
    }
    return;
  }
  const float mul = std::ldexp(1.0f, scale);
  for (size_t i = 0; i < n; ++i) {
    const uint16_t h = F32ToF16(in[i] * mul);
    std::memcpy(o + i, &h, sizeof h);
  }
}

void WidenValues(const std::byte* in, size_t n, wire::DType dtype, int scale, float* out) {
  if (dtype == wire::DType::BF16) {
    for (size_t i = 0; i < n; ++i) {
      uint16_t h;
      std::memcpy(&h, in + 2 * i, sizeof h);
      out[i] = Bf16ToF32(h);
    }
    return;
  }
  const float mul = std::ldexp(1.0f, -scale);
  for (size_t i = 0; i < n; ++i) {
    uint16_t h;
    std::memcpy(&h, in + 2 * i, sizeof h);
    out[i] = F16ToF32(h) * mul;
  }
}

}  // namespace parasol
