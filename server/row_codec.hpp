// RowCodec: how a sparse row is stored when its values or optimizer state are 16-bit
// (tables[].dtype, tables[].state_dtype: bf16 or f16).
//
// Everything outside the table sees a row as f32 words (its "view"):
//   [last update clock: uint32][values: dim floats][optimizer state: state floats]
// A stored row keeps the clock word as it is, the values in the table's dtype and the state in
// its state dtype (each array padded to whole 32-bit words); raw 32-bit words at the end of the
// state (adam's step count) stay as they are. A 16-bit table that never evicts (no ttl_clocks,
// no max_rows: nothing reads the clock) stores no clock word; its view's clock reads 0. Encode() rounds to nearest even, or
// stochastically with `bits` (tables[].rounding: stochastic). For f32 values and state the view
// is the stored row itself (identity()). Without `bits`, Encode() rounds to nearest even
// whatever the table says (initial values, restored rows: the same on every run).
#pragma once

#include <cstdint>
#include <cstring>

#include "common/half.hpp"
#include "common/manifest.hpp"

namespace parasol {

// `v` rounded to nearest even in dtype `t`, as stored, and widened back (f32: `v` itself).
inline float RoundedTo(DType t, float v) {
  if (t == DType::kBf16) return Bf16ToF32(F32ToBf16(v));
  if (t == DType::kF16) return F16ToF32(F32ToF16(v));
  return v;
}

class RowCodec {
 public:
  // `raw_tail`: state words at the end that are not floats (adam: 1). `keep_clock`: store the
  // clock word (always, for f32 values and state).
  RowCodec(uint32_t dim, uint32_t state_floats, uint32_t raw_tail, DType values, DType state,
           bool stochastic, bool keep_clock = true)
      : dim_(dim),
        state_(state_floats - raw_tail),
        raw_(raw_tail),
        values_(values),
        state_type_(state),
        stochastic_(stochastic),
        clock_(keep_clock || (values == DType::kF32 && state == DType::kF32) ? 1 : 0) {}

  bool identity() const { return values_ == DType::kF32 && state_type_ == DType::kF32; }
  // Whether a stored row starts with its clock word.
  bool stores_clock() const { return clock_ == 1; }
  // f32 words of the view: clock, values, state.
  uint32_t view_floats() const { return 1 + dim_ + state_ + raw_; }
  // 32-bit words of a stored row.
  uint32_t stored_words() const {
    return clock_ + Words(values_, dim_) + Words(state_type_, state_) + raw_;
  }

  void Decode(const float* stored, float* view) const {
    if (identity()) {
      std::memcpy(view, stored, sizeof(float) * view_floats());
      return;
    }
    if (clock_) {
      view[0] = stored[0];
    } else {
      const uint32_t zero = 0;
      std::memcpy(view, &zero, sizeof(zero));
    }
    const float* p = stored + clock_;
    DecodeArray(values_, p, view + 1, dim_);
    p += Words(values_, dim_);
    DecodeArray(state_type_, p, view + 1 + dim_, state_);
    p += Words(state_type_, state_);
    std::memcpy(view + 1 + dim_ + state_, p, sizeof(float) * raw_);
  }

  void Encode(const float* view, float* stored, RoundingBits* bits) const {
    if (identity()) {
      std::memcpy(stored, view, sizeof(float) * view_floats());
      return;
    }
    if (clock_) stored[0] = view[0];
    float* p = stored + clock_;
    EncodeArray(values_, view + 1, p, dim_, bits);
    p += Words(values_, dim_);
    EncodeArray(state_type_, view + 1 + dim_, p, state_, bits);
    p += Words(state_type_, state_);
    std::memcpy(p, view + 1 + dim_ + state_, sizeof(float) * raw_);
  }

 private:
  static uint32_t Words(DType t, uint32_t n) { return t == DType::kF32 ? n : (n + 1) / 2; }

  static void DecodeArray(DType t, const float* in, float* out, uint32_t n) {
    if (t == DType::kF32) {
      std::memcpy(out, in, sizeof(float) * n);
      return;
    }
    uint16_t h[2];
    for (uint32_t i = 0; i < n; i += 2) {
      std::memcpy(h, in + i / 2, sizeof(h));
      for (uint32_t j = 0; j < 2 && i + j < n; ++j) {
        out[i + j] = t == DType::kBf16 ? Bf16ToF32(h[j]) : F16ToF32(h[j]);
      }
    }
  }

  void EncodeArray(DType t, const float* in, float* out, uint32_t n, RoundingBits* bits) const {
    if (t == DType::kF32) {
      std::memcpy(out, in, sizeof(float) * n);
      return;
    }
    for (uint32_t i = 0; i < n; i += 2) {
      uint16_t h[2] = {0, 0};
      for (uint32_t j = 0; j < 2 && i + j < n; ++j) {
        const float v = in[i + j];
        const bool stochastic = stochastic_ && bits;
        if (t == DType::kBf16) {
          h[j] = stochastic ? F32ToBf16Stochastic(v, bits->Next()) : F32ToBf16(v);
        } else {
          h[j] = stochastic ? F32ToF16Stochastic(v, bits->Next()) : F32ToF16(v);
        }
      }
      std::memcpy(out + i / 2, h, sizeof(h));
    }
  }

  uint32_t dim_, state_, raw_;
  DType values_, state_type_;
  bool stochastic_;
  uint32_t clock_;  // 1: the stored row starts with the clock word; 0: no clock
};

}  // namespace parasol
