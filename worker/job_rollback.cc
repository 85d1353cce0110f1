#include "worker/job_rollback.hpp"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <limits>
#include <optional>

#include "common/protocol.hpp"
#include "worker/shard_greeting.hpp"

namespace parasol {

Result<std::vector<Header>> JobRollback::Ask(int64_t clock, bool stop) {
  const ShardSession::Ticket t = c_.NewTicket(Op::Rollback, 0);
  for (uint32_t s = 0; s < c_.num_shards_; ++s) {
    Header h = c_.NewRequest(Op::Rollback, 0);
    h.clock = clock;
    SetRollbackQuestion(h, /*about_to_make=*/stop);
    c_.Send(t, s, std::move(h), {});
  }
  Status awaited = ShardGreeting(c_).Await(t);  // a shard may still be starting
  std::vector<Header> out(c_.num_shards_);
  for (uint32_t s = 0; s < c_.num_shards_ && awaited.ok(); ++s) {
    if (std::optional<Header> h = c_.ReplyHeader(t, s)) out[s] = *h;
  }
  PARASOL_RETURN_IF_ERROR(c_.Wait(t));
  PARASOL_RETURN_IF_ERROR(awaited);
  return out;
}

Status JobRollback::Follow() {
  c_.rolling_back_ = true;
  const Status st = FollowOnce();
  c_.rolling_back_ = false;
  // The shards' epochs are learned again from the Hellos.
  c_.recovery_.ForgetEpochs();
  return st;
}

Status JobRollback::FollowOnce() {
  PARASOL_ASSIGN_OR_RETURN(std::vector<Header> shards,
                           Ask(std::numeric_limits<int64_t>::max(), /*stop=*/false));
  const uint64_t gen = shards[0].rollback_gen;
  const int64_t clock = shards[0].rollback_clock;
  if (gen == 0) return Status::Ok();  // shard 0 is the first to roll back: none was made
  c_.rollback_gen_ = gen;
  for (uint32_t s = 1; s < c_.num_shards_; ++s) {
    if (shards[s].rollback_gen >= gen) continue;
    spdlog::warn("worker {}: shard {} is at rollback {}, shard 0 at {} (to clock {}): completing "
                 "it", c_.worker_id_, s, shards[s].rollback_gen, gen, clock);
    Header h = c_.NewRequest(Op::Rollback, 0);
    h.clock = clock;
    PARASOL_RETURN_IF_ERROR(c_.Call(s, std::move(h), {}).status());
  }
  return Status::Ok();
}

Status JobRollback::Make(const std::string& why) {
  c_.rolling_back_ = true;
  Status st;
  // Shard 0 refuses a clock it no longer holds a checkpoint at (pruned since it was asked), or
  // a rollback nobody asked about there (it restarted since the question): asked again.
  // Bounded.
  const uint64_t connected_in = c_.rollback_gen_;
  for (uint32_t attempt = 0; attempt < 4; ++attempt) {
    c_.rollback_gen_ = connected_in;  // each attempt makes the same rollback
    st = MakeOnce(why);
    if (st.code() != StatusCode::kNotFound && st.code() != StatusCode::kUnavailable) break;
  }
  c_.rolling_back_ = false;
  return st;
}

Status JobRollback::MakeOnce(const std::string& why) {
  // The clock: lowered to the newest checkpoint of the shard whose newest is oldest, until
  // every shard holds one at that clock. Each round lowers it, so this ends.
  // The generation is the one after the one this worker connected in: a worker that finds
  // the same loss as another makes the same rollback, never one more.
  const uint64_t next = c_.rollback_gen_ + 1;
  int64_t clock = std::numeric_limits<int64_t>::max();
  for (uint32_t round = 0;; ++round) {
    PARASOL_ASSIGN_OR_RETURN(std::vector<Header> shards, Ask(clock, /*stop=*/true));
    // A change of the shard count named since this worker greeted the shards (their replies
    // carry it): no rollback crosses it (ShardSession::Connect then reports the loss and goes on).
    if (c_.ShardCountChanged()) {
      return FailedPrecondition("worker " + std::to_string(c_.worker_id_) + ": " + why +
                                "; the shard count changed since this worker connected, and "
                                "no rollback crosses such a change");
    }
    int64_t lowest = clock;
    bool agree = true;
    for (uint32_t s = 0; s < c_.num_shards_; ++s) {
      const Header& h = shards[s];
      // Another worker rolled back already: follow it.
      if (h.rollback_gen >= next) return FollowOnce();
      if (RollbackRestorableClock(h) < 0) {
        return FailedPrecondition(
            "worker " + std::to_string(c_.worker_id_) + ": " + why +
            "; the job cannot roll back: shard " + std::to_string(s) + " holds no checkpoint" +
            (clock == std::numeric_limits<int64_t>::max()
                 ? std::string()
                 : " at or before clock " + std::to_string(clock)) +
            " (training.on_overlapping_failure: rollback needs a checkpoint every shard took "
            "at one clock; the updates are lost, so the job stops)");
      }
      agree = agree && (s == 0 || RollbackRestorableClock(h) ==
                                      RollbackRestorableClock(shards[0]));
      lowest = std::min(lowest, RollbackRestorableClock(h));
    }
    if (agree) {
      clock = lowest;
      break;
    }
    clock = lowest;
    if (round > 1024) return Internal("the shards' checkpoints never agreed on a clock");
  }
  spdlog::warn("worker {}: {}; rolling the job back to clock {} (rollback {})", c_.worker_id_, why,
               clock, next);
  // Shard 0 first: once it has moved, its generation and clock are the rollback's, and
  // Follow() of any worker completes it.
  c_.rollback_gen_ = next;
  Header first = c_.NewRequest(Op::Rollback, 0);
  first.clock = clock;
  Result<ShardSession::Reply> zero = c_.Call(0, std::move(first), {});
  int64_t at = clock;
  if (!zero.ok()) {
    if (zero.status().code() != StatusCode::kAborted) {
      c_.rollback_gen_ = next - 1;  // not made: the client stays in the generation it was in
      // Refused, perhaps past a change named or reached since the question (parasol_sim
      // --reshard --seed 875): learned, ShardSession::Connect reports the loss and goes on.
      if (zero.status().code() == StatusCode::kFailedPrecondition) (void)c_.SyncMembership();
      return zero.status();
    }
    // Another worker rolled back first: follow its rollback instead.
    return FollowOnce();
  }
  for (uint32_t s = 1; s < c_.num_shards_; ++s) {
    Header h = c_.NewRequest(Op::Rollback, 0);
    h.clock = at;
    PARASOL_RETURN_IF_ERROR(c_.Call(s, std::move(h), {}).status());
  }
  return Status::Ok();
}

}  // namespace parasol
