// Logistic regression on the hashed sparse keys plus the 13 dense features.
//
// Step buffers as in the DLRM model (model.hpp), with the batch's bags (offsets, values, the bag
// of each key) besides. libsvm rows may carry any number of keys: a slot grows when a batch needs
// more room, before anything is pulled into it for the step. The slots share one device input
// and one device output buffer, so a step's upload waits for the kernels issued before it.
#include <cstring>

#include "common/model_tables.hpp"
#include "kernels/embedding_pool.hpp"
#include "worker/linear_layer.hpp"
#include "worker/model.hpp"

namespace parasol {
namespace {

constexpr int kXStride = 16;  // kCriteoDenseFeatures rounded up to 16-byte rows

template <typename T>
T* At(char* base, size_t offset) {
  return reinterpret_cast<T*>(base + offset);
}

class LrModel : public Model {
 public:
  LrModel(const Manifest& m, Backend* backend, uint32_t max_batch, uint32_t max_keys)
      : Model(backend),
        layout_(LayoutOf(m.model)),
        max_batch_(max_batch),
        dense_(backend, kCriteoDenseFeatures, 1, /*relu=*/false, max_batch) {
    pooled_ = backend->Allocate(max_batch);
    dlogit_ = backend->Allocate(max_batch);
    sparse_table_ = static_cast<uint32_t>(m.FindTable(layout_.sparse_table));
    sparse_dim_ = 1;
    dense_tables_ = {static_cast<uint32_t>(m.FindTable(layout_.top[0].weight_table)),
                     static_cast<uint32_t>(m.FindTable(layout_.top[0].bias_table))};
    for (int s = 0; s < kSlots; ++s) {
      Layout(s, max_keys);
      Outputs(s, max_keys);
    }
  }

  float* StepRows(int slot, uint32_t /*unique*/, uint32_t keys) override {
    if (keys > slots_[slot].max_keys) Layout(slot, keys * 2);
    if (failed_) return nullptr;
    return At<float>(slots_[slot].host.data(), slots_[slot].rows);
  }

  void Run(const Batch& batch, int slot, uint32_t unique, const uint32_t* indices,
           bool train) override {
    batch_ = batch.size;
    unique_ = unique;
    const auto keys = static_cast<uint32_t>(batch.keys.size());
    if (keys > slots_[slot].max_keys) Layout(slot, keys * 2);  // StepRows was not called
    Slot& sl = slots_[slot];
    if (keys > outs_[slot].max_keys) Outputs(slot, keys * 2);
    if (failed_) return;  // Finish() reports it
    Out& out = outs_[slot];
    const bool shared = backend_->SharesHostMemory();
    // The device buffers are shared by the slots: before one is replaced, the other slot's
    // step (which may still read it) must be done.
    if (!shared && (dev_in_.size() * sizeof(float) < sl.layout.size() ||
                    dev_out_.size() * sizeof(float) < out.layout.size())) {
      // A backend error is sticky: Finish() returns it, and the calls until then are skipped.
      if (!backend_->WaitMark(slot ^ 1).ok()) return;
      if (dev_in_.size() * sizeof(float) < sl.layout.size()) {
        dev_in_ = backend_->Allocate(sl.layout.size() / sizeof(float) + 1);
      }
      if (dev_out_.size() * sizeof(float) < out.layout.size()) {
        dev_out_ = backend_->Allocate(out.layout.size() / sizeof(float) + 1);
      }
    }
    char* h = sl.host.data();
    float* x = At<float>(h, sl.x);
    for (uint32_t r = 0; r < batch_; ++r) {
      std::memcpy(x + size_t{r} * kXStride, batch.dense.data() + size_t{r} * kCriteoDenseFeatures,
                  kCriteoDenseFeatures * sizeof(float));
    }
    std::memcpy(At<float>(h, sl.labels), batch.labels.data(), batch_ * sizeof(float));
    std::memcpy(At<uint32_t>(h, sl.offsets), batch.offsets.data(),
                (size_t{batch_} + 1) * sizeof(uint32_t));
    std::memcpy(At<float>(h, sl.values), batch.values.data(), keys * sizeof(float));
    std::memcpy(At<uint32_t>(h, sl.indices), indices, keys * sizeof(uint32_t));
    At<uint32_t>(h, sl.counts)[0] = unique;
    if (train) {
      uint32_t* bags = At<uint32_t>(h, sl.key_bags);
      for (uint32_t b = 0; b < batch_; ++b) {
        for (uint32_t j = batch.offsets[b]; j < batch.offsets[b + 1]; ++j) bags[j] = b;
      }
    }
    char* d = shared ? h : reinterpret_cast<char*>(dev_in_.data());
    backend_->Upload(d, h, sl.rows + size_t{unique} * sizeof(float));

    char* o = shared ? out.host.data() : reinterpret_cast<char*>(dev_out_.data());
    dense_.Bind(At<float>(d, sl.dense[0]), At<float>(d, sl.dense[1]), At<float>(o, out.dense[0]),
                At<float>(o, out.dense[1]));
    const uint32_t* idx = At<uint32_t>(d, sl.indices);
    const uint32_t* off = At<uint32_t>(d, sl.offsets);
    const float* values = At<float>(d, sl.values);
    backend_->EmbeddingPool(pooled_.data(), At<float>(d, sl.rows), 1, idx, values, off,
                            static_cast<int>(batch_), unique);
    const float* xd = At<float>(d, sl.x);
    const float* dense_out = dense_.Forward(xd, kXStride, batch_);
    // logit = pooled + dense part (the batch of outputs seen as one row of `batch_` columns).
    backend_->AddBias(pooled_.data(), dense_out, 1, static_cast<int>(batch_));
    backend_->SigmoidBce(At<float>(o, out.probs), dlogit_.data(), At<double>(o, out.loss),
                         pooled_.data(), At<float>(d, sl.labels), static_cast<int>(batch_));
    if (train) {
      dense_.Backward(xd, kXStride, dlogit_.data(), nullptr, 0, batch_);
      uint32_t* counts = At<uint32_t>(d, sl.counts);
      backend_->BuildRowIndex(idx, keys, unique, U32(row_start_), U32(occ_), U32(hot_), counts);
      backend_->EmbeddingRowGrad(At<float>(o, out.row_grads), dlogit_.data(), 1, U32(row_start_),
                                 U32(occ_), U32(hot_), keys / kHotRowKeys + 1,
                                 At<uint32_t>(d, sl.key_bags), values, unique, counts);
    }
    const size_t down = train ? out.row_grads + size_t{unique} * sizeof(float)
                              : out.loss + sizeof(double);
    backend_->Download(out.host.data(), o, down);
    backend_->Mark(slot);
    char* ho = out.host.data();
    SlotOutput& so = out_[slot];
    so.probs = At<float>(ho, out.probs);
    so.loss_sum = At<double>(ho, out.loss);
    so.row_grads = At<float>(ho, out.row_grads);
    so.batch = batch_;
    so.unique = unique;
  }

 private:
  struct Slot {
    uint32_t max_keys = 0;
    RegionLayout layout;
    size_t counts = 0;
    size_t dense[2] = {0, 0};
    size_t x = 0, labels = 0, offsets = 0, values = 0, indices = 0, key_bags = 0, rows = 0;
    HostBuffer host;
  };
  struct Out {
    uint32_t max_keys = 0;
    RegionLayout layout;
    size_t probs = 0, loss = 0, dense[2] = {0, 0}, row_grads = 0;
    HostBuffer host;
  };

  static uint32_t* U32(const DeviceBuffer& b) { return reinterpret_cast<uint32_t*>(b.data()); }

  // (Re)lays out slot s for max_keys keys, keeping the dense weights already pulled into it.
  void Layout(int s, uint32_t max_keys) {
    Slot next;
    next.max_keys = max_keys;
    RegionLayout& l = next.layout;
    next.counts = l.Add(2 * sizeof(uint32_t));
    next.dense[0] = l.Add(kCriteoDenseFeatures * sizeof(float));
    next.dense[1] = l.Add(sizeof(float));
    next.x = l.Add(size_t{max_batch_} * kXStride * sizeof(float));
    next.labels = l.Add(size_t{max_batch_} * sizeof(float));
    next.offsets = l.Add((size_t{max_batch_} + 1) * sizeof(uint32_t));
    next.values = l.Add(size_t{max_keys} * sizeof(float));
    next.indices = l.Add(size_t{max_keys} * sizeof(uint32_t));
    next.key_bags = l.Add(size_t{max_keys} * sizeof(uint32_t));
    next.rows = l.Add(size_t{max_keys} * sizeof(float));
    next.host = backend_->AllocateHost(l.size());
    if (!next.host.data()) {
      failed_ = true;
      return;
    }
    Slot& old = slots_[s];
    if (old.host.data()) {
      std::memcpy(next.host.data() + next.dense[0], old.host.data() + old.dense[0],
                  kCriteoDenseFeatures * sizeof(float));
      std::memcpy(next.host.data() + next.dense[1], old.host.data() + old.dense[1], sizeof(float));
    }
    old = std::move(next);
    dense_in_[s] = {std::span<float>(At<float>(old.host.data(), old.dense[0]), kCriteoDenseFeatures),
                    std::span<float>(At<float>(old.host.data(), old.dense[1]), 1)};
  }

  // (Re)lays out slot s's outputs, and the row index scratch, for max_keys keys.
  void Outputs(int s, uint32_t max_keys) {
    Out next;
    next.max_keys = max_keys;
    RegionLayout& l = next.layout;
    next.probs = l.Add(size_t{max_batch_} * sizeof(float));
    next.loss = l.Add(sizeof(double));
    next.dense[0] = l.Add(kCriteoDenseFeatures * sizeof(float));
    next.dense[1] = l.Add(sizeof(float));
    next.row_grads = l.Add(size_t{max_keys} * sizeof(float));
    next.host = backend_->AllocateHost(l.size());
    if (!next.host.data()) {
      failed_ = true;
      return;
    }
    outs_[s] = std::move(next);
    out_[s].dense_grads = {
        std::span<const float>(At<float>(outs_[s].host.data(), outs_[s].dense[0]),
                               kCriteoDenseFeatures),
        std::span<const float>(At<float>(outs_[s].host.data(), outs_[s].dense[1]), 1)};
    if (occ_.size() < max_keys) {
      // The other slot's step may still use them. A backend error is sticky: Finish() returns
      // it.
      if (!backend_->WaitMark(s ^ 1).ok()) return;
      row_start_ = backend_->Allocate(size_t{max_keys} + 1);
      occ_ = backend_->Allocate(max_keys);
      hot_ = backend_->Allocate(max_keys / kHotRowKeys + 1);
    }
  }

  ModelLayout layout_;
  uint32_t max_batch_;
  LinearLayer dense_;
  uint32_t batch_ = 0, unique_ = 0;
  Slot slots_[kSlots];
  Out outs_[kSlots];
  DeviceBuffer dev_in_, dev_out_, pooled_, dlogit_, row_start_, occ_, hot_;
};

}  // namespace

std::unique_ptr<Model> MakeLrModel(const Manifest& m, Backend* backend, uint32_t max_batch) {
  return std::make_unique<LrModel>(m, backend, max_batch, max_batch * 64);
}

}  // namespace parasol
