#include <cuda_runtime.h>

#include "kernels/cuda_check.hpp"
#include "kernels/embedding_pool.hpp"

namespace parasol {
namespace {

// One block per bag; threads stride over the row's columns, so reads of a row coalesce.
__global__ void EmbeddingSumPoolKernel(const float* __restrict__ rows, uint32_t dim,
                                       const uint32_t* __restrict__ indices,
                                       const uint32_t* __restrict__ offsets,
                                       float* __restrict__ out) {
  const uint32_t b = blockIdx.x;
  const uint32_t begin = offsets[b];
  const uint32_t end = offsets[b + 1];
  for (uint32_t d = threadIdx.x; d < dim; d += blockDim.x) {
    float acc = 0.0f;
    for (uint32_t j = begin; j < end; ++j) acc += rows[size_t{indices[j]} * dim + d];
    out[size_t{b} * dim + d] = acc;
  }
}

}  // namespace

Status EmbeddingSumPoolCuda(const float* rows, uint32_t dim, const uint32_t* indices,
                            const uint32_t* offsets, uint32_t batch, float* out, void* stream) {
  if (batch == 0 || dim == 0) return Status::Ok();
  const uint32_t threads = dim >= 128 ? 128 : ((dim + 31) / 32) * 32;
  EmbeddingSumPoolKernel<<<batch, threads, 0, static_cast<cudaStream_t>(stream)>>>(
      rows, dim, indices, offsets, out);
  PARASOL_CUDA_CHECK_LAUNCH("EmbeddingSumPoolKernel");
  return Status::Ok();
}

}  // namespace parasol
