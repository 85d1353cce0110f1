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

// One thread per column, walking the rows: coalesced across the warp.
__global__ void BiasGradKernel(float* db, const float* dy, int rows, int cols) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= cols) return;
  float s = 0.0f;
  for (int r = 0; r < rows; ++r) s += dy[size_t{static_cast<size_t>(r)} * cols + c];
  db[c] = s;
}

__global__ void FillKernel(float* dst, float value, size_t n) {
  const size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x;
  if (i < n) dst[i] = value;
}

cudaStream_t S(void* stream) { return static_cast<cudaStream_t>(stream); }

}  // namespace

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

Status BiasGradCuda(float* db, const float* dy, int rows, int cols, void* stream) {
  if (cols == 0) return Status::Ok();
  BiasGradKernel<<<Blocks(cols), kThreads, 0, S(stream)>>>(db, dy, rows, cols);
  PARASOL_CUDA_CHECK_LAUNCH("BiasGradKernel");
  return Status::Ok();
}

Status FillCuda(float* dst, float value, size_t n, void* stream) {
  if (n == 0) return Status::Ok();
  FillKernel<<<Blocks(n), kThreads, 0, S(stream)>>>(dst, value, n);
  PARASOL_CUDA_CHECK_LAUNCH("FillKernel");
  return Status::Ok();
}

}  // namespace parasol
