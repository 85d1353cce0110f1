// Optimizer: the update rules the server applies, and where their state lives.
//
// Sparse rows keep their state right after their values, in the same allocation, so one row
// update touches one contiguous block:
//   sgd              [w x dim]
//   adagrad          [w x dim][acc x dim]
//   adagrad_rowwise  [w x dim][acc]                (one accumulator per row, as in DLRM)
//   adam             [w x dim][m x dim][v x dim][step]
//   ftrl             [w x dim][z x dim][n x dim]
// Dense slices keep each state as an array beside the values (adam's step per element, since a
// dense push may arrive in chunks). Arithmetic is done in double and stored as float.
//
// Gradients arrive as raw little-endian f32 bytes straight from a received frame (possibly
// unaligned) and are read through std::memcpy. Thread-safety: const methods, no shared state;
// callers guarantee exclusive access to the memory they pass.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>

#include "common/manifest.hpp"

namespace parasol {

inline float LoadF32(const std::byte* p) {
  float v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}

// Where the state of a run of n elements is. Unused members are null.
struct OptimizerState {
  float* a = nullptr;          // adagrad: acc; adam: m; ftrl: z (n each)
  float* b = nullptr;          // adam: v; ftrl: n (n each)
  float* row_acc = nullptr;    // adagrad_rowwise: the row's accumulator
  uint32_t* step = nullptr;    // adam: the row's step (sparse) or each element's (dense)
  bool step_per_element = false;
  bool row = false;            // a sparse row's: updated whole or not at all
};

class Optimizer {
 public:
  explicit Optimizer(const OptimizerOptions& options) : o_(options) {}

  const OptimizerOptions& options() const { return o_; }

  // Floats of state after the dim values of a sparse row.
  uint32_t SparseStateFloats(uint32_t dim) const;
  // The state inside a sparse row whose values start at `w`.
  OptimizerState SparseState(float* w, uint32_t dim) const;

  // Number of n-element float arrays a dense slice of n elements keeps (adam's step array is
  // counted as one: uint32 has the size of float).
  uint32_t DenseStateArrays() const;
  // The state of dense elements [i, i + ...) given the state arrays' bases.
  OptimizerState DenseState(float* const* arrays, uint64_t i) const;

  // Sets the state of n fresh elements whose initial values are `w`.
  void InitState(const float* w, OptimizerState s, uint32_t n) const;

  // One update of n elements with gradient `grad` (raw f32) times `scale`. An update that
  // would leave a value or its state not finite (finite gradients can overflow: a sum of
  // large ones, a huge learning rate) is not made: the elements keep what they held, a
  // sparse row whole (SparseState()) or a run of at most kGuardRun dense elements. (Values
  // stored in f16 are checked as f32: past 65504 they round to infinity when stored, as the
  // docs/concepts.md says of f16.) Returns how many elements were kept so; nonfinite_kept() counts them all.
  uint64_t Apply(float* w, OptimizerState s, const std::byte* grad, uint64_t n,
                 double scale) const;
  static constexpr uint64_t kGuardRun = 256;
  uint64_t nonfinite_kept() const { return kept_->load(std::memory_order_relaxed); }

 private:
  OptimizerOptions o_;
  // Shared by copies (a table's optimizer is copied into its partitions' views).
  std::shared_ptr<std::atomic<uint64_t>> kept_ = std::make_shared<std::atomic<uint64_t>>(0);
};

}  // namespace parasol
