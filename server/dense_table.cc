#include "server/dense_table.hpp"

#include <algorithm>
#include <atomic>
#include <cstring>

#include "common/initializer.hpp"

namespace parasol {
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
      retired_bytes_(std::move(retired_bytes)) {
  data_ = AllocateValues();
  InitDenseRange(options_.init, options_.seed, slice_.begin,
                 std::span<float>(data_.get(), slice_.size()));
  for (uint32_t a = 0; a < optimizer_.DenseStateArrays(); ++a) {
    state_.push_back(std::make_unique_for_overwrite<float[]>(std::max<uint64_t>(1, slice_.size())));
    state_ptrs_.push_back(state_.back().get());
  }
  constexpr uint64_t kChunk = 1 << 20;
  for (uint64_t i = 0; i < slice_.size(); i += kChunk) {
    const uint32_t n = static_cast<uint32_t>(std::min(kChunk, slice_.size() - i));
    optimizer_.InitState(data_.get() + i, optimizer_.DenseState(state_ptrs_.data(), i), n);
  }
}

float* DenseTable::PrepareWrite() {
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

}  // namespace parasol
