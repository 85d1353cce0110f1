#include <cuda_runtime.h>

#include "kernels/cuda_check.hpp"
#include "kernels/sigmoid_bce.hpp"

namespace parasol {
namespace {

__global__ void SigmoidBceKernel(float* probs, float* dlogits, double* loss_sum,
                                 const float* logits, const float* labels, int n) {
  __shared__ double partial[256];
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  double loss = 0.0;
  if (i < n) {
    const double x = logits[i];
    const double p = 1.0 / (1.0 + exp(-x));
    probs[i] = static_cast<float>(p);
    dlogits[i] = static_cast<float>((p - labels[i]) / n);
    loss = fmax(x, 0.0) - x * labels[i] + log1p(exp(-fabs(x)));
  }
  partial[threadIdx.x] = loss;
  __syncthreads();
  for (int s = blockDim.x / 2; s > 0; s /= 2) {
    if (threadIdx.x < s) partial[threadIdx.x] += partial[threadIdx.x + s];
    __syncthreads();
  }
  if (threadIdx.x == 0) atomicAdd(loss_sum, partial[0]);
}

}  // namespace

Status SigmoidBceCuda(float* probs, float* dlogits, double* loss_sum, const float* logits,
                      const float* labels, int n, void* stream) {
  if (n == 0) return Status::Ok();
  SigmoidBceKernel<<<(n + 255) / 256, 256, 0, static_cast<cudaStream_t>(stream)>>>(
      probs, dlogits, loss_sum, logits, labels, n);
  PARASOL_CUDA_CHECK_LAUNCH("SigmoidBceKernel");
  return Status::Ok();
}

}  // namespace parasol
