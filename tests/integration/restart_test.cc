// kill -9 of a server in the middle of a BSP training run: launch restarts it from its
// checkpoint, the workers replay what it had not checkpointed, and the job ends with the weights
// of an undisturbed run.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <thread>

#include "common/net.hpp"
#include "common/subprocess.hpp"
#include "server/checkpoint.hpp"
#include "tests/support/json_figures.hpp"
#include "tests/support/test_cluster.hpp"
#include "worker/data_generator.hpp"

namespace parasol {
namespace {

using testing::JsonAt;
using testing::MakeTempDir;
using testing::ReadFile;
using testing::RemoveTree;
using testing::WriteFile;

// The pid of the process whose command line contains every one of `words`, or -1.
pid_t FindProcess(const std::vector<std::string>& words) {
  for (const auto& e : std::filesystem::directory_iterator("/proc")) {
    const std::string name = e.path().filename().string();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    std::string cmd = ReadFile(e.path().string() + "/cmdline");
    std::replace(cmd.begin(), cmd.end(), '\0', ' ');
    bool all = true;
    for (const auto& w : words) all = all && cmd.find(w) != std::string::npos;
    if (all) return static_cast<pid_t>(std::stol(name));
  }
  return -1;
}

// Every float of a shard's newest checkpoint, keyed by (table, key) for sparse rows (the clock
// word left out) and (table, element) for dense values and state.
std::map<std::pair<uint32_t, uint64_t>, std::vector<float>> Weights(const std::string& dir,
                                                                     uint32_t shard) {
  std::map<std::pair<uint32_t, uint64_t>, std::vector<float>> out;
  const auto files = ListCheckpoints(dir, shard);
  if (files.empty()) return out;
  CheckpointHeader h;
  EXPECT_TRUE(ReadCheckpointFile(files[0], &h, [&](const CheckpointBlock& b) {
                if (b.kind == 1) {
                  const size_t row = (b.bytes.size() / b.count) - 8;
                  for (uint64_t i = 0; i < b.count; ++i) {
                    const char* p = b.bytes.data() + i * (8 + row);
                    uint64_t key;
                    std::memcpy(&key, p, 8);
                    std::vector<float> v(row / 4 - 1);
                    std::memcpy(v.data(), p + 8 + 4, row - 4);
                    out[{b.table, key}] = v;
                  }
                } else if (b.kind == 2) {
                  std::vector<float> v(b.bytes.size() / 4);
                  std::memcpy(v.data(), b.bytes.data(), b.bytes.size());
                  out[{b.table, ~0ull}] = v;
                }
                return Status::Ok();
              }).ok());
  return out;
}

class RestartTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = MakeTempDir();
    GeneratorOptions g;
    g.rows = 60000;
    ASSERT_TRUE(GenerateCriteo(dir_ + "/train.tsv", g).ok());
    g.rows = 5000;
    g.seed = 9;
    ASSERT_TRUE(GenerateCriteo(dir_ + "/eval.tsv", g).ok());
  }
  void TearDown() override { RemoveTree(dir_); }

  std::string Manifest(const std::string& ckpt, const std::string& consistency = "bsp") {
    const std::vector<uint16_t> ports = *PickFreePorts(2);
    return "job: {name: restart, seed: 3}\n"
           "cluster:\n  servers: [127.0.0.1:" + std::to_string(ports[0]) + ", 127.0.0.1:" +
           std::to_string(ports[1]) + "]\n  workers: 2\n  request_timeout: 1s\n"
           "  request_retries: 30\n  restart_servers: true\n"
           "training: {consistency: " + consistency +
           ", batch_size: 256, epochs: 1, worker_timeout: 60s}\n"
           "model: {kind: dlrm, embedding_dim: 8, bottom: [16, 8], top: [16, 1]}\n"
           "data: {train: " + dir_ + "/train.tsv, eval: " + dir_ + "/eval.tsv}\n"
           "checkpoint: {dir: " + ckpt + ", every_steps: 20, keep: 2}\n";
  }

  std::string dir_;
};


TEST_F(RestartTest, UnderSspAKilledServerIsRestartedAndTheModelIsAsGood) {
  WriteFile(dir_ + "/a.yaml", Manifest(dir_ + "/ckpt-a", "ssp, staleness: 2"));
  auto a = Subprocess::Spawn({PARASOL_BINARY, "launch", dir_ + "/a.yaml", "--summary",
                              dir_ + "/a.json"},
                             dir_ + "/a.log");
  ASSERT_TRUE(a.ok());
  auto sa = a->Wait(std::chrono::seconds(240));
  ASSERT_TRUE(sa && WIFEXITED(*sa) && WEXITSTATUS(*sa) == 0) << ReadFile(dir_ + "/a.log");
  WriteFile(dir_ + "/b.yaml", Manifest(dir_ + "/ckpt-b", "ssp, staleness: 2"));
  auto b = Subprocess::Spawn({PARASOL_BINARY, "launch", dir_ + "/b.yaml", "--summary",
                              dir_ + "/b.json"},
                             dir_ + "/b.log");
  ASSERT_TRUE(b.ok());
  bool killed = false;
  for (int i = 0; i < 3000 && !killed && !b->Poll(); ++i) {
    if (!ListCheckpoints(dir_ + "/ckpt-b", 0).empty()) {
      const pid_t pid = FindProcess({"server", dir_ + "/b.yaml", "--rank 0"});
      if (pid > 0) killed = ::kill(pid, SIGKILL) == 0;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  auto sb = b->Wait(std::chrono::seconds(240));
  const std::string out = ReadFile(dir_ + "/b.log");
  ASSERT_TRUE(killed) << out;
  ASSERT_TRUE(sb && WIFEXITED(*sb) && WEXITSTATUS(*sb) == 0) << out;
  const double auc_a = JsonAt(ReadFile(dir_ + "/a.json"), "/eval_auc");
  const double auc_b = JsonAt(ReadFile(dir_ + "/b.json"), "/eval_auc");
  EXPECT_GT(auc_a, 0.6);
  EXPECT_NEAR(auc_b, auc_a, 0.01);
}

TEST_F(RestartTest, AKilledServerIsRestartedAndTheJobEndsWithTheSameWeights) {
  // The undisturbed run.
  WriteFile(dir_ + "/a.yaml", Manifest(dir_ + "/ckpt-a"));
  auto a = Subprocess::Spawn({PARASOL_BINARY, "launch", dir_ + "/a.yaml"}, dir_ + "/a.log");
  ASSERT_TRUE(a.ok());
  auto sa = a->Wait(std::chrono::seconds(240));
  ASSERT_TRUE(sa && WIFEXITED(*sa) && WEXITSTATUS(*sa) == 0) << ReadFile(dir_ + "/a.log");

  // The same run, with server 1 killed once it has written a checkpoint.
  WriteFile(dir_ + "/b.yaml", Manifest(dir_ + "/ckpt-b"));
  auto b = Subprocess::Spawn({PARASOL_BINARY, "launch", dir_ + "/b.yaml"}, dir_ + "/b.log");
  ASSERT_TRUE(b.ok());
  bool killed = false;
  for (int i = 0; i < 3000 && !killed; ++i) {
    if (!ListCheckpoints(dir_ + "/ckpt-b", 1).empty()) {
      const pid_t pid = FindProcess({"server", dir_ + "/b.yaml", "--rank 1"});
      if (pid > 0) killed = ::kill(pid, SIGKILL) == 0;
    }
    if (b->Poll()) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  auto sb = b->Wait(std::chrono::seconds(240));
  const std::string out = ReadFile(dir_ + "/b.log");
  ASSERT_TRUE(killed) << "the job ended before server 1 could be killed\n" << out;
  ASSERT_TRUE(sb && WIFEXITED(*sb) && WEXITSTATUS(*sb) == 0) << out;
  EXPECT_NE(out.find("server 1 killed by signal 9; restarting it"), std::string::npos) << out;
  EXPECT_NE(out.find("restored"), std::string::npos) << out;

  for (uint32_t shard = 0; shard < 2; ++shard) {
    const auto wa = Weights(dir_ + "/ckpt-a", shard), wb = Weights(dir_ + "/ckpt-b", shard);
    ASSERT_EQ(wa.size(), wb.size()) << "shard " << shard;
    double worst = 0;
    for (const auto& [k, va] : wa) {
      auto it = wb.find(k);
      ASSERT_NE(it, wb.end());
      ASSERT_EQ(va.size(), it->second.size());
      for (size_t i = 0; i < va.size(); ++i) {
        worst = std::max(worst, std::abs(va[i] - it->second[i]) / (1e-3 + std::abs(va[i])));
      }
    }
    EXPECT_LT(worst, 1e-4) << "shard " << shard << " weights differ from the undisturbed run";
  }
}

}  // namespace
}  // namespace parasol
