#include "kernels/cuda_check.hpp"

#ifdef PARASOL_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

namespace parasol {

#ifdef PARASOL_HAVE_CUDA
Status CudaStatus(int error, const char* expr, const char* file, int line) {
  const auto err = static_cast<cudaError_t>(error);
  return Internal(std::string(file) + ":" + std::to_string(line) + ": " + expr + " failed: " +
                  cudaGetErrorName(err) + ": " + cudaGetErrorString(err));
}

std::string CudaUnavailableReason() {
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) return std::string("no CUDA device: ") + cudaGetErrorString(err);
  if (count == 0) return "no CUDA device present";
  return "";
}
#else
std::string CudaUnavailableReason() { return "this build has no CUDA support (nvcc not found)"; }
#endif

bool CudaDeviceAvailable() { return CudaUnavailableReason().empty(); }

}  // namespace parasol
