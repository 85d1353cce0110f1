// ZipfSampler: ranks in [1, n] with P(k) roughly proportional to k^-s, by inverting the
// continuous power law. Cheap (no tables), so n may be in the hundreds of millions.
// Thread-safety: const after construction; the caller owns the random engine.
#pragma once

#include <cmath>
#include <cstdint>
#include <random>

namespace parasol {

class ZipfSampler {
 public:
  // REQUIRES: n >= 1, s > 0.
  ZipfSampler(uint64_t n, double s) : n_(n), s_(s) {
    if (std::abs(s_ - 1.0) < 1e-9) s_ = 1.0 + 1e-9;
    top_ = std::pow(static_cast<double>(n_) + 1.0, 1.0 - s_) - 1.0;
  }

  template <typename Rng>
  uint64_t operator()(Rng& rng) const {
    const double u = std::uniform_real_distribution<double>(0.0, 1.0)(rng);
    const double x = std::pow(top_ * u + 1.0, 1.0 / (1.0 - s_));
    const uint64_t k = static_cast<uint64_t>(x);
    return k < 1 ? 1 : (k > n_ ? n_ : k);
  }

 private:
  uint64_t n_;
  double s_;
  double top_;
};

}  // namespace parasol
