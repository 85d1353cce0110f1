// The CPU backend: OpenBLAS for matrix products, plain loops for the rest. It is also the
// reference the CUDA backend is tested against.
#include <cblas.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <map>
#include <string>
#include <vector>

#include "kernels/embedding_pool.hpp"
#include "worker/backend.hpp"
#include "worker/interaction.hpp"

namespace parasol {

void InteractionReference(float* out, int out_ld, const float* z, const float* e, int batch,
                      int fields, int dim) {
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

void InteractionBackwardReference(float* dz, float* de, const float* dout, int dout_ld,
                              const float* z, const float* e, int batch, int fields, int dim) {
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

namespace {

// --- The DLRM interaction -------------------------------------------------------------------
//
// Both directions keep the plain pairwise loops' order of every sum, so their results have the
// same bits as those loops (tests/worker/cpu_backend_test.cc checks it), only with the
// independent sums side by side in four-float lanes and in registers:
// - forward: dot(v_i, v_j) sums v_i[d] v_j[d] over d from 0, starting at 0; two rows i of
//   dots at a time, each lane a j, against the sample's vectors transposed;
// - backward: the gradient of v_m sums g_mn v_n over n ascending (n != m; z's starts from its
//   own passthrough gradient), which is the order the pairwise loop (i > j, i ascending, then
//   j) adds them in; four m at a time, each lane an element d.

typedef float V4 __attribute__((vector_size(16)));
// The same at any float's alignment, and allowed to alias floats (as SSE's __m128_u).
typedef float V4U __attribute__((vector_size(16), aligned(4), may_alias));

// x in every lane (a shuffle: `V4{} + x` would add +0.0 and turn -0.0 into +0.0).
inline V4 Broadcast(float x) { return V4{x, x, x, x}; }

struct InteractionScratch {
  std::vector<V4> transposed, row0, row1;
  std::vector<float> pair_grads;
  std::vector<const float*> vecs;
  std::vector<float*> grads;
};

// Rows v0 and v1 of dots against the transposed vectors (B lanes each, past the row's end
// computed and dropped).
template <int B>
void TwoDotRows(const float* v0, const float* v1, const V4* vt, size_t lanes, int dim, V4* o0,
                V4* o1) {
  V4 a0[B], a1[B];
  for (int q = 0; q < B; ++q) a0[q] = a1[q] = V4{};
  for (int d = 0; d < dim; ++d) {
    const V4 x0 = Broadcast(v0[d]), x1 = Broadcast(v1[d]);
    const V4* row = vt + d * lanes;
#pragma GCC unroll 8
    for (int q = 0; q < B; ++q) {
      const V4 r = row[q];
      a0[q] += x0 * r;
      a1[q] += x1 * r;
    }
  }
  for (int q = 0; q < B; ++q) {
    o0[q] = a0[q];
    o1[q] = a1[q];
  }
}

void InteractionForward(float* out, int out_ld, const float* z, const float* e, int batch,
                        int fields, int dim, InteractionScratch* s) {
  using Rows = void (*)(const float*, const float*, const V4*, size_t, int, V4*, V4*);
  static constexpr Rows kRows[] = {nullptr,       TwoDotRows<1>, TwoDotRows<2>,
                                   TwoDotRows<3>, TwoDotRows<4>, TwoDotRows<5>,
                                   TwoDotRows<6>, TwoDotRows<7>, TwoDotRows<8>};
  const int vectors = fields + 1;
  const size_t lanes = (size_t(vectors) + 3) / 4;
  if (lanes >= std::size(kRows)) return InteractionReference(out, out_ld, z, e, batch, fields, dim);
  const int width = dim + vectors * fields / 2;
  s->transposed.assign(size_t(dim) * lanes, V4{});
  s->row0.resize(lanes);
  s->row1.resize(lanes);
  float* vt = reinterpret_cast<float*>(s->transposed.data());
  for (int b = 0; b < batch; ++b) {
    const float* zb = z + size_t(b) * dim;
    const float* eb = e + size_t(b) * fields * dim;
    auto vec = [&](int i) { return i == 0 ? zb : eb + size_t(i - 1) * dim; };
    for (int i = 0; i < vectors; ++i) {
      const float* v = vec(i);
      for (int d = 0; d < dim; ++d) vt[(size_t(d) * lanes) * 4 + i] = v[d];
    }
    float* o = out + size_t(b) * out_ld;
    std::memcpy(o, zb, sizeof(float) * dim);
    std::fill(o + width, o + out_ld, 0.0f);
    float* dst = o + dim;
    for (int i = 1; i < vectors; i += 2) {
      const int i1 = std::min(i + 1, vectors - 1);
      kRows[(i1 + 3) / 4](vec(i), vec(i1), s->transposed.data(), lanes, dim, s->row0.data(),
                          s->row1.data());
      std::memcpy(dst, s->row0.data(), sizeof(float) * i);
      dst += i;
      if (i + 1 < vectors) {
        std::memcpy(dst, s->row1.data(), sizeof(float) * (i + 1));
        dst += i + 1;
      }
    }
  }
}

// The gradients of vectors m0 .. m0 + M - 1, L lanes (4L elements) each.
template <int M, int L>
void GradientRows(int m0, int vectors, const float* gm, const float* const* vecs,
                  float* const* grads, const float* passthrough) {
  V4 acc[M][L];
  for (int r = 0; r < M; ++r) {
    for (int q = 0; q < L; ++q) {
      acc[r][q] = m0 + r == 0 ? *reinterpret_cast<const V4U*>(passthrough + 4 * q) : V4{};
    }
  }
  for (int n = 0; n < vectors; ++n) {
    V4 v[L];
    for (int q = 0; q < L; ++q) v[q] = *reinterpret_cast<const V4U*>(vecs[n] + 4 * q);
    for (int r = 0; r < M; ++r) {
      if (n == m0 + r) continue;
      const V4 c = Broadcast(gm[size_t(m0 + r) * vectors + n]);
      for (int q = 0; q < L; ++q) acc[r][q] += c * v[q];
    }
  }
  for (int r = 0; r < M; ++r) {
    for (int q = 0; q < L; ++q) *reinterpret_cast<V4U*>(grads[m0 + r] + 4 * q) = acc[r][q];
  }
}

template <int L>
void GradientsOfSample(int vectors, const float* gm, const float* const* vecs,
                       float* const* grads, const float* passthrough) {
  int m = 0;
  for (; m + 4 <= vectors; m += 4) GradientRows<4, L>(m, vectors, gm, vecs, grads, passthrough);
  for (; m < vectors; ++m) GradientRows<1, L>(m, vectors, gm, vecs, grads, passthrough);
}

void InteractionBackward(float* dz, float* de, const float* dout, int dout_ld, const float* z,
                         const float* e, int batch, int fields, int dim, InteractionScratch* s) {
  using Sample = void (*)(int, const float*, const float* const*, float* const*, const float*);
  static constexpr Sample kSample[] = {nullptr, GradientsOfSample<1>, GradientsOfSample<2>,
                                       GradientsOfSample<3>, GradientsOfSample<4>};
  if (dim == 0 || dim % 4 != 0 || dim / 4 >= int(std::size(kSample))) {
    return InteractionBackwardReference(dz, de, dout, dout_ld, z, e, batch, fields, dim);
  }
  const int vectors = fields + 1;
  s->pair_grads.resize(size_t(vectors) * vectors);
  s->vecs.resize(vectors);
  s->grads.resize(vectors);
  float* gm = s->pair_grads.data();
  for (int b = 0; b < batch; ++b) {
    const float* zb = z + size_t(b) * dim;
    const float* eb = e + size_t(b) * fields * dim;
    float* dzb = dz + size_t(b) * dim;
    float* deb = de + size_t(b) * fields * dim;
    for (int i = 0; i < vectors; ++i) {
      s->vecs[i] = i == 0 ? zb : eb + size_t(i - 1) * dim;
      s->grads[i] = i == 0 ? dzb : deb + size_t(i - 1) * dim;
    }
    const float* g = dout + size_t(b) * dout_ld;
    int k = dim;
    for (int i = 1; i < vectors; ++i) {
      for (int j = 0; j < i; ++j) {
        gm[size_t(i) * vectors + j] = g[k];
        gm[size_t(j) * vectors + i] = g[k];
        ++k;
      }
    }
    kSample[dim / 4](vectors, gm, s->vecs.data(), s->grads.data(), g);
  }
}

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

  void ClearOpTimes() override { op_times_.clear(); }
  std::vector<OpTime> OpTimes() const override {
    std::vector<OpTime> out;
    for (const auto& [op, t] : op_times_) out.push_back(t);
    return out;
  }

  void GemmStrided(bool trans_a, bool trans_b, int m, int n, int k, float alpha, const float* a,
                   int lda, const float* b, int ldb, float beta, float* c, int ldc) override {
    char name[96] = "gemm";
    if (profiling()) {
      std::snprintf(name, sizeof name, "gemm %dx%dx%d %c%c ld %d %d %d", m, n, k,
                    trans_a ? 'T' : 'N', trans_b ? 'T' : 'N', lda, ldb, ldc);
    }
    Timed timed(this, name);
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
    Timed timed(this, "bias_activation");
    AddBias(y, bias, rows, cols);
    if (relu) Relu(y, y, size_t(rows) * cols);
  }

  void BiasActivationBackward(float* dpre, float* db, const float* dy, const float* y, int rows,
                              int cols, bool relu) override {
    Timed timed(this, "bias_activation_backward");
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
    Timed timed(this, "embedding_pool");
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
    Timed timed(this, "embedding_pool_backward");
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
    Timed timed(this, "row_index");
    counts[1] = parasol::BuildRowIndex(indices, keys, counts[0], row_start, occ, hot_rows);
  }

  void EmbeddingRowGrad(float* drows, const float* dout, int dim, const uint32_t* row_start,
                        const uint32_t* occ, const uint32_t* /*hot_rows*/,
                        uint32_t /*hot_count*/, const uint32_t* key_bags, const float* values,
                        uint32_t unique, const uint32_t* counts) override {
    Timed timed(this, "row_grad");
    if (counts) unique = counts[0];
    // The gradient rows a key reads are scattered over the batch: the ones a few keys ahead are
    // prefetched. Dims that are a multiple of 4, up to 16, sum in registers, four elements a
    // lane, in the same order (the same bits).
    const uint32_t keys = unique > 0 ? row_start[unique] : 0;
    auto grad_row = [&](uint32_t k) {
      const uint32_t j = occ[k];
      return dout + size_t(key_bags ? key_bags[j] : j) * dim;
    };
    constexpr uint32_t kAhead = 8;
    const int lanes = dim % 4 == 0 && dim <= 16 ? dim / 4 : 0;
    for (uint32_t u = 0; u < unique; ++u) {
      float* r = drows + size_t(u) * dim;
      const uint32_t begin = row_start[u], end = row_start[u + 1];
      if (lanes > 0) {
        V4 acc[4] = {V4{}, V4{}, V4{}, V4{}};
        for (uint32_t k = begin; k < end; ++k) {
          if (k + kAhead < keys) __builtin_prefetch(grad_row(k + kAhead));
          const float* g = grad_row(k);
          const V4 v = Broadcast(values ? values[occ[k]] : 1.0f);
          for (int q = 0; q < lanes; ++q) acc[q] += v * *reinterpret_cast<const V4U*>(g + 4 * q);
        }
        for (int q = 0; q < lanes; ++q) *reinterpret_cast<V4U*>(r + 4 * q) = acc[q];
        continue;
      }
      std::fill(r, r + dim, 0.0f);
      for (uint32_t k = begin; k < end; ++k) {
        if (k + kAhead < keys) __builtin_prefetch(grad_row(k + kAhead));
        const float* g = grad_row(k);
        const float v = values ? values[occ[k]] : 1.0f;
        for (int d = 0; d < dim; ++d) r[d] += v * g[d];
      }
    }
  }

  void Interaction(float* out, int out_ld, const float* z, const float* e, int batch, int fields,
                   int dim) override {
    Timed timed(this, "interaction");
    InteractionForward(out, out_ld, z, e, batch, fields, dim, &scratch_);
  }

  void InteractionBackward(float* dz, float* de, const float* dout, int dout_ld, const float* z,
                           const float* e, int batch, int fields, int dim) override {
    Timed timed(this, "interaction_backward");
    parasol::InteractionBackward(dz, de, dout, dout_ld, z, e, batch, fields, dim, &scratch_);
  }

  void SigmoidBce(float* probs, float* dlogits, double* loss_sum, const float* logits,
                  const float* labels, int n) override {
    Timed timed(this, "sigmoid_bce");
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

 private:
  // Adds the wall time of its scope to op_times_[op] while profiling is on.
  class Timed {
   public:
    // `op` must outlive the scope (a literal, or the caller's buffer).
    Timed(CpuBackend* backend, const char* op)
        : backend_(backend->profiling() ? backend : nullptr), op_(op) {
      if (backend_) start_ = std::chrono::steady_clock::now();
    }
    ~Timed() {
      if (!backend_) return;
      const double seconds =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
      OpTime& t = backend_->op_times_[op_];
      t.op = op_;
      t.seconds += seconds;
      ++t.calls;
    }

   private:
    CpuBackend* backend_;
    const char* op_;
    std::chrono::steady_clock::time_point start_;
  };

  std::map<std::string, OpTime> op_times_;
  InteractionScratch scratch_;  // kept: no allocation per call
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
