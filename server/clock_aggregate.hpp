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
// Reuse: a clock's parts, once applied, can go to a SpareParts (Recycle()), their sums cleared
// and their buffers kept; a later clock's new parts are taken from there. Once the shard has
// seen a clock as large, a clock's sums need no allocation, no growth (with its copies) and no
// page faults of fresh memory.
//
// Thread-safety: PartOf(), PrepareCombine() and Recycle() are called on the request thread;
// the sums of (table, engine) of a part, and CombineOn(engine), are touched only by that
// engine.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <vector>

#include "common/key_index.hpp"
#include "common/sharding.hpp"

namespace parasol {

struct SpareParts;

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
    // Before the first push to (table, engine): room for its `keys` without growing (a part
    // taken from the spares usually has it already). Later pushes grow as vectors do.
    void ReserveSparse(uint32_t table, uint32_t engine, size_t keys, uint32_t dim);

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

    // The memory held (buffers' capacity, a reused part's included).
    uint64_t MemoryBytes() const;
    // What the sums themselves take, as a part made for them would: the pending limits count
    // this, the same whichever part (reused or not) a worker's pushes land in.
    uint64_t SumBytes() const;

   private:
    friend class ClockAggregate;
    // Drops every sum, keeping the sparse sums' buffers (the dense ones are freed).
    void Clear();

    struct SparseSums {
      KeyIndex index{16};
      std::vector<uint64_t> keys;
      std::vector<float> sums;
    };
    std::vector<std::vector<SparseSums>> sparse_;  // [table][engine]
    std::vector<std::unique_ptr<float[]>> dense_;  // [table]
    std::vector<uint64_t> dense_elements_;
  };

  // New parts are taken from `spares` when it has one (it must outlive this aggregate).
  ClockAggregate(uint32_t tables, uint32_t engines, SpareParts* spares = nullptr);

  // The part of `worker` (a rank, or kNoWorker), made when new. Not after PrepareCombine().
  Part& PartOf(int64_t worker);
  // Once the clock is applied (or dropped): gives its parts to the spares, as far as they
  // take them, and leaves this aggregate empty.
  void Recycle();
  // The parts by worker, in rank order (kNoWorker first). Empty once combined.
  const std::map<int64_t, Part>& parts() const { return parts_; }

  // Folding the parts in rank order, for every key and element: PrepareCombine() on the
  // request thread, then CombineOn(e) on every engine e (each touches its own keys and its
  // share of each dense table's elements). Then sums() holds the clock's sums. A second
  // PrepareCombine() does nothing.
  void PrepareCombine();
  void CombineOn(uint32_t engine);
  // After every CombineOn(): frees the parts folded in (gives them to the spares).
  void EndCombine();
  bool combined() const { return combined_ != nullptr; }
  // The combined sums (after PrepareCombine() and every CombineOn()).
  const Part& sums() const { return *combined_; }

  // Whether `worker`'s part (or, once combined, the sums) has sums of dense table `table`.
  bool HasDense(int64_t worker, uint32_t table) const;

  // Every part's dense sums of `table` re-cut (Part::ResliceDense()).
  void ResliceDense(uint32_t table, SliceRange from, SliceRange to);

  uint64_t MemoryBytes() const;
  uint64_t SumBytes() const;  // Part::SumBytes() of every part

 private:
  // Clears `done` and keeps as many as the spares take; frees the others.
  void GiveToSpares(std::vector<Part>& done);

  uint32_t tables_;
  uint32_t engines_;
  SpareParts* spares_;
  std::map<int64_t, Part> parts_;
  std::unique_ptr<Part> combined_;
  // While combining: the parts after the first, in rank order (the first became combined_).
  std::vector<Part> rest_;
};

// Applied clocks' parts, cleared, for the next clocks (ClockAggregate::Recycle()). Bounded:
// at most max_parts parts of at most max_bytes in all (MemoryBytes()). The pending limits do
// not count what a reused part holds beyond its sums (SumBytes()).
struct SpareParts {
  // A part is kept only while its buffers hold at most 4 times what its last clock summed
  // (plus this), so that one large clock does not leave every later one clearing its index.
  static constexpr uint64_t kSlackBytes = 64 << 10;
  size_t max_parts = 4;
  uint64_t max_bytes = 0;
  uint64_t bytes = 0;        // what the kept parts hold
  uint64_t reused = 0;       // parts taken by a later clock, since the start
  std::vector<ClockAggregate::Part> parts;
};

// A shard's aggregates of the clocks not yet applied, by clock. Checkpoints hold them
// (server/shard_state.hpp): their pushes are already in the push record.
using PendingAggregates = std::map<int64_t, std::unique_ptr<ClockAggregate>>;

}  // namespace parasol
