#include "worker/departure.hpp"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <string>

#include "common/protocol.hpp"

namespace parasol {

Status Departure::Leave() {
  c_.left_ = true;
  const ShardSession::Ticket t = c_.NewTicket(Op::Clock, 0);
  // The shards serving its clock (which would wait for its pushes); those that served only the
  // clock before have had its tick.
  const uint32_t n = c_.relay_.membership().PlacementAt(c_.clock_).count();
  for (uint32_t s = 0; s < std::min<size_t>(n, c_.num_shards_); ++s) {
    Header h = c_.NewRequest(Op::Clock, 0);
    h.done = true;
    c_.Send(t, s, std::move(h), {});
  }
  PARASOL_RETURN_IF_ERROR(c_.Wait(t));
  // One that leaves the running job (a rank shard 0 named a leave clock for) exits now: every
  // shard must hold its pushes first. At the job's end the last worker's Leave makes each
  // shard checkpoint before the last barrier is released; only the shards a change of the
  // shard count removed are asked.
  const int64_t leave = c_.relay_.membership().leave(c_.worker_id_);
  const bool early = leave >= 0 && c_.clock_ >= leave;
  return SettleLog(early ? 0 : std::min<uint32_t>(n, c_.num_shards_));
}

Status Departure::SettleLog(uint32_t first) {
  // The worker exits after leaving, its push log with it. A shard from `first` on whose log
  // still holds pushes must first hold them in a durable checkpoint: one at or after the clock
  // this worker stopped pushing to it (its leave clock, or the clock a change of the shard
  // count removed the shard at). A checkpoint at clock c holds every push of the clocks before
  // c: every worker had ticked them, and a tick waits for the pushes it names. A shard
  // checkpoints when a worker leaves the running job (ShardServer::CheckpointWhenALeaverIsDone)
  // and a removed shard once every worker has passed the change's clock. Asking finds a
  // restart, and the replay goes as always (parasol_sim --seed 2511 --reshard: a removed
  // shard restarted after every worker had left it, and the change waited for ever on the
  // pushes of clocks 5 and 6; --elastic --seed 90: a shard restarted from before a leave).
  auto until = c_.env_->Now() + std::chrono::milliseconds(c_.manifest_.training.worker_timeout_ms);
  const uint32_t serving = std::min<uint32_t>(
      c_.relay_.membership().PlacementAt(std::max<int64_t>(0, c_.clock_ - 1)).count(),
      c_.num_shards_);
  auto late = [&](uint32_t s, int64_t stopped, const Status& last) {
    if (s < serving) {
      // A shard of the job that stays silent: leaving now would take the only copy.
      return Unavailable("worker " + std::to_string(c_.worker_id_) + " leaves, but shard " +
                         std::to_string(s) + " has no durable checkpoint from clock " +
                         std::to_string(stopped) + " on within training.worker_timeout (" +
                         std::to_string(c_.manifest_.training.worker_timeout_ms) + " ms)" +
                         (last.ok() ? "" : "; it last answered " + last.ToString()));
    }
    // Given up, not failed: a removed shard may have been stopped once its change was finished
    // (its rows live on elsewhere), which this worker cannot tell from one that is down.
    spdlog::warn(
        "worker {}: leaves with pushes to shard {} that no checkpoint of it from clock "
        "{} on is known to hold (asked for training.worker_timeout = {} ms{}); a restart "
        "of that shard before its rows moved on would need them",
        c_.worker_id_, s, stopped, c_.manifest_.training.worker_timeout_ms,
        last.ok() ? "" : "; it last answered " + last.ToString());
    return Status::Ok();
  };
  // A replay under way empties the log until its pushes are acknowledged again.
  while (!c_.replay_tickets_.empty() && c_.env_->Now() < until) {
    PARASOL_RETURN_IF_ERROR(c_.Pump(std::chrono::milliseconds(100)));
    // A rollback undoes what the replay would bring back (the replay goes to a process that no
    // longer serves its history, and is never answered): the worker connects again instead
    // (parasol_sim --seed 60791: a leaver replayed into a rolled-back shard until it failed).
    c_.CheckOwedRollback();
    if (!c_.rolled_back_.ok()) return c_.rolled_back_;
    if (!c_.replay_failure_.ok()) return c_.replay_failure_;
  }
  // One that leaves the running job waits, even with nothing in its log, for a checkpoint that
  // holds its done: the shard begins one after the done tick's reply, in the background.
  const bool left_early = first == 0 && c_.recovery_.logs_pushes();
  // While a shard writes a checkpoint it is waited for longer, up to ten time-outs in all.
  const auto longest =
      c_.env_->Now() + 10 * std::chrono::milliseconds(c_.manifest_.training.worker_timeout_ms);
  const Membership& m = c_.relay_.membership();
  for (uint32_t s = first; s < c_.num_shards_; ++s) {
    int64_t stopped = c_.clock_;
    while (stopped > 0 && m.PlacementAt(stopped - 1).count() <= s) --stopped;
    Status last;
    const bool owes_done = left_early && c_.recovery_.DoneNoted(s);
    while (c_.recovery_.log().entries(s) > 0 || c_.recovery_.replay_due(s) || owes_done) {
      if (c_.env_->Now() >= until) {
        PARASOL_RETURN_IF_ERROR(late(s, stopped, last));
        break;  // the next shard is asked still
      }
      // A plain membership request: answered by any shard, cheaply, with the reply's stamps.
      Result<ShardSession::Reply> r = c_.Call(s, c_.NewRequest(Op::Membership, 0), {});
      if (!c_.rolled_back_.ok()) return c_.rolled_back_;
      if (!c_.replay_failure_.ok()) return c_.replay_failure_;
      if (r.ok() &&
          (r->header.checkpoint_clock >= stopped || c_.recovery_.DoneHeld(s, r->header)) &&
          !c_.recovery_.replay_due(s) && c_.replay_tickets_.empty()) {
        c_.recovery_.Settled(s);  // every push it took from this worker is on its disk
        break;
      }
      if (r.ok() && r->header.checkpoints_begun > r->header.checkpoint_count) {
        until = std::min(
            longest,
            std::max(until, c_.env_->Now() + std::chrono::milliseconds(
                                                 c_.manifest_.training.worker_timeout_ms)));
      }
      // Any refusal (down, restarting, refused for now until its attempts ran out) is asked
      // again until the time-out.
      last = r.ok() ? Status::Ok() : r.status();
      PARASOL_RETURN_IF_ERROR(c_.Idle(std::chrono::milliseconds(100)));
    }
  }
  return Status::Ok();
}

Status Departure::AskShardZero(bool done, uint64_t count, int64_t not_before) {
  const ShardSession::Ticket t = c_.NewTicket(Op::Membership, 0);
  Header h = c_.NewRequest(Op::Membership, 0);
  h.done = done;  // MembershipAsksToLeave
  SetMembershipWorkers(h, count);
  SetMembershipNotBefore(h, not_before);
  c_.Send(t, 0, std::move(h), {});
  return c_.Wait(t).WithContext("asking shard 0 about the job's membership");
}

Result<int64_t> Departure::RequestLeave(int64_t not_before) {
  if (!c_.JobRank() || !c_.relay_.membership().Joined(c_.worker_id_)) {
    return FailedPrecondition("worker " + std::to_string(c_.worker_id_) + " is not in the job");
  }
  PARASOL_RETURN_IF_ERROR(AskShardZero(/*done=*/true, 0, not_before));
  if (c_.relay_.membership().leave(c_.worker_id_) < 0) {
    return FailedPrecondition("shard 0 named no leave clock for worker " +
                              std::to_string(c_.worker_id_));
  }
  return c_.relay_.membership().leave(c_.worker_id_);
}

Result<uint64_t> Departure::Scale(uint64_t workers, int64_t not_before) {
  if (c_.JobRank()) return FailedPrecondition("Scale is a tool's request, not a worker's");
  if (workers == 0) return InvalidArgument("a job needs at least one worker");
  PARASOL_RETURN_IF_ERROR(AskShardZero(/*done=*/false, workers, not_before));
  uint64_t staying = 0;
  for (uint32_t w = 0; w < c_.relay_.membership().max_ranks(); ++w) {
    if (c_.relay_.membership().Joined(w) && c_.relay_.membership().leave(w) < 0) ++staying;
  }
  return staying;
}

}  // namespace parasol
