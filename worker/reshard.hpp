// Reshard: a tool's side of a change of the job's shard count while it trains (`parasol scale
// --servers N`; the shards' side is server/shard_migration.cc).
//
// Shard 0 names the clock C from which keys are placed among N shards (common/placement.hpp).
// Once every shard has applied every push of the clocks before C, the tool copies each row that
// changes shard, with its optimizer state, from the shard that held it to the one that holds it
// from C on (in pages, table by table), then has every shard commit (a shard that gains rows
// answers no pull of clock C or later before it has, and writes a checkpoint when it does), then
// has the old holders drop the rows they no longer hold. Workers route by the new placement
// from clock C on, so training goes on meanwhile; only the pulls of clock C that need moved
// rows wait for the copy.
//
// A shard that restarts during the copy is seen by its process number: a source is read again
// from the start, and a pass whose target restarted before it committed is done again. Every
// step is safe to repeat, so running the tool again finishes a change it left unfinished.
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
  uint64_t rows_moved = 0;     // rows installed on their new shards (the last pass)
  uint64_t rows_dropped = 0;   // rows the old holders removed
  uint64_t passes = 0;         // copies made (more than 1 when a shard restarted)
  double wait_seconds = 0;     // from the request until the first page could be read
  double copy_seconds = 0;     // the last pass: export and install
  double total_seconds = 0;
  std::string ToString() const;
};

// REQUIRES: `client` is a tool's (PsClient::kObserver, or a key outside the job's ranks).
Result<ReshardReport> Reshard(PsClient& client, uint32_t servers,
                              std::chrono::milliseconds timeout);

}  // namespace parasol
