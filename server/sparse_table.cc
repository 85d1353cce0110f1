#include "server/sparse_table.hpp"

#include <cstring>

#include "common/initializer.hpp"

namespace parasol {

SparseTable::Partition::Partition(const TableOptions* options, const Optimizer* optimizer,
                                  uint64_t max_rows)
    : options_(options),
      optimizer_(optimizer),
      row_floats_(1 + options->dim + optimizer->SparseStateFloats(options->dim)),
      max_rows_(max_rows),
      index_(16),
      pending_(16) {}

float* SparseTable::Partition::Create(uint64_t key, uint32_t clock) {
  uint32_t slot;
  if (!free_slots_.empty()) {
    slot = free_slots_.back();
    free_slots_.pop_back();
  } else {
    slot = next_slot_++;
    if (slot / kRowsPerBlock >= blocks_.size()) {
      blocks_.push_back(
          std::make_unique_for_overwrite<float[]>(size_t{kRowsPerBlock} * row_floats_));
    }
  }
  bool inserted = false;
  index_.FindOrInsert(key, slot, &inserted);
  float* values = RowAt(slot) + 1;
  const uint32_t dim = options_->dim;
  InitSparseRow(options_->init, options_->seed, key, std::span<float>(values, dim));
  optimizer_->InitState(values, optimizer_->SparseState(values, dim), dim);
  LastClock(values) = clock;
  ++counters_.admitted;
  return values;
}

void SparseTable::Partition::RestoreRow(uint64_t key, const float* row) {
  float* values = Find(key);
  if (!values) values = Create(key, 0);
  std::memcpy(values - 1, row, sizeof(float) * row_floats_);
}

float* SparseTable::Partition::FindOrCreate(uint64_t key, uint32_t clock) {
  const uint32_t slot = index_.Find(key);
  if (slot != KeyIndex::kAbsent) return RowAt(slot) + 1;
  return Create(key, clock);
}

float* SparseTable::Partition::Find(uint64_t key) {
  const uint32_t slot = index_.Find(key);
  return slot == KeyIndex::kAbsent ? nullptr : RowAt(slot) + 1;
}

float* SparseTable::Partition::CountPush(uint64_t key, uint32_t clock) {
  const uint32_t need = options_->admission.min_count;
  if (need <= 1) return Create(key, clock);
  const uint32_t candidate = free_pending_.empty()
                                 ? static_cast<uint32_t>(pending_counts_.size())
                                 : free_pending_.back();
  bool inserted = false;
  const uint32_t entry = pending_.FindOrInsert(key, candidate, &inserted);
  if (inserted) {
    if (free_pending_.empty()) {
      pending_counts_.push_back(0);
      pending_clocks_.push_back(0);
    } else {
      free_pending_.pop_back();
    }
    pending_counts_[entry] = 0;
  }
  const uint32_t count = ++pending_counts_[entry];
  pending_clocks_[entry] = clock;
  if (count < need) {
    ++counters_.pushes_counted;
    return nullptr;
  }
  pending_.Erase(key);
  free_pending_.push_back(entry);
  return Create(key, clock);
}

void SparseTable::Partition::ErasePendingBucket(size_t bucket) {
  free_pending_.push_back(pending_.BucketSlot(bucket));
  pending_.EraseBucket(bucket);
  ++counters_.pending_expired;
}

void SparseTable::Partition::SweepPending(size_t max_buckets, uint32_t now) {
  const uint64_t ttl = options_->eviction.ttl_clocks;
  const size_t buckets = pending_.buckets();
  if (pending_cursor_ >= buckets) pending_cursor_ = 0;
  for (size_t seen = 0; seen < max_buckets && pending_.size() > 0; ++seen) {
    const size_t b = pending_cursor_;
    if (pending_.BucketFull(b)) {
      const uint32_t last = pending_clocks_[pending_.BucketSlot(b)];
      const bool expired = ttl > 0 && now >= last && now - last >= ttl;
      const bool over = max_rows_ > 0 && index_.size() + pending_.size() > max_rows_;
      if (expired || over) {
        ErasePendingBucket(b);
        continue;  // another entry may have moved into bucket b: look at it again
      }
    }
    if (++pending_cursor_ >= buckets) pending_cursor_ = 0;
  }
}

void SparseTable::Partition::EvictBucket(size_t bucket, bool by_ttl) {
  free_slots_.push_back(index_.BucketSlot(bucket));
  index_.EraseBucket(bucket);
  ++(by_ttl ? counters_.evicted_ttl : counters_.evicted_max_rows);
}

void SparseTable::Partition::Sweep(size_t max_buckets, uint32_t now) {
  SweepPending(max_buckets, now);
  const uint64_t ttl = options_->eviction.ttl_clocks;
  const size_t buckets = index_.buckets();
  if (cursor_ >= buckets) cursor_ = 0;
  for (size_t seen = 0; seen < max_buckets; ++seen) {
    const size_t b = cursor_;
    if (index_.BucketFull(b)) {
      const uint32_t last = LastClock(RowAt(index_.BucketSlot(b)) + 1);
      const bool expired = ttl > 0 && now >= last && now - last >= ttl;
      const bool over = max_rows_ > 0 && last < evict_before_ && index_.size() > max_rows_;
      if (expired || over) {
        EvictBucket(b, expired);
        continue;  // another entry may have moved into bucket b: look at it again
      }
      if (max_rows_ > 0) ++pass_clocks_[last];
    }
    if (++cursor_ < buckets) continue;
    // A pass is complete: choose the clock below which the next pass evicts, so that about
    // the excess over max_rows goes, oldest updates first.
    cursor_ = 0;
    evict_before_ = 0;
    if (max_rows_ > 0 && index_.size() > max_rows_) {
      uint64_t excess = index_.size() - max_rows_, taken = 0;
      for (const auto& [clock, count] : pass_clocks_) {
        evict_before_ = clock + 1;
        taken += count;
        if (taken >= excess) break;
      }
    }
    pass_clocks_.clear();
    break;
  }
}

uint64_t SparseTable::Partition::MemoryBytes() const {
  return index_.MemoryBytes() + pending_.MemoryBytes() +
         (pending_counts_.capacity() + pending_clocks_.capacity() + free_pending_.capacity()) *
             sizeof(uint32_t) +
         blocks_.size() * uint64_t{kRowsPerBlock} * row_floats_ * sizeof(float) +
         free_slots_.capacity() * sizeof(uint32_t);
}

SparseTable::SparseTable(const TableOptions& options, uint32_t engines)
    : options_(options), optimizer_(options.optimizer) {
  const uint64_t max_rows = options_.eviction.max_rows;
  const uint64_t share = max_rows == 0 ? 0 : std::max<uint64_t>(1, max_rows / engines);
  partitions_.reserve(engines);
  for (uint32_t e = 0; e < engines; ++e) partitions_.emplace_back(&options_, &optimizer_, share);
}

uint64_t SparseTable::TotalRows() const {
  uint64_t n = 0;
  for (const auto& p : partitions_) n += p.rows();
  return n;
}

uint64_t SparseTable::PendingKeys() const {
  uint64_t n = 0;
  for (const auto& p : partitions_) n += p.pending_keys();
  return n;
}

uint64_t SparseTable::MemoryBytes() const {
  uint64_t n = 0;
  for (const auto& p : partitions_) n += p.MemoryBytes();
  return n;
}

SparseTable::Counters SparseTable::TotalCounters() const {
  Counters c;
  for (const auto& p : partitions_) {
    c.admitted += p.counters().admitted;
    c.pushes_counted += p.counters().pushes_counted;
    c.evicted_ttl += p.counters().evicted_ttl;
    c.evicted_max_rows += p.counters().evicted_max_rows;
    c.pending_expired += p.counters().pending_expired;
  }
  return c;
}

}  // namespace parasol
