#include "server/sparse_table.hpp"

#include "common/initializer.hpp"

namespace parasol {

SparseTable::Partition::Partition(const TableOptions* options, uint32_t row_floats)
    : options_(options), row_floats_(row_floats) {}

float* SparseTable::Partition::FindOrCreate(uint64_t key) {
  const uint32_t next = static_cast<uint32_t>(index_.size());
  bool inserted = false;
  const uint32_t slot = index_.FindOrInsert(key, next, &inserted);
  if (!inserted) return RowAt(slot);
  if (slot / kRowsPerBlock >= blocks_.size()) {
    blocks_.push_back(
        std::make_unique_for_overwrite<float[]>(size_t{kRowsPerBlock} * row_floats_));
  }
  float* row = RowAt(slot);
  InitSparseRow(options_->init, options_->seed, key, std::span<float>(row, options_->dim));
  return row;
}

const float* SparseTable::Partition::Find(uint64_t key) const {
  const uint32_t slot = index_.Find(key);
  return slot == KeyIndex::kAbsent ? nullptr : RowAt(slot);
}

uint64_t SparseTable::Partition::MemoryBytes() const {
  return index_.MemoryBytes() +
         blocks_.size() * uint64_t{kRowsPerBlock} * row_floats_ * sizeof(float);
}

SparseTable::SparseTable(const TableOptions& options, uint32_t engines) : options_(options) {
  partitions_.reserve(engines);
  for (uint32_t e = 0; e < engines; ++e) partitions_.emplace_back(&options_, options_.dim);
}

uint64_t SparseTable::TotalRows() const {
  uint64_t n = 0;
  for (const auto& p : partitions_) n += p.rows();
  return n;
}

uint64_t SparseTable::MemoryBytes() const {
  uint64_t n = 0;
  for (const auto& p : partitions_) n += p.MemoryBytes();
  return n;
}

}  // namespace parasol
