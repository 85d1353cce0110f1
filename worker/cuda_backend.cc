// The CUDA backend: cuBLAS for matrix products, the kernels in kernels/ for the rest.
//
// Kernels and products run on one compute stream. Uploads run on a copy stream: each waits for
// the compute work issued before it, or before a mark (the destination may still be read), and
// the compute work issued after it waits for it. A model's step makes one upload from and one
// download into pinned host buffers (AllocateHost) and waits once (WaitMark). Every CUDA and
// cuBLAS status is checked; the first error (file, line, expression or kernel) is kept, every
// call after it is skipped (no launch, no copy), and Sync() and WaitMark() return it.
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "kernels/cuda_check.hpp"
#include "kernels/elementwise.hpp"
#include "kernels/embedding_pool.hpp"
#include "kernels/interaction.hpp"
#include "kernels/row_index.hpp"
#include "kernels/sigmoid_bce.hpp"
#include "worker/backend.hpp"

namespace parasol {
namespace {

Status CublasStatus(cublasStatus_t s, const char* expr, const char* file, int line) {
  return Internal(std::string(file) + ":" + std::to_string(line) + ": " + expr + " failed: " +
                  cublasGetStatusName(s) + ": " + cublasGetStatusString(s));
}

class CudaBackend : public Backend {
 public:
  CudaBackend(int device, bool tf32) : device_(device), tf32_(tf32) {}

  ~CudaBackend() override {
    if (compute_) cudaStreamSynchronize(compute_);
    if (copy_) cudaStreamSynchronize(copy_);
    for (cudaGraphExec_t g : graphs_) {
      if (g) cudaGraphExecDestroy(g);
    }
    lt_plans_.clear();
    if (lt_) cublasLtDestroy(lt_);
    if (handle_) cublasDestroy(handle_);
    if (cublas_workspace_) cudaFree(cublas_workspace_);
    for (cudaEvent_t e : {copied_, computed_}) {
      if (e) cudaEventDestroy(e);
    }
    for (cudaEvent_t e : marks_) {
      if (e) cudaEventDestroy(e);
    }
    if (row_scratch_) cudaFree(row_scratch_);
    for (auto& t : timings_) {
      cudaEventDestroy(t.start);
      cudaEventDestroy(t.end);
    }
    for (cudaEvent_t e : spare_events_) cudaEventDestroy(e);
    if (compute_) cudaStreamDestroy(compute_);
    if (copy_) cudaStreamDestroy(copy_);
    for (auto& b : pinned_) cudaFreeHost(b.data);
    if (workspace_) cudaFree(workspace_);
  }

  Status Init() {
    PARASOL_CUDA_CHECK(cudaSetDevice(device_));
    PARASOL_CUDA_CHECK(cudaStreamCreateWithFlags(&compute_, cudaStreamNonBlocking));
    PARASOL_CUDA_CHECK(cudaStreamCreateWithFlags(&copy_, cudaStreamNonBlocking));
    PARASOL_CUDA_CHECK(cudaEventCreateWithFlags(&copied_, cudaEventDisableTiming));
    PARASOL_CUDA_CHECK(cudaEventCreateWithFlags(&computed_, cudaEventDisableTiming));
    for (cudaEvent_t& e : marks_) {
      PARASOL_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    }
    if (cublasStatus_t s = cublasCreate(&handle_); s != CUBLAS_STATUS_SUCCESS) {
      return CublasStatus(s, "cublasCreate(&handle_)", __FILE__, __LINE__);
    }
    if (cublasStatus_t s = cublasSetStream(handle_, compute_); s != CUBLAS_STATUS_SUCCESS) {
      return CublasStatus(s, "cublasSetStream(handle_, compute_)", __FILE__, __LINE__);
    }
    // A workspace of cuBLAS's own, so that products recorded into a graph allocate nothing.
    PARASOL_CUDA_CHECK(cudaMalloc(&cublas_workspace_, kCublasWorkspace));
    if (cublasStatus_t s = cublasSetWorkspace(handle_, cublas_workspace_, kCublasWorkspace);
        s != CUBLAS_STATUS_SUCCESS) {
      return CublasStatus(s, "cublasSetWorkspace", __FILE__, __LINE__);
    }
    // fp32 products in plain fp32 (cuBLAS's default math); TF32 tensor cores when asked.
    const cublasMath_t math = tf32_ ? CUBLAS_TF32_TENSOR_OP_MATH : CUBLAS_DEFAULT_MATH;
    if (cublasStatus_t s = cublasSetMathMode(handle_, math); s != CUBLAS_STATUS_SUCCESS) {
      return CublasStatus(s, "cublasSetMathMode(handle_, math)", __FILE__, __LINE__);
    }
    return Status::Ok();
  }

  const char* name() const override { return "cuda"; }

  DeviceBuffer Allocate(size_t floats) override {
    void* p = nullptr;
    if (!status_.ok()) return DeviceBuffer();
    const size_t bytes = std::max<size_t>(1, floats) * sizeof(float);
    Record(CudaCall(cudaMalloc(&p, bytes), "cudaMalloc", __LINE__));
    if (!status_.ok()) return DeviceBuffer();
    // Zeroed on the compute stream; uploads wait for the compute stream, so they land after.
    Record(CudaCall(cudaMemsetAsync(p, 0, bytes, compute_), "cudaMemsetAsync", __LINE__));
    return DeviceBuffer(static_cast<float*>(p), floats, [](float* q) { cudaFree(q); });
  }

  HostBuffer AllocateHost(size_t bytes) override {
    void* p = nullptr;
    if (!status_.ok()) return HostBuffer();
    Record(CudaCall(cudaHostAlloc(&p, std::max<size_t>(1, bytes), cudaHostAllocDefault),
                    "cudaHostAlloc", __LINE__));
    if (!status_.ok()) return HostBuffer();
    std::memset(p, 0, bytes);  // zeroed, as the CPU backend's
    return HostBuffer(p, bytes, [](void* q) { cudaFreeHost(q); });
  }

  void Upload(void* dst, const void* host, size_t bytes, int after) override {
    ++transfers_.uploads;
    transfers_.upload_bytes += bytes;
    if (bytes == 0 || !status_.ok()) return;
    // The copy waits for the compute work issued before mark `after` (or so far): that work may
    // read dst. The compute work issued from now on waits for the copy.
    if (after >= 0 && after < kMarks && marked_[after]) {
      Record(CudaCall(cudaStreamWaitEvent(copy_, marks_[after], 0), "cudaStreamWaitEvent",
                      __LINE__));
    } else {  // no mark yet (or none asked for): after all compute work so far
      Record(CudaCall(cudaEventRecord(computed_, compute_), "cudaEventRecord", __LINE__));
      Record(CudaCall(cudaStreamWaitEvent(copy_, computed_, 0), "cudaStreamWaitEvent", __LINE__));
    }
    Record(CudaCall(cudaMemcpyAsync(dst, host, bytes, cudaMemcpyHostToDevice, copy_),
                    "cudaMemcpyAsync(H2D)", __LINE__));
    Record(CudaCall(cudaEventRecord(copied_, copy_), "cudaEventRecord", __LINE__));
    Record(CudaCall(cudaStreamWaitEvent(compute_, copied_, 0), "cudaStreamWaitEvent", __LINE__));
  }

  void Mark(int mark) override {
    if (!status_.ok() || mark < 0 || mark >= kMarks) return;
    Record(CudaCall(cudaEventRecord(marks_[mark], compute_), "cudaEventRecord(mark)", __LINE__));
    marked_[mark] = true;
  }

  Status WaitMark(int mark) override {
    ++transfers_.syncs;
    if (status_.ok() && mark >= 0 && mark < kMarks && marked_[mark]) {
      Record(CudaCall(cudaEventSynchronize(marks_[mark]), "cudaEventSynchronize(mark)",
                      __LINE__));
    }
    CollectTimings();
    return status_;
  }

  void BuildRowIndex(const uint32_t* indices, uint32_t keys, uint32_t max_rows,
                     uint32_t* row_start, uint32_t* occ, uint32_t* hot_rows,
                     uint32_t* counts) override {
    // Sized for as many rows as keys (the most there can be), so that a graph recorded later
    // with a larger bound needs no more.
    const size_t need = RowIndexScratchBytes(keys, std::max(keys, max_rows));
    float* scratch = Scratch(&row_scratch_, &row_scratch_floats_, (need + 3) / 4);
    Launch("row_index", [&] {
      return BuildRowIndexCuda(indices, keys, max_rows, row_start, occ, hot_rows, counts, scratch,
                               row_scratch_floats_ * sizeof(float), compute_);
    });
  }

  void Download(void* host, const void* src, size_t bytes) override {
    ++transfers_.downloads;
    transfers_.download_bytes += bytes;
    if (bytes == 0 || !status_.ok()) return;
    Record(CudaCall(cudaMemcpyAsync(host, src, bytes, cudaMemcpyDeviceToHost, compute_),
                    "cudaMemcpyAsync(D2H)", __LINE__));
  }

  void ToDevice(float* dst, const float* host, size_t n) override {
    if (n == 0 || !status_.ok()) {
      ++transfers_.uploads;
      return;
    }
    // Any host memory: staged through pinned memory, which stays in use until Sync().
    float* staged = Stage(n);
    if (!staged) return;
    std::memcpy(staged, host, n * sizeof(float));
    Upload(dst, staged, n * sizeof(float), -1);
  }

  void ToHost(float* host, const float* src, size_t n) override {
    ++transfers_.downloads;
    transfers_.download_bytes += n * sizeof(float);
    if (n == 0 || !status_.ok()) return;
    float* staged = Stage(n);
    if (!staged) return;
    Record(CudaCall(cudaMemcpyAsync(staged, src, n * sizeof(float), cudaMemcpyDeviceToHost,
                                    compute_),
                    "cudaMemcpyAsync(D2H)", __LINE__));
    Record(CudaCall(cudaStreamSynchronize(compute_), "cudaStreamSynchronize(compute)", __LINE__));
    if (status_.ok()) std::memcpy(host, staged, n * sizeof(float));
  }

  void Fill(float* dst, float value, size_t n) override {
    Launch("fill", [&] { return FillCuda(dst, value, n, compute_); });
  }

  void GemmStrided(bool trans_a, bool trans_b, int m, int n, int k, float alpha, const float* a,
                   int lda, const float* b, int ldb, float beta, float* c, int ldc) override {
    auto op = [&]() -> Status {
      // Row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T.
      const cublasStatus_t s = cublasSgemm(
          handle_, trans_b ? CUBLAS_OP_T : CUBLAS_OP_N, trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, n,
          m, k, &alpha, b, ldb, a, lda, &beta, c, ldc);
      if (s != CUBLAS_STATUS_SUCCESS) return CublasStatus(s, "cublasSgemm", __FILE__, __LINE__);
      return Status::Ok();
    };
    if (!profiling_) {
      Launch("gemm", op);
      return;
    }
    char name[128];
    std::snprintf(name, sizeof name, "gemm %dx%dx%d %c%c ld %d %d %d", m, n, k, trans_a ? 'T' : 'N',
                  trans_b ? 'T' : 'N', lda, ldb, ldc);
    Launch(name, op);
  }

  // One cuBLASLt product with the bias (and ReLU) in its epilogue. The descriptors and the
  // algorithm (cuBLASLt's first choice for the shape, never one that reduces in place, so the
  // result is the same from run to run) are kept per shape; a shape with no such algorithm takes
  // the product and a fused bias pass instead.
  void GemmBiasActivation(bool trans_a, bool trans_b, int m, int n, int k, const float* a,
                          int lda, const float* b, int ldb, const float* bias, float* c, int ldc,
                          bool relu) override {
    if (!status_.ok()) return;
    const LtKey key{trans_a, trans_b, m, n, k, lda, ldb, ldc, relu};
    auto it = lt_plans_.find(key);
    if (it == lt_plans_.end()) it = lt_plans_.emplace(key, MakeLtPlan(key)).first;
    LtPlan& plan = *it->second;
    if (!plan.ok) {
      Backend::GemmBiasActivation(trans_a, trans_b, m, n, k, a, lda, b, ldb, bias, c, ldc, relu);
      return;
    }
    char name[128] = "gemm";
    if (profiling_) {
      std::snprintf(name, sizeof name, "gemm %dx%dx%d %c%c ld %d %d %d %s", m, n, k,
                    trans_a ? 'T' : 'N', trans_b ? 'T' : 'N', lda, ldb, ldc,
                    relu ? "+bias_relu" : "+bias");
    }
    Launch(name, [&]() -> Status {
      if (cublasStatus_t s = cublasLtMatmulDescSetAttribute(
              plan.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias);
          s != CUBLAS_STATUS_SUCCESS) {
        return CublasStatus(s, "cublasLtMatmulDescSetAttribute(BIAS_POINTER)", __FILE__, __LINE__);
      }
      const float alpha = 1.0f, beta = 0.0f;
      const cublasStatus_t s =
          cublasLtMatmul(lt_, plan.desc, &alpha, b, plan.first, a, plan.second, &beta, c,
                         plan.out, c, plan.out, &plan.algo, cublas_workspace_, kCublasWorkspace,
                         compute_);
      if (s != CUBLAS_STATUS_SUCCESS) return CublasStatus(s, "cublasLtMatmul", __FILE__, __LINE__);
      return Status::Ok();
    });
  }

  void AddBias(float* y, const float* bias, int rows, int cols) override {
    Launch("add_bias", [&] { return AddBiasCuda(y, bias, rows, cols, compute_); });
  }
  void BiasGrad(float* db, const float* dy, int rows, int cols) override {
    float* ws = Workspace(ColumnSumWorkspaceFloats(rows, cols));
    Launch("bias_grad", [&] { return BiasGradCuda(db, dy, rows, cols, ws, compute_); });
  }
  void Relu(float* y, const float* x, size_t n) override {
    Launch("relu", [&] { return ReluCuda(y, x, n, compute_); });
  }
  void ReluBackward(float* dx, const float* dy, const float* y, size_t n) override {
    Launch("relu_backward", [&] { return ReluBackwardCuda(dx, dy, y, n, compute_); });
  }
  void BiasActivation(float* y, const float* bias, int rows, int cols, bool relu) override {
    Launch(relu ? "bias_relu" : "bias",
           [&] { return BiasActivationCuda(y, bias, rows, cols, relu, compute_); });
  }
  void BiasActivationBackward(float* dpre, float* db, const float* dy, const float* y, int rows,
                              int cols, bool relu) override {
    float* ws = Workspace(ColumnSumWorkspaceFloats(rows, cols));
    Launch(relu ? "bias_relu_backward" : "bias_backward", [&] {
      return BiasActivationBackwardCuda(dpre, db, dy, y, rows, cols, relu, ws, compute_);
    });
  }
  void EmbeddingPool(float* out, const float* rows, int dim, const uint32_t* indices,
                     const float* values, const uint32_t* offsets, int batch,
                     uint32_t row_count) override {
    Launch("embedding_pool", [&] {
      return EmbeddingPoolCuda(out, rows, dim, indices, values, offsets, batch, row_count,
                               compute_);
    });
  }
  void EmbeddingPoolBackward(float* drows, const float* dout, int dim, const uint32_t* indices,
                             const float* values, const uint32_t* offsets, int batch) override {
    Launch("embedding_pool_backward", [&] {
      return EmbeddingPoolBackwardCuda(drows, dout, dim, indices, values, offsets, batch,
                                       compute_);
    });
  }
  void EmbeddingRowGrad(float* drows, const float* dout, int dim, const uint32_t* row_start,
                        const uint32_t* occ, const uint32_t* hot_rows, uint32_t hot_count,
                        const uint32_t* key_bags, const float* values, uint32_t unique,
                        const uint32_t* counts) override {
    Launch("embedding_row_grad", [&] {
      return EmbeddingRowGradCuda(drows, dout, dim, row_start, occ, hot_rows, hot_count,
                                  key_bags, values, unique, counts, compute_);
    });
  }
  void Interaction(float* out, int out_ld, const float* z, const float* e, int batch, int fields,
                   int dim) override {
    Launch("interaction", [&] {
      return InteractionCuda(out, out_ld, z, e, batch, fields, dim, compute_);
    });
  }
  void InteractionBackward(float* dz, float* de, const float* dout, int dout_ld, const float* z,
                           const float* e, int batch, int fields, int dim) override {
    Launch("interaction_backward", [&] {
      return InteractionBackwardCuda(dz, de, dout, dout_ld, z, e, batch, fields, dim, compute_);
    });
  }
  void SigmoidBce(float* probs, float* dlogits, double* loss_sum, const float* logits,
                  const float* labels, int n) override {
    Launch("sigmoid_bce", [&] {
      return SigmoidBceCuda(probs, dlogits, loss_sum, logits, labels, n, compute_);
    });
  }

  Status Sync() override {
    ++transfers_.syncs;
    Record(CudaCall(cudaStreamSynchronize(copy_), "cudaStreamSynchronize(copy)", __LINE__));
    Record(CudaCall(cudaStreamSynchronize(compute_), "cudaStreamSynchronize(compute)", __LINE__));
    for (auto& b : pinned_) b.used = 0;  // every staged copy has landed
    CollectTimings();
    return status_;
  }

  double TimeDevice(const std::function<void()>& work, int repeats, int samples) override {
    cudaEvent_t start = NewEvent(), end = NewEvent();
    std::vector<double> times;
    for (int s = 0; s < samples && status_.ok(); ++s) {
      Record(CudaCall(cudaEventRecord(start, compute_), "cudaEventRecord", __LINE__));
      for (int i = 0; i < repeats; ++i) work();
      Record(CudaCall(cudaEventRecord(end, compute_), "cudaEventRecord", __LINE__));
      Record(CudaCall(cudaEventSynchronize(end), "cudaEventSynchronize", __LINE__));
      float ms = 0;
      Record(CudaCall(cudaEventElapsedTime(&ms, start, end), "cudaEventElapsedTime", __LINE__));
      times.push_back(ms / 1e3 / repeats);
    }
    spare_events_.push_back(start);
    spare_events_.push_back(end);
    if (!status_.ok() || times.empty()) return -1;
    std::sort(times.begin(), times.end());
    return times[times.size() / 2];
  }

  bool BeginGraph() override {
    if (profiling_ || !status_.ok()) return false;
    // Thread-local: other threads' CUDA calls are not this recording's business.
    if (cudaStreamBeginCapture(compute_, cudaStreamCaptureModeThreadLocal) != cudaSuccess) {
      cudaGetLastError();
      return false;
    }
    return true;
  }

  int EndGraph() override {
    cudaGraph_t graph = nullptr;
    const cudaError_t ended = cudaStreamEndCapture(compute_, &graph);
    cudaGraphExec_t exec = nullptr;
    const bool ok = status_.ok() && ended == cudaSuccess && graph &&
                    cudaGraphInstantiate(&exec, graph, 0) == cudaSuccess;
    if (graph) cudaGraphDestroy(graph);
    if (!ok) {
      // Nothing ran: the caller issues the work directly. Forget the recording's errors.
      cudaGetLastError();
      status_ = Status::Ok();
      if (exec) cudaGraphExecDestroy(exec);
      return -1;
    }
    graphs_.push_back(exec);
    ++graphs_recorded_;
    return static_cast<int>(graphs_.size() - 1);
  }

  bool RunGraph(int id) override {
    if (!status_.ok() || id < 0 || id >= static_cast<int>(graphs_.size()) || !graphs_[id]) {
      return false;
    }
    Record(CudaCall(cudaGraphLaunch(graphs_[id], compute_), "cudaGraphLaunch", __LINE__));
    return true;
  }

  void ReleaseGraph(int id) override {
    if (id < 0 || id >= static_cast<int>(graphs_.size()) || !graphs_[id]) return;
    cudaGraphExecDestroy(graphs_[id]);  // waits for its launches, if any are running
    graphs_[id] = nullptr;
  }

  int GraphCount() const override { return graphs_recorded_; }

  void ClearOpTimes() override { op_times_.clear(); }
  std::vector<OpTime> OpTimes() const override {
    std::vector<OpTime> out;
    for (const auto& [op, t] : op_times_) out.push_back(t);
    return out;
  }

 private:
  struct LtKey {
    bool ta, tb;
    int m, n, k, lda, ldb, ldc;
    bool relu;
    bool operator<(const LtKey& o) const {
      return std::tie(ta, tb, m, n, k, lda, ldb, ldc, relu) <
             std::tie(o.ta, o.tb, o.m, o.n, o.k, o.lda, o.ldb, o.ldc, o.relu);
    }
  };
  struct LtPlan {
    bool ok = false;
    cublasLtMatmulDesc_t desc = nullptr;
    cublasLtMatrixLayout_t first = nullptr, second = nullptr, out = nullptr;
    cublasLtMatmulAlgo_t algo = {};
    ~LtPlan() {
      for (auto l : {first, second, out}) {
        if (l) cublasLtMatrixLayoutDestroy(l);
      }
      if (desc) cublasLtMatmulDescDestroy(desc);
    }
  };

  // Row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T: cuBLASLt's first operand
  // is our b, its second our a, and the bias runs along its rows (our columns).
  std::unique_ptr<LtPlan> MakeLtPlan(const LtKey& key) {
    auto plan = std::make_unique<LtPlan>();
    if (!lt_ && cublasLtCreate(&lt_) != CUBLAS_STATUS_SUCCESS) return plan;
    const cublasComputeType_t compute = tf32_ ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
    if (cublasLtMatmulDescCreate(&plan->desc, compute, CUDA_R_32F) != CUBLAS_STATUS_SUCCESS) {
      return plan;
    }
    const cublasOperation_t op_first = key.tb ? CUBLAS_OP_T : CUBLAS_OP_N;
    const cublasOperation_t op_second = key.ta ? CUBLAS_OP_T : CUBLAS_OP_N;
    const cublasLtEpilogue_t epilogue = key.relu ? CUBLASLT_EPILOGUE_RELU_BIAS : CUBLASLT_EPILOGUE_BIAS;
    bool ok =
        cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_TRANSA, &op_first,
                                       sizeof op_first) == CUBLAS_STATUS_SUCCESS &&
        cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_TRANSB, &op_second,
                                       sizeof op_second) == CUBLAS_STATUS_SUCCESS &&
        cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue,
                                       sizeof epilogue) == CUBLAS_STATUS_SUCCESS;
    const int first_rows = key.tb ? key.k : key.n, first_cols = key.tb ? key.n : key.k;
    const int second_rows = key.ta ? key.m : key.k, second_cols = key.ta ? key.k : key.m;
    ok = ok &&
         cublasLtMatrixLayoutCreate(&plan->first, CUDA_R_32F, first_rows, first_cols, key.ldb) ==
             CUBLAS_STATUS_SUCCESS &&
         cublasLtMatrixLayoutCreate(&plan->second, CUDA_R_32F, second_rows, second_cols,
                                    key.lda) == CUBLAS_STATUS_SUCCESS &&
         cublasLtMatrixLayoutCreate(&plan->out, CUDA_R_32F, key.n, key.m, key.ldc) ==
             CUBLAS_STATUS_SUCCESS;
    if (!ok) return plan;
    cublasLtMatmulPreference_t pref = nullptr;
    if (cublasLtMatmulPreferenceCreate(&pref) != CUBLAS_STATUS_SUCCESS) return plan;
    const uint64_t workspace = kCublasWorkspace;
    const uint32_t schemes = CUBLASLT_REDUCTION_SCHEME_NONE | CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE |
                             CUBLASLT_REDUCTION_SCHEME_OUTPUT_TYPE;
    cublasLtMatmulHeuristicResult_t result = {};
    int returned = 0;
    ok = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                              &workspace, sizeof workspace) ==
             CUBLAS_STATUS_SUCCESS &&
         cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK,
                                              &schemes, sizeof schemes) == CUBLAS_STATUS_SUCCESS &&
         cublasLtMatmulAlgoGetHeuristic(lt_, plan->desc, plan->first, plan->second, plan->out,
                                        plan->out, pref, 1, &result, &returned) ==
             CUBLAS_STATUS_SUCCESS &&
         returned > 0 && result.state == CUBLAS_STATUS_SUCCESS;
    cublasLtMatmulPreferenceDestroy(pref);
    if (ok) {
      plan->algo = result.algo;
      plan->ok = true;
    }
    return plan;
  }

  struct Pinned {
    float* data = nullptr;
    size_t size = 0;  // floats
    size_t used = 0;
  };
  struct Timing {
    std::string op;
    cudaEvent_t start = nullptr, end = nullptr;
  };

  Status CudaCall(cudaError_t err, const char* expr, int line) {
    if (err == cudaSuccess) return Status::Ok();
    return CudaStatus(static_cast<int>(err), expr, __FILE__, line);
  }
  void Record(const Status& st) {
    if (status_.ok() && !st.ok()) status_ = st;
  }

  // Runs one operation unless an earlier one failed; while profiling, between two events.
  template <typename Op>
  void Launch(const char* op, Op&& run) {
    if (!status_.ok()) return;
    if (!profiling_) {
      Record(run());
      return;
    }
    Timing t{op, NewEvent(), NewEvent()};
    Record(CudaCall(cudaEventRecord(t.start, compute_), "cudaEventRecord", __LINE__));
    Record(run());
    Record(CudaCall(cudaEventRecord(t.end, compute_), "cudaEventRecord", __LINE__));
    timings_.push_back(std::move(t));
  }
  cudaEvent_t NewEvent() {
    if (!spare_events_.empty()) {
      cudaEvent_t e = spare_events_.back();
      spare_events_.pop_back();
      return e;
    }
    cudaEvent_t e = nullptr;
    Record(CudaCall(cudaEventCreate(&e), "cudaEventCreate", __LINE__));
    return e;
  }
  // Sums the timings whose operations have finished; keeps the others for later.
  void CollectTimings() {
    std::vector<Timing> pending;
    for (auto& t : timings_) {
      if (status_.ok() && cudaEventQuery(t.end) == cudaErrorNotReady) {
        pending.push_back(std::move(t));
        continue;
      }
      float ms = 0;
      if (status_.ok() && cudaEventElapsedTime(&ms, t.start, t.end) == cudaSuccess) {
        OpTime& o = op_times_[t.op];
        o.op = t.op;
        o.seconds += ms / 1e3;
        ++o.calls;
      }
      spare_events_.push_back(t.start);
      spare_events_.push_back(t.end);
    }
    cudaGetLastError();  // a query of an unfinished event is not an error
    timings_ = std::move(pending);
  }

  // Device scratch of at least n floats (column-sum partials); grows only while warming up.
  float* Workspace(size_t n) { return Scratch(&workspace_, &workspace_floats_, n); }

  // Device scratch *buffer of *floats floats, grown to at least n (only while warming up).
  float* Scratch(float** buffer, size_t* floats, size_t n) {
    if (n <= *floats || !status_.ok()) return *buffer;
    cudaStreamCaptureStatus capturing = cudaStreamCaptureStatusNone;
    cudaStreamIsCapturing(compute_, &capturing);
    if (capturing != cudaStreamCaptureStatusNone) {  // no allocation while recording a graph
      Record(Internal("device scratch must grow while a graph is recorded"));
      return nullptr;
    }
    // The old scratch may still be in use by queued kernels, and recorded graphs use it: they
    // are dropped (their models record them again).
    Record(CudaCall(cudaStreamSynchronize(compute_), "cudaStreamSynchronize(compute)", __LINE__));
    for (cudaGraphExec_t& g : graphs_) {
      if (g) cudaGraphExecDestroy(g);
      g = nullptr;
    }
    if (*buffer) cudaFree(*buffer);
    *buffer = nullptr;
    *floats = 0;
    void* p = nullptr;
    const size_t size = std::max<size_t>(n, 1 << 16);
    Record(CudaCall(cudaMalloc(&p, size * sizeof(float)), "cudaMalloc", __LINE__));
    if (!status_.ok()) return nullptr;
    *buffer = static_cast<float*>(p);
    *floats = size;
    return *buffer;
  }

  // Pinned staging space for n floats, valid until the next Sync() (ToDevice/ToHost only).
  float* Stage(size_t n) {
    for (auto& b : pinned_) {
      if (b.size - b.used >= n) {
        float* p = b.data + b.used;
        b.used += (n + 31) / 32 * 32;
        return p;
      }
    }
    // A fresh block; earlier copies may still be reading the others, so keep them.
    Pinned b;
    b.size = std::max<size_t>(n, size_t{1} << 22);
    void* p = nullptr;
    Record(CudaCall(cudaHostAlloc(&p, b.size * sizeof(float), cudaHostAllocDefault),
                    "cudaHostAlloc", __LINE__));
    if (!status_.ok()) return nullptr;
    b.data = static_cast<float*>(p);
    b.used = (n + 31) / 32 * 32;
    pinned_.push_back(b);
    return b.data;
  }

  static constexpr size_t kCublasWorkspace = size_t{32} << 20;

  int device_;
  bool tf32_;
  void* cublas_workspace_ = nullptr;
  cublasLtHandle_t lt_ = nullptr;
  std::map<LtKey, std::unique_ptr<LtPlan>> lt_plans_;
  std::vector<cudaGraphExec_t> graphs_;  // null: released or dropped
  int graphs_recorded_ = 0;
  cudaStream_t compute_ = nullptr;
  cudaStream_t copy_ = nullptr;
  cudaEvent_t copied_ = nullptr;
  cudaEvent_t computed_ = nullptr;
  cublasHandle_t handle_ = nullptr;
  float* workspace_ = nullptr;
  size_t workspace_floats_ = 0;
  float* row_scratch_ = nullptr;
  size_t row_scratch_floats_ = 0;
  cudaEvent_t marks_[kMarks] = {};
  bool marked_[kMarks] = {};
  std::vector<Pinned> pinned_;
  std::vector<Timing> timings_;
  std::vector<cudaEvent_t> spare_events_;
  std::map<std::string, OpTime> op_times_;
  Status status_;
};

}  // namespace

Result<std::unique_ptr<Backend>> MakeCudaBackend(int device, bool tf32) {
  const std::string why = CudaUnavailableReason();
  if (!why.empty()) return FailedPrecondition(why);
  int count = 0;
  cudaGetDeviceCount(&count);
  if (device < 0 || device >= count) {
    return InvalidArgument("no CUDA device " + std::to_string(device) + " (this machine has " +
                           std::to_string(count) + ")");
  }
  auto backend = std::make_unique<CudaBackend>(device, tf32);
  PARASOL_RETURN_IF_ERROR(backend->Init());
  return std::unique_ptr<Backend>(std::move(backend));
}

}  // namespace parasol
