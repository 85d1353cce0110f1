#include "server/dense_table.hpp"

#include <algorithm>
#include <atomic>
#include <cstring>

#include "common/hash.hpp"
#include "common/initializer.hpp"

namespace parasol {
namespace {

// Adam's step count (its third dense state array) is a 32-bit word, whatever state_dtype says.
bool RawStateArray(const OptimizerOptions& o, uint32_t a) {
  return o.kind == OptimizerOptions::Kind::kAdam && a == 2;
}

constexpr uint64_t kChunk = DenseTable::kDenseChunk;

}  // namespace

std::shared_ptr<float[]> DenseTable::AllocateValues() {
  auto state = std::make_shared<BufferState>();
  state->bytes = std::max<uint64_t>(1, slice_.size()) * sizeof(float);
  state->retired_total = retired_bytes_;
  data_state_ = state;
  std::unique_ptr<float[]> values =
      std::make_unique_for_overwrite<float[]>(std::max<uint64_t>(1, slice_.size()));
  return std::shared_ptr<float[]>(values.release(), [state](float* p) {
    if (state->retired.load(std::memory_order_acquire) && state->retired_total) {
      state->retired_total->fetch_sub(state->bytes);
    }
    std::default_delete<float[]>()(p);
  });
}

DenseTable::DenseTable(const TableOptions& options, SliceRange slice,
                       std::shared_ptr<std::atomic<uint64_t>> retired_bytes)
    : options_(options),
      optimizer_(options.optimizer),
      slice_(slice),
      stochastic_(options.rounding == TableOptions::Rounding::kStochastic),
      retired_bytes_(std::move(retired_bytes)) {
  const uint64_t n = slice_.size(), alloc = std::max<uint64_t>(1, n);
  for (uint32_t a = 0; a < optimizer_.DenseStateArrays(); ++a) {
    StateArray s;
    s.type = RawStateArray(options_.optimizer, a) ? DType::kF32 : options_.state_dtype;
    if (s.type == DType::kF32) {
      s.words = std::make_unique_for_overwrite<float[]>(alloc);
      state_ptrs_.push_back(s.words.get());
    } else {
      s.halves = std::make_unique_for_overwrite<uint16_t[]>(alloc);
    }
    state_.push_back(std::move(s));
  }
  identity_ = f32_values() && state_ptrs_.size() == state_.size();
  if (f32_values()) {
    data_ = AllocateValues();
    InitDenseRange(options_.init, options_.seed, slice_.begin, std::span<float>(data_.get(), n));
  } else {
    halves_ = std::make_unique_for_overwrite<uint16_t[]>(alloc);
  }
  // Initial values and state computed in f32, a chunk at a time; 16-bit ones rounded to
  // nearest (the same on every run and restart).
  float w[kChunk], st[3][kChunk];
  for (uint64_t i = 0; i < n; i += kChunk) {
    const uint64_t m = std::min(kChunk, n - i);
    float* values = w;
    if (f32_values()) {
      values = data_.get() + i;
    } else {
      InitDenseRange(options_.init, options_.seed, slice_.begin + i, std::span<float>(w, m));
    }
    float* arrays[3] = {st[0], st[1], st[2]};
    for (uint32_t a = 0; a < state_.size(); ++a) {
      if (state_[a].type == DType::kF32) arrays[a] = state_[a].words.get() + i;
    }
    optimizer_.InitState(values, optimizer_.DenseState(arrays, 0), static_cast<uint32_t>(m));
    Store(i, m, w, st, /*stochastic=*/false);
  }
}

void DenseTable::Store(uint64_t i, uint64_t m, const float* w, const float (*st)[kDenseChunk],
                       bool stochastic) {
  if (stochastic && stochastic_) {
    // Each element's draws (its value's, then each state array's) from its own bits.
    for (uint64_t j = 0; j < m; ++j) {
      RoundingBits bits = RoundingBitsFor(options_.seed, write_, slice_.begin + i + j);
      if (!f32_values()) halves_[i + j] = Narrow(options_.dtype, w[j], &bits);
      for (uint32_t a = 0; a < state_.size(); ++a) {
        StateArray& s = state_[a];
        if (s.type != DType::kF32) s.halves[i + j] = Narrow(s.type, st[a][j], &bits);
      }
    }
    return;
  }
  if (!f32_values()) {
    for (uint64_t j = 0; j < m; ++j) halves_[i + j] = Narrow(options_.dtype, w[j], nullptr);
  }
  for (uint32_t a = 0; a < state_.size(); ++a) {
    StateArray& s = state_[a];
    if (s.type == DType::kF32) continue;
    for (uint64_t j = 0; j < m; ++j) s.halves[i + j] = Narrow(s.type, st[a][j], nullptr);
  }
}

uint16_t DenseTable::Narrow(DType t, float v, RoundingBits* bits) const {
  if (stochastic_ && bits) {
    return t == DType::kBf16 ? F32ToBf16Stochastic(v, bits->Next())
                             : F32ToF16Stochastic(v, bits->Next());
  }
  return t == DType::kBf16 ? F32ToBf16(v) : F32ToF16(v);
}

float* DenseTable::PrepareWrite(uint64_t write) {
  write_ = write;
  if (!f32_values()) return nullptr;
  // Only this thread creates shares, so a count of 1 cannot grow behind our back; a stale
  // higher count merely costs a copy. The fence orders our writes after the last reader's
  // release of its share.
  if (data_.use_count() > 1) {
    // The replies' buffer retires: it counts until the last of them has been sent.
    const std::shared_ptr<BufferState> old_state = data_state_;
    std::shared_ptr<float[]> fresh = AllocateValues();
    std::memcpy(fresh.get(), data_.get(), slice_.size() * sizeof(float));
    if (old_state->retired_total) old_state->retired_total->fetch_add(old_state->bytes);
    old_state->retired.store(true, std::memory_order_release);
    data_ = std::move(fresh);
    ++copies_on_write_;
  }
  std::atomic_thread_fence(std::memory_order_acquire);
  return data_.get();
}

void DenseTable::Apply(uint64_t local, const std::byte* grad, uint64_t n, double scale) {
  if (identity_) {
    optimizer_.Apply(data_.get() + local, optimizer_.DenseState(state_ptrs_.data(), local), grad,
                     n, scale);
    return;
  }
  float w[kChunk], st[3][kChunk];  // at most 3 state arrays (adam: m, v, step)
  for (uint64_t i = local; i < local + n; i += kChunk) {
    const uint64_t m = std::min(kChunk, local + n - i);
    float* values = w;
    if (f32_values()) {
      values = data_.get() + i;
    } else {
      for (uint64_t j = 0; j < m; ++j) w[j] = Widen(options_.dtype, halves_[i + j]);
    }
    float* arrays[3] = {st[0], st[1], st[2]};
    for (uint32_t a = 0; a < state_.size(); ++a) {
      const StateArray& s = state_[a];
      if (s.type == DType::kF32) {
        arrays[a] = s.words.get() + i;
      } else {
        for (uint64_t j = 0; j < m; ++j) st[a][j] = Widen(s.type, s.halves[i + j]);
      }
    }
    optimizer_.Apply(values, optimizer_.DenseState(arrays, 0),
                     grad + (i - local) * sizeof(float), m, scale);
    Store(i, m, w, st, /*stochastic=*/true);
  }
}

void DenseTable::ReadValues(uint64_t local, uint64_t n, float* out) const {
  if (f32_values()) {
    std::memcpy(out, data_.get() + local, n * sizeof(float));
    return;
  }
  for (uint64_t j = 0; j < n; ++j) out[j] = Widen(options_.dtype, halves_[local + j]);
}

void DenseTable::ReadWithState(uint64_t local, uint64_t n, float* out) const {
  const uint32_t row = 1 + state_array_count();
  for (uint64_t j = 0; j < n; ++j) {
    const uint64_t i = local + j;
    out[j * row] = f32_values() ? data_[i] : Widen(options_.dtype, halves_[i]);
    for (uint32_t a = 0; a < state_.size(); ++a) {
      const StateArray& s = state_[a];
      out[j * row + 1 + a] = s.type == DType::kF32 ? s.words[i] : Widen(s.type, s.halves[i]);
    }
  }
}

void DenseTable::WriteWithState(uint64_t local, uint64_t n, const float* in) {
  const uint32_t row = 1 + state_array_count();
  float* values = PrepareWrite();
  for (uint64_t j = 0; j < n; ++j) {
    const uint64_t i = local + j;
    const float* r = in + j * row;
    if (values) {
      values[i] = r[0];
    } else {
      halves_[i] = Narrow(options_.dtype, r[0], nullptr);
    }
    for (uint32_t a = 0; a < state_.size(); ++a) {
      StateArray& s = state_[a];
      if (s.type == DType::kF32) {
        s.words[i] = r[1 + a];
      } else {
        s.halves[i] = Narrow(s.type, r[1 + a], nullptr);
      }
    }
  }
}

std::unique_ptr<DenseTable> DenseTable::Resliced(SliceRange slice) const {
  auto out = std::make_unique<DenseTable>(options_, slice, retired_bytes_);
  const uint64_t b = std::max(slice.begin, slice_.begin), e = std::min(slice.end, slice_.end);
  const uint32_t row = 1 + state_array_count();
  std::vector<float> rows(kChunk * row);
  for (uint64_t i = b; i < e; i += kChunk) {
    const uint64_t m = std::min(kChunk, e - i);
    ReadWithState(i - slice_.begin, m, rows.data());
    out->WriteWithState(i - slice.begin, m, rows.data());
  }
  return out;
}

void DenseTable::AppendArrays(std::vector<char>* bytes) const {
  const uint64_t n = slice_.size();
  if (n == 0) return;  // a tensor with fewer elements than shards
  const size_t at = bytes->size();
  bytes->resize(at + n * sizeof(float) * (1 + state_.size()));
  float* out = reinterpret_cast<float*>(bytes->data() + at);
  ReadValues(0, n, out);
  for (uint32_t a = 0; a < state_.size(); ++a) {
    const StateArray& s = state_[a];
    float* dst = out + (1 + a) * n;
    if (s.type == DType::kF32) {
      std::memcpy(dst, s.words.get(), n * sizeof(float));
    } else {
      for (uint64_t j = 0; j < n; ++j) dst[j] = Widen(s.type, s.halves[j]);
    }
  }
}

void DenseTable::RestoreArrays(const char* bytes) {
  const uint64_t n = slice_.size();
  if (n == 0) return;
  if (float* values = PrepareWrite()) {
    std::memcpy(values, bytes, n * sizeof(float));
  } else {
    for (uint64_t j = 0; j < n; ++j) {
      float v;
      std::memcpy(&v, bytes + j * sizeof(float), sizeof(v));
      halves_[j] = Narrow(options_.dtype, v, nullptr);
    }
  }
  for (uint32_t a = 0; a < state_.size(); ++a) {
    StateArray& s = state_[a];
    const char* src = bytes + (1 + a) * n * sizeof(float);
    if (s.type == DType::kF32) {
      std::memcpy(s.words.get(), src, n * sizeof(float));
      continue;
    }
    for (uint64_t j = 0; j < n; ++j) {
      float v;
      std::memcpy(&v, src + j * sizeof(float), sizeof(v));
      s.halves[j] = Narrow(s.type, v, nullptr);
    }
  }
}

uint64_t DenseTable::MemoryBytes() const {
  const uint64_t n = slice_.size();
  uint64_t bytes = n * (f32_values() ? sizeof(float) : sizeof(uint16_t));
  for (const StateArray& s : state_) {
    bytes += n * (s.type == DType::kF32 ? sizeof(float) : sizeof(uint16_t));
  }
  return bytes;
}

}  // namespace parasol
