// Writes valid exported-model folders in export_fuzzer's input layout as its seed corpus: a
// model with rows, one with none, and an export of the older format (no tables_fingerprint).
// Usage: fuzz_export_seeds FOLDER
#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "common/json_text.hpp"
#include "common/manifest.hpp"

namespace {

// The manifest of export_fuzzer.cc.
constexpr const char* kManifest =
    "cluster: {servers: [127.0.0.1:7000]}\n"
    "tables:\n  - {name: emb, dim: 2}\n  - {name: w, kind: dense, shape: [3]}\n";

std::string ModelJson(const parasol::Manifest& m, uint64_t rows, bool tables_fingerprint) {
  parasol::Json j;
  j["fingerprint"] = m.Fingerprint();
  if (tables_fingerprint) j["tables_fingerprint"] = m.TablesFingerprint();
  j["incremental"] = false;
  j["since"] = 0;
  parasol::Json emb, w;
  emb["name"] = "emb";
  emb["kind"] = "sparse";
  emb["dim"] = 2;
  emb["file"] = "emb.rows";
  emb["rows"] = rows;
  w["name"] = "w";
  w["kind"] = "dense";
  w["shape"] = std::vector<uint64_t>{3};
  w["file"] = "w.f32";
  j["tables"] = parasol::Json::array({emb, w});
  return parasol::SpacedJson(j);
}

std::string Rows(const std::vector<uint64_t>& keys) {
  std::string bytes(12 + 16 * keys.size(), '\0');
  const uint64_t count = keys.size();
  const uint32_t dim = 2;
  std::memcpy(bytes.data(), &count, 8);
  std::memcpy(bytes.data() + 8, &dim, 4);
  for (size_t i = 0; i < keys.size(); ++i) {
    const float v[2] = {0.25f * static_cast<float>(i), -1.5f};
    std::memcpy(bytes.data() + 12 + 16 * i, &keys[i], 8);
    std::memcpy(bytes.data() + 20 + 16 * i, v, 8);
  }
  return bytes;
}

bool Write(const std::string& path, const std::string& json, const std::string& rows) {
  const float dense[3] = {1.0f, -2.0f, 0.5f};
  std::string bytes;
  bytes += static_cast<char>(json.size() & 0xff);
  bytes += static_cast<char>(json.size() >> 8);
  bytes += static_cast<char>(rows.size() & 0xff);
  bytes += static_cast<char>(rows.size() >> 8);
  bytes += json + rows + std::string(reinterpret_cast<const char*>(dense), sizeof(dense));
  std::ofstream out(path, std::ios::binary);
  out << bytes;
  return static_cast<bool>(out);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s FOLDER\n", argv[0]);
    return 2;
  }
  const std::string dir = argv[1];
  const parasol::Manifest m = *parasol::ParseManifest(kManifest, "fuzz.yaml");
  const std::vector<uint64_t> keys = {3, 17, 1ull << 40, UINT64_MAX};
  const bool ok = Write(dir + "/rows", ModelJson(m, keys.size(), true), Rows(keys)) &&
                  Write(dir + "/empty", ModelJson(m, 0, true), Rows({})) &&
                  Write(dir + "/older-format", ModelJson(m, 2, false), Rows({5, 6}));
  return ok ? 0 : 1;
}
