#include <cuda_runtime.h>

#include "kernels/cuda_check.hpp"
#include "kernels/interaction.hpp"

namespace parasol {
namespace {

__device__ const float* Vec(const float* z, const float* e, int b, int i, int fields, int dim) {
  return i == 0 ? z + size_t(b) * dim : e + (size_t(b) * fields + (i - 1)) * dim;
}

// One block per sample; threads take the pairs (i > j) and the copied bottom output.
__global__ void InteractionKernel(float* out, const float* z, const float* e, int fields,
                                  int dim) {
  const int b = blockIdx.x;
  const int vectors = fields + 1;
  const int pairs = vectors * fields / 2;
  const int width = dim + pairs;
  float* o = out + size_t(b) * width;
  for (int d = threadIdx.x; d < dim; d += blockDim.x) o[d] = z[size_t(b) * dim + d];
  for (int p = threadIdx.x; p < pairs; p += blockDim.x) {
    // Invert p = i * (i - 1) / 2 + j, 0 <= j < i.
    int i = static_cast<int>((1.0f + sqrtf(1.0f + 8.0f * p)) / 2.0f);
    while (i * (i - 1) / 2 > p) --i;
    while ((i + 1) * i / 2 <= p) ++i;
    const int j = p - i * (i - 1) / 2;
    const float* vi = Vec(z, e, b, i, fields, dim);
    const float* vj = Vec(z, e, b, j, fields, dim);
    float s = 0.0f;
    for (int d = 0; d < dim; ++d) s += vi[d] * vj[d];
    o[dim + p] = s;
  }
}

// One block per sample; thread (i, d) sums g(i, j) * v_j[d] over j != i.
__global__ void InteractionBackwardKernel(float* dz, float* de, const float* dout,
                                          const float* z, const float* e, int fields, int dim) {
  const int b = blockIdx.x;
  const int vectors = fields + 1;
  const int width = dim + vectors * fields / 2;
  const float* g = dout + size_t(b) * width;
  for (int t = threadIdx.x; t < vectors * dim; t += blockDim.x) {
    const int i = t / dim, d = t % dim;
    float s = i == 0 ? g[d] : 0.0f;
    for (int j = 0; j < vectors; ++j) {
      if (j == i) continue;
      const int hi = i > j ? i : j, lo = i > j ? j : i;
      s += g[dim + hi * (hi - 1) / 2 + lo] * Vec(z, e, b, j, fields, dim)[d];
    }
    if (i == 0) {
      dz[size_t(b) * dim + d] = s;
    } else {
      de[(size_t(b) * fields + (i - 1)) * dim + d] = s;
    }
  }
}

}  // namespace

Status InteractionCuda(float* out, const float* z, const float* e, int batch, int fields,
                       int dim, void* stream) {
  if (batch == 0) return Status::Ok();
  InteractionKernel<<<batch, 128, 0, static_cast<cudaStream_t>(stream)>>>(out, z, e, fields,
                                                                           dim);
  PARASOL_CUDA_CHECK_LAUNCH("InteractionKernel");
  return Status::Ok();
}

Status InteractionBackwardCuda(float* dz, float* de, const float* dout, const float* z,
                               const float* e, int batch, int fields, int dim, void* stream) {
  if (batch == 0) return Status::Ok();
  InteractionBackwardKernel<<<batch, 128, 0, static_cast<cudaStream_t>(stream)>>>(
      dz, de, dout, z, e, fields, dim);
  PARASOL_CUDA_CHECK_LAUNCH("InteractionBackwardKernel");
  return Status::Ok();
}

}  // namespace parasol
