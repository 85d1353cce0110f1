// A batch of training or evaluation samples, laid out for the models.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/key_index.hpp"

namespace parasol {

// A batch's distinct keys, and for each of its keys the index of its distinct key: the rows
// to pull, and where each key finds its row.
struct BatchKeys {
  std::vector<uint64_t> unique;
  std::vector<uint32_t> indices;
};

struct Batch {
  uint32_t size = 0;
  std::vector<float> labels;      // [size], 0 or 1
  std::vector<float> dense;       // [size * 13]: log(1 + max(x, 0)), 0 when empty
  std::vector<uint64_t> keys;     // sample b's keys are keys[offsets[b] .. offsets[b + 1])
  std::vector<float> values;      // one per key (1 for categorical keys)
  std::vector<uint32_t> offsets;  // [size + 1]
  // With ReaderOptions::deduplicate: `keys` deduplicated, by the reader's thread.
  BatchKeys distinct;
  // BatchReader: the step (clock) the batch is for, its place among the step's micro-batches
  // (training.accumulate), and the malformed rows left out of it.
  int64_t step = -1;
  uint32_t micro = 0;
  uint32_t bad_rows = 0;
  std::string first_bad;  // "file:line: why" of the first of them, or ""
  // Each sample's line in the stream of every epoch's lines (common/membership.hpp).
  std::vector<uint64_t> positions;

  void Clear() {
    size = 0;
    labels.clear();
    dense.clear();
    keys.clear();
    values.clear();
    offsets.assign(1, 0);
    distinct.unique.clear();
    distinct.indices.clear();
    step = -1;
    micro = 0;
    bad_rows = 0;
    first_bad.clear();
    positions.clear();
  }
};

// Fills `out` from `keys`, reusing `index` (and out's buffers) across calls.
inline void DeduplicateKeys(const std::vector<uint64_t>& keys, KeyIndex& index, BatchKeys* out) {
  if (index.capacity() * 7 >= keys.size() * 10) {
    index.Clear();
  } else {
    index.Reset(keys.size());
  }
  out->unique.clear();
  out->indices.resize(keys.size());
  // The bucket of the key 16 ahead is loaded while this one is looked up.
  constexpr size_t kAhead = 16;
  for (size_t i = 0; i < keys.size(); ++i) {
    if (i + kAhead < keys.size()) index.Prefetch(keys[i + kAhead]);
    bool inserted = false;
    out->indices[i] =
        index.FindOrInsert(keys[i], static_cast<uint32_t>(out->unique.size()), &inserted);
    if (inserted) out->unique.push_back(keys[i]);
  }
}

inline BatchKeys DeduplicateKeys(const std::vector<uint64_t>& keys) {
  KeyIndex index(keys.size());
  BatchKeys out;
  DeduplicateKeys(keys, index, &out);
  return out;
}

}  // namespace parasol
