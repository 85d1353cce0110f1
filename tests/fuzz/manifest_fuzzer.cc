// libFuzzer target for the manifest loader: the bytes are a manifest's YAML text. An accepted
// manifest is then used as the roles use it (its fingerprint, its tables by name).
#include <cstdint>
#include <cstdlib>
#include <string>

#include "common/manifest.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  parasol::Result<parasol::Manifest> m = parasol::ParseManifest(text, "fuzz.yaml");
  if (!m.ok()) {
    if (m.status().message().empty()) std::abort();  // a refusal says why
    return 0;
  }
  (void)m->Fingerprint();
  for (const parasol::TableOptions& t : m->tables) {
    if (m->FindTable(t.name) < 0) std::abort();
    (void)t.NumElements();
  }
  return 0;
}
