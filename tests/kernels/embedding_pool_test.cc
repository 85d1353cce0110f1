// The embedding pooling kernel against its CPU reference. Needs a CUDA device: skips without.
#include <gtest/gtest.h>

#include <random>
#include <vector>

#include "kernels/cuda_check.hpp"
#include "kernels/embedding_pool.hpp"

#ifdef PARASOL_HAVE_CUDA
#include <cuda_runtime.h>
#endif

namespace parasol {
namespace {

TEST(EmbeddingPoolCpuTest, SumsTheRowsOfEachBag) {
  const std::vector<float> rows = {1, 2, 10, 20, 100, 200};  // 3 rows of dim 2
  const std::vector<uint32_t> indices = {0, 2, 1, 1};
  const std::vector<uint32_t> offsets = {0, 2, 2, 4};  // bags {0,2}, {}, {1,1}
  std::vector<float> out(6, -1);
  EmbeddingSumPoolCpu(rows.data(), 2, indices.data(), offsets.data(), 3, out.data());
  EXPECT_EQ(out, (std::vector<float>{101, 202, 0, 0, 20, 40}));
}

TEST(EmbeddingPoolGpuTest, MatchesTheCpuReference) {
  if (!CudaDeviceAvailable()) GTEST_SKIP() << CudaUnavailableReason();
#ifdef PARASOL_HAVE_CUDA
  const uint32_t dim = 16, unique = 5000, batch = 4096;
  std::mt19937 rng(1);
  std::vector<float> rows(size_t{unique} * dim);
  for (auto& v : rows) v = std::uniform_real_distribution<float>(-1, 1)(rng);
  std::vector<uint32_t> offsets(batch + 1, 0), indices;
  for (uint32_t b = 0; b < batch; ++b) {
    const uint32_t n = rng() % 30;
    for (uint32_t j = 0; j < n; ++j) indices.push_back(rng() % unique);
    offsets[b + 1] = static_cast<uint32_t>(indices.size());
  }
  std::vector<float> want(size_t{batch} * dim);
  EmbeddingSumPoolCpu(rows.data(), dim, indices.data(), offsets.data(), batch, want.data());

  float *d_rows, *d_out;
  uint32_t *d_idx, *d_off;
  ASSERT_EQ(cudaMalloc(&d_rows, rows.size() * 4), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&d_out, want.size() * 4), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&d_idx, indices.size() * 4 + 4), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&d_off, offsets.size() * 4), cudaSuccess);
  cudaMemcpy(d_rows, rows.data(), rows.size() * 4, cudaMemcpyHostToDevice);
  cudaMemcpy(d_idx, indices.data(), indices.size() * 4, cudaMemcpyHostToDevice);
  cudaMemcpy(d_off, offsets.data(), offsets.size() * 4, cudaMemcpyHostToDevice);
  cudaMemset(d_out, 0xff, want.size() * 4);  // poison: NaN wherever the kernel did not write
  Status st = EmbeddingSumPoolCuda(d_rows, dim, d_idx, d_off, batch, d_out, nullptr);
  ASSERT_TRUE(st.ok()) << st.ToString();
  std::vector<float> got(want.size());
  ASSERT_EQ(cudaMemcpy(got.data(), d_out, got.size() * 4, cudaMemcpyDeviceToHost), cudaSuccess);
  cudaFree(d_rows);
  cudaFree(d_out);
  cudaFree(d_idx);
  cudaFree(d_off);
  for (size_t i = 0; i < want.size(); ++i) {
    ASSERT_NEAR(got[i], want[i], 1e-5 * (1 + std::abs(want[i]))) << "element " << i;
  }
#endif
}

}  // namespace
}  // namespace parasol
