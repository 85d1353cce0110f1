#include "server/consistency_controller.hpp"

#include <algorithm>
#include <limits>

namespace parasol {

ConsistencyController::ConsistencyController(const TrainingOptions& options, uint32_t workers,
                                             SteadyClock::time_point start)
    : options_(options),
      clocks_(workers, 0),
      last_heard_(workers, start),
      held_(workers, 0),
      lost_(workers, false),
      done_at_(workers, -1),
      live_(workers) {}

void ConsistencyController::SetDone(uint32_t worker, int64_t clock) {
  if (!InJob(worker) || done_at_[worker] >= 0) return;
  done_at_[worker] = clock;
  SetClock(worker, clock);
}

uint32_t ConsistencyController::ActiveAt(int64_t clock) const {
  uint32_t n = 0;
  for (size_t w = 0; w < clocks_.size(); ++w) {
    if (!lost_[w] && (done_at_[w] < 0 || done_at_[w] > clock)) ++n;
  }
  return n;
}

void ConsistencyController::Heard(uint32_t worker, SteadyClock::time_point now) {
  if (InJob(worker)) last_heard_[worker] = now;
}

void ConsistencyController::SetClock(uint32_t worker, int64_t clock) {
  if (InJob(worker)) clocks_[worker] = std::max(clocks_[worker], clock);
}

void ConsistencyController::AddHeld(uint32_t worker, int delta) {
  if (InJob(worker)) held_[worker] += delta;
}

int64_t ConsistencyController::MinClock() const {
  int64_t m = std::numeric_limits<int64_t>::max();
  for (size_t w = 0; w < clocks_.size(); ++w) {
    if (!lost_[w] && done_at_[w] < 0) m = std::min(m, clocks_[w]);
  }
  return m;
}

int64_t ConsistencyController::MaxClock() const {
  int64_t m = 0;
  for (size_t w = 0; w < clocks_.size(); ++w) {
    if (!lost_[w]) m = std::max(m, clocks_[w]);
  }
  return m;
}

bool ConsistencyController::PullAllowed(int64_t c) const {
  switch (options_.consistency) {
    case TrainingOptions::Consistency::kAsp:
      return true;
    case TrainingOptions::Consistency::kBsp:
      return MinClock() >= c;
    case TrainingOptions::Consistency::kSsp:
      return MinClock() >= c - static_cast<int64_t>(options_.staleness);
  }
  return true;
}

std::vector<uint32_t> ConsistencyController::DetectLost(SteadyClock::time_point now) {
  std::vector<uint32_t> lost;
  const auto timeout = std::chrono::milliseconds(options_.worker_timeout_ms);
  const int64_t min_clock = MinClock();
  const bool bounded = options_.consistency != TrainingOptions::Consistency::kAsp;
  for (uint32_t w = 0; w < clocks_.size(); ++w) {
    if (lost_[w] || held_[w] > 0 || done_at_[w] >= 0) continue;
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
