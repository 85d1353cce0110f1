// The worker's request tracker (worker/request_tracker.hpp): tickets complete when every
// request is answered or failed, deadlines say what is due, the first failure is kept, and a
// request renumbered for a resend is found by its new id only. No socket, no clock: times are
// passed in.
#include "worker/request_tracker.hpp"

#include <gtest/gtest.h>

#include <chrono>

namespace parasol {
namespace {

using namespace std::chrono_literals;
using TimePoint = RequestTracker::TimePoint;

Header Request(uint64_t id, Op op, int64_t clock = 0) {
  Header h;
  h.request_id = id;
  h.op = op;
  h.clock = clock;
  return h;
}

TEST(RequestTrackerTest, ATicketIsCompleteOnceEachOfItsRequestsIsAnsweredOrFailed) {
  RequestTracker tracker(/*shards=*/3);
  const TimePoint t0{};
  const auto ticket = tracker.Open(Op::PullSparse, 7);
  TicketState& p = tracker.ticket(ticket);
  EXPECT_EQ(p.op, Op::PullSparse);
  EXPECT_EQ(p.table, 7u);
  EXPECT_EQ(p.replies.size(), 3u);
  TrackedRequest& a = tracker.Track(ticket, Request(10, Op::PullSparse, 4), 0, 100ms, 3, t0);
  tracker.Track(ticket, Request(11, Op::PullSparse, 4), 2, 100ms, 3, t0);
  EXPECT_EQ(a.clock, 4);
  EXPECT_EQ(p.outstanding, 2u);
  // A reply is for the request only from the shard it went to.
  EXPECT_EQ(tracker.Find(11, 1u), nullptr);
  ASSERT_NE(tracker.Find(11, 2u), nullptr);
  EXPECT_NE(tracker.Find(11, std::nullopt), nullptr);
  tracker.Complete(a);
  EXPECT_FALSE(tracker.Outstanding(10));
  EXPECT_EQ(p.outstanding, 1u);
  tracker.Fail(*tracker.Find(11, 2u), Unavailable("first"));
  EXPECT_EQ(p.outstanding, 0u);
  EXPECT_EQ(p.status.message(), "first");
  EXPECT_TRUE(tracker.requests().empty());
  tracker.Close(ticket);
  EXPECT_EQ(tracker.Find(ticket), nullptr);
  EXPECT_EQ(tracker.open_tickets(), 0u);
}

TEST(RequestTrackerTest, TheFirstFailureIsKeptAndALaterOneDoesNotReplaceIt) {
  RequestTracker tracker(2);
  const auto ticket = tracker.Open(Op::PushSparse, 0);
  tracker.Track(ticket, Request(1, Op::PushSparse), 0, 10ms, 1, TimePoint{});
  tracker.Track(ticket, Request(2, Op::PushSparse), 1, 10ms, 1, TimePoint{});
  tracker.Fail(*tracker.Find(1, 0u), Timeout("shard 0 did not answer"));
  tracker.Fail(*tracker.Find(2, 1u), BadMessage("shard 1 sent garbage"));
  EXPECT_EQ(tracker.ticket(ticket).status.code(), StatusCode::kTimeout);
}

TEST(RequestTrackerTest, DeadlinesSayWhatIsDueAndHowLongAWaitMayLast) {
  RequestTracker tracker(2);
  const TimePoint t0 = TimePoint{} + 1s;
  const auto ticket = tracker.Open(Op::Clock, 0);
  tracker.Track(ticket, Request(5, Op::Clock), 0, 300ms, 2, t0);
  tracker.Track(ticket, Request(6, Op::Clock), 1, 100ms, 2, t0);
  EXPECT_EQ(tracker.UntilDue(t0, 1000ms), 100ms);
  EXPECT_EQ(tracker.UntilDue(t0, 50ms), 50ms);
  EXPECT_EQ(tracker.UntilDue(t0 + 200ms, 1000ms), 0ms);  // one is overdue: no wait
  EXPECT_TRUE(tracker.Due(t0 + 99ms).empty());
  EXPECT_EQ(tracker.Due(t0 + 100ms), (std::vector<uint64_t>{6}));
  EXPECT_EQ(tracker.Due(t0 + 300ms), (std::vector<uint64_t>{5, 6}));
  TrackedRequest& r = *tracker.Find(6, 1u);
  EXPECT_EQ(r.attempts, 1u);
  EXPECT_EQ(r.max_attempts, 2u);
  EXPECT_EQ(r.timeout, 100ms);
}

TEST(RequestTrackerTest, ARenumberedRequestIsFoundByItsNewIdAndKeepsItsPlace) {
  RequestTracker tracker(1);
  const auto ticket = tracker.Open(Op::PushDense, 0);
  TrackedRequest& r = tracker.Track(ticket, Request(3, Op::PushDense), 0, 10ms, 1, TimePoint{});
  r.kept.emplace_back(4);
  tracker.Renumber(r, 40);
  EXPECT_EQ(tracker.Find(3, std::nullopt), nullptr);
  TrackedRequest* moved = tracker.Find(40, 0u);
  ASSERT_NE(moved, nullptr);
  EXPECT_EQ(moved->request_id, 40u);
  EXPECT_EQ(moved->kept.size(), 1u);
  EXPECT_EQ(tracker.ticket(ticket).outstanding, 1u);
  // Renumbered for a resend, it is the newest request: Due() and iteration go in id order.
  tracker.Track(ticket, Request(20, Op::PushDense), 0, 10ms, 1, TimePoint{});
  EXPECT_EQ(tracker.Due(TimePoint{} + 10ms), (std::vector<uint64_t>{20, 40}));
  tracker.Complete(*tracker.Find(20, 0u));
  tracker.Withdraw(*moved);
  EXPECT_EQ(tracker.ticket(ticket).outstanding, 0u);
  EXPECT_TRUE(tracker.ticket(ticket).status.ok());  // withdrawn is not failed
}

TEST(RequestTrackerTest, ReusedTicketsAndRequestsStartClean) {
  RequestTracker tracker(2);
  for (int round = 0; round < 3; ++round) {
    SCOPED_TRACE(round);
    const auto ticket = tracker.Open(Op::PullSparse, round);
    TicketState& p = tracker.ticket(ticket);
    EXPECT_TRUE(p.status.ok());
    EXPECT_EQ(p.outstanding, 0u);
    EXPECT_EQ(p.out, nullptr);
    EXPECT_TRUE(p.inverse.empty());
    for (const auto& r : p.replies) EXPECT_TRUE(r.empty());
    TrackedRequest& r = tracker.Track(ticket, Request(100 + round, Op::PullSparse), 1, 10ms, 2,
                                      TimePoint{});
    EXPECT_TRUE(r.kept.empty());
    EXPECT_TRUE(r.refused.ok());
    EXPECT_EQ(r.attempts, 1u);
    EXPECT_EQ(r.expect_rows, 0u);
    r.kept.emplace_back(8);
    r.attempts = 2;
    r.expect_rows = 9;
    r.refused = Unavailable("not now");
    p.inverse.assign(5, 1);
    p.replies[1].emplace_back(3);
    tracker.Fail(r, Internal("x"));
    tracker.Close(ticket);
  }
}

}  // namespace
}  // namespace parasol
