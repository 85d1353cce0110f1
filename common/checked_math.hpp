// Overflow-checked arithmetic for sizes, counts, offsets and products computed from received
// bytes (message headers, checkpoint files). An overflow is a BadMessage naming the field, never
// a wrapped value that a later check happens to accept.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "common/status.hpp"

namespace parasol {

// a * b, or BadMessage("`what` overflows: a x b").
inline Result<uint64_t> CheckedMul(uint64_t a, uint64_t b, std::string_view what) {
  uint64_t r;
  if (__builtin_mul_overflow(a, b, &r)) {
    return BadMessage(std::string(what) + " overflows: " + std::to_string(a) + " x " +
                      std::to_string(b));
  }
  return r;
}

// a + b, or BadMessage("`what` overflows: a + b").
inline Result<uint64_t> CheckedAdd(uint64_t a, uint64_t b, std::string_view what) {
  uint64_t r;
  if (__builtin_add_overflow(a, b, &r)) {
    return BadMessage(std::string(what) + " overflows: " + std::to_string(a) + " + " +
                      std::to_string(b));
  }
  return r;
}

// ceil(n / d) for d > 0, without the wrap of (n + d - 1) / d.
constexpr uint64_t CeilDiv(uint64_t n, uint64_t d) { return n == 0 ? 0 : 1 + (n - 1) / d; }

}  // namespace parasol
