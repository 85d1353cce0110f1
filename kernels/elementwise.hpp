// Elementwise and row-wise device ops of the layers: ReLU, bias, fill. Each launcher runs on
// `stream` (a cudaStream_t) and returns the launch's status; the CPU backend holds the
// reference implementations they are tested against.
#pragma once

#include <cstddef>

#include "common/status.hpp"

namespace parasol {

Status ReluCuda(float* y, const float* x, size_t n, void* stream);
// dx = dy where y > 0, else 0.
Status ReluBackwardCuda(float* dx, const float* dy, const float* y, size_t n, void* stream);
// y[r, :] += bias for every row r of a rows x cols matrix.
Status AddBiasCuda(float* y, const float* bias, int rows, int cols, void* stream);
// y[r, :] += bias, then ReLU when `relu`, in one pass.
Status BiasActivationCuda(float* y, const float* bias, int rows, int cols, bool relu,
                          void* stream);

// Column sums use a grid-wide two-pass reduction (partial sums of 64-row chunks, then their sum
// in chunk order: deterministic) with a workspace of this many floats.
size_t ColumnSumWorkspaceFloats(int rows, int cols);
// db[c] = sum over rows of dy[r, c].
Status BiasGradCuda(float* db, const float* dy, int rows, int cols, float* workspace,
                    void* stream);
// With relu: dpre = dy where y > 0, else 0, and db = column sums of dpre, in one pass over dy;
// without: db = column sums of dy (dpre untouched).
Status BiasActivationBackwardCuda(float* dpre, float* db, const float* dy, const float* y,
                                  int rows, int cols, bool relu, float* workspace, void* stream);
Status FillCuda(float* dst, float value, size_t n, void* stream);

}  // namespace parasol
