#include "common/initializer.hpp"

#include <cmath>

#include "common/hash.hpp"

namespace parasol {
namespace {

// Uniform in [0, 1) from the top 24 bits of a hash: exactly representable as float.
inline double Unit(uint64_t h) { return static_cast<double>(h >> 40) * (1.0 / 16777216.0); }

// The value of element `index` of the stream identified by `stream`.
inline float InitValue(const InitOptions& init, uint64_t stream, uint64_t index) {
  switch (init.kind) {
    case InitOptions::Kind::kZeros:
      return 0.0f;
    case InitOptions::Kind::kConstant:
      return static_cast<float>(init.value);
    case InitOptions::Kind::kUniform: {
      const double u = Unit(SplitMix64(stream + index));
      return static_cast<float>((2.0 * u - 1.0) * init.scale);
    }
    case InitOptions::Kind::kNormal: {
      // Box-Muller on two independent uniforms; u1 in (0, 1] keeps the log finite.
      const uint64_t h = SplitMix64(stream + 2 * index);
      const double u1 = 1.0 - Unit(h);
      const double u2 = Unit(SplitMix64(stream + 2 * index + 1));
      const double z = std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * M_PI * u2);
      return static_cast<float>(init.mean + init.stddev * z);
    }
  }
  return 0.0f;
}

}  // namespace

void InitSparseRow(const InitOptions& init, uint64_t seed, uint64_t key, std::span<float> row) {
  const uint64_t stream = HashKey(key, seed);
  for (size_t i = 0; i < row.size(); ++i) row[i] = InitValue(init, stream, i);
}

void InitDenseRange(const InitOptions& init, uint64_t seed, uint64_t first, std::span<float> out) {
  const uint64_t stream = Fmix64(seed ^ 0x44454e5345ULL);  // "DENSE"
  for (size_t i = 0; i < out.size(); ++i) out[i] = InitValue(init, stream, first + i);
}

}  // namespace parasol
