#include "server/push_dedup.hpp"

#include <gtest/gtest.h>

namespace parasol {
namespace {

TEST(PushDedupTest, APushIsSeenOnlyAfterItIsMarked) {
  PushDedup d;
  EXPECT_FALSE(d.Seen(1, 100, 5));
  d.Mark(1, 100, 5);
  EXPECT_TRUE(d.Seen(1, 100, 5));
  EXPECT_FALSE(d.Seen(1, 100, 6));
  EXPECT_FALSE(d.Seen(2, 100, 5));  // another worker
}

TEST(PushDedupTest, OutOfOrderSequencesAreTrackedOneByOne) {
  PushDedup d;
  d.Mark(0, 1, 10);
  d.Mark(0, 1, 7);
  EXPECT_TRUE(d.Seen(0, 1, 7));
  EXPECT_FALSE(d.Seen(0, 1, 8));
  EXPECT_FALSE(d.Seen(0, 1, 9));
  EXPECT_TRUE(d.Seen(0, 1, 10));
}

TEST(PushDedupTest, ANewIncarnationStartsAfresh) {
  PushDedup d;
  d.Mark(3, 111, 1);
  EXPECT_TRUE(d.Seen(3, 111, 1));
  EXPECT_FALSE(d.Seen(3, 222, 1));  // the worker restarted: seq 1 is a new push
  d.Mark(3, 222, 1);
  EXPECT_TRUE(d.Seen(3, 222, 1));
}

TEST(PushDedupTest, WindowSlidesAndTreatsVeryOldPushesAsSeen) {
  PushDedup d(128);
  d.Mark(0, 1, 5);
  d.Mark(0, 1, 1000);  // window is now [873, 1001)
  EXPECT_TRUE(d.Seen(0, 1, 5));      // below the window: refused as a resend
  EXPECT_TRUE(d.Seen(0, 1, 800));    // below the window
  EXPECT_FALSE(d.Seen(0, 1, 900));   // inside, never marked
  EXPECT_TRUE(d.Seen(0, 1, 1000));
  // A bit left over from before the slide must not leak into the new window.
  d.Mark(0, 1, 1000 + 128 * 10 + 5);
  EXPECT_FALSE(d.Seen(0, 1, 1000 + 128 * 10 + 5 - 128 + 1));
}

}  // namespace
}  // namespace parasol
