// Where a restarted or joining worker goes on from, from its Hello replies
// (worker/resume_point.hpp).
#include "worker/resume_point.hpp"

#include <gtest/gtest.h>

#include <vector>

namespace parasol {
namespace {

// Shard `shard` knows the worker at `clock` (-1: not at all), left or not, with `barrier`
// released, and has applied up to `read`.
Header Hello(uint32_t shard, int64_t clock, bool left = false, int64_t barrier = 0,
             int64_t read = -1) {
  Header h;
  h.op = Op::Hello;
  h.shard_rank = shard;
  h.worker_clock = clock;
  h.done = left;
  h.last_barrier = barrier;
  h.read_clock = read;
  return h;
}

TEST(ResumePointTest, NoShardKnowsANewWorker) {
  const std::vector<Header> hellos = {Hello(0, -1), Hello(1, -1)};
  const ResumePoint r = ResumeFrom(hellos, 3, true);
  EXPECT_FALSE(r.known);
  EXPECT_EQ(r.clock, -1);
  EXPECT_TRUE(r.lost_step.empty());
  EXPECT_FALSE(ResumeFrom({}, 3, true).known);
}

// The smallest clock, barrier and "left" over the shards that know it; one that does not is
// passed over (its barrier too).
TEST(ResumePointTest, TheSlowestShardDecides) {
  const std::vector<Header> hellos = {Hello(0, 7, true, 2), Hello(1, -1, false, 0),
                                      Hello(2, 7, false, 3)};
  const ResumePoint r = ResumeFrom(hellos, 1, false);
  EXPECT_TRUE(r.known);
  EXPECT_EQ(r.clock, 7);
  EXPECT_FALSE(r.done);  // shard 2 did not see it leave
  EXPECT_EQ(r.last_barrier, 2);
  EXPECT_EQ(r.furthest_clock, 7);
  const std::vector<Header> left = {Hello(0, 9, true, 4), Hello(1, 9, true, 4)};
  EXPECT_TRUE(ResumeFrom(left, 1, true).done);
  EXPECT_TRUE(ResumeFrom(left, 1, true).lost_step.empty());
}

// A shard restored from before barrier 0's release knows the worker at clock 0 with no barrier
// released; the others know it past clock 0. It goes on from clock 0, and the furthest clock
// says it had ticked out of step 0 (so had passed barrier 0 everywhere: MeetsAtStart).
TEST(ResumePointTest, TheFurthestClockIsKeptBesideTheSlowest) {
  const std::vector<Header> hellos = {Hello(0, 0, false, -1), Hello(1, 1, false, 0),
                                      Hello(2, -1, false, 5), Hello(3, 1, false, 0)};
  const ResumePoint r = ResumeFrom(hellos, 1, false);
  EXPECT_EQ(r.clock, 0);
  EXPECT_EQ(r.last_barrier, -1);
  EXPECT_EQ(r.furthest_clock, 1);
  EXPECT_EQ(ResumeFrom(std::vector<Header>{Hello(0, -1)}, 1, false).furthest_clock, -1);
}

// BSP: a tick out of step 4 that reached shard 1 only. Shard 1 is named, and whether it has
// applied the step already (its read clock) is said; without the check (SSP, a joining worker)
// nothing is reported, and the worker still goes on from the slowest clock.
TEST(ResumePointTest, ATickThatReachedSomeShardsOnlyIsReportedUnderBsp) {
  const std::vector<Header> hellos = {Hello(0, 4), Hello(1, 5, false, 0, 5), Hello(2, 4)};
  const ResumePoint r = ResumeFrom(hellos, 2, true);
  EXPECT_EQ(r.clock, 4);
  EXPECT_NE(r.lost_step.find("worker 2 restarted after its tick out of step 4 reached shard 1"),
            std::string::npos)
      << r.lost_step;
  EXPECT_NE(r.lost_step.find("shard 1 has applied that step"), std::string::npos) << r.lost_step;
  const std::vector<Header> pending = {Hello(0, 4), Hello(1, 5, false, 0, 4)};
  EXPECT_NE(ResumeFrom(pending, 2, true).lost_step.find("shard 1 may apply"), std::string::npos);
  EXPECT_TRUE(ResumeFrom(hellos, 2, false).lost_step.empty());
  EXPECT_EQ(ResumeFrom(hellos, 2, false).clock, 4);
}

}  // namespace
}  // namespace parasol
