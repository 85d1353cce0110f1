#include "server/consistency_controller.hpp"

#include <gtest/gtest.h>

namespace parasol {
namespace {

ConsistencyController Controller(TrainingOptions::Consistency mode, uint32_t staleness = 0) {
  TrainingOptions t;
  t.consistency = mode;
  t.staleness = staleness;
  return ConsistencyController(t, 2, std::chrono::steady_clock::now());
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

TEST(ConsistencyControllerTest, BspRefusesRequestsMoreThanOneClockAheadOfTheSlowest) {
  ConsistencyController c = Controller(TrainingOptions::Consistency::kBsp);
  ASSERT_TRUE(c.Advance(0, 1, false).ok());
  EXPECT_TRUE(c.CheckRequestClock(0, 1).ok());
  ASSERT_TRUE(c.Advance(0, 2, false).ok());  // a forger may tick worker 0 ahead...
  Status st = c.CheckRequestClock(0, 2);     // ...but bsp never admits clock 2 while 1 is at 0
  EXPECT_FALSE(st.ok());
  EXPECT_NE(st.message().find("could never admit"), std::string::npos) << st.ToString();
  EXPECT_FALSE(c.CheckRequestClock(1, 2).ok());  // beyond worker 1's own next clock
  EXPECT_TRUE(c.CheckRequestClock(1, 1).ok());
}

TEST(ConsistencyControllerTest, SspAdmitsUpToStalenessPlusOneAhead) {
  ConsistencyController c = Controller(TrainingOptions::Consistency::kSsp, 2);
  for (int64_t k = 1; k <= 5; ++k) ASSERT_TRUE(c.Advance(0, k, false).ok());
  EXPECT_TRUE(c.CheckRequestClock(0, 3).ok());
  EXPECT_FALSE(c.CheckRequestClock(0, 4).ok());
  EXPECT_FALSE(c.CheckRequestClock(0, 5).ok());
}

TEST(ConsistencyControllerTest, AspBoundsOnlyByTheSendersOwnClock) {
  ConsistencyController c = Controller(TrainingOptions::Consistency::kAsp);
  for (int64_t k = 1; k <= 50; ++k) ASSERT_TRUE(c.Advance(0, k, false).ok());
  EXPECT_TRUE(c.CheckRequestClock(0, 51).ok());
  EXPECT_FALSE(c.CheckRequestClock(0, 52).ok());
}

TEST(ConsistencyControllerTest, RestoredClocksAreALowerBoundUntilConfirmed) {
  ConsistencyController c = Controller(TrainingOptions::Consistency::kBsp);
  c.SetClock(0, 7);
  c.SetClock(1, 7);
  // The workers may be ahead of the checkpoint: nothing is refused for its clock yet.
  EXPECT_TRUE(c.CheckRequestClock(0, 12).ok());
  EXPECT_FALSE(c.Advance(0, 9, false).ok());  // replays go one clock at a time
  ASSERT_TRUE(c.Advance(0, 7, false).ok());
  ASSERT_TRUE(c.Advance(0, 8, false).ok());
  EXPECT_TRUE(c.CheckRequestClock(0, 9).ok());  // worker 1 is not confirmed yet
  ASSERT_TRUE(c.Advance(1, 7, false).ok());
  EXPECT_FALSE(c.CheckRequestClock(0, 9).ok());
  EXPECT_TRUE(c.CheckRequestClock(0, 8).ok());
}

}  // namespace
}  // namespace parasol
