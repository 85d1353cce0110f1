// Renders a job for the cluster managers users already run: Kubernetes objects or a Slurm
// batch script. Both carry the job's manifest, rewritten so that the servers' hosts are the
// names the cluster gives them, and start each role with `parasol server|worker --rank`.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/status.hpp"

namespace parasol {

struct RenderOptions {
  std::string image = "parasol:latest";   // k8s: the container image holding `parasol`
  std::string k8s_namespace = "default";
  std::string binary = "parasol";          // the program's path in the image / on the nodes
  std::string keys_secret;                 // k8s, set by the renderer: the Secret of the job's keys
  uint32_t server_cpus = 4;
  // Slurm: shards per node. One shard uses its engine threads (server.engine_threads) and a
  // request thread; on a node of many cores several shards use them better than one (the
  // measured layouts are in docs/performance.md). The shards of a node need ports of their
  // own in cluster.servers.
  uint32_t servers_per_node = 1;
  std::string server_memory = "16Gi";
  uint32_t worker_cpus = 4;
  std::string worker_memory = "8Gi";
  uint32_t worker_gpus = 0;                // GPUs requested per worker
  // Slurm: sbatch options (empty: not set), extra #SBATCH lines, and whether the servers'
  // nodes are the job's alone (they listen on the manifest's fixed ports).
  std::string time;
  std::string partition;
  std::string account;
  std::string output;
  std::vector<std::string> sbatch_lines;
  bool exclusive = true;
};

// A memory size as Slurm's --mem takes it (e.g. "1536M" for "1.5Gi"): exact, or an error when
// the size is not a whole number of KiB or is not understood.
Result<std::string> SlurmMemory(const std::string& size);

// A ConfigMap with the manifest, a headless Service and a StatefulSet for the servers (stable
// DNS names NAME-server-I.NAME-server used as their hosts), and an Indexed Job for the workers.
Result<std::string> RenderKubernetes(const std::string& manifest_path, const RenderOptions& o);

// An sbatch script for a heterogeneous job: component 0 runs the servers, component 1 the
// workers; the manifest is written at run time with the nodes Slurm gave component 0.
Result<std::string> RenderSlurm(const std::string& manifest_path, const RenderOptions& o);

}  // namespace parasol
