// Placement: which shard holds each sparse key and each dense element, as the job's shard count
// changes while it runs (`parasol scale --servers`).
//
// Keys are placed by ranges of their 64-bit shard hash (HashKey(key, kShardSalt)). The first
// placement of a job with n shards cuts the hash space into n equal ranges, so that it places
// every key exactly as ShardOfKey(key, n) does. Growing by one shard gives the new shard the
// last 1/(n+1) of every shard's hashes (from the end of its last range: one piece each), so
// about 1/(n+1) of the keys move, from every shard alike; shrinking by one cuts the highest
// shard's hashes, in order, into n-1 equal parts for shards 0 .. n-2, so only its keys move.
// Either adds at most n ranges, so a placement has O(changes x shards) ranges. Shards
// 0 .. count()-1 hold keys, and each a slice of every dense tensor: DenseSlice() among count()
// shards (re-cut at every change, so a shard's slice may move as a whole).
//
// A placement is a function of the listed shards, the initial count and the counts it went
// through, so every worker and shard that knows the same changes (common/membership.hpp)
// computes the same one.
// Thread-safety: immutable once built.
#pragma once

#include <cstdint>
#include <vector>

#include "common/sharding.hpp"

namespace parasol {

// The most shards a job whose shard count changes may list (a placement then has at most
// O(changes x shards) ranges).
inline constexpr uint32_t kMaxReshardServers = 256;

class Placement {
 public:
  // The first placement: `count` shards, as ShardOfKey and DenseSlice place keys and elements.
  // REQUIRES: count >= 1.
  explicit Placement(uint32_t count = 1);

  uint32_t count() const { return count_; }
  // Whether this is still the first placement of count() shards (a key's shard is then
  // ShardOfKey(key, count())).
  bool uniform() const { return uniform_; }

  // The placement after one more shard (grow) or one fewer (the highest removed).
  // REQUIRES: count() >= 2 to shrink.
  Placement Grown() const;
  Placement Shrunk() const;
  // Through single steps to `count`. REQUIRES: count >= 1.
  Placement Resized(uint32_t count) const;

  // Shard `shard`'s slice of a dense tensor of `total` elements (empty past count()).
  SliceRange DenseSliceOf(uint64_t total, uint32_t shard) const {
    return shard < count_ ? DenseSlice(total, shard, count_) : SliceRange{0, 0};
  }

  // The shard whose slice holds element `index` of a dense tensor of `total` elements.
  // REQUIRES: index < total.
  uint32_t DenseShardOf(uint64_t total, uint64_t index) const {
    const uint64_t base = total / count_, extra = total % count_;
    // The first `extra` shards hold base + 1 elements, the others base.
    if (index < extra * (base + 1)) return static_cast<uint32_t>(index / (base + 1));
    return static_cast<uint32_t>(extra + (index - extra * (base + 1)) / base);
  }

  uint32_t ShardOfHash(uint64_t hash) const;
  uint32_t ShardOf(uint64_t key) const {
    return uniform_ ? ShardOfKey(key, count_) : ShardOfHash(HashKey(key, kShardSalt));
  }

  // The ranges of the hash space: range i is [begin(i), begin(i + 1)) (the last ends at 2^64)
  // and belongs to shard(i). Adjacent ranges belong to different shards.
  size_t ranges() const { return begins_.size(); }
  uint64_t begin(size_t i) const { return begins_[i]; }
  uint32_t shard(size_t i) const { return shards_[i]; }
  // The fraction of the hash space held by `shard`.
  double Share(uint32_t shard) const;

  bool operator==(const Placement&) const = default;

 private:
  // Merges adjacent ranges of one shard.
  void Normalize();

  uint32_t count_ = 1;
  bool uniform_ = true;
  std::vector<uint64_t> begins_;
  std::vector<uint32_t> shards_;
};

}  // namespace parasol
