#include "worker/reply_outcome.hpp"

namespace parasol {

namespace {

bool IsPull(Op op) { return op == Op::PullSparse || op == Op::PullDense; }
bool IsPush(Op op) { return op == Op::PushSparse || op == Op::PushDense; }

}  // namespace

ReplyOutcome OutcomeOf(Op request, StatusCode status, bool restoring, bool replay_due) {
  if (restoring && status == StatusCode::kUnavailable) return ReplyOutcome::kAwaitRestore;
  if (status != StatusCode::kOk) {
    if (replay_due) return ReplyOutcome::kAwaitReplay;
    if (status == StatusCode::kUnavailable &&
        (request == Op::Clock || IsPull(request) || IsPush(request) || request == Op::Step ||
         request == Op::Hello || request == Op::Membership)) {
      return ReplyOutcome::kRetryLater;
    }
    return ReplyOutcome::kFail;
  }
  if (replay_due && IsPull(request)) return ReplyOutcome::kAwaitReplay;
  return ReplyOutcome::kDone;
}

const char* OutcomeName(ReplyOutcome outcome) {
  switch (outcome) {
    case ReplyOutcome::kDone:
      return "done";
    case ReplyOutcome::kAwaitRestore:
      return "await restore";
    case ReplyOutcome::kAwaitReplay:
      return "await replay";
    case ReplyOutcome::kRetryLater:
      return "retry later";
    case ReplyOutcome::kFail:
      return "fail";
  }
  return "?";
}

}  // namespace parasol
