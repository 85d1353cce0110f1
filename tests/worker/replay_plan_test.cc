// PlanReplay (worker/replay_plan.hpp): the order in which a worker replays to a restarted shard,
// checked without a socket. Fixed cases, then the plan's rules over many drawn ones (seeded,
// printed): every logged push once, in the log's order; everything in flight resent once, in
// the order first sent; the Clocks one by one up to the worker's, the last caught up; and no
// Clock to clock k before every push of an earlier clock, logged or in flight.
#include "worker/replay_plan.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <random>
#include <set>
#include <string>
#include <vector>

namespace parasol {
namespace {

using Kind = ReplayStep::Kind;

// "C3" a Clock (with "*" when caught up, "+n" naming n pushes), "P1" the log's entry 1, "R7" the
// resend of request 7.
std::string Text(const ReplayPlan& plan) {
  std::string s;
  for (const ReplayStep& step : plan.steps) {
    if (!s.empty()) s += ' ';
    switch (step.kind) {
      case Kind::kClock:
        s += 'C';
        s += std::to_string(step.clock);
        if (step.caught_up) s += '*';
        if (step.named) {
          s += '+';
          s += std::to_string(step.named);
        }
        break;
      case Kind::kPush:
        s += 'P';
        s += std::to_string(step.index);
        break;
      case Kind::kResend:
        s += 'R';
        s += std::to_string(step.index);
        break;
    }
  }
  return s;
}

ReplayInputs::InFlight Push(uint64_t id, int64_t clock) { return {id, Op::PushSparse, clock, false}; }
ReplayInputs::InFlight Tick(uint64_t id, int64_t clock) { return {id, Op::Clock, clock, false}; }

TEST(ReplayPlanTest, EachClockFromTheCheckpointsThenItsLoggedPushes) {
  ReplayInputs in;
  in.clock = 5;
  in.restored_clock = 2;
  in.last_barrier = 1;
  in.log_clocks = {2, 2, 3, 4};
  const ReplayPlan plan = PlanReplay(in);
  EXPECT_EQ(Text(plan), "C2 P0 P1 C3 P2 C4 P3 C5*");
  EXPECT_EQ(plan.first, 2);
  EXPECT_EQ(plan.last, 5);
  EXPECT_EQ(plan.pushes, 4u);
  EXPECT_EQ(plan.steps.back().last_barrier, 1);
  EXPECT_EQ(plan.steps.front().last_barrier, -1);
}

// With the logged pushes' indexes known, each replayed tick names the pushes of the clock
// before it up to the newest logged index (those below it were logged or checkpointed), so
// that a shard refuses the tick until they are applied: a replayed push lost on its way
// (found by the simulation, seed 971 of `parasol_sim` with overlapping faults) no longer lets
// the tick apply its clock without it.
TEST(ReplayPlanTest, ReplayedTicksNameTheLoggedPushesOfTheClockBefore) {
  ReplayInputs in;
  in.clock = 5;
  in.restored_clock = 2;
  in.log_clocks = {2, 2, 3, 4};
  in.log_indexes = {1, 2, 0, 3};  // clock 2's push 0 is in the checkpoint
  EXPECT_EQ(Text(PlanReplay(in)), "C2 P0 P1 C3+3 P2 C4+1 P3 C5*+4");
  in.log_indexes.clear();  // unknown: no tick names a push
  EXPECT_EQ(Text(PlanReplay(in)), "C2 P0 P1 C3 P2 C4 P3 C5*");
}

TEST(ReplayPlanTest, ATickInFlightBehindItsPushesIsResentWithThemAfterTheClocksBeforeIt) {
  // Worker at 5 sent step 4's pushes (ids 10, 11) and the tick to 5 (id 12) right behind them;
  // none was answered.
  ReplayInputs in;
  in.clock = 5;
  in.restored_clock = 3;
  in.log_clocks = {3};
  in.in_flight = {Push(10, 4), Push(11, 4), Tick(12, 5)};
  EXPECT_EQ(Text(PlanReplay(in)), "C3 P0 C4* R10 R11 R12");
}

TEST(ReplayPlanTest, APushInFlightFromAClockAlreadyTickedStopsTheClocksThere) {
  // Worker at 5: of the 3 pushes of clock 4 it sent with its tick to 5, one (id 20) lost its
  // reply with a connection while the tick's came. The clocks stop at 4, the push is resent,
  // then the Clock to 5 follows naming the 3 pushes of clock 4.
  ReplayInputs in;
  in.clock = 5;
  in.restored_clock = 2;
  in.last_push_count = 3;
  in.log_clocks = {2, 3, 4, 4};
  in.in_flight = {Push(20, 4)};
  EXPECT_EQ(Text(PlanReplay(in)), "C2 P0 C3 P1 C4* P2 P3 R20 C5*+3");
}

TEST(ReplayPlanTest, ARemovedShardTakesClocksOnlyToItsChangeAndAnObserverSendsNone) {
  ReplayInputs in;
  in.clock = 9;
  in.restored_clock = 4;
  in.removed_at = 6;
  in.log_clocks = {4, 5};
  EXPECT_EQ(Text(PlanReplay(in)), "C4 P0 C5 P1 C6*");
  in.in_job = false;
  in.removed_at = -1;
  EXPECT_EQ(Text(PlanReplay(in)), "P0 P1");
}

TEST(ReplayPlanTest, AShardThatJoinedLaterIsReplayedFromTheClockItServesFromAndALeaverSaysDone) {
  ReplayInputs in;
  in.clock = 7;
  in.restored_clock = 0;
  in.serving_from = 5;
  in.left = true;
  in.log_clocks = {5, 6, 7};
  const ReplayPlan plan = PlanReplay(in);
  EXPECT_EQ(Text(plan), "C5 P0 C6 P1 C7* P2");
  EXPECT_TRUE(plan.steps[4].done);   // C7: the worker leaves at its clock
  EXPECT_FALSE(plan.steps[2].done);
}

// The rules, over drawn inputs like those a worker has when a shard restarts.
TEST(ReplayPlanTest, DrawnCasesKeepEveryRule) {
  const uint64_t seed = 20261201;
  std::printf("[ seed     ] %llu\n", static_cast<unsigned long long>(seed));
  std::mt19937_64 rng(seed);
  int with_tick = 0, with_late_push = 0;
  for (int round = 0; round < 5000; ++round) {
    SCOPED_TRACE("round " + std::to_string(round));
    // What a worker can have when a shard restarts (its trainer sends a step's pushes, then
    // its tick, and waits for both before the next step): at clock c,
    //   - between steps, or with the step's pushes (clock c) in flight, some acknowledged;
    //   - with the pushes of clock c - 1 and the tick to c in flight;
    //   - with the tick to c answered and a push of c - 1 whose reply was lost.
    ReplayInputs in;
    in.clock = 1 + static_cast<int64_t>(rng() % 11);
    in.restored_clock = static_cast<int64_t>(rng() % (in.clock + 1));
    in.serving_from = rng() % 4 == 0 ? static_cast<int64_t>(rng() % (in.restored_clock + 1)) : 0;
    in.last_barrier = static_cast<int64_t>(rng() % 3) - 1;
    in.last_push_count = 1 + rng() % 3;
    in.left = rng() % 4 == 0;
    const int state = static_cast<int>(rng() % 3);
    const int64_t logged_to = state == 0 ? in.clock : in.clock - 1;
    for (int64_t c = in.restored_clock; c <= logged_to; ++c) {
      for (uint64_t k = rng() % 3; k > 0; --k) in.log_clocks.push_back(c);
    }
    uint64_t id = 100;
    const bool tick = state == 1;
    if (state == 0) {
      for (uint64_t k = rng() % 3; k > 0; --k) in.in_flight.push_back(Push(id++, in.clock));
    } else if (state == 1) {
      for (uint64_t k = rng() % 3; k > 0; --k) in.in_flight.push_back(Push(id++, in.clock - 1));
      in.in_flight.push_back(Tick(id++, in.clock));
      ++with_tick;
    } else if (in.clock - 1 >= in.restored_clock) {
      in.in_flight.push_back(Push(id++, in.clock - 1));
      ++with_late_push;
    }
    const ReplayPlan plan = PlanReplay(in);
    // Every logged push once, in the log's order; every request in flight once, in its order.
    std::vector<uint64_t> pushes, resends;
    std::vector<int64_t> clocks;
    for (const ReplayStep& s : plan.steps) {
      if (s.kind == Kind::kPush) pushes.push_back(s.index);
      if (s.kind == Kind::kResend) resends.push_back(s.index);
      if (s.kind == Kind::kClock) clocks.push_back(s.clock);
    }
    ASSERT_EQ(pushes.size(), in.log_clocks.size()) << Text(plan);
    for (size_t i = 0; i < pushes.size(); ++i) ASSERT_EQ(pushes[i], i) << Text(plan);
    ASSERT_EQ(resends.size(), in.in_flight.size()) << Text(plan);
    for (size_t i = 0; i < resends.size(); ++i) {
      ASSERT_EQ(resends[i], in.in_flight[i].id) << Text(plan);
    }
    // The Clocks one by one from the checkpoint's to the worker's (or the one before its tick
    // in flight), the last caught up.
    ASSERT_FALSE(clocks.empty()) << Text(plan);
    EXPECT_EQ(clocks.front(), std::min(std::max(in.restored_clock, in.serving_from), plan.last));
    for (size_t i = 1; i < clocks.size(); ++i) ASSERT_EQ(clocks[i], clocks[i - 1] + 1) << Text(plan);
    EXPECT_EQ(clocks.back(), tick ? in.clock - 1 : in.clock) << Text(plan);
    EXPECT_TRUE(plan.steps[0].kind == Kind::kClock) << Text(plan);
    // No tick to k (a Clock of the replay, or a tick resent) before every push of a clock
    // before k, logged or in flight.
    auto in_flight = [&](uint64_t request) -> const ReplayInputs::InFlight& {
      return *std::find_if(in.in_flight.begin(), in.in_flight.end(),
                           [&](const ReplayInputs::InFlight& r) { return r.id == request; });
    };
    auto tick_to = [&](const ReplayStep& step) -> int64_t {  // -1: no tick
      if (step.kind == Kind::kClock) return step.clock;
      if (step.kind == Kind::kResend && in_flight(step.index).op == Op::Clock) {
        return in_flight(step.index).clock;
      }
      return -1;
    };
    auto push_of = [&](const ReplayStep& step) -> int64_t {  // INT64_MAX: no push
      if (step.kind == Kind::kPush) return in.log_clocks[step.index];
      if (step.kind == Kind::kResend && in_flight(step.index).op != Op::Clock) {
        return in_flight(step.index).clock;
      }
      return INT64_MAX;
    };
    for (size_t at = 0; at < plan.steps.size(); ++at) {
      const int64_t k = tick_to(plan.steps[at]);
      if (k < 0) continue;
      for (size_t later = at + 1; later < plan.steps.size(); ++later) {
        ASSERT_GE(push_of(plan.steps[later]), k)
            << "a push after the tick to " << k << ": " << Text(plan);
      }
    }
    // A logged push comes after the Clock to its clock: the shard takes it at the clock it
    // belongs to. A Clock that names pushes is the tick to the worker's clock, naming the
    // pushes of the clock before.
    int64_t ticked = -1;
    for (const ReplayStep& step : plan.steps) {
      if (step.kind == Kind::kClock) ticked = std::max(ticked, step.clock);
      if (step.kind == Kind::kPush) {
        ASSERT_GE(ticked, in.log_clocks[step.index])
            << "a logged push before the Clock to its clock: " << Text(plan);
      }
      if (step.kind == Kind::kClock && step.named > 0) {
        EXPECT_EQ(step.clock, in.clock) << Text(plan);
        EXPECT_EQ(step.named, in.last_push_count) << Text(plan);
      }
    }
    // The last Clock says the worker caught up; at most the end of each run does.
    const auto last_clock = std::find_if(plan.steps.rbegin(), plan.steps.rend(),
                                         [](const ReplayStep& s) { return s.kind == Kind::kClock; });
    EXPECT_TRUE(last_clock->caught_up) << Text(plan);
    EXPECT_EQ(last_clock->last_barrier, in.last_barrier);
    EXPECT_LE(std::count_if(plan.steps.begin(), plan.steps.end(),
                            [](const ReplayStep& s) { return s.caught_up; }),
              2)
        << Text(plan);
  }
  // The draws reached the cases that stop the clocks early.
  EXPECT_GT(with_tick, 1000);
  EXPECT_GT(with_late_push, 1000);
}

}  // namespace
}  // namespace parasol
