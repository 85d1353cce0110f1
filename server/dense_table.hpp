// DenseTable: one shard's contiguous slice of a dense tensor, initialised from
// (table seed, global element index), with its optimizer state in arrays beside the values.
//
// Pull replies send the values without copying them: each reply frame holds a share of the
// buffer until ZeroMQ has sent it. A push that finds shares outstanding first moves the values
// to a fresh buffer (copy-on-write), so a reply in flight never sees a half-applied push and a
// push never waits for a slow reader.
// Thread-safety: Share() and PrepareWrite() are called on the shard's request thread; engines
// then work on disjoint element ranges of the pointer PrepareWrite() returned.
#pragma once

#include <cstdint>
#include <atomic>
#include <memory>
#include <vector>

#include "common/manifest.hpp"
#include "common/sharding.hpp"
#include "server/optimizer.hpp"

namespace parasol {

class DenseTable {
 public:
  // `retired_bytes` (optional, may be shared by several tables) counts the bytes of replaced
  // value buffers that replies still hold: a reply waiting to be sent keeps its copy alive.
  DenseTable(const TableOptions& options, SliceRange slice,
             std::shared_ptr<std::atomic<uint64_t>> retired_bytes = nullptr);

  const TableOptions& options() const { return options_; }
  const Optimizer& optimizer() const { return optimizer_; }
  SliceRange slice() const { return slice_; }
  uint64_t total_elements() const { return options_.NumElements(); }

  // The current values, shared: element `global` is at get()[global - slice().begin].
  std::shared_ptr<const float[]> Share() const { return data_; }

  // A buffer no reply shares, for updating in place; element `global` is at
  // [global - slice().begin]. Copies the values first when replies still hold shares.
  float* PrepareWrite();

  // The optimizer's state arrays (DenseStateArrays() of them), indexed like the values.
  float* const* state_arrays() { return state_ptrs_.data(); }
  uint32_t state_array_count() const { return static_cast<uint32_t>(state_.size()); }

  uint64_t MemoryBytes() const { return slice_.size() * sizeof(float) * (1 + state_.size()); }
  uint64_t copies_on_write() const { return copies_on_write_; }

 private:
  TableOptions options_;
  Optimizer optimizer_;
  SliceRange slice_;
  // A value buffer's flag, set when PrepareWrite() replaces it while replies hold it; its
  // deleter (on whichever thread drops the last share) then takes it off the retired count.
  struct BufferState {
    std::atomic<bool> retired{false};
    uint64_t bytes = 0;
    std::shared_ptr<std::atomic<uint64_t>> retired_total;
  };
  std::shared_ptr<float[]> AllocateValues();

  std::shared_ptr<std::atomic<uint64_t>> retired_bytes_;
  std::shared_ptr<float[]> data_;
  std::shared_ptr<BufferState> data_state_;
  std::vector<std::unique_ptr<float[]>> state_;
  std::vector<float*> state_ptrs_;
  uint64_t copies_on_write_ = 0;
};

}  // namespace parasol
