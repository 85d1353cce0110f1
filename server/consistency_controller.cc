#include "server/consistency_controller.hpp"

#include <algorithm>
#include <limits>
#include <string>

namespace parasol {
namespace {
// Why a worker's clock can be that far ahead of the slowest one in a real job.
constexpr const char* kBehindNote =
    " (the slowest worker restarted behind where it had been: when it died together with a "
    "shard, the updates it had made since that shard's checkpoint are lost, as two failures "
    "overlapped)";
}  // namespace


ConsistencyController::ConsistencyController(const TrainingOptions& options, uint32_t workers,
                                             SteadyClock::time_point start, uint32_t max_ranks)
    : options_(options),
      clocks_(std::max(workers, max_ranks), 0),
      last_heard_(clocks_.size(), start),
      held_(clocks_.size(), 0),
      lost_(clocks_.size(), false),
      done_at_(clocks_.size(), -1),
      incarnations_(clocks_.size(), 0),
      unconfirmed_(clocks_.size(), true),
      restored_(clocks_.size(), false),
      joined_at_(clocks_.size(), -1),
      waiting_tick_(clocks_.size(), -1),
      live_(workers) {
  for (uint32_t w = 0; w < workers; ++w) joined_at_[w] = 0;
}

void ConsistencyController::Join(uint32_t worker, int64_t clock, SteadyClock::time_point now,
                                 bool unconfirmed) {
  if (worker >= clocks_.size() || joined_at_[worker] >= 0) return;
  joined_at_[worker] = clock;
  clocks_[worker] = std::max(clocks_[worker], clock);
  unconfirmed_[worker] = unconfirmed;
  restored_[worker] = false;
  last_heard_[worker] = now;
  ++live_;
}

namespace {

// How far ahead of its own clock a worker may ask: the next clock (the pulls that travel with
// its tick), or as many as its prefetches reach.
int64_t AheadOf(const TrainingOptions& o) {
  return o.prefetch && o.consistency != TrainingOptions::Consistency::kBsp
             ? std::max<int64_t>(1, o.prefetch_depth)
             : 1;
}

// How far past the slowest live worker a Clock may move, or (`request`) a request's clock may
// be: one more than the read bound (see the header), and for requests as many more as a
// prefetch reaches past the next clock.
int64_t SlackOf(const TrainingOptions& o, bool request) {
  if (o.consistency == TrainingOptions::Consistency::kBsp) return 2;
  return static_cast<int64_t>(o.staleness) + 1 + (request ? AheadOf(o) : 1);
}

}  // namespace

bool ConsistencyController::ClocksKnown() const {
  for (size_t w = 0; w < clocks_.size(); ++w) {
    if (joined_at_[w] < 0) continue;
    if (unconfirmed_[w] && !lost_[w] && done_at_[w] < 0) return false;
  }
  return true;
}

bool ConsistencyController::ReplayUnheard() const {
  for (size_t w = 0; w < clocks_.size(); ++w) {
    if (joined_at_[w] >= 0 && restored_[w] && done_at_[w] < 0) return true;
  }
  return false;
}

bool ConsistencyController::ReplayOwed() const {
  for (size_t w = 0; w < clocks_.size(); ++w) {
    if (joined_at_[w] < 0) continue;
    if (restored_[w] && !lost_[w] && done_at_[w] < 0) return true;
  }
  return false;
}

Status ConsistencyController::Advance(uint32_t worker, int64_t clock, bool done,
                                      bool caught_up, bool replay) {
  const int64_t current = clocks_[worker];
  if (restored_[worker] && !replay) {
    PARASOL_RETURN_IF_ERROR(BehindWaitingTick(worker, clock, "Clock"));
    // Asked again after the replay (one cut off on its way is resent before this tick).
    return Unavailable("Clock: worker " + std::to_string(worker) + "'s clock was " +
                       "restored from a checkpoint (" + std::to_string(current) +
                       "); it is taken from the worker's replay first");
  }
  if (clock > current && clock - current > 1) {
    PARASOL_RETURN_IF_ERROR(BehindWaitingTick(worker, clock, "Clock"));
    return FailedPrecondition(
        "Clock: worker " + std::to_string(worker) + " jumps from " +
        (unconfirmed_[worker] ? "its restored clock " : "clock ") + std::to_string(current) +
        " to " + std::to_string(clock) + "; a worker's clock moves forward by one per Clock" +
        (unconfirmed_[worker] ? " (after a restart it replays its clocks in order)" : ""));
  }
  // A rank that joined recently starts where shard 0 named it, which may be ahead of the
  // slowest worker by more than the slack: its first clocks wait like anyone's reads.
  const bool joining = joined_at_[worker] > 0 && clock <= joined_at_[worker] + 1 + AheadOf(options_);
  if (clock > current && options_.consistency != TrainingOptions::Consistency::kAsp &&
      ClocksKnown() && !joining) {
    const int64_t slowest = MinClock();
    if (slowest != std::numeric_limits<int64_t>::max() &&
        clock - slowest > SlackOf(options_, /*request=*/false)) {
      behind_seen_ = true;
      return FailedPrecondition("Clock: worker " + std::to_string(worker) + " moves to clock " +
                                std::to_string(clock) + ", which the job could never reach " +
                                "while the slowest worker is at " + std::to_string(slowest) +
                                kBehindNote);
    }
  }
  if (caught_up || done) {
    unconfirmed_[worker] = false;
    restored_[worker] = false;
  }
  clocks_[worker] = std::max(current, clock);
  if (clocks_[worker] >= waiting_tick_[worker]) waiting_tick_[worker] = -1;
  if (done && done_at_[worker] < 0) done_at_[worker] = clocks_[worker];
  return Status::Ok();
}

void ConsistencyController::RestoreAt(int64_t clock, SteadyClock::time_point now) {
  RollBack(clock, now);
  for (size_t w = 0; w < clocks_.size(); ++w) {
    if (joined_at_[w] < 0 || done_at_[w] >= 0) continue;
    restored_[w] = true;
    unconfirmed_[w] = true;
  }
}

void ConsistencyController::NoteTickWaiting(uint32_t worker, int64_t clock) {
  if (InJob(worker) && clock == clocks_[worker] + 1) waiting_tick_[worker] = clock;
}

Status ConsistencyController::BehindWaitingTick(uint32_t worker, int64_t clock,
                                                const char* what) const {
  if (waiting_tick_[worker] < 0 || waiting_tick_[worker] != clocks_[worker] + 1) {
    return Status::Ok();
  }
  return Unavailable(std::string(what) + ": worker " + std::to_string(worker) + " at clock " +
                     std::to_string(clock) + " comes behind its tick to clock " +
                     std::to_string(waiting_tick_[worker]) + ", which waits for its pushes here");
}

Status ConsistencyController::CheckRequestClock(uint32_t worker, int64_t clock,
                                                bool prefetch) const {
  const int64_t own = clocks_[worker];
  const int64_t ahead = prefetch ? AheadOf(options_) : 1;
  if (clock > own && clock - own > ahead) {
    PARASOL_RETURN_IF_ERROR(BehindWaitingTick(worker, clock, "request"));
    // A restored clock is only a lower bound until the worker's replay has come: what it asks
    // beyond is asked again after the replay (one cut off on its way is resent).
    if (restored_[worker]) {
      return Unavailable("worker " + std::to_string(worker) + " asks at clock " +
                         std::to_string(clock) + ", beyond its clock " + std::to_string(own) +
                         " + " + std::to_string(ahead) + " as this shard came back with it; "
                         "its clock is taken from its replay first");
    }
    return FailedPrecondition(
        "worker " + std::to_string(worker) + " asks at clock " + std::to_string(clock) +
        (ahead == 1 ? ", beyond its own next clock " + std::to_string(own + 1)
                    : ", beyond its own clock " + std::to_string(own) + " + " +
                          std::to_string(ahead) + " (training.prefetch_depth)"));
  }
  if (options_.consistency == TrainingOptions::Consistency::kAsp) return Status::Ok();
  if (!ClocksKnown()) return Status::Ok();  // restored clocks are only a lower bound
  // A joining rank's first requests are at the clock shard 0 named (see Advance).
  if (joined_at_[worker] > 0 && clock <= joined_at_[worker] + 1 + AheadOf(options_)) {
    return Status::Ok();
  }
  const int64_t slowest = MinClock();
  if (slowest == std::numeric_limits<int64_t>::max()) return Status::Ok();
  const int64_t slack = SlackOf(options_, /*request=*/true) - (AheadOf(options_) - ahead);
  if (clock > slowest && clock - slowest > slack) {
    behind_seen_ = true;
    return FailedPrecondition(
        "worker " + std::to_string(worker) + " asks at clock " + std::to_string(clock) +
        ", which the job could never admit: the slowest worker is at " + std::to_string(slowest) +
        " and " + (options_.consistency == TrainingOptions::Consistency::kBsp ? "bsp" : "ssp") +
        " admits at most " + std::to_string(slack) + " clocks ahead" + kBehindNote);
  }
  return Status::Ok();
}

uint32_t ConsistencyController::ActiveAt(int64_t clock) const {
  uint32_t n = 0;
  for (size_t w = 0; w < clocks_.size(); ++w) {
    if (joined_at_[w] < 0 || joined_at_[w] > clock) continue;
    if (!lost_[w] && (done_at_[w] < 0 || done_at_[w] > clock)) ++n;
  }
  return n;
}

void ConsistencyController::Heard(uint32_t worker, SteadyClock::time_point now) {
  if (InJob(worker)) last_heard_[worker] = now;
}

void ConsistencyController::SetClock(uint32_t worker, int64_t clock) {
  if (!InJob(worker)) return;
  clocks_[worker] = std::max(clocks_[worker], clock);
  unconfirmed_[worker] = true;
  restored_[worker] = true;
}

bool ConsistencyController::AbandonReplay(uint32_t worker) {
  if (!InJob(worker) || !restored_[worker]) return false;
  restored_[worker] = false;
  unconfirmed_[worker] = false;
  // A worker that had left when the checkpoint was taken pushed nothing after it: the
  // checkpoint holds all it pushed, so nothing was owed (parasol_sim --seed 2282 --reshard:
  // a shard restored the checkpoint of "every worker has finished", a finished worker
  // restarted, and the job rolled back for nothing, to a clock its other worker had left).
  return done_at_[worker] < 0;
}

void ConsistencyController::RollBack(int64_t clock, SteadyClock::time_point now) {
  live_ = 0;
  for (size_t w = 0; w < clocks_.size(); ++w) {
    if (joined_at_[w] < 0) continue;
    if (done_at_[w] > clock) done_at_[w] = -1;
    // A rank that joins later than `clock` starts where it was named, as before.
    if (done_at_[w] < 0) clocks_[w] = std::max(clock, joined_at_[w]);
    last_heard_[w] = now;
    held_[w] = 0;
    lost_[w] = false;
    incarnations_[w] = 0;
    restored_[w] = false;
    unconfirmed_[w] = false;
    waiting_tick_[w] = -1;
    ++live_;
  }
}

void ConsistencyController::SetDone(uint32_t worker, int64_t clock) {
  if (!InJob(worker) || done_at_[worker] >= 0) return;
  done_at_[worker] = clock;
}

void ConsistencyController::AddHeld(uint32_t worker, int delta) {
  if (InJob(worker)) held_[worker] += delta;
}

int64_t ConsistencyController::MinClock() const {
  int64_t m = std::numeric_limits<int64_t>::max();
  for (size_t w = 0; w < clocks_.size(); ++w) {
    if (joined_at_[w] >= 0 && !lost_[w] && done_at_[w] < 0) m = std::min(m, clocks_[w]);
  }
  return m;
}

int64_t ConsistencyController::MaxClock() const {
  int64_t m = 0;
  for (size_t w = 0; w < clocks_.size(); ++w) {
    if (joined_at_[w] >= 0 && !lost_[w]) m = std::max(m, clocks_[w]);
  }
  return m;
}

bool ConsistencyController::PullAllowed(int64_t c) const {
  switch (options_.consistency) {
    case TrainingOptions::Consistency::kAsp:
      return true;
    case TrainingOptions::Consistency::kBsp:
      return MinClock() >= c;
    case TrainingOptions::Consistency::kSsp: {
      // c - staleness without wrapping: a bound below INT64_MIN admits every clock.
      const int64_t staleness = static_cast<int64_t>(options_.staleness);
      return c < std::numeric_limits<int64_t>::min() + staleness || MinClock() >= c - staleness;
    }
  }
  return true;
}

void ConsistencyController::Enter(int64_t clock, const std::vector<int64_t>& left,
                                  SteadyClock::time_point now) {
  live_ = 0;
  for (uint32_t w = 0; w < clocks_.size(); ++w) {
    if (joined_at_[w] < 0) continue;
    const int64_t l = w < left.size() ? left[w] : -1;
    lost_[w] = l == kLostRank;
    if (l >= 0 && done_at_[w] < 0) done_at_[w] = l;
    clocks_[w] = done_at_[w] >= 0 ? std::max(clocks_[w], done_at_[w]) : std::max(clocks_[w], clock);
    unconfirmed_[w] = false;
    restored_[w] = false;
    last_heard_[w] = now;
    if (!lost_[w]) ++live_;
  }
}

void ConsistencyController::NoteAhead(uint32_t worker, int64_t clock, bool done, int64_t from) {
  if (!InJob(worker) || done_at_[worker] >= 0 || clock < from ||
      clock - from > SlackOf(options_, /*request=*/false)) {
    return;
  }
  clocks_[worker] = std::max(clocks_[worker], clock);
  if (done) done_at_[worker] = clocks_[worker];
}

std::vector<uint32_t> ConsistencyController::DetectLost(SteadyClock::time_point now) {
  std::vector<uint32_t> lost;
  const auto timeout = std::chrono::milliseconds(options_.worker_timeout_ms);
  const int64_t min_clock = MinClock();
  const bool bounded = options_.consistency != TrainingOptions::Consistency::kAsp;
  for (uint32_t w = 0; w < clocks_.size(); ++w) {
    if (joined_at_[w] < 0 || lost_[w] || held_[w] > 0 || done_at_[w] >= 0) continue;
    // Under a bound, a worker ahead of the slowest may be waiting on another shard; only a
    // worker at the slowest clock can be the one holding the job up.
    if (bounded && clocks_[w] > min_clock) continue;
    if (now - last_heard_[w] > timeout) {
      lost_[w] = true;
      --live_;
      lost.push_back(w);
    }
  }
  return lost;
}

double ConsistencyController::SilentSeconds(uint32_t worker, SteadyClock::time_point now) const {
  if (!InJob(worker)) return 0;
  return std::chrono::duration<double>(now - last_heard_[worker]).count();
}

}  // namespace parasol
