// KeyIndex: an open-addressing hash map from uint64 key to uint32 slot, with linear probing.
//
// Used where std::unordered_map would allocate a node per key: deduplicating a batch's keys
// on the worker and mapping keys to row slots in the server's sparse tables. Every key value
// is valid, including 0 and ~0 (an occupied bit per bucket tells empty from full).
// Thread-safety: none; one owner at a time.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "common/hash.hpp"

namespace parasol {

class KeyIndex {
 public:
  static constexpr uint32_t kAbsent = 0xffffffffu;

  explicit KeyIndex(size_t expected = 16) { Reset(expected); }

  // Buckets for `expected` keys at a load factor of at most 0.7 (a power of two, at least 16).
  static size_t CapacityFor(size_t expected) {
    size_t cap = 16;
    while (cap * 7 < expected * 10) cap <<= 1;
    return cap;
  }

  // Removes every key and sizes the table for `expected` keys without further growth.
  void Reset(size_t expected) {
    const size_t cap = CapacityFor(expected);
    keys_.assign(cap, 0);
    slots_.assign(cap, kAbsent);
    mask_ = cap - 1;
    size_ = 0;
  }

  // Grows (doubling, keeping every key) until `expected` keys fit at load factor <= 0.7.
  void Reserve(size_t expected) {
    while (keys_.size() * 7 < expected * 10) Grow();
  }

  // Removes every key, keeping the capacity (no allocation).
  void Clear() {
    std::fill(slots_.begin(), slots_.end(), kAbsent);
    size_ = 0;
  }

  size_t size() const { return size_; }
  size_t capacity() const { return keys_.size(); }
  size_t MemoryBytes() const {
    return keys_.capacity() * sizeof(uint64_t) + slots_.capacity() * sizeof(uint32_t);
  }

  // Starts loading the bucket where `key` lives, for a lookup a few iterations later.
  void Prefetch(uint64_t key) const {
    const size_t b = Bucket(key);
    __builtin_prefetch(&keys_[b]);
    __builtin_prefetch(&slots_[b]);
  }

  // Returns the slot of `key`, or kAbsent.
  uint32_t Find(uint64_t key) const {
    for (size_t i = Bucket(key);; i = (i + 1) & mask_) {
      if (slots_[i] == kAbsent) return kAbsent;
      if (keys_[i] == key) return slots_[i];
    }
  }

  // Returns the slot of `key`; when absent, inserts it with `slot_if_new` and sets *inserted.
  // REQUIRES: slot_if_new != kAbsent.
  uint32_t FindOrInsert(uint64_t key, uint32_t slot_if_new, bool* inserted) {
    if ((size_ + 1) * 10 > keys_.size() * 7) Grow();
    for (size_t i = Bucket(key);; i = (i + 1) & mask_) {
      if (slots_[i] == kAbsent) {
        keys_[i] = key;
        slots_[i] = slot_if_new;
        ++size_;
        *inserted = true;
        return slot_if_new;
      }
      if (keys_[i] == key) {
        *inserted = false;
        return slots_[i];
      }
    }
  }

  // Sets the slot of a present key. Returns false when the key is absent.
  bool Update(uint64_t key, uint32_t slot) {
    for (size_t i = Bucket(key);; i = (i + 1) & mask_) {
      if (slots_[i] == kAbsent) return false;
      if (keys_[i] == key) {
        slots_[i] = slot;
        return true;
      }
    }
  }

  // Removes `key` (backward-shift deletion: no tombstones, lookups stay short). Returns its
  // slot, or kAbsent.
  uint32_t Erase(uint64_t key) {
    size_t i = Bucket(key);
    while (true) {
      if (slots_[i] == kAbsent) return kAbsent;
      if (keys_[i] == key) break;
      i = (i + 1) & mask_;
    }
    const uint32_t slot = slots_[i];
    EraseBucket(i);
    return slot;
  }

  // Bucket-level access for sweeps: a bucket is empty or holds (key, slot).
  size_t buckets() const { return keys_.size(); }
  bool BucketFull(size_t b) const { return slots_[b] != kAbsent; }
  uint64_t BucketKey(size_t b) const { return keys_[b]; }
  uint32_t BucketSlot(size_t b) const { return slots_[b]; }
  // Empties bucket b; a later entry may move into b, so a sweep looks at b again.
  void EraseBucket(size_t i) {
    slots_[i] = kAbsent;
    --size_;
    for (size_t j = (i + 1) & mask_; slots_[j] != kAbsent; j = (j + 1) & mask_) {
      const size_t home = Bucket(keys_[j]);
      // Move j back to i unless its home lies cyclically in (i, j].
      const bool home_between = i <= j ? (home > i && home <= j) : (home > i || home <= j);
      if (home_between) continue;
      keys_[i] = keys_[j];
      slots_[i] = slots_[j];
      slots_[j] = kAbsent;
      i = j;
    }
  }

  // Calls fn(key, slot) for every entry, in bucket order.
  template <typename Fn>
  void ForEach(Fn&& fn) const {
    for (size_t i = 0; i < keys_.size(); ++i) {
      if (slots_[i] != kAbsent) fn(keys_[i], slots_[i]);
    }
  }

 private:
  size_t Bucket(uint64_t key) const { return Fmix64(key) & mask_; }

  void Grow() {
    std::vector<uint64_t> old_keys = std::move(keys_);
    std::vector<uint32_t> old_slots = std::move(slots_);
    keys_.assign(old_keys.size() * 2, 0);
    slots_.assign(old_keys.size() * 2, kAbsent);
    mask_ = keys_.size() - 1;
    for (size_t j = 0; j < old_keys.size(); ++j) {
      if (old_slots[j] == kAbsent) continue;
      size_t i = Bucket(old_keys[j]);
      while (slots_[i] != kAbsent) i = (i + 1) & mask_;
      keys_[i] = old_keys[j];
      slots_[i] = old_slots[j];
    }
  }

  std::vector<uint64_t> keys_;
  std::vector<uint32_t> slots_;
  size_t mask_ = 0;
  size_t size_ = 0;
};

}  // namespace parasol
