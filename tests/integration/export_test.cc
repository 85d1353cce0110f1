// Export a trained job's checkpoints, load the export without servers, and get exactly the
// predictions the restored servers give.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>

#include "common/initializer.hpp"
#include "common/key_index.hpp"
#include "common/net.hpp"
#include "common/subprocess.hpp"
#include "server/model_export.hpp"
#include "tests/support/test_cluster.hpp"
#include "worker/data_generator.hpp"
#include "worker/data_reader.hpp"
#include "tests/support/model_step.hpp"
#include "worker/model.hpp"

namespace parasol {
namespace {

using testing::ReadFile;

TEST(ExportTest, TheExportedModelPredictsExactlyAsTheServers) {
  const std::string dir = testing::MakeTempDir();
  GeneratorOptions g;
  g.rows = 20000;
  ASSERT_TRUE(GenerateCriteo(dir + "/train.tsv", g).ok());
  g.rows = 2000;
  g.seed = 4;
  ASSERT_TRUE(GenerateCriteo(dir + "/eval.tsv", g).ok());
  const std::vector<uint16_t> ports = *PickFreePorts(2);
  testing::WriteFile(dir + "/job.yaml",
                     "cluster:\n  servers: [127.0.0.1:" + std::to_string(ports[0]) +
                         ", 127.0.0.1:" + std::to_string(ports[1]) + "]\n  workers: 2\n"
                         "model: {kind: dlrm, embedding_dim: 8, bottom: [16, 8], top: [16, 1]}\n"
                         "data: {train: " + dir + "/train.tsv}\n"
                         "checkpoint: {dir: " + dir + "/ckpt, every_steps: 10}\n");
  auto job = Subprocess::Spawn({PARASOL_BINARY, "launch", dir + "/job.yaml"}, dir + "/job.log");
  ASSERT_TRUE(job.ok());
  auto st = job->Wait(std::chrono::seconds(240));
  ASSERT_TRUE(st && WIFEXITED(*st) && WEXITSTATUS(*st) == 0) << ReadFile(dir + "/job.log");
  // Export, full and incremental.
  auto ex = Subprocess::Spawn({PARASOL_BINARY, "export", "--manifest", dir + "/job.yaml", "--out",
                               dir + "/export"},
                              dir + "/export.log");
  ASSERT_TRUE(ex.ok());
  auto es = ex->Wait(std::chrono::seconds(60));
  ASSERT_TRUE(es && WIFEXITED(*es) && WEXITSTATUS(*es) == 0) << ReadFile(dir + "/export.log");
  EXPECT_NE(ReadFile(dir + "/export/model.json").find("\"incremental\": false"), std::string::npos);

  const Manifest m = *LoadManifest(dir + "/job.yaml");
  auto exported = LoadExportedModel(m, dir + "/export");
  ASSERT_TRUE(exported.ok()) << exported.status().ToString();

  // The servers again, restored from the same checkpoints.
  std::vector<Subprocess> servers;
  for (int r = 0; r < 2; ++r) {
    auto p = Subprocess::Spawn({PARASOL_BINARY, "server", "--manifest", dir + "/job.yaml", "--rank",
                                std::to_string(r)},
                               dir + "/s" + std::to_string(r) + ".log");
    ASSERT_TRUE(p.ok());
    servers.push_back(std::move(*p));
  }
  auto client = PsClient::Connect(m, PsClient::kObserver);
  ASSERT_TRUE(client.ok()) << client.status().ToString();

  auto backend = MakeCpuBackend();
  auto served = Model::Create(m, backend.get(), 256);
  auto offline = Model::Create(m, backend.get(), 256);
  ASSERT_TRUE(served.ok() && offline.ok());
  std::vector<std::vector<float>> served_dense = DenseShapes(**served), offline_dense;
  for (size_t t = 0; t < (*served)->dense_tables().size(); ++t) {
    ASSERT_TRUE((*client)->PullDense((*served)->dense_tables()[t], served_dense[t].data()).ok());
    offline_dense.push_back(exported->dense.at(m.tables[(*offline)->dense_tables()[t]].name));
  }
  const TableOptions& emb = m.tables[(*served)->sparse_table()];
  const auto& rows_by_key = exported->sparse.at(emb.name);
  uint64_t bad = 0;
  auto batches = ReadAll(DataOptions::Format::kCriteo, dir + "/eval.tsv", 256, true, &bad);
  ASSERT_TRUE(batches.ok());
  size_t compared = 0, from_export = 0;
  for (const Batch& b : *batches) {
    const BatchKeys k = DeduplicateKeys(b.keys);
    std::vector<float> pulled(k.unique.size() * emb.dim), loaded(k.unique.size() * emb.dim);
    ASSERT_TRUE((*client)->PullSparse((*served)->sparse_table(), k.unique, pulled.data()).ok());
    for (size_t i = 0; i < k.unique.size(); ++i) {
      auto it = rows_by_key.find(k.unique[i]);
      std::span<float> row(loaded.data() + i * emb.dim, emb.dim);
      if (it != rows_by_key.end()) {
        std::copy(it->second.begin(), it->second.end(), row.begin());
        ++from_export;
      } else {
        InitSparseRow(emb.init, emb.seed, k.unique[i], row);  // a key training never saw
      }
    }
    ASSERT_TRUE(RunModelStep(**served, b, k, pulled, served_dense, /*train=*/false).ok());
    ASSERT_TRUE(RunModelStep(**offline, b, k, loaded, offline_dense, /*train=*/false).ok());
    const auto a = (*served)->Probabilities(), c = (*offline)->Probabilities();
    ASSERT_EQ(std::vector<float>(a.begin(), a.end()), std::vector<float>(c.begin(), c.end()));
    compared += b.size;
  }
  EXPECT_EQ(compared, 2000u);
  EXPECT_GT(from_export, 0u);
  servers.clear();
  testing::RemoveTree(dir);
}

}  // namespace
}  // namespace parasol
