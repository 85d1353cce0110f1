// Checking for every CUDA runtime call and kernel launch: a failure becomes a Status that names
// the file, line and expression, never an abort.
#pragma once

#include <string>

#include "common/status.hpp"

namespace parasol {

// True when the CUDA runtime is compiled in and at least one device is present.
bool CudaDeviceAvailable();
// Why no device can be used ("built without CUDA", "no CUDA device: ..."), or "".
std::string CudaUnavailableReason();

#ifdef PARASOL_HAVE_CUDA
// Returns a Status for a cudaError_t value (as int, to keep CUDA headers out of this header).
Status CudaStatus(int error, const char* expr, const char* file, int line);
#endif

}  // namespace parasol

#ifdef PARASOL_HAVE_CUDA
#define PARASOL_CUDA_CHECK(expr)                                                      \
  do {                                                                                \
    const int _err = static_cast<int>(expr);                                          \
    if (_err != 0) return ::parasol::CudaStatus(_err, #expr, __FILE__, __LINE__);     \
  } while (0)
// After a kernel launch: the launch error, if any, naming the kernel and the launching line.
#define PARASOL_CUDA_CHECK_LAUNCH(name)                                                 \
  do {                                                                                  \
    const int _err = static_cast<int>(cudaGetLastError());                              \
    if (_err != 0) return ::parasol::CudaStatus(_err, "launch of " name, __FILE__, __LINE__); \
  } while (0)
#endif
