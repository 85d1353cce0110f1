#include "worker/model.hpp"

namespace parasol {

std::unique_ptr<Model> MakeDlrmModel(const Manifest& m, Backend* backend, uint32_t max_batch);
std::unique_ptr<Model> MakeLrModel(const Manifest& m, Backend* backend, uint32_t max_batch);
std::unique_ptr<Model> MakeFeedModel(const Manifest& m, Backend* backend, uint32_t max_batch);

Result<std::unique_ptr<Model>> Model::Create(const Manifest& manifest, Backend* backend,
                                             uint32_t max_batch) {
  std::unique_ptr<Model> model;
  if (manifest.model.kind != ModelOptions::Kind::kNone &&
      manifest.worker.compute == WorkerOptions::Compute::kNone) {
    // The tables and buffers of the same kind, and no computation (benchmarks only).
    return MakeFeedModel(manifest, backend, max_batch);
  }
  switch (manifest.model.kind) {
    case ModelOptions::Kind::kDlrm:
      if (manifest.data.format != DataOptions::Format::kCriteo) {
        return InvalidArgument(manifest.source +
                               ": model dlrm reads Criteo data (one key per field); "
                               "data.format is libsvm");
      }
      model = MakeDlrmModel(manifest, backend, max_batch);
      break;
    case ModelOptions::Kind::kLr:
      model = MakeLrModel(manifest, backend, max_batch);
      break;
    case ModelOptions::Kind::kNone:
      return InvalidArgument(manifest.source + ": key 'model.kind': no model to train");
  }
  if (model->failed_) {
    Status st = backend->Sync();
    return ResourceExhausted("the model's step buffers (batch " + std::to_string(max_batch) +
                             ") could not be allocated on the " + backend->name() + " backend" +
                             (st.ok() ? std::string() : ": " + st.message()));
  }
  return model;
}

Status Model::Finish(int slot) {
  PARASOL_RETURN_IF_ERROR(backend_->WaitMark(slot));
  if (failed_) return ResourceExhausted("the model's step buffers could not be grown");
  finished_ = slot;
  const SlotOutput& o = out_[slot];
  loss_ = o.batch ? *o.loss_sum / o.batch : 0.0;
  return Status::Ok();
}

}  // namespace parasol
