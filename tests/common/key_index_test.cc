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

#include <algorithm>
#include <map>

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
    if (!ref.count(k)) { ASSERT_EQ(index.Find(k, key_of), SlotIndex::kAbsent) << k; }
    if (!ref.count(~k)) { ASSERT_EQ(index.Find(~k, key_of), SlotIndex::kAbsent) << ~k; }
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

// Build() (a restore's bulk fill) against a standard map, over keys repeated up to three
// times, keys crowding a few home buckets, and keys whose runs pass the last bucket: every key
// keeps its highest slot, every other slot is dropped exactly once.
TEST(SlotIndexTest, BuildKeepsEachKeysLastSlotAndDropsTheRest) {
  size_t wrapped_rounds = 0, crowded_dropped = 0;
  for (uint32_t round = 0; round < 40; ++round) {
    std::mt19937_64 rng(1000 + round);
    const size_t distinct = 64 + rng() % 20000;
    SlotIndex index(distinct + 200, rng());
    std::vector<uint64_t> slot_keys;
    auto add = [&](uint64_t key) {
      const int copies = rng() % 3 == 0 ? 2 + static_cast<int>(rng() % 2) : 1;
      for (int c = 0; c < copies; ++c) slot_keys.push_back(key);
    };
    for (size_t i = 0; i < distinct; ++i) {
      // Some keys small (0 and ~0 among them): they also repeat by chance.
      add(rng() % 5 == 0 ? (rng() % 2 ? rng() % 64 : ~(rng() % 64)) : rng());
    }
    // Keys homed in the last 4 buckets (their runs wrap) and in 4 buckets mid-table.
    const size_t buckets = index.buckets();
    for (int tries = 0, found = 0; tries < 4000000 && found < 100; ++tries) {
      const uint64_t key = rng();
      const size_t home = index.HomeBucket(key);
      if (home + 4 >= buckets || (home >= buckets / 2 && home < buckets / 2 + 4)) {
        add(key);
        ++found;
      }
    }
    std::shuffle(slot_keys.begin(), slot_keys.end(), rng);
    auto key_of = [&](uint32_t slot) { return slot_keys.at(slot); };
    std::map<uint64_t, uint32_t> last;
    for (uint32_t s = 0; s < slot_keys.size(); ++s) last[slot_keys[s]] = s;
    ASSERT_LE(last.size() * 10, buckets * 7) << "round " << round;
    std::vector<uint32_t> dropped;
    index.Build(static_cast<uint32_t>(slot_keys.size()), key_of, &dropped);
    ASSERT_EQ(index.size(), last.size()) << "round " << round;
    for (const auto& [key, slot] : last) ASSERT_EQ(index.Find(key, key_of), slot) << key;
    std::vector<uint32_t> all = dropped;
    for (const auto& [key, slot] : last) all.push_back(slot);
    std::sort(all.begin(), all.end());
    ASSERT_EQ(all.size(), slot_keys.size()) << "round " << round;
    for (uint32_t s = 0; s < all.size(); ++s) ASSERT_EQ(all[s], s) << "round " << round;
    // Did runs wrap: a key of the index sits in a bucket before its home.
    bool wrapped = false;
    for (size_t b = 0; b < 8 && !wrapped; ++b) {
      wrapped = index.BucketFull(b) && index.HomeBucket(key_of(index.BucketSlot(b))) > b;
    }
    wrapped_rounds += wrapped;
    crowded_dropped += dropped.size();
  }
  EXPECT_GE(wrapped_rounds, 20u);  // the end's crowd made runs wrap in most rounds
  EXPECT_GT(crowded_dropped, 1000u);
}

// An index of 2^25 buckets (two passes within each chunk), few keys, some twice.
TEST(SlotIndexTest, BuildOfALargeIndexSortsInTwoPassesPerChunk) {
  std::mt19937_64 rng(5);
  SlotIndex index(size_t{1} << 24, rng());
  ASSERT_EQ(index.buckets(), size_t{1} << 25);
  std::vector<uint64_t> slot_keys;
  for (int i = 0; i < 200000; ++i) {
    const uint64_t key = rng();
    slot_keys.push_back(key);
    if (i % 7 == 0) slot_keys.push_back(key);
  }
  std::shuffle(slot_keys.begin(), slot_keys.end(), rng);
  auto key_of = [&](uint32_t slot) { return slot_keys.at(slot); };
  std::map<uint64_t, uint32_t> last;
  for (uint32_t s = 0; s < slot_keys.size(); ++s) last[slot_keys[s]] = s;
  std::vector<uint32_t> dropped;
  index.Build(static_cast<uint32_t>(slot_keys.size()), key_of, &dropped);
  ASSERT_EQ(index.buckets(), size_t{1} << 25);
  ASSERT_EQ(index.size(), last.size());
  ASSERT_EQ(dropped.size(), slot_keys.size() - last.size());
  for (const auto& [key, slot] : last) ASSERT_EQ(index.Find(key, key_of), slot) << key;
  // Bucket order: every key sits at or after its home, with no empty bucket between.
  for (size_t b = 0; b < index.buckets(); ++b) {
    if (!index.BucketFull(b)) continue;
    const size_t home = index.HomeBucket(key_of(index.BucketSlot(b)));
    ASSERT_LE(home, b);
    for (size_t p = home; p < b; ++p) ASSERT_TRUE(index.BucketFull(p)) << b;
  }
}


}  // namespace
}  // namespace parasol
