#include "worker/push_log.hpp"

#include <gtest/gtest.h>

namespace parasol {
namespace {

std::vector<zmq::message_t> Frames(size_t header, size_t payload) {
  std::vector<zmq::message_t> f;
  f.emplace_back(header);
  f.emplace_back(payload);
  return f;
}

TEST(PushLogTest, AReplyWithALargerCheckpointCountTrimsWhatWasAcknowledgedBefore) {
  PushLog log(2, 1 << 20);
  log.Add(0, 0, 9, 0, Frames(10, 100));  // acknowledged while shard 0 had written no checkpoint
  log.Add(0, 0, 9, 0, Frames(10, 100));
  log.Add(0, 1, 9, 1, Frames(10, 100));  // after its first checkpoint
  log.Add(1, 0, 9, 0, Frames(10, 50));
  EXPECT_EQ(log.bytes(), 3 * 110u + 60u);
  log.Trim(0, 9, 0, 0);  // nothing new
  EXPECT_EQ(log.entries(0), 3u);
  // A restarted process (epoch 10) that started from checkpoint 0 and has written 5 since:
  // those hold none of the old process's pushes.
  log.Trim(0, 10, 5, 0);
  EXPECT_EQ(log.entries(0), 3u);
  log.Trim(0, 9, 1, 0);  // checkpoint 1 holds the pushes acknowledged at count 0
  EXPECT_EQ(log.entries(0), 1u);
  EXPECT_EQ(log.bytes(0), 110u);
  EXPECT_EQ(log.entries(1), 1u);  // another shard's count does not touch it
  // A restarted process that started from checkpoint 2: the old process's push acknowledged at
  // count 1 is in it.
  log.Trim(0, 10, 7, 2);
  EXPECT_EQ(log.entries(0), 0u);
  EXPECT_EQ(log.bytes(), 60u);
  EXPECT_EQ(log.peak_bytes(), 3 * 110u + 60u);
}

TEST(PushLogTest, TakeEmptiesOneShardInOrder) {
  PushLog log(2, 1 << 20);
  for (int64_t c = 0; c < 4; ++c) log.Add(1, c, 9, 7, Frames(8, static_cast<size_t>(c + 1)));
  log.Add(0, 0, 9, 7, Frames(8, 8));
  std::deque<PushLog::Entry> taken = log.Take(1);
  ASSERT_EQ(taken.size(), 4u);
  for (int64_t c = 0; c < 4; ++c) {
    EXPECT_EQ(taken[c].clock, c);
    EXPECT_EQ(taken[c].frames[1].size(), static_cast<size_t>(c + 1));
  }
  EXPECT_EQ(log.entries(1), 0u);
  EXPECT_EQ(log.bytes(1), 0u);
  EXPECT_EQ(log.bytes(), 16u);
}

TEST(PushLogTest, PastItsBoundItSaysWhichShardHoldsTheMost) {
  PushLog log(3, 1000);
  log.Add(0, 0, 9, 0, Frames(0, 300));
  log.Add(2, 0, 9, 0, Frames(0, 600));
  EXPECT_TRUE(log.Check().ok());
  log.Add(2, 1, 9, 0, Frames(0, 200));
  const Status st = log.Check();
  ASSERT_EQ(st.code(), StatusCode::kResourceExhausted);
  EXPECT_NE(st.message().find("checkpoint.max_log_bytes (1000)"), std::string::npos) << st.ToString();
  EXPECT_NE(st.message().find("shard 2 holds 800"), std::string::npos) << st.ToString();
  log.Trim(2, 9, 1, 0);
  EXPECT_TRUE(log.Check().ok());
}

}  // namespace
}  // namespace parasol
