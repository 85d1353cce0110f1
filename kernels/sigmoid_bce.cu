#include <cuda_runtime.h>

#include "kernels/cuda_check.hpp"
#include "kernels/sigmoid_bce.hpp"

namespace parasol {
namespace {

constexpr int kThreads = 1024;

// One block: each thread takes every kThreads-th sample, then a tree sum in shared memory. The
// order of the loss sum is fixed, so it is the same from run to run. exp(-|x|) never overflows,
// so large |logits| give finite losses and probabilities of exactly 0 or 1 at worst.
__global__ void SigmoidBceKernel(float* probs, float* dlogits, double* loss_sum,
                                 const float* logits, const float* labels, int n) {
  __shared__ double partial[kThreads];
  double loss = 0.0;
  for (int i = threadIdx.x; i < n; i += kThreads) {
    const double x = logits[i];
    const double t = exp(-fabs(x));
    const double p = x >= 0 ? 1.0 / (1.0 + t) : t / (1.0 + t);
    probs[i] = static_cast<float>(p);
    dlogits[i] = static_cast<float>((p - labels[i]) / n);
    loss += fmax(x, 0.0) - x * labels[i] + log1p(t);
  }
  partial[threadIdx.x] = loss;
  __syncthreads();
  for (int s = kThreads / 2; s > 0; s /= 2) {
    if (threadIdx.x < s) partial[threadIdx.x] += partial[threadIdx.x + s];
    __syncthreads();
  }
  if (threadIdx.x == 0) *loss_sum = partial[0];
}

}  // namespace

Status SigmoidBceCuda(float* probs, float* dlogits, double* loss_sum, const float* logits,
                      const float* labels, int n, void* stream) {
  SigmoidBceKernel<<<1, kThreads, 0, static_cast<cudaStream_t>(stream)>>>(probs, dlogits,
                                                                         loss_sum, logits,
                                                                         labels, n);
  PARASOL_CUDA_CHECK_LAUNCH("SigmoidBceKernel");
  return Status::Ok();
}

}  // namespace parasol
