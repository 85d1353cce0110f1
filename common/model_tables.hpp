// The parameter tables of the built-in models, derived from the manifest's `model` section so
// that servers and workers agree on them without listing them by hand.
//
//   lr    model.weights  sparse, dim 1 (one weight per hashed feature key)
//         model.dense.0.weight [1, 13], model.dense.0.bias [1]
//   dlrm  model.embeddings sparse, dim d (one shared table for the 26 fields)
//         model.bottom.i.weight [out, in], model.bottom.i.bias [out]  (13 -> ... -> d)
//         model.top.i.weight, model.top.i.bias  (d + 27*26/2 -> ... -> 1)
// Weights start Glorot-uniform, biases at zero, embeddings uniform in +-embedding_init_scale.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/manifest.hpp"
#include "common/status.hpp"

namespace parasol {

inline constexpr uint32_t kCriteoDenseFeatures = 13;
inline constexpr uint32_t kCriteoSparseFields = 26;

struct DenseLayerSpec {
  std::string weight_table;  // [out, in], row-major
  std::string bias_table;    // [out]
  uint32_t in = 0;
  uint32_t out = 0;
};

struct ModelLayout {
  std::string sparse_table;
  uint32_t sparse_dim = 0;
  std::vector<DenseLayerSpec> bottom;  // dlrm only
  std::vector<DenseLayerSpec> top;     // dlrm: the top MLP; lr: the one dense layer
  // dlrm: width of the interaction output (d + pairs of the 27 vectors).
  uint32_t interaction_width = 0;
};

ModelLayout LayoutOf(const ModelOptions& model);

// Appends the model's tables to manifest->tables (nothing for model kind none). A table the
// manifest already lists under a model.* name is an error.
Status AddModelTables(Manifest* manifest);

}  // namespace parasol
