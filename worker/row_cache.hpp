// RowCache: a worker's copies of sparse rows, each valid up to a clock (worker.cache_rows).
//
// Under SSP with staleness s a pull at clock c must see every update of the clocks before
// c - s. A row a shard served while its slowest worker was at clock m holds every update of the
// clocks before m, so the copy may answer pulls up to clock m + s (PsClient passes m + s as
// `valid_until`). The worker's own pushes reach its copies as the shard would apply them (SGD)
// or drop them (other optimizers). Least recently used rows go first past the capacity.
// Thread-safety: none; owned by one PsClient.
#pragma once

#include <cstdint>
#include <list>
#include <unordered_map>
#include <utility>
#include <vector>

namespace parasol {

class RowCache {
 public:
  explicit RowCache(uint64_t capacity_rows = 0) : capacity_(capacity_rows) {}

  // Copies the row of (table, key) into out (dim floats) when there is one valid at `clock`.
  bool Lookup(uint32_t table, uint64_t key, int64_t clock, float* out, uint32_t dim);
  void Insert(uint32_t table, uint64_t key, const float* row, uint32_t dim, int64_t valid_until);
  // The cached row, or nullptr (for the worker's own pushes).
  float* Find(uint32_t table, uint64_t key);
  void Erase(uint32_t table, uint64_t key);
  uint64_t size() const { return map_.size(); }
  // Forgets every row (the job's shard count changed: the rows' new shards answer from then on).
  void Clear() {
    map_.clear();
    lru_.clear();
  }

 private:
  struct Entry {
    std::vector<float> row;
    int64_t valid_until = 0;
    std::list<std::pair<uint32_t, uint64_t>>::iterator lru;
  };
  static uint64_t Slot(uint32_t table, uint64_t key) {
    return key * 0x9e3779b97f4a7c15ull ^ (uint64_t{table} << 56) ^ table;
  }
  Entry* Get(uint32_t table, uint64_t key);

  uint64_t capacity_;
  // By (table, key); Slot() mixes them, and each entry remembers both (lru) to tell apart
  // the rare keys of two tables that mix alike.
  std::unordered_multimap<uint64_t, Entry> map_;
  std::list<std::pair<uint32_t, uint64_t>> lru_;  // front: most recently used
};

}  // namespace parasol
