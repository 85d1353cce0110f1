// LinearLayer: y = x W^T + b, optionally followed by ReLU, on a Backend. W is [out, in]
// row-major (a dense table), b is [out]. The weights and their gradients live in the model's
// step buffers (Bind); the layer's own buffers are sized for `max_batch` at construction, so a
// step allocates nothing. Inputs may have a row stride (ldx) above `in`, so that rows stay
// 16-byte aligned.
#pragma once

#include <cstdint>

#include "worker/backend.hpp"

namespace parasol {

class LinearLayer {
 public:
  LinearLayer(Backend* backend, uint32_t in, uint32_t out, bool relu, uint32_t max_batch);

  uint32_t in() const { return in_; }
  uint32_t out() const { return out_; }

  // Device pointers: weight [out * in], bias [out], and where their gradients go.
  void Bind(const float* weight, const float* bias, float* dweight, float* dbias);
  // y = act(x W^T + b) for `batch` rows of x (ldx floats apart); returns y (batch x out).
  const float* Forward(const float* x, int ldx, uint32_t batch);
  // From dy (batch x out, gradient of y): the weight and bias gradients, and dx (batch rows,
  // lddx floats apart) when dx is not null. REQUIRES: the Forward() of the same x just before.
  void Backward(const float* x, int ldx, const float* dy, float* dx, int lddx, uint32_t batch);

 private:
  Backend* backend_;
  uint32_t in_, out_;
  bool relu_;
  const float* w_ = nullptr;
  const float* b_ = nullptr;
  float* dw_ = nullptr;
  float* db_ = nullptr;
  DeviceBuffer y_, dpre_;
};

}  // namespace parasol
