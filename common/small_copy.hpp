// CopyFloats: copies a short run of floats (a sparse row: 8 to a few hundred) without a call.
//
// A copy of a row of runtime length compiles to a call of the C library's memmove, whose
// entry and size dispatch cost more than moving 64 bytes. A shard copies a few such rows per
// key a step (a pull's reply, the optimizer's backup of the row it updates), so the calls show
// in profiles. Here: blocks of 8 floats with fixed-size copies (moves of vector registers),
// the last block overlapping the one before it; under 8 floats, 4, 2 and 1.
// The ranges must not overlap.
#pragma once

#include <cstddef>
#include <cstring>

namespace parasol {

inline void CopyFloats(float* dst, const float* src, size_t n) {
  if (n >= 8) {
    size_t i = 0;
    for (; i + 8 <= n; i += 8) std::memcpy(dst + i, src + i, 8 * sizeof(float));
    if (i < n) std::memcpy(dst + n - 8, src + n - 8, 8 * sizeof(float));
    return;
  }
  size_t i = 0;
  if (n & 4) {
    std::memcpy(dst, src, 4 * sizeof(float));
    i = 4;
  }
  if (n & 2) {
    std::memcpy(dst + i, src + i, 2 * sizeof(float));
    i += 2;
  }
  if (n & 1) dst[i] = src[i];
}

}  // namespace parasol
