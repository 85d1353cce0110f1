// How a sparse request's keys split across shards: each distinct key once (a key asked for
// twice is fetched once; gradients of a repeated key are summed), numbered within the request
// to its shard, and where each of the caller's positions finds its row again.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "common/key_index.hpp"
#include "common/placement.hpp"

namespace parasol {

struct KeySplit {
  std::vector<uint32_t> inverse;       // position -> unique id
  std::vector<uint32_t> unique_shard;  // unique id -> shard
  std::vector<uint32_t> unique_local;  // unique id -> row within that shard's request
  std::vector<uint64_t> counts;        // shard -> unique keys sent to it
};

// Fills `split` (its vectors' capacity reused) for `keys`, which `placement` places among
// `shards` shards; `index` is scratch for the deduplication.
void SplitKeys(std::span<const uint64_t> keys, const Placement& placement, uint32_t shards,
               KeyIndex& index, KeySplit& split);
// The same for keys the caller has deduplicated already: only split by shard, no hashing.
// REQUIRES: no key twice in `keys`.
void SplitUniqueKeys(std::span<const uint64_t> keys, const Placement& placement, uint32_t shards,
                     KeySplit& split);

}  // namespace parasol
