#include "common/cluster_render.hpp"

#include <yaml-cpp/yaml.h>

#include <cctype>
#include <filesystem>
#include <sstream>

#include "common/manifest.hpp"

namespace parasol {
namespace {

// A name Kubernetes accepts: lowercase letters, digits and '-'.
std::string DnsName(const std::string& s) {
  std::string out;
  for (char c : s) {
    const char l = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    out += std::isalnum(static_cast<unsigned char>(l)) ? l : '-';
  }
  while (!out.empty() && out.front() == '-') out.erase(out.begin());
  while (!out.empty() && out.back() == '-') out.pop_back();
  return out.empty() ? "parasol" : out.substr(0, 40);
}

// The manifest file's YAML with cluster.servers replaced by `servers` and cluster.bind set.
Result<std::string> RewriteManifest(const std::string& path, const std::vector<std::string>& servers,
                                    const std::string& bind) {
  YAML::Node doc;
  try {
    doc = YAML::LoadFile(path);
  } catch (const YAML::Exception& e) {
    return InvalidArgument(path + ": " + e.what());
  }
  YAML::Node list(YAML::NodeType::Sequence);
  for (const std::string& s : servers) list.push_back(s);
  doc["cluster"]["servers"] = list;
  doc["cluster"]["bind"] = bind;
  doc["cluster"].remove("worker_hosts");
  // Data paths were relative to the original file; the copy lives elsewhere.
  const std::filesystem::path base =
      std::filesystem::absolute(std::filesystem::path(path)).parent_path();
  auto absolute = [&](const YAML::Node& n) {
    const std::string p = n.as<std::string>();
    return p.empty() || p[0] == '/' ? p : (base / p).lexically_normal().string();
  };
  if (doc["data"] && doc["data"].IsMap()) {
    YAML::Node data = doc["data"];
    if (data["eval"] && data["eval"].IsScalar()) data["eval"] = absolute(data["eval"]);
    if (data["train"] && data["train"].IsScalar()) data["train"] = absolute(data["train"]);
    if (data["train"] && data["train"].IsSequence()) {
      for (size_t i = 0; i < data["train"].size(); ++i) {
        data["train"][i] = absolute(data["train"][i]);
      }
    }
  }
  YAML::Emitter out;
  out << doc;
  return std::string(out.c_str()) + "\n";
}

// Kubernetes writes 16Gi, Slurm 16G.
std::string SlurmMemory(std::string m) {
  if (m.size() > 2 && m.back() == 'i') m.pop_back();
  return m;
}

void Resources(YAML::Emitter& y, uint32_t cpus, const std::string& memory, uint32_t gpus) {
  y << YAML::Key << "resources" << YAML::Value << YAML::BeginMap;
  y << YAML::Key << "requests" << YAML::Value << YAML::BeginMap;
  y << YAML::Key << "cpu" << YAML::Value << std::to_string(cpus);
  y << YAML::Key << "memory" << YAML::Value << memory;
  if (gpus > 0) y << YAML::Key << "nvidia.com/gpu" << YAML::Value << std::to_string(gpus);
  y << YAML::EndMap;
  y << YAML::Key << "limits" << YAML::Value << YAML::BeginMap;
  y << YAML::Key << "memory" << YAML::Value << memory;
  if (gpus > 0) y << YAML::Key << "nvidia.com/gpu" << YAML::Value << std::to_string(gpus);
  y << YAML::EndMap << YAML::EndMap;
}

void Metadata(YAML::Emitter& y, const std::string& name, const std::string& ns,
              const std::string& instance) {
  y << YAML::Key << "metadata" << YAML::Value << YAML::BeginMap;
  y << YAML::Key << "name" << YAML::Value << name;
  y << YAML::Key << "namespace" << YAML::Value << ns;
  y << YAML::Key << "labels" << YAML::Value << YAML::BeginMap;
  y << YAML::Key << "app.kubernetes.io/name" << YAML::Value << "parasol";
  y << YAML::Key << "app.kubernetes.io/instance" << YAML::Value << instance;
  y << YAML::EndMap << YAML::EndMap;
}

// The pod spec of a role: one container running `command`, the manifest mounted.
void PodSpec(YAML::Emitter& y, const std::string& name, const std::string& command,
             const RenderOptions& o, const std::string& config_map, uint32_t cpus,
             const std::string& memory, uint32_t gpus, int port, bool restart_never) {
  y << YAML::Key << "spec" << YAML::Value << YAML::BeginMap;
  if (restart_never) y << YAML::Key << "restartPolicy" << YAML::Value << "Never";
  y << YAML::Key << "containers" << YAML::Value << YAML::BeginSeq << YAML::BeginMap;
  y << YAML::Key << "name" << YAML::Value << name;
  y << YAML::Key << "image" << YAML::Value << o.image;
  y << YAML::Key << "command" << YAML::Value << YAML::Flow << YAML::BeginSeq << "sh" << "-c"
    << command << YAML::EndSeq;
  if (port > 0) {
    y << YAML::Key << "ports" << YAML::Value << YAML::BeginSeq << YAML::BeginMap;
    y << YAML::Key << "containerPort" << YAML::Value << port;
    y << YAML::Key << "name" << YAML::Value << "parasol";
    y << YAML::EndMap << YAML::EndSeq;
  }
  Resources(y, cpus, memory, gpus);
  y << YAML::Key << "volumeMounts" << YAML::Value << YAML::BeginSeq << YAML::BeginMap;
  y << YAML::Key << "name" << YAML::Value << "manifest";
  y << YAML::Key << "mountPath" << YAML::Value << "/etc/parasol";
  y << YAML::EndMap << YAML::EndSeq;
  y << YAML::EndMap << YAML::EndSeq;
  y << YAML::Key << "volumes" << YAML::Value << YAML::BeginSeq << YAML::BeginMap;
  y << YAML::Key << "name" << YAML::Value << "manifest";
  y << YAML::Key << "configMap" << YAML::Value << YAML::BeginMap;
  y << YAML::Key << "name" << YAML::Value << config_map;
  y << YAML::EndMap << YAML::EndMap << YAML::EndSeq;
  y << YAML::EndMap;
}

}  // namespace

Result<std::string> RenderKubernetes(const std::string& manifest_path, const RenderOptions& o) {
  PARASOL_ASSIGN_OR_RETURN(Manifest m, LoadManifest(manifest_path));
  const std::string name = DnsName(m.job.name);
  const std::string service = name + "-server";
  const std::string config_map = name + "-manifest";
  const int port = m.cluster.servers[0].port;  // every server pod has its own address
  std::vector<std::string> servers;
  for (size_t i = 0; i < m.cluster.servers.size(); ++i) {
    servers.push_back(service + "-" + std::to_string(i) + "." + service + ":" +
                      std::to_string(port));
  }
  PARASOL_ASSIGN_OR_RETURN(std::string text, RewriteManifest(manifest_path, servers, "0.0.0.0"));
  const std::string manifest_file = "/etc/parasol/manifest.yaml";

  YAML::Emitter y;
  // ConfigMap: the manifest every pod reads.
  y << YAML::BeginDoc << YAML::BeginMap;
  y << YAML::Key << "apiVersion" << YAML::Value << "v1";
  y << YAML::Key << "kind" << YAML::Value << "ConfigMap";
  Metadata(y, config_map, o.k8s_namespace, name);
  y << YAML::Key << "data" << YAML::Value << YAML::BeginMap;
  y << YAML::Key << "manifest.yaml" << YAML::Value << YAML::Literal << text;
  y << YAML::EndMap << YAML::EndMap;
  // Headless Service: stable DNS names for the server pods.
  y << YAML::BeginDoc << YAML::BeginMap;
  y << YAML::Key << "apiVersion" << YAML::Value << "v1";
  y << YAML::Key << "kind" << YAML::Value << "Service";
  Metadata(y, service, o.k8s_namespace, name);
  y << YAML::Key << "spec" << YAML::Value << YAML::BeginMap;
  y << YAML::Key << "clusterIP" << YAML::Value << "None";
  y << YAML::Key << "publishNotReadyAddresses" << YAML::Value << true;
  y << YAML::Key << "selector" << YAML::Value << YAML::BeginMap << YAML::Key << "app"
    << YAML::Value << service << YAML::EndMap;
  y << YAML::Key << "ports" << YAML::Value << YAML::BeginSeq << YAML::BeginMap;
  y << YAML::Key << "name" << YAML::Value << "parasol";
  y << YAML::Key << "port" << YAML::Value << port;
  y << YAML::EndMap << YAML::EndSeq << YAML::EndMap << YAML::EndMap;
  // StatefulSet: server i is pod NAME-server-i and takes rank i from its name.
  y << YAML::BeginDoc << YAML::BeginMap;
  y << YAML::Key << "apiVersion" << YAML::Value << "apps/v1";
  y << YAML::Key << "kind" << YAML::Value << "StatefulSet";
  Metadata(y, service, o.k8s_namespace, name);
  y << YAML::Key << "spec" << YAML::Value << YAML::BeginMap;
  y << YAML::Key << "serviceName" << YAML::Value << service;
  y << YAML::Key << "replicas" << YAML::Value << m.cluster.servers.size();
  y << YAML::Key << "podManagementPolicy" << YAML::Value << "Parallel";
  y << YAML::Key << "selector" << YAML::Value << YAML::BeginMap << YAML::Key << "matchLabels"
    << YAML::Value << YAML::BeginMap << YAML::Key << "app" << YAML::Value << service
    << YAML::EndMap << YAML::EndMap;
  y << YAML::Key << "template" << YAML::Value << YAML::BeginMap;
  y << YAML::Key << "metadata" << YAML::Value << YAML::BeginMap << YAML::Key << "labels"
    << YAML::Value << YAML::BeginMap << YAML::Key << "app" << YAML::Value << service
    << YAML::EndMap << YAML::EndMap;
  PodSpec(y, "server",
          "exec " + o.binary + " server --manifest " + manifest_file + " --rank ${HOSTNAME##*-}",
          o, config_map, o.server_cpus, o.server_memory, 0, port, false);
  y << YAML::EndMap << YAML::EndMap << YAML::EndMap;
  // Indexed Job: worker j runs with JOB_COMPLETION_INDEX = j.
  y << YAML::BeginDoc << YAML::BeginMap;
  y << YAML::Key << "apiVersion" << YAML::Value << "batch/v1";
  y << YAML::Key << "kind" << YAML::Value << "Job";
  Metadata(y, name + "-worker", o.k8s_namespace, name);
  y << YAML::Key << "spec" << YAML::Value << YAML::BeginMap;
  y << YAML::Key << "completionMode" << YAML::Value << "Indexed";
  y << YAML::Key << "completions" << YAML::Value << m.cluster.workers;
  y << YAML::Key << "parallelism" << YAML::Value << m.cluster.workers;
  y << YAML::Key << "backoffLimit" << YAML::Value << 0;
  y << YAML::Key << "template" << YAML::Value << YAML::BeginMap;
  PodSpec(y, "worker",
          "exec " + o.binary + " worker --manifest " + manifest_file +
              " --rank ${JOB_COMPLETION_INDEX}",
          o, config_map, o.worker_cpus, o.worker_memory, o.worker_gpus, 0, true);
  y << YAML::EndMap << YAML::EndMap << YAML::EndMap;
  if (!y.good()) return Internal(std::string("rendering failed: ") + y.GetLastError());
  return std::string(y.c_str()) + "\n";
}

Result<std::string> RenderSlurm(const std::string& manifest_path, const RenderOptions& o) {
  PARASOL_ASSIGN_OR_RETURN(Manifest m, LoadManifest(manifest_path));
  const std::string name = DnsName(m.job.name);
  const size_t servers = m.cluster.servers.size();
  std::vector<std::string> hosts;
  for (size_t i = 0; i < servers; ++i) {
    hosts.push_back("${SERVER_HOSTS[" + std::to_string(i) + "]}:" +
                    std::to_string(m.cluster.servers[i].port));
  }
  PARASOL_ASSIGN_OR_RETURN(std::string text, RewriteManifest(manifest_path, hosts, "0.0.0.0"));
  // Inside an unquoted here-document only the placeholders may expand.
  std::string escaped;
  for (size_t i = 0; i < text.size(); ++i) {
    const bool placeholder = text.compare(i, 14, "${SERVER_HOSTS") == 0;
    if ((text[i] == '$' && !placeholder) || text[i] == '`' || text[i] == '\\') escaped += '\\';
    escaped += text[i];
  }
  std::ostringstream s;
  s << "#!/bin/bash\n"
    << "# Parasol job '" << m.job.name << "': component 0 runs the " << servers
    << " server shards, component 1 the " << m.cluster.workers << " workers.\n"
    << "#SBATCH --job-name=" << name << "\n"
    << "#SBATCH --nodes=" << servers << " --ntasks=" << servers << " --ntasks-per-node=1\n"
    << "#SBATCH --cpus-per-task=" << o.server_cpus << " --mem=" << SlurmMemory(o.server_memory)
    << "\n"
    << "#SBATCH hetjob\n"
    << "#SBATCH --nodes=" << m.cluster.workers << " --ntasks=" << m.cluster.workers
    << " --ntasks-per-node=1\n"
    << "#SBATCH --cpus-per-task=" << o.worker_cpus << " --mem=" << SlurmMemory(o.worker_memory)
    << "\n";
  if (o.worker_gpus > 0) s << "#SBATCH --gpus-per-task=" << o.worker_gpus << "\n";
  s << "set -euo pipefail\n\n"
    << "# The servers' hosts are the nodes of component 0, in rank order.\n"
    << "mapfile -t SERVER_HOSTS < <(scontrol show hostnames \"$SLURM_JOB_NODELIST_HET_GROUP_0\")\n"
    << "MANIFEST=\"${SLURM_SUBMIT_DIR:-$PWD}/" << name << ".${SLURM_JOB_ID}.yaml\"\n"
    << "cat > \"$MANIFEST\" <<PARASOL_MANIFEST\n"
    << escaped << "PARASOL_MANIFEST\n\n"
    << "srun --het-group=0 bash -c 'exec " << o.binary
    << " server --manifest \"$0\" --rank \"$SLURM_PROCID\"' \"$MANIFEST\" &\n"
    << "servers=$!\n"
    << "status=0\n"
    << "srun --het-group=1 bash -c 'exec " << o.binary
    << " worker --manifest \"$0\" --rank \"$SLURM_PROCID\"' \"$MANIFEST\" || status=$?\n"
    << "kill -TERM \"$servers\" 2>/dev/null || true\n"
    << "wait \"$servers\" || true\n"
    << "exit \"$status\"\n";
  return s.str();
}

}  // namespace parasol
