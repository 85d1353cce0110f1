// How much optimizer state each row or element carries, for servers (which store it) and
// clients (which may pull it with the values). See server/optimizer.hpp for the layouts.
#pragma once

#include <cstdint>

#include "common/manifest.hpp"

namespace parasol {

// Floats of state after the dim values of a sparse row.
inline uint32_t SparseStateFloats(const OptimizerOptions& o, uint32_t dim) {
  using Kind = OptimizerOptions::Kind;
  switch (o.kind) {
    case Kind::kSgd: return 0;
    case Kind::kAdagrad: return dim;
    case Kind::kAdagradRowwise: return 1;
    case Kind::kAdam: return 2 * dim + 1;
    case Kind::kFtrl: return 2 * dim;
  }
  return 0;
}

// Of those, the words at the end that are not floats (adam's step count, a uint32): copied
// as they are, never rounded.
inline uint32_t SparseStateRawWords(const OptimizerOptions& o) {
  return o.kind == OptimizerOptions::Kind::kAdam ? 1 : 0;
}

// State arrays of a dense slice, one float (or uint32 step) per element each.
inline uint32_t DenseStateArrays(const OptimizerOptions& o) {
  using Kind = OptimizerOptions::Kind;
  switch (o.kind) {
    case Kind::kSgd: return 0;
    case Kind::kAdagrad: return 1;
    case Kind::kAdagradRowwise: return 0;  // refused for dense tables by the manifest
    case Kind::kAdam: return 3;
    case Kind::kFtrl: return 2;
  }
  return 0;
}

}  // namespace parasol
