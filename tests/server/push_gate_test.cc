// PushGate: what a shard makes of a push (new, duplicate or conflict) and of a tick (admitted,
// or held back while a push it names is missing), as a table of cases, without a socket.
#include "server/push_gate.hpp"

#include <gtest/gtest.h>

#include <string>

namespace parasol {
namespace {

// A push (index `n`) or a tick (naming `n` pushes) of `worker` at `clock`.
Header Request(Op op, uint32_t worker, int64_t clock, uint64_t n, uint64_t incarnation,
               bool replay) {
  Header h;
  h.op = op;
  h.worker_id = worker;
  h.clock = clock;
  (op == Op::Clock ? h.key_count : h.seq) = n;
  h.incarnation = incarnation;
  h.replay = replay;
  return h;
}
Header Push(uint32_t worker, int64_t clock, uint64_t index, uint64_t incarnation = 7) {
  return Request(Op::PushSparse, worker, clock, index, incarnation, false);
}
Header Tick(uint32_t worker, int64_t clock, uint64_t pushes, bool replay = false) {
  return Request(Op::Clock, worker, clock, pushes, 7, replay);
}

using A = PushGate::Admission;
constexpr PushGate::Sender kAtClock3{3, false};

TEST(PushGateTest, APushIsNewUntilMarkedThenADuplicateAndItsBytesAreCounted) {
  PushGate gate(2);
  const Header p = Push(1, 3, 0);
  EXPECT_EQ(gate.AdmitPush(p, 111, kAtClock3, false).admission, A::kNew);
  ASSERT_TRUE(gate.CanMark(p).ok());
  ASSERT_TRUE(gate.Mark(p, 111, 640).ok());
  const PushGate::Decision again = gate.AdmitPush(p, 111, kAtClock3, false);
  EXPECT_EQ(again.admission, A::kDuplicate);
  EXPECT_STREQ(again.reason, "in the push record");
  // A resend of another process of the worker (a restarted one recomputing the step) is a
  // duplicate whatever its payload; the same process with another payload is a conflict.
  EXPECT_EQ(gate.AdmitPush(Push(1, 3, 0, 8), 222, kAtClock3, false).admission, A::kDuplicate);
  EXPECT_EQ(gate.AdmitPush(p, 222, kAtClock3, false).admission, A::kConflict);
  // Another worker's push of the same clock and index is its own.
  EXPECT_EQ(gate.AdmitPush(Push(0, 3, 0), 111, kAtClock3, false).admission, A::kNew);
  EXPECT_EQ(gate.pushed_since_checkpoint()[1], 640u);
  EXPECT_EQ(gate.pushed_since_checkpoint()[0], 0u);
  // A checkpoint begun with 600 of them holds those; 40 remain to log.
  gate.CheckpointTaken({0, 600});
  EXPECT_EQ(gate.pushed_since_checkpoint()[1], 40u);
}

TEST(PushGateTest, APushOfAClockMovedAwayIsADuplicate) {
  PushGate gate(1);
  const PushGate::Decision d = gate.AdmitPush(Push(0, 3, 0), 1, kAtClock3, /*moved_away=*/true);
  EXPECT_EQ(d.admission, A::kDuplicate);
  EXPECT_NE(std::string(d.reason).find("moved"), std::string::npos);
}

TEST(PushGateTest, APushOlderThanTheRecordIsADuplicateOnlyOnceItsWorkerIsKnownPastIt) {
  PushGate gate(1);
  ASSERT_TRUE(gate.Mark(Push(0, 500, 0), 1, 8).ok());
  ASSERT_GT(gate.record().Floor(0), 10);
  const Header old = Push(0, 10, 0);
  // Known at clock 501 from the worker itself: every push before it was applied.
  EXPECT_EQ(gate.AdmitPush(old, 1, PushGate::Sender{501, false}, false).admission,
            A::kDuplicate);
  // Known only from a checkpoint (its replay due), or not past the clock: not a duplicate,
  // and the record cannot hold it, so it is refused before it is applied.
  EXPECT_EQ(gate.AdmitPush(old, 1, PushGate::Sender{501, true}, false).admission, A::kNew);
  EXPECT_EQ(gate.AdmitPush(old, 1, PushGate::Sender{10, false}, false).admission, A::kNew);
  EXPECT_FALSE(gate.CanMark(old).ok());
}

TEST(PushGateTest, ATickWaitsForEveryPushItNames) {
  PushGate gate(1);
  uint64_t checked = 99;
  // Worker 0 at clock 3 ticks to 4 after 2 pushes of clock 3; only push 0 arrived.
  ASSERT_TRUE(gate.Mark(Push(0, 3, 0), 1, 8).ok());
  const Status held = gate.AdmitTick(Tick(0, 4, 2), kAtClock3, &checked);
  EXPECT_EQ(held.code(), StatusCode::kUnavailable);
  EXPECT_NE(held.message().find("its push 1 has not been applied here"), std::string::npos)
      << held.ToString();
  EXPECT_EQ(checked, 0u);
  ASSERT_TRUE(gate.Mark(Push(0, 3, 1), 2, 8).ok());
  EXPECT_TRUE(gate.AdmitTick(Tick(0, 4, 2), kAtClock3, &checked).ok());
  EXPECT_EQ(checked, 2u);
  // A resend of a tick the shard has taken (the worker is at 4 here), a tick naming no push,
  // and a restored worker's tick that is no replay (the clock controller refuses it) are
  // not checked.
  EXPECT_TRUE(gate.AdmitTick(Tick(0, 4, 5), PushGate::Sender{4, false}, &checked).ok());
  EXPECT_EQ(checked, 0u);
  EXPECT_TRUE(gate.AdmitTick(Tick(0, 5, 0), PushGate::Sender{4, false}, &checked).ok());
  EXPECT_EQ(checked, 0u);
  EXPECT_TRUE(gate.AdmitTick(Tick(0, 5, 3), PushGate::Sender{4, true}, &checked).ok());
  EXPECT_EQ(checked, 0u);
  // A restored worker's replayed tick is checked.
  EXPECT_FALSE(gate.AdmitTick(Tick(0, 5, 3, /*replay=*/true), PushGate::Sender{4, true},
                              &checked)
                   .ok());
}

}  // namespace
}  // namespace parasol
