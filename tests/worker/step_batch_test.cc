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

// The rule as the shard checked it before it lived in common/protocol.hpp, written out on its
// own: part i of a Step whose parts are `ops` is accepted when it is a push in a Step of pushes,
// a pull in a Step of pulls or behind its first-part tick, or that tick (not one that leaves,
// and not alone).
bool OldShardAccepts(const std::vector<Spec>& run, size_t i) {
  auto is_pull = [](Op op) { return op == Op::PullSparse || op == Op::PullDense; };
  auto is_push = [](Op op) { return op == Op::PushSparse || op == Op::PushDense; };
  const bool ticks = run[0].op == Op::Clock;
  const bool pulls = is_pull(run[0].op);
  const Spec& h = run[i];
  const bool tick = h.op == Op::Clock && i == 0 && !h.done && run.size() > 1;
  return (is_push(h.op) && !ticks && !pulls) || (is_pull(h.op) && (pulls || ticks || i == 0)) ||
         tick;
}

// What the worker cuts, the shard accepts; and it cuts no later than needed: the request after
// each run could not have joined it. Checked against the rule written out independently above,
// over every queue of up to 4 requests of these kinds at two clocks.
TEST(StepBatchTest, EveryRunTheWorkerCutsIsOneTheShardsRuleAccepts) {
  const Spec kinds[] = {E(Op::PushSparse, 0), E(Op::PushDense, 0), E(Op::PullSparse, 0),
                        E(Op::PullDense, 0), E(Op::Clock, 0, 0), E(Op::Clock, 0, 0, true)};
  constexpr int kKinds = 6, kClocks = 2, kChoices = kKinds * kClocks;
  int runs = 0, queues = 0;
  for (int len = 1; len <= 4; ++len) {
    int combos = 1;
    for (int i = 0; i < len; ++i) combos *= kChoices;
    for (int c = 0; c < combos; ++c) {
      std::vector<Spec> queue;
      for (int i = 0, x = c; i < len; ++i, x /= kChoices) {
        Spec spec = kinds[x % kChoices % kKinds];
        spec.clock = x % kChoices / kKinds;
        queue.push_back(spec);
      }
      ++queues;
      const std::vector<size_t> starts = Cut(queue);
      ASSERT_FALSE(starts.empty());
      ASSERT_EQ(starts[0], 0u);
      for (size_t r = 0; r < starts.size(); ++r) {
        const size_t begin = starts[r], end = r + 1 < starts.size() ? starts[r + 1] : queue.size();
        const std::vector<Spec> run(queue.begin() + begin, queue.begin() + end);
        if (run.size() > 1) {
          ++runs;
          for (size_t i = 0; i < run.size(); ++i) {
            EXPECT_TRUE(OldShardAccepts(run, i)) << "queue " << c << " run " << r << " part " << i;
            EXPECT_EQ(run[i].clock, run[0].clock);
          }
        }
        if (end < queue.size()) {
          std::vector<Spec> longer = run;
          longer.push_back(queue[end]);
          bool accepted = queue[end].clock == run[0].clock;
          for (size_t i = 0; i < longer.size() && accepted; ++i) {
            accepted = OldShardAccepts(longer, i);
          }
          EXPECT_FALSE(accepted) << "queue " << c << ": cut before part " << end
                                 << ", which the Step could have held";
        }
      }
    }
  }
  EXPECT_EQ(queues, 12 + 144 + 1728 + 20736);
  EXPECT_GT(runs, 5000);
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
