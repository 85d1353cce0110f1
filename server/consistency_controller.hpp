// ConsistencyController: one shard's view of the workers' clocks and liveness, and the read
// bound of the job's consistency mode.
//
//   bsp  a pull by a worker at clock c is answered once every live worker is at clock >= c
//        (so every push of clocks < c has been aggregated and applied)
//   ssp  ... once every live worker is at clock >= c - staleness; pushes apply on arrival
//   asp  never waits
//
// Clocks move forward by one: a Clock at or below the worker's clock is a resend (no change),
// one above it by more than one is refused. A request beyond the sender's own clock + k is
// refused (k = 1; under ssp/asp with prefetch, k = training.prefetch_depth: prefetches carry
// the clock of their step), and so is one at a clock the mode could never admit, rather than
// held: bsp beyond the slowest live worker's clock + 2, ssp beyond it + staleness + 1 + k.
// (One more than the read bound: a worker's Clock reaches the shards one by one, so a shard may
// not have seen the slowest worker's last tick yet when a faster one, admitted elsewhere, asks
// here.) A Clock is bounded the same way with k = 1. A shard's clocks are only a lower bound until each worker has said
// where it is (a Clock marked caught_up: every tick, and the last Clock of a replay after a
// restart; or done): a shard may have been restarted with or without a checkpoint while the
// workers went on. Until then only the sender's own clock bounds its requests.
//
// Ranks beyond the first cluster.workers are outside the job until they join (Join()); from
// then on they count like the others, for the clocks from their join clock on.
//
// A worker is lost when the shard has heard nothing from it for training.worker_timeout while
// it had no request held here and (under bsp/ssp) was at the slowest clock: a worker ahead of
// the slowest may be waiting on another shard, which this shard cannot see. Lost workers no
// longer count towards the bound, the barrier or the BSP average.
// Thread-safety: none; the shard's request thread owns it.
#pragma once

#include <chrono>
#include <cstdint>
#include <vector>

#include "common/manifest.hpp"
#include "common/status.hpp"

namespace parasol {

class ConsistencyController {
 public:
  using SteadyClock = std::chrono::steady_clock;

  // `workers` ranks in the job from the start, of `max_ranks` (cluster.max_workers; 0: workers).
  ConsistencyController(const TrainingOptions& options, uint32_t workers,
                        SteadyClock::time_point start, uint32_t max_ranks = 0);

  const TrainingOptions& options() const { return options_; }
  // A rank that has joined the job (from the start, or later by Join()).
  bool InJob(uint32_t worker) const { return worker < clocks_.size() && joined_at_[worker] >= 0; }
  // Rank `worker` joins the job at `clock` (common/membership.hpp): its clock starts there, it
  // counts towards the bound and the barriers from now on, and towards the BSP average of
  // the clocks from `clock` on. Nothing for a rank in the job already or out of range.
  // `unconfirmed`: a shard restarted from a checkpoint older than the join learns of it now;
  // the rank may have ticked the process before past `clock`, so its clock is only a lower
  // bound until its own tick says where it is (ClocksKnown()).
  void Join(uint32_t worker, int64_t clock, SteadyClock::time_point now, bool unconfirmed = false);
  int64_t JoinedAt(uint32_t worker) const {
    return worker < joined_at_.size() ? joined_at_[worker] : -1;
  }
  bool IsLost(uint32_t worker) const { return InJob(worker) && lost_[worker]; }
  // Whether `worker`'s clock here is still a checkpoint's, its replay not ended.
  bool Restored(uint32_t worker) const { return InJob(worker) && restored_[worker]; }
  uint32_t live_workers() const { return live_; }

  void Heard(uint32_t worker, SteadyClock::time_point now);
  // A clock restored from a checkpoint: raises `worker`'s clock to `clock` (clocks never go
  // back) and leaves it unconfirmed until the worker's next Clock.
  // REQUIRES: InJob(worker).
  void SetClock(uint32_t worker, int64_t clock);
  // A Clock request from `worker`: moves its clock to `clock` when that is the next one, and
  // with `done` marks it finished at its clock (it no longer bounds the others, and it is no
  // longer expected to push for later clocks). A clock at or below the worker's changes
  // nothing; a jump of more than one is refused.
  // REQUIRES: InJob(worker).
  // `caught_up` (the last Clock of a worker's replay after a restore) confirms the worker's
  // clock. A Clock beyond what the mode lets the slowest worker's peers reach is refused too.
  // A worker whose clock was restored from a checkpoint takes Clocks only from its replay
  // (`replay`): a tick sent before the worker saw the restart would move the restored clock on
  // before the replayed pushes of the clocks in between arrive. It resends the tick after.
  Status Advance(uint32_t worker, int64_t clock, bool done, bool caught_up = false,
                 bool replay = false);
  // Whether every live worker's clock is known (none restored and not yet caught up).
  bool ClocksKnown() const;
  // Whether a live worker still owes this shard a replay (its clock is a checkpoint's).
  bool ReplayOwed() const;
  // The same, lost workers too: whether a worker restored from a checkpoint has not replayed
  // (what it pushed to the process before may be only in its log, even once it counts as lost).
  bool ReplayUnheard() const;
  // Whether a pull or push by `worker` at `clock` could ever be admitted: OK, or an error
  // naming the bound it is beyond. Only sparse pulls (`prefetch`) may be prefetches, up to
  // training.prefetch_depth clocks past the worker's own; pushes and dense pulls at most one:
  // a push named at a later clock would mark that clock's push as done before it is made.
  // REQUIRES: InJob(worker).
  Status CheckRequestClock(uint32_t worker, int64_t clock, bool prefetch = false) const;
  bool IsDone(uint32_t worker) const { return InJob(worker) && done_at_[worker] >= 0; }
  // The clock the worker left at, or -1.
  int64_t DoneAt(uint32_t worker) const { return InJob(worker) ? done_at_[worker] : -1; }
  // A new process of `worker` said Hello while its clock was still a checkpoint's (its replay
  // had not ended): its clock is taken as it is. Returns whether a replay was still due (never
  // for a worker that had left by the checkpoint's moment).
  bool AbandonReplay(uint32_t worker);
  // The job rolled back to `clock` (protocols/message.fbs, Op.Rollback): every worker of the
  // job is at that clock, or at the clock it joins at if that is later (one that had finished
  // after it has not), heard `now`, owes no replay,
  // and is known by no process yet; none is lost.
  void RollBack(int64_t clock, SteadyClock::time_point now);
  // The same for a process restarted from that rollback's checkpoint: every worker's clock is
  // `clock` as restored (its replay is due), and no worker process is known yet.
  void RestoreAt(int64_t clock, SteadyClock::time_point now);
  // The worker's tick to `clock` was refused for now (Unavailable: a push it names has not been
  // applied here). Until it passes, its requests of later clocks are refused for now as well,
  // not as out of order: they were sent behind it.
  void NoteTickWaiting(uint32_t worker, int64_t clock);
  // Whether a request was refused since the last call because the slowest worker is behind
  // where the others had seen it (two failures overlapped and its updates are lost).
  bool TakeBehind() {
    const bool seen = behind_seen_;
    behind_seen_ = false;
    return seen;
  }
  // From a checkpoint: the worker had left at `clock`.
  void SetDone(uint32_t worker, int64_t clock);
  // The newest barrier released (ids only move forward; -1: none). In checkpoints, so that a
  // restarted shard does not hold a barrier the others passed long ago.
  int64_t last_barrier() const { return last_barrier_; }
  void set_last_barrier(int64_t id) { last_barrier_ = id; }
  // The process (incarnation) of each worker this shard last heard from (0: none). In
  // checkpoints, so that a restarted shard still tells a restarted worker from the one before.
  uint64_t incarnation(uint32_t worker) const { return InJob(worker) ? incarnations_[worker] : 0; }
  void set_incarnation(uint32_t worker, uint64_t id) {
    if (InJob(worker)) incarnations_[worker] = id;
  }
  // Workers expected to push for `clock`: live, and not done before it.
  uint32_t ActiveAt(int64_t clock) const;
  // Requests of `worker` held by the shard (+1 when held, -1 when answered).
  void AddHeld(uint32_t worker, int delta);

  // Over live workers that are not done; INT64_MAX when there are none.
  int64_t MinClock() const;
  int64_t MaxClock() const;
  const std::vector<int64_t>& clocks() const { return clocks_; }

  // Whether a pull by a worker at clock `c` may be answered now.
  bool PullAllowed(int64_t c) const;

  // A shard that starts serving the job at `clock` (at a change of the shard count it gained
  // rows or elements, holding none before, so no worker ticked it): every rank in the job is
  // at `clock` at least, confirmed and heard `now`, except those that left before it
  // (`left[w]` >= 0: the clock it left at) and those lost (`left[w]` == kLostRank), as a shard
  // that served them knows it.
  static constexpr int64_t kLostRank = -2;
  void Enter(int64_t clock, const std::vector<int64_t>& left, SteadyClock::time_point now);
  // A Clock (or, `done`, a worker leaving) taken by a shard that serves nothing yet but will
  // from `from` on, before its commit (a worker whose step `from` pulled nothing from it goes on
  // without waiting for that): noted when it lies in [from, from + the slack a Clock may have
  // past the slowest worker], and kept by Enter(); others are ignored.
  void NoteAhead(uint32_t worker, int64_t clock, bool done, int64_t from);

  // Marks and returns the workers found silent past worker_timeout at `now`.
  std::vector<uint32_t> DetectLost(SteadyClock::time_point now);
  // Seconds since `worker` was last heard from.
  double SilentSeconds(uint32_t worker, SteadyClock::time_point now) const;

 private:
  TrainingOptions options_;
  std::vector<int64_t> clocks_;
  std::vector<SteadyClock::time_point> last_heard_;
  std::vector<int> held_;
  std::vector<bool> lost_;
  std::vector<int64_t> done_at_;  // -1 while working
  int64_t last_barrier_ = -1;
  std::vector<uint64_t> incarnations_;
  std::vector<bool> unconfirmed_;  // its clock not known yet (see the class comment)
  std::vector<bool> restored_;     // its clock is a checkpoint's, and its replay has not ended
  std::vector<int64_t> joined_at_;  // -1: not in the job (yet)
  // Per worker: the clock of its tick refused for now (its pushes not all applied here), or -1.
  std::vector<int64_t> waiting_tick_;
  mutable bool behind_seen_ = false;  // TakeBehind()
  // Why a request of `worker` at `clock` (beyond its next one) waits, when its tick to the next
  // one was refused for now: the requests behind that tick are refused for now too.
  Status BehindWaitingTick(uint32_t worker, int64_t clock, const char* what) const;
  uint32_t live_;
};

}  // namespace parasol
