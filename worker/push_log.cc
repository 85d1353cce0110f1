#include "worker/push_log.hpp"

#include <algorithm>
#include <string>

namespace parasol {

PushLog::PushLog(uint32_t shards, uint64_t max_bytes)
    : logs_(shards), shard_bytes_(shards, 0), max_bytes_(max_bytes) {}

void PushLog::Add(uint32_t shard, int64_t clock, uint64_t epoch, uint64_t checkpoint_count,
                  std::vector<zmq::message_t> frames) {
  Entry e;
  e.clock = clock;
  e.epoch = epoch;
  e.acked_at = checkpoint_count;
  for (const auto& f : frames) e.bytes += f.size();
  e.frames = std::move(frames);
  shard_bytes_[shard] += e.bytes;
  bytes_ += e.bytes;
  added_bytes_ += e.bytes;
  peak_bytes_ = std::max(peak_bytes_, bytes_);
  logs_[shard].push_back(std::move(e));
}

uint64_t PushLog::Trim(uint32_t shard, uint64_t epoch, uint64_t count, uint64_t restored) {
  auto& log = logs_[shard];
  uint64_t dropped_to = 0;
  while (!log.empty() &&
         log.front().acked_at < (log.front().epoch == epoch ? count : restored)) {
    dropped_to = std::max(dropped_to, log.front().acked_at + 1);
    shard_bytes_[shard] -= log.front().bytes;
    bytes_ -= log.front().bytes;
    log.pop_front();
  }
  return dropped_to;
}

std::deque<PushLog::Entry> PushLog::Take(uint32_t shard) {
  std::deque<Entry> out = std::move(logs_[shard]);
  logs_[shard].clear();
  bytes_ -= shard_bytes_[shard];
  shard_bytes_[shard] = 0;
  return out;
}

Status PushLog::Check() const {
  if (max_bytes_ == 0 || bytes_ <= max_bytes_) return Status::Ok();
  uint32_t worst = 0;
  for (uint32_t s = 1; s < shard_bytes_.size(); ++s) {
    if (shard_bytes_[s] > shard_bytes_[worst]) worst = s;
  }
  return ResourceExhausted(
      "the push log holds " + std::to_string(bytes_) + " bytes, over checkpoint.max_log_bytes (" +
      std::to_string(max_bytes_) + "); shard " + std::to_string(worst) + " holds " +
      std::to_string(shard_bytes_[worst]) + " of them since its last checkpoint: it has not "
      "been able to write a checkpoint (see its log)");
}

}  // namespace parasol
