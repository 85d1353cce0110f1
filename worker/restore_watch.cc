#include "worker/restore_watch.hpp"

#include <algorithm>

namespace parasol {

bool RestoreWatch::Note(uint32_t shard, const Header& reply, TimePoint now) {
  Progress& r = shards_[shard];
  const bool first = r.heard == TimePoint{} || now - r.heard > request_timeout_;
  // Any change is progress (a chain of checkpoints counts each file from 0 again).
  if (first || reply.restore_done != r.done || reply.restore_total != r.total ||
      reply.restore_rows != r.rows) {
    r.progressed = now;
  }
  if (r.began == TimePoint{}) r.began = now;
  r.done = reply.restore_done;
  r.total = reply.restore_total;
  r.rows = reply.restore_rows;
  r.rows_total = reply.restore_rows_total;
  r.heard = now;
  if (now - r.logged < std::chrono::seconds(5)) return false;
  r.logged = now;
  return true;
}

std::chrono::milliseconds RestoreWatch::Poll() const {
  return std::clamp(request_timeout_ / 2, std::chrono::milliseconds(10), kMaxPoll);
}

bool RestoreWatch::Moving(uint32_t shard, TimePoint now) const {
  const Progress& r = shards_[shard];
  // A request's time-out, and the asking again: no progress for that long counts as silence.
  const auto window = request_timeout_ + 2 * Poll();
  return r.heard != TimePoint{} && now - r.heard <= window && now - r.progressed <= window &&
         now - r.began <= restore_timeout_;
}

}  // namespace parasol
