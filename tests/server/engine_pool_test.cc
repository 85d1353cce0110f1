#include "server/engine_pool.hpp"

#include <gtest/gtest.h>

#include <atomic>
#include <set>
#include <thread>
#include <vector>

namespace parasol {
namespace {

TEST(EnginePoolTest, EveryEngineRunsOncePerCallOnItsOwnThread) {
  EnginePool pool(4);
  for (int round = 0; round < 200; ++round) {
    std::vector<int> ran(4, 0);
    std::vector<std::thread::id> ids(4);
    pool.RunOnAll([&](uint32_t e) {
      ran[e]++;
      ids[e] = std::this_thread::get_id();
    });
    EXPECT_EQ(ran, std::vector<int>(4, 1));
    std::set<std::thread::id> distinct(ids.begin(), ids.end());
    EXPECT_EQ(distinct.size(), 4u);
    EXPECT_EQ(distinct.count(std::this_thread::get_id()), 0u);
  }
}

TEST(EnginePoolTest, InlineRunsOnTheCaller) {
  EnginePool pool(3);
  std::vector<std::thread::id> ids(3);
  pool.RunOnAll([&](uint32_t e) { ids[e] = std::this_thread::get_id(); }, /*run_inline=*/true);
  for (auto id : ids) EXPECT_EQ(id, std::this_thread::get_id());
}

}  // namespace
}  // namespace parasol
