// client_probe: the C++ client's side of tests/python/test_client.py. Runs a fixed workload
// through PsClient, or only reads, and writes what it pulled as raw float32, so the test can
// compare the Python client's bytes with it.
//   client_probe MANIFEST work STEPS OUT   (worker 0: STEPS steps of sparse and dense pushes)
//   client_probe MANIFEST read 0 OUT       (an observer: pulls only)
// The workload (keep in step with test_client.py): at step s, the 64 keys (i * 7919 + s * 13)
// mod 1000 of table "emb" get gradient rows g[i][j] = ((k * 31 + j + s) mod 17) / 17 - 0.5
// (k the key), and dense table "w" gets g[e] = ((e + 3 * s) mod 11) / 11 - 0.5; then a tick.
// Written: rows of keys 0..999 of "emb", then "w".
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "worker/ps_client.hpp"

using namespace parasol;

int main(int argc, char** argv) {
  if (argc != 5) {
    std::fprintf(stderr, "usage: client_probe MANIFEST work|read STEPS OUT\n");
    return 2;
  }
  auto manifest = LoadManifest(argv[1]);
  if (!manifest.ok()) {
    std::fprintf(stderr, "%s\n", manifest.status().ToString().c_str());
    return 2;
  }
  const bool work = std::string(argv[2]) == "work";
  const int steps = std::stoi(argv[3]);
  auto client = PsClient::Connect(*manifest, work ? 0 : PsClient::kObserver);
  if (!client.ok()) {
    std::fprintf(stderr, "%s\n", client.status().ToString().c_str());
    return 1;
  }
  PsClient& c = **client;
  const uint32_t emb = *c.TableId("emb"), w = *c.TableId("w");
  const uint32_t dim = manifest->tables[emb].dim;
  const uint64_t n = manifest->tables[w].NumElements();
  auto fail = [](const Status& st) {
    std::fprintf(stderr, "%s\n", st.ToString().c_str());
    return 1;
  };
  for (int s = 0; work && s < steps; ++s) {
    std::vector<uint64_t> keys(64);
    std::vector<float> grads(64 * dim);
    for (uint64_t i = 0; i < 64; ++i) {
      const uint64_t k = (i * 7919 + static_cast<uint64_t>(s) * 13) % 1000;
      keys[i] = k;
      for (uint32_t j = 0; j < dim; ++j) {
        grads[i * dim + j] = static_cast<float>((k * 31 + j + s) % 17) / 17.0f - 0.5f;
      }
    }
    std::vector<float> dense(n);
    for (uint64_t e = 0; e < n; ++e) {
      dense[e] = static_cast<float>((e + 3 * static_cast<uint64_t>(s)) % 11) / 11.0f - 0.5f;
    }
    if (Status st = c.PushSparse(emb, keys, grads); !st.ok()) return fail(st);
    if (Status st = c.PushDense(w, dense); !st.ok()) return fail(st);
    if (Status st = c.Tick(); !st.ok()) return fail(st);
  }
  std::vector<uint64_t> all(1000);
  for (uint64_t k = 0; k < 1000; ++k) all[k] = k;
  std::vector<float> rows(1000 * dim), dense(n);
  if (Status st = c.PullSparse(emb, all, rows.data()); !st.ok()) return fail(st);
  if (Status st = c.PullDense(w, dense.data()); !st.ok()) return fail(st);
  if (work) {
    if (Status st = c.Leave(); !st.ok()) return fail(st);
  }
  std::ofstream out(argv[4], std::ios::binary);
  out.write(reinterpret_cast<const char*>(rows.data()), rows.size() * sizeof(float));
  out.write(reinterpret_cast<const char*>(dense.data()), dense.size() * sizeof(float));
  return out ? 0 : 1;
}
