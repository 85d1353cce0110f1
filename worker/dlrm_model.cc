// DLRM (Naumov et al. 2019) on a Backend: bottom MLP, embeddings, dot interaction, top MLP.
//
// A step's inputs sit in one buffer per slot (host memory the backend copies from directly):
// the dense weights, the features (13 per sample, padded to 16 so rows stay 16-byte aligned),
// the labels, the batch's key-to-row indices and row index (for the deterministic row
// gradients), then the rows. One upload takes the used part; the outputs (probabilities, loss,
// dense gradients, row gradients) sit in one buffer that one download brings back.
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
    counts_ = in_.Add(2 * sizeof(uint32_t));  // the step's unique rows and hot rows
    for (size_t n : sizes) in_dense_.push_back(in_.Add(n * sizeof(float)));
    x_ = in_.Add(size_t{max_batch} * kXStride * sizeof(float));
    labels_ = in_.Add(size_t{max_batch} * sizeof(float));
    indices_ = in_.Add(size_t{max_bags_} * sizeof(uint32_t));
    occ_ = in_.Add(size_t{max_bags_} * sizeof(uint32_t));
    row_start_ = in_.Add((size_t{max_bags_} + 1) * sizeof(uint32_t));
    hot_ = in_.Add((size_t{max_bags_} / kHotRowKeys + 1) * sizeof(uint32_t));
    rows_ = in_.Add(size_t{max_bags_} * dim_ * sizeof(float));
    probs_off_ = out_.Add(size_t{max_batch} * sizeof(float));
    loss_off_ = out_.Add(sizeof(double));
    for (size_t n : sizes) out_dense_.push_back(out_.Add(n * sizeof(float)));
    row_grads_off_ = out_.Add(size_t{max_bags_} * dim_ * sizeof(float));

    const bool shared = backend->SharesHostMemory();
    for (int s = 0; s < kSlots; ++s) {
      host_in_[s] = backend->AllocateHost(in_.size());
      for (size_t i = 0; i < sizes.size(); ++i) {
        dense_in_[s].emplace_back(At<float>(host_in_[s].data(), in_dense_[i]), sizes[i]);
      }
    }
    host_out_ = backend->AllocateHost(out_.size());
    if (!shared) {
      dev_in_ = backend->Allocate(in_.size() / sizeof(float) + 1);
      dev_out_ = backend->Allocate(out_.size() / sizeof(float) + 1);
    }
    for (size_t i = 0; i < sizes.size(); ++i) {
      dense_grads_.emplace_back(At<float>(host_out_.data(), out_dense_[i]), sizes[i]);
    }

    const size_t bags = max_bags_;
    offsets_ = backend->Allocate(bags + 1);
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

  float* StepRows(int slot, uint32_t /*unique*/, uint32_t /*keys*/) override {
    // unique <= keys <= max_batch x 26: the slot always has room.
    return At<float>(host_in_[slot].data(), rows_);
  }

  void Run(const Batch& batch, int slot, uint32_t unique, const uint32_t* indices,
           bool train) override {
    batch_ = batch.size;
    unique_ = unique;
    const uint32_t bags = batch_ * kFields;
    char* h = host_in_[slot].data();
    // Pack the batch into the slot: features (padded rows), labels, indices, row index.
    float* x = At<float>(h, x_);
    for (uint32_t r = 0; r < batch_; ++r) {
      std::memcpy(x + size_t{r} * kXStride, batch.dense.data() + size_t{r} * kCriteoDenseFeatures,
                  kCriteoDenseFeatures * sizeof(float));
    }
    std::memcpy(At<float>(h, labels_), batch.labels.data(), batch_ * sizeof(float));
    std::memcpy(At<uint32_t>(h, indices_), indices, bags * sizeof(uint32_t));
    uint32_t hot = 0;
    if (train) {
      hot = BuildRowIndex(indices, bags, unique, At<uint32_t>(h, row_start_),
                          At<uint32_t>(h, occ_), At<uint32_t>(h, hot_));
    }
    At<uint32_t>(h, counts_)[0] = unique;
    At<uint32_t>(h, counts_)[1] = hot;
    char* d = dev_in_.data() ? reinterpret_cast<char*>(dev_in_.data()) : h;
    backend_->Upload(d, h, rows_ + size_t{unique} * dim_ * sizeof(float));
    char* o = dev_out_.data() ? reinterpret_cast<char*>(dev_out_.data()) : host_out_.data();

    // Full batches replay a recorded graph of the step's kernels (recorded at the second full
    // batch of its kind, after the first has sized every buffer): the kernels read the counts of
    // rows from the upload, so one graph serves every step. Other batches issue them directly.
    const uint32_t max_hot = max_bags_ / kHotRowKeys + 1;
    bool ran = false;
    if (batch_ * kFields == max_bags_) {
      int& graph = graph_[train];
      if (graph < 0 && ++full_steps_[train] >= 2 && backend_->BeginGraph()) {
        Compute(d, o, train, max_bags_, max_hot);
        graph = backend_->EndGraph();
      }
      if (graph >= 0) {
        backend_->RunGraph(graph);
        ran = true;
      }
    }
    if (!ran) Compute(d, o, train, unique, hot);

    // One download: the probabilities and loss, and after training the gradients too.
    const size_t down = train ? row_grads_off_ + size_t{unique} * dim_ * sizeof(float)
                              : loss_off_ + sizeof(double);
    backend_->Download(host_out_.data(), o, down);
    char* ho = host_out_.data();
    probs_ = At<float>(ho, probs_off_);
    loss_sum_ = At<double>(ho, loss_off_);
    row_grads_ = At<float>(ho, row_grads_off_);
  }

 private:
  // The step's kernels on the device input d and output o; unique and hot bound the rows (the
  // real counts are read from the input).
  void Compute(char* d, char* o, bool train, uint32_t unique, uint32_t hot) {
    const uint32_t bags = batch_ * kFields;
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
    backend_->EmbeddingPool(e_.data(), At<float>(d, rows_), dim_, idx, nullptr, Offsets(),
                            static_cast<int>(bags), unique);
    const float* hcur = xd;
    int ld = kXStride;
    bottom_outputs_.clear();
    for (LinearLayer& l : bottom_) {
      bottom_outputs_.push_back(hcur = l.Forward(hcur, ld, batch_));
      ld = static_cast<int>(l.out());
    }
    const float* z = hcur;
    backend_->Interaction(inter_.data(), inter_ld_, z, e_.data(), batch_, kFields, dim_);
    const float* g = inter_.data();
    ld = inter_ld_;
    top_outputs_.clear();
    for (LinearLayer& l : top_) {
      top_outputs_.push_back(g = l.Forward(g, ld, batch_));
      ld = static_cast<int>(l.out());
    }
    backend_->SigmoidBce(At<float>(o, probs_off_), dlogit_.data(), At<double>(o, loss_off_), g,
                         At<float>(d, labels_), batch_);

    if (train) {
      const float* dy = dlogit_.data();
      // Top MLP, last layer first; each layer's input is the previous layer's output.
      for (size_t i = top_.size(); i-- > 0;) {
        const float* in = i == 0 ? inter_.data() : top_outputs_[i - 1];
        const int in_ld = i == 0 ? inter_ld_ : static_cast<int>(top_[i - 1].out());
        float* dx = i == 0 ? dinter_.data() : dtop_[i - 1].data();
        top_[i].Backward(in, in_ld, dy, dx, in_ld, batch_);
        dy = dx;
      }
      backend_->InteractionBackward(dz_.data(), de_.data(), dinter_.data(), inter_ld_, z,
                                    e_.data(), batch_, kFields, dim_);
      dy = dz_.data();
      for (size_t i = bottom_.size(); i-- > 0;) {
        const float* in = i == 0 ? xd : bottom_outputs_[i - 1];
        const int in_ld = i == 0 ? kXStride : static_cast<int>(bottom_[i - 1].out());
        float* dx = i == 0 ? nullptr : dbottom_[i - 1].data();
        bottom_[i].Backward(in, in_ld, dy, dx, in_ld, batch_);
        dy = dx;
      }
      backend_->EmbeddingRowGrad(At<float>(o, row_grads_off_), de_.data(), dim_,
                                 At<uint32_t>(d, row_start_), At<uint32_t>(d, occ_),
                                 At<uint32_t>(d, hot_), hot, nullptr, nullptr, unique,
                                 At<uint32_t>(d, counts_));
    }
  }

  const uint32_t* Offsets() const { return reinterpret_cast<const uint32_t*>(offsets_.data()); }

  ModelLayout layout_;
  uint32_t dim_ = 0;
  uint32_t max_bags_ = 0;
  int inter_ld_ = 0;
  RegionLayout in_, out_;
  std::vector<size_t> in_dense_, out_dense_;
  int graph_[2] = {-1, -1};       // recorded graphs: evaluation, training
  int full_steps_[2] = {0, 0};    // full batches seen of each kind
  size_t counts_ = 0;
  size_t x_ = 0, labels_ = 0, indices_ = 0, occ_ = 0, row_start_ = 0, hot_ = 0, rows_ = 0;
  size_t probs_off_ = 0, loss_off_ = 0, row_grads_off_ = 0;
  HostBuffer host_in_[kSlots];
  HostBuffer host_out_;
  DeviceBuffer dev_in_, dev_out_;
  std::vector<LinearLayer> bottom_, top_;
  std::vector<const float*> bottom_outputs_, top_outputs_;
  std::vector<DeviceBuffer> dtop_, dbottom_;
  DeviceBuffer offsets_, e_, de_, dz_, inter_, dinter_, dlogit_;
};

}  // namespace

std::unique_ptr<Model> MakeDlrmModel(const Manifest& m, Backend* backend, uint32_t max_batch) {
  return std::make_unique<DlrmModel>(m, backend, max_batch);
}

}  // namespace parasol
