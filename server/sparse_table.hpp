// SparseTable: one shard's part of a sparse (embedding) table.
//
// A row is created from (table seed, key) when its key is first touched (with admission
// min_count n > 1: at its n-th push; until then pulls see the initial value and pushes are only
// counted). The table is split into one Partition per engine thread; a key lives in partition
// EngineOfKey(key, engines) and only that engine touches it, so no row is ever locked.
//
// Row layout, in large arena blocks (a row never moves while it lives):
//   [last update clock: uint32][values: dim floats][optimizer state: see optimizer.hpp]
// An open-addressing KeyIndex maps key -> slot; slots of evicted rows are reused.
// Thread-safety: a Partition is used by one thread at a time; table-level readers (TotalRows,
// MemoryBytes, counters) are for the request thread while no engine runs.
#pragma once

#include <algorithm>
#include <cstdint>
#include <map>
#include <memory>
#include <vector>

#include "common/key_index.hpp"
#include "common/manifest.hpp"
#include "server/optimizer.hpp"

namespace parasol {

class SparseTable {
 public:
  struct Counters {
    uint64_t admitted = 0;            // rows created
    uint64_t pushes_counted = 0;      // pushes of keys not yet admitted (only counted)
    uint64_t evicted_ttl = 0;
    uint64_t evicted_max_rows = 0;
    uint64_t pending_expired = 0;     // admission counts dropped (ttl_clocks or max_rows)
  };

  class Partition {
   public:
    Partition(const TableOptions* options, const Optimizer* optimizer, uint64_t max_rows);

    // The values of `key`'s row, created (and counted as admitted) when absent.
    float* FindOrCreate(uint64_t key, uint32_t clock);
    // The values of `key`'s row, or nullptr.
    float* Find(uint64_t key);
    // For a push of a key that has no row: counts it, and creates the row when this is its
    // admission.min_count-th push. Returns the row's values, or nullptr while not admitted.
    float* CountPush(uint64_t key, uint32_t clock);

    static uint32_t& LastClock(float* values) { return reinterpret_cast<uint32_t*>(values)[-1]; }

    // Looks at up to `max_buckets` buckets from where the last call stopped, removing rows not
    // updated in the last ttl_clocks clocks before `now`, and the least recently updated rows
    // while the partition holds more than its share of eviction.max_rows; the same for the
    // admission counts of keys not yet admitted (dropped first while over max_rows).
    void Sweep(size_t max_buckets, uint32_t now);

    // Lookahead for batched access: the index bucket of a key some iterations ahead, then its
    // row a few iterations later (its bucket is cached by then).
    void PrefetchIndex(uint64_t key) const { index_.Prefetch(key); }
    void PrefetchRow(uint64_t key) const {
      const uint32_t slot = index_.Find(key);
      if (slot != KeyIndex::kAbsent) __builtin_prefetch(RowAt(slot));
    }

    // Calls fn(i, key) for each position i in `positions`, in order, prefetching the index
    // and rows of the keys ahead so that the cache misses of many keys overlap.
    template <typename KeyOf, typename Fn>
    void ForEachKey(const std::vector<uint32_t>& positions, KeyOf&& key_of, Fn&& fn) {
      constexpr size_t kIndexAhead = 16, kRowAhead = 8;
      const size_t n = positions.size();
      for (size_t j = 0; j < std::min(n, kIndexAhead); ++j) PrefetchIndex(key_of(positions[j]));
      for (size_t j = 0; j < std::min(n, kRowAhead); ++j) PrefetchRow(key_of(positions[j]));
      for (size_t j = 0; j < n; ++j) {
        if (j + kIndexAhead < n) PrefetchIndex(key_of(positions[j + kIndexAhead]));
        if (j + kRowAhead < n) PrefetchRow(key_of(positions[j + kRowAhead]));
        fn(positions[j], key_of(positions[j]));
      }
    }

    // Calls fn(key, row) for every row; `row` is the clock word followed by the values and
    // state (row_floats() + 1 floats).
    template <typename Fn>
    void ForEachRow(Fn&& fn) const {
      for (size_t b = 0; b < index_.buckets(); ++b) {
        if (index_.BucketFull(b)) fn(index_.BucketKey(b), RowAt(index_.BucketSlot(b)));
      }
    }
    // Creates (or overwrites) `key`'s row from `row` as ForEachRow() gave it.
    void RestoreRow(uint64_t key, const float* row);
    // Sizes an empty partition's index for `rows` rows: rows restored in the index's own
    // (hash) order would otherwise pile up in a smaller, growing table.
    void Reserve(uint64_t rows) {
      if (index_.size() == 0) index_.Reset(rows);
    }
    uint32_t stored_floats() const { return row_floats_; }

    uint64_t rows() const { return index_.size(); }
    uint64_t pending_keys() const { return pending_.size(); }
    uint64_t MemoryBytes() const;
    const Counters& counters() const { return counters_; }

   private:
    static constexpr uint32_t kRowsPerBlock = 4096;

    // Start of the row (its clock word); values follow.
    float* RowAt(uint32_t slot) const {
      return blocks_[slot / kRowsPerBlock].get() + size_t{slot % kRowsPerBlock} * row_floats_;
    }
    float* Create(uint64_t key, uint32_t clock);
    void EvictBucket(size_t bucket, bool by_ttl);

    const TableOptions* options_;
    const Optimizer* optimizer_;
    uint32_t row_floats_;
    uint64_t max_rows_;            // this partition's share of eviction.max_rows (0: none)
    KeyIndex index_;               // key -> slot
    // Keys not yet admitted: key -> entry of pending_counts_/pending_clocks_ (the pushes so
    // far, and the clock of the last). They expire like rows (ttl_clocks) and count towards
    // max_rows, going first: a count only delays an admission.
    KeyIndex pending_;
    std::vector<uint32_t> pending_counts_;
    std::vector<uint32_t> pending_clocks_;
    std::vector<uint32_t> free_pending_;
    size_t pending_cursor_ = 0;
    void ErasePendingBucket(size_t bucket);
    void SweepPending(size_t max_buckets, uint32_t now);
    std::vector<std::unique_ptr<float[]>> blocks_;
    std::vector<uint32_t> free_slots_;
    uint32_t next_slot_ = 0;
    Counters counters_;
    // Sweep state: where the last sweep stopped, the clock histogram of the pass in progress,
    // and the clock below which the current pass evicts to honour max_rows.
    size_t cursor_ = 0;
    std::map<uint32_t, uint64_t> pass_clocks_;
    uint32_t evict_before_ = 0;
  };

  SparseTable(const TableOptions& options, uint32_t engines);

  const TableOptions& options() const { return options_; }
  const Optimizer& optimizer() const { return optimizer_; }
  uint32_t dim() const { return options_.dim; }
  // Floats of a row's values and state (what a pull with state returns per key).
  uint32_t row_floats() const { return options_.dim + optimizer_.SparseStateFloats(options_.dim); }
  bool admits_on_pull() const { return options_.admission.min_count <= 1; }
  bool evicts() const { return options_.eviction.ttl_clocks > 0 || options_.eviction.max_rows > 0; }
  uint32_t engines() const { return static_cast<uint32_t>(partitions_.size()); }
  Partition& partition(uint32_t engine) { return partitions_[engine]; }
  const Partition& partition(uint32_t engine) const { return partitions_[engine]; }

  uint64_t TotalRows() const;
  uint64_t PendingKeys() const;
  uint64_t MemoryBytes() const;
  Counters TotalCounters() const;

 private:
  TableOptions options_;
  Optimizer optimizer_;
  std::vector<Partition> partitions_;
};

}  // namespace parasol
