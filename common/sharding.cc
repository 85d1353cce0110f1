#include "common/sharding.hpp"

namespace parasol {

SliceRange DenseSlice(uint64_t total, uint32_t rank, uint32_t num_shards) {
  const uint64_t base = total / num_shards;
  const uint64_t extra = total % num_shards;
  const uint64_t begin = rank * base + (rank < extra ? rank : extra);
  const uint64_t size = base + (rank < extra ? 1 : 0);
  return {begin, begin + size};
}

std::vector<SliceRange> DenseSlices(uint64_t total, uint32_t num_shards) {
  std::vector<SliceRange> out;
  out.reserve(num_shards);
  for (uint32_t r = 0; r < num_shards; ++r) out.push_back(DenseSlice(total, r, num_shards));
  return out;
}

}  // namespace parasol
