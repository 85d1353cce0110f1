// A job whose shard count changes while it trains (`parasol scale --servers`; worker/reshard.hpp):
// dlrm-small under BSP with one worker, 3 shards listed and 2 holding keys at the start. The
// shard count goes to 3 once the job has passed a clock drawn from a printed seed, and back to 2
// once it has passed a later drawn clock. Three runs: every shard running throughout; all
// three shards killed (SIGKILL) a drawn moment (0 to 150 ms) into the second change, started
// again from their checkpoints (taken during the change), and the change finished by running
// the tool again; the third shard started only before the first change and killed once the
// second has returned (a shard outside the placement needs not run).
//
// The model must equal, bit for bit, the same job run with 3 shards from the start (every
// key's row with its optimizer state, and every dense value, from each job's final checkpoints
// through `parasol export` and `compare-models`), with no key in two shards' checkpoints, and
// the shards of both jobs must hold the same number of rows. After each change every dense
// tensor is cut among the shards the job has then (the one that left holds none).
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstdio>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/manifest.hpp"
#include "common/net.hpp"
#include "common/sharding.hpp"
#include "common/subprocess.hpp"
#include "tests/support/test_cluster.hpp"
#include "tests/support/test_seed.hpp"
#include "worker/data_generator.hpp"
#include "worker/ps_client.hpp"

namespace parasol {
namespace {

using testing::MakeTempDir;
using testing::ReadFile;
using testing::RemoveTree;
using testing::WriteFile;

constexpr uint32_t kRows = 120000;

struct Job {
  std::string dir;
  std::string name;
  std::string manifest_path;
  Manifest manifest;
  std::vector<Subprocess> servers;
  Subprocess worker;
  std::string Log(const std::string& role) const { return dir + "/" + name + "-" + role + ".log"; }
};

// Starts shard `s` of `job`.
void StartServer(Job* job, int s) {
  auto p = Subprocess::Spawn({PARASOL_BINARY, "server", "--manifest", job->manifest_path,
                              "--rank", std::to_string(s)},
                             job->Log("server" + std::to_string(s)));
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  job->servers[s] = std::move(*p);
}

// Writes the manifest of job `name` (3 shards listed, `initial` of them holding keys) and starts
// its worker and servers: every listed one, or (`only_initial`) those holding keys.
void StartJob(const std::string& dir, const std::string& name, uint32_t initial, Job* job,
              bool only_initial = false) {
  job->dir = dir;
  job->name = name;
  const std::vector<uint16_t> ports = *PickFreePorts(3);
  job->manifest_path = dir + "/" + name + ".yaml";
  WriteFile(job->manifest_path,
            "job: {name: reshard, seed: 5}\n"
            "cluster:\n  servers: [127.0.0.1:" + std::to_string(ports[0]) + ", 127.0.0.1:" +
                std::to_string(ports[1]) + ", 127.0.0.1:" + std::to_string(ports[2]) +
                "]\n  initial_servers: " + std::to_string(initial) +
                "\n  workers: 1\n  request_timeout: 1s\n  request_retries: 60\n"
                "training: {consistency: bsp, batch_size: 64, epochs: 1, worker_timeout: 60s}\n"
                "model: {kind: dlrm, embedding_dim: 8, bottom: [32, 8], top: [32, 16, 1]}\n"
                "data: {train: " + dir + "/train.tsv}\n"
                "checkpoint: {dir: " + dir + "/" + name + "-ckpt, every_seconds: 1, keep: 3}\n");
  Result<Manifest> m = LoadManifest(job->manifest_path);
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  job->manifest = *m;
  job->servers.resize(3);
  for (uint32_t s = 0; s < (only_initial ? initial : 3u); ++s) {
    StartServer(job, static_cast<int>(s));
    if (::testing::Test::HasFatalFailure()) return;
  }
  auto w = Subprocess::Spawn({PARASOL_BINARY, "worker", "--manifest", job->manifest_path,
                              "--rank", "0"},
                             job->Log("worker0"));
  ASSERT_TRUE(w.ok()) << w.status().ToString();
  job->worker = std::move(*w);
}

// The stats of shards 0 .. `shards` - 1, parsed (empty on failure).
std::vector<nlohmann::json> ShardStats(PsClient& observer, uint32_t shards) {
  std::vector<nlohmann::json> out;
  for (uint32_t s = 0; s < shards; ++s) {
    Result<std::string> stats = observer.StatsOf(s);
    if (!stats.ok()) return {};
    out.push_back(nlohmann::json::parse(*stats, nullptr, false));
  }
  return out;
}


// Rows of the embedding table on shards 0 .. `shards` - 1 together.
uint64_t TotalRows(PsClient& observer, uint32_t shards) {
  uint64_t rows = 0;
  for (const auto& s : ShardStats(observer, shards)) {
    if (s.is_discarded()) return 0;
    for (const auto& t : s["tables"]) {
      if (t["kind"] == "sparse") rows += t["rows"].get<uint64_t>();
    }
  }
  return rows;
}

// Runs `parasol scale --servers N` until it succeeds (at most 5 times); `kill_after`: a first
// try during which every shard is killed that long after the tool started, then restarted.
bool Scale(Job& job, uint32_t servers, std::chrono::milliseconds kill_after = {},
           bool kill = false) {
  for (int attempt = 1; attempt <= 5; ++attempt) {
    auto tool = Subprocess::Spawn({PARASOL_BINARY, "scale", "--manifest", job.manifest_path,
                                   "--servers", std::to_string(servers), "--timeout", "60"},
                                  job.Log("scale"));
    if (!tool.ok()) return false;
    if (kill && attempt == 1) {
      std::this_thread::sleep_for(kill_after);
      for (auto& s : job.servers) s.Signal(SIGKILL);
      for (auto& s : job.servers) (void)s.Wait(std::chrono::seconds(10));
      std::printf("[ reshard  ] killed every shard %lld ms into the change to %u shards\n",
                  static_cast<long long>(kill_after.count()), servers);
      for (int s = 0; s < 3; ++s) {
        auto p = Subprocess::Spawn({PARASOL_BINARY, "server", "--manifest", job.manifest_path,
                                    "--rank", std::to_string(s)},
                                   job.Log("server" + std::to_string(s)));
        if (!p.ok()) return false;
        job.servers[s] = std::move(*p);
      }
    }
    auto st = tool->Wait(std::chrono::seconds(90));
    if (st && WIFEXITED(*st) && WEXITSTATUS(*st) == 0) return true;
    if (!st) tool->Signal(SIGKILL);
  }
  return false;
}

// `parasol export` of a job's final checkpoints, then `parasol compare-models` against
// another's: its JSON.
nlohmann::json CompareModels(const Job& a, const Job& b) {
  for (const Job* j : {&a, &b}) {
    auto p = Subprocess::Spawn({PARASOL_BINARY, "export", "--manifest", j->manifest_path, "--out",
                                j->dir + "/" + j->name + "-model"},
                               j->Log("export"));
    EXPECT_TRUE(p.ok());
    if (!p.ok()) return {};
    auto st = p->Wait(std::chrono::seconds(60));
    EXPECT_TRUE(st && WIFEXITED(*st) && WEXITSTATUS(*st) == 0) << ReadFile(j->Log("export"));
  }
  const std::string out = a.dir + "/compare.json";
  auto p = Subprocess::Spawn({PARASOL_BINARY, "compare-models", "--manifest", a.manifest_path,
                              a.dir + "/" + a.name + "-model", b.dir + "/" + b.name + "-model"},
                             out);
  EXPECT_TRUE(p.ok());
  if (!p.ok()) return {};
  (void)p->Wait(std::chrono::seconds(60));
  const std::string text = ReadFile(out);
  const size_t brace = text.find('{');
  return nlohmann::json::parse(brace == std::string::npos ? "" : text.substr(brace), nullptr,
                               false);
}

// Every dense tensor of `manifest` cut among `count` of the shards whose `stats` are given,
// each a whole slice (the others hold none), and the tensors' elements all held once.
void ExpectDenseCut(const Manifest& manifest, const std::vector<nlohmann::json>& stats,
                    uint32_t count) {
  int dense = 0;
  for (uint32_t t = 0; t < manifest.tables.size(); ++t) {
    if (manifest.tables[t].kind != TableKind::kDense) continue;
    ++dense;
    const uint64_t total = manifest.tables[t].NumElements();
    for (uint32_t r = 0; r < stats.size(); ++r) {
      const nlohmann::json& table = stats[r]["tables"][t];
      const SliceRange want = r < count ? DenseSlice(total, r, count) : SliceRange{0, 0};
      EXPECT_EQ(table["slice_end"].get<uint64_t>() - table["slice_begin"].get<uint64_t>(),
                want.size())
          << "shard " << r << ", table " << manifest.tables[t].name << ": " << table.dump();
      if (want.size() > 0) { EXPECT_EQ(table["slice_begin"].get<uint64_t>(), want.begin); }
    }
  }
  EXPECT_GT(dense, 0);
}

// How a run treats its shards.
enum class Shards {
  kAllRun,      // all three run from the start to the end
  kKilled,      // all three run; every one is killed into the second change
  kThirdComes,  // the third runs only while it holds keys: started before the first change,
                // stopped (SIGKILL) after the second
};

void RunReshardJob(uint64_t seed, Shards mode) {
  std::mt19937_64 rng(seed);
  const int64_t grow_after = std::uniform_int_distribution<int64_t>(150, 500)(rng);
  const int64_t shrink_after = grow_after + std::uniform_int_distribution<int64_t>(200, 600)(rng);
  const auto kill_after = std::chrono::milliseconds(std::uniform_int_distribution<int>(0, 150)(rng));
  const bool kill_shards = mode == Shards::kKilled;
  const bool third_comes = mode == Shards::kThirdComes;
  std::printf("[ reshard  ] seed %llu: 3 shards after clock %lld, 2 after clock %lld%s\n",
              static_cast<unsigned long long>(seed), static_cast<long long>(grow_after),
              static_cast<long long>(shrink_after),
              kill_shards ? (", every shard killed " + std::to_string(kill_after.count()) +
                             " ms into the second change").c_str()
              : third_comes ? ", the third shard running only while it holds keys"
                            : "");
  const std::string dir = MakeTempDir();
  GeneratorOptions g;
  g.rows = kRows;
  g.seed = seed;
  ASSERT_TRUE(GenerateCriteo(dir + "/train.tsv", g).ok());

  // The reference: 3 shards from the start.
  Job ref;
  StartJob(dir, "ref", 3, &ref);
  if (::testing::Test::HasFatalFailure()) return;
  auto st = ref.worker.Wait(std::chrono::seconds(120));
  ASSERT_TRUE(st && WIFEXITED(*st) && WEXITSTATUS(*st) == 0) << ReadFile(ref.Log("worker0"));
  auto ref_observer = PsClient::Connect(ref.manifest, PsClient::kObserver);
  ASSERT_TRUE(ref_observer.ok());
  const uint64_t ref_rows = TotalRows(**ref_observer, 3);

  Job job;
  StartJob(dir, "run", 2, &job, third_comes);
  if (::testing::Test::HasFatalFailure()) return;
  auto observer = PsClient::Connect(job.manifest, PsClient::kObserver);
  ASSERT_TRUE(observer.ok()) << observer.status().ToString();
  auto wait_for_clock = [&](int64_t clock) {
    return testing::WaitForWorkerClock(**observer, clock, std::chrono::seconds(60));
  };
  ASSERT_TRUE(wait_for_clock(grow_after)) << "the job never reached clock " << grow_after;
  if (third_comes) {
    StartServer(&job, 2);
    if (::testing::Test::HasFatalFailure()) return;
  }
  ASSERT_TRUE(Scale(job, 3)) << ReadFile(job.Log("scale"));
  // Dense tensors re-cut among the 3 (the tool returns once every shard has dropped).
  ExpectDenseCut(job.manifest, ShardStats(**observer, 3), 3);
  ASSERT_TRUE(wait_for_clock(shrink_after)) << "the job never reached clock " << shrink_after;
  ASSERT_TRUE(Scale(job, 2, kill_after, kill_shards)) << ReadFile(job.Log("scale"));
  std::vector<nlohmann::json> stats;
  if (third_comes) {
    // Holding nothing now: its last stats, then it goes (the job trains on without it).
    stats = ShardStats(**observer, 3);
    job.servers[2].Signal(SIGKILL);
    (void)job.servers[2].Wait(std::chrono::seconds(10));
  }
  st = job.worker.Wait(std::chrono::seconds(120));
  ASSERT_TRUE(st && WIFEXITED(*st) && WEXITSTATUS(*st) == 0) << ReadFile(job.Log("worker0"));

  // Both changes, named by shard 0 past the drawn clocks; the job ends with 2 shards.
  ASSERT_TRUE((*observer)->SyncMembership().ok());
  const auto& changes = (*observer)->membership().server_changes();
  ASSERT_EQ(changes.size(), 2u);
  EXPECT_GT(changes[0].clock, grow_after);
  EXPECT_EQ(changes[0].count, 3u);
  EXPECT_GT(changes[1].clock, shrink_after);
  EXPECT_EQ(changes[1].count, 2u);
  std::printf("[ reshard  ] 3 shards from clock %lld, 2 from clock %lld\n",
              static_cast<long long>(changes[0].clock), static_cast<long long>(changes[1].clock));
  if (!third_comes) stats = ShardStats(**observer, 3);
  ASSERT_EQ(stats.size(), 3u);
  for (const auto& s : stats) {
    ASSERT_FALSE(s.is_discarded());
    EXPECT_EQ(s["migration_dropped"].get<int64_t>(), changes[1].clock) << s.dump();
  }
  // The rows: as many as the reference's, and none on the shard that left.
  const uint64_t rows = TotalRows(**observer, 2);
  std::printf("[ reshard  ] rows: %llu on the resharded job's shards, %llu on the reference's\n",
              static_cast<unsigned long long>(rows), static_cast<unsigned long long>(ref_rows));
  EXPECT_GT(ref_rows, 10000u);
  EXPECT_EQ(rows, ref_rows);
  for (const auto& t : stats[2]["tables"]) {
    if (t["kind"] == "sparse") { EXPECT_EQ(t["rows"].get<uint64_t>(), 0u) << stats[2].dump(); }
  }
  ExpectDenseCut(job.manifest, stats, 2);

  // The final checkpoints, exported and compared.
  (void)(*observer)->Shutdown();
  (void)(*ref_observer)->Shutdown();
  for (Job* j : {&job, &ref}) {
    for (size_t i = 0; i < j->servers.size(); ++i) {
      if (j == &job && i == 2 && third_comes) continue;  // stopped above
      auto done = j->servers[i].Wait(std::chrono::seconds(30));
      EXPECT_TRUE(done.has_value()) << "a server of " << j->name << " did not stop";
    }
  }
  const nlohmann::json cmp = CompareModels(job, ref);
  ASSERT_FALSE(cmp.is_discarded()) << ReadFile(dir + "/compare.json");
  std::printf("[ reshard  ] against the reference: %s\n", cmp.dump().c_str());
  EXPECT_EQ(cmp["max_relative_difference"].get<double>(), 0.0);
  EXPECT_EQ(cmp["rows_in_one_only"].get<uint64_t>(), 0u);
  EXPECT_GT(cmp["values_compared"].get<uint64_t>(), 100000u);
  RemoveTree(dir);
}

TEST(ReshardTest, AShardJoinsAndLeavesWhileTrainingAndTheModelIsTheThreeShardJobsBitForBit) {
  const uint64_t base = testing::TestSeed();
  for (uint64_t i = 0; i < 3; ++i) {
    SCOPED_TRACE("seed " + std::to_string(base + i));
    RunReshardJob(base + i, i == 0 ? Shards::kAllRun : i == 1 ? Shards::kKilled
                                                              : Shards::kThirdComes);
    if (HasFatalFailure()) return;
  }
}

}  // namespace
}  // namespace parasol
