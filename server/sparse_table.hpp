// SparseTable: one shard's part of a sparse (embedding) table.
//
// Rows are created the first time their key is touched (pulled or pushed), initialised from
// (table seed, key). The table is split into one Partition per engine thread; a key lives in
// the partition EngineOfKey(key, engines) and only that engine touches it, so no row is ever
// locked. Rows live in large arena blocks (never moved once created), indexed by an
// open-addressing KeyIndex.
// Thread-safety: a Partition is used by one thread at a time; the table-level readers
// (TotalRows, MemoryBytes) are for the request thread while no engine runs.
#pragma once

#include <cstdint>
#include <algorithm>
#include <memory>
#include <vector>

#include "common/key_index.hpp"
#include "common/manifest.hpp"

namespace parasol {

class SparseTable {
 public:
  class Partition {
   public:
    Partition(const TableOptions* options, uint32_t row_floats);

    // The row of `key`, created and initialised when absent.
    float* FindOrCreate(uint64_t key);
    // The row of `key`, or nullptr.
    const float* Find(uint64_t key) const;

    // Lookahead for batched access: PrefetchIndex() a key some iterations ahead, PrefetchRow()
    // it a few iterations later (its bucket is cached by then), then FindOrCreate() it.
    void PrefetchIndex(uint64_t key) const { index_.Prefetch(key); }
    void PrefetchRow(uint64_t key) const {
      const uint32_t slot = index_.Find(key);
      if (slot != KeyIndex::kAbsent) __builtin_prefetch(RowAt(slot));
    }

    // Calls fn(i, row) for each position i in `positions`, with row = FindOrCreate(key_of(i)),
    // prefetching ahead so that the cache misses of many keys overlap.
    template <typename KeyOf, typename Fn>
    void ForEachRow(const std::vector<uint32_t>& positions, KeyOf&& key_of, Fn&& fn) {
      constexpr size_t kIndexAhead = 16, kRowAhead = 8;
      const size_t n = positions.size();
      for (size_t j = 0; j < std::min(n, kIndexAhead); ++j) PrefetchIndex(key_of(positions[j]));
      for (size_t j = 0; j < std::min(n, kRowAhead); ++j) PrefetchRow(key_of(positions[j]));
      for (size_t j = 0; j < n; ++j) {
        if (j + kIndexAhead < n) PrefetchIndex(key_of(positions[j + kIndexAhead]));
        if (j + kRowAhead < n) PrefetchRow(key_of(positions[j + kRowAhead]));
        const uint32_t i = positions[j];
        fn(i, FindOrCreate(key_of(i)));
      }
    }

    uint64_t rows() const { return index_.size(); }
    uint64_t MemoryBytes() const;

   private:
    static constexpr uint32_t kRowsPerBlock = 4096;

    float* RowAt(uint32_t slot) const {
      return blocks_[slot / kRowsPerBlock].get() + size_t{slot % kRowsPerBlock} * row_floats_;
    }

    const TableOptions* options_;
    uint32_t row_floats_;
    KeyIndex index_;
    std::vector<std::unique_ptr<float[]>> blocks_;
  };

  SparseTable(const TableOptions& options, uint32_t engines);

  const TableOptions& options() const { return options_; }
  uint32_t dim() const { return options_.dim; }
  uint32_t engines() const { return static_cast<uint32_t>(partitions_.size()); }
  Partition& partition(uint32_t engine) { return partitions_[engine]; }
  const Partition& partition(uint32_t engine) const { return partitions_[engine]; }

  uint64_t TotalRows() const;
  uint64_t MemoryBytes() const;

 private:
  TableOptions options_;
  std::vector<Partition> partitions_;
};

}  // namespace parasol
