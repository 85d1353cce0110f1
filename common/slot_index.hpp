// SlotIndex: an open-addressing hash index from uint64 key to uint32 slot that stores only
// the slots, with linear probing.
//
// The key lives beside what the slot names (a sparse table keeps its rows' keys in an array
// beside each block of rows), so a bucket costs 4 bytes instead of KeyIndex's 12; every method
// that compares or moves entries takes `key_of`, a callable returning the key stored for a
// slot. The price: a lookup reads the key of each slot it probes, a memory access of its own
// (KeyIndex finds the next bucket's key in the same cache line), so probe runs and lookups of
// absent keys cost more, and growth reads every key. A hit in its home bucket, the common case
// at load <= 0.7, costs what it did when the caller prefetches the key (HomeSlot()).
// REQUIRES of the caller: key_of(slot) returns the key a slot was inserted with for as long as
// the slot is in the index. Every key value is valid, including 0 and ~0.
// Thread-safety: none; one owner at a time.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "common/hash.hpp"
#include "common/key_index.hpp"

namespace parasol {

class SlotIndex {
 public:
  static constexpr uint32_t kAbsent = 0xffffffffu;

  explicit SlotIndex(size_t expected = 16) { Reset(expected); }

  // Removes every key and sizes the index for `expected` keys without further growth.
  void Reset(size_t expected) {
    const size_t cap = KeyIndex::CapacityFor(expected);
    slots_.assign(cap, kAbsent);
    mask_ = cap - 1;
    size_ = 0;
  }

  // Grows (doubling, keeping every key) until `expected` keys fit at load factor <= 0.7.
  template <typename KeyOf>
  void Reserve(size_t expected, KeyOf&& key_of) {
    while (slots_.size() * 7 < expected * 10) Grow(key_of);
  }

  size_t size() const { return size_; }
  size_t buckets() const { return slots_.size(); }
  size_t MemoryBytes() const { return slots_.capacity() * sizeof(uint32_t); }

  // Starts loading the bucket where `key` lives, for a lookup a few iterations later.
  void Prefetch(uint64_t key) const { __builtin_prefetch(&slots_[Bucket(key)]); }
  // The slot in `key`'s home bucket (the key's own slot when it sits there, which is the
  // common case), or kAbsent: for prefetching the key's row without comparing keys.
  uint32_t HomeSlot(uint64_t key) const { return slots_[Bucket(key)]; }

  // Returns the slot of `key`, or kAbsent.
  template <typename KeyOf>
  uint32_t Find(uint64_t key, KeyOf&& key_of) const {
    for (size_t i = Bucket(key);; i = (i + 1) & mask_) {
      const uint32_t slot = slots_[i];
      if (slot == kAbsent || key_of(slot) == key) return slot;
    }
  }

  // Returns the slot of `key`; when absent, inserts `slot_if_new` and sets *inserted.
  // REQUIRES: slot_if_new != kAbsent, key_of(slot_if_new) == key.
  template <typename KeyOf>
  uint32_t FindOrInsert(uint64_t key, uint32_t slot_if_new, KeyOf&& key_of, bool* inserted) {
    if ((size_ + 1) * 10 > slots_.size() * 7) Grow(key_of);
    for (size_t i = Bucket(key);; i = (i + 1) & mask_) {
      const uint32_t slot = slots_[i];
      if (slot == kAbsent) {
        slots_[i] = slot_if_new;
        ++size_;
        *inserted = true;
        return slot_if_new;
      }
      if (key_of(slot) == key) {
        *inserted = false;
        return slot;
      }
    }
  }

  // Removes `key` (backward-shift deletion: no tombstones, lookups stay short). Returns its
  // slot, or kAbsent.
  template <typename KeyOf>
  uint32_t Erase(uint64_t key, KeyOf&& key_of) {
    size_t i = Bucket(key);
    while (true) {
      if (slots_[i] == kAbsent) return kAbsent;
      if (key_of(slots_[i]) == key) break;
      i = (i + 1) & mask_;
    }
    const uint32_t slot = slots_[i];
    EraseBucket(i, key_of);
    return slot;
  }

  // Bucket-level access for sweeps: a bucket is empty or holds a slot.
  bool BucketFull(size_t b) const { return slots_[b] != kAbsent; }
  uint32_t BucketSlot(size_t b) const { return slots_[b]; }
  // Empties bucket b; a later entry may move into b, so a sweep looks at b again.
  template <typename KeyOf>
  void EraseBucket(size_t i, KeyOf&& key_of) {
    slots_[i] = kAbsent;
    --size_;
    for (size_t j = (i + 1) & mask_; slots_[j] != kAbsent; j = (j + 1) & mask_) {
      const size_t home = Bucket(key_of(slots_[j]));
      // Move j back to i unless its home lies cyclically in (i, j].
      const bool home_between = i <= j ? (home > i && home <= j) : (home > i || home <= j);
      if (home_between) continue;
      slots_[i] = slots_[j];
      slots_[j] = kAbsent;
      i = j;
    }
  }

 private:
  size_t Bucket(uint64_t key) const { return Fmix64(key) & mask_; }

  template <typename KeyOf>
  void Grow(KeyOf&& key_of) {
    std::vector<uint32_t> old = std::move(slots_);
    slots_.assign(old.size() * 2, kAbsent);
    mask_ = slots_.size() - 1;
    for (uint32_t slot : old) {
      if (slot == kAbsent) continue;
      size_t i = Bucket(key_of(slot));
      while (slots_[i] != kAbsent) i = (i + 1) & mask_;
      slots_[i] = slot;
    }
  }

  std::vector<uint32_t> slots_;
  size_t mask_ = 0;
  size_t size_ = 0;
};

}  // namespace parasol
