// Exactly-once at chosen points: a BSP dlrm-small job (2 servers, 2 workers, both restart
// flags) in which one process fails at a point of the durability design, injected through the
// fault seam (common/fault_points.hpp) at a hit number drawn from a printed seed. Each job must
// complete, the fault must have fired, and the final model (exported from the shards' last
// checkpoints) must equal an undisturbed run's value for value.
#include <gtest/gtest.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <algorithm>
#include <random>
#include <sstream>
#include <string>
#include <thread>

#include "common/fault_points.hpp"
#include "common/manifest.hpp"
#include "common/net.hpp"
#include "common/subprocess.hpp"
#include "server/checkpoint.hpp"
#include "server/model_export.hpp"
#include "tests/support/json_figures.hpp"
#include "tests/support/test_cluster.hpp"
#include "tests/support/test_seed.hpp"
#include "worker/data_generator.hpp"

namespace parasol {
namespace {

using testing::MakeTempDir;
using testing::ReadFile;
using testing::RemoveTree;
using testing::WriteFile;

class DurabilityTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new std::string(MakeTempDir());
    GeneratorOptions g;
    g.rows = 30000;
    ASSERT_TRUE(GenerateCriteo(*dir_ + "/train.tsv", g).ok());
    g.rows = 2000;
    g.seed = 9;
    ASSERT_TRUE(GenerateCriteo(*dir_ + "/eval.tsv", g).ok());
    // The undisturbed run, once for every test of the suite.
    reference_ = new ExportedModel();
    std::string error;
    const auto start = std::chrono::steady_clock::now();
    ASSERT_TRUE(RunJob("ref", "", &error)) << error;
    reference_ms_ = std::chrono::duration_cast<std::chrono::milliseconds>(
                        std::chrono::steady_clock::now() - start)
                        .count();
    auto m = Load("ref");
    ASSERT_TRUE(m.ok()) << m.status().ToString();
    *reference_ = std::move(*m);
  }
  static void TearDownTestSuite() {
    RemoveTree(*dir_);
    delete dir_;
    delete reference_;
  }

  // `servers`: 1 or 2. `extra`: more sections, appended.
  static std::string ManifestText(const std::string& name,
                                  const std::string& when = "every_seconds: 1",
                                  int servers = 2, int workers = 2,
                                  const std::string& extra = "") {
    const std::vector<uint16_t> ports = *PickFreePorts(2);
    const std::string second = servers == 2 ? ", 127.0.0.1:" + std::to_string(ports[1]) : "";
    return "job: {name: durability, seed: 5}\n"
           "cluster:\n  servers: [127.0.0.1:" + std::to_string(ports[0]) + second +
           "]\n  workers: " + std::to_string(workers) + "\n  request_timeout: 500ms\n"
           "  request_retries: 100\n  restart_servers: true\n  restart_workers: true\n"
           "training: {consistency: bsp, batch_size: 64, epochs: 1, worker_timeout: 60s}\n"
           "model: {kind: dlrm, embedding_dim: 8, bottom: [16, 8], top: [16, 1]}\n"
           "data: {train: " + *dir_ + "/train.tsv, eval: " + *dir_ + "/eval.tsv}\n"
           "checkpoint: {dir: " + *dir_ + "/" + name + "-ckpt, " + when + ", keep: 3}\n" +
           extra;
  }

  // Runs the job `name` with PARASOL_FAULTS=`faults` (each fault fires once in the job) and
  // waits for it; *log gets its output.
  static bool RunJob(const std::string& name, const std::string& faults, std::string* log,
                     const std::string& when = "every_seconds: 1", int servers = 2,
                     int workers = 2, const std::string& extra = "") {
    RemoveTree(*dir_ + "/" + name + "-ckpt");
    RemoveTree(*dir_ + "/" + name + "-marks");
    std::filesystem::create_directories(*dir_ + "/" + name + "-marks");
    WriteFile(*dir_ + "/" + name + ".yaml", ManifestText(name, when, servers, workers, extra));
    if (!faults.empty()) {
      ::setenv("PARASOL_FAULTS", faults.c_str(), 1);
      ::setenv("PARASOL_FAULTS_ONCE", (*dir_ + "/" + name + "-marks").c_str(), 1);
    }
    auto job = Subprocess::Spawn({PARASOL_BINARY, "launch", *dir_ + "/" + name + ".yaml"},
                                 *dir_ + "/" + name + ".log");
    ::unsetenv("PARASOL_FAULTS");
    ::unsetenv("PARASOL_FAULTS_ONCE");
    if (!job.ok()) {
      *log = job.status().ToString();
      return false;
    }
    auto status = job->Wait(std::chrono::seconds(240));
    *log = ReadFile(*dir_ + "/" + name + ".log");
    if (!status) job->Signal(SIGKILL);
    return status && WIFEXITED(*status) && WEXITSTATUS(*status) == 0;
  }

  static Result<ExportedModel> Load(const std::string& name) {
    PARASOL_ASSIGN_OR_RETURN(Manifest m, LoadManifest(*dir_ + "/" + name + ".yaml"));
    PARASOL_RETURN_IF_ERROR(ExportModel(m, {}, *dir_ + "/" + name + "-model"));
    return LoadExportedModel(m, *dir_ + "/" + name + "-model");
  }

  // Runs the job with the fault, checks it fired, completed and ends as the undisturbed run.
  // The job's log in *out_log, when given.
  void ExpectSameModel(const std::string& name, const std::string& faults,
                       const std::vector<std::string>& fired,
                       const std::string& when = "every_seconds: 1", int servers = 2,
                       std::string* out_log = nullptr) {
    SCOPED_TRACE("PARASOL_FAULTS=" + faults);
    std::printf("[ faults   ] %s\n", faults.c_str());
    std::string log;
    const bool ran = RunJob(name, faults, &log, when, servers);
    if (out_log) *out_log = log;
    ASSERT_TRUE(ran) << log;
    for (const std::string& point : fired) {
      EXPECT_TRUE(std::filesystem::exists(*dir_ + "/" + name + "-marks/" + point + ".fired"))
          << point << " never fired: the run was shorter than the hit drawn\n" << log;
    }
    ExpectNoReplayRefusedOrLost(log, servers);
    auto m = Load(name);
    ASSERT_TRUE(m.ok()) << m.status().ToString();
    const ModelDifference d = CompareModels(*m, *reference_);
    EXPECT_GT(d.values_compared, 1000u);
    EXPECT_EQ(d.max_relative, 0.0) << d.ToJson() << "\n" << log;
    EXPECT_EQ(d.rows_in_one_only, 0u) << d.ToJson();
  }

  // Every shard's last stats line says no replay was refused and none was lost.
  static void ExpectNoReplayRefusedOrLost(const std::string& log, int servers = 2) {
    const std::vector<Json> lines = testing::StoppingStats(log);
    for (const Json& stats : lines) {
      ASSERT_FALSE(stats.is_discarded()) << "a stats line that is not JSON\n" << log;
      EXPECT_EQ(stats.value("refused_replays", -1), 0) << stats.dump();
      EXPECT_EQ(stats.value("lost_replays", -1), 0) << stats.dump();
    }
    EXPECT_GE(lines.size(), static_cast<size_t>(servers))
        << "no shard logged its stats as it stopped\n" << log;
  }

  // A hit number in [lo, hi] from the printed seed.
  static uint64_t Draw(uint64_t seed, uint64_t lo, uint64_t hi) {
    std::mt19937_64 rng(seed);
    return lo + rng() % (hi - lo + 1);
  }

  static std::string* dir_;
  static ExportedModel* reference_;
  static int64_t reference_ms_;  // the undisturbed run's wall time
};

std::string* DurabilityTest::dir_ = nullptr;
ExportedModel* DurabilityTest::reference_ = nullptr;
int64_t DurabilityTest::reference_ms_ = 0;

// The seeds: fixed ones (reproducible) and one from the clock (printed), so that every run of
// the suite also tries a moment no earlier run tried.
std::vector<uint64_t> Seeds() {
  return {1, 2, testing::TestSeed() % 100000 + 3};
}

TEST_F(DurabilityTest, AWorkerKilledWithRequestsInFlightIsRestartedAndRedoesItsStep) {
  // At its first requests: before barrier 0, and after entering it on shard 0 only.
  for (uint64_t n : {3, 4}) {
    ExpectSameModel("early" + std::to_string(n), "client.send=kill@" + std::to_string(n),
                    {"client.send"});
  }
  // A worker sends 4 messages a step for 234 steps (a Step of pushes to each shard, then a Step
  // of the tick and the next step's pulls to each): any moment of the run, including between
  // its pushes (or ticks) to the two shards.
  for (uint64_t seed : Seeds()) {
    const uint64_t n = Draw(seed, 20, 900);
    std::printf("[ seed     ] %llu: client.send=kill@%llu\n", (unsigned long long)seed,
                (unsigned long long)n);
    ExpectSameModel("worker" + std::to_string(seed), "client.send=kill@" + std::to_string(n),
                    {"client.send"});
  }
}

// One shard: a worker sends its tick right behind its pushes. A message of pushes lost on its
// way (the tick behind it arrives) must not leave the pushes behind the clock: the shard
// refuses the tick for now, the worker resends the pushes when they are overdue and then the
// tick, with no restart, and the model is the undisturbed one (which the 2-shard reference
// is, value for value). A worker
// sends 2 messages a step, the pushes at even hits, then the tick with the next pulls (a lost
// one of those is resent only after training.worker_timeout, as pulls may be held): an even
// hit is drawn, and should it lose no pushes, the next one is tried.
TEST_F(DurabilityTest, AOneShardJobsLostPushesAreNeverLeftBehindTheTick) {
  for (uint64_t seed : Seeds()) {
    bool refused = false;
    const uint64_t first = Draw(seed, 10, 220) * 2;  // of about 470 messages a worker sends
    for (uint64_t n = first; n < first + 2 && !refused; ++n) {
      std::printf("[ seed     ] %llu: client.send=drop@%llu, one shard\n",
                  (unsigned long long)seed, (unsigned long long)n);
      std::string log;
      ExpectSameModel("lost" + std::to_string(seed) + "-" + std::to_string(n),
                      "client.send=drop@" + std::to_string(n), {"client.send"},
                      "every_seconds: 1", /*servers=*/1, &log);
      if (HasFailure()) return;
      refused = log.find("has not been applied here") != std::string::npos;
      EXPECT_EQ(log.find("restarted at clock"), std::string::npos) << log;
    }
    EXPECT_TRUE(refused) << "neither hit " << first << " nor the next lost a message of pushes";
  }
}

TEST_F(DurabilityTest, AShardKilledAfterApplyingAPushBeforeAcknowledgingIt) {
  for (uint64_t seed : Seeds()) {
    const uint64_t n = Draw(seed, 5, 3500);  // of about 4000 pushes a shard applies
    std::printf("[ seed     ] %llu: shard.applied=kill@%llu\n", (unsigned long long)seed,
                (unsigned long long)n);
    ExpectSameModel("applied" + std::to_string(seed), "shard.applied=kill@" + std::to_string(n),
                    {"shard.applied"});
  }
}

// Three workers: a clock's sums are folded in rank order (server/clock_aggregate.hpp), not in
// the order the pushes arrive, so two undisturbed runs end in the same bits, and so does a run
// whose shard is killed after applying a push drawn from the printed seed. The second run and
// the killed one apply each clock's other rows after the reply (server.apply_after_reply:
// always), the first as this host's cores decide (whole clocks on 2): the same bits either way.
TEST_F(DurabilityTest, ThreeWorkersEndInTheSameBitsOnEveryRunAndAfterAShardIsKilled) {
  const std::string every = "every_seconds: 1";
  const std::string after = "server: {apply_after_reply: always}\n";
  std::string log;
  ASSERT_TRUE(RunJob("three-a", "", &log, every, 2, 3)) << log;
  ASSERT_TRUE(RunJob("three-b", "", &log, every, 2, 3, after)) << log;
  const uint64_t seed = Seeds().back();
  const uint64_t n = Draw(seed, 5, 3500);  // of about 4,000 pushes a shard applies
  std::printf("[ seed     ] %llu: shard.applied=kill@%llu\n", (unsigned long long)seed,
              (unsigned long long)n);
  const std::string faults = "shard.applied=kill@" + std::to_string(n);
  ASSERT_TRUE(RunJob("three-kill", faults, &log, every, 2, 3, after)) << faults << "\n" << log;
  // The killed run took the two passes: its shards' stopping stats say so, and count rows
  // applied after the reply (a shard restarted near the end may have applied none since).
  const std::vector<Json> stats = testing::StoppingStats(log);
  ASSERT_FALSE(stats.empty()) << log;
  uint64_t after_reply = 0;
  for (const Json& st : stats) {
    ASSERT_TRUE(!st.is_discarded() && st.contains("bsp_rows_after_reply")) << log;
    EXPECT_TRUE(st["apply_after_reply"].get<bool>()) << st.dump();
    after_reply += st["bsp_rows_after_reply"].get<uint64_t>();
  }
  EXPECT_GT(after_reply, 1000u) << log;
  EXPECT_TRUE(std::filesystem::exists(*dir_ + "/three-kill-marks/shard.applied.fired"))
      << faults << " never fired\n" << log;
  ExpectNoReplayRefusedOrLost(log);
  auto a = Load("three-a"), b = Load("three-b"), killed = Load("three-kill");
  ASSERT_TRUE(a.ok() && b.ok() && killed.ok());
  for (const ExportedModel* m : {&*b, &*killed}) {
    const ModelDifference d = CompareModels(*m, *a);
    EXPECT_GT(d.values_compared, 1000u);
    EXPECT_EQ(d.differing_values, 0u) << d.ToJson();
    EXPECT_EQ(d.rows_in_one_only, 0u) << d.ToJson();
  }
  // A job of its own: three workers' model is not the two workers' one.
  EXPECT_GT(CompareModels(*a, *reference_).differing_values, 0u);
}

TEST_F(DurabilityTest, AReplayWhoseFirstReplyIsLostIsResent) {
  for (uint64_t seed : Seeds()) {
    const uint64_t n = Draw(seed, 5, 900);
    std::printf("[ seed     ] %llu: shard.applied=kill@%llu + replay reply dropped\n",
                (unsigned long long)seed, (unsigned long long)n);
    std::string name = "replay" + std::to_string(seed);
    ExpectSameModel(name,
                    "shard.applied=kill@" + std::to_string(n) + ",shard.replay_reply=drop@1",
                    {"shard.applied", "shard.replay_reply"});
  }
}

TEST_F(DurabilityTest, ShardKilledAgainDuringItsReplays) {
  // The restarted shard dies at its k-th replayed push; the unfinished replays go into the
  // next ones.
  for (uint64_t seed : Seeds()) {
    const uint64_t n = Draw(seed, 5, 900), k = Draw(seed + 100, 1, 30);
    std::printf("[ seed     ] %llu: shard.applied=kill@%llu, then shard.replay_applied=kill@%llu\n",
                (unsigned long long)seed, (unsigned long long)n, (unsigned long long)k);
    ExpectSameModel("again" + std::to_string(seed),
                    "shard.applied=kill@" + std::to_string(n) +
                        ",shard.replay_applied=kill@" + std::to_string(k),
                    {"shard.applied", "shard.replay_applied"});
  }
}

TEST_F(DurabilityTest, AShardKilledWhileWritingACheckpointRestoresTheOneBefore) {
  for (uint64_t seed : Seeds()) {
    // Checkpoints every 50 of the 234 steps: the second or third, with one before it to
    // restore (the last ones, when every worker has left and on stop, come after training).
    const uint64_t n = Draw(seed, 2, 3);
    const char* point = seed % 2 ? "checkpoint.write" : "checkpoint.rename";
    std::printf("[ seed     ] %llu: %s=kill@%llu\n", (unsigned long long)seed, point,
                (unsigned long long)n);
    ExpectSameModel("ckpt" + std::to_string(seed), std::string(point) + "=kill@" +
                    std::to_string(n), {point}, "every_steps: 50");
  }
}

TEST_F(DurabilityTest, AShardKilledWhileWritingADeltaRestoresTheChainBeforeIt) {
  // Checkpoints every 20 of the 234 steps, a full one every 3rd and deltas between: the n-th
  // write (a full one or a delta) is where the shard dies; its restart loads the newest whole
  // chain, and the workers replay the rest.
  for (uint64_t seed : Seeds()) {
    const uint64_t n = Draw(seed, 2, 9);
    const char* point = seed % 2 ? "checkpoint.write" : "checkpoint.rename";
    std::printf("[ seed     ] %llu: %s=kill@%llu, full_every 3\n", (unsigned long long)seed,
                point, (unsigned long long)n);
    std::string log;
    ExpectSameModel("delta" + std::to_string(seed), std::string(point) + "=kill@" +
                    std::to_string(n), {point}, "every_steps: 20, full_every: 3", 2, &log);
    EXPECT_NE(log.find("delta checkpoint"), std::string::npos) << "no delta was written";
    // Checkpoint n - 1 is the newest whole one: a delta unless it is 1, 4 or 7 (full ones).
    if ((n - 1) % 3 != 1) {
      EXPECT_NE(log.find("is a delta: loaded"), std::string::npos)
          << "the restart did not load a chain of deltas\n" << log;
    }
  }
}

TEST_F(DurabilityTest, AFailedCheckpointWriteLosesNothing) {
  // The first write fails (a full disk): the shard goes on, and the workers keep in their logs
  // what it would have held; then a shard dies, and what the logs kept is replayed.
  for (uint64_t seed : Seeds()) {
    const uint64_t n = Draw(seed, 1600, 2600);
    std::printf("[ seed     ] %llu: checkpoint.write=fail@1, shard.applied=kill@%llu\n",
                (unsigned long long)seed, (unsigned long long)n);
    ExpectSameModel("fail" + std::to_string(seed),
                    "checkpoint.write=fail@1,shard.applied=kill@" + std::to_string(n),
                    {"checkpoint.write", "shard.applied"});
  }
}

TEST_F(DurabilityTest, ASigtermedServerInTheMiddleOfABspClockKeepsItsPendingSums) {
  // SIGTERM writes a last checkpoint wherever the shard is, often inside a clock (pushes of
  // one worker summed, the other's not yet); launch starts it again and it restores.
  for (uint64_t seed : Seeds()) {
    // A moment within the job's run: from 200 ms (the processes started) to 80% of the
    // undisturbed run's wall time (the whole job, startup and evaluation included). A job that
    // ended before the signal tested nothing: the moment is drawn again, before the last one
    // (at most 3 tries).
    uint64_t earliest = 200;
    uint64_t latest = std::max<uint64_t>(300, static_cast<uint64_t>(reference_ms_) * 4 / 5);
    for (int attempt = 0; attempt < 3; ++attempt) {
      const int delay_ms = static_cast<int>(Draw(seed + 1000 * attempt, earliest, latest));
      std::printf("[ seed     ] %llu: SIGTERM to server 1 after %d ms (try %d)\n",
                  (unsigned long long)seed, delay_ms, attempt + 1);
      const std::string name = "term" + std::to_string(seed) + "-" + std::to_string(attempt);
      RemoveTree(*dir_ + "/" + name + "-ckpt");
      WriteFile(*dir_ + "/" + name + ".yaml", ManifestText(name));
      auto job = Subprocess::Spawn({PARASOL_BINARY, "launch", *dir_ + "/" + name + ".yaml"},
                                   *dir_ + "/" + name + ".log");
      ASSERT_TRUE(job.ok());
      std::this_thread::sleep_for(std::chrono::milliseconds(delay_ms));
      const std::string needle = std::string(PARASOL_BINARY) + " server --manifest " + *dir_ + "/" +
                                 name + ".yaml --rank 1";
      // Bounded: the server process is found within 5 s (on a loaded machine launch may still be
      // starting it, or restarting it after a failed bind).
      pid_t pid = -1;
      bool ended = false;  // the whole job finished before its server 1 was found
      for (int tries = 0; tries < 100 && pid < 0 && !ended; ++tries) {
        if (tries > 0) std::this_thread::sleep_for(std::chrono::milliseconds(50));
        std::error_code ec;
        for (const auto& e : std::filesystem::directory_iterator("/proc", ec)) {
          const std::string p = e.path().filename().string();
          if (p.find_first_not_of("0123456789") != std::string::npos) continue;
          std::string cmd = ReadFile(e.path().string() + "/cmdline");
          std::replace(cmd.begin(), cmd.end(), '\0', ' ');
          if (cmd.find(needle) != std::string::npos) pid = static_cast<pid_t>(std::stol(p));
        }
        if (pid < 0) {
          if (std::optional<int> st = job->Poll()) {
            ended = true;
            ASSERT_TRUE(WIFEXITED(*st) && WEXITSTATUS(*st) == 0)
                << ReadFile(*dir_ + "/" + name + ".log");
          }
        }
      }
      if (ended) {
        const std::string log = ReadFile(*dir_ + "/" + name + ".log");
        ASSERT_LT(attempt, 2) << "the job ended before the SIGTERM, three times\n" << log;
        std::printf("[ seed     ] the job ended before server 1 was found: drawing again\n");
        latest = std::max<uint64_t>(earliest + 50, static_cast<uint64_t>(delay_ms) / 2);
        continue;
      }
      ASSERT_GT(pid, 0) << "no server 1 process within 5 s\n"
                        << ReadFile(*dir_ + "/" + name + ".log");
      // Not before the server has set its handler, which it has once it says it serves (a
      // loaded machine can take seconds to start it): bounded, 10 s.
      auto serving = [&] {
        std::istringstream lines(ReadFile(*dir_ + "/" + name + ".log"));
        for (std::string line; std::getline(lines, line);) {
          if (line.find("shard 1/") != std::string::npos &&
              line.find(" serving on ") != std::string::npos) {
            return true;
          }
        }
        return false;
      };
      for (int tries = 0; tries < 200 && !serving(); ++tries) {
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
      }
      if (!serving()) std::printf("[ seed     ] server 1 did not say it serves within 10 s\n");
      ASSERT_EQ(::kill(pid, SIGTERM), 0);
      auto status = job->Wait(std::chrono::seconds(240));
      const std::string log = ReadFile(*dir_ + "/" + name + ".log");
      // The signal straddled the job's end: both workers had finished and launch was stopping
      // the servers with its own SIGTERM (a second one stops a server at once). Nothing was
      // tested: the moment is drawn again, earlier.
      auto finished = [&log](int w) {  // its summary line: "worker W: N steps, ..."
        std::istringstream lines(log);
        const std::string who = "worker " + std::to_string(w) + ": ";
        for (std::string line; std::getline(lines, line);) {
          if (line.find(who) != std::string::npos && line.find(" steps, ") != std::string::npos &&
              line.find("samples in") != std::string::npos) {
            return true;
          }
        }
        return false;
      };
      const bool straddled =
          log.find("launch: the job failed: server 1 killed by signal 15") != std::string::npos &&
          finished(0) && finished(1);
      if (straddled && attempt < 2) {
        std::printf("[ seed     ] the SIGTERM came as the job ended: drawing again\n");
        latest = std::max<uint64_t>(earliest + 50, static_cast<uint64_t>(delay_ms) / 2);
        continue;
      }
      ASSERT_TRUE(status && WIFEXITED(*status) && WEXITSTATUS(*status) == 0) << log;
      // The signal came before the server had set its handler (a loaded machine can take that
      // long to start a process): launch restarted it, and nothing was tested. Drawn again, later.
      if (log.find("launch: server 1 killed by signal 15; restarting it") != std::string::npos) {
        ASSERT_LT(attempt, 2) << "every SIGTERM came before the server's handler\n" << log;
        std::printf("[ seed     ] the SIGTERM came before the server's handler: drawing again\n");
        earliest = static_cast<uint64_t>(delay_ms) + 200;
        latest = std::max<uint64_t>(latest, earliest + 200);
        continue;
      }
      if (log.find("launch: server 1 exited with code 0; restarting it") == std::string::npos) {
        ASSERT_LT(attempt, 2) << "the job ended before the SIGTERM, three times\n" << log;
        std::printf("[ seed     ] the job ended before the SIGTERM: drawing again\n");
        latest = std::max<uint64_t>(earliest + 50, static_cast<uint64_t>(delay_ms));
        continue;
      }
      ASSERT_NE(log.find("(on stop)"), std::string::npos) << log;
      auto m = Load(name);
      ASSERT_TRUE(m.ok()) << m.status().ToString();
      const ModelDifference d = CompareModels(*m, *reference_);
      EXPECT_EQ(d.max_relative, 0.0) << d.ToJson() << "\n" << log;
      break;
    }
  }
}

}  // namespace
}  // namespace parasol
