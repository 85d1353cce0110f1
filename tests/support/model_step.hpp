// Tests' way to run a Model on host vectors: copies the rows and the dense weights into a slot,
// runs one step and waits for it.
#pragma once

#include <algorithm>
#include <vector>

#include "common/key_index.hpp"
#include "worker/model.hpp"

namespace parasol {

inline Status RunModelStep(Model& model, const Batch& batch, const BatchKeys& keys,
                           const std::vector<float>& rows,
                           const std::vector<std::vector<float>>& dense, bool train,
                           int slot = 0) {
  const auto unique = static_cast<uint32_t>(keys.unique.size());
  float* in = model.StepRows(slot, unique, static_cast<uint32_t>(batch.keys.size()));
  std::copy(rows.begin(), rows.end(), in);
  for (size_t t = 0; t < dense.size(); ++t) {
    std::copy(dense[t].begin(), dense[t].end(), model.StepDense(slot, t).begin());
  }
  model.Run(batch, slot, unique, keys.indices.data(), train);
  return model.Finish(slot);
}

// The sizes of the model's dense tables, as zeroed host vectors.
inline std::vector<std::vector<float>> DenseShapes(Model& model) {
  std::vector<std::vector<float>> dense;
  for (size_t t = 0; t < model.dense_tables().size(); ++t) {
    dense.emplace_back(model.StepDense(0, t).size(), 0.0f);
  }
  return dense;
}

}  // namespace parasol
