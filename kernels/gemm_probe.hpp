// The fastest cuBLAS can do one product, found by exhaustive search: every configuration of every
// cuBLASLt algorithm for the shape and epilogue (cublasLtMatmulAlgoGetIds, and for each its
// tiles, stages, split-K counts and reduction schemes, CTA swizzling and custom options, each
// checked with cublasLtMatmulAlgoCheck), the heuristic's picks, and for a plain product
// cublasSgemm too. The restrictions are the backend's: no reduction in place (a result that
// changes from run to run) and its 32 MiB workspace. Every configuration is screened with one
// timed sample; the fastest eight, and the heuristic's first pick (the backend's own), are
// measured in full, with device events over products issued back to back on the same random
// operands. The best time is the ceiling a layer's product is measured against (benchmarks
// only). The search stops at `budget_seconds` (cut_short says so).
#pragma once

#include "common/status.hpp"

namespace parasol {

struct GemmProbe {
  double best_seconds = 0;          // per product, the fastest configuration
  int algorithms = 0;               // how many configurations were timed
  int configurations_checked = 0;   // how many were put to cublasLtMatmulAlgoCheck
  bool cut_short = false;           // the time budget ended the search before its end
};

enum class GemmEpilogue { kNone, kBias, kBiasRelu };

// Row-major c[m x n] = op(a) op(b) (+ bias, ReLU) with leading dimensions lda, ldb, ldc, as
// Backend::GemmStrided and GemmBiasActivation compute it, fp32 or TF32 tensor cores.
Result<GemmProbe> ProbeCublasGemm(bool trans_a, bool trans_b, int m, int n, int k, int lda,
                                  int ldb, int ldc, bool tf32, GemmEpilogue epilogue, int iters,
                                  double budget_seconds = 4.0);

}  // namespace parasol
