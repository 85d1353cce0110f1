#include "worker/replay_plan.hpp"

#include <algorithm>

namespace parasol {

namespace {

bool IsPush(Op op) { return op == Op::PushSparse || op == Op::PushDense; }

}  // namespace

ReplayPlan PlanReplay(const ReplayInputs& in) {
  ReplayPlan plan;
  // A tick still in flight at the worker's clock: the replay's clocks stop before it.
  int64_t replay_to = in.clock;
  for (const ReplayInputs::InFlight& r : in.in_flight) {
    if (r.op == Op::Clock && !r.done && r.clock == in.clock) replay_to = in.clock - 1;
  }
  // A removed shard takes Clocks only up to its change's clock.
  if (in.removed_at >= 0) replay_to = std::min(replay_to, in.removed_at);
  // A push in flight whose clock's tick was answered: the clocks stop at its clock.
  const int64_t resume_to = replay_to;
  for (const ReplayInputs::InFlight& r : in.in_flight) {
    if (IsPush(r.op) && r.clock < replay_to) replay_to = r.clock;
  }
  plan.first = std::min(std::max({int64_t{0}, in.restored_clock, in.serving_from}), replay_to);
  plan.last = resume_to;
  auto clock = [&](int64_t c, int64_t last, uint64_t named) {
    ReplayStep s;
    s.kind = ReplayStep::Kind::kClock;
    s.clock = c;
    s.done = in.left && c == in.clock;
    s.caught_up = c == last;
    s.named = named;
    if (c == last) s.last_barrier = in.last_barrier;
    plan.steps.push_back(s);
  };
  auto push = [&](size_t i) {
    ReplayStep s;
    s.kind = ReplayStep::Kind::kPush;
    s.clock = in.log_clocks[i];
    s.index = i;
    plan.steps.push_back(s);
    ++plan.pushes;
  };
  auto resend = [&](const ReplayInputs::InFlight& r) {
    ReplayStep s;
    s.kind = ReplayStep::Kind::kResend;
    s.clock = r.clock;
    s.index = r.id;
    plan.steps.push_back(s);
  };
  // A replayed tick names the logged pushes of the clock before it (up to the newest logged
  // index: those below it are logged too, or in the checkpoint), so that the shard refuses it
  // until they are applied: a replayed push lost on its way is sent again before the tick
  // passes. No push of those clocks is in flight (replay_to stops at the first that is).
  auto named_at = [&](int64_t c) -> uint64_t {
    uint64_t n = 0;
    if (in.log_indexes.size() != in.log_clocks.size()) return 0;
    for (size_t i = 0; i < in.log_clocks.size(); ++i) {
      if (in.log_clocks[i] == c) n = std::max(n, in.log_indexes[i] + 1);
    }
    return n;
  };
  size_t next = 0;
  for (int64_t c = plan.first; c <= replay_to; ++c) {
    if (in.in_job) clock(c, replay_to, c > plan.first ? named_at(c - 1) : 0);
    for (; next < in.log_clocks.size() && in.log_clocks[next] <= c; ++next) push(next);
  }
  for (; next < in.log_clocks.size(); ++next) push(next);  // none: pushes carry clocks <= clock
  // What was in flight, in the order first sent; a tick past the clocks that follow an
  // unacknowledged push (and what is behind it) after those clocks.
  std::vector<const ReplayInputs::InFlight*> after_resume;
  for (const ReplayInputs::InFlight& r : in.in_flight) {
    const bool tick_past = r.op == Op::Clock && r.clock > resume_to;
    if (resume_to > replay_to && (!after_resume.empty() || tick_past)) {
      after_resume.push_back(&r);
      continue;
    }
    resend(r);
  }
  for (int64_t c = replay_to + 1; in.in_job && c <= resume_to; ++c) {
    clock(c, resume_to, c == in.clock ? in.last_push_count : 0);
  }
  for (const ReplayInputs::InFlight* r : after_resume) resend(*r);
  return plan;
}

}  // namespace parasol
