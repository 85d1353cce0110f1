#include "common/small_copy.hpp"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <vector>

namespace parasol {
namespace {

uint32_t Bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  return u;
}

TEST(SmallCopyTest, CopiesExactlyTheRunBitForBitAndNothingAround) {
  // Every length through three blocks and a tail, from every offset of a 32-byte line: the
  // n floats (NaN payloads and -0 among them) arrive with their bits; the guards on both
  // sides keep theirs.
  constexpr float kGuard = 12345.0f;
  for (size_t n = 0; n <= 40; ++n) {
    for (size_t offset = 0; offset < 8; ++offset) {
      std::vector<float> src(n + 16), dst(n + 16, kGuard);
      for (size_t i = 0; i < src.size(); ++i) {
        uint32_t u = 0x7fc00000u + static_cast<uint32_t>(i * 7919 + n);  // quiet NaNs
        if (i % 3 == 1) u = 0x80000000u;                                  // -0
        if (i % 3 == 2) u = Bits(static_cast<float>(i) + 0.5f);
        std::memcpy(&src[i], &u, sizeof(u));
      }
      CopyFloats(dst.data() + offset, src.data() + offset, n);
      for (size_t i = 0; i < dst.size(); ++i) {
        const bool inside = i >= offset && i < offset + n;
        ASSERT_EQ(Bits(dst[i]), inside ? Bits(src[i]) : Bits(kGuard))
            << "n " << n << " offset " << offset << " element " << i;
      }
    }
  }
}

}  // namespace
}  // namespace parasol
