// Deterministic initial values for table rows and dense elements.
//
// A sparse row's values depend only on (table seed, key); a dense element's only on
// (table seed, global element index). The same job therefore starts from the same numbers
// whatever the shard count, the engine count or the order in which keys arrive.
// Thread-safety: pure functions.
#pragma once

#include <cstdint>
#include <span>

#include "common/manifest.hpp"

namespace parasol {

// Fills `row` (dim floats) with the initial value of `key`.
void InitSparseRow(const InitOptions& init, uint64_t seed, uint64_t key, std::span<float> row);

// Fills `out` with the initial values of dense elements [first, first + out.size()).
void InitDenseRange(const InitOptions& init, uint64_t seed, uint64_t first, std::span<float> out);

}  // namespace parasol
