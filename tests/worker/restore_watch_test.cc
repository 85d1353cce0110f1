// The worker's watch of restoring shards (worker/restore_watch.hpp): a shard whose progress
// moves is waited for; one whose progress stopped, or whose restore outlasts
// cluster.restore_timeout, is not.
#include "worker/restore_watch.hpp"

#include <gtest/gtest.h>

namespace parasol {
namespace {

using namespace std::chrono_literals;
using TimePoint = RestoreWatch::TimePoint;

Header Loading(uint64_t done, uint64_t total = 1000) {
  Header h;
  h.status = StatusCode::kUnavailable;
  h.restore_done = done;
  h.restore_total = total;
  return h;
}

TEST(RestoreWatchTest, AShardIsWaitedForWhileItsProgressMovesAndNotOnceItStops) {
  RestoreWatch watch(2, /*request_timeout=*/1000ms, /*restore_timeout=*/60s);
  EXPECT_EQ(watch.Poll(), 500ms);
  const TimePoint t0 = TimePoint{} + 10s;
  EXPECT_FALSE(watch.Moving(0, t0));  // never heard loading
  watch.Note(0, Loading(10), t0);
  EXPECT_TRUE(watch.Moving(0, t0));
  EXPECT_FALSE(watch.Moving(1, t0));
  // Window: a time-out and two polls (2 s). The same progress again within a time-out does
  // not move it.
  watch.Note(0, Loading(10), t0 + 900ms);
  EXPECT_TRUE(watch.Moving(0, t0 + 2000ms));
  EXPECT_FALSE(watch.Moving(0, t0 + 2001ms));
  // Progress again: waited for again.
  watch.Note(0, Loading(20), t0 + 2500ms);
  EXPECT_TRUE(watch.Moving(0, t0 + 4000ms));
  // Not heard for longer than the window: silent.
  EXPECT_FALSE(watch.Moving(0, t0 + 4501ms));
  watch.Loaded(0);
  EXPECT_FALSE(watch.Moving(0, t0 + 2500ms));
  EXPECT_EQ(watch.progress(0).heard, TimePoint{});
}

TEST(RestoreWatchTest, ARestoreThatOutlastsTheRestoreTimeoutIsNoLongerWaitedFor) {
  RestoreWatch watch(1, 1000ms, /*restore_timeout=*/5s);
  const TimePoint t0 = TimePoint{} + 1s;
  for (int i = 0; i <= 10; ++i) watch.Note(0, Loading(i), t0 + i * 500ms);
  EXPECT_TRUE(watch.Moving(0, t0 + 5000ms));
  EXPECT_FALSE(watch.Moving(0, t0 + 5001ms));
}

TEST(RestoreWatchTest, ItLogsAtMostEveryFiveSecondsAndPollsWithinItsBounds) {
  RestoreWatch watch(1, 1000ms, 60s);
  const TimePoint t0 = TimePoint{} + 100s;
  EXPECT_TRUE(watch.Note(0, Loading(1), t0));
  EXPECT_FALSE(watch.Note(0, Loading(2), t0 + 4s));
  EXPECT_TRUE(watch.Note(0, Loading(3), t0 + 5s));
  EXPECT_EQ(RestoreWatch(1, 4ms, 1s).Poll(), 10ms);
  EXPECT_EQ(RestoreWatch(1, 30s, 1s).Poll(), 1000ms);
  EXPECT_EQ(watch.progress(0).done, 3u);
  EXPECT_EQ(watch.progress(0).total, 1000u);
}

}  // namespace
}  // namespace parasol
