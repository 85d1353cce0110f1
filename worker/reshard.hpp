// Reshard: a tool's side of a change of the job's shard count while it trains (`parasol scale
// --servers N`; the shards' side is server/shard_migration.cc).
//
// First, while the job trains on, the tool copies every row that will change shard (with its
// optimizer state) from the shard that holds it to the one that will (common/placement.hpp),
// in pages, table by table. Then shard 0 names the clock C from which keys are placed among N
// shards. Once every shard has applied every push of the clocks before C, the tool copies again
// only the moving rows updated since the copy ahead (each row carries the shard clock of its
// last update), has every shard commit (a shard that gains rows answers no pull of clock C or
// later before it has, and writes a checkpoint when it does), then has the old holders drop the
// rows they no longer hold. Workers route by the new placement from clock C on; only their
// pulls of clock C wait, for the second copy.
//
// A shard that restarts during a copy is seen by its process number: a source is read again
// from the start, in full, and a pass whose target restarted before it committed is done again
// in full. Every step is safe to repeat, so running the tool again finishes a change it left
// unfinished. Tables that evict rows are copied at the change only (a row evicted after a copy
// ahead would stay on its new shard).
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

#include "common/status.hpp"
#include "worker/ps_client.hpp"

namespace parasol {

struct ReshardReport {
  int64_t clock = -1;      // the clock the new placement holds from
  uint32_t from = 0;       // shards before
  uint32_t to = 0;         // and after
  uint64_t ahead_rows = 0;     // rows copied before the change was named, training going on
  double ahead_seconds = 0;
  uint64_t rows_moved = 0;     // rows copied at the change (updated since; all without ahead)
  uint64_t elements_moved = 0; // dense elements copied at the change (to their new slices)
  double copy_seconds = 0;     // from the change's naming to the last commit
  uint64_t rows_dropped = 0;   // rows the old holders removed
  uint64_t passes = 0;         // copies at the change (more than 1 when a target restarted)
  double total_seconds = 0;
  std::string ToString() const;
};

// REQUIRES: `client` is a tool's (PsClient::kObserver, or a key outside the job's ranks).
Result<ReshardReport> Reshard(PsClient& client, uint32_t servers,
                              std::chrono::milliseconds timeout);

}  // namespace parasol
