#include "common/key_index.hpp"

#include <gtest/gtest.h>

#include <random>
#include <unordered_map>

namespace parasol {
namespace {

TEST(KeyIndexTest, MatchesAStandardMapUnderRandomInsertsAndLookups) {
  KeyIndex index(4);
  std::unordered_map<uint64_t, uint32_t> ref;
  std::mt19937_64 rng(3);
  for (int i = 0; i < 200000; ++i) {
    const uint64_t key = rng() % 50000;
    bool inserted = false;
    const uint32_t slot = index.FindOrInsert(key, static_cast<uint32_t>(ref.size()), &inserted);
    auto [it, fresh] = ref.try_emplace(key, static_cast<uint32_t>(ref.size()));
    ASSERT_EQ(inserted, fresh);
    ASSERT_EQ(slot, it->second);
  }
  EXPECT_EQ(index.size(), ref.size());
  for (const auto& [k, v] : ref) EXPECT_EQ(index.Find(k), v);
  EXPECT_EQ(index.Find(1ull << 50), KeyIndex::kAbsent);
}

TEST(KeyIndexTest, ExtremeKeysAreOrdinaryKeys) {
  KeyIndex index;
  bool inserted = false;
  index.FindOrInsert(0, 10, &inserted);
  index.FindOrInsert(~0ull, 11, &inserted);
  EXPECT_EQ(index.Find(0), 10u);
  EXPECT_EQ(index.Find(~0ull), 11u);
  EXPECT_EQ(index.size(), 2u);
}

TEST(KeyIndexTest, ClearKeepsCapacityAndForgetsKeys) {
  KeyIndex index(1000);
  bool inserted = false;
  for (uint64_t k = 0; k < 500; ++k) index.FindOrInsert(k, static_cast<uint32_t>(k), &inserted);
  const size_t cap = index.capacity();
  index.Clear();
  EXPECT_EQ(index.size(), 0u);
  EXPECT_EQ(index.capacity(), cap);
  EXPECT_EQ(index.Find(3), KeyIndex::kAbsent);
}

}  // namespace
}  // namespace parasol

namespace parasol {
namespace {

TEST(KeyIndexTest, EraseKeepsEveryOtherKeyFindable) {
  KeyIndex index(8);
  std::unordered_map<uint64_t, uint32_t> ref;
  std::mt19937_64 rng(5);
  for (int i = 0; i < 100000; ++i) {
    const uint64_t key = rng() % 3000;
    if (rng() % 3 == 0) {
      const uint32_t slot = index.Erase(key);
      auto it = ref.find(key);
      ASSERT_EQ(slot, it == ref.end() ? KeyIndex::kAbsent : it->second);
      if (it != ref.end()) ref.erase(it);
    } else {
      bool inserted = false;
      index.FindOrInsert(key, static_cast<uint32_t>(i), &inserted);
      if (inserted) ref[key] = static_cast<uint32_t>(i);
    }
  }
  ASSERT_EQ(index.size(), ref.size());
  for (const auto& [k, v] : ref) ASSERT_EQ(index.Find(k), v);
  for (uint64_t k = 0; k < 3000; ++k) {
    if (!ref.count(k)) {
      ASSERT_EQ(index.Find(k), KeyIndex::kAbsent);
    }
  }
}

TEST(KeyIndexTest, UpdateChangesOnlyPresentKeys) {
  KeyIndex index;
  bool inserted = false;
  index.FindOrInsert(9, 1, &inserted);
  EXPECT_TRUE(index.Update(9, 5));
  EXPECT_EQ(index.Find(9), 5u);
  EXPECT_FALSE(index.Update(10, 5));
}

}  // namespace
}  // namespace parasol
