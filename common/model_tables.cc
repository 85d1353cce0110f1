#include "common/model_tables.hpp"

#include <cmath>

#include "common/hash.hpp"
#include "common/manifest_fields.hpp"

namespace parasol {
namespace {

std::vector<DenseLayerSpec> Mlp(const std::string& prefix, uint32_t in,
                                const std::vector<uint32_t>& widths) {
  std::vector<DenseLayerSpec> layers;
  for (size_t i = 0; i < widths.size(); ++i) {
    const std::string name = prefix + "." + std::to_string(i);
    layers.push_back({name + ".weight", name + ".bias", in, widths[i]});
    in = widths[i];
  }
  return layers;
}

TableOptions DenseTableOf(const std::string& name, std::vector<uint64_t> shape, InitOptions init,
                          const ModelOptions& m, uint64_t job_seed) {
  TableOptions t;
  t.name = name;
  t.kind = TableKind::kDense;
  t.shape = std::move(shape);
  t.init = init;
  t.optimizer = m.dense_optimizer;
  t.dtype = m.dense_dtype;
  t.state_dtype = m.dense_state_dtype;
  t.seed = job_seed ^ HashBytes(name);
  return t;
}

}  // namespace

ModelLayout LayoutOf(const ModelOptions& model) {
  ModelLayout l;
  if (model.kind == ModelOptions::Kind::kLr) {
    l.sparse_table = "model.weights";
    l.sparse_dim = 1;
    l.top = Mlp("model.dense", kCriteoDenseFeatures, {1});
  } else if (model.kind == ModelOptions::Kind::kDlrm) {
    l.sparse_table = "model.embeddings";
    l.sparse_dim = model.embedding_dim;
    l.bottom = Mlp("model.bottom", kCriteoDenseFeatures, model.bottom);
    const uint32_t vectors = kCriteoSparseFields + 1;
    l.interaction_width = model.embedding_dim + vectors * (vectors - 1) / 2;
    l.top = Mlp("model.top", l.interaction_width, model.top);
  }
  return l;
}

Status AddModelTables(Manifest* manifest) {
  const ModelOptions& m = manifest->model;
  if (m.kind == ModelOptions::Kind::kNone) return Status::Ok();
  for (const TableOptions& t : manifest->tables) {
    if (t.name.rfind("model.", 0) == 0) {
      return InvalidArgument(manifest->source + ": key 'tables': the name '" + t.name +
                             "' is reserved for the model's own tables" +
                             ManifestExplainHint("tables"));
    }
  }
  const ModelLayout layout = LayoutOf(m);
  TableOptions sparse;
  sparse.name = layout.sparse_table;
  sparse.kind = TableKind::kSparse;
  sparse.dim = layout.sparse_dim;
  sparse.init.kind = m.kind == ModelOptions::Kind::kLr ? InitOptions::Kind::kZeros
                                                       : InitOptions::Kind::kUniform;
  sparse.init.scale = m.embedding_init_scale;
  sparse.optimizer = m.sparse_optimizer;
  sparse.storage = m.sparse_storage;
  sparse.dtype = m.sparse_dtype;
  sparse.state_dtype = m.sparse_state_dtype;
  sparse.seed = manifest->job.seed ^ HashBytes(sparse.name);
  manifest->tables.push_back(sparse);
  for (const auto* layers : {&layout.bottom, &layout.top}) {
    for (const DenseLayerSpec& d : *layers) {
      InitOptions glorot;
      glorot.kind = InitOptions::Kind::kUniform;
      glorot.scale = std::sqrt(6.0 / (d.in + d.out));
      InitOptions zeros;
      zeros.kind = InitOptions::Kind::kZeros;
      manifest->tables.push_back(
          DenseTableOf(d.weight_table, {d.out, d.in}, glorot, m, manifest->job.seed));
      manifest->tables.push_back(DenseTableOf(d.bias_table, {d.out}, zeros, m, manifest->job.seed));
    }
  }
  return Status::Ok();
}

}  // namespace parasol
