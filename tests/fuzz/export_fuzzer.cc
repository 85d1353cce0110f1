// libFuzzer target for the loader of an exported model folder (LoadExportedModel, as
// `parasol compare-models` runs it): the bytes are the folder's files. Input layout: u16
// length of model.json, u16 length of emb.rows, then model.json, emb.rows, and the rest is
// w.f32 (lengths past the end are cut short). The job's tables are fixed: sparse `emb` (dim 2)
// and dense `w` (shape [3]). A loaded model must hold what its files promise: every table, the
// dense tensor whole, sparse rows of the table's dim; a refusal says why and names the folder.
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>

#include "common/manifest.hpp"
#include "server/model_export.hpp"

namespace {

void Require(bool promise) {
  if (!promise) std::abort();
}

const parasol::Manifest& FuzzManifest() {
  static const parasol::Manifest m = *parasol::ParseManifest(
      "cluster: {servers: [127.0.0.1:7000]}\n"
      "tables:\n  - {name: emb, dim: 2}\n  - {name: w, kind: dense, shape: [3]}\n",
      "fuzz.yaml");
  return m;
}

uint16_t Length(const uint8_t* p) { return static_cast<uint16_t>(p[0] | (p[1] << 8)); }

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 4) return 0;
  const char* p = reinterpret_cast<const char*>(data) + 4;
  size_t left = size - 4;
  std::map<std::string, std::string> files;
  for (const auto& [name, length] :
       {std::pair<const char*, size_t>{"model.json", Length(data)}, {"emb.rows", Length(data + 2)}}) {
    const size_t n = length < left ? length : left;
    files[name].assign(p, n);
    p += n;
    left -= n;
  }
  files["w.f32"].assign(p, left);

  const parasol::Manifest& m = FuzzManifest();
  auto read = [&](const std::string& file, uint64_t max_bytes) -> parasol::Result<std::string> {
    const auto it = files.find(file);
    // The names the loader asks for are the tables' own, never one from the JSON.
    Require(it != files.end());
    if (it->second.size() > max_bytes) return parasol::InvalidArgument(file + " is too long");
    return it->second;
  };
  parasol::Result<parasol::ExportedModel> model = parasol::LoadExportedModel(m, "fuzz", read);
  if (!model.ok()) {
    Require(model.status().message().rfind("exported model fuzz: ", 0) == 0 ||
            model.status().message().find("too long") != std::string::npos);
    return 0;
  }
  Require(model->tables_fingerprint == m.TablesFingerprint());
  Require(model->dense.size() == 1 && model->dense.at("w").size() == 3);
  Require(model->sparse.size() == 1);
  for (const auto& [key, row] : model->sparse.at("emb")) Require(row.size() == 2);
  const parasol::ModelDifference d = parasol::CompareModels(*model, *model);
  Require(d.rows_in_one_only == 0);
  return 0;
}
