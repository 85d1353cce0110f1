#include "kernels/embedding_pool.hpp"

#include <cstring>

namespace parasol {

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
