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
#include <string>
#include <vector>

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

// Host memory the backend copies from and into without staging (pinned for CUDA), of `bytes`
// bytes, freed by its backend when the buffer goes.
class HostBuffer {
 public:
  HostBuffer() = default;
  HostBuffer(void* data, size_t bytes, std::function<void(void*)> free)
      : data_(data, std::move(free)), size_(bytes) {}
  char* data() const { return static_cast<char*>(data_.get()); }
  size_t size() const { return size_; }

 private:
  std::unique_ptr<void, std::function<void(void*)>> data_{nullptr, [](void*) {}};
  size_t size_ = 0;
};

// What crossed between host and device since the backend was made (each Upload/ToDevice is one
// upload, each Download/ToHost one download, each Sync one synchronisation).
struct TransferCounts {
  uint64_t uploads = 0, upload_bytes = 0;
  uint64_t downloads = 0, download_bytes = 0;
  uint64_t syncs = 0;
};

// Device time of one kind of operation, summed while profiling was on.
struct OpTime {
  std::string op;
  double seconds = 0;
  uint64_t calls = 0;
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual const char* name() const = 0;

  virtual DeviceBuffer Allocate(size_t floats) = 0;
  virtual HostBuffer AllocateHost(size_t bytes) = 0;
  // True when device pointers are host pointers (the CPU): a model may then hand its host
  // buffers to the compute calls and its uploads copy nothing.
  virtual bool SharesHostMemory() const { return false; }

  // One asynchronous copy each way. `host` must come from AllocateHost and stay untouched (an
  // upload) or unread (a download) until the copy is known done (Sync, or WaitMark of a mark
  // set after it). A copy to the same address is counted and skipped. An upload runs beside the
  // compute work: it waits for the compute work issued before mark `after` was set (-1: before
  // the upload), and the compute work issued after the upload waits for it. So an upload into a
  // buffer the work of mark `after` was the last to read overlaps the compute issued since.
  virtual void Upload(void* dst, const void* host, size_t bytes, int after = -1) = 0;
  virtual void Download(void* host, const void* src, size_t bytes) = 0;
  // Marks (0 <= mark < kMarks): Mark(m) notes the compute work and downloads issued so far;
  // WaitMark(m) waits for them (one synchronisation) and returns the backend's first error (a
  // backend that failed stays failed).
  static constexpr int kMarks = 4;
  virtual void Mark(int /*mark*/) {}
  virtual Status WaitMark(int /*mark*/) {
    ++transfers_.syncs;
    return Status::Ok();
  }
  // Synchronous copies of floats from and into any host memory (set-up and tests).
  virtual void ToDevice(float* dst, const float* host, size_t n) = 0;
  virtual void ToHost(float* host, const float* src, size_t n) = 0;
  virtual void Fill(float* dst, float value, size_t n) = 0;

  // c[m x n] = alpha * op(a) * op(b) + beta * c, op(a) m x k, op(b) k x n, row-major with
  // leading dimensions (row strides) lda, ldb, ldc.
  virtual void GemmStrided(bool trans_a, bool trans_b, int m, int n, int k, float alpha,
                           const float* a, int lda, const float* b, int ldb, float beta, float* c,
                           int ldc) = 0;
  // The same with dense matrices (each leading dimension its row length).
  void Gemm(bool trans_a, bool trans_b, int m, int n, int k, float alpha, const float* a,
            const float* b, float beta, float* c) {
    GemmStrided(trans_a, trans_b, m, n, k, alpha, a, trans_a ? m : k, b, trans_b ? k : n, beta,
                c, n);
  }
  // c = op(a) op(b) + bias (bias[j] added to column j), then ReLU when `relu`: a linear
  // layer's forward in one call (a device backend fuses the bias and ReLU into the product's
  // epilogue).
  virtual void GemmBiasActivation(bool trans_a, bool trans_b, int m, int n, int k, const float* a,
                                  int lda, const float* b, int ldb, const float* bias, float* c,
                                  int ldc, bool relu) {
    GemmStrided(trans_a, trans_b, m, n, k, 1.0f, a, lda, b, ldb, 0.0f, c, ldc);
    if (ldc == n) {
      BiasActivation(c, bias, m, n, relu);
    } else {
      for (int r = 0; r < m; ++r) BiasActivation(c + size_t(r) * ldc, bias, 1, n, relu);
    }
  }
  // y[r, :] += bias for every row r.
  virtual void AddBias(float* y, const float* bias, int rows, int cols) = 0;
  // db = sum over rows of dy (overwrites db).
  virtual void BiasGrad(float* db, const float* dy, int rows, int cols) = 0;
  virtual void Relu(float* y, const float* x, size_t n) = 0;
  // dx = dy where y > 0, else 0.
  virtual void ReluBackward(float* dx, const float* dy, const float* y, size_t n) = 0;
  // One pass: y[r, :] += bias, then ReLU when `relu`.
  virtual void BiasActivation(float* y, const float* bias, int rows, int cols, bool relu) = 0;
  // One pass backward of BiasActivation: with `relu`, dpre = dy where y > 0, else 0, and
  // db = column sums of dpre; without, db = column sums of dy (dpre is not written).
  virtual void BiasActivationBackward(float* dpre, float* db, const float* dy, const float* y,
                                      int rows, int cols, bool relu) = 0;

  // out[b, :] = sum_j values[j] * rows[indices[j], :] for j in [offsets[b], offsets[b + 1]);
  // `values` may be null (all ones). REQUIRES: every index < row_count.
  virtual void EmbeddingPool(float* out, const float* rows, int dim, const uint32_t* indices,
                             const float* values, const uint32_t* offsets, int batch,
                             uint32_t row_count) = 0;
  // drows[indices[j], :] += values[j] * dout[b, :] (drows must be zeroed by the caller).
  virtual void EmbeddingPoolBackward(float* drows, const float* dout, int dim,
                                     const uint32_t* indices, const float* values,
                                     const uint32_t* offsets, int batch) = 0;
  // The same gradient, deterministically and without zeroing, from the batch's row index (see
  // BuildRowIndex in kernels/embedding_pool.hpp): for each of the `unique` rows u,
  //   drows[u, :] = sum over k in [row_start[u], row_start[u + 1]) in order of
  //                 values[occ[k]] * dout[bag(occ[k]), :]
  // where bag(j) = key_bags[j], or j when key_bags is null; `values` may be null. hot_rows
  // lists the rows with at least kHotRowKeys keys (computed with more threads). With `counts`
  // (device memory: the number of rows, then of hot rows), `unique` and `hot_count` are only
  // upper bounds, so one recorded graph serves every step.
  virtual void EmbeddingRowGrad(float* drows, const float* dout, int dim,
                                const uint32_t* row_start, const uint32_t* occ,
                                const uint32_t* hot_rows, uint32_t hot_count,
                                const uint32_t* key_bags, const float* values, uint32_t unique,
                                const uint32_t* counts = nullptr) = 0;

  // The batch's row index (kernels/embedding_pool.hpp), built where the gradients are summed:
  // from indices[0, keys), each < counts[0] (the number of rows, in this backend's memory;
  // max_rows bounds it, and every row has a key), row_start [counts[0] + 1], occ [keys],
  // hot_rows and counts[1] (their number).
  virtual void BuildRowIndex(const uint32_t* indices, uint32_t keys, uint32_t max_rows,
                             uint32_t* row_start, uint32_t* occ, uint32_t* hot_rows,
                             uint32_t* counts) = 0;

  // DLRM interaction of the bottom output z [batch, dim] and the embeddings e
  // [batch, fields, dim]. With v_0 = z and v_i = e[:, i - 1], per sample:
  //   out[b] = [z[b, :], dot(v_i, v_j) for i > j, in row-major order of (i, j)]
  // (width dim + (fields + 1) * fields / 2), each sample's row `out_ld` floats apart; the
  // columns past the width are zeroed.
  virtual void Interaction(float* out, int out_ld, const float* z, const float* e, int batch,
                           int fields, int dim) = 0;
  // dz and de from dout (rows dout_ld floats apart; both outputs overwritten).
  virtual void InteractionBackward(float* dz, float* de, const float* dout, int dout_ld,
                                   const float* z, const float* e, int batch, int fields,
                                   int dim) = 0;

  // probs = sigmoid(logits); dlogits = (probs - labels) / n; *loss_sum (one device double) =
  // the sum of the BCE losses. Asynchronous: read loss_sum after Sync().
  virtual void SigmoidBce(float* probs, float* dlogits, double* loss_sum, const float* logits,
                          const float* labels, int n) = 0;

  // Waits for the device and returns the first error of any call (a device backend records
  // errors instead of throwing, skips every call after one and stays failed; the CPU backend
  // has none).
  virtual Status Sync() {
    ++transfers_.syncs;
    return Status::Ok();
  }

  const TransferCounts& transfers() const { return transfers_; }

  // Graphs: the compute work issued between BeginGraph() (true: recording) and EndGraph() is
  // recorded instead of run, and RunGraph(id) replays it as one launch (CUDA Graphs). EndGraph
  // returns the graph's id, or -1 when recording failed: then nothing ran, so issue the work
  // directly. The CPU backend records nothing (BeginGraph is false), nor does any backend while
  // profiling. A graph replays the same pointers and shapes. RunGraph returns false, running
  // nothing, when the graph is gone (released, or dropped because the backend's scratch memory
  // it used had to grow): record it again. GraphCount: graphs recorded so far.
  virtual bool BeginGraph() { return false; }
  virtual int EndGraph() { return -1; }
  virtual bool RunGraph(int /*id*/) { return false; }
  virtual void ReleaseGraph(int /*id*/) {}
  virtual int GraphCount() const { return 0; }

  // Profiling: while on, the device time of each operation is summed by kind (a device
  // backend brackets each call with events; off by default, as it synchronises per call).
  // Benchmarks: seconds per run of `work` (which issues device work) run `repeats` times back
  // to back, between two device events (the host clock on the CPU); median of `samples`.
  virtual double TimeDevice(const std::function<void()>& work, int repeats, int samples);
  void SetProfiling(bool on) { profiling_ = on; }
  bool profiling() const { return profiling_; }
  virtual std::vector<OpTime> OpTimes() const { return {}; }
  virtual void ClearOpTimes() {}

 protected:
  TransferCounts transfers_;
  bool profiling_ = false;
};

// The CPU backend: OpenBLAS with `threads` threads per product, and each kernel (products
// included) split by rows over `compute_threads` threads, the caller's among them; with `pin`,
// each of those kept to a core of its own (worker.pin_compute_threads).
std::unique_ptr<Backend> MakeCpuBackend(int threads = 1, int compute_threads = 1,
                                        bool pin = false);

// Ends OpenBLAS's thread pool, leaving it one thread (the caller's) until a CPU backend asks for
// more (worker.blas_threads). The pthread OpenBLAS starts the pool as it loads, a thread for
// each core but the caller's (or OPENBLAS_NUM_THREADS - 1), and each of those spins
// (sched_yield) for about 0.1 s before it sleeps: 60-120 ms of a core per thread in every
// process of the `parasol` program as it starts, beside the job's threads, where no role uses
// a second BLAS thread unless blas_threads asks (the pool then starts again at its full size,
// and the threads beyond those asked for sleep after their spin). Its main() calls this first.
// A BLAS without OpenBLAS's pool shutdown gets only the thread count set.
void EndIdleBlasThreads();

// The CUDA backend on device `device` (cuBLAS, TF32 when `tf32`), or an error saying why it
// cannot run here (no CUDA in this build, no device, ...).
Result<std::unique_ptr<Backend>> MakeCudaBackend(int device, bool tf32);

// The backend worker.device names: "cpu", "cuda" or "cuda:N".
Result<std::unique_ptr<Backend>> MakeBackend(const WorkerOptions& options);

}  // namespace parasol
