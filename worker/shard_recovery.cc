#include "worker/shard_recovery.hpp"

#include <algorithm>
#include <string>

namespace parasol {

ShardRecovery::ShardRecovery(uint32_t shards, uint64_t max_log_bytes, bool log_pushes,
                             uint32_t worker)
    : worker_(worker),
      log_pushes_(log_pushes),
      log_(shards, max_log_bytes),
      epochs_(shards, 0),
      replay_due_(shards, false),
      trimmed_to_(shards, 0),
      restored_clock_(shards, -1),
      done_(shards) {}

ShardRecovery::Noted ShardRecovery::NoteReply(uint32_t shard, const Header& reply) {
  Noted noted;
  if (epochs_[shard] != 0 && epochs_[shard] != reply.server_epoch) {
    noted.restarted = true;
    replay_due_[shard] = true;
    restored_clock_[shard] = reply.checkpoint_clock;
    // What the restored checkpoint holds of what this worker trimmed its log by: everything
    // before its sequence when it holds every acknowledged push before it, or when this worker
    // trimmed by the counts of the process that took it (its own acknowledgements are in it);
    // otherwise only what was acknowledged before restored_count (it was taken while a replay
    // of an earlier process's pushes was owed).
    const bool short_of = reply.restored_count < reply.restored_sequence;
    const uint64_t holds = !short_of || epochs_[shard] == reply.restored_writer
                               ? reply.restored_sequence
                               : reply.restored_count;
    if (log_pushes_ && holds < trimmed_to_[shard]) {
      // The new process started from an older checkpoint than one this worker had trimmed its
      // log by (the newer one was damaged, or not loaded): the pushes only it held are gone.
      // (A client that pushes nothing, a tool, lost nothing.)
      noted.lost = FailedPrecondition(
          "worker " + std::to_string(worker_) + ": shard " + std::to_string(shard) +
          " restarted from checkpoint " + std::to_string(reply.restored_sequence) +
          (holds < reply.restored_sequence
               ? " (which holds the pushes acknowledged before " + std::to_string(holds) + ")"
               : "") +
          ", but this worker had dropped from its log pushes that only a checkpoint from " +
          std::to_string(trimmed_to_[shard]) + " on holds: acknowledged updates are lost");
    }
  }
  epochs_[shard] = reply.server_epoch;
  // Pushes acknowledged before the shard's newest checkpoint are in it: no replay needs them.
  // What was dropped, for the check above (only pushes actually dropped: a worker that held
  // none lost none, whatever count a checkpoint it never needed claimed).
  trimmed_to_[shard] = std::max(
      trimmed_to_[shard],
      log_.Trim(shard, reply.server_epoch, reply.checkpoint_count, reply.restored_count));
  return noted;
}

void ShardRecovery::LogPush(uint32_t shard, int64_t clock, const Header& reply,
                            std::vector<zmq::message_t>& frames) {
  if (!log_pushes_) return;
  // A duplicate too: its first acknowledgement was lost, and a restart before the next
  // checkpoint needs it replayed like any other. In every checkpoint begun after this reply
  // (one written in the background now holds the state from before it).
  log_.Add(shard, clock, reply.server_epoch,
           std::max(reply.checkpoint_count, reply.checkpoints_begun), std::move(frames));
}

void ShardRecovery::NoteDone(uint32_t shard, const Header& reply) {
  done_[shard] = {true, reply.server_epoch,
                  std::max(reply.checkpoint_count, reply.checkpoints_begun)};
}

bool ShardRecovery::DoneHeld(uint32_t shard, const Header& reply) const {
  const DoneAck& d = done_[shard];
  return d.noted && reply.server_epoch == d.epoch && reply.checkpoint_count > d.past;
}

bool ShardRecovery::any_replay_due() const {
  return std::find(replay_due_.begin(), replay_due_.end(), true) != replay_due_.end();
}

std::deque<PushLog::Entry> ShardRecovery::StartReplay(uint32_t shard) {
  replay_due_[shard] = false;
  return log_.Take(shard);
}

void ShardRecovery::ForgetEpochs() {
  // After a rollback: every process is learned afresh, and what the log held is redone.
  std::fill(epochs_.begin(), epochs_.end(), 0);
  std::fill(trimmed_to_.begin(), trimmed_to_.end(), 0);
}

Status ShardRecovery::CheckLog() const {
  if (!log_pushes_) return Status::Ok();
  return log_.Check().WithContext("worker " + std::to_string(worker_));
}

}  // namespace parasol
