// ClockAggregate: under BSP, the gradients pushed for one clock, summed per key (sparse) or
// element (dense), until every live worker has moved past that clock and the shard applies
// their average once.
// Thread-safety: the sums of (table, engine) are touched only by that engine; DenseSum() is
// called on the request thread before the engines run.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <vector>

#include "common/key_index.hpp"
#include "common/sharding.hpp"

namespace parasol {

class ClockAggregate {
 public:
  ClockAggregate(uint32_t tables, uint32_t engines);

  // The sum row of `key` in sparse table `table`, owned by `engine`; zeroes when new. The
  // pointer is valid until the next call for the same (table, engine).
  float* SparseSum(uint32_t table, uint32_t engine, uint64_t key, uint32_t dim);

  // Calls fn(key, sum) for every key summed in (table, engine).
  template <typename Fn>
  void ForEachSparse(uint32_t table, uint32_t engine, uint32_t dim, Fn&& fn) const {
    const SparseSums& s = sparse_[table][engine];
    for (size_t i = 0; i < s.keys.size(); ++i) fn(s.keys[i], s.sums.data() + i * dim);
  }

  // The position of `key` among SparseKeys(table, engine), or KeyIndex::kAbsent.
  uint32_t FindSparse(uint32_t table, uint32_t engine, uint64_t key) const {
    return sparse_[table][engine].index.Find(key);
  }

  // The keys summed for `table` on `engine` (in the order of their first push), and their sums
  // (dim floats each, in the same order).
  std::span<const uint64_t> SparseKeys(uint32_t table, uint32_t engine) const {
    return sparse_[table][engine].keys;
  }
  const float* SparseSumsOf(uint32_t table, uint32_t engine) const {
    return sparse_[table][engine].sums.data();
  }

  // The sum buffer of dense table `table`'s slice (`elements` floats, zeroed when new).
  float* DenseSum(uint32_t table, uint64_t elements);
  // The buffer, or nullptr when no push of this clock touched the table.
  const float* DenseSumIfAny(uint32_t table) const { return dense_[table].get(); }

  // The dense sums of `table` (if any) re-cut from a slice `from` to a slice `to` of the same
  // tensor: the elements of both keep their sums, the others start at zero.
  void ResliceDense(uint32_t table, SliceRange from, SliceRange to);

  uint64_t MemoryBytes() const;

 private:
  struct SparseSums {
    KeyIndex index{16};
    std::vector<uint64_t> keys;
    std::vector<float> sums;
  };
  std::vector<std::vector<SparseSums>> sparse_;  // [table][engine]
  std::vector<std::unique_ptr<float[]>> dense_;  // [table]
  std::vector<uint64_t> dense_elements_;
};

// A shard's aggregates of the clocks not yet applied, by clock. Checkpoints hold them
// (server/shard_state.hpp): their pushes are already in the push record.
using PendingAggregates = std::map<int64_t, std::unique_ptr<ClockAggregate>>;

}  // namespace parasol
