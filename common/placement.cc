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
  // Each shard gives the new one the last 1/(count + 1) of what it holds (in hash order, from
  // the end of its last range): one piece per shard, so the ranges grow by at most count.
  Placement next;
  next.count_ = count_ + 1;
  next.uniform_ = false;
  std::vector<u128> give(count_, 0);
  std::vector<u128> held(count_, 0);
  for (size_t i = 0; i < begins_.size(); ++i) {
    const u128 end = i + 1 < begins_.size() ? u128{begins_[i + 1]} : kSpace;
    held[shards_[i]] += end - begins_[i];
  }
  for (uint32_t s = 0; s < count_; ++s) give[s] = held[s] / next.count_;
  // Walking the ranges from the end, each shard's last hashes go to the new shard.
  std::vector<uint64_t> begins;
  std::vector<uint32_t> shards;
  for (size_t i = begins_.size(); i-- > 0;) {
    const u128 begin = begins_[i];
    const u128 end = i + 1 < begins_.size() ? u128{begins_[i + 1]} : kSpace;
    u128& left = give[shards_[i]];
    const u128 take = std::min(left, end - begin);
    left -= take;
    if (take > 0) {
      begins.push_back(static_cast<uint64_t>(end - take));
      shards.push_back(count_);
    }
    if (take < end - begin) {
      begins.push_back(begins_[i]);
      shards.push_back(shards_[i]);
    }
  }
  next.begins_.assign(begins.rbegin(), begins.rend());
  next.shards_.assign(shards.rbegin(), shards.rend());
  next.Normalize();
  return next;
}

Placement Placement::Shrunk() const {
  // The highest shard's hashes, in order, cut into count - 1 equal parts for the others: at
  // most count - 2 cuts beyond its ranges.
  Placement next;
  next.count_ = count_ - 1;
  next.uniform_ = false;
  const uint32_t removed = count_ - 1;
  u128 total = 0;
  for (size_t i = 0; i < begins_.size(); ++i) {
    const u128 end = i + 1 < begins_.size() ? u128{begins_[i + 1]} : kSpace;
    if (shards_[i] == removed) total += end - begins_[i];
  }
  u128 before = 0;  // the removed shard's hashes in the ranges before this one
  for (size_t i = 0; i < begins_.size(); ++i) {
    const u128 begin = begins_[i];
    const u128 end = i + 1 < begins_.size() ? u128{begins_[i + 1]} : kSpace;
    if (shards_[i] != removed) {
      next.begins_.push_back(begins_[i]);
      next.shards_.push_back(shards_[i]);
      continue;
    }
    // Hash begin + x (x < length) is the removed shard's (before + x)-th: part
    // (before + x) * (count - 1) / total.
    const u128 length = end - begin;
    u128 x = 0;
    while (x < length) {
      const uint32_t part = static_cast<uint32_t>((before + x) * next.count_ / total);
      // The first of its hashes past this part.
      const u128 part_end = (u128{part} + 1) * total / next.count_ +
                            (((u128{part} + 1) * total) % next.count_ != 0 ? 1 : 0);
      const u128 stop = std::min(length, part_end - before);
      next.begins_.push_back(static_cast<uint64_t>(begin + x));
      next.shards_.push_back(part);
      x = stop;
    }
    before += length;
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
