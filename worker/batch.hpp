// A batch of training or evaluation samples, laid out for the models.
#pragma once

#include <cstdint>
#include <vector>

namespace parasol {

struct Batch {
  uint32_t size = 0;
  std::vector<float> labels;      // [size], 0 or 1
  std::vector<float> dense;       // [size * 13]: log(1 + max(x, 0)), 0 when empty
  std::vector<uint64_t> keys;     // sample b's keys are keys[offsets[b] .. offsets[b + 1])
  std::vector<float> values;      // one per key (1 for categorical keys)
  std::vector<uint32_t> offsets;  // [size + 1]

  void Clear() {
    size = 0;
    labels.clear();
    dense.clear();
    keys.clear();
    values.clear();
    offsets.assign(1, 0);
  }
};

}  // namespace parasol
