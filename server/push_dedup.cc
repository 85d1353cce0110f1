#include "server/push_dedup.hpp"

#include <algorithm>
#include <cstring>

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

std::vector<char> PushDedup::Save() const {
  size_t words = 2;
  for (const auto& [worker, w] : workers_) words += 4 + w.bits.size();
  std::vector<char> out(words * 8);
  size_t pos = 0;
  auto put = [&](uint64_t v) {
    std::memcpy(out.data() + pos, &v, 8);
    pos += 8;
  };
  put(window_);
  put(workers_.size());
  for (const auto& [worker, w] : workers_) {
    put(worker);
    put(w.incarnation);
    put(w.base);
    put(w.bits.size());
    for (uint64_t b : w.bits) put(b);
  }
  return out;
}

bool PushDedup::Load(const std::vector<char>& bytes) {
  size_t pos = 0;
  auto get = [&](uint64_t* v) {
    if (pos + 8 > bytes.size()) return false;
    std::memcpy(v, bytes.data() + pos, 8);
    pos += 8;
    return true;
  };
  uint64_t window = 0, count = 0;
  if (!get(&window) || !get(&count) || window != window_) return false;
  std::unordered_map<uint32_t, Window> workers;
  for (uint64_t i = 0; i < count; ++i) {
    uint64_t worker = 0, n = 0;
    Window w;
    if (!get(&worker) || !get(&w.incarnation) || !get(&w.base) || !get(&n) || n != window_ / 64) {
      return false;
    }
    w.bits.resize(n);
    for (auto& b : w.bits) {
      if (!get(&b)) return false;
    }
    workers[static_cast<uint32_t>(worker)] = std::move(w);
  }
  if (pos != bytes.size()) return false;
  workers_ = std::move(workers);
  return true;
}

}  // namespace parasol
