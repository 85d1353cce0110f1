#include "common/slot_index.hpp"

#include <atomic>
#include <random>

namespace parasol {

uint64_t RandomIndexSeed() {
  static const uint64_t start = [] {
    std::random_device rd;
    return (uint64_t{rd()} << 32) ^ rd();
  }();
  static std::atomic<uint64_t> next{0};
  return SplitMix64(start + next.fetch_add(1, std::memory_order_relaxed));
}

}  // namespace parasol
