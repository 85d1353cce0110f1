// PushRecord: which pushes this shard has applied, so that a resent, replayed or recomputed
// push is applied once.
//
// A push is identified by (worker, clock, index): the clock the worker was on when it pushed
// and the push's position among that clock's pushes (ShardSession numbers them from 0 at every
// tick). The identity is deterministic, so a worker that restarts and recomputes a step sends
// the very pushes it sent before, and those the shard had applied are answered as duplicates.
//
// Per worker the record keeps the last `window_clocks` clocks the worker pushed at; within a
// clock, every index below a contiguous prefix plus at most `max_out_of_order` indexes past it.
// A push older than the window is kTooOld: it cannot be told apart from one applied before,
// and applying an update twice is worse than refusing a very late resend (the worker gets a
// clear error). So the record's size is bounded by workers x window_clocks x max_out_of_order.
// Thread-safety: none; the shard's request thread owns it.
#pragma once

#include <cstdint>
#include <map>
#include <set>
#include <unordered_map>
#include <utility>
#include <vector>

#include "common/status.hpp"

namespace parasol {

class PushRecord {
 public:
  static constexpr uint32_t kDefaultWindowClocks = 64;
  static constexpr uint32_t kDefaultMaxOutOfOrder = 4096;
  // Checksums kept per worker (the newest pushes'); an applied push older than these is
  // answered as a duplicate unchecked.
  static constexpr size_t kMaxChecksums = 16384;

  explicit PushRecord(uint32_t window_clocks = kDefaultWindowClocks,
                      uint32_t max_out_of_order = kDefaultMaxOutOfOrder);

  enum class Verdict { kNew, kApplied, kTooOld, kConflict };
  // kConflict: applied, sent by process `incarnation` with a payload whose checksum was not
  // `checksum` (0: not checked).
  Verdict Check(uint32_t worker, int64_t clock, uint64_t index, uint64_t checksum = 0,
                uint64_t incarnation = 0) const;

  // Records the push as applied, with its payload's checksum (0: none) and its sender. Fails (and records nothing) when the clock is older than the
  // window or when `index` would be the (max_out_of_order + 1)-th index past the clock's
  // contiguous prefix; call it before applying the push, so a refused push is not applied.
  Status Mark(uint32_t worker, int64_t clock, uint64_t index, uint64_t checksum = 0,
              uint64_t incarnation = 0);
  // Whether Mark would succeed, without recording.
  Status CanMark(uint32_t worker, int64_t clock, uint64_t index) const;

  // The oldest clock a push of `worker` may carry (pushes before it are kTooOld).
  int64_t Floor(uint32_t worker) const;
  // Entries held, over all workers and clocks (a clock's prefix counts as one).
  uint64_t Entries() const;

  // The whole state as bytes (for checkpoints), and back; Load refuses malformed bytes and a
  // record of another window, changing nothing.
  std::vector<char> Save() const;
  bool Load(const std::vector<char>& bytes);

 private:
  struct ClockEntry {
    uint64_t next = 0;            // every index < next is applied
    std::set<uint64_t> beyond;    // applied indexes > next
  };
  struct WorkerRecord {
    int64_t floor = 0;  // clocks < floor are forgotten
    std::map<int64_t, ClockEntry> clocks;
    // (clock, index) -> (checksum of the applied payload, its sender's incarnation); at most
    // kMaxChecksums, the newest kept.
    std::map<std::pair<int64_t, uint64_t>, std::pair<uint64_t, uint64_t>> checksums;
  };

  uint32_t window_clocks_;
  uint32_t max_out_of_order_;
  std::unordered_map<uint32_t, WorkerRecord> workers_;
};

}  // namespace parasol
