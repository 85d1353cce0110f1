#include "worker/linear_layer.hpp"

namespace parasol {

LinearLayer::LinearLayer(Backend* backend, uint32_t in, uint32_t out, bool relu,
                         uint32_t max_batch)
    : backend_(backend),
      in_(in),
      out_(out),
      relu_(relu),
      y_(backend->Allocate(size_t{max_batch} * out)),
      dpre_(relu ? backend->Allocate(size_t{max_batch} * out) : DeviceBuffer()) {}

void LinearLayer::Bind(const float* weight, const float* bias, float* dweight, float* dbias) {
  w_ = weight;
  b_ = bias;
  dw_ = dweight;
  db_ = dbias;
}

const float* LinearLayer::Forward(const float* x, int ldx, uint32_t batch) {
  const int n = static_cast<int>(batch), o = static_cast<int>(out_), i = static_cast<int>(in_);
  backend_->GemmBiasActivation(false, true, n, o, i, x, ldx, w_, i, b_, y_.data(), o, relu_);
  return y_.data();
}

void LinearLayer::Backward(const float* x, int ldx, const float* dy, float* dx, int lddx,
                           uint32_t batch) {
  const int n = static_cast<int>(batch), o = static_cast<int>(out_), i = static_cast<int>(in_);
  // dpre = dy through the ReLU, db = its column sums (one pass); dW = dpre^T x; dx = dpre W.
  backend_->BiasActivationBackward(dpre_.data(), db_, dy, y_.data(), n, o, relu_);
  const float* dpre = relu_ ? dpre_.data() : dy;
  backend_->GemmStrided(true, false, o, i, n, 1.0f, dpre, o, x, ldx, 0.0f, dw_, i);
  if (dx) backend_->GemmStrided(false, false, n, i, o, 1.0f, dpre, o, w_, i, 0.0f, dx, lddx);
}

}  // namespace parasol
