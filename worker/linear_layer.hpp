// LinearLayer: y = x W^T + b, optionally followed by ReLU, on a Backend. W is [out, in]
// row-major (a dense table), b is [out]. Buffers are sized for `max_batch` at construction, so
// a step allocates nothing.
#pragma once

#include <cstdint>

#include "worker/backend.hpp"

namespace parasol {

class LinearLayer {
 public:
  LinearLayer(Backend* backend, uint32_t in, uint32_t out, bool relu, uint32_t max_batch);

  uint32_t in() const { return in_; }
  uint32_t out() const { return out_; }

  // Copies host weights [out * in] and bias [out] to the device.
  void SetParams(const float* weight, const float* bias);
  // y = act(x W^T + b) for `batch` rows of x; returns y (device, batch x out).
  const float* Forward(const float* x, uint32_t batch);
  // From dy (batch x out, gradient of y): weight and bias gradients, and dx (batch x in) when
  // dx is not null. REQUIRES: the Forward() of the same x just before.
  void Backward(const float* x, const float* dy, float* dx, uint32_t batch);
  // Host copies of the last Backward()'s gradients.
  void GradsToHost(float* dweight, float* dbias);

 private:
  Backend* backend_;
  uint32_t in_, out_;
  bool relu_;
  DeviceBuffer w_, b_, dw_, db_, y_, dpre_;
};

}  // namespace parasol
