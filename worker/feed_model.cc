// The model of worker.compute: none (benchmarks only): the tables and the step buffers of the
// manifest's model kind, and no computation. Each step's gradients are a fixed pattern of the
// shapes the model's would have (a row gradient for each of the step's rows, one for each dense
// element), so the worker pulls, pushes and ticks exactly as with the model, and the shards apply
// updates of the same sizes. Its rate is what the data and parameter-server path can feed a
// device, with the device infinitely fast.
#include <algorithm>
#include <cmath>
#include <vector>

#include "common/model_tables.hpp"
#include "worker/model.hpp"

namespace parasol {
namespace {

// A small gradient that is not the same for every element (so that no optimizer's arithmetic
// is trivially short), and the same at every step.
float Pattern(size_t i) { return 1e-4f * static_cast<float>(static_cast<int>(i % 7) - 3); }

void FillPattern(std::vector<float>& v, size_t from) {
  for (size_t i = from; i < v.size(); ++i) v[i] = Pattern(i);
}

class FeedModel : public Model {
 public:
  FeedModel(const Manifest& m, Backend* backend, uint32_t max_batch) : Model(backend) {
    const ModelLayout layout = LayoutOf(m.model);
    sparse_table_ = static_cast<uint32_t>(m.FindTable(layout.sparse_table));
    sparse_dim_ = layout.sparse_dim;
    std::vector<size_t> sizes;
    for (const auto* layers : {&layout.bottom, &layout.top}) {
      for (const DenseLayerSpec& s : *layers) {
        dense_tables_.push_back(static_cast<uint32_t>(m.FindTable(s.weight_table)));
        dense_tables_.push_back(static_cast<uint32_t>(m.FindTable(s.bias_table)));
        sizes.push_back(size_t{s.in} * s.out);
        sizes.push_back(s.out);
      }
    }
    for (int s = 0; s < kSlots; ++s) {
      Slot& sl = slots_[s];
      sl.dense_in.resize(sizes.size());
      sl.dense_grads.resize(sizes.size());
      for (size_t i = 0; i < sizes.size(); ++i) {
        sl.dense_in[i].assign(sizes[i], 0.0f);
        sl.dense_grads[i].resize(sizes[i]);
        FillPattern(sl.dense_grads[i], 0);
        dense_in_[s].emplace_back(sl.dense_in[i]);
        out_[s].dense_grads.emplace_back(sl.dense_grads[i]);
      }
      sl.probs.assign(max_batch, 0.5f);
    }
  }

  float* StepRows(int slot, uint32_t unique, uint32_t keys) override {
    // The model kind's rows for the step: one per unique key (dlrm), or per key (lr).
    std::vector<float>& rows = slots_[slot].rows;
    const size_t need = size_t{std::max(unique, keys)} * sparse_dim_;
    if (rows.size() < need) rows.resize(need);
    return rows.data();
  }

  void Run(const Batch& batch, int slot, uint32_t unique, const uint32_t* /*indices*/,
           bool /*train*/) override {
    Slot& sl = slots_[slot];
    const size_t grads = size_t{unique} * sparse_dim_;
    if (sl.row_grads.size() < grads) {
      const size_t had = sl.row_grads.size();
      sl.row_grads.resize(grads);
      FillPattern(sl.row_grads, had);
    }
    if (sl.probs.size() < batch.size) sl.probs.resize(batch.size, 0.5f);
    sl.loss_sum = std::log(2.0) * batch.size;  // the loss of a probability of 0.5
    SlotOutput& out = out_[slot];
    out.probs = sl.probs.data();
    out.row_grads = sl.row_grads.data();
    out.loss_sum = &sl.loss_sum;
    out.batch = batch.size;
    out.unique = unique;
  }

 private:
  struct Slot {
    std::vector<std::vector<float>> dense_in, dense_grads;
    std::vector<float> rows, row_grads, probs;
    double loss_sum = 0;
  };
  Slot slots_[kSlots];
};

}  // namespace

std::unique_ptr<Model> MakeFeedModel(const Manifest& m, Backend* backend, uint32_t max_batch) {
  return std::make_unique<FeedModel>(m, backend, max_batch);
}

}  // namespace parasol
