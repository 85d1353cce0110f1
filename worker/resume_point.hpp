// Where a worker of the job goes on from, decided from the Hello replies of the shards it
// greeted: the smallest clock a shard knows it at (a restarted worker redoes the step it died
// in; its pushes that arrived are answered as duplicates), whether every shard saw it leave, and
// the newest barrier every shard released. Pure: ShardSession's handshake gathers the replies and
// acts on the answer.
#pragma once

#include <cstdint>
#include <span>
#include <string>

#include "common/wire.hpp"

namespace parasol {

struct ResumePoint {
  bool known = false;        // a shard knew the worker (the fields below say nothing otherwise)
  int64_t clock = -1;        // the smallest clock a shard knows it at
  int64_t furthest_clock = -1;  // the largest clock a shard knows it at
  bool done = true;          // every shard that knew it saw it leave
  int64_t last_barrier = -1;  // the smallest barrier count the knowing shards released
  // BSP only: the worker's tick out of `clock` reached some shards but not all. A shard that has
  // it applies that step once the others ticked there too (it may have: read_clock), so the
  // redo reads other values than the first run did and its updates as first computed are lost.
  // What happened, for the log and lost_step(); empty when nothing was.
  std::string lost_step;
};

// `hellos`: the replies of the shards greeted (a shard that serves nothing yet does not know
// the worker and is passed over). `check_redo`: under BSP, for a worker of the job that
// restarted (not one joining it).
ResumePoint ResumeFrom(std::span<const Header> hellos, uint32_t worker, bool check_redo);

}  // namespace parasol
