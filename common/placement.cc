#include "common/placement.hpp"

#include <algorithm>

namespace parasol {
namespace {

using u128 = unsigned __int128;
constexpr u128 kSpace = u128{1} << 64;

// The first hash of range r of n equal ranges: the least h with ReduceRange(h, n) >= r.
uint64_t UniformBegin(uint32_t r, uint32_t n) {
  return static_cast<uint64_t>(((u128{r} << 64) + n - 1) / n);
}

}  // namespace

Placement::Placement(uint32_t count) : count_(std::max<uint32_t>(count, 1)) {
  for (uint32_t r = 0; r < count_; ++r) {
    begins_.push_back(UniformBegin(r, count_));
    shards_.push_back(r);
  }
}

uint32_t Placement::ShardOfHash(uint64_t hash) const {
  const auto it = std::upper_bound(begins_.begin(), begins_.end(), hash);
  return shards_[static_cast<size_t>(it - begins_.begin()) - 1];
}

double Placement::Share(uint32_t shard) const {
  u128 held = 0;
  for (size_t i = 0; i < begins_.size(); ++i) {
    const u128 end = i + 1 < begins_.size() ? u128{begins_[i + 1]} : kSpace;
    if (shards_[i] == shard) held += end - begins_[i];
  }
  return static_cast<double>(held) / static_cast<double>(kSpace);
}

Placement Placement::Grown() const {
  Placement next;
  next.count_ = count_ + 1;
  next.uniform_ = false;
  next.begins_.clear();
  next.shards_.clear();
  for (size_t i = 0; i < begins_.size(); ++i) {
    const u128 begin = begins_[i];
    const u128 end = i + 1 < begins_.size() ? u128{begins_[i + 1]} : kSpace;
    // The last 1/(count + 1) of the range, rounded down: the new shard's.
    const u128 cut = end - (end - begin) / next.count_;
    next.begins_.push_back(begins_[i]);
    next.shards_.push_back(shards_[i]);
    if (cut < end) {
      next.begins_.push_back(static_cast<uint64_t>(cut));
      next.shards_.push_back(count_);
    }
  }
  next.Normalize();
  return next;
}

Placement Placement::Shrunk() const {
  Placement next;
  next.count_ = count_ - 1;
  next.uniform_ = false;
  next.begins_.clear();
  next.shards_.clear();
  const uint32_t removed = count_ - 1;
  for (size_t i = 0; i < begins_.size(); ++i) {
    if (shards_[i] != removed) {
      next.begins_.push_back(begins_[i]);
      next.shards_.push_back(shards_[i]);
      continue;
    }
    const u128 begin = begins_[i];
    const u128 end = i + 1 < begins_.size() ? u128{begins_[i + 1]} : kSpace;
    const u128 length = end - begin;
    for (uint32_t part = 0; part < next.count_; ++part) {
      const u128 from = begin + length * part / next.count_;
      const u128 to = begin + length * (part + 1) / next.count_;
      if (from == to) continue;
      next.begins_.push_back(static_cast<uint64_t>(from));
      next.shards_.push_back(part);
    }
  }
  next.Normalize();
  return next;
}

Placement Placement::Resized(uint32_t count) const {
  count = std::max<uint32_t>(count, 1);
  Placement p = *this;
  while (p.count_ < count) p = p.Grown();
  while (p.count_ > count) p = p.Shrunk();
  return p;
}

void Placement::Normalize() {
  size_t out = 0;
  for (size_t i = 0; i < begins_.size(); ++i) {
    if (out > 0 && shards_[out - 1] == shards_[i]) continue;
    begins_[out] = begins_[i];
    shards_[out] = shards_[i];
    ++out;
  }
  begins_.resize(out);
  shards_.resize(out);
}

}  // namespace parasol
