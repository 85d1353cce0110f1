#include "common/small_copy.hpp"

#include <gtest/gtest.h>

#include <bit>
#include <cstdint>
#include <cstring>
#include <vector>

namespace parasol {
namespace {

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
        if (i % 3 == 2) u = std::bit_cast<uint32_t>(static_cast<float>(i) + 0.5f);
        std::memcpy(&src[i], &u, sizeof(u));
      }
      CopyFloats(dst.data() + offset, src.data() + offset, n);
      for (size_t i = 0; i < dst.size(); ++i) {
        const bool inside = i >= offset && i < offset + n;
        ASSERT_EQ(std::bit_cast<uint32_t>(dst[i]),
                  std::bit_cast<uint32_t>(inside ? src[i] : kGuard))
            << "n " << n << " offset " << offset << " element " << i;
      }
    }
  }
}

}  // namespace
}  // namespace parasol
