// Checkpoints every checkpoint.every_steps: one at each multiple of the clock, on every shard,
// however the ticks arrive. A rollback looks for a clock every shard holds, so a shard that
// skips a multiple (its loop drained the ticks of several clocks between two polls) leaves the
// job an older one, or none.
#include <gtest/gtest.h>

#include <set>
#include <string>
#include <vector>

#include "server/checkpoint.hpp"
#include "tests/support/in_process_shard.hpp"
#include "tests/support/temp_dir.hpp"

namespace parasol {
namespace {

class StepCheckpointTest : public testing::TempDirTest {};

// Two workers' pushes and ticks for clocks 0..10, handed to the shard one message after the
// other with no poll between them (as a loop that drains a burst does): checkpoints at clocks
// 2, 4, 6, 8 and 10, each holding that clock, and none at any other clock.
TEST_F(StepCheckpointTest, ABurstOfTicksGetsACheckpointAtEveryMultiple) {
  testing::InProcessShard shard(
      "cluster:\n  servers: [127.0.0.1:1]\n  workers: 2\n"
      "training: {consistency: bsp}\n"
      "checkpoint: {dir: " + dir_ + ", every_steps: 2, keep: 100}\n"
      "tables:\n"
      "  - {name: e, kind: sparse, dim: 4, optimizer: {kind: sgd, lr: 1.0}}\n",
      "steps");
  const std::vector<uint64_t> keys = {1, 2, 3};
  for (int64_t c = 0; c < 10; ++c) {
    for (uint32_t w = 0; w < 2; ++w) {
      ASSERT_TRUE(shard.Answered(shard.Push(0, c, keys, w)));
      ASSERT_TRUE(shard.Answered(shard.Tick(c + 1, w)));
    }
  }
  std::multiset<int64_t> clocks;
  for (const std::string& path : ListCheckpoints(dir_, 0)) {
    Result<CheckpointHeader> h = ReadCheckpointHeader(path);
    ASSERT_TRUE(h.ok()) << path << ": " << h.status().ToString();
    clocks.insert(h->clock);
  }
  EXPECT_EQ(clocks, (std::multiset<int64_t>{2, 4, 6, 8, 10}));
  EXPECT_EQ(shard.Stat("checkpoints"), 5u);
}

}  // namespace
}  // namespace parasol
