#include "common/half.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>

namespace parasol {
namespace {

uint16_t Bits(_Float16 h) {
  uint16_t u;
  std::memcpy(&u, &h, sizeof(u));
  return u;
}

// Every f16 value converts to f32 and back unchanged; f32 -> f16 equals the compiler's own
// conversion (IEEE, round to nearest even) on every exponent, subnormals, ties and overflow.
TEST(HalfTest, F16MatchesTheCompilersConversion) {
  for (uint32_t h = 0; h < 0x10000; ++h) {
    _Float16 x;
    const uint16_t hb = static_cast<uint16_t>(h);
    std::memcpy(&x, &hb, sizeof(hb));
    const float f = F16ToF32(hb);
    if (std::isnan(static_cast<float>(x))) {
      EXPECT_TRUE(std::isnan(f));
      continue;
    }
    ASSERT_EQ(F32Bits(f), F32Bits(static_cast<float>(x))) << h;
    ASSERT_EQ(F32ToF16(f), hb) << h;
  }
  std::mt19937 rng(1);
  std::uniform_int_distribution<uint32_t> any;
  for (int i = 0; i < 2000000; ++i) {
    const float f = F32FromBits(any(rng));
    if (std::isnan(f)) continue;
    ASSERT_EQ(F32ToF16(f), Bits(static_cast<_Float16>(f))) << f;
  }
  // Ties and the edges, by hand.
  EXPECT_EQ(F32ToF16(65504.0f), 0x7bff);
  EXPECT_EQ(F32ToF16(65519.99f), 0x7bff);
  EXPECT_EQ(F32ToF16(65520.0f), 0x7c00);  // the tie rounds to even: infinity
  EXPECT_EQ(F32ToF16(std::ldexp(1.0f, -24)), 0x0001);
  EXPECT_EQ(F32ToF16(std::ldexp(1.0f, -25)), 0x0000);  // tie with 0: even
  EXPECT_EQ(F32ToF16(std::ldexp(1.5f, -25)), 0x0001);
  EXPECT_EQ(F32ToF16(-0.0f), 0x8000);
  EXPECT_EQ(F32ToF16(std::numeric_limits<float>::quiet_NaN()) & 0x7c00, 0x7c00);
}

// bf16: to nearest, ties to even, checked against the two neighbours computed by hand.
TEST(HalfTest, Bf16RoundsToNearestEven) {
  std::mt19937 rng(2);
  std::uniform_int_distribution<uint32_t> any;
  for (int i = 0; i < 2000000; ++i) {
    const uint32_t u = any(rng);
    const float f = F32FromBits(u);
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(Bf16ToF32(F32ToBf16(f))));
      continue;
    }
    const uint32_t lo = u & 0xffff0000u, rest = u & 0xffffu;
    uint32_t want = lo;
    if (rest > 0x8000u || (rest == 0x8000u && (lo & 0x10000u))) want = lo + 0x10000u;
    ASSERT_EQ(uint32_t{F32ToBf16(f)} << 16, want) << std::hex << u;
  }
  EXPECT_EQ(Bf16ToF32(F32ToBf16(1.0f)), 1.0f);
  EXPECT_EQ(F32ToBf16(1.0f + std::ldexp(1.0f, -8)), F32ToBf16(1.0f));  // tie: even
}

// Stochastic rounding lands on one of the two neighbours, up with probability equal to the
// distance from the lower one: the mean of many roundings is the value.
TEST(HalfTest, StochasticRoundingIsUnbiased) {
  RoundingBits bits;
  for (float v : {1.0f + 1.0f / 1024.0f, 0.1f, -3.3333f, 1e-6f, 1234.567f}) {
    const float bf_lo = Bf16ToF32(static_cast<uint16_t>(F32Bits(std::fabs(v)) >> 16));
    double sum_bf = 0, sum_f16 = 0;
    const int n = 200000;
    for (int i = 0; i < n; ++i) {
      const float b = Bf16ToF32(F32ToBf16Stochastic(v, bits.Next()));
      const float h = F16ToF32(F32ToF16Stochastic(v, bits.Next()));
      ASSERT_TRUE(std::fabs(b) == bf_lo ||
                  std::fabs(b) == Bf16ToF32(static_cast<uint16_t>((F32Bits(bf_lo) >> 16) + 1)))
          << v << " -> " << b;
      sum_bf += b;
      sum_f16 += h;
    }
    EXPECT_NEAR(sum_bf / n, v, std::fabs(v) * 2e-4) << v;
    EXPECT_NEAR(sum_f16 / n, v, std::max(std::fabs(v) * 2e-4, 1e-9)) << v;
  }
}

}  // namespace
}  // namespace parasol
