// Embedding gather and sum pooling from the buffer of pulled unique rows, and its backward, the
// scatter-add of gradients into those rows:
//   out[b, :] = sum_j values[j] * rows[indices[j], :]   for j in [offsets[b], offsets[b + 1])
//   drows[indices[j], :] += values[j] * dout[b, :]
// `values` may be null (all ones). The CPU functions are the references the CUDA kernels are
// tested against.
#pragma once

#include <cstdint>

#include "common/status.hpp"

namespace parasol {

// REQUIRES: offsets has batch + 1 entries, non-decreasing; every index < the rows in `rows`.
void EmbeddingSumPoolCpu(const float* rows, uint32_t dim, const uint32_t* indices,
                         const uint32_t* offsets, uint32_t batch, float* out);

#ifdef PARASOL_HAVE_CUDA
// Device pointers; runs on `stream` (a cudaStream_t, passed as void* to keep CUDA headers out).
Status EmbeddingSumPoolCuda(const float* rows, uint32_t dim, const uint32_t* indices,
                            const uint32_t* offsets, uint32_t batch, float* out, void* stream);
Status EmbeddingPoolCuda(float* out, const float* rows, int dim, const uint32_t* indices,
                         const float* values, const uint32_t* offsets, int batch, void* stream);
// drows must be zeroed by the caller; rows shared by several bags are summed atomically.
Status EmbeddingPoolBackwardCuda(float* drows, const float* dout, int dim,
                                 const uint32_t* indices, const float* values,
                                 const uint32_t* offsets, int batch, void* stream);
#endif

}  // namespace parasol
