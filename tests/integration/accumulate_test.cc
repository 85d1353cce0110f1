// training.accumulate: k micro-batches of b samples per push and per clock train the model as
// one step of k x b samples does (to float rounding), and unlike k steps of b.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <chrono>
#include <string>

#include "common/manifest.hpp"
#include "common/net.hpp"
#include "common/subprocess.hpp"
#include "server/model_export.hpp"
#include "tests/support/test_cluster.hpp"
#include "worker/data_generator.hpp"

namespace parasol {
namespace {

using testing::MakeTempDir;
using testing::ReadFile;
using testing::RemoveTree;
using testing::WriteFile;

class AccumulateTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = MakeTempDir();
    GeneratorOptions g;
    g.rows = 5000;  // not a multiple of 4 x 64: the last step has a short micro-batch
    ASSERT_TRUE(GenerateCriteo(dir_ + "/train.tsv", g).ok());
  }
  void TearDown() override { RemoveTree(dir_); }

  // Trains (1 server, 1 worker, BSP) and returns the exported model.
  Result<ExportedModel> Train(const std::string& name, uint32_t batch, uint32_t accumulate) {
    const std::vector<uint16_t> ports = *PickFreePorts(1);
    const std::string manifest = dir_ + "/" + name + ".yaml";
    WriteFile(manifest,
              "job: {name: acc, seed: 4}\n"
              "cluster:\n  servers: [127.0.0.1:" + std::to_string(ports[0]) + "]\n"
              "  workers: 1\n"
              "training: {consistency: bsp, batch_size: " + std::to_string(batch) +
              ", accumulate: " + std::to_string(accumulate) + ", epochs: 1}\n"
              // SGD: an update is linear in the gradient, so the two trainings differ by float
              // rounding only (Adam's first steps turn a near-zero gradient's rounding into a
              // sign, +-lr).
              "model: {kind: dlrm, embedding_dim: 8, bottom: [16, 8], top: [16, 1],\n"
              "        sparse_optimizer: {kind: sgd, lr: 0.05}, dense_optimizer: {kind: sgd, "
              "lr: 0.05}}\n"
              "data: {train: " + dir_ + "/train.tsv}\n"
              "checkpoint: {dir: " + dir_ + "/" + name + "-ckpt}\n");
    auto job = Subprocess::Spawn({PARASOL_BINARY, "launch", manifest}, dir_ + "/" + name + ".log");
    if (!job.ok()) return job.status();
    auto status = job->Wait(std::chrono::seconds(120));
    if (!status || !WIFEXITED(*status) || WEXITSTATUS(*status) != 0) {
      return Internal("the job failed:\n" + ReadFile(dir_ + "/" + name + ".log"));
    }
    PARASOL_ASSIGN_OR_RETURN(Manifest m, LoadManifest(manifest));
    PARASOL_RETURN_IF_ERROR(ExportModel(m, {}, dir_ + "/" + name + "-model"));
    return LoadExportedModel(m, dir_ + "/" + name + "-model");
  }

  std::string dir_;
};

TEST_F(AccumulateTest, FourMicroBatchesAreOneStepOfFourTimesTheBatch) {
  auto big = Train("big", 256, 1);
  ASSERT_TRUE(big.ok()) << big.status().ToString();
  auto accumulated = Train("acc", 64, 4);
  ASSERT_TRUE(accumulated.ok()) << accumulated.status().ToString();
  auto small = Train("small", 64, 1);
  ASSERT_TRUE(small.ok()) << small.status().ToString();

  const ModelDifference same = CompareModels(*accumulated, *big);
  EXPECT_GT(same.values_compared, 10000u);
  EXPECT_EQ(same.rows_in_one_only, 0u) << same.ToJson();
  EXPECT_LT(same.max_relative, 1e-5) << same.ToJson();
  // Four steps of 64 are another training: the comparison above can tell them apart.
  const ModelDifference other = CompareModels(*small, *big);
  EXPECT_GT(other.max_relative, 1e-3) << other.ToJson();
}

}  // namespace
}  // namespace parasol
