#include "kernels/gemm_probe.hpp"

#ifdef PARASOL_HAVE_CUDA
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "kernels/cuda_check.hpp"
#endif

namespace parasol {

#ifdef PARASOL_HAVE_CUDA
namespace {

Status LtStatus(cublasStatus_t s, const char* what) {
  if (s == CUBLAS_STATUS_SUCCESS) return Status::Ok();
  return Internal(std::string(what) + " failed: cuBLAS status " + std::to_string(int(s)));
}

// Everything the probe holds, released in any case.
struct Resources {
  cublasHandle_t blas = nullptr;
  cublasLtHandle_t lt = nullptr;
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t la = nullptr, lb = nullptr, lc = nullptr;
  cublasLtMatmulPreference_t pref = nullptr;
  cudaStream_t stream = nullptr;
  cudaEvent_t start = nullptr, end = nullptr;
  void* a = nullptr;
  void* b = nullptr;
  void* c = nullptr;
  void* bias = nullptr;
  void* workspace = nullptr;
  ~Resources() {
    if (stream) cudaStreamSynchronize(stream);
    if (pref) cublasLtMatmulPreferenceDestroy(pref);
    for (auto l : {la, lb, lc}) {
      if (l) cublasLtMatrixLayoutDestroy(l);
    }
    if (desc) cublasLtMatmulDescDestroy(desc);
    if (lt) cublasLtDestroy(lt);
    if (blas) cublasDestroy(blas);
    for (auto e : {start, end}) {
      if (e) cudaEventDestroy(e);
    }
    if (stream) cudaStreamDestroy(stream);
    for (void* p : {a, b, c, bias, workspace}) cudaFree(p);
  }
};

Status Upload(void** dst, size_t floats, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> host(floats);
  for (float& x : host) x = u(rng);
  PARASOL_CUDA_CHECK(cudaMalloc(dst, floats * sizeof(float)));
  PARASOL_CUDA_CHECK(cudaMemcpy(*dst, host.data(), floats * sizeof(float), cudaMemcpyHostToDevice));
  return Status::Ok();
}

}  // namespace

Result<GemmProbe> ProbeCublasGemm(bool trans_a, bool trans_b, int m, int n, int k, int lda,
                                  int ldb, int ldc, bool tf32, GemmEpilogue epilogue, int iters,
                                  double budget_seconds) {
  Resources r;
  constexpr size_t kWorkspace = size_t{32} << 20;
  PARASOL_RETURN_IF_ERROR(Upload(&r.a, size_t(trans_a ? k : m) * lda, 1));
  PARASOL_RETURN_IF_ERROR(Upload(&r.b, size_t(trans_b ? n : k) * ldb, 2));
  PARASOL_RETURN_IF_ERROR(Upload(&r.bias, size_t(n), 3));
  PARASOL_CUDA_CHECK(cudaMalloc(&r.c, size_t(m) * ldc * sizeof(float)));
  PARASOL_CUDA_CHECK(cudaMalloc(&r.workspace, kWorkspace));
  PARASOL_CUDA_CHECK(cudaStreamCreateWithFlags(&r.stream, cudaStreamNonBlocking));
  PARASOL_CUDA_CHECK(cudaEventCreate(&r.start));
  PARASOL_CUDA_CHECK(cudaEventCreate(&r.end));
  PARASOL_RETURN_IF_ERROR(LtStatus(cublasLtCreate(&r.lt), "cublasLtCreate"));
  // Row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T: cuBLAS's first operand is
  // our b, its second our a.
  PARASOL_RETURN_IF_ERROR(LtStatus(
      cublasLtMatmulDescCreate(&r.desc, tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F,
                               CUDA_R_32F),
      "cublasLtMatmulDescCreate"));
  const cublasOperation_t op_first = trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t op_second = trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  PARASOL_RETURN_IF_ERROR(LtStatus(
      cublasLtMatmulDescSetAttribute(r.desc, CUBLASLT_MATMUL_DESC_TRANSA, &op_first,
                                     sizeof op_first),
      "TRANSA"));
  PARASOL_RETURN_IF_ERROR(LtStatus(
      cublasLtMatmulDescSetAttribute(r.desc, CUBLASLT_MATMUL_DESC_TRANSB, &op_second,
                                     sizeof op_second),
      "TRANSB"));
  if (epilogue != GemmEpilogue::kNone) {
    const cublasLtEpilogue_t e =
        epilogue == GemmEpilogue::kBias ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_RELU_BIAS;
    PARASOL_RETURN_IF_ERROR(LtStatus(
        cublasLtMatmulDescSetAttribute(r.desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &e, sizeof e),
        "EPILOGUE"));
    PARASOL_RETURN_IF_ERROR(LtStatus(
        cublasLtMatmulDescSetAttribute(r.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &r.bias,
                                       sizeof r.bias),
        "BIAS_POINTER"));
  }
  // Stored shapes (column-major rows x cols, leading dimension = rows).
  const int first_rows = trans_b ? k : n, first_cols = trans_b ? n : k;
  const int second_rows = trans_a ? m : k, second_cols = trans_a ? k : m;
  PARASOL_RETURN_IF_ERROR(LtStatus(
      cublasLtMatrixLayoutCreate(&r.la, CUDA_R_32F, first_rows, first_cols, ldb), "layout"));
  PARASOL_RETURN_IF_ERROR(LtStatus(
      cublasLtMatrixLayoutCreate(&r.lb, CUDA_R_32F, second_rows, second_cols, lda), "layout"));
  PARASOL_RETURN_IF_ERROR(
      LtStatus(cublasLtMatrixLayoutCreate(&r.lc, CUDA_R_32F, n, m, ldc), "layout"));
  PARASOL_RETURN_IF_ERROR(
      LtStatus(cublasLtMatmulPreferenceCreate(&r.pref), "cublasLtMatmulPreferenceCreate"));
  PARASOL_RETURN_IF_ERROR(LtStatus(
      cublasLtMatmulPreferenceSetAttribute(r.pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                           &kWorkspace, sizeof kWorkspace),
      "workspace preference"));
  // The backend's own restrictions: no reduction in place (its result would change from run
  // to run), the same workspace.
  const uint32_t allowed_schemes = CUBLASLT_REDUCTION_SCHEME_NONE |
                                   CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE |
                                   CUBLASLT_REDUCTION_SCHEME_OUTPUT_TYPE;
  PARASOL_RETURN_IF_ERROR(LtStatus(
      cublasLtMatmulPreferenceSetAttribute(r.pref, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK,
                                           &allowed_schemes, sizeof allowed_schemes),
      "reduction scheme preference"));
  const float alpha = 1.0f, beta = 0.0f;
  GemmProbe probe;
  // One sample: `back` products back to back between two events (the device never idle waiting
  // for the next launch), per product.
  auto sample = [&](auto&& run, int back, double* seconds) -> Status {
    PARASOL_CUDA_CHECK(cudaEventRecord(r.start, r.stream));
    for (int b = 0; b < back; ++b) run();
    PARASOL_CUDA_CHECK(cudaEventRecord(r.end, r.stream));
    PARASOL_CUDA_CHECK(cudaEventSynchronize(r.end));
    float ms = 0;
    PARASOL_CUDA_CHECK(cudaEventElapsedTime(&ms, r.start, r.end));
    *seconds = ms / 1e3 / back;
    return Status::Ok();
  };
  // The full measure: the median of `iters` samples of 20 products, after two warm-up products.
  auto measure = [&](auto&& run, double* seconds) -> Status {
    for (int w = 0; w < 2; ++w) run();
    std::vector<double> times(std::max(iters, 1));
    for (double& t : times) PARASOL_RETURN_IF_ERROR(sample(run, 20, &t));
    std::sort(times.begin(), times.end());
    *seconds = times[times.size() / 2];
    return Status::Ok();
  };
  auto lt_run = [&](const cublasLtMatmulAlgo_t& algo) {
    return [&r, &algo, &alpha, &beta] {
      return cublasLtMatmul(r.lt, r.desc, &alpha, r.b, r.la, r.a, r.lb, &beta, r.c, r.lc, r.c,
                            r.lc, &algo, r.workspace, kWorkspace,
                            r.stream) == CUBLAS_STATUS_SUCCESS;
    };
  };
  // Every configuration cuBLASLt accepts for the shape (cublasLtMatmulAlgoCheck): each algorithm
  // id, and for each its tiles, stages, split-K counts with each allowed reduction scheme, CTA
  // swizzling and custom options. Cluster and inner shapes stay cuBLASLt's own choice (no
  // capability lists them).
  const cublasComputeType_t compute = tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
  std::vector<int> ids(256);
  int id_count = 0;
  PARASOL_RETURN_IF_ERROR(LtStatus(
      cublasLtMatmulAlgoGetIds(r.lt, compute, CUDA_R_32F, CUDA_R_32F, CUDA_R_32F, CUDA_R_32F,
                               CUDA_R_32F, int(ids.size()), ids.data(), &id_count),
      "cublasLtMatmulAlgoGetIds"));
  ids.resize(size_t(std::max(id_count, 0)));
  // Each accepted configuration, and its screening time by index into `configs`. The search
  // (checks and screening) stops at the time budget; what it did not reach is counted.
  std::vector<cublasLtMatmulAlgo_t> configs;
  std::vector<std::pair<double, size_t>> screened;
  const auto deadline = std::chrono::steady_clock::now() +
                        std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                            std::chrono::duration<double>(budget_seconds));
  auto out_of_time = [&] { return std::chrono::steady_clock::now() > deadline; };
  auto cap_list = [](const cublasLtMatmulAlgo_t& algo, cublasLtMatmulAlgoCapAttributes_t attr,
                     uint32_t undefined) {
    size_t bytes = 0;
    std::vector<uint32_t> v;
    if (cublasLtMatmulAlgoCapGetAttribute(&algo, attr, nullptr, 0, &bytes) ==
            CUBLAS_STATUS_SUCCESS &&
        bytes >= sizeof(uint32_t)) {
      v.resize(bytes / sizeof(uint32_t));
      if (cublasLtMatmulAlgoCapGetAttribute(&algo, attr, v.data(), v.size() * sizeof(uint32_t),
                                            &bytes) != CUBLAS_STATUS_SUCCESS) {
        v.clear();
      }
    }
    if (v.empty()) v.push_back(undefined);
    return v;
  };
  const uint32_t wanted_epilogue =
      epilogue == GemmEpilogue::kNone  ? uint32_t(CUBLASLT_EPILOGUE_DEFAULT)
      : epilogue == GemmEpilogue::kBias ? uint32_t(CUBLASLT_EPILOGUE_BIAS)
                                        : uint32_t(CUBLASLT_EPILOGUE_RELU_BIAS);
  for (int id : ids) {
    cublasLtMatmulAlgo_t algo;
    if (cublasLtMatmulAlgoInit(r.lt, compute, CUDA_R_32F, CUDA_R_32F, CUDA_R_32F, CUDA_R_32F,
                               CUDA_R_32F, id, &algo) != CUBLAS_STATUS_SUCCESS) {
      continue;
    }
    uint32_t epilogues = 0;
    size_t written = 0;
    if (cublasLtMatmulAlgoCapGetAttribute(&algo, CUBLASLT_ALGO_CAP_EPILOGUE_MASK, &epilogues,
                                          sizeof epilogues, &written) != CUBLAS_STATUS_SUCCESS ||
        (epilogues & wanted_epilogue) != wanted_epilogue) {
      continue;
    }
    int32_t splitk_support = 0, custom_max = 0;
    uint32_t schemes = 0, swizzle_support = 0;
    cublasLtMatmulAlgoCapGetAttribute(&algo, CUBLASLT_ALGO_CAP_SPLITK_SUPPORT, &splitk_support,
                                      sizeof splitk_support, &written);
    cublasLtMatmulAlgoCapGetAttribute(&algo, CUBLASLT_ALGO_CAP_REDUCTION_SCHEME_MASK, &schemes,
                                      sizeof schemes, &written);
    cublasLtMatmulAlgoCapGetAttribute(&algo, CUBLASLT_ALGO_CAP_CTA_SWIZZLING_SUPPORT,
                                      &swizzle_support, sizeof swizzle_support, &written);
    cublasLtMatmulAlgoCapGetAttribute(&algo, CUBLASLT_ALGO_CAP_CUSTOM_OPTION_MAX, &custom_max,
                                      sizeof custom_max, &written);
    const std::vector<uint32_t> tiles =
        cap_list(algo, CUBLASLT_ALGO_CAP_TILE_IDS, CUBLASLT_MATMUL_TILE_UNDEFINED);
    const std::vector<uint32_t> stages =
        cap_list(algo, CUBLASLT_ALGO_CAP_STAGES_IDS, CUBLASLT_MATMUL_STAGES_UNDEFINED);
    std::vector<int32_t> splits = {1};
    if (splitk_support) splits.insert(splits.end(), {2, 3, 4, 5, 6, 8, 12, 16, 32});
    // The split-K variants of a tile and stage count that runs unsplit (one that does not
    // cannot run split either).
    for (uint32_t tile : tiles) {
      for (uint32_t stage : stages) {
        bool unsplit_ok = false;
        for (int32_t split : splits) {
          if (split > 1 && !unsplit_ok) break;
          for (uint32_t scheme : {uint32_t(CUBLASLT_REDUCTION_SCHEME_NONE),
                                  uint32_t(CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE),
                                  uint32_t(CUBLASLT_REDUCTION_SCHEME_OUTPUT_TYPE)}) {
            // One split needs no reduction; more need one the algorithm has and we allow.
            if ((split == 1) != (scheme == CUBLASLT_REDUCTION_SCHEME_NONE)) continue;
            if (split > 1 && (schemes & scheme) != scheme) continue;
            for (uint32_t swizzle = 0; swizzle <= (swizzle_support ? 1u : 0u); ++swizzle) {
              for (uint32_t custom = 0; custom <= uint32_t(std::max(custom_max, 0)); ++custom) {
                if (out_of_time()) {
                  probe.cut_short = true;
                  continue;
                }
                cublasLtMatmulAlgo_t c = algo;
                cublasLtMatmulAlgoConfigSetAttribute(&c, CUBLASLT_ALGO_CONFIG_TILE_ID, &tile,
                                                     sizeof tile);
                cublasLtMatmulAlgoConfigSetAttribute(&c, CUBLASLT_ALGO_CONFIG_STAGES_ID, &stage,
                                                     sizeof stage);
                cublasLtMatmulAlgoConfigSetAttribute(&c, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &split,
                                                     sizeof split);
                cublasLtMatmulAlgoConfigSetAttribute(&c, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME,
                                                     &scheme, sizeof scheme);
                cublasLtMatmulAlgoConfigSetAttribute(&c, CUBLASLT_ALGO_CONFIG_CTA_SWIZZLING,
                                                     &swizzle, sizeof swizzle);
                cublasLtMatmulAlgoConfigSetAttribute(&c, CUBLASLT_ALGO_CONFIG_CUSTOM_OPTION,
                                                     &custom, sizeof custom);
                cublasLtMatmulHeuristicResult_t check = {};
                ++probe.configurations_checked;
                if (cublasLtMatmulAlgoCheck(r.lt, r.desc, r.la, r.lb, r.lc, r.lc, &c, &check) !=
                        CUBLAS_STATUS_SUCCESS ||
                    check.state != CUBLAS_STATUS_SUCCESS || check.workspaceSize > kWorkspace) {
                  continue;
                }
                if (split == 1) unsplit_ok = true;
                // Each accepted configuration is screened at once: one sample of three
                // products.
                auto run = lt_run(c);
                if (!run()) continue;  // refuses the operands after all
                double t = 0;
                PARASOL_RETURN_IF_ERROR(sample(run, 3, &t));
                screened.push_back({t, configs.size()});
                configs.push_back(c);
              }
            }
          }
        }
      }
    }
  }
  // cuBLASLt's heuristic picks too (under the same restrictions): the backend takes its first.
  cublasLtMatmulHeuristicResult_t results[16] = {};
  int returned = 0;
  PARASOL_RETURN_IF_ERROR(LtStatus(
      cublasLtMatmulAlgoGetHeuristic(r.lt, r.desc, r.la, r.lb, r.lc, r.lc, r.pref, 16, results,
                                     &returned),
      "cublasLtMatmulAlgoGetHeuristic"));
  // The heuristic's first pick, the backend's own configuration, is always measured in full.
  std::optional<size_t> first_pick;
  for (int i = 0; i < returned; ++i) {
    if (results[i].state != CUBLAS_STATUS_SUCCESS) continue;
    auto run = lt_run(results[i].algo);
    if (!run()) continue;
    if (!first_pick) first_pick = configs.size();
    double t = 0;
    PARASOL_RETURN_IF_ERROR(sample(run, 3, &t));
    screened.push_back({t, configs.size()});
    configs.push_back(results[i].algo);
  }
  probe.algorithms = int(screened.size());
  constexpr size_t kFinalists = 8;
  std::sort(screened.begin(), screened.end());
  if (screened.size() > kFinalists) screened.resize(kFinalists);
  if (first_pick && std::none_of(screened.begin(), screened.end(),
                                 [&](const auto& p) { return p.second == *first_pick; })) {
    screened.push_back({0.0, *first_pick});
  }
  bool any = false;
  for (const auto& [t, i] : screened) {
    double seconds = 0;
    PARASOL_RETURN_IF_ERROR(measure(lt_run(configs[i]), &seconds));
    if (!any || seconds < probe.best_seconds) probe.best_seconds = seconds;
    any = true;
  }
  if (epilogue == GemmEpilogue::kNone) {  // the classic interface's own choice
    PARASOL_RETURN_IF_ERROR(LtStatus(cublasCreate(&r.blas), "cublasCreate"));
    PARASOL_RETURN_IF_ERROR(LtStatus(cublasSetStream(r.blas, r.stream), "cublasSetStream"));
    PARASOL_RETURN_IF_ERROR(LtStatus(
        cublasSetMathMode(r.blas, tf32 ? CUBLAS_TF32_TENSOR_OP_MATH : CUBLAS_DEFAULT_MATH),
        "cublasSetMathMode"));
    auto sgemm = [&] {
      return cublasSgemm(r.blas, op_first, op_second, n, m, k, &alpha,
                         static_cast<const float*>(r.b), ldb, static_cast<const float*>(r.a), lda,
                         &beta, static_cast<float*>(r.c), ldc) == CUBLAS_STATUS_SUCCESS;
    };
    if (sgemm()) {
      double seconds = 0;
      PARASOL_RETURN_IF_ERROR(measure(sgemm, &seconds));
      if (!any || seconds < probe.best_seconds) probe.best_seconds = seconds;
      any = true;
      ++probe.algorithms;
    }
  }
  if (probe.algorithms == 0) return Internal("cuBLASLt offered no algorithm for the shape");
  return probe;
}
#else
Result<GemmProbe> ProbeCublasGemm(bool, bool, int, int, int, int, int, int, bool, GemmEpilogue,
                                  int, double) {
  return FailedPrecondition("this build has no CUDA support (nvcc not found)");
}
#endif

}  // namespace parasol
