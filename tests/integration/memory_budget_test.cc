// A shard with a tiered table holds to server.memory_budget: it runs in a memory cgroup whose
// limit is its own footprint with empty tables (the program, its libraries, its threads)
// plus the budget plus a stated slack, is trained over a table of about twice the rows the
// budget holds, checkpointed, and every row read back; it must never be OOM-killed. Where no
// memory cgroup can be made (not root, no memory controller), the test says why and skips.
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "common/net.hpp"
#include "tests/support/test_cluster.hpp"

namespace parasol {
namespace {

using testing::ReadFile;

// A memory cgroup of this test's own (v2 where the memory controller is there, else v1).
class MemoryCgroup {
 public:
  // Made under this process's own cgroup; an error says why none can be.
  static Result<MemoryCgroup> Create() {
    std::ifstream self("/proc/self/cgroup");
    std::string line, v1_path, v2_path;
    bool v2_line = false;
    while (std::getline(self, line)) {
      const size_t a = line.find(':'), b = line.find(':', a + 1);
      if (a == std::string::npos || b == std::string::npos) continue;
      const std::string controllers = line.substr(a + 1, b - a - 1), path = line.substr(b + 1);
      if (controllers.empty() && line.rfind("0:", 0) == 0) {
        v2_path = path;
        v2_line = true;
      }
      std::stringstream list(controllers);
      for (std::string c; std::getline(list, c, ',');) {
        if (c == "memory") v1_path = path;
      }
    }
    MemoryCgroup g;
    const std::string name = "/parasol-memory-test-" + std::to_string(::getpid());
    const std::string v2_root = "/sys/fs/cgroup";
    if (v2_line && ReadFile(v2_root + "/cgroup.controllers").find("memory") != std::string::npos) {
      g.v2_ = true;
      g.dir_ = v2_root + (v2_path == "/" ? "" : v2_path) + name;
    } else if (!v1_path.empty() && std::filesystem::exists("/sys/fs/cgroup/memory")) {
      g.dir_ = "/sys/fs/cgroup/memory" + (v1_path == "/" ? "" : v1_path) + name;
    } else {
      return NotFound("no memory cgroup controller on this machine (v1 or v2)");
    }
    std::error_code ec;
    std::filesystem::create_directory(g.dir_, ec);
    if (ec) return FailedPrecondition("cannot make cgroup " + g.dir_ + ": " + ec.message());
    return g;
  }

  MemoryCgroup() = default;
  MemoryCgroup(MemoryCgroup&& o) noexcept : dir_(std::move(o.dir_)), v2_(o.v2_) { o.dir_.clear(); }
  ~MemoryCgroup() {
    if (dir_.empty()) return;
    for (int i = 0; i < 50 && ::rmdir(dir_.c_str()) != 0; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));  // its process is leaving
    }
  }

  const std::string& dir() const { return dir_; }
  bool v2() const { return v2_; }
  std::string procs() const { return dir_ + "/cgroup.procs"; }
  bool SetLimit(uint64_t bytes) const {
    std::ofstream(dir_ + (v2_ ? "/memory.max" : "/memory.limit_in_bytes")) << bytes;
    return Number(v2_ ? "memory.max" : "memory.limit_in_bytes") == bytes;
  }
  uint64_t Usage() const { return Number(v2_ ? "memory.current" : "memory.usage_in_bytes"); }
  // The most it held (v2 without memory.peak: 0).
  uint64_t Peak() const { return Number(v2_ ? "memory.peak" : "memory.max_usage_in_bytes"); }
  // Anonymous memory now (the heap and stacks: what the OOM killer cannot reclaim; page cache,
  // which the kernel reclaims at the limit, left out).
  uint64_t Anonymous() const {
    std::stringstream in(ReadFile(dir_ + "/memory.stat"));
    std::string key;
    uint64_t value = 0, total = 0;
    while (in >> key >> value) {
      if (v2_ ? key == "anon" : (key == "rss" || key == "rss_huge")) total += value;
    }
    return total;
  }
  // Processes the OOM killer killed in it.
  uint64_t OomKills() const {
    std::stringstream in(ReadFile(dir_ + (v2_ ? "/memory.events" : "/memory.oom_control")));
    std::string key;
    uint64_t value = 0;
    while (in >> key >> value) {
      if (key == "oom_kill") return value;
    }
    return 0;
  }

 private:
  uint64_t Number(const std::string& file) const {
    const std::string text = ReadFile(dir_ + "/" + file);
    return text.empty() ? 0 : std::strtoull(text.c_str(), nullptr, 10);
  }
  std::string dir_;
  bool v2_ = false;
};

constexpr uint64_t kBudget = 32ull << 20;
constexpr uint64_t kSlack = 48ull << 20;  // allocator arenas, thread stacks, ZeroMQ buffers
constexpr uint32_t kDim = 16;

TEST(MemoryBudgetTest, ATieredShardInACgroupOfItsBudgetIsNeverOomKilled) {
  if (::geteuid() != 0) GTEST_SKIP() << "not root: cannot make a memory cgroup";
  Result<MemoryCgroup> cgroup = MemoryCgroup::Create();
  if (!cgroup.ok()) GTEST_SKIP() << cgroup.status().ToString();
  const std::string dir = testing::MakeTempDir();
  const std::vector<uint16_t> ports = *PickFreePorts(1);
  const std::string manifest = dir + "/job.yaml";
  testing::WriteFile(manifest,
                     "cluster:\n  servers: [\"127.0.0.1:" + std::to_string(ports[0]) +
                         "\"]\n  workers: 1\n  request_timeout: 60s\n"
                         "training:\n  consistency: asp\n"
                         "server:\n  memory_budget: " + std::to_string(kBudget) +
                         "\n  disk_dir: " + dir + "/disk\n"
                         "checkpoint:\n  dir: " + dir + "/ckpt\n"
                         "tables:\n  - {name: emb, dim: 16, storage: tiered, "
                         "optimizer: {kind: adagrad, lr: 0.05}}\n");
  auto m = LoadManifest(manifest);
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  // The shard joins the cgroup before it becomes parasol.
  auto server = Subprocess::Spawn({"/bin/sh", "-c",
                                   "echo $$ > " + cgroup->procs() + " && exec " +
                                       std::string(PARASOL_BINARY) + " server --manifest " +
                                       manifest + " --rank 0"},
                                  dir + "/server.log");
  ASSERT_TRUE(server.ok()) << server.status().ToString();
  auto client = PsClient::Connect(*m, 0);
  ASSERT_TRUE(client.ok()) << client.status().ToString();
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  const uint64_t empty = cgroup->Usage();
  const uint64_t empty_anonymous = cgroup->Anonymous();
  ASSERT_GT(empty, 0u) << "the shard is not in " << cgroup->dir();
  const uint64_t limit = empty + kBudget + kSlack;
  ASSERT_TRUE(cgroup->SetLimit(limit)) << cgroup->dir();
  std::printf("[ cgroup   ] %s (v%d): the empty shard holds %.1f MiB; limit %.1f MiB "
              "(+ budget %.0f MiB + slack %.0f MiB)\n",
              cgroup->dir().c_str(), cgroup->v2() ? 2 : 1, empty / 1048576.0, limit / 1048576.0,
              kBudget / 1048576.0, kSlack / 1048576.0);

  // About 600,000 rows of 16 values and their state (~ 160 bytes each in memory): three times
  // the rows the budget holds. Pushed in random batches, then read back whole.
  constexpr uint64_t kRows = 600000;
  constexpr size_t kBatch = 20000;
  std::mt19937_64 rng(5);
  uint64_t anonymous_peak = 0;  // sampled after every request
  auto sample = [&] { anonymous_peak = std::max(anonymous_peak, cgroup->Anonymous()); };
  std::vector<uint64_t> keys(kBatch);
  std::vector<float> grads(kBatch * kDim, 0.5f), rows(kBatch * kDim);
  for (uint64_t first = 0; first < kRows; first += kBatch) {
    for (size_t i = 0; i < kBatch; ++i) keys[i] = first + i;
    ASSERT_TRUE((*client)->PushSparse(0, keys, grads).ok()) << "batch at " << first;
    sample();
  }
  for (int round = 0; round < 20; ++round) {
    for (uint64_t& k : keys) k = rng() % kRows;
    ASSERT_TRUE((*client)->PushSparse(0, keys, grads).ok()) << "round " << round;
    ASSERT_TRUE((*client)->PullSparse(0, keys, rows.data()).ok()) << "round " << round;
    sample();
  }
  // Every row as it is before the checkpoint (on either tier)...
  std::vector<float> before(kRows * kDim);
  for (uint64_t first = 0; first < kRows; first += kBatch) {
    for (size_t i = 0; i < kBatch; ++i) keys[i] = first + i;
    ASSERT_TRUE((*client)->PullSparse(0, keys, &before[first * kDim]).ok()) << first;
    sample();
  }
  ASSERT_TRUE((*client)->Checkpoint().ok());
  sample();
  // ...and after it, in another order: the same values, bit for bit (a row lost between the
  // tiers would come back as a new row's initial values).
  uint64_t same = 0;
  for (uint64_t first = kRows; first > 0; first -= kBatch) {
    for (size_t i = 0; i < kBatch; ++i) keys[i] = first - kBatch + i;
    ASSERT_TRUE((*client)->PullSparse(0, keys, rows.data()).ok()) << first;
    same += std::memcmp(rows.data(), &before[(first - kBatch) * kDim],
                        rows.size() * sizeof(float)) == 0
                ? kBatch
                : 0;
    sample();
  }
  uint64_t read = same;
  auto stats = (*client)->StatsOf(0);
  ASSERT_TRUE(stats.ok()) << stats.status().ToString();
  EXPECT_EQ(read, kRows);
  EXPECT_TRUE(server->running()) << ReadFile(dir + "/server.log");
  EXPECT_EQ(cgroup->OomKills(), 0u);
  // The cgroup's own peak counts page cache (the disk tier's files, the checkpoint), which
  // the kernel reclaims at the limit; anonymous memory is what must fit.
  std::printf("[ cgroup   ] peak %.1f MiB (page cache included) of a %.1f MiB limit; anonymous "
              "memory %.1f MiB at most, sampled after each request (%.1f MiB over the empty "
              "shard's); %s\n",
              cgroup->Peak() / 1048576.0, limit / 1048576.0, anonymous_peak / 1048576.0,
              (anonymous_peak - std::min(anonymous_peak, empty_anonymous)) / 1048576.0,
              stats->c_str());
  (void)(*client)->Shutdown();
  client->reset();
  server->Wait(std::chrono::seconds(30));
  testing::RemoveTree(dir);
}

}  // namespace
}  // namespace parasol
