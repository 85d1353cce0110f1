// ReplaySender: how a worker carries out a replay to a shard that restarted (its process lost
// what it had not checkpointed). What to send, and in which order, is a pure plan
// (worker/replay_plan.hpp, where the rule is stated); this gathers what the plan is made from
// (the worker's clocks, the push log of worker/shard_recovery.hpp, the requests in flight to
// the old process) and sends it through the client's connections.
//
// - Start(shard): the replay of a shard whose replay is due. Every replayed request is tracked
//   like any other (worker/request_tracker.hpp): resent until acknowledged; an acknowledged
//   push goes back into the log. A replay the shard's previous process had not finished gives
//   back its unacknowledged pushes, merged in clock order. What was in flight to the old process
//   is sent again after them, under new request ids.
// - Reap(): drops finished replays. A refused one fails the worker (ShardSession::replay_failed()):
//   going on would lose acknowledged updates.
#pragma once

#include <cstdint>

#include "worker/shard_session.hpp"

namespace parasol {

class ReplaySender {
 public:
  explicit ReplaySender(ShardSession& client) : c_(client) {}

  void Start(uint32_t shard);
  void Reap();

 private:
  ShardSession& c_;
};

}  // namespace parasol
