// ShardRecovery: what a worker keeps to bring a restarted shard back to where it had it.
//
// The invariant (with server/push_gate.hpp, its shard-side half): every push a shard
// acknowledged is applied exactly once to the final model. A shard's checkpoint holds the
// pushes it had applied when the checkpoint began; the worker keeps every push acknowledged
// since in its push log (worker/push_log.hpp) until a reply's checkpoint count says a durable
// checkpoint holds it. Every reply names the shard's process (its epoch): a new epoch from a
// shard this worker had heard from is a restart, and a replay to it is due. The replay sends,
// in clock order, a Clock for each clock from the checkpoint's to the worker's own and that
// clock's logged pushes (a pure plan, worker/replay_plan.hpp); the shard's restored push record
// applies each push once. A restart from an older checkpoint than the one the worker trimmed
// its log by (the newer one was damaged) has lost pushes only that checkpoint held: it is an
// error, never hidden.
//
// This class holds that state and decides from each reply; the replay itself (what was in
// flight, the requests it sends) is ShardSession's, which owns the connections.
// Thread-safety: none; owned by one ShardSession.
#pragma once

#include <cstdint>
#include <deque>
#include <vector>

#include "common/status.hpp"
#include "common/wire.hpp"
#include "worker/push_log.hpp"

namespace parasol {

class ShardRecovery {
 public:
  ShardRecovery() = default;
  // `worker`: this worker's id (for errors); `log_pushes`: the job checkpoints and this is a
  // worker of the job, so acknowledged pushes are logged.
  ShardRecovery(uint32_t shards, uint64_t max_log_bytes, bool log_pushes, uint32_t worker);

  // A reply of `shard`: notes its process and trims the log by its checkpoint count. A new
  // process of a shard heard from before (`restarted`) makes a replay to it due, and the clock
  // of the checkpoint it restarted from is kept. `lost`: that process started from an older
  // checkpoint than the one this worker trimmed its log by, so updates are lost.
  struct Noted {
    bool restarted = false;
    Status lost;
  };
  Noted NoteReply(uint32_t shard, const Header& reply);
  // A push acknowledged by `reply` of `shard`, whose frames are moved into the log when pushes
  // are logged (else left where they are): in every checkpoint begun after this reply.
  void LogPush(uint32_t shard, int64_t clock, const Header& reply,
               std::vector<zmq::message_t>& frames);

  // This worker leaves the running job, and `reply` of `shard` answered its done tick: the
  // shard begins a checkpoint after that reply, which holds the done and every push before it
  // (ShardServer::CheckpointWhenALeaverIsDone).
  void NoteDone(uint32_t shard, const Header& reply);
  // Whether `reply` of `shard` says such a checkpoint is durable: a count past the one the
  // done's reply carried, from the same process (a restart is replayed to, done again).
  bool DoneHeld(uint32_t shard, const Header& reply) const;
  // Whether `shard` answered this worker's done tick.
  bool DoneNoted(uint32_t shard) const { return done_[shard].noted; }

  bool logs_pushes() const { return log_pushes_; }
  bool replay_due(uint32_t shard) const { return replay_due_[shard]; }
  // `shard`'s restart owes no replay (this worker has not been taken into the job yet).
  void NothingOwed(uint32_t shard) { replay_due_[shard] = false; }
  bool any_replay_due() const;
  // The replay to `shard` begins: it is no longer due; what the log held for it is its.
  std::deque<PushLog::Entry> StartReplay(uint32_t shard);
  // `shard` has a durable checkpoint holding every push this worker made to it (it serves no
  // more clocks): its log goes.
  void Settled(uint32_t shard) { (void)log_.Take(shard); }
  // The clock of the checkpoint `shard` restarted from (-1: it has not restarted).
  int64_t restored_clock(uint32_t shard) const { return restored_clock_[shard]; }
  // The process of `shard` this worker last heard from (0: none).
  uint64_t epoch(uint32_t shard) const { return epochs_[shard]; }
  // Every shard's process is unknown again (after a rollback, learned afresh from the Hellos).
  void ForgetEpochs();
  const PushLog& log() const { return log_; }
  // An error once the log is past its bound (see PushLog::Check()).
  Status CheckLog() const;

 private:
  uint32_t worker_ = 0;
  bool log_pushes_ = false;
  PushLog log_;
  std::vector<uint64_t> epochs_;
  std::vector<bool> replay_due_;
  // Per shard: a checkpoint must be at least this count to hold every push this worker dropped
  // from its log (1 + the largest count one was acknowledged at; 0: none dropped).
  std::vector<uint64_t> trimmed_to_;
  std::vector<int64_t> restored_clock_;  // per shard: the clock of the checkpoint it restarted from
  struct DoneAck {
    bool noted = false;
    uint64_t epoch = 0;  // the shard's process that answered the done tick
    uint64_t past = 0;   // the count its reply carried
  };
  std::vector<DoneAck> done_;  // per shard
};

}  // namespace parasol
