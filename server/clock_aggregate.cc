#include "server/clock_aggregate.hpp"

#include <algorithm>

namespace parasol {

ClockAggregate::Part::Part(uint32_t tables, uint32_t engines)
    : sparse_(tables), dense_(tables), dense_elements_(tables, 0) {
  for (auto& t : sparse_) t.resize(engines);
}

float* ClockAggregate::Part::SparseSum(uint32_t table, uint32_t engine, uint64_t key,
                                       uint32_t dim) {
  SparseSums& s = sparse_[table][engine];
  bool inserted = false;
  const uint32_t i = s.index.FindOrInsert(key, static_cast<uint32_t>(s.keys.size()), &inserted);
  if (inserted) {
    s.keys.push_back(key);
    s.sums.resize(s.sums.size() + dim, 0.0f);
  }
  return s.sums.data() + size_t{i} * dim;
}

void ClockAggregate::Part::ReserveSparse(uint32_t table, uint32_t engine, size_t keys,
                                         uint32_t dim) {
  SparseSums& s = sparse_[table][engine];
  if (!s.keys.empty()) return;
  s.index.Reserve(keys);
  s.keys.reserve(keys);
  s.sums.reserve(keys * dim);
}

void ClockAggregate::Part::Clear() {
  for (auto& t : sparse_) {
    for (SparseSums& s : t) {
      s.index.Clear();
      s.keys.clear();
      s.sums.clear();
    }
  }
  for (auto& d : dense_) d.reset();
  std::fill(dense_elements_.begin(), dense_elements_.end(), 0);
}

float* ClockAggregate::Part::DenseSum(uint32_t table, uint64_t elements) {
  if (!dense_[table]) {
    dense_[table] = std::make_unique<float[]>(elements);  // zeroed
    dense_elements_[table] = elements;
  }
  return dense_[table].get();
}

void ClockAggregate::Part::ResliceDense(uint32_t table, SliceRange from, SliceRange to) {
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

uint64_t ClockAggregate::Part::MemoryBytes() const {
  uint64_t n = 0;
  for (const auto& t : sparse_) {
    for (const auto& s : t) {
      n += s.index.MemoryBytes() + s.keys.capacity() * 8 + s.sums.capacity() * 4;
    }
  }
  for (uint64_t e : dense_elements_) n += e * 4;
  return n;
}

uint64_t ClockAggregate::Part::SumBytes() const {
  uint64_t n = 0;
  for (const auto& t : sparse_) {
    for (const auto& s : t) {
      n += KeyIndex::CapacityFor(s.keys.size()) * (sizeof(uint64_t) + sizeof(uint32_t)) +
           s.keys.size() * sizeof(uint64_t) + s.sums.size() * sizeof(float);
    }
  }
  for (uint64_t e : dense_elements_) n += e * sizeof(float);
  return n;
}

ClockAggregate::ClockAggregate(uint32_t tables, uint32_t engines, SpareParts* spares)
    : tables_(tables), engines_(engines), spares_(spares) {}

ClockAggregate::Part& ClockAggregate::PartOf(int64_t worker) {
  auto it = parts_.find(worker);
  if (it != parts_.end()) return it->second;
  if (spares_ && !spares_->parts.empty()) {
    Part& spare = spares_->parts.back();
    spares_->bytes -= std::min(spares_->bytes, spare.MemoryBytes());
    it = parts_.try_emplace(worker, std::move(spare)).first;
    spares_->parts.pop_back();
    ++spares_->reused;
    return it->second;
  }
  return parts_.try_emplace(worker, tables_, engines_).first->second;
}

void ClockAggregate::Recycle() {
  std::vector<Part> done;
  if (combined_) done.push_back(std::move(*combined_));
  for (auto& [w, p] : parts_) done.push_back(std::move(p));
  for (Part& p : rest_) done.push_back(std::move(p));
  combined_.reset();
  parts_.clear();
  rest_.clear();
  GiveToSpares(done);
}

void ClockAggregate::EndCombine() {
  std::vector<Part> done = std::move(rest_);
  rest_.clear();
  GiveToSpares(done);
}

void ClockAggregate::GiveToSpares(std::vector<Part>& done) {
  if (!spares_) return;
  for (Part& p : done) {
    if (p.sparse_.size() != tables_ || (tables_ > 0 && p.sparse_[0].size() != engines_)) continue;
    if (spares_->parts.size() >= spares_->max_parts) return;
    const uint64_t used = p.SumBytes();
    p.Clear();  // the sparse buffers' capacity stays, and counts
    const uint64_t bytes = p.MemoryBytes();
    if (spares_->bytes + bytes > spares_->max_bytes) continue;
    // Buffers far larger than the clock just summed in them (one large clock, such as a
    // restart's replays, then ordinary ones) are freed: every reuse clears the whole index.
    if (bytes > 4 * used + SpareParts::kSlackBytes) continue;
    spares_->bytes += bytes;
    spares_->parts.push_back(std::move(p));
  }
}

void ClockAggregate::PrepareCombine() {
  if (combined_) return;
  // The lowest rank's part becomes the sums; the others are added to it in rank order.
  if (parts_.empty()) {
    combined_ = std::make_unique<Part>(tables_, engines_);
    return;
  }
  auto it = parts_.begin();
  combined_ = std::make_unique<Part>(std::move(it->second));
  for (++it; it != parts_.end(); ++it) rest_.push_back(std::move(it->second));
  parts_.clear();
  // Dense sums that only later parts have start at zero.
  for (uint32_t t = 0; t < tables_; ++t) {
    if (combined_->dense_[t]) continue;
    for (const Part& p : rest_) {
      if (p.dense_[t]) {
        combined_->DenseSum(t, p.dense_elements_[t]);
        break;
      }
    }
  }
}

void ClockAggregate::CombineOn(uint32_t engine) {
  if (rest_.empty()) return;
  Part& sums = *combined_;
  for (uint32_t t = 0; t < tables_; ++t) {
    for (const Part& p : rest_) {
      const Part::SparseSums& from = p.sparse_[t][engine];
      if (from.keys.empty()) continue;
      const size_t dim = from.sums.size() / from.keys.size();
      for (size_t i = 0; i < from.keys.size(); ++i) {
        float* sum = sums.SparseSum(t, engine, from.keys[i], static_cast<uint32_t>(dim));
        const float* add = from.sums.data() + i * dim;
        for (size_t d = 0; d < dim; ++d) sum[d] += add[d];
      }
    }
    if (!sums.dense_[t]) continue;
    // This engine's share of the elements.
    const uint64_t n = sums.dense_elements_[t];
    const uint64_t b = n * engine / engines_, e = n * (engine + 1) / engines_;
    float* out = sums.dense_[t].get();
    for (const Part& p : rest_) {
      const float* add = p.dense_[t].get();
      if (!add) continue;
      const uint64_t end = std::min(e, p.dense_elements_[t]);
      for (uint64_t i = b; i < end; ++i) out[i] += add[i];
    }
  }
}

bool ClockAggregate::HasDense(int64_t worker, uint32_t table) const {
  if (combined_) return combined_->DenseSumIfAny(table) != nullptr;
  const auto it = parts_.find(worker);
  return it != parts_.end() && it->second.DenseSumIfAny(table) != nullptr;
}

void ClockAggregate::ResliceDense(uint32_t table, SliceRange from, SliceRange to) {
  for (auto& [worker, p] : parts_) p.ResliceDense(table, from, to);
  if (combined_) combined_->ResliceDense(table, from, to);
  for (Part& p : rest_) p.ResliceDense(table, from, to);
}

uint64_t ClockAggregate::SumBytes() const {
  uint64_t n = combined_ ? combined_->SumBytes() : 0;
  for (const auto& [worker, p] : parts_) n += p.SumBytes();
  for (const Part& p : rest_) n += p.SumBytes();
  return n;
}

uint64_t ClockAggregate::MemoryBytes() const {
  uint64_t n = combined_ ? combined_->MemoryBytes() : 0;
  for (const auto& [worker, p] : parts_) n += p.MemoryBytes();
  for (const Part& p : rest_) n += p.MemoryBytes();
  return n;
}

}  // namespace parasol
