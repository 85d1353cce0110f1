// TestCluster: real `parasol server` processes on loopback ports, for integration tests.
//
// Writes a manifest with free ports into a fresh temporary directory, starts one server process
// per shard, and on destruction stops them (Shutdown, then SIGKILL for any that linger) and
// removes the directory.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/manifest.hpp"
#include "common/subprocess.hpp"
#include "worker/ps_client.hpp"

namespace parasol::testing {

class TestCluster {
 public:
  // `tables_yaml` is the manifest's `tables:` list (YAML text, indented by two spaces);
  // `extra_yaml` is appended at the top level. Without a `training:` section in it, the job
  // runs under ASP (pushes apply on arrival).
  // `ports`: the servers' ports (picked here when empty). `max_workers`: cluster.max_workers
  // (0: not set).
  TestCluster(int shards, int workers, const std::string& tables_yaml,
              const std::string& extra_yaml = "", std::vector<uint16_t> ports = {},
              uint32_t max_workers = 0);
  ~TestCluster();

  // Starts every server. Returns false (with a gtest failure) when one cannot start.
  bool Start();

  const Manifest& manifest() const { return manifest_; }
  const std::string& manifest_path() const { return manifest_path_; }
  const std::string& dir() const { return dir_; }
  Subprocess& server(int rank) { return servers_[rank]; }

  // A connected client for `worker`, or nullptr with a gtest failure.
  std::unique_ptr<PsClient> Connect(uint32_t worker);

  // Starts server `rank` again (after it died or was killed), appending to its log.
  // `faults`: its PARASOL_FAULTS (common/fault_points.hpp), if any.
  bool Respawn(int rank, const std::string& faults = "");
  // PARASOL_FAULTS of every server that Start() starts.
  void set_faults(std::string faults) { faults_ = std::move(faults); }

  // The server log of `rank` (stdout and stderr).
  std::string ServerLog(int rank) const;

 private:
  int shards_;
  std::string dir_;
  std::string manifest_path_;
  Manifest manifest_;
  std::vector<Subprocess> servers_;
  std::string faults_;
};

// The newest clock any worker of the job has reached, from every shard's stats (-1: none yet,
// or no stats).
int64_t NewestWorkerClock(PsClient& observer);
// Polls until the job has reached `clock` (true), or `timeout` has passed (false).
bool WaitForWorkerClock(PsClient& observer, int64_t clock, std::chrono::seconds timeout);

// `steps` steps of a worker of table 0 (dim 4): a push of 64 rows from `first_key`, a tick, a
// pull of them; the first error.
Status TrainSparseSteps(PsClient& c, uint64_t first_key, int steps);
// The same for several workers at once, each on a thread and keys of its own (worker i from
// 100000 x (i + 1)); the first error. *seconds: how long they took together.
Status TrainWorkersTogether(const std::vector<PsClient*>& workers, int steps, double* seconds);

// A fresh temporary directory (removed by the caller).
std::string MakeTempDir();
void RemoveTree(const std::string& path);
std::string ReadFile(const std::string& path);
void WriteFile(const std::string& path, const std::string& text);
// Resident memory of a process in bytes (VmRSS), or 0.
using parasol::ResidentBytes;

}  // namespace parasol::testing
