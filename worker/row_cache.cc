#include "worker/row_cache.hpp"

#include <cstring>

namespace parasol {

RowCache::Entry* RowCache::Get(uint32_t table, uint64_t key) {
  auto [first, last] = map_.equal_range(Slot(table, key));
  for (auto it = first; it != last; ++it) {
    if (it->second.lru->first == table && it->second.lru->second == key) return &it->second;
  }
  return nullptr;
}

bool RowCache::Lookup(uint32_t table, uint64_t key, int64_t clock, float* out, uint32_t dim) {
  Entry* e = Get(table, key);
  if (e == nullptr || clock > e->valid_until || e->row.size() != dim) return false;
  std::memcpy(out, e->row.data(), dim * sizeof(float));
  lru_.splice(lru_.begin(), lru_, e->lru);
  return true;
}

void RowCache::Insert(uint32_t table, uint64_t key, const float* row, uint32_t dim,
                      int64_t valid_until) {
  if (capacity_ == 0) return;
  Entry* e = Get(table, key);
  if (e == nullptr) {
    while (map_.size() >= capacity_ && !lru_.empty()) Erase(lru_.back().first, lru_.back().second);
    lru_.emplace_front(table, key);
    Entry fresh;
    fresh.lru = lru_.begin();
    e = &map_.emplace(Slot(table, key), std::move(fresh))->second;
  } else {
    lru_.splice(lru_.begin(), lru_, e->lru);
  }
  e->row.assign(row, row + dim);
  e->valid_until = valid_until;
}

float* RowCache::Find(uint32_t table, uint64_t key) {
  Entry* e = Get(table, key);
  return e ? e->row.data() : nullptr;
}

void RowCache::Erase(uint32_t table, uint64_t key) {
  auto [first, last] = map_.equal_range(Slot(table, key));
  for (auto it = first; it != last; ++it) {
    if (it->second.lru->first == table && it->second.lru->second == key) {
      lru_.erase(it->second.lru);
      map_.erase(it);
      return;
    }
  }
}

}  // namespace parasol
