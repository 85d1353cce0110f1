// DLRM (Naumov et al. 2019) on a Backend: bottom MLP, embeddings, dot interaction, top MLP.
//
// A step's inputs sit in one buffer per slot (host memory the backend copies from directly):
// the counts of rows, the dense weights, the features (13 per sample, padded to 16 so rows stay
// 16-byte aligned), the labels, the batch's key-to-row indices, then the rows. One upload takes
// the used part into the slot's device buffer. The kernels build the batch's row index on the
// device (for the deterministic row gradients) and write the outputs (probabilities, loss,
// dense gradients, row gradients) into the slot's device output buffer, which one download
// brings back. Full batches replay a recorded graph of the step's kernels.
#include <cstring>

#include "common/model_tables.hpp"
#include "kernels/embedding_pool.hpp"
#include "worker/linear_layer.hpp"
#include "worker/model.hpp"

namespace parasol {
namespace {

constexpr uint32_t kFields = kCriteoSparseFields;
constexpr int kXStride = 16;  // kCriteoDenseFeatures rounded up to 16-byte rows

template <typename T>
T* At(char* base, size_t offset) {
  return reinterpret_cast<T*>(base + offset);
}

class DlrmModel : public Model {
 public:
  DlrmModel(const Manifest& m, Backend* backend, uint32_t max_batch)
      : Model(backend), layout_(LayoutOf(m.model)) {
    dim_ = layout_.sparse_dim;
    sparse_dim_ = dim_;
    max_bags_ = max_batch * kFields;
    inter_ld_ = static_cast<int>((layout_.interaction_width + 3) / 4 * 4);
    sparse_table_ = static_cast<uint32_t>(m.FindTable(layout_.sparse_table));
    std::vector<size_t> sizes;
    for (const auto* layers : {&layout_.bottom, &layout_.top}) {
      for (const DenseLayerSpec& s : *layers) {
        dense_tables_.push_back(static_cast<uint32_t>(m.FindTable(s.weight_table)));
        dense_tables_.push_back(static_cast<uint32_t>(m.FindTable(s.bias_table)));
        sizes.push_back(size_t{s.in} * s.out);
        sizes.push_back(s.out);
      }
    }
    // The input and output buffers' layouts.
    counts_ = in_.Add(2 * sizeof(uint32_t));  // the step's rows, then (set on the device) hot rows
    for (size_t n : sizes) in_dense_.push_back(in_.Add(n * sizeof(float)));
    x_ = in_.Add(size_t{max_batch} * kXStride * sizeof(float));
    labels_ = in_.Add(size_t{max_batch} * sizeof(float));
    indices_ = in_.Add(size_t{max_bags_} * sizeof(uint32_t));
    rows_ = in_.Add(size_t{max_bags_} * dim_ * sizeof(float));
    probs_off_ = out_layout_.Add(size_t{max_batch} * sizeof(float));
    loss_off_ = out_layout_.Add(sizeof(double));
    for (size_t n : sizes) out_dense_.push_back(out_layout_.Add(n * sizeof(float)));
    row_grads_off_ = out_layout_.Add(size_t{max_bags_} * dim_ * sizeof(float));

    const bool shared = backend->SharesHostMemory();
    for (int s = 0; s < kSlots; ++s) {
      host_in_[s] = backend->AllocateHost(in_.size());
      host_out_[s] = backend->AllocateHost(out_layout_.size());
      if (!host_in_[s].data() || !host_out_[s].data()) {
        failed_ = true;  // Model::Create reports it
        return;
      }
      if (!shared) {
        dev_in_[s] = backend->Allocate(in_.size() / sizeof(float) + 1);
        dev_out_[s] = backend->Allocate(out_layout_.size() / sizeof(float) + 1);
      }
      for (size_t i = 0; i < sizes.size(); ++i) {
        dense_in_[s].emplace_back(At<float>(host_in_[s].data(), in_dense_[i]), sizes[i]);
        out_[s].dense_grads.emplace_back(At<float>(host_out_[s].data(), out_dense_[i]), sizes[i]);
      }
    }

    const size_t bags = max_bags_;
    offsets_ = backend->Allocate(bags + 1);
    row_start_ = backend->Allocate(bags + 1);
    occ_ = backend->Allocate(bags);
    hot_ = backend->Allocate(bags / kHotRowKeys + 1);
    e_ = backend->Allocate(bags * dim_);
    de_ = backend->Allocate(bags * dim_);
    dz_ = backend->Allocate(size_t{max_batch} * dim_);
    inter_ = backend->Allocate(size_t{max_batch} * inter_ld_);
    dinter_ = backend->Allocate(size_t{max_batch} * inter_ld_);
    dlogit_ = backend->Allocate(max_batch);
    // Every sample has exactly one key per field: bag i is key i (set once).
    std::vector<uint32_t> offsets(bags + 1);
    for (size_t i = 0; i <= bags; ++i) offsets[i] = static_cast<uint32_t>(i);
    backend->ToDevice(offsets_.data(), reinterpret_cast<const float*>(offsets.data()), bags + 1);
    for (const DenseLayerSpec& s : layout_.bottom) {
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
  }

  ~DlrmModel() override {
    for (auto& kinds : graph_) {
      for (int g : kinds) backend_->ReleaseGraph(g);
    }
  }

  float* StepRows(int slot, uint32_t /*unique*/, uint32_t /*keys*/) override {
    // unique <= keys <= max_batch x 26: the slot always has room.
    return At<float>(host_in_[slot].data(), rows_);
  }

  void Run(const Batch& batch, int slot, uint32_t unique, const uint32_t* indices,
           bool train) override {
    const uint32_t rows = batch.size;
    const uint32_t bags = rows * kFields;
    char* h = host_in_[slot].data();
    // Pack the batch into the slot: counts, features (padded rows), labels, indices.
    At<uint32_t>(h, counts_)[0] = unique;
    float* x = At<float>(h, x_);
    for (uint32_t r = 0; r < rows; ++r) {
      std::memcpy(x + size_t{r} * kXStride, batch.dense.data() + size_t{r} * kCriteoDenseFeatures,
                  kCriteoDenseFeatures * sizeof(float));
    }
    std::memcpy(At<float>(h, labels_), batch.labels.data(), rows * sizeof(float));
    std::memcpy(At<uint32_t>(h, indices_), indices, bags * sizeof(uint32_t));
    char* d = dev_in_[slot].data() ? reinterpret_cast<char*>(dev_in_[slot].data()) : h;
    char* o = dev_out_[slot].data() ? reinterpret_cast<char*>(dev_out_[slot].data())
                                    : host_out_[slot].data();
    // The upload waits only for this slot's last step: it overlaps the other slot's.
    backend_->Upload(d, h, rows_ + size_t{unique} * dim_ * sizeof(float), slot);

    // Full batches replay a recorded graph of the slot's kernels (recorded at its second full
    // batch of the kind, after the first has sized every scratch buffer): the kernels read the
    // counts of rows from the upload, so one graph serves every step. Other batches issue them
    // directly.
    bool ran = false;
    if (bags == max_bags_ && !backend_->profiling()) {  // profiling times each kernel
      int& graph = graph_[slot][train];
      if (graph == kNoGraph && ++full_steps_[slot][train] >= 2 && backend_->BeginGraph()) {
        Compute(d, o, rows, train, max_bags_);
        graph = backend_->EndGraph();
        if (graph < 0) graph = kGraphFailed;  // run directly from now on
      }
      if (graph >= 0) {
        ran = backend_->RunGraph(graph);
        if (!ran) graph = kNoGraph;  // dropped by the backend: record it again
      }
    }
    if (!ran) Compute(d, o, rows, train, unique);

    // One download: the probabilities and loss, and after training the gradients too.
    const size_t down = train ? row_grads_off_ + size_t{unique} * dim_ * sizeof(float)
                              : loss_off_ + sizeof(double);
    backend_->Download(host_out_[slot].data(), o, down);
    backend_->Mark(slot);
    char* ho = host_out_[slot].data();
    SlotOutput& out = out_[slot];
    out.probs = At<float>(ho, probs_off_);
    out.loss_sum = At<double>(ho, loss_off_);
    out.row_grads = At<float>(ho, row_grads_off_);
    out.batch = rows;
    out.unique = unique;
  }

 private:
  // The step's kernels on the device input d and output o for a batch of `rows` samples;
  // max_rows bounds the rows of the embedding table (the real count is read from the input).
  void Compute(char* d, char* o, uint32_t rows, bool train, uint32_t max_rows) {
    const uint32_t bags = rows * kFields;
    size_t p = 0;
    for (auto* layers : {&bottom_, &top_}) {
      for (LinearLayer& l : *layers) {
        l.Bind(At<float>(d, in_dense_[p]), At<float>(d, in_dense_[p + 1]),
               At<float>(o, out_dense_[p]), At<float>(o, out_dense_[p + 1]));
        p += 2;
      }
    }
    const float* xd = At<float>(d, x_);
    const uint32_t* idx = At<uint32_t>(d, indices_);
    uint32_t* counts = At<uint32_t>(d, counts_);
    if (train) {
      backend_->BuildRowIndex(idx, bags, max_rows, U32(row_start_), U32(occ_), U32(hot_), counts);
    }
    backend_->EmbeddingPool(e_.data(), At<float>(d, rows_), dim_, idx, nullptr, U32(offsets_),
                            static_cast<int>(bags), max_rows);
    const float* hcur = xd;
    int ld = kXStride;
    bottom_outputs_.clear();
    for (LinearLayer& l : bottom_) {
      bottom_outputs_.push_back(hcur = l.Forward(hcur, ld, rows));
      ld = static_cast<int>(l.out());
    }
    const float* z = hcur;
    backend_->Interaction(inter_.data(), inter_ld_, z, e_.data(), rows, kFields, dim_);
    const float* g = inter_.data();
    ld = inter_ld_;
    top_outputs_.clear();
    for (LinearLayer& l : top_) {
      top_outputs_.push_back(g = l.Forward(g, ld, rows));
      ld = static_cast<int>(l.out());
    }
    backend_->SigmoidBce(At<float>(o, probs_off_), dlogit_.data(), At<double>(o, loss_off_), g,
                         At<float>(d, labels_), rows);
    if (!train) return;
    const float* dy = dlogit_.data();
    // Top MLP, last layer first; each layer's input is the previous layer's output.
    for (size_t i = top_.size(); i-- > 0;) {
      const float* in = i == 0 ? inter_.data() : top_outputs_[i - 1];
      const int in_ld = i == 0 ? inter_ld_ : static_cast<int>(top_[i - 1].out());
      float* dx = i == 0 ? dinter_.data() : dtop_[i - 1].data();
      top_[i].Backward(in, in_ld, dy, dx, in_ld, rows);
      dy = dx;
    }
    backend_->InteractionBackward(dz_.data(), de_.data(), dinter_.data(), inter_ld_, z, e_.data(),
                                  rows, kFields, dim_);
    dy = dz_.data();
    for (size_t i = bottom_.size(); i-- > 0;) {
      const float* in = i == 0 ? xd : bottom_outputs_[i - 1];
      const int in_ld = i == 0 ? kXStride : static_cast<int>(bottom_[i - 1].out());
      float* dx = i == 0 ? nullptr : dbottom_[i - 1].data();
      bottom_[i].Backward(in, in_ld, dy, dx, in_ld, rows);
      dy = dx;
    }
    // Hot rows have kHotRowKeys keys or more each, so there are at most bags / kHotRowKeys.
    backend_->EmbeddingRowGrad(At<float>(o, row_grads_off_), de_.data(), dim_, U32(row_start_),
                               U32(occ_), U32(hot_), bags / kHotRowKeys + 1, nullptr, nullptr,
                               max_rows, counts);
  }

  static uint32_t* U32(const DeviceBuffer& b) { return reinterpret_cast<uint32_t*>(b.data()); }

  ModelLayout layout_;
  uint32_t dim_ = 0;
  uint32_t max_bags_ = 0;
  int inter_ld_ = 0;
  RegionLayout in_, out_layout_;
  std::vector<size_t> in_dense_, out_dense_;
  size_t counts_ = 0, x_ = 0, labels_ = 0, indices_ = 0, rows_ = 0;
  size_t probs_off_ = 0, loss_off_ = 0, row_grads_off_ = 0;
  HostBuffer host_in_[kSlots], host_out_[kSlots];
  DeviceBuffer dev_in_[kSlots], dev_out_[kSlots];
  static constexpr int kNoGraph = -1, kGraphFailed = -2;
  // Recorded graphs per slot: evaluation, training.
  int graph_[kSlots][2] = {{kNoGraph, kNoGraph}, {kNoGraph, kNoGraph}};
  int full_steps_[kSlots][2] = {};               // full batches seen per slot and kind
  std::vector<LinearLayer> bottom_, top_;
  std::vector<const float*> bottom_outputs_, top_outputs_;
  std::vector<DeviceBuffer> dtop_, dbottom_;
  DeviceBuffer offsets_, row_start_, occ_, hot_, e_, de_, dz_, inter_, dinter_, dlogit_;
};

}  // namespace

std::unique_ptr<Model> MakeDlrmModel(const Manifest& m, Backend* backend, uint32_t max_batch) {
  return std::make_unique<DlrmModel>(m, backend, max_batch);
}

}  // namespace parasol
