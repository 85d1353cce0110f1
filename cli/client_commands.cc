#include <signal.h>
#include <spdlog/spdlog.h>

#include <chrono>
#include <cstdio>
#include <vector>

#include "cli/commands.hpp"
#include "common/manifest.hpp"
#include "common/subprocess.hpp"
#include "worker/ps_client.hpp"

namespace parasol::cli {
namespace {

Result<std::unique_ptr<PsClient>> ConnectTo(const std::string& manifest_path, uint32_t worker) {
  PARASOL_ASSIGN_OR_RETURN(Manifest manifest, LoadManifest(manifest_path));
  return PsClient::Connect(manifest, worker);
}

}  // namespace

int RunLoadgen(const std::string& manifest_path, uint32_t worker, WorkloadOptions options) {
  auto client = ConnectTo(manifest_path, worker);
  if (!client.ok()) {
    spdlog::error("worker {}: {}", worker, client.status().ToString());
    return 1;
  }
  const Manifest& m = (*client)->manifest();
  spdlog::info("worker {}: connected to {} shards; {} rounds of {} Zipf({}) keys over {} tables",
               worker, m.cluster.servers.size(), options.steps, options.batch_keys, options.zipf_s,
               m.tables.size());
  // Workers touch disjoint keys; only worker 0 writes the dense tables, so that each
  // worker's local reference is exact.
  options.key_offset += uint64_t{worker} << 40;
  options.push_dense = worker == 0;
  options.seed += worker;
  Result<WorkloadReport> report = RunWorkload(**client, options);
  if (!report.ok()) {
    spdlog::error("worker {}: {}", worker, report.status().ToString());
    return 1;
  }
  spdlog::info("worker {}: {}", worker, report->ToString());
  std::printf("worker %u: OK: %s\n", worker, report->ToString().c_str());
  return 0;
}

int RunStats(const std::string& manifest_path) {
  auto client = ConnectTo(manifest_path, PsClient::kObserver);
  if (!client.ok()) {
    spdlog::error("{}", client.status().ToString());
    return 1;
  }
  auto stats = (*client)->Stats();
  if (!stats.ok()) {
    spdlog::error("{}", stats.status().ToString());
    return 1;
  }
  for (const std::string& s : *stats) std::printf("%s\n", s.c_str());
  return 0;
}

int RunShutdown(const std::string& manifest_path) {
  auto client = ConnectTo(manifest_path, PsClient::kObserver);
  if (!client.ok()) {
    spdlog::error("{}", client.status().ToString());
    return 1;
  }
  if (Status st = (*client)->Shutdown(); !st.ok()) {
    spdlog::error("{}", st.ToString());
    return 1;
  }
  return 0;
}

int RunLaunch(const std::string& self_path, const std::string& manifest_path,
              const WorkloadOptions& options) {
  Result<Manifest> manifest = LoadManifest(manifest_path);
  if (!manifest.ok()) {
    spdlog::error("{}", manifest.status().message());
    return 2;
  }
  std::vector<Subprocess> servers;
  for (uint32_t r = 0; r < manifest->cluster.servers.size(); ++r) {
    auto p = Subprocess::Spawn(
        {self_path, "server", "--manifest", manifest_path, "--rank", std::to_string(r)});
    if (!p.ok()) {
      spdlog::error("{}", p.status().ToString());
      return 1;
    }
    spdlog::info("launch: server {} (pid {}) on {}", r, p->pid(),
                 manifest->cluster.servers[r].ToString());
    servers.push_back(std::move(*p));
  }
  std::vector<Subprocess> workers;
  for (uint32_t w = 0; w < manifest->cluster.workers; ++w) {
    auto p = Subprocess::Spawn({self_path, "loadgen", "--manifest", manifest_path, "--worker",
                                std::to_string(w), "--steps", std::to_string(options.steps),
                                "--batch-keys", std::to_string(options.batch_keys),
                                "--key-space", std::to_string(options.key_space), "--zipf",
                                std::to_string(options.zipf_s), "--seed",
                                std::to_string(options.seed)});
    if (!p.ok()) {
      spdlog::error("{}", p.status().ToString());
      return 1;
    }
    spdlog::info("launch: worker {} (pid {})", w, p->pid());
    workers.push_back(std::move(*p));
  }
  int failed = 0;
  for (uint32_t w = 0; w < workers.size(); ++w) {
    // Bounded: a worker that hangs past an hour is killed with the rest.
    auto status = workers[w].Wait(std::chrono::hours(1));
    if (!status || !WIFEXITED(*status) || WEXITSTATUS(*status) != 0) {
      spdlog::error("launch: worker {} {}", w,
                    status ? DescribeWaitStatus(*status) : std::string("did not finish"));
      ++failed;
    }
  }
  for (auto& s : servers) s.Signal(SIGTERM);
  for (uint32_t r = 0; r < servers.size(); ++r) {
    auto status = servers[r].Wait(std::chrono::seconds(30));
    if (!status || !WIFEXITED(*status) || WEXITSTATUS(*status) != 0) {
      spdlog::error("launch: server {} {}", r,
                    status ? DescribeWaitStatus(*status) : std::string("did not stop"));
      ++failed;
    }
  }
  if (failed == 0) spdlog::info("launch: job finished; every worker's check passed");
  return failed == 0 ? 0 : 1;
}

}  // namespace parasol::cli
