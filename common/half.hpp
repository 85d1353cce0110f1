// 16-bit floats for storage and the wire: bfloat16 (bf16: f32's exponent, 7 mantissa bits) and
// IEEE binary16 (f16: 5 exponent bits, 10 mantissa bits). Arithmetic stays in f32; values are
// rounded when stored.
//
// Rounding: to nearest, ties to even (RNE), as IEEE does; or stochastic: up with probability
// equal to the distance from the lower neighbour, so that many small updates to a value add up
// in expectation instead of being rounded away (`bits` is 16 or more random bits per call).
// NaN stays NaN (quiet); values beyond the format's range become infinity (RNE) as IEEE does.
#pragma once

#include <cstdint>
#include <cstring>

#include "common/hash.hpp"

namespace parasol {

inline uint32_t F32Bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  return u;
}

inline float F32FromBits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
}

// --- bf16 ----------------------------------------------------------------------------------

inline float Bf16ToF32(uint16_t h) { return F32FromBits(uint32_t{h} << 16); }

inline uint16_t F32ToBf16(float f) {
  const uint32_t u = F32Bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);  // NaN
  const uint32_t lsb = (u >> 16) & 1u;
  return static_cast<uint16_t>((u + 0x7fffu + lsb) >> 16);  // carries into the exponent: inf
}

// Stochastic: the 16 bits below bf16's mantissa against `bits`' low 16 bits.
inline uint16_t F32ToBf16Stochastic(float f, uint32_t bits) {
  const uint32_t u = F32Bits(f);
  if ((u & 0x7f800000u) == 0x7f800000u) return F32ToBf16(f);  // inf and NaN as they are
  return static_cast<uint16_t>((u + (bits & 0xffffu)) >> 16);
}

// --- f16 -----------------------------------------------------------------------------------

inline float F16ToF32(uint16_t h) {
  const uint32_t sign = uint32_t{h & 0x8000u} << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  const uint32_t mant = h & 0x3ffu;
  if (exp == 0x1f) return F32FromBits(sign | 0x7f800000u | (mant << 13));  // inf, NaN
  if (exp != 0) return F32FromBits(sign | ((exp + 112) << 23) | (mant << 13));
  if (mant == 0) return F32FromBits(sign);  // +-0
  // Subnormal: mant x 2^-24, exact in f32.
  const float v = static_cast<float>(mant) * 5.9604644775390625e-8f;
  return sign ? -v : v;
}

namespace half_detail {

// |f| as f16 bits (no sign), adding `add` (0 .. 2^shift - 1) below the kept bits before
// truncating: RNE passes half the step less one plus the kept lsb, stochastic a random number.
inline uint16_t F16Magnitude(uint32_t abs_bits, bool nearest, uint32_t random) {
  if (abs_bits >= 0x47800000u) {  // >= 65536 (or inf): beyond f16's largest finite 65504
    if (abs_bits > 0x7f800000u) return 0x7e00;  // NaN
    if (abs_bits == 0x7f800000u) return 0x7c00;
    if (nearest && abs_bits >= 0x477ff000u) return 0x7c00;  // rounds to 65536: inf
  }
  uint32_t exp = abs_bits >> 23;
  uint32_t mant = abs_bits & 0x7fffffu;
  uint32_t shift;        // bits of the f32 mantissa (with its implicit 1) dropped
  uint32_t value;        // the f16 magnitude's bits before rounding, scaled by 2^shift
  if (exp >= 113) {      // normal f16: exponent exp - 112
    shift = 13;
    value = ((exp - 112) << 23) | mant;
  } else {
    if (exp < 102) return 0;  // below half the smallest subnormal (2^-25): 0 whatever the rounding
    shift = 13 + (113 - exp);  // 14 .. 24
    value = (mant | 0x800000u);
  }
  const uint32_t step = 1u << shift;
  uint32_t add;
  if (nearest) {
    add = (step >> 1) - 1 + ((value >> shift) & 1u);
  } else {
    add = random & (step - 1);
  }
  uint32_t r = (value + add) >> shift;
  if (r > 0x7c00u) r = 0x7c00u;  // a carry past 65504 (stochastic near the top): inf
  return static_cast<uint16_t>(r);
}

}  // namespace half_detail

inline uint16_t F32ToF16(float f) {
  const uint32_t u = F32Bits(f);
  const uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  return sign | half_detail::F16Magnitude(u & 0x7fffffffu, true, 0);
}

inline uint16_t F32ToF16Stochastic(float f, uint32_t bits) {
  const uint32_t u = F32Bits(f);
  const uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  uint16_t m = half_detail::F16Magnitude(u & 0x7fffffffu, false, bits);
  if ((u & 0x7fffffffu) >= 0x477ff000u && (u & 0x7fffffffu) <= 0x7f800000u) {
    m = half_detail::F16Magnitude(u & 0x7fffffffu, true, 0);  // the top and inf: as RNE
  }
  return sign | m;
}

// A small, fast generator of the random bits (xorshift32).
struct RoundingBits {
  uint32_t state = 0x9e3779b9u;
  uint32_t Next() {
    state ^= state << 13;
    state ^= state >> 17;
    state ^= state << 5;
    return state;
  }
};

// The bits of one element's (or row's) stochastic rounding in one write: a function of the
// table's seed, the write's name and the element alone, so that the same writes round the same
// way on every run, after a restart (whose replays carry the same names), and however the
// work is split between threads.
inline RoundingBits RoundingBitsFor(uint64_t seed, uint64_t write, uint64_t element) {
  RoundingBits bits;
  bits.state = static_cast<uint32_t>(
                   Fmix64(seed ^ Fmix64(write) ^ (element * 0x9E3779B97F4A7C15ull))) |
               1u;
  return bits;
}

}  // namespace parasol
