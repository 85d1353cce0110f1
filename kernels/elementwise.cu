#include <cuda_runtime.h>

#include "kernels/cuda_check.hpp"
#include "kernels/elementwise.hpp"

namespace parasol {
namespace {

constexpr int kThreads = 256;

int Blocks(size_t n) { return static_cast<int>((n + kThreads - 1) / kThreads); }

__global__ void ReluKernel(float* y, const float* x, size_t n) {
  const size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x;
  if (i < n) y[i] = x[i] > 0.0f ? x[i] : 0.0f;
}

__global__ void ReluBackwardKernel(float* dx, const float* dy, const float* y, size_t n) {
  const size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x;
  if (i < n) dx[i] = y[i] > 0.0f ? dy[i] : 0.0f;
}

__global__ void AddBiasKernel(float* y, const float* bias, int rows, int cols) {
  const size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x;
  if (i < size_t{static_cast<size_t>(rows)} * cols) y[i] += bias[i % cols];
}

template <bool kRelu>
__global__ void BiasActivationKernel(float* y, const float* bias, int rows, int cols) {
  const size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x;
  if (i >= size_t{static_cast<size_t>(rows)} * cols) return;
  const float v = y[i] + bias[i % cols];
  y[i] = kRelu ? (v > 0.0f ? v : 0.0f) : v;
}

// Column sums over a grid: block (x: 32 columns, y: 8 row lanes) takes kRowsPerChunk rows of
// 32 columns and writes one partial sum per column to partial[chunk][col]; with kRelu it also
// writes dpre. The partials are then added in chunk order (ColumnSumKernel): deterministic.
constexpr int kRowsPerChunk = 64;

template <bool kRelu>
__global__ void ColumnPartialKernel(float* partial, float* dpre, const float* dy, const float* y,
                                    int rows, int cols) {
  __shared__ float lanes[8][33];
  const int c = blockIdx.x * 32 + threadIdx.x;
  const int r0 = blockIdx.y * kRowsPerChunk;
  const int r1 = min(rows, r0 + kRowsPerChunk);
  float s = 0.0f;
  if (c < cols) {
    for (int r = r0 + threadIdx.y; r < r1; r += 8) {
      const size_t i = size_t(r) * cols + c;
      float g = dy[i];
      if (kRelu) {
        g = y[i] > 0.0f ? g : 0.0f;
        dpre[i] = g;
      }
      s += g;
    }
  }
  lanes[threadIdx.y][threadIdx.x] = s;
  __syncthreads();
  if (threadIdx.y == 0 && c < cols) {
    float t = 0.0f;
    for (int k = 0; k < 8; ++k) t += lanes[k][threadIdx.x];
    partial[size_t(blockIdx.y) * cols + c] = t;
  }
}

__global__ void ColumnSumKernel(float* db, const float* partial, int chunks, int cols) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= cols) return;
  float s = 0.0f;
  for (int k = 0; k < chunks; ++k) s += partial[size_t(k) * cols + c];
  db[c] = s;
}

__global__ void FillKernel(float* dst, float value, size_t n) {
  const size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x;
  if (i < n) dst[i] = value;
}

cudaStream_t S(void* stream) { return static_cast<cudaStream_t>(stream); }

}  // namespace

size_t ColumnSumWorkspaceFloats(int rows, int cols) {
  return size_t((rows + kRowsPerChunk - 1) / kRowsPerChunk) * cols;
}

Status ReluCuda(float* y, const float* x, size_t n, void* stream) {
  if (n == 0) return Status::Ok();
  ReluKernel<<<Blocks(n), kThreads, 0, S(stream)>>>(y, x, n);
  PARASOL_CUDA_CHECK_LAUNCH("ReluKernel");
  return Status::Ok();
}

Status ReluBackwardCuda(float* dx, const float* dy, const float* y, size_t n, void* stream) {
  if (n == 0) return Status::Ok();
  ReluBackwardKernel<<<Blocks(n), kThreads, 0, S(stream)>>>(dx, dy, y, n);
  PARASOL_CUDA_CHECK_LAUNCH("ReluBackwardKernel");
  return Status::Ok();
}

Status AddBiasCuda(float* y, const float* bias, int rows, int cols, void* stream) {
  const size_t n = size_t{static_cast<size_t>(rows)} * cols;
  if (n == 0) return Status::Ok();
  AddBiasKernel<<<Blocks(n), kThreads, 0, S(stream)>>>(y, bias, rows, cols);
  PARASOL_CUDA_CHECK_LAUNCH("AddBiasKernel");
  return Status::Ok();
}

Status BiasActivationCuda(float* y, const float* bias, int rows, int cols, bool relu,
                          void* stream) {
  const size_t n = size_t{static_cast<size_t>(rows)} * cols;
  if (n == 0) return Status::Ok();
  if (relu) {
    BiasActivationKernel<true><<<Blocks(n), kThreads, 0, S(stream)>>>(y, bias, rows, cols);
  } else {
    BiasActivationKernel<false><<<Blocks(n), kThreads, 0, S(stream)>>>(y, bias, rows, cols);
  }
  PARASOL_CUDA_CHECK_LAUNCH("BiasActivationKernel");
  return Status::Ok();
}

Status BiasActivationBackwardCuda(float* dpre, float* db, const float* dy, const float* y,
                                  int rows, int cols, bool relu, float* workspace,
                                  void* stream) {
  if (cols == 0) return Status::Ok();
  if (rows == 0) return FillCuda(db, 0.0f, cols, stream);
  const int chunks = (rows + kRowsPerChunk - 1) / kRowsPerChunk;
  const dim3 grid((cols + 31) / 32, chunks), block(32, 8);
  if (relu) {
    ColumnPartialKernel<true><<<grid, block, 0, S(stream)>>>(workspace, dpre, dy, y, rows, cols);
  } else {
    ColumnPartialKernel<false><<<grid, block, 0, S(stream)>>>(workspace, dpre, dy, y, rows, cols);
  }
  PARASOL_CUDA_CHECK_LAUNCH("ColumnPartialKernel");
  ColumnSumKernel<<<(cols + 127) / 128, 128, 0, S(stream)>>>(db, workspace, chunks, cols);
  PARASOL_CUDA_CHECK_LAUNCH("ColumnSumKernel");
  return Status::Ok();
}

Status BiasGradCuda(float* db, const float* dy, int rows, int cols, float* workspace,
                    void* stream) {
  return BiasActivationBackwardCuda(nullptr, db, dy, nullptr, rows, cols, false, workspace,
                                    stream);
}

Status FillCuda(float* dst, float value, size_t n, void* stream) {
  if (n == 0) return Status::Ok();
  FillKernel<<<Blocks(n), kThreads, 0, S(stream)>>>(dst, value, n);
  PARASOL_CUDA_CHECK_LAUNCH("FillKernel");
  return Status::Ok();
}

}  // namespace parasol
