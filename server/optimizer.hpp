// Optimizer updates applied by the server to weights it owns.
//
// Gradients arrive as raw little-endian f32 bytes straight from the received frame (which may
// be unaligned), so they are read through std::memcpy. Thread-safety: pure functions over the
// memory they are given; callers guarantee exclusive access to `weights`.
#pragma once

#include <cstddef>
#include <cstring>

#include "common/manifest.hpp"

namespace parasol {

inline float LoadF32(const std::byte* p) {
  float v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}

// weights[i] -= lr * (grad[i] + weight_decay * weights[i]) for i in [0, n).
inline void ApplySgd(const OptimizerOptions& opt, float* weights, const std::byte* grad, size_t n) {
  const float lr = static_cast<float>(opt.lr);
  const float wd = static_cast<float>(opt.weight_decay);
  for (size_t i = 0; i < n; ++i) {
    const float g = LoadF32(grad + i * sizeof(float));
    weights[i] -= lr * (g + wd * weights[i]);
  }
}

inline void ApplyUpdate(const OptimizerOptions& opt, float* weights, const std::byte* grad,
                        size_t n) {
  switch (opt.kind) {
    case OptimizerOptions::Kind::kSgd:
      ApplySgd(opt, weights, grad, n);
      return;
  }
}

}  // namespace parasol
