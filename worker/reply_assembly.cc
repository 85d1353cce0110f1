#include "worker/reply_assembly.hpp"

#include <cstring>
#include <span>
#include <string>

#include "worker/request_frames.hpp"

namespace parasol {

Status AcceptReply(const Header& h, const TrackedRequest& r, TicketState& p, uint32_t shard,
                   std::vector<zmq::message_t>& frames, uint64_t max_bytes,
                   RequestTracker& tracker) {
  // Swapped, not moved: the caller's vector takes the slot's empty buffer back for reuse.
  p.replies[shard].clear();
  std::swap(p.replies[shard], frames);
  std::vector<zmq::message_t>& stored = p.replies[shard];
  Result<PayloadView> view = PayloadView::Parse(h, std::span<zmq::message_t>(stored).subspan(1),
                                                max_bytes, tracker.TakeView());
  // Built only for an error.
  auto where = [&] { return "shard " + std::to_string(shard) + " reply to " + OpName(r.op); };
  if (!view.ok()) return view.status().WithContext(where());
  if ((r.op == Op::PullSparse || r.op == Op::PullDense) &&
      (view->rows() != r.expect_rows || view->dim() != r.expect_dim ||
       h.offset != r.expect_offset)) {
    return BadMessage(where() + ": " + std::to_string(view->rows()) + " rows of dim " +
                      std::to_string(view->dim()) + " at offset " + std::to_string(h.offset) +
                      ", expected " + std::to_string(r.expect_rows) + " of dim " +
                      std::to_string(r.expect_dim) + " at offset " +
                      std::to_string(r.expect_offset));
  }
  if (r.op == Op::PullDense) {
    const uint64_t row_floats = view->dim();
    view->ForEachValueFrame([&](uint64_t first, const std::byte* data, uint64_t rows) {
      std::memcpy(p.out + (h.offset + first) * row_floats, data, rows * row_floats * sizeof(float));
    });
    stored.clear();
    tracker.KeepView(std::move(*view));
  } else {
    p.views[shard] = std::move(*view);
    if (!p.read_clocks.empty()) p.read_clocks[shard] = h.read_clock;
  }
  p.messages[shard] = h.message;
  return Status::Ok();
}

void AssembleSparsePull(const TicketState& p) {
  const size_t row_bytes = size_t{p.dim} * sizeof(float);
  for (size_t i = 0; i < p.inverse.size(); ++i) {
    const uint32_t u = p.inverse[i];
    const uint32_t s = p.unique_shard[u];
    // Rows in a reply may be unaligned: copied as bytes.
    const void* row = s == kNoShard ? static_cast<const void*>(p.hit_rows.data() +
                                                               size_t{p.unique_local[u]} * p.dim)
                                    : p.views[s]->Row(p.unique_local[u]);
    std::memcpy(p.out + i * p.dim, row, row_bytes);
  }
}

}  // namespace parasol
