#include "server/consistency_controller.hpp"

#include <gtest/gtest.h>

namespace parasol {
namespace {

ConsistencyController Controller(TrainingOptions::Consistency mode, uint32_t staleness = 0) {
  TrainingOptions t;
  t.consistency = mode;
  t.staleness = staleness;
  ConsistencyController c(t, 2, std::chrono::steady_clock::now());
  for (uint32_t w = 0; w < 2; ++w) EXPECT_TRUE(c.Advance(w, 0, false, /*caught_up=*/true).ok());
  return c;
}

TEST(ConsistencyControllerTest, AFreshShardKnowsNoClockUntilEachWorkerSaysWhereItIs) {
  // It may have been restarted without a checkpoint while the workers went on.
  TrainingOptions t;
  ConsistencyController c(t, 2, std::chrono::steady_clock::now());
  EXPECT_FALSE(c.ClocksKnown());
  for (int64_t k = 0; k <= 5; ++k) ASSERT_TRUE(c.Advance(0, k, false, k == 5).ok());  // a replay
  EXPECT_TRUE(c.CheckRequestClock(0, 6).ok());
  ASSERT_TRUE(c.Advance(1, 1, false, true).ok());  // a tick
  EXPECT_TRUE(c.ClocksKnown());
  EXPECT_FALSE(c.CheckRequestClock(0, 6).ok());
  EXPECT_FALSE(c.Advance(0, 6, false, true).ok());
}

TEST(ConsistencyControllerTest, ClocksMoveForwardByOne) {
  ConsistencyController c = Controller(TrainingOptions::Consistency::kBsp);
  EXPECT_FALSE(c.Advance(0, 2, false).ok());
  EXPECT_FALSE(c.Advance(0, int64_t{1} << 62, false).ok());
  EXPECT_EQ(c.clocks()[0], 0);
  EXPECT_TRUE(c.Advance(0, 1, false).ok());
  EXPECT_TRUE(c.Advance(0, 1, false).ok());   // a resend
  EXPECT_TRUE(c.Advance(0, -5, false).ok());  // behind: changes nothing
  EXPECT_EQ(c.clocks()[0], 1);
  EXPECT_FALSE(c.Advance(0, 3, true).ok());   // done may not jump either
  EXPECT_TRUE(c.Advance(0, 1, true).ok());
  EXPECT_TRUE(c.IsDone(0));
}

TEST(ConsistencyControllerTest, BspRefusesRequestsAndClocksTwoAheadOfTheSlowest) {
  ConsistencyController c = Controller(TrainingOptions::Consistency::kBsp);
  ASSERT_TRUE(c.Advance(0, 1, false).ok());
  ASSERT_TRUE(c.Advance(0, 2, false).ok());  // worker 1's tick to 1 may not have arrived yet
  Status st = c.Advance(0, 3, false);         // but no worker can be three ahead
  EXPECT_FALSE(st.ok());
  EXPECT_NE(st.message().find("could never reach"), std::string::npos) << st.ToString();
  EXPECT_EQ(c.clocks()[0], 2);
  EXPECT_TRUE(c.CheckRequestClock(0, 2).ok());
  st = c.CheckRequestClock(0, 3);  // its own next clock, but three ahead of worker 1
  EXPECT_FALSE(st.ok());
  EXPECT_NE(st.message().find("could never admit"), std::string::npos) << st.ToString();
  EXPECT_FALSE(c.CheckRequestClock(1, 2).ok());  // beyond worker 1's own next clock
  EXPECT_TRUE(c.CheckRequestClock(1, 1).ok());
}

TEST(ConsistencyControllerTest, SspAdmitsUpToStalenessPlusTwoAhead) {
  ConsistencyController c = Controller(TrainingOptions::Consistency::kSsp, 2);
  for (int64_t k = 1; k <= 4; ++k) ASSERT_TRUE(c.Advance(0, k, false).ok());
  EXPECT_FALSE(c.Advance(0, 5, false).ok());
  EXPECT_TRUE(c.CheckRequestClock(0, 4).ok());
  EXPECT_FALSE(c.CheckRequestClock(0, 5).ok());
  ASSERT_TRUE(c.Advance(1, 1, false).ok());  // the slowest moves: so may the fastest
  EXPECT_TRUE(c.Advance(0, 5, false).ok());
}

// training.prefetch_depth k: a worker may ask up to k clocks past its own, and the job admits
// up to staleness + 1 + k past the slowest.
TEST(ConsistencyControllerTest, PrefetchDepthWidensTheOwnAndTheJobBound) {
  TrainingOptions t;
  t.consistency = TrainingOptions::Consistency::kSsp;
  t.staleness = 3;
  t.prefetch_depth = 3;
  ConsistencyController c(t, 2, std::chrono::steady_clock::now());
  for (uint32_t w = 0; w < 2; ++w) ASSERT_TRUE(c.Advance(w, 0, false, true).ok());
  EXPECT_TRUE(c.CheckRequestClock(0, 3, /*prefetch=*/true).ok());
  const Status own = c.CheckRequestClock(0, 4, /*prefetch=*/true);
  EXPECT_FALSE(own.ok());
  EXPECT_NE(own.ToString().find("training.prefetch_depth"), std::string::npos) << own.ToString();
  // A push or dense pull is no prefetch: one past its own clock at most (a push named at a
  // later clock would mark that clock's push as made).
  EXPECT_TRUE(c.CheckRequestClock(0, 1).ok());
  const Status push = c.CheckRequestClock(0, 2);
  EXPECT_FALSE(push.ok());
  EXPECT_NE(push.ToString().find("beyond its own next clock 1"), std::string::npos)
      << push.ToString();
  // Clocks (ticks) keep their bound: staleness + 2 past the slowest.
  for (int64_t k = 1; k <= 5; ++k) ASSERT_TRUE(c.Advance(0, k, false).ok());
  EXPECT_FALSE(c.Advance(0, 6, false).ok());
  // Requests: own 5 + 3 = 8 would pass the own bound; the job's is slowest 0 + 3 + 1 + 3 = 7.
  EXPECT_TRUE(c.CheckRequestClock(0, 7, /*prefetch=*/true).ok());
  const Status job = c.CheckRequestClock(0, 8, /*prefetch=*/true);
  EXPECT_FALSE(job.ok());
  EXPECT_NE(job.ToString().find("could never admit"), std::string::npos) << job.ToString();
  // Without prefetch the depth does not count.
  t.prefetch = false;
  ConsistencyController d(t, 2, std::chrono::steady_clock::now());
  for (uint32_t w = 0; w < 2; ++w) ASSERT_TRUE(d.Advance(w, 0, false, true).ok());
  EXPECT_FALSE(d.CheckRequestClock(0, 2, /*prefetch=*/true).ok());
}

TEST(ConsistencyControllerTest, AspBoundsOnlyByTheSendersOwnClock) {
  ConsistencyController c = Controller(TrainingOptions::Consistency::kAsp);
  for (int64_t k = 1; k <= 50; ++k) ASSERT_TRUE(c.Advance(0, k, false).ok());
  EXPECT_TRUE(c.CheckRequestClock(0, 51).ok());
  EXPECT_FALSE(c.CheckRequestClock(0, 52).ok());
}

TEST(ConsistencyControllerTest, RestoredClocksAreALowerBoundUntilTheReplayCatchesUp) {
  ConsistencyController c = Controller(TrainingOptions::Consistency::kBsp);
  c.SetClock(0, 7);
  c.SetClock(1, 7);
  EXPECT_FALSE(c.ClocksKnown());  // restored: a lower bound again
  // Only the sender's own clock bounds it until the workers have caught up. Beyond it, the
  // request is refused for now, not failed: a replay cut off on its way (a connection cut) is
  // resent, and what came ahead of it is asked again after it.
  Status ahead = c.CheckRequestClock(0, 9);
  EXPECT_EQ(ahead.code(), StatusCode::kUnavailable) << ahead.ToString();
  EXPECT_NE(ahead.message().find("taken from its replay first"), std::string::npos);
  // A tick sent before the worker saw the restart (or ahead of its replay) is refused for now
  // as well (it resends it after its replay).
  Status st = c.Advance(0, 8, false, /*caught_up=*/true);
  EXPECT_EQ(st.code(), StatusCode::kUnavailable) << st.ToString();
  EXPECT_NE(st.message().find("restored from a checkpoint"), std::string::npos) << st.ToString();
  EXPECT_EQ(c.clocks()[0], 7);
  EXPECT_FALSE(c.Advance(0, 9, false, false, /*replay=*/true).ok());  // one clock at a time
  for (int64_t k = 7; k <= 12; ++k) ASSERT_TRUE(c.Advance(0, k, false, k == 12, true).ok());
  EXPECT_TRUE(c.CheckRequestClock(0, 13).ok());  // worker 1 has not caught up yet
  // Caught up: its clock is its own again, and a request beyond it is an error.
  EXPECT_EQ(c.CheckRequestClock(0, 14).code(), StatusCode::kFailedPrecondition);
  ASSERT_TRUE(c.Advance(1, 7, false, false, true).ok());
  EXPECT_TRUE(c.CheckRequestClock(0, 13).ok());  // a replay's first Clock does not confirm it
  for (int64_t k = 8; k <= 11; ++k) ASSERT_TRUE(c.Advance(1, k, false, k == 11, true).ok());
  EXPECT_TRUE(c.Advance(1, 12, false, true).ok());  // ticks are taken again
  EXPECT_TRUE(c.ClocksKnown());
  EXPECT_TRUE(c.CheckRequestClock(0, 13).ok());
  EXPECT_FALSE(c.Advance(0, 15, false, true).ok());  // 3 ahead of worker 1
}

TEST(ConsistencyControllerTest, AWorkerThatHadLeftByTheCheckpointOwesNoReplay) {
  // A shard restored a checkpoint taken after worker 1 left: the checkpoint holds all worker 1
  // pushed, so a new process of it that says Hello loses nothing (worker 0's does).
  ConsistencyController c = Controller(TrainingOptions::Consistency::kBsp);
  c.SetClock(0, 7);
  c.SetClock(1, 7);
  c.SetDone(1, 7);
  EXPECT_TRUE(c.ReplayOwed());  // worker 0's
  EXPECT_FALSE(c.AbandonReplay(1));
  EXPECT_TRUE(c.AbandonReplay(0));
  EXPECT_FALSE(c.ReplayOwed());
  EXPECT_FALSE(c.AbandonReplay(0));  // once
}

}  // namespace
}  // namespace parasol

namespace parasol {
namespace {

// A rank beyond cluster.workers is outside the job until it joins; from then on it bounds the
// others and counts towards the BSP average of the clocks from its join clock on.
TEST(ConsistencyControllerTest, ARankCountsFromTheClockItJoinsAt) {
  TrainingOptions t;
  t.consistency = TrainingOptions::Consistency::kBsp;
  const auto now = std::chrono::steady_clock::now();
  ConsistencyController c(t, 2, now, 3);
  EXPECT_FALSE(c.InJob(2));
  EXPECT_TRUE(c.InJob(1));
  for (uint32_t w : {0u, 1u}) {
    for (int64_t k = 1; k <= 4; ++k) ASSERT_TRUE(c.Advance(w, k, false, true).ok());
  }
  EXPECT_EQ(c.MinClock(), 4);  // the rank outside the job holds nobody back
  EXPECT_EQ(c.ActiveAt(4), 2u);
  c.Join(2, 6, now);
  EXPECT_TRUE(c.InJob(2));
  EXPECT_EQ(c.clocks()[2], 6);
  EXPECT_EQ(c.live_workers(), 3u);
  EXPECT_EQ(c.ActiveAt(5), 2u);
  EXPECT_EQ(c.ActiveAt(6), 3u);
  EXPECT_EQ(c.MinClock(), 4);
  for (int64_t k = 5; k <= 7; ++k) {
    for (uint32_t w : {0u, 1u}) {
      const Status st = c.Advance(w, k, false, true);
      ASSERT_TRUE(st.ok()) << "worker " << w << " to " << k << ": " << st.ToString();
    }
  }
  EXPECT_EQ(c.MinClock(), 6);  // the joined rank at 6 now bounds clock 7's reads
  EXPECT_FALSE(c.PullAllowed(7));
  ASSERT_TRUE(c.Advance(2, 7, false, true).ok());
  EXPECT_TRUE(c.PullAllowed(7));
  c.Join(2, 100, now);  // a second join changes nothing
  EXPECT_EQ(c.clocks()[2], 7);
}

// A rollback past a join: the ranks of the job go back to the rollback's clock, a rank that
// joins later stays at the clock it was named (it waits for the job to get there, as when it
// was named), and one that joined before goes back like the others.
TEST(ConsistencyControllerTest, ARollbackPastAJoinLeavesTheJoinerAtItsClock) {
  TrainingOptions t;
  t.consistency = TrainingOptions::Consistency::kBsp;
  const auto now = std::chrono::steady_clock::now();
  for (const int64_t back_to : {2, 6, 7}) {
    SCOPED_TRACE("back to clock " + std::to_string(back_to));
    ConsistencyController c(t, 2, now, 4);
    for (uint32_t w : {0u, 1u}) ASSERT_TRUE(c.Advance(w, 0, false, true).ok());
    c.Join(2, 6, now);
    c.Join(3, 1, now);
    for (int64_t k = 1; k <= 8; ++k) {
      for (uint32_t w : {0u, 1u, 2u, 3u}) {
        if (k < c.JoinedAt(w) + 1) continue;
        const Status st = c.Advance(w, k, false, true);
        ASSERT_TRUE(st.ok()) << "worker " << w << " to " << k << ": " << st.ToString();
      }
    }
    ASSERT_EQ(c.clocks(), (std::vector<int64_t>{8, 8, 8, 8}));
    c.RollBack(back_to, now);
    EXPECT_EQ(c.clocks()[0], back_to);
    EXPECT_EQ(c.clocks()[1], back_to);
    EXPECT_EQ(c.clocks()[2], std::max<int64_t>(back_to, 6));
    EXPECT_EQ(c.clocks()[3], back_to);
    EXPECT_EQ(c.MinClock(), back_to);
    EXPECT_TRUE(c.ClocksKnown());
    // The joiner's first step after it is admitted once the others reach its clock.
    EXPECT_EQ(c.PullAllowed(std::max<int64_t>(back_to, 6)), back_to >= 6);
  }
}

// A shard that starts serving at a change of the shard count (clock 500) was ticked by no
// worker: it notes ticks past its first clock before its commit (and ignores others), then
// takes every worker at the change's clock at least, those that left or were lost as the
// commit says, and serves by them.
TEST(ConsistencyControllerTest, AShardThatStartsServingTakesTheWorkersAtTheChangesClock) {
  TrainingOptions t;
  t.consistency = TrainingOptions::Consistency::kBsp;
  const auto now = std::chrono::steady_clock::now();
  ConsistencyController c(t, 4, now);
  EXPECT_FALSE(c.ClocksKnown());
  c.NoteAhead(1, 501, false, 500);   // a worker whose step 500 pulled nothing here
  c.NoteAhead(2, 900, false, 500);   // beyond the slack: ignored
  c.NoteAhead(3, 400, true, 500);    // before the first clock: ignored
  EXPECT_EQ(c.clocks()[1], 501);
  EXPECT_EQ(c.clocks()[2], 0);
  EXPECT_EQ(c.DoneAt(3), -1);
  c.AddHeld(0, +1);  // a pull of clock 500 held for the commit
  c.Enter(500, {-1, -1, ConsistencyController::kLostRank, 480}, now);
  EXPECT_TRUE(c.ClocksKnown());
  EXPECT_FALSE(c.ReplayOwed());
  EXPECT_EQ(c.clocks()[0], 500);
  EXPECT_EQ(c.clocks()[1], 501);
  EXPECT_TRUE(c.IsLost(2));
  EXPECT_EQ(c.DoneAt(3), 480);
  EXPECT_EQ(c.live_workers(), 3u);
  EXPECT_EQ(c.MinClock(), 500);  // worker 0; the lost and the finished hold nobody back
  EXPECT_TRUE(c.PullAllowed(500));
  EXPECT_FALSE(c.PullAllowed(501));
  // The held pull still counts: its worker is not silent while it waits here.
  EXPECT_TRUE(c.DetectLost(now + std::chrono::hours(1)).empty());
  c.AddHeld(0, -1);
  ASSERT_TRUE(c.Advance(0, 501, false, true).ok());
  ASSERT_TRUE(c.Advance(1, 502, false, true).ok());
  EXPECT_FALSE(c.Advance(0, 503, false, true).ok());  // clocks move by one from the change on
  EXPECT_TRUE(c.PullAllowed(501));
}

}  // namespace
}  // namespace parasol
