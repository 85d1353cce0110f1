// The CPU backend: OpenBLAS for matrix products, plain loops for the rest. It is also the
// reference the CUDA backend is tested against.
#include <cblas.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>

#include "kernels/embedding_pool.hpp"
#include "worker/backend.hpp"

namespace parasol {
namespace {

class CpuBackend : public Backend {
 public:
  explicit CpuBackend(int threads) { openblas_set_num_threads(std::max(1, threads)); }

  const char* name() const override { return "cpu"; }

  DeviceBuffer Allocate(size_t floats) override {
    float* p = new float[floats == 0 ? 1 : floats]();
    return DeviceBuffer(p, floats, [](float* q) { delete[] q; });
  }
  HostBuffer AllocateHost(size_t bytes) override {
    // 64-byte aligned and zeroed, as device buffers are.
    const size_t size = (std::max<size_t>(bytes, 1) + 63) / 64 * 64;
    void* p = std::aligned_alloc(64, size);
    if (p) std::memset(p, 0, size);
    return HostBuffer(p, p ? bytes : 0, [](void* q) { std::free(q); });
  }
  bool SharesHostMemory() const override { return true; }
  void Upload(void* dst, const void* host, size_t bytes, int /*after*/) override {
    ++transfers_.uploads;
    transfers_.upload_bytes += bytes;
    if (bytes && dst != host) std::memcpy(dst, host, bytes);
  }
  void Download(void* host, const void* src, size_t bytes) override {
    ++transfers_.downloads;
    transfers_.download_bytes += bytes;
    if (bytes && host != src) std::memcpy(host, src, bytes);
  }
  void ToDevice(float* dst, const float* host, size_t n) override {
    Upload(dst, host, n * sizeof(float), -1);
  }
  void ToHost(float* host, const float* src, size_t n) override {
    Download(host, src, n * sizeof(float));
  }
  void Fill(float* dst, float value, size_t n) override { std::fill(dst, dst + n, value); }

  void GemmStrided(bool trans_a, bool trans_b, int m, int n, int k, float alpha, const float* a,
                   int lda, const float* b, int ldb, float beta, float* c, int ldc) override {
    cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans,
                trans_b ? CblasTrans : CblasNoTrans, m, n, k, alpha, a, lda, b, ldb, beta, c,
                ldc);
  }

  void AddBias(float* y, const float* bias, int rows, int cols) override {
    for (int r = 0; r < rows; ++r) {
      float* row = y + size_t(r) * cols;
      for (int c = 0; c < cols; ++c) row[c] += bias[c];
    }
  }

  void BiasGrad(float* db, const float* dy, int rows, int cols) override {
    std::fill(db, db + cols, 0.0f);
    for (int r = 0; r < rows; ++r) {
      const float* row = dy + size_t(r) * cols;
      for (int c = 0; c < cols; ++c) db[c] += row[c];
    }
  }

  void Relu(float* y, const float* x, size_t n) override {
    for (size_t i = 0; i < n; ++i) y[i] = x[i] > 0 ? x[i] : 0.0f;
  }

  void ReluBackward(float* dx, const float* dy, const float* y, size_t n) override {
    for (size_t i = 0; i < n; ++i) dx[i] = y[i] > 0 ? dy[i] : 0.0f;
  }

  void BiasActivation(float* y, const float* bias, int rows, int cols, bool relu) override {
    AddBias(y, bias, rows, cols);
    if (relu) Relu(y, y, size_t(rows) * cols);
  }

  void BiasActivationBackward(float* dpre, float* db, const float* dy, const float* y, int rows,
                              int cols, bool relu) override {
    if (relu) {
      ReluBackward(dpre, dy, y, size_t(rows) * cols);
      BiasGrad(db, dpre, rows, cols);
    } else {
      BiasGrad(db, dy, rows, cols);
    }
  }

  void EmbeddingPool(float* out, const float* rows, int dim, const uint32_t* indices,
                     const float* values, const uint32_t* offsets, int batch,
                     uint32_t /*row_count*/) override {
    for (int b = 0; b < batch; ++b) {
      float* o = out + size_t(b) * dim;
      std::fill(o, o + dim, 0.0f);
      for (uint32_t j = offsets[b]; j < offsets[b + 1]; ++j) {
        const float* r = rows + size_t(indices[j]) * dim;
        const float v = values ? values[j] : 1.0f;
        for (int d = 0; d < dim; ++d) o[d] += v * r[d];
      }
    }
  }

  void EmbeddingPoolBackward(float* drows, const float* dout, int dim, const uint32_t* indices,
                             const float* values, const uint32_t* offsets, int batch) override {
    for (int b = 0; b < batch; ++b) {
      const float* g = dout + size_t(b) * dim;
      for (uint32_t j = offsets[b]; j < offsets[b + 1]; ++j) {
        float* r = drows + size_t(indices[j]) * dim;
        const float v = values ? values[j] : 1.0f;
        for (int d = 0; d < dim; ++d) r[d] += v * g[d];
      }
    }
  }

  void BuildRowIndex(const uint32_t* indices, uint32_t keys, uint32_t /*max_rows*/,
                     uint32_t* row_start, uint32_t* occ, uint32_t* hot_rows,
                     uint32_t* counts) override {
    counts[1] = parasol::BuildRowIndex(indices, keys, counts[0], row_start, occ, hot_rows);
  }

  void EmbeddingRowGrad(float* drows, const float* dout, int dim, const uint32_t* row_start,
                        const uint32_t* occ, const uint32_t* /*hot_rows*/,
                        uint32_t /*hot_count*/, const uint32_t* key_bags, const float* values,
                        uint32_t unique, const uint32_t* counts) override {
    if (counts) unique = counts[0];
    for (uint32_t u = 0; u < unique; ++u) {
      float* r = drows + size_t(u) * dim;
      std::fill(r, r + dim, 0.0f);
      for (uint32_t k = row_start[u]; k < row_start[u + 1]; ++k) {
        const uint32_t j = occ[k];
        const float* g = dout + size_t(key_bags ? key_bags[j] : j) * dim;
        const float v = values ? values[j] : 1.0f;
        for (int d = 0; d < dim; ++d) r[d] += v * g[d];
      }
    }
  }

  void Interaction(float* out, int out_ld, const float* z, const float* e, int batch, int fields,
                   int dim) override {
    const int vectors = fields + 1;
    const int width = dim + vectors * fields / 2;
    for (int b = 0; b < batch; ++b) {
      const float* zb = z + size_t(b) * dim;
      const float* eb = e + size_t(b) * fields * dim;
      auto vec = [&](int i) { return i == 0 ? zb : eb + size_t(i - 1) * dim; };
      float* o = out + size_t(b) * out_ld;
      std::memcpy(o, zb, sizeof(float) * dim);
      std::fill(o + width, o + out_ld, 0.0f);
      int k = dim;
      for (int i = 1; i < vectors; ++i) {
        const float* vi = vec(i);
        for (int j = 0; j < i; ++j) {
          const float* vj = vec(j);
          float s = 0;
          for (int d = 0; d < dim; ++d) s += vi[d] * vj[d];
          o[k++] = s;
        }
      }
    }
  }

  void InteractionBackward(float* dz, float* de, const float* dout, int dout_ld, const float* z,
                           const float* e, int batch, int fields, int dim) override {
    const int vectors = fields + 1;
    for (int b = 0; b < batch; ++b) {
      const float* zb = z + size_t(b) * dim;
      const float* eb = e + size_t(b) * fields * dim;
      float* dzb = dz + size_t(b) * dim;
      float* deb = de + size_t(b) * fields * dim;
      auto vec = [&](int i) { return i == 0 ? zb : eb + size_t(i - 1) * dim; };
      auto grad = [&](int i) { return i == 0 ? dzb : deb + size_t(i - 1) * dim; };
      const float* g = dout + size_t(b) * dout_ld;
      std::memcpy(dzb, g, sizeof(float) * dim);
      std::fill(deb, deb + size_t(fields) * dim, 0.0f);
      int k = dim;
      for (int i = 1; i < vectors; ++i) {
        for (int j = 0; j < i; ++j) {
          const float gk = g[k++];
          const float* vi = vec(i);
          const float* vj = vec(j);
          float* gi = grad(i);
          float* gj = grad(j);
          for (int d = 0; d < dim; ++d) {
            gi[d] += gk * vj[d];
            gj[d] += gk * vi[d];
          }
        }
      }
    }
  }

  void SigmoidBce(float* probs, float* dlogits, double* loss_sum, const float* logits,
                  const float* labels, int n) override {
    double loss = 0;
    for (int i = 0; i < n; ++i) {
      const double x = logits[i];
      const double p = 1.0 / (1.0 + std::exp(-x));
      probs[i] = static_cast<float>(p);
      dlogits[i] = static_cast<float>((p - labels[i]) / n);
      // log(1 + e^x) - y x, computed without overflow.
      loss += std::max(x, 0.0) - x * labels[i] + std::log1p(std::exp(-std::abs(x)));
    }
    *loss_sum = loss;
  }
};

}  // namespace

double Backend::TimeDevice(const std::function<void()>& work, int repeats, int samples) {
  std::vector<double> times;
  for (int s = 0; s < samples; ++s) {
    const auto start = std::chrono::steady_clock::now();
    for (int i = 0; i < repeats; ++i) work();
    if (!Sync().ok()) return -1;
    times.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() /
                    repeats);
  }
  std::sort(times.begin(), times.end());
  return times.empty() ? -1 : times[times.size() / 2];
}

std::unique_ptr<Backend> MakeCpuBackend(int threads) {
  return std::make_unique<CpuBackend>(threads);
}

Result<std::unique_ptr<Backend>> MakeBackend(const WorkerOptions& options) {
  if (options.device == "cpu") {
    return MakeCpuBackend(static_cast<int>(options.blas_threads));
  }
  const int device = options.device == "cuda" ? 0 : std::atoi(options.device.c_str() + 5);
  Result<std::unique_ptr<Backend>> cuda = MakeCudaBackend(device, options.tf32);
  if (!cuda.ok()) {
    return cuda.status().WithContext("worker.device is " + options.device);
  }
  return cuda;
}

#ifndef PARASOL_HAVE_CUDA
Result<std::unique_ptr<Backend>> MakeCudaBackend(int /*device*/, bool /*tf32*/) {
  return FailedPrecondition("this build of parasol has no CUDA support (nvcc was not found)");
}
#endif

}  // namespace parasol
