#include "common/cluster_render.hpp"

#include <yaml-cpp/yaml.h>

#include <cctype>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "common/curve_keys.hpp"
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

// Where a rendered job without keys of its own finds the ones made for it: key pairs
// DIR/server0 .. DIR/server<N-1> and DIR/client.
struct GeneratedKeys {
  std::string dir;
  size_t servers = 0;
};

// The manifest file's YAML with cluster.servers replaced by `servers` and cluster.bind set.
// A manifest without CURVE gets the generated keys (secure by default), unless it states
// security.mode itself; without `keys` it is marked security.mode: insecure. Sets *secured when
// the generated keys are used.
Result<std::string> RewriteManifest(const std::string& path, const std::vector<std::string>& servers,
                                    const std::string& bind, const GeneratedKeys* keys,
                                    bool* secured) {
  *secured = false;
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
  // Every path of the manifest (a scalar, or a list of them) under `section`.
  auto make_absolute = [&](const char* section, const char* key) {
    if (!doc[section] || !doc[section].IsMap()) return;
    YAML::Node node = doc[section][key];
    if (!node) return;
    if (node.IsScalar()) {
      doc[section][key] = absolute(node);
    } else if (node.IsSequence()) {
      for (size_t i = 0; i < node.size(); ++i) {
        if (node[i].IsScalar()) node[i] = absolute(node[i]);
      }
    }
  };
  make_absolute("data", "train");
  make_absolute("data", "eval");
  make_absolute("checkpoint", "dir");
  make_absolute("security", "server_keys");
  make_absolute("security", "client_key");
  make_absolute("security", "allowed_clients");
  make_absolute("security", "worker_keys");
  make_absolute("security", "operator_keys");
  // The servers bind every address: without CURVE keys a shard starts only when the manifest
  // says plainly that anyone who reaches its port controls the job (security.mode).
  bool curve = false;
  try {
    curve = doc["security"] && doc["security"].IsMap() && doc["security"]["curve"] &&
            doc["security"]["curve"].as<bool>();
  } catch (const YAML::Exception&) {
    curve = false;  // LoadManifest names the bad value
  }
  if (!curve) {
    if (doc["security"] && !doc["security"].IsMap()) {
      return InvalidArgument(path + ": key 'security' must be a mapping");
    }
    if (!doc["security"] || !doc["security"]["mode"]) {
      if (keys) {
        YAML::Node sec = doc["security"];
        sec["curve"] = true;
        YAML::Node server_keys(YAML::NodeType::Sequence);
        for (size_t i = 0; i < keys->servers; ++i) {
          server_keys.push_back(keys->dir + "/server" + std::to_string(i));
        }
        sec["server_keys"] = server_keys;
        sec["client_key"] = keys->dir + "/client";
        YAML::Node allowed(YAML::NodeType::Sequence);
        allowed.push_back(keys->dir + "/client.pub");
        sec["allowed_clients"] = allowed;
        *secured = true;
      } else {
        doc["security"]["mode"] = "insecure";
        std::fprintf(stderr,
                     "parasol render: %s has no CURVE keys, so the rendered manifest says "
                     "security.mode: insecure (anyone who reaches the servers' ports controls "
                     "the job); give it keys (parasol keygen, security.curve) to make it "
                     "secure\n",
                     path.c_str());
      }
    }
  }
  // A worker.command runs where the original manifest is, not where the copy lives.
  if (doc["worker"] && doc["worker"].IsMap() && doc["worker"]["command"]) {
    if (doc["worker"]["command_dir"]) {
      make_absolute("worker", "command_dir");
    } else {
      doc["worker"]["command_dir"] = base.lexically_normal().string();
    }
  }
  YAML::Emitter out;
  out << doc;
  return std::string(out.c_str()) + "\n";
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
  y << YAML::EndMap;
  if (!o.keys_secret.empty()) {
    y << YAML::BeginMap << YAML::Key << "name" << YAML::Value << "keys";
    y << YAML::Key << "mountPath" << YAML::Value << "/etc/parasol-keys";
    y << YAML::Key << "readOnly" << YAML::Value << true << YAML::EndMap;
  }
  y << YAML::EndSeq;
  y << YAML::EndMap << YAML::EndSeq;
  y << YAML::Key << "volumes" << YAML::Value << YAML::BeginSeq << YAML::BeginMap;
  y << YAML::Key << "name" << YAML::Value << "manifest";
  y << YAML::Key << "configMap" << YAML::Value << YAML::BeginMap;
  y << YAML::Key << "name" << YAML::Value << config_map;
  y << YAML::EndMap << YAML::EndMap;
  if (!o.keys_secret.empty()) {
    // Secret key files must not be readable by group or others: 0400.
    y << YAML::BeginMap << YAML::Key << "name" << YAML::Value << "keys";
    y << YAML::Key << "secret" << YAML::Value << YAML::BeginMap;
    y << YAML::Key << "secretName" << YAML::Value << o.keys_secret;
    y << YAML::Key << "defaultMode" << YAML::Value << 0400;
    y << YAML::EndMap << YAML::EndMap;
  }
  y << YAML::EndSeq;
  y << YAML::EndMap;
}

}  // namespace

Result<std::string> RenderKubernetes(const std::string& manifest_path, const RenderOptions& o) {
  if (o.servers_per_node != 1) {
    return InvalidArgument("--servers-per-node is for Slurm: Kubernetes places each shard's pod "
                           "itself (as many on a node as --server-cpus lets fit)");
  }
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
  // A job without keys gets its own, in a Secret every pod mounts read-only for its owner.
  const GeneratedKeys made{"/etc/parasol-keys", m.cluster.servers.size()};
  bool secured = false;
  PARASOL_ASSIGN_OR_RETURN(std::string text, RewriteManifest(manifest_path, servers, "0.0.0.0",
                                                             &made, &secured));
  const std::string manifest_file = "/etc/parasol/manifest.yaml";
  const std::string secret = name + "-keys";
  RenderOptions pods = o;
  if (secured) pods.keys_secret = secret;

  YAML::Emitter y;
  // ConfigMap: the manifest every pod reads.
  y << YAML::BeginDoc << YAML::BeginMap;
  y << YAML::Key << "apiVersion" << YAML::Value << "v1";
  y << YAML::Key << "kind" << YAML::Value << "ConfigMap";
  Metadata(y, config_map, o.k8s_namespace, name);
  y << YAML::Key << "data" << YAML::Value << YAML::BeginMap;
  y << YAML::Key << "manifest.yaml" << YAML::Value << YAML::Literal << text;
  y << YAML::EndMap << YAML::EndMap;
  if (secured) {
    // Secret: the job's CURVE key pairs, made now (kubectl get secret NAME-keys gives the
    // client's to the tools: parasol stats|checkpoint|shutdown --key).
    y << YAML::BeginDoc << YAML::BeginMap;
    y << YAML::Key << "apiVersion" << YAML::Value << "v1";
    y << YAML::Key << "kind" << YAML::Value << "Secret";
    Metadata(y, secret, o.k8s_namespace, name);
    y << YAML::Key << "type" << YAML::Value << "Opaque";
    y << YAML::Key << "stringData" << YAML::Value << YAML::BeginMap;
    for (size_t i = 0; i <= made.servers; ++i) {
      PARASOL_ASSIGN_OR_RETURN(CurveKeyPair k, GenerateCurveKeyPair());
      const std::string pair = i < made.servers ? "server" + std::to_string(i) : "client";
      y << YAML::Key << pair + ".key" << YAML::Value << k.secret_key + "\n";
      y << YAML::Key << pair + ".pub" << YAML::Value << k.public_key + "\n";
    }
    y << YAML::EndMap << YAML::EndMap;
  }
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
  // The shards holding the model at the start; the others (up to every listed one) are
  // started by raising `replicas` before `parasol scale --servers` gives them rows, and stopped
  // by lowering it after a scale down.
  y << YAML::Key << "replicas" << YAML::Value << m.cluster.InitialServers();
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
          pods, config_map, o.server_cpus, o.server_memory, 0, port, false);
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
          pods, config_map, o.worker_cpus, o.worker_memory, o.worker_gpus, 0, true);
  y << YAML::EndMap << YAML::EndMap << YAML::EndMap;
  if (!y.good()) return Internal(std::string("rendering failed: ") + y.GetLastError());
  return std::string(y.c_str()) + "\n";
}

Result<std::string> SlurmMemory(const std::string& size) {
  // A number (a decimal fraction allowed) and a unit: k or K, M, G, T (powers of 10, as
  // Kubernetes reads them) or Ki, Mi, Gi, Ti (powers of 2). A bare number is refused: Kubernetes
  // reads it as bytes, Slurm as megabytes.
  const std::string what = "memory size '" + size + "'";
  size_t i = 0;
  uint64_t whole = 0, frac = 0, frac_scale = 1;
  bool digits = false;
  for (; i < size.size() && std::isdigit(static_cast<unsigned char>(size[i])); ++i) {
    if (whole > (UINT64_MAX - 9) / 10) return InvalidArgument(what + " is too large");
    whole = whole * 10 + static_cast<uint64_t>(size[i] - '0');
    digits = true;
  }
  if (i < size.size() && size[i] == '.') {
    for (++i; i < size.size() && std::isdigit(static_cast<unsigned char>(size[i])); ++i) {
      if (frac_scale >= 1000000000000ull) return InvalidArgument(what + " has too many decimals");
      frac = frac * 10 + static_cast<uint64_t>(size[i] - '0');
      frac_scale *= 10;
      digits = true;
    }
  }
  const std::string unit = size.substr(i);
  static const std::pair<const char*, uint64_t> kUnits[] = {
      {"k", 1000},          {"K", 1000},          {"M", 1000000},       {"G", 1000000000},
      {"T", 1000000000000}, {"Ki", uint64_t{1} << 10}, {"Mi", uint64_t{1} << 20},
      {"Gi", uint64_t{1} << 30}, {"Ti", uint64_t{1} << 40}};
  uint64_t scale = 0;
  for (const auto& [name, value] : kUnits) {
    if (unit == name) scale = value;
  }
  if (!digits || scale == 0) {
    return InvalidArgument(what + ": expected a number and one of the units k, M, G, T (powers "
                           "of 10) or Ki, Mi, Gi, Ti (powers of 2)");
  }
  const unsigned __int128 scaled_frac = static_cast<unsigned __int128>(frac) * scale;
  if (scaled_frac % frac_scale != 0) {
    return InvalidArgument(what + " is not a whole number of bytes");
  }
  const unsigned __int128 bytes = static_cast<unsigned __int128>(whole) * scale +
                                  scaled_frac / frac_scale;
  if (bytes > (static_cast<unsigned __int128>(1) << 62)) return InvalidArgument(what + " is too large");
  // Slurm's --mem counts whole MiB (a K value is rounded up to them).
  constexpr uint64_t kMiB = uint64_t{1} << 20;
  if (bytes == 0 || bytes % kMiB != 0) {
    return InvalidArgument(what + " is " + std::to_string(static_cast<uint64_t>(bytes)) +
                           " bytes, not a whole number of MiB, which is what Slurm's --mem "
                           "counts (use Mi or Gi, e.g. 1536Mi)");
  }
  static const std::pair<const char*, uint64_t> kSlurm[] = {
      {"T", uint64_t{1} << 40}, {"G", uint64_t{1} << 30}, {"M", kMiB}};
  for (const auto& [name, value] : kSlurm) {
    if (bytes % value == 0) return std::to_string(static_cast<uint64_t>(bytes / value)) + name;
  }
  return Internal("unreachable");
}

Result<std::string> RenderSlurm(const std::string& manifest_path, const RenderOptions& o) {
  PARASOL_ASSIGN_OR_RETURN(Manifest m, LoadManifest(manifest_path));
  PARASOL_ASSIGN_OR_RETURN(const std::string server_mem, SlurmMemory(o.server_memory));
  PARASOL_ASSIGN_OR_RETURN(const std::string worker_mem, SlurmMemory(o.worker_memory));
  for (const std::string& line : o.sbatch_lines) {
    if (line.find_first_of("\n\r") != std::string::npos) {
      return InvalidArgument("--sbatch '" + line + "': one line each");
    }
  }
  // sbatch reads an option line up to the first blank: a value must be one word.
  for (const auto& [flag, value] : {std::pair{"--time", &o.time}, std::pair{"--partition", &o.partition},
                                    std::pair{"--account", &o.account},
                                    std::pair{"--output", &o.output}}) {
    if (value->find_first_of(" \t\n\r") != std::string::npos) {
      return InvalidArgument(std::string(flag) + " '" + *value + "': no blanks allowed");
    }
  }
  const std::string name = DnsName(m.job.name);
  const size_t servers = m.cluster.servers.size();
  // Several shards per node: shard i runs on node i / per_node (block distribution), so the
  // shards that share a node must listen on ports of their own.
  const size_t per_node = std::max<size_t>(1, std::min<size_t>(o.servers_per_node, servers));
  if (o.servers_per_node == 0) return InvalidArgument("--servers-per-node must be at least 1");
  // Every node of the servers holds as many shards (so the host list need not guess how Slurm
  // spreads an uneven count).
  if (servers % per_node != 0) {
    return InvalidArgument("--servers-per-node " + std::to_string(o.servers_per_node) +
                           " does not divide the " + std::to_string(servers) +
                           " shards of cluster.servers: each node holds as many");
  }
  for (size_t i = 0; i < servers; ++i) {
    for (size_t j = i + 1; j < servers && j / per_node == i / per_node; ++j) {
      if (m.cluster.servers[i].port == m.cluster.servers[j].port) {
        return InvalidArgument(
            manifest_path + ": servers " + std::to_string(i) + " and " + std::to_string(j) +
            " share a node with --servers-per-node " + std::to_string(o.servers_per_node) +
            " and both listen on port " + std::to_string(m.cluster.servers[i].port) +
            ": give the shards of a node ports of their own in cluster.servers");
      }
    }
  }
  const size_t server_nodes = (servers + per_node - 1) / per_node;
  // --mem is per node: each shard's memory times the shards of a node ("16G" -> "32G").
  std::string node_mem = server_mem;
  if (per_node > 1) {
    node_mem = std::to_string(std::stoull(server_mem) * per_node) + server_mem.back();
  }
  // The servers' hosts are filled in at run time: a marker no manifest text can contain goes
  // in now, everything is escaped, and then the markers become the script's variables.
  std::vector<std::string> hosts;
  auto marker = [](size_t i) { return "@@parasol-server-host-" + std::to_string(i) + "@@"; };
  for (size_t i = 0; i < servers; ++i) {
    hosts.push_back(marker(i) + ":" + std::to_string(m.cluster.servers[i].port));
  }
  {
    std::ifstream in(manifest_path);
    std::stringstream original;
    original << in.rdbuf();
    if (original.str().find("@@parasol-server-host-") != std::string::npos) {
      return InvalidArgument(manifest_path + ": contains '@@parasol-server-host-', which the "
                             "Slurm script uses for the servers' hosts");
    }
  }
  // A job without keys gets its own, made at its start in its folder (mode 600).
  const std::string job_dir_marker = "@@parasol-job-dir@@";
  const GeneratedKeys made{job_dir_marker + "/keys", servers};
  bool secured = false;
  PARASOL_ASSIGN_OR_RETURN(std::string text, RewriteManifest(manifest_path, hosts, "0.0.0.0",
                                                             &made, &secured));
  // Inside an unquoted here-document nothing but the hosts and the job's folder may expand.
  std::string escaped;
  for (char c : text) {
    if (c == '$' || c == '`' || c == '\\') escaped += '\\';
    escaped += c;
  }
  for (size_t i = 0; i < servers; ++i) {
    const std::string from = marker(i), to = "${SERVER_HOSTS[" + std::to_string(i) + "]}";
    const size_t at = escaped.find(from);
    if (at == std::string::npos) return Internal("rendering lost server " + std::to_string(i));
    escaped.replace(at, from.size(), to);
  }
  for (size_t at; (at = escaped.find(job_dir_marker)) != std::string::npos;) {
    escaped.replace(at, job_dir_marker.size(), "${JOB_DIR}");
  }
  // A bash single-quoted word.
  auto quoted = [](const std::string& v) {
    std::string q = "'";
    for (char c : v) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
    return q + "'";
  };
  auto option = [](const std::string& flag, const std::string& value) {
    return value.empty() ? std::string() : "#SBATCH " + flag + "=" + value + "\n";
  };
  std::ostringstream s;
  s << "#!/bin/bash\n"
    << "# Parasol job '" << name << "': component 0 runs the " << servers
    << " server shards, component 1 the " << m.cluster.workers << " workers.\n"
    << "#SBATCH --job-name=" << name << "\n"
    << "# A node lost mid-job fails the job (its shards' updates since their checkpoints are\n"
    << "# gone with them); not requeued, which would start every role afresh.\n"
    << "#SBATCH --no-requeue\n"
    << option("--time", o.time) << option("--account", o.account)
    << option("--output", o.output);
  // Job-wide options (time, account, output, qos, ...) carry over to the later component;
  // per-component ones in these lines (e.g. --constraint) apply to the servers' component.
  for (const std::string& line : o.sbatch_lines) s << "#SBATCH " << line << "\n";
  s << "#SBATCH --nodes=" << server_nodes << " --ntasks=" << servers
    << " --ntasks-per-node=" << per_node << "\n"
    << "#SBATCH --cpus-per-task=" << o.server_cpus << " --mem=" << node_mem << "\n"
    << option("--partition", o.partition);
  // The servers listen on the manifest's fixed ports: a node of theirs is theirs alone.
  if (o.exclusive) s << "#SBATCH --exclusive\n";
  s << "#SBATCH hetjob\n"
    << "#SBATCH --nodes=" << m.cluster.workers << " --ntasks=" << m.cluster.workers
    << " --ntasks-per-node=1\n"
    << "#SBATCH --cpus-per-task=" << o.worker_cpus << " --mem=" << worker_mem << "\n"
    << option("--partition", o.partition);  // per component: each needs it
  if (o.worker_gpus > 0) s << "#SBATCH --gpus-per-task=" << o.worker_gpus << "\n";
  s << "set -euo pipefail\n\n"
    << "PARASOL=" << quoted(o.binary) << "\n"
    << "# The job's folder (the manifest the roles read): on the submit directory's file system,\n"
    << "# which every node sees; removed at the end (PARASOL_KEEP_JOB_DIR=1 keeps it).\n"
    << "JOB_DIR=\"${SLURM_SUBMIT_DIR:-$PWD}/parasol-" << name << "-${SLURM_JOB_ID}\"\n"
    << "mkdir -p \"$JOB_DIR\"\n"
    << "trap '[ \"${PARASOL_KEEP_JOB_DIR:-0}\" = 1 ] || rm -rf \"$JOB_DIR\"' EXIT\n"
    << "# scancel, a time limit or preemption: SIGTERM; exiting runs the EXIT trap.\n"
    << "trap 'exit 143' TERM INT\n"
    << "MANIFEST=\"$JOB_DIR/manifest.yaml\"\n\n";
  if (secured) {
    s << "# The job's CURVE key pairs (the manifest had none): made now, readable by the job's\n"
      << "# user only, removed with the job's folder.\n"
      << "\"$PARASOL\" keygen --out \"$JOB_DIR/keys\" --name server --count " << servers
      << " >/dev/null\n"
      << "\"$PARASOL\" keygen --out \"$JOB_DIR/keys\" --name client >/dev/null\n\n";
  }
  s
    << "# The servers' hosts are the nodes of component 0, in rank order, at the address Slurm\n"
    << "# reaches each node by (NodeAddr; the node's name unless slurm.conf says otherwise);\n"
    << "# each node holds " << per_node << " shard(s), in rank order (block distribution).\n"
    << "SERVER_HOSTS=()\n"
    << "for node in $(scontrol show hostnames \"$SLURM_JOB_NODELIST_HET_GROUP_0\"); do\n"
    << "  addr=$(scontrol show node \"$node\" 2>/dev/null | grep -o 'NodeAddr=[^ ]*' | cut -d= -f2 "
       "|| true)\n"
    << "  for ((k = 0; k < " << per_node << "; ++k)); do SERVER_HOSTS+=(\"${addr:-$node}\"); done\n"
    << "done\n"
    << "cat > \"$MANIFEST\" <<PARASOL_MANIFEST\n"
    << escaped << "PARASOL_MANIFEST\n\n"
    << "srun --het-group=0 --distribution=block bash -c 'exec \"$0\" server --manifest \"$1\" "
       "--rank \"$SLURM_PROCID\"' "
       "\"$PARASOL\" \"$MANIFEST\" &\n"
    << "servers=$!\n"
    << "status=0\n"
    << "srun --het-group=1 bash -c 'exec \"$0\" worker --manifest \"$1\" --rank \"$SLURM_PROCID\"' "
       "\"$PARASOL\" \"$MANIFEST\" || status=$?\n"
    << "# A clean stop: each shard writes its final checkpoint (with checkpoint.dir), logs its\n"
    << "# stats and exits. If that cannot be asked, SIGTERM goes to the shard processes (srun\n"
    << "# itself would answer a signal by killing them).\n"
    << "if ! \"$PARASOL\" shutdown --manifest \"$MANIFEST\"; then\n"
    << "  scancel --signal=TERM \"${SLURM_JOB_ID}.0\" 2>/dev/null || true\n"
    << "fi\n"
    << "server_status=0\n"
    << "wait \"$servers\" || server_status=$?\n"
    << "if [ \"$status\" -eq 0 ]; then status=$server_status; fi\n"
    << "exit \"$status\"\n";
  return s.str();
}

}  // namespace parasol
