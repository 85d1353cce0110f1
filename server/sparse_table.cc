#include "server/sparse_table.hpp"

#include <spdlog/spdlog.h>

#include <cstdlib>
#include <cstring>

#include "common/initializer.hpp"

namespace parasol {

SparseTable::Partition::Partition(const TableOptions* options, const Optimizer* optimizer,
                                  uint64_t max_rows)
    : options_(options),
      optimizer_(optimizer),
      codec_(options->dim, optimizer->SparseStateFloats(options->dim),
             options->optimizer.kind == OptimizerOptions::Kind::kAdam ? 1 : 0, options->dtype,
             options->state_dtype, options->rounding == TableOptions::Rounding::kStochastic,
             /*keep_clock=*/options->eviction.ttl_clocks > 0 || options->eviction.max_rows > 0 ||
                 options->keep_clock),
      row_words_(codec_.stored_words()),
      view_(codec_.view_floats()),
      max_rows_(max_rows),
      index_(16, RandomIndexSeed()),
      pending_(16) {}

uint32_t SparseTable::Partition::NewSlot() {
  uint32_t slot;
  if (!free_slots_.empty()) {
    slot = free_slots_.back();
    free_slots_.pop_back();
  } else {
    slot = next_slot_;
    if (slot / kRowsPerBlock >= blocks_.size()) {
      // Everything that may throw first: the partition is unchanged if one does.
      blocks_.reserve(blocks_.size() + 1);
      key_blocks_.reserve(key_blocks_.size() + 1);
      if (disk_) referenced_.reserve((blocks_.size() + 1) * kRowsPerBlock);
      auto* rows = static_cast<float*>(
          arena_.Allocate(size_t{kRowsPerBlock} * row_words_ * sizeof(float)));
      auto* keys =
          static_cast<uint64_t*>(key_arena_.Allocate(size_t{kRowsPerBlock} * sizeof(uint64_t)));
      blocks_.push_back(rows);
      key_blocks_.push_back(keys);
      if (disk_) referenced_.resize(blocks_.size() * kRowsPerBlock, kFreeSlot);
    }
    ++next_slot_;
  }
  return slot;
}

float* SparseTable::Partition::Create(uint64_t key, uint32_t clock) {
  const uint32_t slot = NewSlot();
  Touch(slot);
  KeyAt(slot) = key;
  bool inserted = false;
  index_.FindOrInsert(key, slot, keys(), &inserted);
  float* values;
  if (codec_.identity()) {
    values = RowAt(slot) + 1;
  } else {
    values = view_.data() + 1;
    view_slot_ = slot;
  }
  const uint32_t dim = options_->dim;
  InitSparseRow(options_->init, options_->seed, key, std::span<float>(values, dim));
  optimizer_->InitState(values, optimizer_->SparseState(values, dim), dim);
  LastClock(values) = clock;
  // A 16-bit row: its initial values rounded to nearest (the same on every run and restart).
  if (!codec_.identity()) {
    codec_.Encode(values - 1, RowAt(slot), nullptr);
    codec_.Decode(RowAt(slot), view_.data());  // the caller sees the row as stored
  }
  ++counters_.admitted;
  return values;
}

void SparseTable::Partition::RestoreRow(uint64_t key, const float* row) {
  if (disk_ && disk_rows_ > 0 && index_.Find(key, keys()) == SlotIndex::kAbsent) {
    // The same key twice in a checkpoint (damaged, or hostile, with good checksums) must not
    // leave a second copy on disk.
    const uint64_t one[1] = {key};
    if (Status st = Prefault(one); !st.ok()) DiskFailed(st);
  }
  // The row is written whole from `row`: no initial values to compute first.
  uint32_t slot = NewSlot();
  KeyAt(slot) = key;
  bool inserted = false;
  const uint32_t found = index_.FindOrInsert(key, slot, keys(), &inserted);
  if (!inserted) {  // the key twice: the later row wins
    free_slots_.push_back(slot);
    slot = found;
  }
  Touch(slot);
  if (codec_.identity()) {
    std::memcpy(RowAt(slot), row, sizeof(float) * codec_.view_floats());
  } else {
    codec_.Encode(row, RowAt(slot), nullptr);  // exact: no rounding
  }
  // A tiered table restores more rows than memory holds: to disk in batches as it goes.
  if (disk_ && index_.size() >= memory_limit_ + 4096) Settle();
}

bool SparseTable::Partition::AppendRestoredRow(uint64_t key, const float* row) {
  if (disk_ || index_.size() != 0 || (!appending_ && next_slot_ != 0)) return false;
  appending_ = true;
  const uint32_t slot = NewSlot();
  KeyAt(slot) = key;
  if (codec_.identity()) {
    std::memcpy(RowAt(slot), row, sizeof(float) * codec_.view_floats());
  } else {
    codec_.Encode(row, RowAt(slot), nullptr);  // exact: no rounding
  }
  return true;
}

void SparseTable::Partition::FinishRestoredRows() {
  if (!appending_) return;
  appending_ = false;
  std::vector<uint32_t> dropped;
  index_.Build(next_slot_, keys(), &dropped);
  free_slots_.insert(free_slots_.end(), dropped.begin(), dropped.end());
}

Status SparseTable::Partition::EraseKey(uint64_t key) {
  FinishRestoredRows();
  if (disk_) {
    const uint64_t one[1] = {key};
    PARASOL_RETURN_IF_ERROR(Prefault(one));  // a row on disk comes into memory, then goes
  }
  const uint32_t slot = index_.Erase(key, keys());
  if (slot == SlotIndex::kAbsent) return Status::Ok();
  NoteRemoved(key);
  if (disk_) referenced_[slot] = kFreeSlot;
  free_slots_.push_back(slot);
  return Status::Ok();
}

float* SparseTable::Partition::FindOrCreate(uint64_t key, uint32_t clock) {
  const uint32_t slot = index_.Find(key, keys());
  if (slot != SlotIndex::kAbsent) {
    Touch(slot);
    return ViewOf(slot);
  }
  return Create(key, clock);
}

float* SparseTable::Partition::Find(uint64_t key) {
  const uint32_t slot = index_.Find(key, keys());
  if (slot == SlotIndex::kAbsent) return nullptr;
  Touch(slot);
  return ViewOf(slot);
}

void SparseTable::Partition::SetDiskTier(DiskTier* disk, uint32_t family, uint64_t memory_rows) {
  disk_ = disk;
  family_ = family;
  memory_limit_ = std::max<uint64_t>(1, memory_rows);
  referenced_.assign(blocks_.size() * kRowsPerBlock, kFreeSlot);
}

Status SparseTable::Partition::Prefault(std::span<const uint64_t> wanted) {
  if (!disk_) return Status::Ok();
  missing_.clear();
  for (uint64_t key : wanted) {
    const uint32_t slot = index_.Find(key, keys());
    if (slot != SlotIndex::kAbsent) {
      Touch(slot);
      ++counters_.memory_hits;
    } else {
      missing_.push_back(key);
      ++counters_.memory_misses;
    }
  }
  if (missing_.empty() || disk_rows_ == 0) return Status::Ok();
  const size_t row_bytes = sizeof(float) * row_words_;
  fetched_.resize(missing_.size() * row_bytes);
  PARASOL_RETURN_IF_ERROR(disk_->MultiGet(family_, missing_, row_bytes, fetched_.data(), &found_));
  DiskTier::Batch moved = disk_->NewBatch(family_);
  for (size_t i = 0; i < missing_.size(); ++i) {
    // A key twice in one batch (a hostile request) is brought in once.
    if (!found_[i] || index_.Find(missing_[i], keys()) != SlotIndex::kAbsent) continue;
    const uint32_t slot = NewSlot();
    KeyAt(slot) = missing_[i];
    bool inserted = false;
    index_.FindOrInsert(missing_[i], slot, keys(), &inserted);
    std::memcpy(RowAt(slot), fetched_.data() + i * row_bytes, row_bytes);
    Touch(slot);
    moved.Delete(missing_[i]);
    --disk_rows_;
    ++counters_.promoted;
  }
  // A row must live in one tier: a disk that cannot take the deletes stops the shard (see
  // DiskFailed()).
  if (Status st = disk_->Write(moved); !st.ok()) DiskFailed(st);
  ShrinkScratch();
  return Status::Ok();
}

void SparseTable::Partition::ShrinkScratch() {
  // A request of many keys leaves big buffers behind: let them go once it is done.
  constexpr size_t kKeep = 1 << 16;
  if (prefault_keys_.capacity() > kKeep) std::vector<uint64_t>().swap(prefault_keys_);
  if (missing_.capacity() > kKeep) std::vector<uint64_t>().swap(missing_);
  if (found_.capacity() > kKeep) std::vector<uint8_t>().swap(found_);
  if (fetched_.capacity() > kKeep * 64) std::vector<char>().swap(fetched_);
}

void SparseTable::Partition::DiskFailed(const Status& st) {
  // Rows that cannot move between the tiers would either pile up in memory or exist twice;
  // the shard stops instead, and its restart (from its checkpoint, with the workers' replays)
  // starts a new disk tier.
  spdlog::critical("table '{}': the disk tier failed: {}; the shard stops", options_->name,
                   st.ToString());
  spdlog::shutdown();
  std::_Exit(1);
}

void SparseTable::Partition::Settle() {
  if (!disk_ || index_.size() <= memory_limit_) return;
  const size_t row_bytes = sizeof(float) * row_words_;
  // In batches of a few thousand rows: a large excess (a big request) is not one huge write.
  constexpr size_t kBatchRows = 4096;
  std::vector<uint64_t> chosen;
  while (index_.size() > memory_limit_) {
    const uint64_t excess = std::min<uint64_t>(index_.size() - memory_limit_, kBatchRows);
    // The hand walks the slots, not the index's buckets: rows leave the index in no order of
    // its own, so its probe sequences stay short (taking them in bucket order would empty the
    // buckets behind the hand and crowd those ahead of it into long runs).
    const size_t slots = next_slot_;
    chosen.clear();
    DiskTier::Batch batch = disk_->NewBatch(family_);
    // CLOCK: the hand clears referenced bits and takes the first rows it finds unreferenced.
    // Two turns clear every bit, so the loop ends.
    for (size_t step = 0; step < 2 * slots + 1 && chosen.size() < excess; ++step) {
      if (hand_ >= slots) hand_ = 0;
      const uint32_t slot = static_cast<uint32_t>(hand_++);
      if (referenced_[slot] == kFreeSlot) continue;
      if (referenced_[slot] == 1) {
        referenced_[slot] = 0;
        continue;
      }
      referenced_[slot] = kFreeSlot;  // chosen: not again in this batch
      batch.Put(KeyAt(slot), RowAt(slot), row_bytes);
      chosen.push_back(slot);
    }
    if (Status st = disk_->Write(batch); !st.ok()) DiskFailed(st);
    for (uint32_t slot : chosen) {
      index_.Erase(KeyAt(slot), keys());
      free_slots_.push_back(slot);
      ++disk_rows_;
      ++counters_.demoted;
    }
  }
  ShrinkScratch();
}

void SparseTable::Partition::SweepDisk(size_t max_rows, uint32_t now) {
  const uint64_t ttl = options_->eviction.ttl_clocks;
  if (!disk_ || disk_rows_ == 0 || (ttl == 0 && max_rows_ == 0)) return;
  DiskTier::Batch gone = disk_->NewBatch(family_);
  uint64_t by_ttl = 0, by_max = 0;
  // Rows are counted as they are chosen: max_rows evicts down to the limit, not past it.
  uint64_t total = rows();
  Result<std::string> next = disk_->Scan(
      family_, disk_cursor_, max_rows, [&](uint64_t key, std::span<const char> row) {
        if (row.size() < sizeof(uint32_t)) return;
        // A stale copy of a row that is in memory is not a row (its delete failed).
        if (index_.Find(key, keys()) != SlotIndex::kAbsent) return;
        uint32_t last;
        std::memcpy(&last, row.data(), sizeof(last));
        const bool expired = ttl > 0 && now >= last && now - last >= ttl;
        const bool over = max_rows_ > 0 && last < evict_before_ && total > max_rows_;
        if (expired || over) --total;
        if (expired || over) {
          gone.Delete(key);
          NoteRemoved(key);
          ++(expired ? by_ttl : by_max);
        } else if (max_rows_ > 0) {
          ++pass_clocks_[last];
        }
      });
  if (!next.ok()) {
    if (disk_status_.ok()) disk_status_ = next.status();
    return;
  }
  if (Status st = disk_->Write(gone); !st.ok()) DiskFailed(st);
  disk_rows_ -= std::min(disk_rows_, by_ttl + by_max);
  counters_.evicted_ttl += by_ttl;
  counters_.evicted_max_rows += by_max;
  disk_cursor_ = *next;
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
      const bool over = max_rows_ > 0 && rows() + pending_.size() > max_rows_;
      if (expired || over) {
        ErasePendingBucket(b);
        continue;  // another entry may have moved into bucket b: look at it again
      }
    }
    if (++pending_cursor_ >= buckets) pending_cursor_ = 0;
  }
}

void SparseTable::Partition::EvictBucket(size_t bucket, bool by_ttl) {
  NoteRemoved(KeyAt(index_.BucketSlot(bucket)));
  if (disk_) referenced_[index_.BucketSlot(bucket)] = kFreeSlot;
  free_slots_.push_back(index_.BucketSlot(bucket));
  index_.EraseBucket(bucket, keys());
  ++(by_ttl ? counters_.evicted_ttl : counters_.evicted_max_rows);
}

void SparseTable::Partition::Sweep(size_t max_buckets, uint32_t now) {
  SweepPending(max_buckets, now);
  // Disk rows cost a read each: a smaller slice per call keeps the request loop moving.
  SweepDisk(std::max<size_t>(1, max_buckets / 16), now);
  const uint64_t ttl = options_->eviction.ttl_clocks;
  const size_t buckets = index_.buckets();
  if (cursor_ >= buckets) cursor_ = 0;
  // Rows without a stored clock are in a table that evicts nothing.
  if (!codec_.stores_clock()) return;
  for (size_t seen = 0; seen < max_buckets; ++seen) {
    const size_t b = cursor_;
    if (index_.BucketFull(b)) {
      const uint32_t last = LastClock(RowAt(index_.BucketSlot(b)) + 1);
      const bool expired = ttl > 0 && now >= last && now - last >= ttl;
      const bool over = max_rows_ > 0 && last < evict_before_ && rows() > max_rows_;
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
    if (max_rows_ > 0 && rows() > max_rows_) {
      uint64_t excess = rows() - max_rows_, taken = 0;
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
         arena_.resident_bound() + key_arena_.resident_bound() +
         free_slots_.capacity() * sizeof(uint32_t) + referenced_.capacity();
}

SparseTable::SparseTable(const TableOptions& options, uint32_t engines)
    : options_(options), optimizer_(options.optimizer) {
  const uint64_t max_rows = options_.eviction.max_rows;
  const uint64_t share = max_rows == 0 ? 0 : std::max<uint64_t>(1, max_rows / engines);
  partitions_.reserve(engines);
  for (uint32_t e = 0; e < engines; ++e) partitions_.emplace_back(&options_, &optimizer_, share);
}

void SparseTable::SetDiskTier(DiskTier* disk, uint32_t first_family, uint64_t memory_rows) {
  disk_ = disk;
  const uint32_t n = engines();
  for (uint32_t e = 0; e < n; ++e) {
    partitions_[e].SetDiskTier(disk, first_family + e, std::max<uint64_t>(1, memory_rows / n));
  }
}

Status SparseTable::DiskStatus() const {
  for (const auto& p : partitions_) {
    if (!p.disk_status().ok()) return p.disk_status();
  }
  return Status::Ok();
}

uint64_t SparseTable::MemoryRows() const {
  uint64_t n = 0;
  for (const auto& p : partitions_) n += p.memory_rows();
  return n;
}

uint64_t SparseTable::DiskRows() const {
  uint64_t n = 0;
  for (const auto& p : partitions_) n += p.disk_rows();
  return n;
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
    c.memory_hits += p.counters().memory_hits;
    c.memory_misses += p.counters().memory_misses;
    c.promoted += p.counters().promoted;
    c.demoted += p.counters().demoted;
  }
  return c;
}

}  // namespace parasol
