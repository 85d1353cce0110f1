// DenseTable: one shard's contiguous slice of a dense tensor, initialised from
// (table seed, global element index).
// Thread-safety: the caller splits work into disjoint element ranges, one per engine.
#pragma once

#include <cstdint>
#include <memory>

#include "common/manifest.hpp"
#include "common/sharding.hpp"

namespace parasol {

class DenseTable {
 public:
  DenseTable(const TableOptions& options, SliceRange slice);

  const TableOptions& options() const { return options_; }
  SliceRange slice() const { return slice_; }
  uint64_t total_elements() const { return options_.NumElements(); }

  // The element with global index `global`. REQUIRES: slice().Contains(global, global + 1).
  float* At(uint64_t global) { return data_.get() + (global - slice_.begin); }
  const float* At(uint64_t global) const { return data_.get() + (global - slice_.begin); }

  uint64_t MemoryBytes() const { return slice_.size() * sizeof(float); }

 private:
  TableOptions options_;
  SliceRange slice_;
  std::unique_ptr<float[]> data_;
};

}  // namespace parasol
