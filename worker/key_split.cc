#include "worker/key_split.hpp"

namespace parasol {

void SplitKeys(std::span<const uint64_t> keys, const Placement& placement, uint32_t shards,
               KeyIndex& index, KeySplit& split) {
  split.unique_shard.clear();
  split.unique_local.clear();
  if (index.capacity() * 7 >= keys.size() * 10) {
    index.Clear();
  } else {
    index.Reset(keys.size());
  }
  split.inverse.resize(keys.size());
  split.counts.assign(shards, 0);
  for (size_t i = 0; i < keys.size(); ++i) {
    bool inserted = false;
    const uint32_t u = index.FindOrInsert(
        keys[i], static_cast<uint32_t>(split.unique_shard.size()), &inserted);
    if (inserted) {
      const uint32_t s = placement.ShardOf(keys[i]);
      split.unique_shard.push_back(s);
      split.unique_local.push_back(static_cast<uint32_t>(split.counts[s]++));
    }
    split.inverse[i] = u;
  }
}

void SplitUniqueKeys(std::span<const uint64_t> keys, const Placement& placement, uint32_t shards,
                     KeySplit& split) {
  split.inverse.resize(keys.size());
  split.unique_shard.resize(keys.size());
  split.unique_local.resize(keys.size());
  split.counts.assign(shards, 0);
  for (size_t i = 0; i < keys.size(); ++i) {
    const uint32_t s = placement.ShardOf(keys[i]);
    split.inverse[i] = static_cast<uint32_t>(i);
    split.unique_shard[i] = s;
    split.unique_local[i] = static_cast<uint32_t>(split.counts[s]++);
  }
}

}  // namespace parasol
