// Backend: the device a worker computes on. Layers are written once against this interface;
// the CPU implementation uses OpenBLAS, the CUDA one cuBLAS and the kernels in kernels/.
//
// Pointers passed to the compute calls are device pointers of this backend (host pointers for
// the CPU). Matrices are row-major. Thread-safety: one backend per worker thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>

#include "common/manifest.hpp"
#include "common/status.hpp"

namespace parasol {

class Backend;

// Device memory of `floats` floats, freed by its backend when the buffer goes.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  DeviceBuffer(float* data, size_t floats, std::function<void(float*)> free)
      : data_(data, std::move(free)), size_(floats) {}
  float* data() const { return data_.get(); }
  size_t size() const { return size_; }

 private:
  std::unique_ptr<float, std::function<void(float*)>> data_{nullptr, [](float*) {}};
  size_t size_ = 0;
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual const char* name() const = 0;

  virtual DeviceBuffer Allocate(size_t floats) = 0;
  virtual void ToDevice(float* dst, const float* host, size_t n) = 0;
  virtual void ToHost(float* host, const float* src, size_t n) = 0;
  virtual void Fill(float* dst, float value, size_t n) = 0;

  // c[m x n] = alpha * op(a) * op(b) + beta * c, op(a) m x k, op(b) k x n.
  virtual void Gemm(bool trans_a, bool trans_b, int m, int n, int k, float alpha, const float* a,
                    const float* b, float beta, float* c) = 0;
  // y[r, :] += bias for every row r.
  virtual void AddBias(float* y, const float* bias, int rows, int cols) = 0;
  // db = sum over rows of dy (overwrites db).
  virtual void BiasGrad(float* db, const float* dy, int rows, int cols) = 0;
  virtual void Relu(float* y, const float* x, size_t n) = 0;
  // dx = dy where y > 0, else 0.
  virtual void ReluBackward(float* dx, const float* dy, const float* y, size_t n) = 0;

  // out[b, :] = sum_j values[j] * rows[indices[j], :] for j in [offsets[b], offsets[b + 1]);
  // `values` may be null (all ones).
  virtual void EmbeddingPool(float* out, const float* rows, int dim, const uint32_t* indices,
                             const float* values, const uint32_t* offsets, int batch) = 0;
  // drows[indices[j], :] += values[j] * dout[b, :] (drows must be zeroed by the caller).
  virtual void EmbeddingPoolBackward(float* drows, const float* dout, int dim,
                                     const uint32_t* indices, const float* values,
                                     const uint32_t* offsets, int batch) = 0;

  // DLRM interaction of the bottom output z [batch, dim] and the embeddings e
  // [batch, fields, dim]. With v_0 = z and v_i = e[:, i - 1], per sample:
  //   out[b] = [z[b, :], dot(v_i, v_j) for i > j, in row-major order of (i, j)]
  // (width dim + (fields + 1) * fields / 2).
  virtual void Interaction(float* out, const float* z, const float* e, int batch, int fields,
                           int dim) = 0;
  // dz and de from dout (both overwritten).
  virtual void InteractionBackward(float* dz, float* de, const float* dout, const float* z,
                                   const float* e, int batch, int fields, int dim) = 0;

  // probs = sigmoid(logits); dlogits = (probs - labels) / n; returns the mean BCE loss.
  virtual double SigmoidBce(float* probs, float* dlogits, const float* logits,
                            const float* labels, int n) = 0;

  // Waits for the device and returns the first error of any call since the last Sync() (a
  // device backend records errors instead of throwing; the CPU backend has none).
  virtual Status Sync() { return Status::Ok(); }
};

// The CPU backend (OpenBLAS with `threads` threads).
std::unique_ptr<Backend> MakeCpuBackend(int threads = 1);

// The CUDA backend on device `device` (cuBLAS, TF32 when `tf32`), or an error saying why it
// cannot run here (no CUDA in this build, no device, ...).
Result<std::unique_ptr<Backend>> MakeCudaBackend(int device, bool tf32);

// The backend worker.device names: "cpu", "cuda" or "cuda:N".
Result<std::unique_ptr<Backend>> MakeBackend(const WorkerOptions& options);

}  // namespace parasol
