// ClockAggregate: under BSP, the gradients pushed for one clock, summed per key (sparse) or
// element (dense), until every live worker has moved past that clock and the shard applies
// their average once.
//
// The sums are kept per worker (a Part each) and folded in rank order only when the clock is
// applied (Combine()). Float addition is not associative: summed in arrival order, three or
// more workers' gradients would give other bits on every run. A worker's own pushes reach the
// shard in the order it sent them over its one connection, and its replays keep that order;
// a push resent after a lost connection may come after pushes sent behind it, which changes
// no bits unless one worker adds three or more times to the same value in one clock (a worker
// pushes a key once per table per step). So each part, and the fold, is the same whatever
// the arrival order across workers. Sums restored from a checkpoint older than this (of no
// one worker) are folded first.
//
// Memory: a clock's sums are held once per worker that pushed to them (the pending limits,
// server.max_pending_bytes, count each worker's), and the fold grows the lowest rank's part
// to the union of the keys while the others are still held.
//
// Thread-safety: PartOf() and PrepareCombine() are called on the request thread; the sums of
// (table, engine) of a part, and CombineOn(engine), are touched only by that engine.
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
  // The part of sums restored from a checkpoint that did not say whose they were.
  static constexpr int64_t kNoWorker = -1;

  // The sums of one worker's pushes of the clock (or of the whole clock, once combined).
  class Part {
   public:
    Part(uint32_t tables, uint32_t engines);

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
    // The keys summed for `table` on `engine` (in the order of their first push), and their
    // sums (dim floats each, in the same order).
    std::span<const uint64_t> SparseKeys(uint32_t table, uint32_t engine) const {
      return sparse_[table][engine].keys;
    }
    const float* SparseSumsOf(uint32_t table, uint32_t engine) const {
      return sparse_[table][engine].sums.data();
    }

    // The sum buffer of dense table `table`'s slice (`elements` floats, zeroed when new).
    float* DenseSum(uint32_t table, uint64_t elements);
    // The buffer, or nullptr when no push of this part touched the table.
    const float* DenseSumIfAny(uint32_t table) const { return dense_[table].get(); }
    uint64_t DenseElements(uint32_t table) const { return dense_elements_[table]; }

    // The dense sums of `table` (if any) re-cut from a slice `from` to a slice `to` of the same
    // tensor: the elements of both keep their sums, the others start at zero.
    void ResliceDense(uint32_t table, SliceRange from, SliceRange to);

    uint64_t MemoryBytes() const;

   private:
    friend class ClockAggregate;
    struct SparseSums {
      KeyIndex index{16};
      std::vector<uint64_t> keys;
      std::vector<float> sums;
    };
    std::vector<std::vector<SparseSums>> sparse_;  // [table][engine]
    std::vector<std::unique_ptr<float[]>> dense_;  // [table]
    std::vector<uint64_t> dense_elements_;
  };

  ClockAggregate(uint32_t tables, uint32_t engines);

  // The part of `worker` (a rank, or kNoWorker), made when new. Not after PrepareCombine().
  Part& PartOf(int64_t worker);
  // The parts by worker, in rank order (kNoWorker first). Empty once combined.
  const std::map<int64_t, Part>& parts() const { return parts_; }

  // Folding the parts in rank order, for every key and element: PrepareCombine() on the
  // request thread, then CombineOn(e) on every engine e (each touches its own keys and its
  // share of each dense table's elements). Then sums() holds the clock's sums. A second
  // PrepareCombine() does nothing.
  void PrepareCombine();
  void CombineOn(uint32_t engine);
  // After every CombineOn(): frees the parts folded in.
  void EndCombine() { rest_.clear(); }
  bool combined() const { return combined_ != nullptr; }
  // The combined sums (after PrepareCombine() and every CombineOn()).
  const Part& sums() const { return *combined_; }

  // Whether `worker`'s part (or, once combined, the sums) has sums of dense table `table`.
  bool HasDense(int64_t worker, uint32_t table) const;

  // Every part's dense sums of `table` re-cut (Part::ResliceDense()).
  void ResliceDense(uint32_t table, SliceRange from, SliceRange to);

  uint64_t MemoryBytes() const;

 private:
  uint32_t tables_;
  uint32_t engines_;
  std::map<int64_t, Part> parts_;
  std::unique_ptr<Part> combined_;
  // While combining: the parts after the first, in rank order (the first became combined_).
  std::vector<Part> rest_;
};

// A shard's aggregates of the clocks not yet applied, by clock. Checkpoints hold them
// (server/shard_state.hpp): their pushes are already in the push record.
using PendingAggregates = std::map<int64_t, std::unique_ptr<ClockAggregate>>;

}  // namespace parasol
