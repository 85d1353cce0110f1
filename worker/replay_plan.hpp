// ReplayPlan: what a worker sends a shard that restarted from a checkpoint, in order, as a pure
// function of what the worker knows: its clock, the shard's restored clock and membership, the
// requests it had in flight to the old process, and the clocks of the pushes its log holds.
// worker/replay_sender.hpp carries the plan out; tests/worker/replay_plan_test.cc checks it without
// a socket.
//
// The rule it keeps (docs/internals.md, "How a job survives failures"): the restored shard must see every
// logged push at the clock it belongs to, and must never be ticked past a clock before it has
// that clock's pushes. So, for each clock from the checkpoint's to the worker's, a Clock marked
// replay, then that clock's logged pushes; the last Clock says the worker is caught up. What was
// in flight to the dead process is resent after that, in the order it was first sent. Two cases
// stop the replay's clocks early:
//   - a tick still in flight (sent right behind its step's pushes): the clocks stop before it,
//     and it is resent with those pushes;
//   - a push still in flight from a clock whose tick was answered (its reply was lost with a
//     connection): the clocks stop at its clock; it is resent with the rest, and the clocks
//     after it follow, the first one naming the pushes it follows; a tick in flight past those
//     clocks, and what is behind it, go after them.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "common/wire.hpp"

namespace parasol {

struct ReplayInputs {
  // A request the worker had in flight to the shard's old process (not one of an earlier,
  // unfinished replay: those go back into the log), in the order it was first sent.
  struct InFlight {
    uint64_t id = 0;
    Op op = Op::Hello;
    int64_t clock = 0;
    bool done = false;  // a Clock that says the worker leaves
  };
  int64_t clock = 0;             // the worker's clock
  bool left = false;             // the worker has left the job (its ticks say done)
  bool in_job = true;            // a worker of the job (an observer sends no Clocks)
  int64_t restored_clock = 0;    // the clock of the checkpoint the shard restarted from
  int64_t serving_from = 0;      // the clock the shard serves from (a shard that joined later)
  int64_t removed_at = -1;       // the clock a change of the shard count removed it at (-1: not)
  // Pushes the worker sent the shard at the clock before its own: the tick to its clock names
  // them.
  uint64_t last_push_count = 0;
  int64_t last_barrier = -1;     // the newest barrier the worker passed
  std::vector<InFlight> in_flight;
  std::vector<int64_t> log_clocks;  // the logged pushes' clocks, in the log's (clock) order
  // Their indexes among their clock's pushes (a push's name is worker, clock, index); empty:
  // unknown, and replayed ticks name no pushes.
  std::vector<uint64_t> log_indexes;
};

struct ReplayStep {
  enum class Kind { kClock, kPush, kResend };
  Kind kind = Kind::kClock;
  // kClock: the clock, whether it is the last of its run (caught up), whether it says the
  // worker leaves, the pushes of the clock before it that it names, and (on the last Clock of
  // each run) the barrier the worker passed.
  int64_t clock = 0;
  bool caught_up = false;
  bool done = false;
  uint64_t named = 0;
  int64_t last_barrier = -1;
  // kPush: the entry's position in the log; kResend: the in-flight request's id.
  uint64_t index = 0;
};

struct ReplayPlan {
  int64_t first = 0;       // the first clock replayed
  int64_t last = 0;        // the last clock sent (caught up there)
  uint64_t pushes = 0;     // logged pushes replayed
  std::vector<ReplayStep> steps;
};

ReplayPlan PlanReplay(const ReplayInputs& in);

}  // namespace parasol
