#include <cuda_runtime.h>

#include <cassert>

#include "kernels/cuda_check.hpp"
#include "kernels/embedding_pool.hpp"

namespace parasol {
namespace {

constexpr int kThreads = 256;

// Thread (bag, 4-column group): each thread reads and writes 16 bytes per key, so a warp covers
// 8 bags of dim 16 with fully used 512-byte transactions.
__global__ void EmbeddingPoolVec4Kernel(float4* __restrict__ out, const float4* __restrict__ rows,
                                        int quads, const uint32_t* __restrict__ indices,
                                        const float* __restrict__ values,
                                        const uint32_t* __restrict__ offsets, int batch,
                                        uint32_t row_count) {
  const size_t t = blockIdx.x * size_t{blockDim.x} + threadIdx.x;
  if (t >= size_t(batch) * quads) return;
  const uint32_t b = static_cast<uint32_t>(t / quads);
  const int q = static_cast<int>(t % quads);
  float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
  for (uint32_t j = offsets[b]; j < offsets[b + 1]; ++j) {
    const uint32_t r = indices[j];
    assert(r < row_count);
    const float v = values ? values[j] : 1.0f;
    const float4 x = __ldg(&rows[size_t{r} * quads + q]);
    acc.x += v * x.x;
    acc.y += v * x.y;
    acc.z += v * x.z;
    acc.w += v * x.w;
  }
  out[t] = acc;
}

// Any dim: thread (bag, column).
__global__ void EmbeddingPoolKernel(float* __restrict__ out, const float* __restrict__ rows,
                                    int dim, const uint32_t* __restrict__ indices,
                                    const float* __restrict__ values,
                                    const uint32_t* __restrict__ offsets, int batch,
                                    uint32_t row_count) {
  const size_t t = blockIdx.x * size_t{blockDim.x} + threadIdx.x;
  if (t >= size_t(batch) * dim) return;
  const uint32_t b = static_cast<uint32_t>(t / dim);
  const int d = static_cast<int>(t % dim);
  float acc = 0.0f;
  for (uint32_t j = offsets[b]; j < offsets[b + 1]; ++j) {
    const uint32_t r = indices[j];
    assert(r < row_count);
    acc += (values ? values[j] : 1.0f) * rows[size_t{r} * dim + d];
  }
  out[t] = acc;
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

// The sum for one row by a group of `threads` threads (a warp or a block): the threads form
// `groups` groups of `cols` lanes (cols = the columns taken per pass, a power of two <= 32);
// group g sums the keys g, g + groups, ... of the row in order, then the groups' partial sums
// are added in group order. The order depends only on the row's keys: deterministic.
template <int kThreadsPerRow>
__device__ void RowGradSum(float* __restrict__ drow, const float* __restrict__ dout, int dim,
                           int cols, const uint32_t* __restrict__ occ, uint32_t begin,
                           uint32_t end, const uint32_t* __restrict__ key_bags,
                           const float* __restrict__ values, float* partial, int lane) {
  const int groups = kThreadsPerRow / cols;
  const int g = lane / cols, c = lane % cols;
  for (int c0 = 0; c0 < dim; c0 += cols) {
    const int d = c0 + c;
    float s = 0.0f;
    if (d < dim) {
      for (uint32_t k = begin + g; k < end; k += groups) {
        const uint32_t j = occ[k];
        const uint32_t bag = key_bags ? key_bags[j] : j;
        s += (values ? values[j] : 1.0f) * dout[size_t{bag} * dim + d];
      }
    }
    partial[lane] = s;
    if (kThreadsPerRow == 32) {
      __syncwarp();
    } else {
      __syncthreads();
    }
    if (g == 0 && d < dim) {
      float total = 0.0f;
      for (int h = 0; h < groups; ++h) total += partial[h * cols + c];
      drow[d] = total;
    }
    if (kThreadsPerRow == 32) {
      __syncwarp();
    } else {
      __syncthreads();
    }
  }
}

// One warp per row; hot rows are left to the block kernel.
__global__ void RowGradWarpKernel(float* __restrict__ drows, const float* __restrict__ dout,
                                  int dim, int cols, const uint32_t* __restrict__ row_start,
                                  const uint32_t* __restrict__ occ,
                                  const uint32_t* __restrict__ key_bags,
                                  const float* __restrict__ values, uint32_t unique,
                                  const uint32_t* __restrict__ counts) {
  __shared__ float partial[kThreads];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const uint32_t u = blockIdx.x * (kThreads / 32) + warp;
  if (u >= (counts ? counts[0] : unique)) return;  // the whole warp leaves together
  const uint32_t begin = row_start[u], end = row_start[u + 1];
  if (end - begin >= kHotRowKeys) return;
  RowGradSum<32>(drows + size_t{u} * dim, dout, dim, cols, occ, begin, end, key_bags, values,
                 partial + warp * 32, lane);
}

// One block per hot row.
__global__ void RowGradHotKernel(float* __restrict__ drows, const float* __restrict__ dout,
                                 int dim, int cols, const uint32_t* __restrict__ row_start,
                                 const uint32_t* __restrict__ occ,
                                 const uint32_t* __restrict__ hot_rows,
                                 const uint32_t* __restrict__ key_bags,
                                 const float* __restrict__ values,
                                 const uint32_t* __restrict__ counts) {
  __shared__ float partial[kThreads];
  if (counts && blockIdx.x >= counts[1]) return;  // the whole block leaves together
  const uint32_t u = hot_rows[blockIdx.x];
  RowGradSum<kThreads>(drows + size_t{u} * dim, dout, dim, cols, occ, row_start[u],
                       row_start[u + 1], key_bags, values, partial, threadIdx.x);
}

int ColumnsPerPass(int dim) {
  int c = 1;
  while (c < dim && c < 32) c *= 2;
  return c;
}

}  // namespace

Status EmbeddingSumPoolCuda(const float* rows, uint32_t dim, const uint32_t* indices,
                            const uint32_t* offsets, uint32_t batch, float* out, void* stream) {
  return EmbeddingPoolCuda(out, rows, static_cast<int>(dim), indices, nullptr, offsets,
                           static_cast<int>(batch), UINT32_MAX, stream);
}

Status EmbeddingPoolCuda(float* out, const float* rows, int dim, const uint32_t* indices,
                         const float* values, const uint32_t* offsets, int batch,
                         uint32_t row_count, void* stream) {
  if (batch == 0 || dim == 0) return Status::Ok();
  const auto s = static_cast<cudaStream_t>(stream);
  const bool aligned = reinterpret_cast<uintptr_t>(out) % 16 == 0 &&
                       reinterpret_cast<uintptr_t>(rows) % 16 == 0;
  if (dim % 4 == 0 && aligned) {
    const int quads = dim / 4;
    const size_t threads = size_t(batch) * quads;
    EmbeddingPoolVec4Kernel<<<static_cast<unsigned>((threads + kThreads - 1) / kThreads),
                              kThreads, 0, s>>>(reinterpret_cast<float4*>(out),
                                                reinterpret_cast<const float4*>(rows), quads,
                                                indices, values, offsets, batch, row_count);
    PARASOL_CUDA_CHECK_LAUNCH("EmbeddingPoolVec4Kernel");
  } else {
    const size_t threads = size_t(batch) * dim;
    EmbeddingPoolKernel<<<static_cast<unsigned>((threads + kThreads - 1) / kThreads), kThreads,
                          0, s>>>(out, rows, dim, indices, values, offsets, batch, row_count);
    PARASOL_CUDA_CHECK_LAUNCH("EmbeddingPoolKernel");
  }
  return Status::Ok();
}

Status EmbeddingPoolBackwardCuda(float* drows, const float* dout, int dim,
                                 const uint32_t* indices, const float* values,
                                 const uint32_t* offsets, int batch, void* stream) {
  if (batch == 0 || dim == 0) return Status::Ok();
  const int threads = dim >= 128 ? 128 : ((dim + 31) / 32) * 32;
  EmbeddingPoolBackwardKernel<<<batch, threads, 0, static_cast<cudaStream_t>(stream)>>>(
      drows, dout, dim, indices, values, offsets);
  PARASOL_CUDA_CHECK_LAUNCH("EmbeddingPoolBackwardKernel");
  return Status::Ok();
}

Status EmbeddingRowGradCuda(float* drows, const float* dout, int dim, const uint32_t* row_start,
                            const uint32_t* occ, const uint32_t* hot_rows, uint32_t hot_count,
                            const uint32_t* key_bags, const float* values, uint32_t unique,
                            const uint32_t* counts, void* stream) {
  if (unique == 0 || dim == 0) return Status::Ok();
  const auto s = static_cast<cudaStream_t>(stream);
  const int cols = ColumnsPerPass(dim);
  const unsigned warps_per_block = kThreads / 32;
  RowGradWarpKernel<<<(unique + warps_per_block - 1) / warps_per_block, kThreads, 0, s>>>(
      drows, dout, dim, cols, row_start, occ, key_bags, values, unique, counts);
  PARASOL_CUDA_CHECK_LAUNCH("RowGradWarpKernel");
  if (hot_count > 0) {
    RowGradHotKernel<<<hot_count, kThreads, 0, s>>>(drows, dout, dim, cols, row_start, occ,
                                                    hot_rows, key_bags, values, counts);
    PARASOL_CUDA_CHECK_LAUNCH("RowGradHotKernel");
  }
  return Status::Ok();
}

}  // namespace parasol
