#include "server/push_dedup.hpp"

#include <algorithm>

namespace parasol {

PushDedup::PushDedup(uint64_t window) : window_(std::max<uint64_t>(64, (window + 63) / 64 * 64)) {}

bool PushDedup::Test(const Window& w, uint64_t seq) const {
  if (seq < w.base) return true;
  if (seq >= w.base + window_) return false;
  const uint64_t bit = seq % window_;
  return (w.bits[bit / 64] >> (bit % 64)) & 1;
}

bool PushDedup::Seen(uint32_t worker, uint64_t incarnation, uint64_t seq) const {
  auto it = workers_.find(worker);
  if (it == workers_.end() || it->second.incarnation != incarnation) return false;
  return Test(it->second, seq);
}

void PushDedup::Mark(uint32_t worker, uint64_t incarnation, uint64_t seq) {
  Window& w = workers_[worker];
  if (w.bits.empty() || w.incarnation != incarnation) {
    w.incarnation = incarnation;
    w.base = 0;
    w.bits.assign(window_ / 64, 0);
  }
  if (seq < w.base) return;
  if (seq >= w.base + window_) {
    const uint64_t new_base = seq - window_ + 1;
    if (new_base - w.base >= window_) {
      std::fill(w.bits.begin(), w.bits.end(), 0);
    } else {
      for (uint64_t s = w.base; s < new_base; ++s) {
        const uint64_t bit = s % window_;
        w.bits[bit / 64] &= ~(uint64_t{1} << (bit % 64));
      }
    }
    w.base = new_base;
  }
  const uint64_t bit = seq % window_;
  w.bits[bit / 64] |= uint64_t{1} << (bit % 64);
}

}  // namespace parasol
