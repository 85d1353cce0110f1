// Placement of keys and dense elements on server shards.
//
// Sparse keys go to shards by a strong 64-bit hash of the key (stable: it depends only on the
// key and the shard count). Dense tensors are cut into contiguous slices whose sizes differ by
// at most one element. Within a shard, keys are owned by engines by an independent hash.
#pragma once

#include <cstdint>
#include <vector>

#include "common/hash.hpp"

namespace parasol {

inline constexpr uint64_t kShardSalt = 0x5041524153484152ULL;   // "PARASHAR"
inline constexpr uint64_t kEngineSalt = 0x50415241454e4749ULL;  // "PARAENGI"

// REQUIRES: num_shards >= 1.
inline uint32_t ShardOfKey(uint64_t key, uint32_t num_shards) {
  return ReduceRange(HashKey(key, kShardSalt), num_shards);
}

// REQUIRES: num_engines >= 1.
inline uint32_t EngineOfKey(uint64_t key, uint32_t num_engines) {
  return ReduceRange(HashKey(key, kEngineSalt), num_engines);
}

// A half-open range [begin, end) of a dense tensor's flattened elements.
struct SliceRange {
  uint64_t begin = 0;
  uint64_t end = 0;
  uint64_t size() const { return end - begin; }
  bool Contains(uint64_t b, uint64_t e) const { return b >= begin && e <= end && b <= e; }
};

// The slice of `total` elements held by shard `rank` of `num_shards`.
SliceRange DenseSlice(uint64_t total, uint32_t rank, uint32_t num_shards);

// All slices, in rank order.
std::vector<SliceRange> DenseSlices(uint64_t total, uint32_t num_shards);

}  // namespace parasol
