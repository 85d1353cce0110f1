#include <cub/device/device_radix_sort.cuh>
#include <cub/device/device_select.cuh>
#include <cuda_runtime.h>
#include <thrust/iterator/counting_iterator.h>

#include "kernels/cuda_check.hpp"
#include "kernels/embedding_pool.hpp"
#include "kernels/row_index.hpp"

namespace parasol {
namespace {

constexpr int kThreads = 256;

__global__ void IotaKernel(uint32_t* out, uint32_t n) {
  const uint32_t i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = i;
}

// Where the sorted rows change, a row starts; the last key closes the last row.
__global__ void RowStartKernel(uint32_t* row_start, const uint32_t* sorted, uint32_t keys,
                               const uint32_t* counts) {
  const uint32_t p = blockIdx.x * blockDim.x + threadIdx.x;
  if (p >= keys) return;
  const uint32_t r = sorted[p];
  if (p == 0 || sorted[p - 1] != r) row_start[r] = p;
  if (p == keys - 1) row_start[counts[0]] = keys;
}

struct IsHot {
  const uint32_t* row_start;
  const uint32_t* counts;
  __device__ bool operator()(uint32_t u) const {
    return u < counts[0] && row_start[u + 1] - row_start[u] >= kHotRowKeys;
  }
};

uint32_t Bits(uint32_t n) {
  uint32_t b = 1;
  while (b < 32 && (uint64_t{1} << b) < n) ++b;
  return b;
}

size_t Align(size_t n) { return (n + 255) / 256 * 256; }

// Temporary storage CUB asks for, for the largest problem.
size_t CubBytes(uint32_t max_keys, uint32_t max_rows) {
  size_t sort = 0, select = 0;
  cub::DeviceRadixSort::SortPairs(nullptr, sort, static_cast<const uint32_t*>(nullptr),
                                  static_cast<uint32_t*>(nullptr),
                                  static_cast<const uint32_t*>(nullptr),
                                  static_cast<uint32_t*>(nullptr), max_keys, 0, 32);
  cub::DeviceSelect::If(nullptr, select, thrust::counting_iterator<uint32_t>(0),
                        static_cast<uint32_t*>(nullptr), static_cast<uint32_t*>(nullptr),
                        max_rows, IsHot{nullptr, nullptr});
  return std::max(sort, select);
}

}  // namespace

size_t RowIndexScratchBytes(uint32_t max_keys, uint32_t max_rows) {
  return 2 * Align(size_t{max_keys} * sizeof(uint32_t)) + Align(CubBytes(max_keys, max_rows));
}

Status BuildRowIndexCuda(const uint32_t* indices, uint32_t keys, uint32_t max_rows,
                         uint32_t* row_start, uint32_t* occ, uint32_t* hot_rows,
                         uint32_t* counts, void* scratch, size_t scratch_bytes, void* stream) {
  const auto s = static_cast<cudaStream_t>(stream);
  if (keys == 0 || max_rows == 0) {
    PARASOL_CUDA_CHECK(cudaMemsetAsync(counts + 1, 0, sizeof(uint32_t), s));
    PARASOL_CUDA_CHECK(cudaMemsetAsync(row_start, 0, sizeof(uint32_t), s));
    return Status::Ok();
  }
  if (scratch_bytes < RowIndexScratchBytes(keys, max_rows)) {
    return Internal("row index: scratch too small");
  }
  char* p = static_cast<char*>(scratch);
  auto* positions = reinterpret_cast<uint32_t*>(p);
  auto* sorted = reinterpret_cast<uint32_t*>(p + Align(size_t{keys} * sizeof(uint32_t)));
  void* temp = p + 2 * Align(size_t{keys} * sizeof(uint32_t));
  size_t temp_bytes = scratch_bytes - 2 * Align(size_t{keys} * sizeof(uint32_t));
  const unsigned blocks = (keys + kThreads - 1) / kThreads;
  IotaKernel<<<blocks, kThreads, 0, s>>>(positions, keys);
  PARASOL_CUDA_CHECK_LAUNCH("IotaKernel");
  // LSD radix sort is stable: each row's key positions stay ascending.
  PARASOL_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(temp, temp_bytes, indices, sorted, positions,
                                                     occ, keys, 0, Bits(max_rows), s));
  RowStartKernel<<<blocks, kThreads, 0, s>>>(row_start, sorted, keys, counts);
  PARASOL_CUDA_CHECK_LAUNCH("RowStartKernel");
  temp_bytes = scratch_bytes - 2 * Align(size_t{keys} * sizeof(uint32_t));
  PARASOL_CUDA_CHECK(cub::DeviceSelect::If(temp, temp_bytes, thrust::counting_iterator<uint32_t>(0),
                                           hot_rows, counts + 1, max_rows,
                                           IsHot{row_start, counts}, s));
  return Status::Ok();
}

}  // namespace parasol
