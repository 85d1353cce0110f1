#include <cuda_runtime.h>

#include <algorithm>

#include "kernels/cuda_check.hpp"
#include "kernels/interaction.hpp"

namespace parasol {
namespace {

constexpr int kThreads = 256;
constexpr int kMaxSamplesPerBlock = 8;
constexpr size_t kSharedFloats = 48 * 1024 / sizeof(float);

__host__ __device__ int PairIndex(int hi, int lo) { return hi * (hi - 1) / 2 + lo; }

// The pair (i, j), i > j, at row-major position p: i * (i - 1) / 2 + j = p.
__device__ void PairOf(int p, int* i, int* j) {
  int r = static_cast<int>((1.0f + sqrtf(1.0f + 8.0f * p)) / 2.0f);
  while (r * (r - 1) / 2 > p) --r;
  while ((r + 1) * r / 2 <= p) ++r;
  *i = r;
  *j = p - r * (r - 1) / 2;
}

// Vectors sit `ld` floats apart in shared memory, ld odd: the threads of a warp reading element
// d of vectors j, j + 1, ... then hit different banks (with ld = dim = 16 they would share two).
__host__ __device__ int SharedStride(int dim) { return dim % 2 == 0 ? dim + 1 : dim; }

// Loads the vectors of samples [b0, b0 + nb) into v[s][vector][ld]: v_0 = z[b], v_i = e[b, i-1].
__device__ void LoadVectors(float* v, const float* z, const float* e, int b0, int nb, int fields,
                            int dim) {
  const int vectors = fields + 1, ld = SharedStride(dim);
  for (int t = threadIdx.x; t < nb * dim; t += blockDim.x) {
    const int s = t / dim, d = t % dim;
    v[s * vectors * ld + d] = z[size_t(b0 + s) * dim + d];
  }
  const int per = fields * dim;
  const float* eb = e + size_t(b0) * per;
  for (int t = threadIdx.x; t < nb * per; t += blockDim.x) {
    const int s = t / per, r = t % per;
    v[s * vectors * ld + (1 + r / dim) * ld + r % dim] = eb[t];
  }
}

// Fused shared-memory kernel: a block takes `spb` samples, loads their vectors once, and writes
// each sample's output row (coalesced across the threads).
__global__ void InteractionSharedKernel(float* out, int out_ld, const float* z, const float* e,
                                        int batch, int fields, int dim, int spb) {
  extern __shared__ float smem[];
  const int vectors = fields + 1, pairs = vectors * fields / 2, width = dim + pairs;
  const int ld = SharedStride(dim);
  const int b0 = blockIdx.x * spb;
  const int nb = min(spb, batch - b0);
  int2* pair_ij = reinterpret_cast<int2*>(smem);
  float* v = smem + 2 * pairs;
  for (int p = threadIdx.x; p < pairs; p += blockDim.x) {
    int i, j;
    PairOf(p, &i, &j);
    pair_ij[p] = make_int2(i * ld, j * ld);
  }
  LoadVectors(v, z, e, b0, nb, fields, dim);
  __syncthreads();
  for (int t = threadIdx.x; t < nb * out_ld; t += blockDim.x) {
    const int s = t / out_ld, c = t % out_ld;
    const float* vs = v + s * vectors * ld;
    float r = 0.0f;
    if (c < dim) {
      r = vs[c];
    } else if (c < width) {
      const int2 ij = pair_ij[c - dim];
      for (int d = 0; d < dim; ++d) r += vs[ij.x + d] * vs[ij.y + d];
    }
    out[size_t(b0) * out_ld + t] = r;
  }
}

// Thread (sample, i, d) of the block's samples: dv_i[d] = [i == 0] dout[d] +
// sum over j != i of g(max, min) v_j[d], with the vectors and the pair gradients in shared memory.
__global__ void InteractionBackwardSharedKernel(float* dz, float* de, const float* dout,
                                                int dout_ld, const float* z, const float* e,
                                                int batch, int fields, int dim, int spb) {
  extern __shared__ float smem[];
  const int vectors = fields + 1, pairs = vectors * fields / 2;
  const int ld = SharedStride(dim);
  const int b0 = blockIdx.x * spb;
  const int nb = min(spb, batch - b0);
  float* v = smem;
  float* g = smem + spb * vectors * ld;
  LoadVectors(v, z, e, b0, nb, fields, dim);
  for (int t = threadIdx.x; t < nb * pairs; t += blockDim.x) {
    const int s = t / pairs, p = t % pairs;
    g[t] = dout[size_t(b0 + s) * dout_ld + dim + p];
  }
  __syncthreads();
  const int per = vectors * dim;
  for (int t = threadIdx.x; t < nb * per; t += blockDim.x) {
    const int s = t / per, i = (t % per) / dim, d = t % dim;
    const float* vs = v + s * vectors * ld;
    const float* gs = g + s * pairs;
    float acc = i == 0 ? dout[size_t(b0 + s) * dout_ld + d] : 0.0f;
    for (int j = 0; j < i; ++j) acc += gs[PairIndex(i, j)] * vs[j * ld + d];
    for (int j = i + 1; j < vectors; ++j) acc += gs[PairIndex(j, i)] * vs[j * ld + d];
    if (i == 0) {
      dz[size_t(b0 + s) * dim + d] = acc;
    } else {
      de[(size_t(b0 + s) * fields + (i - 1)) * dim + d] = acc;
    }
  }
}

__device__ const float* Vec(const float* z, const float* e, int b, int i, int fields, int dim) {
  return i == 0 ? z + size_t(b) * dim : e + (size_t(b) * fields + (i - 1)) * dim;
}

// For shapes whose vectors do not fit in shared memory: one block per sample, reading global
// memory.
__global__ void InteractionGlobalKernel(float* out, int out_ld, const float* z, const float* e,
                                        int fields, int dim) {
  const int b = blockIdx.x;
  const int vectors = fields + 1, pairs = vectors * fields / 2, width = dim + pairs;
  float* o = out + size_t(b) * out_ld;
  for (int c = threadIdx.x; c < out_ld; c += blockDim.x) {
    float r = 0.0f;
    if (c < dim) {
      r = z[size_t(b) * dim + c];
    } else if (c < width) {
      int i, j;
      PairOf(c - dim, &i, &j);
      const float* vi = Vec(z, e, b, i, fields, dim);
      const float* vj = Vec(z, e, b, j, fields, dim);
      for (int d = 0; d < dim; ++d) r += vi[d] * vj[d];
    }
    o[c] = r;
  }
}

__global__ void InteractionBackwardGlobalKernel(float* dz, float* de, const float* dout,
                                                int dout_ld, const float* z, const float* e,
                                                int fields, int dim) {
  const int b = blockIdx.x;
  const int vectors = fields + 1;
  const float* g = dout + size_t(b) * dout_ld;
  for (int t = threadIdx.x; t < vectors * dim; t += blockDim.x) {
    const int i = t / dim, d = t % dim;
    float s = i == 0 ? g[d] : 0.0f;
    for (int j = 0; j < vectors; ++j) {
      if (j == i) continue;
      const int hi = i > j ? i : j, lo = i > j ? j : i;
      s += g[dim + PairIndex(hi, lo)] * Vec(z, e, b, j, fields, dim)[d];
    }
    if (i == 0) {
      dz[size_t(b) * dim + d] = s;
    } else {
      de[(size_t(b) * fields + (i - 1)) * dim + d] = s;
    }
  }
}

// Samples per block whose shared data (per_sample floats each, plus `fixed`) fit in 48 KiB.
int SamplesPerBlock(size_t per_sample, size_t fixed) {
  if (fixed + per_sample > kSharedFloats) return 0;
  return static_cast<int>(
      std::min<size_t>(kMaxSamplesPerBlock, (kSharedFloats - fixed) / per_sample));
}

}  // namespace

Status InteractionCuda(float* out, int out_ld, const float* z, const float* e, int batch,
                       int fields, int dim, void* stream) {
  if (batch == 0) return Status::Ok();
  const auto s = static_cast<cudaStream_t>(stream);
  const int vectors = fields + 1, pairs = vectors * fields / 2;
  const size_t ld = SharedStride(dim);
  const int spb = SamplesPerBlock(size_t(vectors) * ld, 2 * size_t(pairs));
  if (spb > 0) {
    const size_t shared = (2 * size_t(pairs) + size_t(spb) * vectors * ld) * sizeof(float);
    InteractionSharedKernel<<<(batch + spb - 1) / spb, kThreads, shared, s>>>(
        out, out_ld, z, e, batch, fields, dim, spb);
    PARASOL_CUDA_CHECK_LAUNCH("InteractionSharedKernel");
  } else {
    InteractionGlobalKernel<<<batch, 128, 0, s>>>(out, out_ld, z, e, fields, dim);
    PARASOL_CUDA_CHECK_LAUNCH("InteractionGlobalKernel");
  }
  return Status::Ok();
}

Status InteractionBackwardCuda(float* dz, float* de, const float* dout, int dout_ld,
                               const float* z, const float* e, int batch, int fields, int dim,
                               void* stream) {
  if (batch == 0) return Status::Ok();
  const auto s = static_cast<cudaStream_t>(stream);
  const int vectors = fields + 1, pairs = vectors * fields / 2;
  const size_t ld = SharedStride(dim);
  const int spb = SamplesPerBlock(size_t(vectors) * ld + pairs, 0);
  if (spb > 0) {
    const size_t shared = size_t(spb) * (size_t(vectors) * ld + pairs) * sizeof(float);
    InteractionBackwardSharedKernel<<<(batch + spb - 1) / spb, kThreads, shared, s>>>(
        dz, de, dout, dout_ld, z, e, batch, fields, dim, spb);
    PARASOL_CUDA_CHECK_LAUNCH("InteractionBackwardSharedKernel");
  } else {
    InteractionBackwardGlobalKernel<<<batch, 128, 0, s>>>(dz, de, dout, dout_ld, z, e, fields,
                                                          dim);
    PARASOL_CUDA_CHECK_LAUNCH("InteractionBackwardGlobalKernel");
  }
  return Status::Ok();
}

}  // namespace parasol
