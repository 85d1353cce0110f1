// The fastest cuBLAS can do one product: every algorithm cuBLASLt's heuristic offers for the
// shape (up to 16), each timed with device events on the same random operands; the best one's
// time is the ceiling a layer's product is measured against (benchmarks only).
#pragma once

#include "common/status.hpp"

namespace parasol {

struct GemmProbe {
  double best_seconds = 0;  // per product, the fastest algorithm
  int algorithms = 0;       // how many were timed
};

// Row-major c[m x n] = op(a) op(b) as Backend::Gemm computes it, fp32 or TF32 tensor cores.
Result<GemmProbe> ProbeCublasGemm(bool trans_a, bool trans_b, int m, int n, int k, bool tf32,
                                  int iters);

}  // namespace parasol
