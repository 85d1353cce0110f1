// The CUDA backend: cuBLAS for matrix products, the kernels in kernels/ for the rest.
//
// Two streams: compute, and copy. Host data bound for the device is staged in pinned memory and
// copied on the copy stream; the compute stream waits on an event for it, so the transfer of the
// next buffer overlaps the kernels of the previous one. Every CUDA and cuBLAS status is checked;
// the first error (file, line, expression) is kept and returned by Sync(), and every call after
// it is skipped.
#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <vector>

#include "kernels/cuda_check.hpp"
#include "kernels/elementwise.hpp"
#include "kernels/embedding_pool.hpp"
#include "kernels/interaction.hpp"
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
    if (handle_) cublasDestroy(handle_);
    if (copied_) cudaEventDestroy(copied_);
    if (compute_) cudaStreamDestroy(compute_);
    if (copy_) cudaStreamDestroy(copy_);
    for (auto& b : pinned_) cudaFreeHost(b.data);
    if (loss_) cudaFree(loss_);
  }

  Status Init() {
    PARASOL_CUDA_CHECK(cudaSetDevice(device_));
    PARASOL_CUDA_CHECK(cudaStreamCreateWithFlags(&compute_, cudaStreamNonBlocking));
    PARASOL_CUDA_CHECK(cudaStreamCreateWithFlags(&copy_, cudaStreamNonBlocking));
    PARASOL_CUDA_CHECK(cudaEventCreateWithFlags(&copied_, cudaEventDisableTiming));
    PARASOL_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&loss_), sizeof(double)));
    if (cublasStatus_t s = cublasCreate(&handle_); s != CUBLAS_STATUS_SUCCESS) {
      return CublasStatus(s, "cublasCreate(&handle_)", __FILE__, __LINE__);
    }
    if (cublasStatus_t s = cublasSetStream(handle_, compute_); s != CUBLAS_STATUS_SUCCESS) {
      return CublasStatus(s, "cublasSetStream(handle_, compute_)", __FILE__, __LINE__);
    }
    const cublasMath_t math = tf32_ ? CUBLAS_TF32_TENSOR_OP_MATH : CUBLAS_PEDANTIC_MATH;
    if (cublasStatus_t s = cublasSetMathMode(handle_, math); s != CUBLAS_STATUS_SUCCESS) {
      return CublasStatus(s, "cublasSetMathMode(handle_, math)", __FILE__, __LINE__);
    }
    return Status::Ok();
  }

  const char* name() const override { return "cuda"; }

  DeviceBuffer Allocate(size_t floats) override {
    void* p = nullptr;
    Record(CudaCall(cudaMalloc(&p, std::max<size_t>(1, floats) * sizeof(float)),
                    "cudaMalloc", __LINE__));
    Record(CudaCall(cudaMemsetAsync(p, 0, std::max<size_t>(1, floats) * sizeof(float), compute_),
                    "cudaMemsetAsync", __LINE__));
    return DeviceBuffer(static_cast<float*>(p), floats, [](float* q) { cudaFree(q); });
  }

  void ToDevice(float* dst, const float* host, size_t n) override {
    if (n == 0 || !status_.ok()) return;
    // Stage in pinned memory, copy on the copy stream, and make compute wait for it.
    float* staged = Stage(n);
    if (!staged) return;
    std::memcpy(staged, host, n * sizeof(float));
    Record(CudaCall(cudaMemcpyAsync(dst, staged, n * sizeof(float), cudaMemcpyHostToDevice, copy_),
                    "cudaMemcpyAsync(H2D)", __LINE__));
    Record(CudaCall(cudaEventRecord(copied_, copy_), "cudaEventRecord", __LINE__));
    Record(CudaCall(cudaStreamWaitEvent(compute_, copied_, 0), "cudaStreamWaitEvent", __LINE__));
  }

  void ToHost(float* host, const float* src, size_t n) override {
    if (n == 0 || !status_.ok()) return;
    float* staged = Stage(n);
    if (!staged) return;
    Record(CudaCall(cudaEventRecord(copied_, compute_), "cudaEventRecord", __LINE__));
    Record(CudaCall(cudaStreamWaitEvent(copy_, copied_, 0), "cudaStreamWaitEvent", __LINE__));
    Record(CudaCall(cudaMemcpyAsync(staged, src, n * sizeof(float), cudaMemcpyDeviceToHost, copy_),
                    "cudaMemcpyAsync(D2H)", __LINE__));
    Record(CudaCall(cudaStreamSynchronize(copy_), "cudaStreamSynchronize(copy)", __LINE__));
    if (status_.ok()) std::memcpy(host, staged, n * sizeof(float));
  }

  void Fill(float* dst, float value, size_t n) override { Run(FillCuda(dst, value, n, compute_)); }

  void Gemm(bool trans_a, bool trans_b, int m, int n, int k, float alpha, const float* a,
            const float* b, float beta, float* c) override {
    if (!status_.ok()) return;
    // Row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T.
    const cublasStatus_t s = cublasSgemm(
        handle_, trans_b ? CUBLAS_OP_T : CUBLAS_OP_N, trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, n, m,
        k, &alpha, b, trans_b ? k : n, a, trans_a ? m : k, &beta, c, n);
    if (s != CUBLAS_STATUS_SUCCESS) Run(CublasStatus(s, "cublasSgemm", __FILE__, __LINE__));
  }

  void AddBias(float* y, const float* bias, int rows, int cols) override {
    Run(AddBiasCuda(y, bias, rows, cols, compute_));
  }
  void BiasGrad(float* db, const float* dy, int rows, int cols) override {
    Run(BiasGradCuda(db, dy, rows, cols, compute_));
  }
  void Relu(float* y, const float* x, size_t n) override { Run(ReluCuda(y, x, n, compute_)); }
  void ReluBackward(float* dx, const float* dy, const float* y, size_t n) override {
    Run(ReluBackwardCuda(dx, dy, y, n, compute_));
  }
  void EmbeddingPool(float* out, const float* rows, int dim, const uint32_t* indices,
                     const float* values, const uint32_t* offsets, int batch) override {
    Run(EmbeddingPoolCuda(out, rows, dim, indices, values, offsets, batch, compute_));
  }
  void EmbeddingPoolBackward(float* drows, const float* dout, int dim, const uint32_t* indices,
                             const float* values, const uint32_t* offsets, int batch) override {
    Run(EmbeddingPoolBackwardCuda(drows, dout, dim, indices, values, offsets, batch, compute_));
  }
  void Interaction(float* out, const float* z, const float* e, int batch, int fields,
                   int dim) override {
    Run(InteractionCuda(out, z, e, batch, fields, dim, compute_));
  }
  void InteractionBackward(float* dz, float* de, const float* dout, const float* z,
                           const float* e, int batch, int fields, int dim) override {
    Run(InteractionBackwardCuda(dz, de, dout, z, e, batch, fields, dim, compute_));
  }

  double SigmoidBce(float* probs, float* dlogits, const float* logits, const float* labels,
                    int n) override {
    if (!status_.ok() || n == 0) return 0.0;
    Record(CudaCall(cudaMemsetAsync(loss_, 0, sizeof(double), compute_), "cudaMemsetAsync",
                    __LINE__));
    Run(SigmoidBceCuda(probs, dlogits, loss_, logits, labels, n, compute_));
    double sum = 0;
    Record(CudaCall(cudaMemcpyAsync(&sum, loss_, sizeof(double), cudaMemcpyDeviceToHost, compute_),
                    "cudaMemcpyAsync(loss)", __LINE__));
    Record(CudaCall(cudaStreamSynchronize(compute_), "cudaStreamSynchronize", __LINE__));
    return sum / n;
  }

  Status Sync() override {
    Record(CudaCall(cudaStreamSynchronize(copy_), "cudaStreamSynchronize(copy)", __LINE__));
    Record(CudaCall(cudaStreamSynchronize(compute_), "cudaStreamSynchronize(compute)", __LINE__));
    for (auto& b : pinned_) b.used = 0;  // every staged copy has landed
    Status st = status_;
    return st;
  }

 private:
  struct Pinned {
    float* data = nullptr;
    size_t size = 0;  // floats
    size_t used = 0;
  };

  Status CudaCall(cudaError_t err, const char* expr, int line) {
    if (err == cudaSuccess) return Status::Ok();
    return CudaStatus(static_cast<int>(err), expr, __FILE__, line);
  }
  void Record(const Status& st) {
    if (status_.ok() && !st.ok()) status_ = st;
  }
  void Run(const Status& st) { Record(st); }

  // Pinned staging space for n floats, valid until the next Sync(). Allocates only while the
  // blocks are warming up to a step's needs.
  float* Stage(size_t n) {
    for (auto& b : pinned_) {
      if (b.size - b.used >= n) {
        float* p = b.data + b.used;
        b.used += (n + 31) / 32 * 32;
        return p;
      }
    }
    // A fresh block; earlier copies may still be reading the others, so keep them.
    Record(CudaCall(cudaStreamSynchronize(copy_), "cudaStreamSynchronize(copy)", __LINE__));
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

  int device_;
  bool tf32_;
  cudaStream_t compute_ = nullptr;
  cudaStream_t copy_ = nullptr;
  cudaEvent_t copied_ = nullptr;
  cublasHandle_t handle_ = nullptr;
  double* loss_ = nullptr;
  std::vector<Pinned> pinned_;
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
