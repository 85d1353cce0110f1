// DLRM (Naumov et al. 2019) on a Backend: bottom MLP, embeddings, dot interaction, top MLP.
#include <cstring>

#include "common/model_tables.hpp"
#include "worker/linear_layer.hpp"
#include "worker/model.hpp"

namespace parasol {
namespace {

class DlrmModel : public Model {
 public:
  DlrmModel(const Manifest& m, Backend* backend, uint32_t max_batch)
      : backend_(backend), layout_(LayoutOf(m.model)) {
    dim_ = layout_.sparse_dim;
    const size_t bags = size_t{max_batch} * kCriteoSparseFields;
    x_ = backend->Allocate(size_t{max_batch} * kCriteoDenseFeatures);
    rows_ = backend->Allocate(bags * dim_);
    drows_ = backend->Allocate(bags * dim_);
    indices_ = backend->Allocate(bags);
    offsets_ = backend->Allocate(bags + 1);
    e_ = backend->Allocate(bags * dim_);
    de_ = backend->Allocate(bags * dim_);
    dz_ = backend->Allocate(size_t{max_batch} * dim_);
    inter_ = backend->Allocate(size_t{max_batch} * layout_.interaction_width);
    dinter_ = backend->Allocate(size_t{max_batch} * layout_.interaction_width);
    labels_ = backend->Allocate(max_batch);
    probs_dev_ = backend->Allocate(max_batch);
    dlogit_ = backend->Allocate(max_batch);
    // Every sample has exactly one key per field: bag i is key i.
    std::vector<uint32_t> offsets(bags + 1);
    for (size_t i = 0; i <= bags; ++i) offsets[i] = static_cast<uint32_t>(i);
    backend->ToDevice(offsets_.data(), reinterpret_cast<const float*>(offsets.data()), bags + 1);
    for (size_t i = 0; i < layout_.bottom.size(); ++i) {
      const DenseLayerSpec& s = layout_.bottom[i];
      bottom_.emplace_back(backend, s.in, s.out, /*relu=*/true, max_batch);  // ReLU on the output too
    }
    for (size_t i = 0; i < layout_.top.size(); ++i) {
      const DenseLayerSpec& s = layout_.top[i];
      top_.emplace_back(backend, s.in, s.out, /*relu=*/i + 1 < layout_.top.size(), max_batch);
    }
    for (size_t i = 0; i + 1 < layout_.top.size(); ++i) {
      dtop_.push_back(backend->Allocate(size_t{max_batch} * layout_.top[i].out));
    }
    for (size_t i = 0; i + 1 < layout_.bottom.size(); ++i) {
      dbottom_.push_back(backend->Allocate(size_t{max_batch} * layout_.bottom[i].out));
    }
    sparse_table_ = static_cast<uint32_t>(m.FindTable(layout_.sparse_table));
    sparse_dim_ = dim_;
    for (const auto* layers : {&layout_.bottom, &layout_.top}) {
      for (const DenseLayerSpec& s : *layers) {
        dense_tables_.push_back(static_cast<uint32_t>(m.FindTable(s.weight_table)));
        dense_tables_.push_back(static_cast<uint32_t>(m.FindTable(s.bias_table)));
        dense_params_.emplace_back(size_t{s.in} * s.out);
        dense_params_.emplace_back(s.out);
      }
    }
    dense_grads_ = dense_params_;
  }

  double Forward(const Batch& batch, const float* rows, uint32_t unique,
                 const uint32_t* indices) override {
    batch_ = batch.size;
    unique_ = unique;
    const int bags = static_cast<int>(batch_ * kCriteoSparseFields);
    size_t p = 0;
    for (auto* layers : {&bottom_, &top_}) {
      for (LinearLayer& l : *layers) {
        l.SetParams(dense_params_[p].data(), dense_params_[p + 1].data());
        p += 2;
      }
    }
    backend_->ToDevice(x_.data(), batch.dense.data(), size_t{batch_} * kCriteoDenseFeatures);
    backend_->ToDevice(rows_.data(), rows, size_t{unique} * dim_);
    backend_->ToDevice(indices_.data(), reinterpret_cast<const float*>(indices), bags);
    backend_->ToDevice(labels_.data(), batch.labels.data(), batch_);
    backend_->EmbeddingPool(e_.data(), rows_.data(), dim_, Indices(), nullptr, Offsets(), bags);
    const float* h = x_.data();
    bottom_outputs_.clear();
    for (LinearLayer& l : bottom_) bottom_outputs_.push_back(h = l.Forward(h, batch_));
    z_ = h;
    backend_->Interaction(inter_.data(), z_, e_.data(), batch_, kCriteoSparseFields, dim_);
    const float* g = inter_.data();
    top_outputs_.clear();
    for (LinearLayer& l : top_) top_outputs_.push_back(g = l.Forward(g, batch_));
    const double loss = backend_->SigmoidBce(probs_dev_.data(), dlogit_.data(), g, labels_.data(),
                                             batch_);
    probs_.resize(batch_);
    backend_->ToHost(probs_.data(), probs_dev_.data(), batch_);
    return loss;
  }

  void Backward(float* row_grads) override {
    const float* dy = dlogit_.data();
    // Top MLP, last layer first; each layer's input is the previous layer's output.
    for (size_t i = top_.size(); i-- > 0;) {
      const float* in = i == 0 ? inter_.data() : TopOutput(i - 1);
      float* dx = i == 0 ? dinter_.data() : dtop_[i - 1].data();
      top_[i].Backward(in, dy, dx, batch_);
      dy = dx;
    }
    backend_->InteractionBackward(dz_.data(), de_.data(), dinter_.data(), z_, e_.data(), batch_,
                                  kCriteoSparseFields, dim_);
    dy = dz_.data();
    for (size_t i = bottom_.size(); i-- > 0;) {
      const float* in = i == 0 ? x_.data() : BottomOutput(i - 1);
      float* dx = i == 0 ? nullptr : dbottom_[i - 1].data();
      bottom_[i].Backward(in, dy, dx, batch_);
      dy = dx;
    }
    const int bags = static_cast<int>(batch_ * kCriteoSparseFields);
    backend_->Fill(drows_.data(), 0.0f, size_t{unique_} * dim_);
    backend_->EmbeddingPoolBackward(drows_.data(), de_.data(), dim_, Indices(), nullptr,
                                    Offsets(), bags);
    backend_->ToHost(row_grads, drows_.data(), size_t{unique_} * dim_);
    size_t p = 0;
    for (auto* layers : {&bottom_, &top_}) {
      for (LinearLayer& l : *layers) {
        l.GradsToHost(dense_grads_[p].data(), dense_grads_[p + 1].data());
        p += 2;
      }
    }
  }

 private:
  const uint32_t* Indices() const { return reinterpret_cast<const uint32_t*>(indices_.data()); }
  const uint32_t* Offsets() const { return reinterpret_cast<const uint32_t*>(offsets_.data()); }
  const float* TopOutput(size_t i) { return top_outputs_[i]; }
  const float* BottomOutput(size_t i) { return bottom_outputs_[i]; }

  Backend* backend_;
  ModelLayout layout_;
  uint32_t dim_ = 0;
  uint32_t batch_ = 0;
  uint32_t unique_ = 0;
  std::vector<LinearLayer> bottom_, top_;
  std::vector<const float*> bottom_outputs_, top_outputs_;
  std::vector<DeviceBuffer> dtop_, dbottom_;
  DeviceBuffer x_, rows_, drows_, indices_, offsets_, e_, de_, dz_, inter_, dinter_, labels_,
      probs_dev_, dlogit_;
  const float* z_ = nullptr;
};

}  // namespace

std::unique_ptr<Model> MakeDlrmModel(const Manifest& m, Backend* backend, uint32_t max_batch) {
  return std::make_unique<DlrmModel>(m, backend, max_batch);
}

}  // namespace parasol
