#include <cuda_runtime.h>

#include "kernels/cuda_check.hpp"
#include "kernels/embedding_pool.hpp"

namespace parasol {
namespace {

int ThreadsFor(int dim) { return dim >= 128 ? 128 : ((dim + 31) / 32) * 32; }

// One block per bag; threads stride over the row's columns, so reads of a row coalesce.
__global__ void EmbeddingPoolKernel(float* __restrict__ out, const float* __restrict__ rows,
                                    int dim, const uint32_t* __restrict__ indices,
                                    const float* __restrict__ values,
                                    const uint32_t* __restrict__ offsets) {
  const uint32_t b = blockIdx.x;
  const uint32_t begin = offsets[b];
  const uint32_t end = offsets[b + 1];
  for (int d = threadIdx.x; d < dim; d += blockDim.x) {
    float acc = 0.0f;
    for (uint32_t j = begin; j < end; ++j) {
      acc += (values ? values[j] : 1.0f) * rows[size_t{indices[j]} * dim + d];
    }
    out[size_t{b} * dim + d] = acc;
  }
}

__global__ void EmbeddingPoolBackwardKernel(float* __restrict__ drows,
                                            const float* __restrict__ dout, int dim,
                                            const uint32_t* __restrict__ indices,
                                            const float* __restrict__ values,
                                            const uint32_t* __restrict__ offsets) {
  const uint32_t b = blockIdx.x;
  for (uint32_t j = offsets[b]; j < offsets[b + 1]; ++j) {
    const float v = values ? values[j] : 1.0f;
    for (int d = threadIdx.x; d < dim; d += blockDim.x) {
      atomicAdd(&drows[size_t{indices[j]} * dim + d], v * dout[size_t{b} * dim + d]);
    }
  }
}

}  // namespace

Status EmbeddingSumPoolCuda(const float* rows, uint32_t dim, const uint32_t* indices,
                            const uint32_t* offsets, uint32_t batch, float* out, void* stream) {
  return EmbeddingPoolCuda(out, rows, static_cast<int>(dim), indices, nullptr, offsets,
                           static_cast<int>(batch), stream);
}

Status EmbeddingPoolCuda(float* out, const float* rows, int dim, const uint32_t* indices,
                         const float* values, const uint32_t* offsets, int batch, void* stream) {
  if (batch == 0 || dim == 0) return Status::Ok();
  EmbeddingPoolKernel<<<batch, ThreadsFor(dim), 0, static_cast<cudaStream_t>(stream)>>>(
      out, rows, dim, indices, values, offsets);
  PARASOL_CUDA_CHECK_LAUNCH("EmbeddingPoolKernel");
  return Status::Ok();
}

Status EmbeddingPoolBackwardCuda(float* drows, const float* dout, int dim,
                                 const uint32_t* indices, const float* values,
                                 const uint32_t* offsets, int batch, void* stream) {
  if (batch == 0 || dim == 0) return Status::Ok();
  EmbeddingPoolBackwardKernel<<<batch, ThreadsFor(dim), 0, static_cast<cudaStream_t>(stream)>>>(
      drows, dout, dim, indices, values, offsets);
  PARASOL_CUDA_CHECK_LAUNCH("EmbeddingPoolBackwardKernel");
  return Status::Ok();
}

}  // namespace parasol
