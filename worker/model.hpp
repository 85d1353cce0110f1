// Model: a CTR model computed on a Backend, with its parameters on the servers.
//
// Each step the trainer pulls the rows of the batch's unique keys and every dense table the
// model lists straight into the step's input slot (StepRows, StepDense: host memory the
// backend copies from without staging), calls Run() and Finish(), and pushes RowGrads() and
// DenseGrads(). A step crosses to the device once each way: one upload of the slot (dense
// weights, features, labels, the batch's row index, the rows) and one download (probabilities,
// loss, gradients), with one synchronisation. There are two slots, so the next step's pulls can
// land while a step runs. Built-in models (manifest `model.kind`):
//   lr    logit = sum_k w_k * value_k + dense . x + b
//   dlrm  bottom MLP on the 13 dense features; one embedding of dimension d per categorical
//         field from one shared table; pairwise dot products of the 27 vectors concatenated
//         with the bottom output; top MLP; sigmoid
// Thread-safety: one model per worker thread.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "common/manifest.hpp"
#include "common/status.hpp"
#include "worker/backend.hpp"
#include "worker/batch.hpp"

namespace parasol {

class Model {
 public:
  static constexpr int kSlots = 2;
  virtual ~Model() = default;

  // REQUIRES: manifest.model.kind != none. `max_batch`: the largest batch to be seen.
  static Result<std::unique_ptr<Model>> Create(const Manifest& manifest, Backend* backend,
                                               uint32_t max_batch);

  uint32_t sparse_table() const { return sparse_table_; }
  uint32_t sparse_dim() const { return sparse_dim_; }
  // The dense tables the model reads, in the order of StepDense()/DenseGrads().
  const std::vector<uint32_t>& dense_tables() const { return dense_tables_; }

  // Where the rows of `unique` keys of a batch of `keys` keys go for slot `slot` (unique x
  // sparse_dim floats), or null when the host memory for them could not be had. May move the
  // slot's memory: call it before any pull into the slot for the step, and take StepDense(slot)
  // after it.
  virtual float* StepRows(int slot, uint32_t unique, uint32_t keys) = 0;
  // Where dense table i's weights go for slot `slot` (one span per dense table).
  std::span<float> StepDense(int slot, size_t i) { return dense_in_[slot][i]; }

  // Runs the model on `batch` with slot `slot`'s inputs (key j uses row indices[j] of the
  // `unique` rows): one upload, the forward pass and, when `train`, the backward pass, then one
  // download. Asynchronous: Finish(slot) waits. The two slots have their own device buffers, so
  // a step's upload overlaps the other slot's step still running. REQUIRES: the slot's last
  // step was finished.
  virtual void Run(const Batch& batch, int slot, uint32_t unique, const uint32_t* indices,
                   bool train) = 0;
  // Waits for slot `slot`'s step (one synchronisation) and returns the backend's first error;
  // then Loss(), Probabilities() and, after a training step, RowGrads() and DenseGrads() hold its
  // results until the slot's next Run().
  Status Finish(int slot);
  double Loss() const { return loss_; }
  std::span<const float> Probabilities() const {
    return {out_[finished_].probs, out_[finished_].batch};
  }
  std::span<const float> RowGrads() const {
    return {out_[finished_].row_grads, size_t{out_[finished_].unique} * sparse_dim_};
  }
  // Gradients of the dense weights over the batch's mean loss, one span per dense table.
  const std::vector<std::span<const float>>& DenseGrads() const {
    return out_[finished_].dense_grads;
  }

 protected:
  explicit Model(Backend* backend) : backend_(backend) {}

  // Where a slot's results land (host memory), set by Run().
  struct SlotOutput {
    const float* probs = nullptr;
    const float* row_grads = nullptr;
    const double* loss_sum = nullptr;
    uint32_t batch = 0, unique = 0;
    std::vector<std::span<const float>> dense_grads;
  };

  Backend* backend_;
  bool failed_ = false;  // its host or device memory could not be had
  uint32_t sparse_table_ = 0;
  uint32_t sparse_dim_ = 0;
  std::vector<uint32_t> dense_tables_;
  // Set by the model: the spans into its slots' inputs, and its slots' outputs.
  std::vector<std::span<float>> dense_in_[kSlots];
  SlotOutput out_[kSlots];
  int finished_ = 0;
  double loss_ = 0;
};

// A buffer of regions: offsets rounded up to 256 bytes, laid out in the order they are added.
class RegionLayout {
 public:
  // Adds a region of `bytes` bytes; returns its offset.
  size_t Add(size_t bytes) {
    const size_t at = (size_ + 255) / 256 * 256;
    size_ = at + bytes;
    return at;
  }
  size_t size() const { return size_; }

 private:
  size_t size_ = 0;
};

}  // namespace parasol
