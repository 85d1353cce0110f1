// Embedding gather and sum pooling from the buffer of pulled unique rows, and its backward, the
// sum of gradients into those rows:
//   out[b, :] = sum_j values[j] * rows[indices[j], :]   for j in [offsets[b], offsets[b + 1])
//   drows[indices[j], :] += values[j] * dout[b, :]
// `values` may be null (all ones). The CPU functions are the references the CUDA kernels are
// tested against.
//
// The backward runs from the batch's row index (BuildRowIndex): for each unique row, its keys in
// ascending order. Each row's gradient is then summed in an order fixed by the row's keys alone,
// so it is the same from run to run (no atomics); rows with many keys (a hot id repeated across
// the batch) are listed apart and summed by a whole block.
#pragma once

#include <cstdint>

#include "common/status.hpp"

namespace parasol {

// A row with at least this many keys in a batch is "hot".
inline constexpr uint32_t kHotRowKeys = 64;

// The batch's row index from indices[0, keys) (each < unique): row_start [unique + 1] and occ
// [keys] (the key positions of row u are occ[row_start[u] .. row_start[u + 1]), ascending), and
// hot_rows (the rows with at least kHotRowKeys keys, ascending; at most keys / kHotRowKeys).
// Returns the number of hot rows. A counting sort: O(keys + unique), no allocation.
uint32_t BuildRowIndex(const uint32_t* indices, uint32_t keys, uint32_t unique,
                       uint32_t* row_start, uint32_t* occ, uint32_t* hot_rows);

// REQUIRES: offsets has batch + 1 entries, non-decreasing; every index < the rows in `rows`.
void EmbeddingSumPoolCpu(const float* rows, uint32_t dim, const uint32_t* indices,
                         const uint32_t* offsets, uint32_t batch, float* out);

#ifdef PARASOL_HAVE_CUDA
// Device pointers; runs on `stream` (a cudaStream_t, passed as void* to keep CUDA headers out).
Status EmbeddingSumPoolCuda(const float* rows, uint32_t dim, const uint32_t* indices,
                            const uint32_t* offsets, uint32_t batch, float* out, void* stream);
// Vectorised (16-byte loads and stores) when dim is a multiple of 4. Debug builds trap on an
// index >= row_count.
Status EmbeddingPoolCuda(float* out, const float* rows, int dim, const uint32_t* indices,
                         const float* values, const uint32_t* offsets, int batch,
                         uint32_t row_count, void* stream);
// drows must be zeroed by the caller; rows shared by several bags are summed atomically (not
// deterministic; EmbeddingRowGradCuda is).
Status EmbeddingPoolBackwardCuda(float* drows, const float* dout, int dim,
                                 const uint32_t* indices, const float* values,
                                 const uint32_t* offsets, int batch, void* stream);
// Backend::EmbeddingRowGrad.
Status EmbeddingRowGradCuda(float* drows, const float* dout, int dim, const uint32_t* row_start,
                            const uint32_t* occ, const uint32_t* hot_rows, uint32_t hot_count,
                            const uint32_t* key_bags, const float* values, uint32_t unique,
                            const uint32_t* counts, void* stream);
#endif

}  // namespace parasol
