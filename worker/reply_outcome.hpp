// ReplyOutcome: what a worker does with a shard's reply to one of its requests, as one table
// (the request tracker's; tests/worker/reply_outcome_test.cc checks every row):
//
//   the shard says                                  | the request
//   ------------------------------------------------+------------------------------------------
//   Unavailable while loading its checkpoint        | waits for the restore (asked again soon
//                                                   | while it moves, without spending attempts)
//   anything, once it restarted and before this     | waits for the replay, which sends it again
//   worker's replay reached it (an error; a pull's  | in order after the pushes it lost
//   answer from the checkpoint's state)             |
//   Unavailable to a tick, a pull or a push (a tick | retried after cluster.request_timeout,
//   whose pushes have not all arrived, and what was | within its attempts; a Step's parts
//   sent behind it; a rollback on its way), or to a | each on its own
//   Step of them; to a Hello or a membership        |
//   request (shard 0 restarted and waits for the    |
//   workers' replays; too many wait for a           |
//   checkpoint)                                     |
//   any other error                                 | fails (its caller sees the status)
//   OK                                              | done
#pragma once

#include "common/status.hpp"
#include "common/wire.hpp"

namespace parasol {

enum class ReplyOutcome {
  kDone,
  kAwaitRestore,
  kAwaitReplay,
  kRetryLater,
  kFail,
};

// `restoring`: the reply says the shard is loading its checkpoint (restore_total > 0);
// `replay_due`: the shard restarted and this worker's replay to it has not been sent yet.
ReplyOutcome OutcomeOf(Op request, StatusCode status, bool restoring, bool replay_due);

const char* OutcomeName(ReplyOutcome outcome);

}  // namespace parasol
