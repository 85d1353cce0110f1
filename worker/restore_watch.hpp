// RestoreWatch: which shards said they are loading their checkpoint, and whether each still
// makes progress.
//
// A shard that restarts answers every request with Unavailable and its progress (restore_done
// of restore_total bytes, restore_rows of restore_rows_total rows) until its checkpoint is
// loaded. A worker waits for such a shard without spending its requests' attempts, asking
// again every Poll(), for as long as its progress moves within a request's time-out and the
// whole restore stays within cluster.restore_timeout. A shard whose progress stopped is waited
// for no longer than a silent one.
//
// Times are passed in: the watch reads no clock.
#pragma once

#include <chrono>
#include <cstdint>
#include <vector>

#include "common/wire.hpp"

namespace parasol {

class RestoreWatch {
 public:
  using TimePoint = std::chrono::steady_clock::time_point;
  struct Progress {
    uint64_t done = 0, total = 0, rows = 0, rows_total = 0;
    TimePoint heard{}, progressed{}, logged{};
    TimePoint began{};  // the first "loading" of this episode
  };

  RestoreWatch(uint32_t shards, std::chrono::milliseconds request_timeout,
               std::chrono::milliseconds restore_timeout)
      : shards_(shards), request_timeout_(request_timeout), restore_timeout_(restore_timeout) {}

  // `reply` of `shard` says it is loading (restore_total > 0). Returns whether to log it now
  // (at most every 5 s per shard).
  bool Note(uint32_t shard, const Header& reply, TimePoint now);
  // `shard` answered from its state: whatever it said while loading is over.
  void Loaded(uint32_t shard) { shards_[shard] = Progress{}; }
  // Whether `shard` said it is loading, and its progress moved, within a request's time-out
  // (and the asking again), and the restore has not outlasted cluster.restore_timeout.
  bool Moving(uint32_t shard, TimePoint now) const;
  // How often a loading shard is asked again: half a request's time-out, within 10 ms and 1 s.
  std::chrono::milliseconds Poll() const;
  const Progress& progress(uint32_t shard) const { return shards_[shard]; }

 private:
  static constexpr std::chrono::milliseconds kMaxPoll{1000};
  std::vector<Progress> shards_;
  std::chrono::milliseconds request_timeout_;
  std::chrono::milliseconds restore_timeout_;
};

}  // namespace parasol
