// The `parasol` program as a user runs it.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>

#include "common/manifest.hpp"
#include "common/net.hpp"
#include "common/subprocess.hpp"
#include "kernels/cuda_check.hpp"
#include "tests/support/test_cluster.hpp"
#include "worker/ps_client.hpp"

namespace parasol {
namespace {

using testing::MakeTempDir;
using testing::ReadFile;
using testing::RemoveTree;
using testing::WriteFile;

struct ProcessRun {
  int status = -1;
  std::string output;
};

ProcessRun RunParasol(const std::vector<std::string>& args, const std::string& dir) {
  std::vector<std::string> argv = {PARASOL_BINARY};
  argv.insert(argv.end(), args.begin(), args.end());
  const std::string log = dir + "/out.log";
  RemoveTree(log);
  auto p = Subprocess::Spawn(argv, log);
  ProcessRun r;
  if (!p.ok()) return r;
  auto st = p->Wait(std::chrono::seconds(120));
  r.status = st ? *st : -1;
  r.output = ReadFile(log);
  return r;
}

std::string PortsManifest(int servers, int workers) {
  std::string y = "cluster:\n  servers:\n";
  const std::vector<uint16_t> ports = *PickFreePorts(servers);
  for (int s = 0; s < servers; ++s) y += "    - 127.0.0.1:" + std::to_string(ports[s]) + "\n";
  y += "  workers: " + std::to_string(workers) + "\n  connect_timeout: 20s\n";
  y += "tables:\n  - {name: emb, kind: sparse, dim: 8}\n  - {name: w, kind: dense, shape: [1000]}\n";
  return y;
}

class CliTest : public ::testing::Test {
 protected:
  void SetUp() override { dir_ = MakeTempDir(); }
  void TearDown() override { RemoveTree(dir_); }
  std::string dir_;
};

TEST_F(CliTest, ServerRefusesABadManifestNamingTheLine) {
  WriteFile(dir_ + "/bad.yaml", "cluster:\n  servers: [127.0.0.1:1]\n  worker: 3\n");
  ProcessRun r = RunParasol({"server", "--manifest", dir_ + "/bad.yaml", "--rank", "0"}, dir_);
  ASSERT_TRUE(WIFEXITED(r.status));
  EXPECT_EQ(WEXITSTATUS(r.status), 2);
  EXPECT_NE(r.output.find("bad.yaml:3:3: key 'cluster.worker': unknown key"), std::string::npos)
      << r.output;
}

TEST_F(CliTest, ServerRefusesARankOutsideTheCluster) {
  WriteFile(dir_ + "/m.yaml", PortsManifest(2, 1));
  ProcessRun r = RunParasol({"server", "--manifest", dir_ + "/m.yaml", "--rank", "2"}, dir_);
  ASSERT_TRUE(WIFEXITED(r.status));
  EXPECT_EQ(WEXITSTATUS(r.status), 2);
  EXPECT_NE(r.output.find("--rank 2 is out of range"), std::string::npos) << r.output;
}

TEST_F(CliTest, ACudaWorkerWithoutAGpuFailsAtStartSayingWhy) {
  if (CudaDeviceAvailable()) GTEST_SKIP() << "this machine has a CUDA device";
  WriteFile(dir_ + "/m.yaml", PortsManifest(1, 1) + "worker: {device: cuda}\nmodel: {kind: lr}\n" +
                                  "data: {train: " + dir_ + "/none.tsv}\n");
  ProcessRun r = RunParasol({"worker", "--manifest", dir_ + "/m.yaml", "--rank", "0"}, dir_);
  ASSERT_TRUE(WIFEXITED(r.status));
  EXPECT_EQ(WEXITSTATUS(r.status), 2) << r.output;
  EXPECT_NE(r.output.find("worker.device is cuda"), std::string::npos) << r.output;
}

TEST_F(CliTest, SigtermStopsAServerCleanly) {
  WriteFile(dir_ + "/m.yaml", PortsManifest(1, 1));
  auto p = Subprocess::Spawn(
      {PARASOL_BINARY, "server", "--manifest", dir_ + "/m.yaml", "--rank", "0"}, dir_ + "/s.log");
  ASSERT_TRUE(p.ok());
  // Wait until it serves: a stats call answers.
  ProcessRun stats = RunParasol({"stats", "--manifest", dir_ + "/m.yaml"}, dir_);
  ASSERT_TRUE(WIFEXITED(stats.status) && WEXITSTATUS(stats.status) == 0) << stats.output;
  EXPECT_NE(stats.output.find("\"shard\":0"), std::string::npos) << stats.output;
  p->Signal(SIGTERM);
  auto st = p->Wait(std::chrono::seconds(20));
  ASSERT_TRUE(st.has_value()) << "server did not stop on SIGTERM";
  EXPECT_TRUE(WIFEXITED(*st) && WEXITSTATUS(*st) == 0) << DescribeWaitStatus(*st);
  EXPECT_NE(ReadFile(dir_ + "/s.log").find("stopped by signal 15"), std::string::npos);
}

TEST_F(CliTest, LaunchRunsAWholeCheckedJob) {
  WriteFile(dir_ + "/m.yaml", PortsManifest(2, 2));
  ProcessRun r = RunParasol({"launch", "--manifest", dir_ + "/m.yaml", "--steps", "5", "--batch-keys",
                      "2000", "--key-space", "50000"},
                     dir_);
  ASSERT_TRUE(WIFEXITED(r.status)) << r.output;
  EXPECT_EQ(WEXITSTATUS(r.status), 0) << r.output;
  EXPECT_NE(r.output.find("worker 0: OK"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("worker 1: OK"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("every worker's check passed"), std::string::npos) << r.output;
}

TEST_F(CliTest, ShutdownStopsEveryShard) {
  WriteFile(dir_ + "/m.yaml", PortsManifest(2, 1));
  std::vector<Subprocess> servers;
  for (int r = 0; r < 2; ++r) {
    auto p = Subprocess::Spawn({PARASOL_BINARY, "server", "--manifest", dir_ + "/m.yaml", "--rank",
                                std::to_string(r)},
                               dir_ + "/s" + std::to_string(r) + ".log");
    ASSERT_TRUE(p.ok());
    servers.push_back(std::move(*p));
  }
  ProcessRun r = RunParasol({"shutdown", "--manifest", dir_ + "/m.yaml"}, dir_);
  EXPECT_TRUE(WIFEXITED(r.status) && WEXITSTATUS(r.status) == 0) << r.output;
  for (auto& s : servers) {
    auto st = s.Wait(std::chrono::seconds(20));
    ASSERT_TRUE(st.has_value());
    EXPECT_TRUE(WIFEXITED(*st) && WEXITSTATUS(*st) == 0);
  }
}

TEST_F(CliTest, ShutdownWritesAFinalCheckpointThatHoldsEveryUpdate) {
  const std::string m = dir_ + "/m.yaml";
  WriteFile(m, PortsManifest(1, 1) + "training: {consistency: asp}\n" +
                   "checkpoint: {dir: ckpt, restore: true}\n");
  auto server = Subprocess::Spawn({PARASOL_BINARY, "server", "--manifest", m, "--rank", "0"},
                                  dir_ + "/s.log");
  ASSERT_TRUE(server.ok());
  Result<Manifest> manifest = LoadManifest(m);
  ASSERT_TRUE(manifest.ok()) << manifest.status().ToString();
  const std::vector<uint64_t> keys = {5, 6};
  std::vector<float> pushed(16);
  {
    auto c = PsClient::Connect(*manifest, 0);
    ASSERT_TRUE(c.ok()) << c.status().ToString();
    std::vector<float> grads(16, 0.5f);
    ASSERT_TRUE((*c)->PushSparse(0, keys, grads).ok());
    ASSERT_TRUE((*c)->PullSparse(0, keys, pushed.data()).ok());
  }
  ProcessRun r = RunParasol({"shutdown", "--manifest", m}, dir_);
  EXPECT_TRUE(WIFEXITED(r.status) && WEXITSTATUS(r.status) == 0) << r.output;
  auto st = server->Wait(std::chrono::seconds(20));
  ASSERT_TRUE(st.has_value());
  EXPECT_TRUE(WIFEXITED(*st) && WEXITSTATUS(*st) == 0) << DescribeWaitStatus(*st);
  const std::string log = ReadFile(dir_ + "/s.log");
  EXPECT_NE(log.find("(on shutdown) at clock 0:"), std::string::npos) << log;
  EXPECT_NE(log.find("shutdown requested by a client outside the job"), std::string::npos) << log;
  // Started again from it, the shard has the pushed rows.
  auto again = Subprocess::Spawn({PARASOL_BINARY, "server", "--manifest", m, "--rank", "0"},
                                 dir_ + "/s2.log");
  ASSERT_TRUE(again.ok());
  auto c = PsClient::Connect(*manifest, PsClient::kObserver);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  std::vector<float> restored(16);
  ASSERT_TRUE((*c)->PullSparse(0, keys, restored.data()).ok());
  EXPECT_EQ(restored, pushed);
  again->Signal(SIGTERM);
  EXPECT_TRUE(again->Wait(std::chrono::seconds(20)).has_value());
}

TEST_F(CliTest, AServerHostThatDoesNotResolveIsNamed) {
  const std::string m = dir_ + "/m.yaml";
  WriteFile(m, "cluster:\n  servers: [no-such-host.invalid:7000]\n  workers: 1\n"
               "  connect_timeout: 2s\n  bind: listed\n"
               "tables:\n  - {name: emb, kind: sparse, dim: 8}\n");
  ProcessRun stats = RunParasol({"stats", "--manifest", m}, dir_);
  ASSERT_TRUE(WIFEXITED(stats.status));
  EXPECT_NE(WEXITSTATUS(stats.status), 0);
  EXPECT_NE(stats.output.find("cannot resolve 'no-such-host.invalid'"), std::string::npos)
      << stats.output;
  ProcessRun server = RunParasol({"server", "--manifest", m, "--rank", "0"}, dir_);
  ASSERT_TRUE(WIFEXITED(server.status));
  EXPECT_NE(WEXITSTATUS(server.status), 0);
  EXPECT_NE(server.output.find("cannot resolve 'no-such-host.invalid'"), std::string::npos)
      << server.output;
}

}  // namespace
}  // namespace parasol
