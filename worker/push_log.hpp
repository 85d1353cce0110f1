// PushLog: a worker's record of the pushes each shard acknowledged since that shard's newest
// checkpoint: what it replays when the shard restarts from that checkpoint.
//
// Each entry keeps the push's frames, its clock, and the shard process (epoch) and checkpoint
// count in the acknowledgement (how many checkpoints the shard had written when it answered). A
// push acknowledged at count n is in that process's checkpoint n + 1, so a reply of the same
// process with a larger count trims it. A reply of a later process (the shard restarted) trims
// an earlier one's entries only by the count of the checkpoint it restored: the later process's
// own checkpoints were written from that state, so they hold no more of them.
// Entries stay in acknowledgement order, which is clock order (a worker ticks only after its
// pushes are acknowledged).
//
// The log is bounded by checkpoint.max_log_bytes: shards checkpoint whenever a worker has
// pushed half of it (over the shards) to them, so a log past the bound means a shard has not
// been able to checkpoint; Check() says so, and the worker stops rather than grow.
// Thread-safety: none; owned by one ShardSession.
#pragma once

#include <cstdint>
#include <deque>
#include <vector>

#include <zmq.hpp>

#include "common/status.hpp"

namespace parasol {

class PushLog {
 public:
  struct Entry {
    int64_t clock = 0;
    uint64_t epoch = 0;     // the shard process that acknowledged it
    uint64_t acked_at = 0;  // its checkpoint count in the acknowledgement
    uint64_t bytes = 0;
    std::vector<zmq::message_t> frames;
  };

  PushLog() = default;
  PushLog(uint32_t shards, uint64_t max_bytes);

  void Add(uint32_t shard, int64_t clock, uint64_t epoch, uint64_t checkpoint_count,
           std::vector<zmq::message_t> frames);
  // Drops the entries of `shard` in a checkpoint of process `epoch`: its own acknowledged
  // before its checkpoint count reached `count`, and an earlier process's acknowledged before
  // `restored` (the count the checkpoint `epoch` started from holds every acknowledged push
  // before: less than its sequence when it was taken while a replay was owed;
  // server/shard_state.hpp, kCompleteThrough).
  // Returns 1 + the largest count an entry it dropped was acknowledged at (0: none dropped):
  // a checkpoint from that count on holds everything it dropped.
  uint64_t Trim(uint32_t shard, uint64_t epoch, uint64_t count, uint64_t restored);
  // Everything logged for `shard`, in order; the shard's log is empty afterwards.
  std::deque<Entry> Take(uint32_t shard);

  uint64_t bytes() const { return bytes_; }
  uint64_t bytes(uint32_t shard) const { return shard_bytes_[shard]; }
  uint64_t entries(uint32_t shard) const { return logs_[shard].size(); }
  uint64_t peak_bytes() const { return peak_bytes_; }
  uint64_t added_bytes() const { return added_bytes_; }  // all ever logged
  uint64_t max_bytes() const { return max_bytes_; }
  // An error naming the shards that hold the most once the log is past max_bytes.
  Status Check() const;

 private:
  std::vector<std::deque<Entry>> logs_;
  std::vector<uint64_t> shard_bytes_;
  uint64_t bytes_ = 0;
  uint64_t peak_bytes_ = 0;
  uint64_t added_bytes_ = 0;
  uint64_t max_bytes_ = 0;
};

}  // namespace parasol
