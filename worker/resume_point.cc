#include "worker/resume_point.hpp"

#include <algorithm>

#include "common/protocol.hpp"

namespace parasol {

ResumePoint ResumeFrom(std::span<const Header> hellos, uint32_t worker, bool check_redo) {
  ResumePoint r;
  for (const Header& h : hellos) {
    if (HelloKnownClock(h) < 0) continue;
    // Barrier n is behind the worker only if every shard released it (a worker killed in the
    // middle of entering it reached some shards only).
    r.last_barrier = r.known ? std::min(r.last_barrier, h.last_barrier) : h.last_barrier;
    r.clock = r.known ? std::min(r.clock, HelloKnownClock(h)) : HelloKnownClock(h);
    r.furthest_clock = std::max(r.furthest_clock, HelloKnownClock(h));
    r.done = r.done && HelloWorkerLeft(h);
    r.known = true;
  }
  if (!check_redo) return r;
  for (const Header& h : hellos) {
    if (HelloKnownClock(h) <= r.clock) continue;
    const std::string at = std::to_string(r.clock);
    const std::string shard = std::to_string(h.shard_rank);
    r.lost_step = "worker " + std::to_string(worker) + " restarted after its tick out of step " +
                  at + " reached shard " + shard + " but not every shard; shard " + shard +
                  (h.read_clock > r.clock ? " has applied" : " may apply") +
                  " that step before the redo reads it, so the step is redone from other "
                  "values and its updates as first computed are lost (two failures overlapped, "
                  "or the worker died between its ticks)";
    break;
  }
  return r;
}

}  // namespace parasol
