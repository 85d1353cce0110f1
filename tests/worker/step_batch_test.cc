// The step batch (worker/step_batch.hpp): where a step's gathered requests are cut into Step
// messages by the Step rule (common/protocol.hpp), and the Steps on their way.
#include "worker/step_batch.hpp"

#include <gtest/gtest.h>

#include <vector>

#include "common/protocol.hpp"

namespace parasol {
namespace {

// A request as the batch sees it (entries hold frames, so they are built, not copied).
struct Spec {
  Op op;
  int64_t clock;
  uint64_t bytes = 8;
  bool done = false;
};
Spec E(Op op, int64_t clock, uint64_t bytes = 8, bool done = false) {
  return Spec{op, clock, bytes, done};
}

std::vector<StepBatch::Entry> Queue(const std::vector<Spec>& specs) {
  std::vector<StepBatch::Entry> queue(specs.size());
  for (size_t i = 0; i < specs.size(); ++i) {
    queue[i].op = specs[i].op;
    queue[i].clock = specs[i].clock;
    queue[i].payload_bytes = specs[i].bytes;
    queue[i].done = specs[i].done;
  }
  return queue;
}

std::vector<size_t> Cut(const std::vector<Spec>& specs, uint64_t max = 1 << 20) {
  std::vector<size_t> starts;
  StepBatch::Cut(Queue(specs), max, &starts);
  return starts;
}

TEST(StepBatchTest, PushesOfOneClockAndATickWithThePullsBehindItTravelAsTwoSteps) {
  // A BSP step: its pushes, then the tick out of it with the next step's pulls.
  EXPECT_EQ(Cut({E(Op::PushSparse, 3), E(Op::PushDense, 3), E(Op::PushSparse, 3),
                 E(Op::Clock, 4, 0), E(Op::PullSparse, 4), E(Op::PullDense, 4)}),
            (std::vector<size_t>{0, 3}));
}

TEST(StepBatchTest, EachRuleCutsWhereItMust) {
  // Another clock.
  EXPECT_EQ(Cut({E(Op::PullSparse, 1), E(Op::PullSparse, 2)}), (std::vector<size_t>{0, 1}));
  // A pull after pushes, and a push after pulls.
  EXPECT_EQ(Cut({E(Op::PushSparse, 1), E(Op::PullSparse, 1), E(Op::PushDense, 1)}),
            (std::vector<size_t>{0, 1, 2}));
  // A second tick, and a tick after pulls.
  EXPECT_EQ(Cut({E(Op::Clock, 1, 0), E(Op::Clock, 1, 0), E(Op::PullSparse, 1),
                 E(Op::Clock, 1, 0)}),
            (std::vector<size_t>{0, 1, 3}));
  // A push after a tick.
  EXPECT_EQ(Cut({E(Op::Clock, 1, 0), E(Op::PushSparse, 1)}), (std::vector<size_t>{0, 1}));
  // A tick that leaves the job leads no Step.
  EXPECT_EQ(Cut({E(Op::Clock, 1, 0, /*done=*/true), E(Op::PullSparse, 1)}),
            (std::vector<size_t>{0, 1}));
  // The byte limit: 3 x 40 bytes within 100.
  EXPECT_EQ(Cut({E(Op::PushSparse, 1, 40), E(Op::PushSparse, 1, 40), E(Op::PushSparse, 1, 40)},
                100),
            (std::vector<size_t>{0, 2}));
  // A request over the limit alone travels alone (the shard says what is wrong with it).
  EXPECT_EQ(Cut({E(Op::PushSparse, 1, 500), E(Op::PushSparse, 1, 10)}, 100),
            (std::vector<size_t>{0, 1}));
  EXPECT_TRUE(Cut({}).empty());
}

TEST(StepBatchTest, APartCountBeyondTheLimitStartsAnotherStep) {
  const std::vector<Spec> specs(kMaxStepParts + 5, E(Op::PullSparse, 7, 1));
  EXPECT_EQ(Cut(specs), (std::vector<size_t>{0, kMaxStepParts}));
}

// What the worker cuts, the shard's check of a Step accepts part by part (the same rule).
TEST(StepBatchTest, EveryRunTheWorkerCutsIsOneTheShardsRuleAccepts) {
  const Op ops[] = {Op::PushSparse, Op::PushDense, Op::PullSparse, Op::PullDense, Op::Clock};
  int runs = 0;
  // Every queue of up to 4 requests from these ops, at clocks 0 and 1.
  for (int len = 1; len <= 4; ++len) {
    int combos = 1;
    for (int i = 0; i < len; ++i) combos *= 10;
    for (int c = 0; c < combos; ++c) {
      std::vector<Spec> queue;
      for (int i = 0, x = c; i < len; ++i, x /= 10) queue.push_back(E(ops[x % 10 % 5], x % 10 / 5));
      const std::vector<size_t> starts = Cut(queue);
      ASSERT_FALSE(starts.empty());
      ASSERT_EQ(starts[0], 0u);
      for (size_t r = 0; r < starts.size(); ++r) {
        const size_t begin = starts[r], end = r + 1 < starts.size() ? starts[r + 1] : queue.size();
        if (end - begin == 1) continue;  // travels alone, not as a Step
        ++runs;
        for (size_t i = begin; i < end; ++i) {
          EXPECT_TRUE(StepMayHold(queue[begin].op, queue[i].op, queue[i].done, i - begin));
          EXPECT_EQ(queue[i].clock, queue[begin].clock);
          if (queue[i].op == Op::Clock) EXPECT_TRUE(StepMayLeadWithTick(end - begin));
        }
        // Cut as late as the rule allows: the next request could not have joined.
        if (end < queue.size()) {
          EXPECT_FALSE(queue[end].clock == queue[begin].clock &&
                       StepMayHold(queue[begin].op, queue[end].op, queue[end].done, end - begin));
        }
      }
    }
  }
  EXPECT_GT(runs, 1000);
}

TEST(StepBatchTest, StepsOnTheirWayAreForgottenOnceEveryPartIsAnswered) {
  StepBatch batch;
  batch.Record(100) = {1, 2};
  batch.Record(200) = {3};
  ASSERT_NE(batch.Parts(100), nullptr);
  EXPECT_EQ(*batch.Parts(100), (std::vector<uint64_t>{1, 2}));
  batch.ForgetAnswered([](uint64_t id) { return id == 2; });
  EXPECT_NE(batch.Parts(100), nullptr);
  EXPECT_EQ(batch.Parts(200), nullptr);
  batch.Forget(100);
  EXPECT_EQ(batch.steps_in_flight(), 0u);
  EXPECT_TRUE(batch.Record(300).empty());  // a reused node starts empty
}

TEST(StepBatchTest, GatheredEntriesAreHandedOutPerShardAndTheQueuesStartEmptyAgain) {
  StepBatch batch;
  batch.Begin(3);
  EXPECT_TRUE(batch.gathering());
  batch.Add(2).request_id = 7;
  batch.Add(0).request_id = 5;
  batch.Add(2).request_id = 8;
  std::vector<std::pair<uint32_t, std::vector<uint64_t>>> seen;
  batch.End([&](uint32_t s, std::span<StepBatch::Entry> q) {
    std::vector<uint64_t> ids;
    for (const auto& e : q) ids.push_back(e.request_id);
    seen.emplace_back(s, ids);
  });
  EXPECT_FALSE(batch.gathering());
  ASSERT_EQ(seen.size(), 2u);
  EXPECT_EQ(seen[0], (std::pair<uint32_t, std::vector<uint64_t>>{0, {5}}));
  EXPECT_EQ(seen[1], (std::pair<uint32_t, std::vector<uint64_t>>{2, {7, 8}}));
  batch.Begin(3);
  int calls = 0;
  batch.End([&](uint32_t, std::span<StepBatch::Entry>) { ++calls; });
  EXPECT_EQ(calls, 0);
}

}  // namespace
}  // namespace parasol
