// The worker's table of reply outcomes (worker/reply_outcome.hpp), row by row, for every op a
// worker sends and every status a shard answers.
#include "worker/reply_outcome.hpp"

#include <gtest/gtest.h>

#include <string>

namespace parasol {
namespace {

constexpr Op kOps[] = {Op::Hello,  Op::PullSparse, Op::PushSparse, Op::PullDense,
                       Op::PushDense, Op::Clock,   Op::Barrier,    Op::Stats,
                       Op::Step,     Op::Membership, Op::Checkpoint, Op::Rollback};
constexpr StatusCode kErrors[] = {StatusCode::kInvalidArgument, StatusCode::kFailedPrecondition,
                                  StatusCode::kResourceExhausted, StatusCode::kUnavailable,
                                  StatusCode::kInternal, StatusCode::kAborted};

bool IsPull(Op op) { return op == Op::PullSparse || op == Op::PullDense; }

TEST(ReplyOutcomeTest, EveryOpAndStatusHasItsRow) {
  int rows = 0;
  for (Op op : kOps) {
    SCOPED_TRACE(OpName(op));
    // OK: done, except a pull answered from a restarted shard's checkpoint before the replay.
    EXPECT_EQ(OutcomeOf(op, StatusCode::kOk, false, false), ReplyOutcome::kDone);
    EXPECT_EQ(OutcomeOf(op, StatusCode::kOk, false, true),
              IsPull(op) ? ReplyOutcome::kAwaitReplay : ReplyOutcome::kDone);
    for (StatusCode error : kErrors) {
      SCOPED_TRACE(static_cast<int>(error));
      // A restarted shard's error before the replay: the replay resends.
      EXPECT_EQ(OutcomeOf(op, error, false, true), ReplyOutcome::kAwaitReplay);
      // Unavailable to a tick, a pull, a push or a Step of them, a Hello or a membership
      // request: later; any other error fails.
      const bool later = error == StatusCode::kUnavailable &&
                         (op == Op::Clock || IsPull(op) || op == Op::PushSparse ||
                          op == Op::PushDense || op == Op::Step || op == Op::Hello ||
                          op == Op::Membership);
      EXPECT_EQ(OutcomeOf(op, error, false, false),
                later ? ReplyOutcome::kRetryLater : ReplyOutcome::kFail);
      // Loading its checkpoint: Unavailable waits for the restore whatever the op; another
      // error while loading is what it says.
      if (error == StatusCode::kUnavailable) {
        EXPECT_EQ(OutcomeOf(op, error, true, false), ReplyOutcome::kAwaitRestore);
        EXPECT_EQ(OutcomeOf(op, error, true, true), ReplyOutcome::kAwaitRestore);
      } else {
        EXPECT_EQ(OutcomeOf(op, error, true, false), ReplyOutcome::kFail);
      }
      ++rows;
    }
  }
  EXPECT_EQ(rows, 72);
}

TEST(ReplyOutcomeTest, OutcomesHaveNames) {
  EXPECT_STREQ(OutcomeName(ReplyOutcome::kRetryLater), "retry later");
  EXPECT_STREQ(OutcomeName(ReplyOutcome::kAwaitRestore), "await restore");
  EXPECT_STREQ(OutcomeName(ReplyOutcome::kFail), "fail");
}

}  // namespace
}  // namespace parasol
