#include "server/dense_table.hpp"

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
    : options_(options), slice_(slice), data_(Allocate(slice.size())) {
  InitDenseRange(options_.init, options_.seed, slice_.begin,
                 std::span<float>(data_.get(), slice_.size()));
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
