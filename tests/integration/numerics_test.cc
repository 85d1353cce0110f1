// training.on_nonfinite: a diverging model's worker stops with an error naming the step (fail),
// or skips the steps whose loss or gradients are not finite and says how many (skip). Either
// way no NaN reaches a shard.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <chrono>
#include <string>

#include "common/net.hpp"
#include "common/subprocess.hpp"
#include "tests/support/test_cluster.hpp"
#include "worker/data_generator.hpp"

namespace parasol {
namespace {

using testing::MakeTempDir;
using testing::ReadFile;
using testing::RemoveTree;
using testing::WriteFile;

class NumericsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = MakeTempDir();
    GeneratorOptions g;
    g.rows = 3000;
    ASSERT_TRUE(GenerateCriteo(dir_ + "/train.tsv", g).ok());
  }
  void TearDown() override { RemoveTree(dir_); }

  // A 1-server, 1-worker BSP job whose dense learning rate (10^6) overflows the weights within
  // first steps. Returns the exit status and fills `log`.
  std::optional<int> Run(const std::string& on_nonfinite, std::string* log) {
    const std::vector<uint16_t> ports = *PickFreePorts(1);
    const std::string manifest = dir_ + "/" + on_nonfinite + ".yaml";
    WriteFile(manifest,
              "job: {name: nan, seed: 3}\n"
              "cluster:\n  servers: [127.0.0.1:" + std::to_string(ports[0]) + "]\n"
              "  workers: 1\n"
              "training: {consistency: bsp, batch_size: 128, epochs: 1, on_nonfinite: " +
                  on_nonfinite + "}\n"
              "model: {kind: dlrm, embedding_dim: 8, bottom: [16, 8], top: [16, 1],\n"
              "        sparse_optimizer: {kind: sgd, lr: 0.05}, dense_optimizer: {kind: sgd, "
              "lr: 1e6}}\n"
              "data: {train: " + dir_ + "/train.tsv}\n");
    auto job = Subprocess::Spawn({PARASOL_BINARY, "launch", manifest},
                                 dir_ + "/" + on_nonfinite + ".log");
    if (!job.ok()) return std::nullopt;
    auto status = job->Wait(std::chrono::seconds(120));
    *log = ReadFile(dir_ + "/" + on_nonfinite + ".log");
    return status;
  }

  std::string dir_;
};

TEST_F(NumericsTest, AWorkerStopsAtTheFirstNonfiniteStepAndNamesIt) {
  std::string log;
  auto status = Run("fail", &log);
  ASSERT_TRUE(status.has_value()) << log;
  EXPECT_FALSE(WIFEXITED(*status) && WEXITSTATUS(*status) == 0) << log;
  EXPECT_NE(log.find("nothing of it was pushed (training.on_nonfinite"), std::string::npos) << log;
  // The step and what was not finite are named.
  EXPECT_NE(log.find(": step "), std::string::npos) << log;
  EXPECT_TRUE(log.find("the loss is") != std::string::npos ||
              log.find("is not finite at") != std::string::npos)
      << log;
  // Nothing non-finite reached the shard (it would have refused and counted it).
  EXPECT_EQ(log.find("is not finite; the push is refused"), std::string::npos) << log;
}

TEST_F(NumericsTest, SkippedStepsAreCountedAndTheJobFinishes) {
  std::string log;
  auto status = Run("skip", &log);
  ASSERT_TRUE(status.has_value()) << log;
  ASSERT_TRUE(WIFEXITED(*status) && WEXITSTATUS(*status) == 0) << log;
  const size_t at = log.find(" steps skipped (a non-finite loss or gradient)");
  ASSERT_NE(at, std::string::npos) << log;
  const size_t from = log.rfind(", ", at) + 2;
  EXPECT_GT(std::stoll(log.substr(from, at - from)), 0) << log;
  EXPECT_NE(log.find("\"nonfinite_pushes\":0"), std::string::npos) << log;
}

}  // namespace
}  // namespace parasol
