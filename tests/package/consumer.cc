// Pushes a gradient row into a running job's table "emb" as worker 0, ends the step, pulls the
// row back and prints both, through the installed Parasol::client.
//   consumer MANIFEST
#include <cstdio>
#include <vector>

#include "common/manifest.hpp"
#include "worker/ps_client.hpp"

int main(int argc, char** argv) {
  if (argc != 2) return 2;
  auto manifest = parasol::LoadManifest(argv[1]);
  if (!manifest.ok()) {
    std::fprintf(stderr, "%s\n", manifest.status().ToString().c_str());
    return 2;
  }
  auto client = parasol::PsClient::Connect(*manifest, 0);
  if (!client.ok()) {
    std::fprintf(stderr, "%s\n", client.status().ToString().c_str());
    return 1;
  }
  parasol::PsClient& c = **client;
  const uint32_t emb = *c.TableId("emb");
  const std::vector<uint64_t> key = {42};
  std::vector<float> before(4), after(4);
  const std::vector<float> grad = {1, 2, 3, 4};
  parasol::Status st = c.PullSparse(emb, key, before.data());
  if (st.ok()) st = c.PushSparse(emb, key, grad);
  if (st.ok()) st = c.Tick();
  if (st.ok()) st = c.PullSparse(emb, key, after.data());
  if (st.ok()) st = c.Leave();
  if (!st.ok()) {
    std::fprintf(stderr, "%s\n", st.ToString().c_str());
    return 1;
  }
  for (int i = 0; i < 4; ++i) std::printf("%s%.6f", i ? " " : "moved: ", before[i] - after[i]);
  std::printf("\n");
  return 0;
}
