#include "worker/row_cache.hpp"

#include <gtest/gtest.h>

namespace parasol {
namespace {

TEST(RowCacheTest, ARowAnswersUpToItsClockOnly) {
  RowCache c(10);
  const float row[2] = {1.5f, -2.0f};
  c.Insert(0, 42, row, 2, /*valid_until=*/5);
  float out[2] = {0, 0};
  EXPECT_TRUE(c.Lookup(0, 42, 5, out, 2));
  EXPECT_EQ(out[0], 1.5f);
  EXPECT_EQ(out[1], -2.0f);
  EXPECT_FALSE(c.Lookup(0, 42, 6, out, 2));  // past the bound: pull again
  EXPECT_FALSE(c.Lookup(1, 42, 0, out, 2));  // another table
  EXPECT_FALSE(c.Lookup(0, 42, 0, out, 3));  // another row size
  ASSERT_NE(c.Find(0, 42), nullptr);
  c.Find(0, 42)[0] = 7.0f;  // the worker's own push
  EXPECT_TRUE(c.Lookup(0, 42, 1, out, 2));
  EXPECT_EQ(out[0], 7.0f);
  c.Erase(0, 42);
  EXPECT_EQ(c.Find(0, 42), nullptr);
  EXPECT_EQ(c.size(), 0u);
}

TEST(RowCacheTest, TheLeastRecentlyUsedRowGoesFirst) {
  RowCache c(3);
  const float row[1] = {1};
  float out[1];
  for (uint64_t k = 0; k < 3; ++k) c.Insert(0, k, row, 1, 100);
  EXPECT_TRUE(c.Lookup(0, 0, 0, out, 1));  // 0 is now the most recent; 1 the least
  c.Insert(0, 3, row, 1, 100);
  EXPECT_EQ(c.size(), 3u);
  EXPECT_EQ(c.Find(0, 1), nullptr);
  EXPECT_NE(c.Find(0, 0), nullptr);
  EXPECT_NE(c.Find(0, 2), nullptr);
  EXPECT_NE(c.Find(0, 3), nullptr);
  RowCache off(0);
  off.Insert(0, 1, row, 1, 100);
  EXPECT_EQ(off.size(), 0u);
}

}  // namespace
}  // namespace parasol
