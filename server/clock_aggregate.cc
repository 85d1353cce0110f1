#include "server/clock_aggregate.hpp"

#include <algorithm>

namespace parasol {

ClockAggregate::ClockAggregate(uint32_t tables, uint32_t engines)
    : sparse_(tables), dense_(tables), dense_elements_(tables, 0) {
  for (auto& t : sparse_) t.resize(engines);
}

float* ClockAggregate::SparseSum(uint32_t table, uint32_t engine, uint64_t key, uint32_t dim) {
  SparseSums& s = sparse_[table][engine];
  bool inserted = false;
  const uint32_t i = s.index.FindOrInsert(key, static_cast<uint32_t>(s.keys.size()), &inserted);
  if (inserted) {
    s.keys.push_back(key);
    s.sums.resize(s.sums.size() + dim, 0.0f);
  }
  return s.sums.data() + size_t{i} * dim;
}

float* ClockAggregate::DenseSum(uint32_t table, uint64_t elements) {
  if (!dense_[table]) {
    dense_[table] = std::make_unique<float[]>(elements);  // zeroed
    dense_elements_[table] = elements;
  }
  return dense_[table].get();
}

void ClockAggregate::ResliceDense(uint32_t table, SliceRange from, SliceRange to) {
  if (!dense_[table]) return;
  auto sums = std::make_unique<float[]>(std::max<uint64_t>(1, to.size()));  // zeroed
  const uint64_t b = std::max(from.begin, to.begin), e = std::min(from.end, to.end);
  if (b < e) {
    const float* old = dense_[table].get();
    std::copy(old + (b - from.begin), old + (e - from.begin), sums.get() + (b - to.begin));
  }
  dense_[table] = std::move(sums);
  dense_elements_[table] = to.size();
}

uint64_t ClockAggregate::MemoryBytes() const {
  uint64_t n = 0;
  for (const auto& t : sparse_) {
    for (const auto& s : t) {
      n += s.index.MemoryBytes() + s.keys.capacity() * 8 + s.sums.capacity() * 4;
    }
  }
  for (uint64_t e : dense_elements_) n += e * 4;
  return n;
}

}  // namespace parasol
