// The `parasol` program as a user runs it.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>

#include <chrono>
#include <filesystem>
#include <sstream>
#include <thread>
#include <vector>

#include "common/manifest.hpp"
#include "common/net.hpp"
#include "common/subprocess.hpp"
#include "server/startup_checks.hpp"
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
  // Starts `parasol server` for rank 0 of a 1-server manifest (its log s.log) and returns it
  // once it serves: a stats call has answered, naming shard 0.
  Subprocess StartServingServer() {
    WriteFile(dir_ + "/m.yaml", PortsManifest(1, 1));
    auto p = Subprocess::Spawn(
        {PARASOL_BINARY, "server", "--manifest", dir_ + "/m.yaml", "--rank", "0"},
        dir_ + "/s.log");
    EXPECT_TRUE(p.ok()) << p.status().ToString();
    if (!p.ok()) return Subprocess();
    ProcessRun stats = RunParasol({"stats", "--manifest", dir_ + "/m.yaml"}, dir_);
    EXPECT_TRUE(WIFEXITED(stats.status) && WEXITSTATUS(stats.status) == 0) << stats.output;
    EXPECT_NE(stats.output.find("\"shard\":0"), std::string::npos) << stats.output;
    return std::move(*p);
  }
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
  Subprocess p = StartServingServer();
  ASSERT_FALSE(HasFailure());
  p.Signal(SIGTERM);
  auto st = p.Wait(std::chrono::seconds(20));
  ASSERT_TRUE(st.has_value()) << "server did not stop on SIGTERM";
  EXPECT_TRUE(WIFEXITED(*st) && WEXITSTATUS(*st) == 0) << DescribeWaitStatus(*st);
  EXPECT_NE(ReadFile(dir_ + "/s.log").find("stopped by signal 15"), std::string::npos);
}

// CPU time (user + system, clock ticks) of each thread of `pid` but its first, from
// /proc/PID/task/TID/stat; empty if it cannot be read.
std::vector<long> OtherThreadsTicks(pid_t pid) {
  std::vector<long> ticks;
  std::error_code ec;
  for (const auto& task :
       std::filesystem::directory_iterator("/proc/" + std::to_string(pid) + "/task", ec)) {
    if (task.path().filename() == std::to_string(pid)) continue;
    std::string stat = ReadFile(task.path().string() + "/stat");
    const size_t close = stat.rfind(')');  // the name may hold blanks
    if (close == std::string::npos) continue;
    std::istringstream in(stat.substr(close + 2));
    std::string field;
    long utime = 0, stime = 0;
    for (int i = 3; i <= 15 && in >> field; ++i) {
      if (i == 14) utime = std::stol(field);
      if (i == 15) stime = std::stol(field);
    }
    ticks.push_back(utime + stime);
  }
  return ticks;
}

// An idle server's threads other than its first take no CPU. Before the program ended
// OpenBLAS's pool (worker/backend.hpp: EndIdleBlasThreads), the pool's thread spun for about
// 0.1 s at start: 6-12 ticks (60-120 ms) of a core in every server, worker and launcher.
TEST_F(CliTest, AnIdleServersThreadsTakeNoCpu) {
  Subprocess p = StartServingServer();
  ASSERT_FALSE(HasFailure());
  // Idle for a second.
  std::this_thread::sleep_for(std::chrono::seconds(1));
  const std::vector<long> ticks = OtherThreadsTicks(p.pid());
  ASSERT_GE(ticks.size(), 3u);  // engine threads, ZeroMQ's, the signal watcher
  long total = 0;
  for (long t : ticks) total += t;
  std::printf("[ figure   ] %zu threads besides the first: %ld ticks of CPU\n", ticks.size(),
              total);
  EXPECT_LE(total, 3) << "ticks of the threads besides the first";
  p.Signal(SIGTERM);
  ASSERT_TRUE(p.Wait(std::chrono::seconds(20)).has_value());
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


double SecondsSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

TEST_F(CliTest, ServerRefusesAManifestThatIsADeviceNamingTheCap) {
  const auto start = std::chrono::steady_clock::now();
  ProcessRun r = RunParasol({"server", "--manifest", "/dev/zero", "--rank", "0"}, dir_);
  ASSERT_TRUE(WIFEXITED(r.status)) << r.output;
  EXPECT_EQ(WEXITSTATUS(r.status), 2);
  EXPECT_NE(r.output.find("manifest '/dev/zero' is larger than the limit of 16777216 bytes "
                          "(16 MiB)"),
            std::string::npos)
      << r.output;
  EXPECT_LT(SecondsSince(start), 20.0);
}

TEST_F(CliTest, LaunchRefusesMoreProcessesThanItsLimitBeforeStartingAny) {
  std::string y = "cluster:\n  servers:\n";
  for (int s = 0; s < 300; ++s) y += "    - 127.0.0.1:" + std::to_string(20000 + s) + "\n";
  y += "  workers: 2\ntables:\n  - {name: emb, dim: 8}\n";
  WriteFile(dir_ + "/big.yaml", y);
  const auto start = std::chrono::steady_clock::now();
  ProcessRun r = RunParasol({"launch", dir_ + "/big.yaml"}, dir_);
  ASSERT_TRUE(WIFEXITED(r.status)) << r.output;
  EXPECT_EQ(WEXITSTATUS(r.status), 2);
  EXPECT_NE(r.output.find("big.yaml lists 300 servers and 2 workers: 302 processes, over the "
                          "limit of 256 that launch starts on one machine"),
            std::string::npos)
      << r.output;
  EXPECT_EQ(r.output.find("[server 0]"), std::string::npos) << r.output;
  EXPECT_LT(SecondsSince(start), 20.0);
}

TEST_F(CliTest, ServerRefusesDenseTablesLargerThanTheMachine) {
  // 2^34 elements with Adam's three state arrays: 256 GiB.
  const uint64_t need = (uint64_t{1} << 34) * 16;
  const MachineMemory memory = DetectMachineMemory();
  if (memory.bytes >= need) GTEST_SKIP() << "this machine has " << memory.bytes << " bytes";
  WriteFile(dir_ + "/m.yaml", PortsManifest(1, 1) +
                                  "  - {name: huge, kind: dense, shape: [131072, 131072], "
                                  "optimizer: {kind: adam}}\n");
  ProcessRun r = RunParasol({"server", "--manifest", dir_ + "/m.yaml", "--rank", "0"}, dir_);
  ASSERT_TRUE(WIFEXITED(r.status)) << r.output;
  EXPECT_EQ(WEXITSTATUS(r.status), 2) << r.output;
  EXPECT_NE(r.output.find("shard 0: dense table 'huge' needs " + std::to_string(need) +
                          " bytes (256.0 GiB) for its values and optimizer state on this shard"),
            std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("more than this machine has: " + std::to_string(memory.bytes)),
            std::string::npos)
      << r.output;
}

TEST_F(CliTest, AServerWhoseAllocationFailsSaysSoInsteadOfAborting) {
  // 8 GB of table under a 4 GB address-space limit: the check against the machine's memory
  // passes (where it has 8 GB), the allocation fails.
  if (DetectMachineMemory().bytes < (uint64_t{9} << 30)) GTEST_SKIP() << "under 9 GiB of memory";
  WriteFile(dir_ + "/m.yaml",
            PortsManifest(1, 1) + "  - {name: big, kind: dense, shape: [100000, 20000]}\n");
  auto p = Subprocess::Spawn({"/bin/bash", "-c",
                              std::string("ulimit -v 4000000; exec ") + PARASOL_BINARY +
                                  " server --manifest " + dir_ + "/m.yaml --rank 0"},
                             dir_ + "/s.log");
  ASSERT_TRUE(p.ok());
  auto st = p->Wait(std::chrono::seconds(60));
  ASSERT_TRUE(st.has_value()) << ReadFile(dir_ + "/s.log");
  EXPECT_TRUE(WIFEXITED(*st) && WEXITSTATUS(*st) == 1) << DescribeWaitStatus(*st);
  EXPECT_NE(ReadFile(dir_ + "/s.log").find("shard 0: out of memory (an allocation failed)"),
            std::string::npos)
      << ReadFile(dir_ + "/s.log");
}

TEST_F(CliTest, ServerRefusesACheckpointDirThatIsNotADirectoryAtStart) {
  WriteFile(dir_ + "/m.yaml", PortsManifest(1, 1) + "checkpoint: {dir: /dev/null}\n");
  ProcessRun r = RunParasol({"server", "--manifest", dir_ + "/m.yaml", "--rank", "0"}, dir_);
  ASSERT_TRUE(WIFEXITED(r.status)) << r.output;
  EXPECT_EQ(WEXITSTATUS(r.status), 2);
  EXPECT_NE(r.output.find("shard 0: checkpoint.dir '/dev/null' is not a directory"),
            std::string::npos)
      << r.output;
  // A folder it can create is made, with the shard's own in it.
  WriteFile(dir_ + "/ok.yaml", PortsManifest(1, 1) + "checkpoint: {dir: " + dir_ + "/new/ckpt}\n");
  ASSERT_TRUE(CheckCheckpointDir(*LoadManifest(dir_ + "/ok.yaml"), 0).ok());
  EXPECT_TRUE(std::filesystem::is_directory(dir_ + "/new/ckpt/shard-0"));
}

TEST_F(CliTest, ServerRefusesACheckpointNamedBeyondTheLargestSequence) {
  WriteFile(dir_ + "/m.yaml", PortsManifest(1, 1) + "checkpoint: {dir: " + dir_ + "/ckpt}\n");
  std::filesystem::create_directories(dir_ + "/ckpt/shard-0");
  WriteFile(dir_ + "/ckpt/shard-0/ckpt-18446744073709551615.bin", "x");
  ProcessRun r = RunParasol({"server", "--manifest", dir_ + "/m.yaml", "--rank", "0"}, dir_);
  ASSERT_TRUE(WIFEXITED(r.status)) << r.output;
  EXPECT_NE(WEXITSTATUS(r.status), 0);
  EXPECT_NE(r.output.find("ckpt-18446744073709551615.bin' names a sequence of 20 digits, beyond "
                          "the largest a checkpoint may have (9999999999)"),
            std::string::npos)
      << r.output;
}

TEST_F(CliTest, CountsAreParsedStrictlyNamingTheFlag) {
  const std::string m = dir_ + "/m.yaml";
  WriteFile(m, PortsManifest(1, 1));
  struct Case {
    std::vector<std::string> args;
    std::string expected;
  };
  const std::vector<Case> cases = {
      {{"gen-data", "--rows=-5", "--out", dir_ + "/d.tsv"},
       "--rows: expected a count in [1, 10000000000] (digits only), got '-5'"},
      {{"gen-data", "--rows", "99999999999999999999", "--out", dir_ + "/d.tsv"},
       "--rows: value 99999999999999999999 is above the limit of 10000000000"},
      {{"gen-data", "--rows", "0x10", "--out", dir_ + "/d.tsv"}, "--rows: expected a count"},
      {{"gen-data", "--rows", "10", "--seed", "18446744073709551616", "--out", dir_ + "/d.tsv"},
       "--seed: value 18446744073709551616 is above the limit of 18446744073709551615"},
      {{"scale", "--manifest", m, "--workers", "0"},
       "--workers: value 0 is below the least allowed, 1"},
      {{"scale", "--manifest", m, "--servers=-1"}, "--servers: expected a count"},
      {{"server", "--manifest", m, "--rank", "4294967296"},
       "--rank: value 4294967296 is above the limit of 4294967295"},
      {{"export", "--manifest", m, "--out", dir_ + "/x", "--sequence", "10000000000"},
       "--sequence: value 10000000000 is above the limit of 9999999999"},
      {{"loadgen", "--manifest", m, "--zipf", "inf"}, "--zipf: expected a finite number, got 'inf'"},
  };
  for (const Case& c : cases) {
    ProcessRun r = RunParasol(c.args, dir_);
    ASSERT_TRUE(WIFEXITED(r.status)) << r.output;
    EXPECT_NE(WEXITSTATUS(r.status), 0) << c.args[0] << " " << c.args[1];
    EXPECT_NE(r.output.find(c.expected), std::string::npos) << c.expected << "\n" << r.output;
  }
  EXPECT_FALSE(std::filesystem::exists(dir_ + "/d.tsv"));
}

}  // namespace
}  // namespace parasol
