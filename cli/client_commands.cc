#include <spdlog/spdlog.h>

#include <chrono>
#include <cstdio>
#include <vector>

#include "cli/commands.hpp"
#include "common/curve_keys.hpp"
#include "common/manifest.hpp"
#include "worker/ps_client.hpp"
#include "worker/reshard.hpp"

namespace parasol::cli {
namespace {

Result<std::unique_ptr<PsClient>> ConnectTo(const std::string& manifest_path, uint32_t worker,
                                            const std::string& key_path = "") {
  PARASOL_ASSIGN_OR_RETURN(Manifest manifest, LoadManifest(manifest_path));
  return PsClient::Connect(manifest, worker, key_path);
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

int RunScale(const std::string& manifest_path, uint64_t workers, const std::string& key_path) {
  auto client = ConnectTo(manifest_path, PsClient::kObserver, key_path);
  if (!client.ok()) {
    spdlog::error("{}", client.status().ToString());
    return 1;
  }
  Result<uint64_t> staying = (*client)->Scale(workers);
  if (!staying.ok()) {
    spdlog::error("{}", staying.status().ToString());
    return 1;
  }
  const Membership& m = (*client)->membership();
  for (uint32_t w = 0; w < m.max_ranks(); ++w) {
    if (!m.Joined(w)) continue;
    std::printf("worker %u: joined at clock %lld%s\n", w, static_cast<long long>(m.join(w)),
                m.leave(w) >= 0 ? (", leaves at clock " + std::to_string(m.leave(w))).c_str()
                                : "");
  }
  std::printf("%llu workers stay", static_cast<unsigned long long>(*staying));
  if (*staying < workers) {
    std::printf("; start %llu more with `parasol worker --manifest %s --rank R` (R from %u up to "
                "cluster.max_workers - 1, not used before)",
                static_cast<unsigned long long>(workers - *staying), manifest_path.c_str(),
                m.initial());
  }
  std::printf("\n");
  return 0;
}

int RunScaleServers(const std::string& manifest_path, uint32_t servers, double timeout_s,
                    const std::string& key_path) {
  auto client = ConnectTo(manifest_path, PsClient::kObserver, key_path);
  if (!client.ok()) {
    spdlog::error("{}", client.status().ToString());
    return 1;
  }
  const auto timeout = std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1000));
  Result<ReshardReport> report = Reshard(**client, servers, timeout);
  if (!report.ok()) {
    spdlog::error("{}", report.status().ToString());
    return 1;
  }
  std::printf("%s\n", report->ToString().c_str());
  return 0;
}

int RunStats(const std::string& manifest_path, const std::string& key_path) {
  auto client = ConnectTo(manifest_path, PsClient::kObserver, key_path);
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

int RunShutdown(const std::string& manifest_path, const std::string& key_path) {
  auto client = ConnectTo(manifest_path, PsClient::kObserver, key_path);
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

int RunCheckpoint(const std::string& manifest_path, const std::string& key_path) {
  auto client = ConnectTo(manifest_path, PsClient::kObserver, key_path);
  if (!client.ok()) {
    spdlog::error("{}", client.status().ToString());
    return 1;
  }
  if (Status st = (*client)->Checkpoint(); !st.ok()) {
    spdlog::error("{}", st.ToString());
    return 1;
  }
  std::printf("every shard wrote a checkpoint\n");
  return 0;
}

int RunKeygen(const std::string& dir, const std::string& name, uint32_t count) {
  std::vector<std::string> names;
  for (uint32_t i = 0; i < count; ++i) names.push_back(name + std::to_string(i));
  if (count == 0) names.push_back(name);
  for (const std::string& n : names) {
    auto keys = GenerateCurveKeyPair();
    if (!keys.ok()) {
      spdlog::error("{}", keys.status().ToString());
      return 1;
    }
    if (Status st = WriteCurveKeyPair(dir, n, *keys); !st.ok()) {
      spdlog::error("{}", st.ToString());
      return 1;
    }
    std::printf("wrote %s/%s.key (secret, mode 0600) and %s/%s.pub\n", dir.c_str(), n.c_str(),
                dir.c_str(), n.c_str());
  }
  return 0;
}

}  // namespace parasol::cli
