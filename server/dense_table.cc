#include "server/dense_table.hpp"

#include <algorithm>
#include <atomic>
#include <cstring>

#include "common/initializer.hpp"

namespace parasol {
namespace {

std::shared_ptr<float[]> Allocate(uint64_t n) {
  return std::shared_ptr<float[]>(std::make_unique_for_overwrite<float[]>(n == 0 ? 1 : n));
}

}  // namespace

DenseTable::DenseTable(const TableOptions& options, SliceRange slice)
    : options_(options), optimizer_(options.optimizer), slice_(slice), data_(Allocate(slice.size())) {
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
    std::shared_ptr<float[]> fresh = Allocate(slice_.size());
    std::memcpy(fresh.get(), data_.get(), slice_.size() * sizeof(float));
    data_ = std::move(fresh);
    ++copies_on_write_;
  }
  std::atomic_thread_fence(std::memory_order_acquire);
  return data_.get();
}

}  // namespace parasol
