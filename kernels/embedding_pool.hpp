// Embedding gather and sum pooling: for each bag b of a batch,
//   out[b, :] = sum of rows[indices[j], :] for j in [offsets[b], offsets[b + 1]).
// `rows` is the buffer of unique rows pulled from the servers (dim floats each); `indices`
// point into it. The CPU function is the reference the CUDA kernel is tested against.
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
#endif

}  // namespace parasol
