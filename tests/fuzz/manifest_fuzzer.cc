// libFuzzer target for the manifest loader: the bytes are a manifest's YAML text. An accepted
// manifest must keep the promises common/manifest.hpp makes to the roles (at least one server
// and worker, unique table names, dense shapes whose element count is exact and bounded), and
// is then used as the roles use it (its fingerprint, its tables by name).
#include <cstdint>
#include <cstdlib>
#include <string>

#include "common/manifest.hpp"

namespace {

void Require(bool promise) {
  if (!promise) std::abort();
}

void CheckTable(const parasol::Manifest& m, size_t index) {
  const parasol::TableOptions& t = m.tables[index];
  Require(!t.name.empty() && m.FindTable(t.name) == static_cast<int>(index));
  if (t.kind == parasol::TableKind::kSparse) {
    Require(t.dim >= 1 && t.shape.empty());
    return;
  }
  Require(!t.shape.empty());
  uint64_t elements = 1;
  for (uint64_t d : t.shape) {
    Require(d >= 1 && !__builtin_mul_overflow(elements, d, &elements));
  }
  Require(elements <= (uint64_t{1} << 34) && elements == t.NumElements());
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  parasol::Result<parasol::Manifest> m = parasol::ParseManifest(text, "fuzz.yaml");
  if (!m.ok()) {
    Require(!m.status().message().empty());  // a refusal says why
    return 0;
  }
  Require(!m->cluster.servers.empty() && m->cluster.workers >= 1);
  Require(m->Fingerprint() == m->Fingerprint());
  for (size_t i = 0; i < m->tables.size(); ++i) CheckTable(*m, i);
  return 0;
}
