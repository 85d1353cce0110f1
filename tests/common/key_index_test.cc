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

#include "common/slot_index.hpp"

namespace parasol {
namespace {

// SlotIndex against a standard map, with the keys kept beside the slots as a table keeps them
// (a slot freed by an erase is reused by a later insert), through inserts, lookups, erases by
// key and by bucket, and growth from the smallest size.
TEST(SlotIndexTest, MatchesAStandardMapWithKeysBesideTheSlots) {
  SlotIndex index(1);
  std::vector<uint64_t> slot_keys;
  std::vector<uint32_t> free_slots;
  auto key_of = [&](uint32_t slot) { return slot_keys.at(slot); };
  std::unordered_map<uint64_t, uint32_t> ref;
  std::mt19937_64 rng(11);
  size_t grew_to = index.buckets();
  for (int i = 0; i < 300000; ++i) {
    // Keys 0 and ~0 among them, and a range small enough to repeat.
    const uint64_t key = rng() % 5 == 0 ? ~(rng() % 4000) : rng() % 4000;
    const int op = static_cast<int>(rng() % 7);
    if (op == 0) {
      const uint32_t slot = index.Erase(key, key_of);
      auto it = ref.find(key);
      ASSERT_EQ(slot, it == ref.end() ? SlotIndex::kAbsent : it->second) << "erase " << key;
      if (it != ref.end()) {
        free_slots.push_back(it->second);
        ref.erase(it);
      }
    } else if (op == 1 && index.size() > 0) {
      // A sweep's erase: the first full bucket from a random one.
      size_t b = rng() % index.buckets();
      while (!index.BucketFull(b)) b = (b + 1) % index.buckets();
      const uint32_t slot = index.BucketSlot(b);
      ASSERT_EQ(ref.at(slot_keys[slot]), slot);
      ref.erase(slot_keys[slot]);
      free_slots.push_back(slot);
      index.EraseBucket(b, key_of);
    } else {
      uint32_t slot;
      if (free_slots.empty()) {
        slot = static_cast<uint32_t>(slot_keys.size());
        slot_keys.push_back(key);
      } else {
        slot = free_slots.back();
      }
      const uint64_t before = slot_keys[slot];
      slot_keys[slot] = key;
      bool inserted = false;
      const uint32_t got = index.FindOrInsert(key, slot, key_of, &inserted);
      auto [it, fresh] = ref.try_emplace(key, slot);
      ASSERT_EQ(inserted, fresh) << "insert " << key;
      ASSERT_EQ(got, it->second);
      if (fresh) {
        if (!free_slots.empty() && free_slots.back() == slot) free_slots.pop_back();
      } else if (!free_slots.empty() && free_slots.back() == slot) {
        slot_keys[slot] = before;  // not taken: the free slot keeps its old key
      }
    }
    grew_to = std::max(grew_to, index.buckets());
    ASSERT_EQ(index.size(), ref.size());
  }
  EXPECT_GE(grew_to, 2048u);  // it grew many times
  for (const auto& [k, v] : ref) ASSERT_EQ(index.Find(k, key_of), v) << k;
  for (uint64_t k = 0; k < 4000; ++k) {
    if (!ref.count(k)) ASSERT_EQ(index.Find(k, key_of), SlotIndex::kAbsent) << k;
    if (!ref.count(~k)) ASSERT_EQ(index.Find(~k, key_of), SlotIndex::kAbsent) << ~k;
  }
  // Every full bucket holds a slot of the map, once.
  size_t full = 0;
  for (size_t b = 0; b < index.buckets(); ++b) {
    if (!index.BucketFull(b)) continue;
    ++full;
    ASSERT_EQ(ref.at(slot_keys[index.BucketSlot(b)]), index.BucketSlot(b));
  }
  EXPECT_EQ(full, ref.size());
}

TEST(SlotIndexTest, ReserveKeepsEveryKeyAndCostsFourBytesABucket) {
  SlotIndex index;
  std::vector<uint64_t> slot_keys;
  auto key_of = [&](uint32_t slot) { return slot_keys[slot]; };
  for (uint64_t k = 0; k < 1000; ++k) {
    slot_keys.push_back(k * 0x9E3779B97F4A7C15ull);
    bool inserted = false;
    index.FindOrInsert(slot_keys.back(), static_cast<uint32_t>(k), key_of, &inserted);
    ASSERT_TRUE(inserted);
  }
  index.Reserve(100000, key_of);
  EXPECT_GE(index.buckets() * 7, 100000u * 10);
  EXPECT_EQ(index.MemoryBytes(), index.buckets() * sizeof(uint32_t));
  for (uint64_t k = 0; k < 1000; ++k) EXPECT_EQ(index.Find(slot_keys[k], key_of), k);
}

}  // namespace
}  // namespace parasol
