// The fastest cuBLAS can do one product: every algorithm cuBLASLt's heuristic offers for the
// shape and epilogue (up to 16), and for a plain product cublasSgemm too, each timed with device
// events over products issued back to back on the same random operands; the best one's time is
// the ceiling a layer's product is measured against (benchmarks only).
#pragma once

#include "common/status.hpp"

namespace parasol {

struct GemmProbe {
  double best_seconds = 0;  // per product, the fastest algorithm
  int algorithms = 0;       // how many were timed
};

enum class GemmEpilogue { kNone, kBias, kBiasRelu };

// Row-major c[m x n] = op(a) op(b) (+ bias, ReLU) with leading dimensions lda, ldb, ldc, as
// Backend::GemmStrided and GemmBiasActivation compute it, fp32 or TF32 tensor cores.
Result<GemmProbe> ProbeCublasGemm(bool trans_a, bool trans_b, int m, int n, int k, int lda,
                                  int ldb, int ldc, bool tf32, GemmEpilogue epilogue, int iters);

}  // namespace parasol
