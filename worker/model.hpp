// Model: a CTR model computed on a Backend, with its parameters on the servers.
//
// Each step the trainer pulls the rows of the batch's unique keys and every dense table the
// model lists, hands them to Forward(), calls Backward(), and pushes the row gradients and
// DenseGrads(). Built-in models (manifest `model.kind`):
//   lr    logit = sum_k w_k * value_k + dense . x + b
//   dlrm  bottom MLP on the 13 dense features; one embedding of dimension d per categorical
//         field from one shared table; pairwise dot products of the 27 vectors concatenated
//         with the bottom output; top MLP; sigmoid
// Thread-safety: one model per worker thread.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/manifest.hpp"
#include "common/status.hpp"
#include "worker/backend.hpp"
#include "worker/batch.hpp"

namespace parasol {

class Model {
 public:
  virtual ~Model() = default;

  // REQUIRES: manifest.model.kind != none. `max_batch`: the largest batch to be seen.
  static Result<std::unique_ptr<Model>> Create(const Manifest& manifest, Backend* backend,
                                               uint32_t max_batch);

  uint32_t sparse_table() const { return sparse_table_; }
  uint32_t sparse_dim() const { return sparse_dim_; }
  // The dense tables the model reads, in the order of DenseParams()/DenseGrads().
  const std::vector<uint32_t>& dense_tables() const { return dense_tables_; }
  // Host copies of the dense weights: the trainer pulls into them before Forward().
  std::vector<std::vector<float>>& DenseParams() { return dense_params_; }
  // Host gradients of the dense weights after Backward(), summed over the batch's mean loss.
  const std::vector<std::vector<float>>& DenseGrads() const { return dense_grads_; }

  // Runs the model on `batch`. `rows` holds the pulled rows of the batch's unique keys
  // (unique x sparse_dim floats, host memory); key j of the batch uses row indices[j].
  // Returns the mean log loss; Probabilities() then holds each sample's prediction.
  virtual double Forward(const Batch& batch, const float* rows, uint32_t unique,
                         const uint32_t* indices) = 0;
  // Gradients of the last Forward(): row_grads (unique x sparse_dim, host) and DenseGrads().
  virtual void Backward(float* row_grads) = 0;
  const std::vector<float>& Probabilities() const { return probs_; }

 protected:
  uint32_t sparse_table_ = 0;
  uint32_t sparse_dim_ = 0;
  std::vector<uint32_t> dense_tables_;
  std::vector<std::vector<float>> dense_params_;
  std::vector<std::vector<float>> dense_grads_;
  std::vector<float> probs_;
};

}  // namespace parasol
