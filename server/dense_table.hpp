// DenseTable: one shard's contiguous slice of a dense tensor, initialised from
// (table seed, global element index).
//
// Pull replies send the values without copying them: each reply frame holds a share of the
// buffer until ZeroMQ has sent it. A push that finds shares outstanding first moves the values
// to a fresh buffer (copy-on-write), so a reply in flight never sees a half-applied push and a
// push never waits for a slow reader.
// Thread-safety: Share() and PrepareWrite() are called on the shard's request thread; engines
// then work on disjoint element ranges of the pointer PrepareWrite() returned.
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

  // The current values, shared: element `global` is at get()[global - slice().begin].
  std::shared_ptr<const float[]> Share() const { return data_; }

  // A buffer no reply shares, for updating in place; element `global` is at
  // [global - slice().begin]. Copies the values first when replies still hold shares.
  float* PrepareWrite();

  uint64_t MemoryBytes() const { return slice_.size() * sizeof(float); }
  uint64_t copies_on_write() const { return copies_on_write_; }

 private:
  TableOptions options_;
  SliceRange slice_;
  std::shared_ptr<float[]> data_;
  uint64_t copies_on_write_ = 0;
};

}  // namespace parasol
