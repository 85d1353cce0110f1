// Export a trained job's checkpoints, load the export without servers, and get exactly the
// predictions the restored servers give.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>

#include <cstring>
#include <filesystem>

#include "common/initializer.hpp"
#include "common/json_text.hpp"
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


// A hand-written export of a small job's tables, for the loader's refusals.
class ExportedModelTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = testing::MakeTempDir();
    manifest_ = *ParseManifest("cluster: {servers: [127.0.0.1:7000]}\n"
                               "tables:\n  - {name: emb, dim: 2}\n"
                               "  - {name: w, kind: dense, shape: [3]}\n",
                               dir_ + "/job.yaml");
    testing::WriteFile(dir_ + "/job.yaml", "cluster: {servers: [127.0.0.1:7000]}\n"
                                           "tables:\n  - {name: emb, dim: 2}\n"
                                           "  - {name: w, kind: dense, shape: [3]}\n");
    WriteModel(dir_ + "/a", {1, 5, 9});
  }
  void TearDown() override { testing::RemoveTree(dir_); }

  Json ModelJson(uint64_t rows) const {
    Json j;
    j["fingerprint"] = manifest_.Fingerprint();
    j["tables_fingerprint"] = manifest_.TablesFingerprint();
    j["incremental"] = false;
    j["since"] = 0;
    Json emb;
    emb["name"] = "emb";
    emb["kind"] = "sparse";
    emb["dim"] = 2;
    emb["file"] = "emb.rows";
    emb["rows"] = rows;
    Json w;
    w["name"] = "w";
    w["kind"] = "dense";
    w["shape"] = std::vector<uint64_t>{3};
    w["file"] = "w.f32";
    j["tables"] = Json::array({emb, w});
    return j;
  }

  static std::string Rows(const std::vector<uint64_t>& keys) {
    std::string bytes(12 + keys.size() * 16, '\0');
    const uint64_t count = keys.size();
    const uint32_t dim = 2;
    std::memcpy(bytes.data(), &count, 8);
    std::memcpy(bytes.data() + 8, &dim, 4);
    for (size_t i = 0; i < keys.size(); ++i) {
      const float v[2] = {float(keys[i]), 0.5f};
      std::memcpy(bytes.data() + 12 + 16 * i, &keys[i], 8);
      std::memcpy(bytes.data() + 20 + 16 * i, v, 8);
    }
    return bytes;
  }

  void WriteModel(const std::string& dir, const std::vector<uint64_t>& keys) const {
    std::filesystem::create_directories(dir);
    testing::WriteFile(dir + "/model.json", SpacedJson(ModelJson(keys.size())));
    testing::WriteFile(dir + "/emb.rows", Rows(keys));
    testing::WriteFile(dir + "/w.f32", std::string(12, '\0'));
  }

  // The error of loading the model in `dir`, or "" when it loads.
  std::string ErrorOf(const std::string& dir) const {
    auto m = LoadExportedModel(manifest_, dir);
    return m.ok() ? "" : m.status().message();
  }

  std::string dir_;
  Manifest manifest_;
};

TEST_F(ExportedModelTest, AGoodExportLoads) {
  auto m = LoadExportedModel(manifest_, dir_ + "/a");
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  EXPECT_EQ(m->sparse["emb"].size(), 3u);
  EXPECT_EQ(m->dense["w"].size(), 3u);
  EXPECT_EQ(m->tables_fingerprint, manifest_.TablesFingerprint());
}

TEST_F(ExportedModelTest, ModelJsonThatIsNotJsonIsRefusedNamingFolderAndFile) {
  testing::WriteFile(dir_ + "/a/model.json", "{\"fingerprint\": ");
  EXPECT_EQ(ErrorOf(dir_ + "/a"), "exported model " + dir_ + "/a: model.json: not valid JSON");
}

TEST_F(ExportedModelTest, ModelJsonOfOtherTablesIsRefused) {
  Json j = ModelJson(3);
  j["tables_fingerprint"] = manifest_.TablesFingerprint() + 1;
  testing::WriteFile(dir_ + "/a/model.json", SpacedJson(j));
  EXPECT_NE(ErrorOf(dir_ + "/a").find("exported model " + dir_ +
                                      "/a: model.json: made for other tables (tables_fingerprint"),
            std::string::npos)
      << ErrorOf(dir_ + "/a");
  // An older export (no tables_fingerprint) must carry the manifest's own fingerprint.
  j.erase("tables_fingerprint");
  j["fingerprint"] = 12345;
  testing::WriteFile(dir_ + "/a/model.json", SpacedJson(j));
  EXPECT_NE(ErrorOf(dir_ + "/a").find("model.json: made by another job (fingerprint 12345"),
            std::string::npos)
      << ErrorOf(dir_ + "/a");
}

TEST_F(ExportedModelTest, AFileNamedInModelJsonIsNeverOpened) {
  Json j = ModelJson(3);
  j["tables"][0]["file"] = "/dev/zero";
  testing::WriteFile(dir_ + "/a/model.json", SpacedJson(j));
  EXPECT_EQ(ErrorOf(dir_ + "/a"), "exported model " + dir_ +
                                      "/a: model.json: tables[0].file: table 'emb' is in emb.rows");
}

TEST_F(ExportedModelTest, AFileThatIsNotARegularFileIsRefused) {
  std::filesystem::remove(dir_ + "/a/emb.rows");
  std::filesystem::create_symlink("/dev/zero", dir_ + "/a/emb.rows");
  EXPECT_EQ(ErrorOf(dir_ + "/a"),
            "exported model " + dir_ + "/a: " + dir_ + "/a/emb.rows is not a regular file");
  std::filesystem::remove(dir_ + "/a/model.json");
  std::filesystem::create_symlink("/dev/zero", dir_ + "/a/model.json");
  EXPECT_EQ(ErrorOf(dir_ + "/a"),
            "exported model " + dir_ + "/a: " + dir_ + "/a/model.json is not a regular file");
}

TEST_F(ExportedModelTest, RowsFilesOfTheWrongLengthAreRefused) {
  testing::WriteFile(dir_ + "/a/emb.rows", Rows({1, 5, 9}) + "x");
  EXPECT_EQ(ErrorOf(dir_ + "/a"), "exported model " + dir_ + "/a: " + dir_ +
                                      "/a/emb.rows has 61 bytes, more than the 60 it may have");
  testing::WriteFile(dir_ + "/a/emb.rows", Rows({1, 5, 9}).substr(0, 59));
  EXPECT_EQ(ErrorOf(dir_ + "/a"), "exported model " + dir_ +
                                      "/a: emb.rows: 59 bytes; 3 rows of dim 2 take 12 + 3 x 16");
  testing::WriteFile(dir_ + "/a/w.f32", std::string(16, '\0'));
  testing::WriteFile(dir_ + "/a/emb.rows", Rows({1, 5, 9}));
  EXPECT_EQ(ErrorOf(dir_ + "/a"), "exported model " + dir_ + "/a: " + dir_ +
                                      "/a/w.f32 has 16 bytes, more than the 12 it may have");
}

TEST_F(ExportedModelTest, KeysOutOfOrderOrTwiceAreRefused) {
  testing::WriteFile(dir_ + "/a/emb.rows", Rows({1, 9, 5}));
  EXPECT_EQ(ErrorOf(dir_ + "/a"), "exported model " + dir_ +
                                      "/a: emb.rows: row 2 has key 5, not above the key before "
                                      "it (9)");
  testing::WriteFile(dir_ + "/a/emb.rows", Rows({1, 5, 5}));
  EXPECT_EQ(ErrorOf(dir_ + "/a"), "exported model " + dir_ +
                                      "/a: emb.rows: row 2 has key 5, not above the key before "
                                      "it (5)");
}

TEST_F(ExportedModelTest, ModelsOfDifferentTablesAreNotCompared) {
  auto a = LoadExportedModel(manifest_, dir_ + "/a");
  ASSERT_TRUE(a.ok());
  ExportedModel b = *a;
  b.tables_fingerprint ^= 1;
  const Status st = CheckComparable(*a, dir_ + "/a", b, dir_ + "/b");
  EXPECT_EQ(st.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(st.message().find("exported models " + dir_ + "/a and " + dir_ +
                              "/b were made for different tables"),
            std::string::npos)
      << st.message();
  EXPECT_TRUE(CheckComparable(*a, dir_ + "/a", *a, dir_ + "/a").ok());
}

TEST_F(ExportedModelTest, CompareModelsNamesTheFolderAndChecksItsTolerance) {
  WriteModel(dir_ + "/b", {1, 5});
  testing::WriteFile(dir_ + "/b/model.json", "not json");
  auto p = Subprocess::Spawn({PARASOL_BINARY, "compare-models", "--manifest", dir_ + "/job.yaml",
                              dir_ + "/a", dir_ + "/b"},
                             dir_ + "/compare.log");
  ASSERT_TRUE(p.ok());
  auto st = p->Wait(std::chrono::seconds(60));
  ASSERT_TRUE(st && WIFEXITED(*st));
  EXPECT_EQ(WEXITSTATUS(*st), 2);
  EXPECT_NE(ReadFile(dir_ + "/compare.log")
                .find("exported model " + dir_ + "/b: model.json: not valid JSON"),
            std::string::npos)
      << ReadFile(dir_ + "/compare.log");
  auto nan = Subprocess::Spawn({PARASOL_BINARY, "compare-models", "--manifest", dir_ + "/job.yaml",
                                dir_ + "/a", dir_ + "/a", "--tolerance", "nan"},
                               dir_ + "/nan.log");
  ASSERT_TRUE(nan.ok());
  st = nan->Wait(std::chrono::seconds(60));
  ASSERT_TRUE(st && WIFEXITED(*st));
  EXPECT_NE(WEXITSTATUS(*st), 0);
  EXPECT_NE(ReadFile(dir_ + "/nan.log").find("--tolerance: expected a finite number, got 'nan'"),
            std::string::npos)
      << ReadFile(dir_ + "/nan.log");
}

}  // namespace
}  // namespace parasol
