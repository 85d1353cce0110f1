#include "kernels/embedding_pool.hpp"

#include <cstring>

namespace parasol {

uint32_t BuildRowIndex(const uint32_t* indices, uint32_t keys, uint32_t unique,
                       uint32_t* row_start, uint32_t* occ, uint32_t* hot_rows) {
  // Count each row's keys into row_start[u + 1], prefix-sum, then place the keys in order.
  std::memset(row_start, 0, sizeof(uint32_t) * (size_t{unique} + 1));
  for (uint32_t j = 0; j < keys; ++j) ++row_start[indices[j] + 1];
  uint32_t hot = 0;
  for (uint32_t u = 0; u < unique; ++u) {
    if (row_start[u + 1] >= kHotRowKeys) hot_rows[hot++] = u;
    row_start[u + 1] += row_start[u];
  }
  // row_start[u] is now where row u begins; fill it forward, then shift back by one row.
  for (uint32_t j = 0; j < keys; ++j) occ[row_start[indices[j]]++] = j;
  for (uint32_t u = unique; u > 0; --u) row_start[u] = row_start[u - 1];
  row_start[0] = 0;
  return hot;
}

void EmbeddingSumPoolCpu(const float* rows, uint32_t dim, const uint32_t* indices,
                         const uint32_t* offsets, uint32_t batch, float* out) {
  for (uint32_t b = 0; b < batch; ++b) {
    float* o = out + size_t{b} * dim;
    std::memset(o, 0, sizeof(float) * dim);
    for (uint32_t j = offsets[b]; j < offsets[b + 1]; ++j) {
      const float* r = rows + size_t{indices[j]} * dim;
      for (uint32_t d = 0; d < dim; ++d) o[d] += r[d];
    }
  }
}

}  // namespace parasol
