// SparseTable: one shard's part of a sparse (embedding) table.
//
// A row is created from (table seed, key) when its key is first touched (with admission
// min_count n > 1: at its n-th push; until then pulls see the initial value and pushes are only
// counted). The table is split into one Partition per engine; a key lives in partition
// EngineOfKey(key, engines) and only that engine's part of a request touches it, on one thread
// at a time (EnginePool), so no row is ever locked.
//
// Row layout, in large arena blocks (a row never moves while it lives):
//   [last update clock: uint32][values: dim floats][optimizer state: see optimizer.hpp]
// (16-bit tables that evict nothing store no clock word: see row_codec.hpp)
// with 16-bit values or state (tables[].dtype, state_dtype) stored as RowCodec says; the
// Partition's accessors then return a decoded f32 copy of the row (its "view"), valid until the
// next accessor call, and a caller that changes it writes it back with Store().
// An open-addressing SlotIndex maps key -> slot, holding only the slot (4 bytes a bucket); each
// block keeps its rows' keys in an array beside it. Slots of evicted rows are reused.
//
// Tiered tables (storage: tiered) keep at most memory_rows rows per partition in memory and
// the rest in the shard's DiskTier; a row lives in one tier at a time. Before a batch of keys
// is handled, Prefault() brings the batch's rows that are on disk into memory (one batched
// read); after it, Settle() moves the least recently used rows back to disk until memory holds
// memory_rows rows. Recency is tracked by CLOCK (a referenced bit per slot, set on every
// access, cleared by a hand that demotes the first row it finds unreferenced): it needs no list
// to maintain on the hot path, and approximates LRU, which suits embedding rows whose
// popularity drifts (a frequency count would keep yesterday's hot ids in memory).
// Thread-safety: a Partition is used by one thread at a time; table-level readers (TotalRows,
// MemoryBytes, counters) are for the request thread while no engine runs.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <map>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <memory>
#include <vector>

#include "common/huge_page_arena.hpp"
#include "common/key_index.hpp"
#include "common/slot_index.hpp"
#include "common/manifest.hpp"
#include "common/status.hpp"
#include "server/disk_tier.hpp"
#include "server/optimizer.hpp"
#include "server/row_codec.hpp"

namespace parasol {

class SparseTable {
 public:
  struct Counters {
    uint64_t admitted = 0;            // rows created
    uint64_t pushes_counted = 0;      // pushes of keys not yet admitted (only counted)
    uint64_t evicted_ttl = 0;
    uint64_t evicted_max_rows = 0;
    uint64_t pending_expired = 0;     // admission counts dropped (ttl_clocks or max_rows)
    // Tiered tables: keys looked up that memory held, or not (then read from disk, or new),
    // rows brought into memory and rows moved to disk.
    uint64_t memory_hits = 0;
    uint64_t memory_misses = 0;
    uint64_t promoted = 0;
    uint64_t demoted = 0;
  };

  class Partition {
   public:
    Partition(const TableOptions* options, const Optimizer* optimizer, uint64_t max_rows);

    // Makes this partition tiered: at most `memory_rows` rows in memory (at least 1), the
    // rest in column family `family` of `disk`.
    void SetDiskTier(DiskTier* disk, uint32_t family, uint64_t memory_rows);
    bool tiered() const { return disk_ != nullptr; }

    // Tiered: brings the rows of `keys` that are on disk into memory, with one batched read.
    // Call before handling the keys; fails, changing nothing, when the disk cannot be read.
    Status Prefault(std::span<const uint64_t> keys);
    template <typename KeyOf>
    Status Prefault(const std::vector<uint32_t>& positions, KeyOf&& key_of) {
      if (!disk_) return Status::Ok();
      prefault_keys_.clear();
      for (uint32_t i : positions) prefault_keys_.push_back(key_of(i));
      return Prefault(prefault_keys_);
    }
    // Tiered: moves the least recently used rows to disk until memory holds memory_rows rows.
    // A disk that fails to take writes stops the process (the shard restarts from its
    // checkpoint with a new disk tier): rows must not pile up in memory or exist twice.
    void Settle();
    Status disk_status() const { return disk_status_; }

    // Writes back a row changed through `values` (from Find, FindOrCreate or CountPush, the
    // last accessor called): rounds a 16-bit row into its storage. Nothing to do for f32.
    // With stochastic rounding, the row's draws depend on the table's seed, the current write
    // (SetWrite) and the row's key only (RoundingBitsFor).
    void Store(float* values) {
      if (codec_.identity()) return;
      RoundingBits bits = RoundingBitsFor(options_->seed, write_, KeyAt(view_slot_));
      codec_.Encode(values - 1, RowAt(view_slot_), &bits);
    }
    // Names the writes that follow (the clock applied, or the push's name).
    void SetWrite(uint64_t write) { write_ = write; }

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

    // Lookahead for batched access, in three stages some iterations apart: the index bucket
    // of a key, then (the bucket cached by then) the key of the row in it, then (both cached)
    // the key's own row, found.
    void PrefetchIndex(uint64_t key) const { index_.Prefetch(key); }
    // The row's first cache lines (up to 4: an optimizer step reads its state too) when the
    // key's home bucket holds it, the common case; else nothing (a key further along its
    // probe run, or absent, would need more keys read than are in cache). Call it after
    // PrefetchIndex() and PrefetchHomeKey() of the same key: it reads those.
    void PrefetchRow(uint64_t key) const {
      const uint32_t slot = index_.HomeSlot(key);
      if (slot == SlotIndex::kAbsent || KeyAt(slot) != key) return;
      // Every line the row touches, from the line its first byte is in.
      const auto first = reinterpret_cast<uintptr_t>(RowAt(slot));
      const uintptr_t end = first + std::min<size_t>(size_t{row_words_} * sizeof(float), 256);
      for (uintptr_t line = first & ~uintptr_t{63}; line < end; line += 64) {
        __builtin_prefetch(reinterpret_cast<const void*>(line));
      }
    }

    // The key of the row in the key's home bucket (what an insert compares first).
    void PrefetchHomeKey(uint64_t key) const {
      const uint32_t slot = index_.HomeSlot(key);
      if (slot != SlotIndex::kAbsent) __builtin_prefetch(&KeyAt(slot));
    }

    // Calls fn(j, key_of(j)) for j in [0, n), in order, prefetching the index and rows of the
    // keys ahead so that the cache misses of many keys overlap. `fn` may return bool: false
    // stops the walk before key j. Returns the keys handled. (The first keys of a walk have
    // no lead: a caller with many keys walks them in one call.)
    template <typename KeyOf, typename Fn>
    size_t ForEachKeyAt(size_t n, KeyOf&& key_of, Fn&& fn) {
      constexpr size_t kIndexAhead = 24, kKeyAhead = 16, kRowAhead = 8;
      for (size_t j = 0; j < std::min(n, kIndexAhead); ++j) PrefetchIndex(key_of(j));
      for (size_t j = 0; j < std::min(n, kKeyAhead); ++j) PrefetchHomeKey(key_of(j));
      for (size_t j = 0; j < std::min(n, kRowAhead); ++j) PrefetchRow(key_of(j));
      for (size_t j = 0; j < n; ++j) {
        if (j + kIndexAhead < n) PrefetchIndex(key_of(j + kIndexAhead));
        if (j + kKeyAhead < n) PrefetchHomeKey(key_of(j + kKeyAhead));
        if (j + kRowAhead < n) PrefetchRow(key_of(j + kRowAhead));
        if constexpr (std::is_same_v<std::invoke_result_t<Fn&, size_t, uint64_t>, bool>) {
          if (!fn(j, key_of(j))) return j;
        } else {
          fn(j, key_of(j));
        }
      }
      return n;
    }
    // The same over the keys at `positions`: fn(positions[j], key).
    template <typename KeyOf, typename Fn>
    void ForEachKey(const std::vector<uint32_t>& positions, KeyOf&& key_of, Fn&& fn) {
      ForEachKeyAt(
          positions.size(), [&](size_t j) { return key_of(positions[j]); },
          [&](size_t j, uint64_t key) { fn(positions[j], key); });
    }

    // Calls fn(key, row) for every row, in memory (in slot order: the rows' memory front to
    // back) and (tiered) on disk; `row` is the clock word followed by the values and state
    // (row_floats() + 1 floats).
    // `fn` may return bool: false stops the walk.
    template <typename Fn>
    Status ForEachRow(Fn&& fn) const {
      auto call = [&](uint64_t key, const float* row) -> bool {
        if constexpr (std::is_same_v<std::invoke_result_t<Fn&, uint64_t, const float*>, bool>) {
          return fn(key, row);
        } else {
          fn(key, row);
          return true;
        }
      };
      std::vector<float> view(codec_.view_floats());
      std::vector<bool> free(next_slot_, false);
      for (uint32_t slot : free_slots_) free[slot] = true;
      for (uint32_t slot = 0; slot < next_slot_; ++slot) {
        if (free[slot]) continue;
        const float* row = RowAt(slot);
        if (slot % kRowsPerBlock == 0 && slot + kRowsPerBlock < next_slot_) {
          // The next block's first lines, while this one is read.
          __builtin_prefetch(RowAt(slot + kRowsPerBlock));
        }
        if (!codec_.identity()) {
          codec_.Decode(row, view.data());
          row = view.data();
        }
        if (!call(KeyAt(slot), row)) return Status::Ok();
      }
      if (!disk_ || disk_rows_ == 0) return Status::Ok();
      std::vector<float> stored(row_words_);
      const size_t row_bytes = sizeof(float) * row_words_;
      return disk_->ForEachRow(family_, [&](uint64_t key, std::span<const char> bytes) {
        // A stale copy of a row in memory is not the row.
        if (bytes.size() != row_bytes || index_.Find(key, keys()) != SlotIndex::kAbsent) {
          return true;
        }
        std::memcpy(stored.data(), bytes.data(), row_bytes);
        codec_.Decode(stored.data(), view.data());
        return call(key, view.data());
      });
    }
    // The in-memory rows by slot, for a walk in pages that rows created or removed meanwhile do
    // not disturb (a row keeps its slot while it lives): calls fn(key, row) (as ForEachRow)
    // for each row from slot `from` on while fn returns true; returns the slot of the row fn
    // refused, or slot_end() when the walk is complete.
    // `since`: only rows whose stored clock (stores_clock()) is at least it.
    template <typename Fn>
    uint32_t ForEachRowFromSlot(uint32_t from, Fn&& fn, uint32_t since = 0) const {
      std::vector<float> view(codec_.identity() ? 0 : codec_.view_floats());
      const bool by_clock = since > 0 && codec_.stores_clock();
      for (uint32_t slot = from; slot < next_slot_; ++slot) {
        if (by_clock) {
          // The clock word first: a free slot's is stale, and the index decides below.
          uint32_t last;
          std::memcpy(&last, RowAt(slot), sizeof(last));
          if (last < since) continue;
        }
        const uint64_t key = KeyAt(slot);
        if (index_.Find(key, keys()) != slot) continue;  // a free slot
        const float* row = RowAt(slot);
        if (!codec_.identity()) {
          codec_.Decode(row, view.data());
          row = view.data();
        }
        if (!fn(key, row)) return slot;
      }
      return next_slot_;
    }
    uint32_t slot_end() const { return next_slot_; }
    // Whether rows keep the shard clock of their last update (the first word ForEachRow gives).
    bool stores_clock() const { return codec_.stores_clock(); }
    // Removes the in-memory rows whose keys `drop(key)` names; returns how many went.
    template <typename Pred>
    uint64_t EraseRowsIf(Pred&& drop) {
      uint64_t erased = 0;
      for (size_t b = 0; b < index_.buckets();) {
        if (index_.BucketFull(b) && drop(KeyAt(index_.BucketSlot(b)))) {
          NoteRemoved(KeyAt(index_.BucketSlot(b)));
          if (disk_) referenced_[index_.BucketSlot(b)] = kFreeSlot;
          free_slots_.push_back(index_.BucketSlot(b));
          index_.EraseBucket(b, keys());
          ++erased;
          continue;  // another entry may have moved into bucket b
        }
        ++b;
      }
      return erased;
    }
    // Creates (or overwrites) `key`'s row from `row` as ForEachRow() gave it.
    void RestoreRow(uint64_t key, const float* row);
    // A restore of many rows into an empty partition that is not tiered: each row is written
    // to the next slot as it comes, and the index is built once, when they are all in
    // (SlotIndex::Build). Until FinishRestoredRows() the partition finds none of them.
    // Returns false (doing nothing) when the partition is not empty or is tiered: use
    // RestoreRow() then.
    bool AppendRestoredRow(uint64_t key, const float* row);
    // Builds the index over the appended rows; a key appended twice keeps its later row.
    void FinishRestoredRows();
    // Removes `key`'s row (in memory or on disk) if there is one; fails when the disk cannot
    // be read.
    Status EraseKey(uint64_t key);

    // Removals are recorded (for the next delta checkpoint) while `on`; turning it off, or
    // TakeRemoved(), empties the record.
    void RecordRemovals(bool on) {
      record_removed_ = on;
      if (!on) std::vector<uint64_t>().swap(removed_);
    }
    // The keys whose rows were removed since the last call (evicted, erased, moved away).
    // *overflowed: more were removed than the record holds (kMaxRemoved): the list is not all.
    std::vector<uint64_t> TakeRemoved(bool* overflowed = nullptr) {
      if (overflowed) *overflowed = *overflowed || removed_overflow_;
      removed_overflow_ = false;
      return std::exchange(removed_, {});
    }
    static constexpr size_t kMaxRemoved = size_t{1} << 22;  // 32 MiB of keys
    uint64_t removed_count() const { return removed_.size(); }
    // Sizes the index for `rows` rows (growing by doubling): rows restored in the index's own
    // (hash) order would otherwise pile up in a smaller, growing table.
    void Reserve(uint64_t rows) { index_.Reserve(rows, keys()); }
    // f32 words of a row as checkpoints hold it (the view: clock, values, state).
    uint32_t stored_floats() const { return codec_.view_floats(); }
    // 32-bit words a row takes in memory and on disk.
    uint32_t stored_words() const { return row_words_; }

    // Index buckets probed by inserts so far (see SlotIndex::insert_probes()).
    uint64_t index_insert_probes() const { return index_.insert_probes(); }

    uint64_t rows() const { return index_.size() + disk_rows_; }
    uint64_t memory_rows() const { return index_.size(); }
    uint64_t disk_rows() const { return disk_rows_; }
    // Tiered: the partition's column family in the disk tier.
    uint32_t family() const { return family_; }
    uint64_t pending_keys() const { return pending_.size(); }
    uint64_t MemoryBytes() const;
    const Counters& counters() const { return counters_; }

   private:
    static constexpr uint32_t kRowsPerBlock = 4096;

    // Start of the stored row (its clock word); values follow.
    float* RowAt(uint32_t slot) const {
      return blocks_[slot / kRowsPerBlock] + size_t{slot % kRowsPerBlock} * row_words_;
    }
    // The key of the row in `slot` (the index's key_of).
    uint64_t& KeyAt(uint32_t slot) const {
      return key_blocks_[slot / kRowsPerBlock][slot % kRowsPerBlock];
    }
    struct KeyOfSlot {
      const Partition* partition;
      uint64_t operator()(uint32_t slot) const { return partition->KeyAt(slot); }
    };
    KeyOfSlot keys() const { return KeyOfSlot{this}; }
    // The values of the row in `slot` as the accessors return them: the row itself (f32), or
    // its decoded view.
    float* ViewOf(uint32_t slot) {
      if (codec_.identity()) return RowAt(slot) + 1;
      codec_.Decode(RowAt(slot), view_.data());
      view_slot_ = slot;
      return view_.data() + 1;
    }
    float* Create(uint64_t key, uint32_t clock);
    // A slot for a new row (a free one, or a new one).
    uint32_t NewSlot();
    void EvictBucket(size_t bucket, bool by_ttl);
    void Touch(uint32_t slot) {
      if (disk_) referenced_[slot] = 1;
    }
    void SweepDisk(size_t max_rows, uint32_t now);
    void ShrinkScratch();
    [[noreturn]] void DiskFailed(const Status& st);

    // Tiered.
    DiskTier* disk_ = nullptr;
    uint32_t family_ = 0;
    uint64_t memory_limit_ = 0;     // rows
    uint64_t disk_rows_ = 0;
    // By slot: 1 accessed since the hand last passed, 0 not, kFreeSlot no row.
    static constexpr uint8_t kFreeSlot = 2;
    std::vector<uint8_t> referenced_;
    size_t hand_ = 0;                  // CLOCK's position among the slots
    Status disk_status_;
    std::vector<uint64_t> prefault_keys_;
    std::vector<uint64_t> missing_;
    std::vector<char> fetched_;
    std::vector<uint8_t> found_;
    std::string disk_cursor_;          // where the disk sweep goes on (an encoded key)

    const TableOptions* options_;
    const Optimizer* optimizer_;
    RowCodec codec_;
    uint32_t row_words_;            // stored
    std::vector<float> view_;       // the decoded row of view_slot_ (16-bit tables)
    uint32_t view_slot_ = 0;
    uint64_t write_ = 0;           // the current write's name (SetWrite)
    uint64_t max_rows_;            // this partition's share of eviction.max_rows (0: none)
    SlotIndex index_;              // key -> slot
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
    // The rows' memory, in huge pages where the kernel allows (common/huge_page_arena.hpp):
    // blocks of kRowsPerBlock rows each, and their keys, taken as the rows grow and kept until
    // the partition goes.
    HugePageArena arena_;
    HugePageArena key_arena_;  // apart: blocks of one size per arena waste nothing
    std::vector<float*> blocks_;
    std::vector<uint64_t*> key_blocks_;
    std::vector<uint32_t> free_slots_;
    uint32_t next_slot_ = 0;
    bool appending_ = false;  // AppendRestoredRow() rows not yet in the index
    bool record_removed_ = false;
    bool removed_overflow_ = false;
    std::vector<uint64_t> removed_;  // keys removed since TakeRemoved(), while recorded
    void NoteRemoved(uint64_t key) {
      if (!record_removed_) return;
      if (removed_.size() >= kMaxRemoved) {
        removed_overflow_ = true;  // the next checkpoint is full
        return;
      }
      removed_.push_back(key);
    }
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

  // Makes the table tiered (see above): `memory_rows` rows in memory, split among the
  // partitions; partition e keeps the rest in column family `first_family + e` of `disk`.
  void SetDiskTier(DiskTier* disk, uint32_t first_family, uint64_t memory_rows);
  bool tiered() const { return disk_ != nullptr; }
  DiskTier* disk() const { return disk_; }
  // The first failed disk write of any partition (rows then stay in memory).
  Status DiskStatus() const;

  uint64_t TotalRows() const;
  uint64_t MemoryRows() const;
  uint64_t DiskRows() const;
  uint64_t PendingKeys() const;
  uint64_t MemoryBytes() const;
  Counters TotalCounters() const;

 private:
  TableOptions options_;
  Optimizer optimizer_;
  std::vector<Partition> partitions_;
  DiskTier* disk_ = nullptr;
};

}  // namespace parasol
