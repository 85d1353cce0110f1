// A checkpoint's rows restore with a bounded number of index probes per row, whatever order the
// file gives them in: sequential keys, the bucket order of another table (which is how a
// checkpoint is written), keys chosen to share their low hash bits. Probes are counted, not
// timed. A control shows the count is sensitive: the same keys in an index without a seed pile
// up into long runs.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <thread>
#include <vector>

#include "common/hash.hpp"
#include "common/sharding.hpp"
#include "common/slot_index.hpp"
#include "server/checkpoint.hpp"
#include "tests/support/small_shard.hpp"
#include "tests/support/temp_dir.hpp"

namespace parasol {
namespace {

using testing::SmallShard;

constexpr const char* kManifest = testing::kOneTableManifest;

// The inverse of Fmix64 (MurmurHash3's finaliser is a bijection).
uint64_t InverseFmix64(uint64_t k) {
  k ^= k >> 33;
  k *= 0x9cb4b2f8129337dbULL;
  k ^= k >> 33;
  k *= 0x4f74430c22a54005ULL;
  k ^= k >> 33;
  return k;
}

// `n` keys whose unseeded bucket hash has its low 20 bits zero.
std::vector<uint64_t> KeysSharingLowHashBits(uint64_t n) {
  std::vector<uint64_t> keys;
  for (uint64_t i = 1; i <= n; ++i) keys.push_back(InverseFmix64(i << 20));
  return keys;
}

class RestoreOrderTest : public testing::TempDirTest {
 protected:

  // Fills a shard with `keys` (in that order), saves it, loads it into a fresh shard on two
  // engine threads, and returns the loaded shard's index probes per row.
  double ProbesPerRestoredRow(const std::vector<uint64_t>& keys) {
    SmallShard source(kManifest);
    SparseTable& table = source.sparse(0);
    for (uint64_t key : keys) {
      table.partition(EngineOfKey(key, table.engines())).FindOrCreate(key, 1);
    }
    CheckpointHeader h;
    h.shard = 0;
    h.shards = 1;
    h.fingerprint = source.manifest().Fingerprint();
    h.sequence = 1;
    const std::string path = dir_ + "/ckpt.bin";
    auto blocks = source.state().Save();
    EXPECT_TRUE(blocks.ok());
    EXPECT_TRUE(WriteCheckpointFile(path, h, *blocks).ok());

    SmallShard loaded(kManifest);
    loaded.state().set_engine_runner([](const std::function<void(uint32_t)>& fn) {
      std::vector<std::thread> threads;
      for (uint32_t e = 0; e < 2; ++e) threads.emplace_back(fn, e);
      for (auto& t : threads) t.join();
    });
    ShardState::LoadProgress progress;
    loaded.state().set_progress(&progress);
    std::ifstream in(path, std::ios::binary);
    CheckpointHeader got;
    const Status st = loaded.state().Load(in, path, &got);
    EXPECT_TRUE(st.ok()) << st.ToString();
    SparseTable& restored = loaded.sparse(0);
    EXPECT_EQ(restored.TotalRows(), keys.size());
    EXPECT_EQ(progress.rows_total.load(), keys.size());
    EXPECT_EQ(progress.rows_done.load(), keys.size());
    EXPECT_EQ(progress.bytes_done.load(),
              2 * (std::filesystem::file_size(path) - kCheckpointHeaderBytes -
                   kCheckpointFooterBytes));
    // Every row is back with its values.
    for (size_t i = 0; i < keys.size(); i += 997) {
      const uint64_t key = keys[i];
      const float* a = table.partition(EngineOfKey(key, 2)).Find(key);
      const float* b = restored.partition(EngineOfKey(key, 2)).Find(key);
      EXPECT_NE(b, nullptr);
      if (a && b) { EXPECT_EQ(std::memcmp(a, b, 17 * sizeof(float)), 0) << "key " << key; }
    }
    uint64_t probes = 0;
    for (uint32_t e = 0; e < restored.engines(); ++e) {
      probes += restored.partition(e).index_insert_probes();
    }
    const double per_row = static_cast<double>(probes) / static_cast<double>(keys.size());
    std::printf("%zu rows restored with %.2f probes per row\n", keys.size(), per_row);
    return per_row;
  }

};

// Linear probing at a load of at most 0.7 averages about 2.2 probes per insert; 4 leaves
// room for chance, and none for clustering (which costs thousands per row at this size).
constexpr double kMaxProbesPerRow = 4.0;
constexpr uint64_t kRows = 200000;

TEST_F(RestoreOrderTest, SequentialKeys) {
  std::vector<uint64_t> keys;
  for (uint64_t k = 0; k < kRows; ++k) keys.push_back(k);
  EXPECT_LE(ProbesPerRestoredRow(keys), kMaxProbesPerRow);
}

TEST_F(RestoreOrderTest, KeysInAnotherTablesBucketOrder) {
  // Checkpoints were written in their index's bucket order, by a hash without a seed: the
  // keys of a full table of 2^18 buckets, in that order, fill a table whose index is smaller
  // while it grows (the order that made restores quadratic).
  std::vector<uint64_t> keys;
  for (uint64_t k = 0; k < kRows; ++k) keys.push_back(SplitMix64(k));
  const uint64_t mask = (uint64_t{1} << 18) - 1;
  std::stable_sort(keys.begin(), keys.end(), [&](uint64_t a, uint64_t b) {
    return (Fmix64(a) & mask) < (Fmix64(b) & mask);
  });
  EXPECT_LE(ProbesPerRestoredRow(keys), kMaxProbesPerRow);
}

TEST_F(RestoreOrderTest, KeysSharingTheirLowHashBits) {
  const std::vector<uint64_t> keys = KeysSharingLowHashBits(kRows);
  for (uint64_t k : {keys[0], keys[kRows / 2], keys.back()}) {
    ASSERT_EQ(Fmix64(k) & ((1u << 20) - 1), 0u);
  }
  EXPECT_LE(ProbesPerRestoredRow(keys), kMaxProbesPerRow);
}

TEST_F(RestoreOrderTest, TheProbeCountSeesClusteringInAnUnseededIndex) {
  // The control: 20,000 of the same keys in an index hashing without a seed all share a home
  // bucket region, and their inserts probe long runs.
  const std::vector<uint64_t> keys = KeysSharingLowHashBits(20000);
  SlotIndex index(keys.size(), /*seed=*/0);
  auto key_of = [&](uint32_t slot) { return keys[slot]; };
  for (uint32_t i = 0; i < keys.size(); ++i) {
    bool inserted = false;
    index.FindOrInsert(keys[i], i, key_of, &inserted);
    ASSERT_TRUE(inserted);
  }
  EXPECT_GT(static_cast<double>(index.insert_probes()) / keys.size(), 1000.0);
  // The same keys with a random seed, as tables have them.
  SlotIndex seeded(keys.size(), RandomIndexSeed());
  for (uint32_t i = 0; i < keys.size(); ++i) {
    bool inserted = false;
    seeded.FindOrInsert(keys[i], i, key_of, &inserted);
  }
  EXPECT_LE(static_cast<double>(seeded.insert_probes()) / keys.size(), kMaxProbesPerRow);
}

TEST(RandomIndexSeedTest, EveryCallDiffers) {
  const uint64_t a = RandomIndexSeed(), b = RandomIndexSeed();
  EXPECT_NE(a, b);
}

}  // namespace
}  // namespace parasol
