#include "worker/linear_layer.hpp"

namespace parasol {

LinearLayer::LinearLayer(Backend* backend, uint32_t in, uint32_t out, bool relu,
                         uint32_t max_batch)
    : backend_(backend),
      in_(in),
      out_(out),
      relu_(relu),
      w_(backend->Allocate(size_t{in} * out)),
      b_(backend->Allocate(out)),
      dw_(backend->Allocate(size_t{in} * out)),
      db_(backend->Allocate(out)),
      y_(backend->Allocate(size_t{max_batch} * out)),
      dpre_(backend->Allocate(size_t{max_batch} * out)) {}

void LinearLayer::SetParams(const float* weight, const float* bias) {
  backend_->ToDevice(w_.data(), weight, size_t{in_} * out_);
  backend_->ToDevice(b_.data(), bias, out_);
}

const float* LinearLayer::Forward(const float* x, uint32_t batch) {
  backend_->Gemm(false, true, batch, out_, in_, 1.0f, x, w_.data(), 0.0f, y_.data());
  backend_->AddBias(y_.data(), b_.data(), batch, out_);
  if (relu_) backend_->Relu(y_.data(), y_.data(), size_t{batch} * out_);
  return y_.data();
}

void LinearLayer::Backward(const float* x, const float* dy, float* dx, uint32_t batch) {
  const float* dpre = dy;
  if (relu_) {
    backend_->ReluBackward(dpre_.data(), dy, y_.data(), size_t{batch} * out_);
    dpre = dpre_.data();
  }
  // dW = dpre^T x, db = column sums of dpre, dx = dpre W.
  backend_->Gemm(true, false, out_, in_, batch, 1.0f, dpre, x, 0.0f, dw_.data());
  backend_->BiasGrad(db_.data(), dpre, batch, out_);
  if (dx) backend_->Gemm(false, false, batch, in_, out_, 1.0f, dpre, w_.data(), 0.0f, dx);
}

void LinearLayer::GradsToHost(float* dweight, float* dbias) {
  backend_->ToHost(dweight, dw_.data(), size_t{in_} * out_);
  backend_->ToHost(dbias, db_.data(), out_);
}

}  // namespace parasol
