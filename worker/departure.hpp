// Departure: how a worker leaves its job, and how a worker or a tool asks shard 0 about the
// job's membership (protocols/message.fbs, Op.Membership), through its client's connections.
//
// The invariant is the one of server/push_gate.hpp: every acknowledged push applied exactly
// once. A worker's push log is the only copy of what a restarted shard has not checkpointed,
// and it dies with the worker; so a worker that leaves exits only once each shard it pushed to
// holds those pushes in a durable checkpoint.
//
// - Leave(): the done tick to every shard serving the worker's clock (each acknowledges it;
//   shard 0 among them, which is what lets shard 0 alone judge whether a rollback can still
//   reach the leaver: ShardServer::RollbackBarrier()), then SettleLog().
// - SettleLog(first): waits until each shard from `first` on whose log still holds pushes has
//   a durable checkpoint from the clock this worker stopped pushing to it; one that leaves the
//   running job waits, even with an empty log, for a checkpoint that holds its done. A shard
//   that restarts meanwhile is replayed to as always; a rollback ends the wait (Aborted).
// - RequestLeave(), Scale(), AskShardZero(): shard 0 names the clock a rank leaves at, or the
//   leaves a tool's Scale asks for; the reply brings the membership.
//
// ShardSession::Leave(), RequestLeave(), Scale() and SyncMembership() call these.
#pragma once

#include <cstdint>

#include "common/status.hpp"
#include "worker/shard_session.hpp"

namespace parasol {

class Departure {
 public:
  explicit Departure(ShardSession& client) : c_(client) {}

  Status Leave();
  Result<int64_t> RequestLeave(int64_t not_before);
  Result<uint64_t> Scale(uint64_t workers, int64_t not_before);
  // A request to shard 0 of op Membership; `done` asks to leave, `count` is Scale's.
  Status AskShardZero(bool done, uint64_t count, int64_t not_before);

 private:
  Status SettleLog(uint32_t first);

  ShardSession& c_;
};

}  // namespace parasol
