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
// Buckets are placed by Fmix64(key ^ seed): a sparse table gives each of its indexes a seed
// drawn at random per process (RandomIndexSeed()), so that keys arriving in the bucket order of
// another index (a checkpoint written from one, rows copied from another shard) or keys chosen
// to share their low hash bits land at random here and cannot pile up into long probe runs.
// Thread-safety: none; one owner at a time.
#pragma once

#include <algorithm>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "common/hash.hpp"
#include "common/huge_page_arena.hpp"
#include "common/key_index.hpp"

namespace parasol {

class SlotIndex {
 public:
  static constexpr uint32_t kAbsent = 0xffffffffu;

  explicit SlotIndex(size_t expected = 16, uint64_t seed = 0) : seed_(seed) { Reset(expected); }

  uint64_t seed() const { return seed_; }
  // Buckets probed by FindOrInsert() since construction (its first bucket included): what a
  // test of the insertion order counts instead of timing it.
  uint64_t insert_probes() const { return insert_probes_; }

  // Removes every key and sizes the index for `expected` keys without further growth.
  void Reset(size_t expected) {
    const size_t cap = KeyIndex::CapacityFor(expected);
    if (slots_.capacity() < cap) ReserveInHugePages(slots_, cap);
    slots_.assign(cap, kAbsent);
    mask_ = cap - 1;
    size_ = 0;
  }

  // Grows (doubling, keeping every key) until `expected` keys fit at load factor <= 0.7.
  // An empty index is sized at once, with no intermediate tables.
  template <typename KeyOf>
  void Reserve(size_t expected, KeyOf&& key_of) {
    if (size_ == 0 && slots_.size() < KeyIndex::CapacityFor(expected)) {
      Reset(expected);
      return;
    }
    while (slots_.size() * 7 < expected * 10) Grow(key_of);
  }

  size_t size() const { return size_; }
  size_t buckets() const { return slots_.size(); }
  size_t MemoryBytes() const { return slots_.capacity() * sizeof(uint32_t); }

  // The bucket where `key`'s probe run starts.
  size_t HomeBucket(uint64_t key) const { return Bucket(key); }
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
      ++insert_probes_;
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

  // Fills this empty index with slots [0, n) at once, placing them in the order of their home
  // buckets (a radix sort of (bucket, tag, slot) records, then one walk of the buckets front to
  // back), so that every memory access is sequential: what a restore of millions of rows does
  // instead of inserting them one by one (a random access per row, and another per occupied
  // bucket it compares). A key in two slots keeps the higher one; the others are appended to
  // *dropped. Two slots of one key share their home bucket, so only a bucket's own slots are
  // compared, and by a tag first (hash bits beyond the bucket's: the hash is a bijection, so
  // unequal tags are unequal keys); keys are read, at random, only when tags match. Counts
  // insert_probes() as inserts one by one would (a row's distance from its home bucket, plus
  // one). Uses 16 bytes of scratch per slot while it runs.
  // REQUIRES: size() == 0; n < kAbsent; at most 2^32 buckets.
  template <typename KeyOf>
  void Build(uint32_t n, KeyOf&& key_of, std::vector<uint32_t>* dropped) {
    if (slots_.size() * 7 < size_t{n} * 10) Reset(n);
    // A record: home bucket in the top `bits`, then the tag, then the slot in the low
    // `slot_bits`. Sorted by bucket, stably (a bucket's slots stay in order; the tag only rides
    // along): one scatter by the bucket's top (at most 12) bits into chunks of neighbouring
    // buckets, its histogram counted while the records are made (one read of the keys); then
    // each chunk, a few thousand records that stay in cache, sorted by the rest of the bucket
    // (one pass of at most 12 bits up to 2^24 buckets). One scatter over the whole array costs
    // what all the chunks' passes together do.
    const uint32_t bits = static_cast<uint32_t>(std::countr_zero(slots_.size()));
    const uint32_t slot_bits = n > 1 ? static_cast<uint32_t>(std::bit_width(n - 1)) : 1;
    if (bits + slot_bits > 64) {  // past 3 x 10^9 slots: no record holds both; one by one
      for (uint32_t slot = 0; slot < n; ++slot) {
        bool inserted = false;
        const uint64_t key = key_of(slot);
        const uint32_t had = FindOrInsert(key, slot, key_of, &inserted);
        if (!inserted) {
          dropped->push_back(had);
          Replace(key, slot, key_of);
        }
      }
      return;
    }
    const uint32_t tag_bits = 64 - bits - slot_bits;  // 0 when they fill the record
    const uint32_t bucket_shift = 64 - bits;
    const uint64_t slot_mask = (uint64_t{1} << slot_bits) - 1;
    const uint64_t tag_mask = tag_bits ? (uint64_t{1} << tag_bits) - 1 : 0;
    const uint32_t top_bits = std::min<uint32_t>(bits, 10);
    const uint32_t rest_bits = bits - top_bits;
    const uint32_t rest_passes = (rest_bits + 13) / 14;
    const uint32_t digit = rest_passes ? (rest_bits + rest_passes - 1) / rest_passes : 0;
    const uint64_t digit_mask = (uint64_t{1} << digit) - 1;
    // Scratch, read front to back but for one scatter, and gone at the end: in 4 KiB pages.
    // Huge pages bought it nothing, and where the kernel had to find them (a virtual machine
    // whose host took freed memory back) they cost 4.5 s per GiB to fault in, against 0.6 s.
    std::vector<uint64_t> records, sorted;
    records.resize(n);
    std::vector<uint32_t> chunk_start((size_t{1} << top_bits) + 1, 0);
    for (uint32_t s = 0; s < n; ++s) {
      const uint64_t hash = Hash(key_of(s));
      const uint64_t bucket = hash & mask_;
      // The tag: the hash's bits above the bucket's.
      const uint64_t tag = tag_bits ? (hash >> bits) & tag_mask : 0;
      records[s] = (bits ? bucket << bucket_shift : 0) | (tag << slot_bits) | s;
      ++chunk_start[(bucket >> rest_bits) + 1];
    }
    if (bits) {
      sorted.resize(n);
      for (size_t c = 1; c < chunk_start.size(); ++c) chunk_start[c] += chunk_start[c - 1];
      std::vector<uint32_t> next(chunk_start.begin(), chunk_start.end() - 1);
      const uint32_t top_shift = bucket_shift + rest_bits;
      for (uint64_t r : records) sorted[next[r >> top_shift]++] = r;
      records.swap(sorted);
      std::vector<uint32_t> count((size_t{1} << digit) + 1);
      for (size_t c = 0; c + 1 < chunk_start.size(); ++c) {
        const uint32_t begin = chunk_start[c], end = chunk_start[c + 1];
        if (end - begin < 2) {
          if (rest_passes % 2 == 1 && end > begin) sorted[begin] = records[begin];
          continue;
        }
        uint64_t* from = records.data();
        uint64_t* to = sorted.data();
        for (uint32_t p = 0; p < rest_passes; ++p) {
          const uint32_t shift = bucket_shift + p * digit;
          std::fill(count.begin(), count.end(), 0);
          for (uint32_t i = begin; i < end; ++i) ++count[((from[i] >> shift) & digit_mask) + 1];
          count[0] = begin;
          for (size_t d = 1; d < count.size(); ++d) count[d] += count[d - 1];
          for (uint32_t i = begin; i < end; ++i) to[count[(from[i] >> shift) & digit_mask]++] = from[i];
          std::swap(from, to);
        }
      }
      if (rest_passes % 2 == 1) records.swap(sorted);
      std::vector<uint64_t>().swap(sorted);
    }
    std::vector<uint32_t> wrapped;  // slots whose run passes the last bucket
    // The slots placed so far from the current home bucket: (tag, bucket placed in).
    std::vector<std::pair<uint64_t, size_t>> placed;
    size_t pos = 0;
    uint64_t home = ~uint64_t{0};
    for (uint32_t i = 0; i < n; ++i) {
      const uint64_t r = records[i];
      const uint64_t bucket = bits ? r >> bucket_shift : 0;
      const uint64_t tag = (r >> slot_bits) & tag_mask;
      const uint32_t slot = static_cast<uint32_t>(r & slot_mask);
      if (bucket != home) {
        home = bucket;
        placed.clear();
      }
      bool duplicate = false;
      for (const auto& [t, p] : placed) {
        if (t == tag && key_of(slots_[p]) == key_of(slot)) {
          dropped->push_back(slots_[p]);  // the lower slot: a bucket's slots are in order
          slots_[p] = slot;
          duplicate = true;
          break;
        }
      }
      if (duplicate) continue;
      pos = std::max<size_t>(pos, bucket);
      if (pos >= slots_.size()) {
        wrapped.push_back(slot);
        continue;
      }
      slots_[pos] = slot;
      placed.emplace_back(tag, pos);
      insert_probes_ += pos - bucket + 1;
      ++size_;
      ++pos;
    }
    // The few past the end go on from the first bucket, inserted one by one.
    for (uint32_t slot : wrapped) {
      bool inserted = false;
      const uint64_t key = key_of(slot);
      const uint32_t had = FindOrInsert(key, slot, key_of, &inserted);
      if (!inserted) {
        dropped->push_back(std::min(had, slot));
        if (had < slot) Replace(key, slot, key_of);
      }
    }
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
  uint64_t Hash(uint64_t key) const { return Fmix64(key ^ seed_); }
  size_t Bucket(uint64_t key) const { return Hash(key) & mask_; }

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

  // The slot of a present key becomes `slot`.
  template <typename KeyOf>
  void Replace(uint64_t key, uint32_t slot, KeyOf&& key_of) {
    for (size_t i = Bucket(key);; i = (i + 1) & mask_) {
      if (slots_[i] == kAbsent) return;
      if (key_of(slots_[i]) == key) {
        slots_[i] = slot;
        return;
      }
    }
  }

  std::vector<uint32_t> slots_;
  size_t mask_ = 0;
  size_t size_ = 0;
  uint64_t seed_ = 0;
  uint64_t insert_probes_ = 0;
};

// A seed for a SlotIndex: random, and different at every call (a process-wide random start,
// then a counter through SplitMix64).
uint64_t RandomIndexSeed();

}  // namespace parasol
