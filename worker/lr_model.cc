// Logistic regression on the hashed sparse keys plus the 13 dense features.
#include "common/model_tables.hpp"
#include "worker/linear_layer.hpp"
#include "worker/model.hpp"

namespace parasol {
namespace {

class LrModel : public Model {
 public:
  LrModel(const Manifest& m, Backend* backend, uint32_t max_batch, uint32_t max_keys)
      : backend_(backend),
        layout_(LayoutOf(m.model)),
        dense_(backend, kCriteoDenseFeatures, 1, /*relu=*/false, max_batch) {
    x_ = backend->Allocate(size_t{max_batch} * kCriteoDenseFeatures);
    rows_ = backend->Allocate(max_keys);
    drows_ = backend->Allocate(max_keys);
    indices_ = backend->Allocate(max_keys);
    values_ = backend->Allocate(max_keys);
    offsets_ = backend->Allocate(size_t{max_batch} + 1);
    pooled_ = backend->Allocate(max_batch);
    labels_ = backend->Allocate(max_batch);
    probs_dev_ = backend->Allocate(max_batch);
    dlogit_ = backend->Allocate(max_batch);
    sparse_table_ = static_cast<uint32_t>(m.FindTable(layout_.sparse_table));
    sparse_dim_ = 1;
    dense_tables_ = {static_cast<uint32_t>(m.FindTable(layout_.top[0].weight_table)),
                     static_cast<uint32_t>(m.FindTable(layout_.top[0].bias_table))};
    dense_params_ = {std::vector<float>(kCriteoDenseFeatures), std::vector<float>(1)};
    dense_grads_ = dense_params_;
    max_keys_ = max_keys;
  }

  double Forward(const Batch& batch, const float* rows, uint32_t unique,
                 const uint32_t* indices) override {
    batch_ = batch.size;
    unique_ = unique;
    keys_ = static_cast<uint32_t>(batch.keys.size());
    if (keys_ > max_keys_) Grow(keys_);
    dense_.SetParams(dense_params_[0].data(), dense_params_[1].data());
    backend_->ToDevice(x_.data(), batch.dense.data(), size_t{batch_} * kCriteoDenseFeatures);
    backend_->ToDevice(rows_.data(), rows, unique);
    backend_->ToDevice(indices_.data(), reinterpret_cast<const float*>(indices), keys_);
    backend_->ToDevice(values_.data(), batch.values.data(), keys_);
    backend_->ToDevice(offsets_.data(), reinterpret_cast<const float*>(batch.offsets.data()),
                       batch_ + 1);
    backend_->ToDevice(labels_.data(), batch.labels.data(), batch_);
    backend_->EmbeddingPool(pooled_.data(), rows_.data(), 1, Indices(), values_.data(), Offsets(),
                            batch_);
    const float* d = dense_.Forward(x_.data(), batch_);
    // logit = pooled + dense part (the batch of outputs seen as one row of `batch_` columns).
    backend_->AddBias(pooled_.data(), d, 1, batch_);
    const double loss = backend_->SigmoidBce(probs_dev_.data(), dlogit_.data(), pooled_.data(),
                                             labels_.data(), batch_);
    probs_.resize(batch_);
    backend_->ToHost(probs_.data(), probs_dev_.data(), batch_);
    return loss;
  }

  void Backward(float* row_grads) override {
    dense_.Backward(x_.data(), dlogit_.data(), nullptr, batch_);
    dense_.GradsToHost(dense_grads_[0].data(), dense_grads_[1].data());
    backend_->Fill(drows_.data(), 0.0f, unique_);
    backend_->EmbeddingPoolBackward(drows_.data(), dlogit_.data(), 1, Indices(), values_.data(),
                                    Offsets(), batch_);
    backend_->ToHost(row_grads, drows_.data(), unique_);
  }

 private:
  const uint32_t* Indices() const { return reinterpret_cast<const uint32_t*>(indices_.data()); }
  const uint32_t* Offsets() const { return reinterpret_cast<const uint32_t*>(offsets_.data()); }
  // libsvm rows may carry more keys than expected; grow once.
  void Grow(uint32_t keys) {
    max_keys_ = keys * 2;
    rows_ = backend_->Allocate(max_keys_);
    drows_ = backend_->Allocate(max_keys_);
    indices_ = backend_->Allocate(max_keys_);
    values_ = backend_->Allocate(max_keys_);
  }

  Backend* backend_;
  ModelLayout layout_;
  LinearLayer dense_;
  uint32_t batch_ = 0, unique_ = 0, keys_ = 0, max_keys_ = 0;
  DeviceBuffer x_, rows_, drows_, indices_, values_, offsets_, pooled_, labels_, probs_dev_,
      dlogit_;
};

}  // namespace

std::unique_ptr<Model> MakeLrModel(const Manifest& m, Backend* backend, uint32_t max_batch) {
  return std::make_unique<LrModel>(m, backend, max_batch, max_batch * 64);
}

}  // namespace parasol
