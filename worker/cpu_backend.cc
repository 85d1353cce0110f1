// The CPU backend: OpenBLAS for matrix products, plain loops for the rest. It is also the
// reference the CUDA backend is tested against.
#include <cblas.h>
#include <pthread.h>
#include <sched.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <functional>
#include <iterator>
#include <map>
#include <mutex>
#include <new>
#include <string>
#include <thread>
#include <vector>

#include <spdlog/spdlog.h>

#include "common/cpu_affinity.hpp"
#include "common/fatal.hpp"
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

// Runs fn(chunk, thread) for every chunk 0 .. chunks - 1 and returns when all are done. The
// calling thread (thread 0) and the helper threads (1 .. threads - 1) take the chunks in turn
// as they come free, so a thread the system slows down takes fewer; what a chunk computes
// depends only on the chunk, never on the thread that runs it. A step's kernels come one after
// another, so while a step is under way (from a Run until EndStep) the helpers wait for the
// next call by spinning, up to kStepSpin: a thread that slept costs more to wake than most
// kernels' chunks take. Between steps they sleep, leaving the cores to the shards the job may
// share them with. With `pin`, thread t (the caller from its first Run until the pool is
// destroyed, on that thread) is kept to the t-th of the cores the process could use at start
// (ProcessCores): otherwise a scheduler may queue a helper it wakes behind the thread that woke
// it, on one core, while another sits idle. Unpinned helpers may use every one of those cores,
// whatever their creator's. One caller at a time.
class ForkJoin {
 public:
  ForkJoin(int threads, bool pin) : threads_(std::max(1, threads)), pin_(pin && threads > 1) {
    if (pin_ && static_cast<size_t>(threads_) > ProcessCores().size()) {
      spdlog::warn("worker.compute_threads is {} but the process has {} cores: pinned threads "
                   "share cores, and a thread spinning for the next kernel holds up another",
                   threads_, ProcessCores().size());
    }
    helpers_.reserve(threads_ - 1);
    for (int t = 1; t < threads_; ++t) {
      helpers_.emplace_back([this, t] { Loop(t); });
      if (pin_) {
        (void)PinThreadToCore(helpers_.back().native_handle(), t);  // refused: runs anywhere
      } else {
        (void)UnpinThread(helpers_.back().native_handle());
      }
    }
  }
  ~ForkJoin() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stopping_.store(true);
    }
    work_cv_.notify_all();
    for (std::thread& t : helpers_) t.join();
    // The caller gets its cores back (when it is the thread destroying the pool; a thread that
    // has ended needs nothing back).
    if (caller_pinned_ && pthread_equal(caller_, pthread_self())) {
      (void)pthread_setaffinity_np(caller_, sizeof caller_cores_, &caller_cores_);
    }
  }
  ForkJoin(const ForkJoin&) = delete;
  ForkJoin& operator=(const ForkJoin&) = delete;

  int threads() const { return threads_; }

  // fn(chunk, thread) is called as it is, with no copy and nothing allocated (a step's
  // kernels allocate nothing). REQUIRES: 1 <= chunks <= kMaxChunks.
  template <typename Fn>
  void Run(int chunks, const Fn& fn) {
    if (chunks <= 1 || threads_ == 1) {
      for (int c = 0; c < chunks; ++c) fn(c, 0);
      return;
    }
    if (pin_ && !caller_pinned_) {
      // Until the pool is destroyed: giving the caller its cores back between steps (tried)
      // let the shards' threads queue behind it.
      caller_ = pthread_self();
      CPU_ZERO(&caller_cores_);
      caller_pinned_ = pthread_getaffinity_np(caller_, sizeof caller_cores_, &caller_cores_) == 0 &&
                       PinThreadToCore(caller_, 0);
    }
    in_step_.store(true);
    task_ = &fn;  // fn outlives the call: no chunk can throw out of RunChunks (below)
    call_ = [](const void* task, int chunk, int thread) {
      (*static_cast<const Fn*>(task))(chunk, thread);
    };
    remaining_.store(chunks);
    const uint64_t generation = (Generation(state_.load()) + 1) & 0xffffffffu;
    // Publishes the task to the spinning helpers, then to the sleeping ones.
    state_.store(generation << 32 | uint64_t(chunks) << 16);
    {
      std::lock_guard<std::mutex> lock(mu_);
    }
    work_cv_.notify_all();
    RunChunks(generation, 0);
    if (!SpinUntil([&] { return remaining_.load() == 0; })) {
      std::unique_lock<std::mutex> lock(mu_);
      done_cv_.wait(lock, [&] { return remaining_.load() == 0; });
    }
  }

  // The step's kernels are all issued: the helpers go to sleep.
  void EndStep() { in_step_.store(false); }

  static constexpr int kMaxChunks = 0xffff;

 private:
  static constexpr std::chrono::microseconds kStepSpin{2000};

  // state_: the call's generation (bits 32-63), its chunks (16-31) and the next chunk (0-15).
  static uint64_t Generation(uint64_t s) { return s >> 32; }
  static int Chunks(uint64_t s) { return static_cast<int>((s >> 16) & 0xffff); }
  static int Next(uint64_t s) { return static_cast<int>(s & 0xffff); }

  // Takes and runs chunks of the call `generation` until none is left.
  void RunChunks(uint64_t generation, int thread) {
    uint64_t s = state_.load();
    while (Generation(s) == generation && Next(s) < Chunks(s)) {
      if (!state_.compare_exchange_weak(s, s + 1)) continue;
      // The call cannot end while this chunk is not done, so task_ is still its task. No
      // chunk may leave the call early on any thread, the caller's included (the others would
      // go on with a task whose frame is gone): a failure ends the process.
      try {
        call_(task_, Next(s), thread);
      } catch (const std::bad_alloc&) {
        ExitOutOfMemory("a CPU worker's compute thread");
      } catch (const std::exception& e) {
        spdlog::critical("a CPU worker's kernel failed: {}", e.what());
        std::terminate();
      }
      if (remaining_.fetch_sub(1) == 1) {
        std::lock_guard<std::mutex> lock(mu_);
        done_cv_.notify_one();
      }
      s = state_.load();
    }
  }

  // Spins until ready(), or the step ends, or kStepSpin has passed; ready()'s last answer.
  template <typename Ready>
  bool SpinUntil(Ready ready) const {
    const auto until = std::chrono::steady_clock::now() + kStepSpin;
    while (in_step_.load()) {
      for (int i = 0; i < 64; ++i) {
        if (ready()) return true;
        __builtin_ia32_pause();
      }
      if (std::chrono::steady_clock::now() >= until) break;
    }
    return ready();
  }

  void Loop(int thread) {
    uint64_t seen = 0;
    while (true) {
      auto called = [&] { return stopping_.load() || Generation(state_.load()) != seen; };
      if (!SpinUntil(called)) {
        std::unique_lock<std::mutex> lock(mu_);
        work_cv_.wait(lock, called);
      }
      if (stopping_.load()) return;
      seen = Generation(state_.load());
      RunChunks(seen, thread);
    }
  }

  const int threads_;
  const bool pin_;
  bool caller_pinned_ = false;
  pthread_t caller_{};       // with caller_pinned_: the caller, and its cores before
  cpu_set_t caller_cores_{};
  std::vector<std::thread> helpers_;
  std::mutex mu_;
  std::condition_variable work_cv_, done_cv_;
  // The call's task, set by Run before state_ names the call.
  const void* task_ = nullptr;
  void (*call_)(const void* task, int chunk, int thread) = nullptr;
  std::atomic<uint64_t> state_{0};
  std::atomic<int> remaining_{0};  // the call's chunks not done yet
  std::atomic<bool> in_step_{false};
  std::atomic<bool> stopping_{false};
};

// Chunk p's share [begin, end) of n items split into `parts` runs as even as can be.
inline void PartOf(int64_t n, int parts, int p, int64_t* begin, int64_t* end) {
  *begin = n * p / parts;
  *end = n * (p + 1) / parts;
}

class CpuBackend : public Backend {
 public:
  // `blas_threads`: OpenBLAS's threads for each product. `compute_threads`: the threads each
  // step's kernels are split over (by rows of their output: a product's rows or columns, a
  // kernel's samples or gradient rows), the calling one included.
  CpuBackend(int blas_threads, int compute_threads, bool pin)
      : pool_(compute_threads, pin), scratch_(pool_.threads()) {
    // Only when it changes: the call starts OpenBLAS's pool again after EndIdleBlasThreads.
    if (openblas_get_num_threads() != std::max(1, blas_threads)) {
      openblas_set_num_threads(std::max(1, blas_threads));
    }
  }

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
  // A mark ends a step's work (everything here is done by then): the compute threads sleep.
  void Mark(int /*mark*/) override { pool_.EndStep(); }

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
    const CBLAS_TRANSPOSE ta = trans_a ? CblasTrans : CblasNoTrans;
    const CBLAS_TRANSPOSE tb = trans_b ? CblasTrans : CblasNoTrans;
    // Split along the longer side of the output: each part one product of its rows (or
    // columns) over the whole of k, so every element is the sum it is in one product.
    const bool by_rows = m >= n;
    const int parts = Parts(by_rows ? m : n, int64_t(m) * n * k, kGemmMacsPerPart);
    pool_.Run(parts, [&](int p, int /*thread*/) {
      int64_t begin, end;
      PartOf(by_rows ? m : n, parts, p, &begin, &end);
      const int len = static_cast<int>(end - begin);
      if (len == 0) return;
      if (by_rows) {
        cblas_sgemm(CblasRowMajor, ta, tb, len, n, k, alpha, a + (trans_a ? begin : begin * lda),
                    lda, b, ldb, beta, c + begin * ldc, ldc);
      } else {
        cblas_sgemm(CblasRowMajor, ta, tb, m, len, k, alpha, a, lda,
                    b + (trans_b ? begin * ldb : begin), ldb, beta, c + begin, ldc);
      }
    });
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
    const int parts = Parts(rows, int64_t(rows) * cols, kElementsPerPart);
    pool_.Run(parts, [&](int p, int /*thread*/) {
      int64_t begin, end;
      PartOf(rows, parts, p, &begin, &end);
      float* part = y + begin * cols;
      AddBias(part, bias, static_cast<int>(end - begin), cols);
      if (relu) Relu(part, part, size_t(end - begin) * cols);
    });
  }

  void BiasActivationBackward(float* dpre, float* db, const float* dy, const float* y, int rows,
                              int cols, bool relu) override {
    Timed timed(this, "bias_activation_backward");
    const int parts = Parts(rows, int64_t(rows) * cols, kElementsPerPart);
    if (parts == 1) {
      if (relu) {
        ReluBackward(dpre, dy, y, size_t(rows) * cols);
        BiasGrad(db, dpre, rows, cols);
      } else {
        BiasGrad(db, dy, rows, cols);
      }
      return;
    }
    // Each chunk sums its rows' bias gradient; the chunks' sums are added in order (the same
    // bits for the same number of chunks).
    if (bias_parts_.size() < size_t(parts)) bias_parts_.resize(parts);
    pool_.Run(parts, [&](int p, int /*thread*/) {
      int64_t begin, end;
      PartOf(rows, parts, p, &begin, &end);
      const size_t at = size_t(begin) * cols, n = size_t(end - begin) * cols;
      std::vector<float>& sum = bias_parts_[p];
      sum.resize(cols);
      if (relu) {
        ReluBackward(dpre + at, dy + at, y + at, n);
        BiasGrad(sum.data(), dpre + at, static_cast<int>(end - begin), cols);
      } else {
        BiasGrad(sum.data(), dy + at, static_cast<int>(end - begin), cols);
      }
    });
    std::copy(bias_parts_[0].begin(), bias_parts_[0].begin() + cols, db);
    for (int p = 1; p < parts; ++p) {
      for (int c = 0; c < cols; ++c) db[c] += bias_parts_[p][c];
    }
  }

  void EmbeddingPool(float* out, const float* rows, int dim, const uint32_t* indices,
                     const float* values, const uint32_t* offsets, int batch,
                     uint32_t /*row_count*/) override {
    Timed timed(this, "embedding_pool");
    const int parts = Parts(batch, int64_t(batch) * dim, kElementsPerPart);
    pool_.Run(parts, [&](int p, int /*thread*/) {
      int64_t begin, end;
      PartOf(batch, parts, p, &begin, &end);
      for (int64_t b = begin; b < end; ++b) {
        float* o = out + size_t(b) * dim;
        std::fill(o, o + dim, 0.0f);
        for (uint32_t j = offsets[b]; j < offsets[b + 1]; ++j) {
          const float* r = rows + size_t(indices[j]) * dim;
          const float v = values ? values[j] : 1.0f;
          for (int d = 0; d < dim; ++d) o[d] += v * r[d];
        }
      }
    });
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
    const int parts = Parts(unique, int64_t(keys) * dim, kElementsPerPart);
    pool_.Run(parts, [&](int p, int /*thread*/) {
      int64_t first, last;
      PartOf(unique, parts, p, &first, &last);
      for (uint32_t u = static_cast<uint32_t>(first); u < last; ++u) {
        float* r = drows + size_t(u) * dim;
        const uint32_t begin = row_start[u], end = row_start[u + 1];
        if (lanes > 0) {
          V4 acc[4] = {V4{}, V4{}, V4{}, V4{}};
          for (uint32_t k = begin; k < end; ++k) {
            if (k + kAhead < keys) __builtin_prefetch(grad_row(k + kAhead));
            const float* g = grad_row(k);
            const V4 v = Broadcast(values ? values[occ[k]] : 1.0f);
            for (int q = 0; q < lanes; ++q) {
              acc[q] += v * *reinterpret_cast<const V4U*>(g + 4 * q);
            }
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
    });
  }

  void Interaction(float* out, int out_ld, const float* z, const float* e, int batch, int fields,
                   int dim) override {
    Timed timed(this, "interaction");
    const int parts = Parts(batch, int64_t(batch) * fields * fields * dim, kElementsPerPart);
    pool_.Run(parts, [&](int p, int thread) {
      int64_t begin, end;
      PartOf(batch, parts, p, &begin, &end);
      InteractionForward(out + begin * out_ld, out_ld, z + begin * dim,
                         e + begin * fields * dim, static_cast<int>(end - begin), fields, dim,
                         &scratch_[thread]);
    });
  }

  void InteractionBackward(float* dz, float* de, const float* dout, int dout_ld, const float* z,
                           const float* e, int batch, int fields, int dim) override {
    Timed timed(this, "interaction_backward");
    const int parts = Parts(batch, int64_t(batch) * fields * fields * dim, kElementsPerPart);
    pool_.Run(parts, [&](int p, int thread) {
      int64_t begin, end;
      PartOf(batch, parts, p, &begin, &end);
      parasol::InteractionBackward(dz + begin * dim, de + begin * fields * dim,
                                   dout + begin * dout_ld, dout_ld, z + begin * dim,
                                   e + begin * fields * dim, static_cast<int>(end - begin),
                                   fields, dim, &scratch_[thread]);
    });
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

  // Below these amounts of work (multiply-adds of a product, elements of another kernel) per
  // part, a kernel is not split further: a part must outweigh waking a thread for it.
  static constexpr int64_t kGemmMacsPerPart = int64_t{1} << 18;
  static constexpr int64_t kElementsPerPart = int64_t{1} << 14;

  // Chunks per compute thread, so that a thread slowed down by others leaves its share to
  // the rest.
  static constexpr int64_t kChunksPerThread = 4;

  // How many chunks a kernel over `items` independent rows, of `work` in all, is split into:
  // 1 on one thread (the kernel as it is).
  int Parts(int64_t items, int64_t work, int64_t per_part) const {
    if (pool_.threads() == 1) return 1;
    const int64_t by_work = std::max<int64_t>(1, work / per_part);
    return static_cast<int>(std::max<int64_t>(
        1, std::min({int64_t{pool_.threads()} * kChunksPerThread, items, by_work,
                     int64_t{ForkJoin::kMaxChunks}})));
  }

  std::map<std::string, OpTime> op_times_;
  ForkJoin pool_;
  std::vector<InteractionScratch> scratch_;     // one per thread; kept: no allocation per call
  std::vector<std::vector<float>> bias_parts_;  // the chunks' bias gradients
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

// OpenBLAS's own shutdown of its pool (exported, not in its headers); weak, so that a BLAS
// without it links.
extern "C" int blas_thread_shutdown_(void) __attribute__((weak));

void EndIdleBlasThreads() {
  // One thread first (a later product runs on the caller), then the pool's threads end; the
  // pool starts again only when a thread count above one is asked for.
  openblas_set_num_threads(1);
  if (blas_thread_shutdown_ != nullptr) blas_thread_shutdown_();
}

std::unique_ptr<Backend> MakeCpuBackend(int threads, int compute_threads, bool pin) {
  return std::make_unique<CpuBackend>(threads, compute_threads, pin);
}

Result<std::unique_ptr<Backend>> MakeBackend(const WorkerOptions& options) {
  if (options.device == "cpu") {
    return MakeCpuBackend(static_cast<int>(options.blas_threads),
                          static_cast<int>(options.compute_threads), options.pin_compute_threads);
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
