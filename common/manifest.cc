#include "common/manifest.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <yaml-cpp/yaml.h>

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <algorithm>
#include <limits>
#include <map>
#include <set>
#include <sstream>

#include "common/hash.hpp"
#include "common/manifest_fields.hpp"
#include "common/model_tables.hpp"
#include "common/placement.hpp"

namespace parasol {
namespace {

// `text` for an error message: bytes outside printable ASCII as \xNN, and at most 64 of them
// shown (a hostile name may be long or binary).
std::string PrintableName(const std::string& text) {
  std::string out;
  for (size_t i = 0; i < text.size() && i < 64; ++i) {
    const unsigned char c = static_cast<unsigned char>(text[i]);
    if (c >= 0x20 && c < 0x7f && c != '\\') {
      out += static_cast<char>(c);
    } else {
      char hex[8];
      std::snprintf(hex, sizeof(hex), "\\x%02x", c);
      out += hex;
    }
  }
  if (text.size() > 64) out += "...";
  return out;
}

std::string Where(const std::string& file, const YAML::Mark& m) {
  if (m.line < 0) return file;
  return file + ":" + std::to_string(m.line + 1) + ":" + std::to_string(m.column + 1);
}

// The tags a manifest may carry: none ("?" plain, "!" quoted) and YAML's core schema. Any other
// (!!python/object, !foo) asks for a type this reader does not have: refused rather than read
// as a plain string.
bool StandardTag(const std::string& tag) {
  static const std::set<std::string> kCore = {
      "", "?", "!",
      "tag:yaml.org,2002:str", "tag:yaml.org,2002:int", "tag:yaml.org,2002:float",
      "tag:yaml.org,2002:bool", "tag:yaml.org,2002:null", "tag:yaml.org,2002:map",
      "tag:yaml.org,2002:seq"};
  return kCore.count(tag) > 0;
}

// The most nodes the check below visits, each use of an alias counted again: a manifest is a
// few hundred; aliases of aliases can make a small file expand to billions.
constexpr uint64_t kMaxManifestNodes = uint64_t{1} << 20;

// Checks what yaml-cpp lets through: a key twice in one mapping (it keeps both and a lookup
// sees only the first, so the second would be silently ignored) and non-standard tags.
// The deepest a manifest nests (it needs 4 or 5 levels); an alias of a node inside itself
// (`a: &x [*x]`) is a cycle, which this depth ends.
constexpr int kMaxManifestDepth = 64;

Status CheckYamlTree(const YAML::Node& node, const std::string& file, uint64_t* visited,
                     int depth = 0) {
  if (depth > kMaxManifestDepth) {
    return InvalidArgument(Where(file, node.Mark()) + ": the manifest nests deeper than " +
                           std::to_string(kMaxManifestDepth) +
                           " levels (an alias inside the node it names is a cycle)");
  }
  if (++*visited > kMaxManifestNodes) {
    return InvalidArgument(Where(file, node.Mark()) + ": the manifest has more than " +
                           std::to_string(kMaxManifestNodes) +
                           " nodes (counting each use of an alias)");
  }
  if (!StandardTag(node.Tag())) {
    return InvalidArgument(Where(file, node.Mark()) + ": tag '" + PrintableName(node.Tag()) +
                           "' is not allowed in a manifest (only YAML's standard tags are)");
  }
  if (node.IsSequence()) {
    for (const YAML::Node& child : node) {
      PARASOL_RETURN_IF_ERROR(CheckYamlTree(child, file, visited, depth + 1));
    }
  } else if (node.IsMap()) {
    std::set<std::string> keys;
    for (auto it = node.begin(); it != node.end(); ++it) {
      PARASOL_RETURN_IF_ERROR(CheckYamlTree(it->first, file, visited, depth + 1));
      if (it->first.IsScalar() && !keys.insert(it->first.Scalar()).second) {
        return InvalidArgument(Where(file, it->first.Mark()) + ": duplicate key '" +
                               PrintableName(it->first.Scalar()) +
                               "' (it appears earlier in the same mapping)");
      }
      PARASOL_RETURN_IF_ERROR(CheckYamlTree(it->second, file, visited, depth + 1));
    }
  }
  return Status::Ok();
}

// While ParseManifestRecordingKeys() runs on this thread: where MapReader notes the path of
// every key it is asked for, list elements as "[]" (tests compare them with the field table of
// manifest_fields.hpp, so that no field goes undocumented).
thread_local std::set<std::string>* asked_keys = nullptr;

// "FILE: key 'PATH': WHAT", ended by the explain command for a known key: the form of every
// error about a key, MapReader's and those checked across sections.
std::string KeyError(const std::string& where, const std::string& path, const std::string& what) {
  return where + ": key '" + path + "': " + what + ManifestExplainHint(path);
}

// Every field any optimizer reads.
const char* const kOptimizerKeys[] = {"lr",    "weight_decay", "eps",   "initial_accumulator",
                                      "beta1", "beta2",        "bias_correction", "alpha",
                                      "beta",  "l1",           "l2"};

// Reads one YAML mapping strictly: every key must be consumed, or Finish() names the first
// unknown one. All errors carry "file:line:col: key 'a.b.c'".
class MapReader {
 public:
  MapReader(const YAML::Node& node, std::string path, const std::string& file)
      : node_(node), path_(std::move(path)), file_(file) {}

  Status CheckIsMap() const {
    if (!node_.IsMap()) return ErrorAt(node_, path_, "expected a mapping");
    return Status::Ok();
  }

  bool Has(const std::string& key) const {
    asked_.insert(key);  // a key this section knows, present or not (for suggestions)
    if (asked_keys != nullptr) asked_keys->insert(ManifestFieldKey(PathOf(key)));
    return node_.IsMap() && node_[key].IsDefined();
  }
  YAML::Node Child(const std::string& key) {
    seen_.insert(key);
    if (asked_keys != nullptr) asked_keys->insert(ManifestFieldKey(PathOf(key)));
    return node_[key];
  }
  std::string PathOf(const std::string& key) const {
    return path_.empty() ? key : path_ + "." + key;
  }

  Status String(const std::string& key, std::string* out) {
    if (!Has(key)) return Status::Ok();
    YAML::Node n = Child(key);
    if (!n.IsScalar()) return ErrorAt(n, PathOf(key), "expected a string");
    *out = n.Scalar();
    return Status::Ok();
  }

  Status Int(const std::string& key, int64_t lo, int64_t hi, int64_t* out) {
    if (!Has(key)) return Status::Ok();
    YAML::Node n = Child(key);
    return ParseInt(n, PathOf(key), lo, hi, out);
  }

  template <typename T>
  Status Unsigned(const std::string& key, int64_t lo, int64_t hi, T* out) {
    int64_t v = static_cast<int64_t>(*out);
    PARASOL_RETURN_IF_ERROR(Int(key, lo, hi, &v));
    *out = static_cast<T>(v);
    return Status::Ok();
  }

  Status Double(const std::string& key, double lo, double hi, double* out) {
    if (!Has(key)) return Status::Ok();
    YAML::Node n = Child(key);
    if (!n.IsScalar()) return ErrorAt(n, PathOf(key), "expected a number");
    const std::string& s = n.Scalar();
    char* end = nullptr;
    errno = 0;
    double v = std::strtod(s.c_str(), &end);
    if (s.empty() || end != s.c_str() + s.size() || errno != 0 || !std::isfinite(v)) {
      return ErrorAt(n, PathOf(key), "expected a number, got '" + s + "'");
    }
    if (v < lo || v > hi) {
      std::ostringstream msg;
      msg << "value " << s << " is out of range [" << lo << ", " << hi << "]";
      return ErrorAt(n, PathOf(key), msg.str());
    }
    *out = v;
    return Status::Ok();
  }

  Status Bool(const std::string& key, bool* out) {
    if (!Has(key)) return Status::Ok();
    YAML::Node n = Child(key);
    if (n.IsScalar() && (n.Scalar() == "true" || n.Scalar() == "false")) {
      *out = n.Scalar() == "true";
      return Status::Ok();
    }
    // Said as the others say it: the value given, when it is one (YAML's yes, on, 1 are not).
    return ErrorAt(n, PathOf(key),
                   n.IsScalar() ? "expected true or false, got '" + n.Scalar() + "'"
                                : std::string("expected true or false"));
  }

  Status DurationMs(const std::string& key, int64_t* out) {
    if (!Has(key)) return Status::Ok();
    YAML::Node n = Child(key);
    if (!n.IsScalar()) return ErrorAt(n, PathOf(key), "expected a duration such as 30s");
    Result<int64_t> v = ParseDurationMs(n.Scalar());
    if (!v.ok()) return ErrorAt(n, PathOf(key), v.status().message());
    *out = *v;
    return Status::Ok();
  }

  Status Bytes(const std::string& key, uint64_t lo, uint64_t* out) {
    if (!Has(key)) return Status::Ok();
    YAML::Node n = Child(key);
    if (!n.IsScalar()) return ErrorAt(n, PathOf(key), "expected a size such as 4MiB");
    Result<uint64_t> v = ParseBytes(n.Scalar());
    if (!v.ok()) return ErrorAt(n, PathOf(key), v.status().message());
    if (*v < lo) return ErrorAt(n, PathOf(key), "must be at least " + std::to_string(lo));
    *out = *v;
    return Status::Ok();
  }

  // One of `choices`; returns its index in *out.
  Status Choice(const std::string& key, const std::vector<std::string>& choices, int* out) {
    if (!Has(key)) return Status::Ok();
    YAML::Node n = Child(key);
    std::string all;
    for (const auto& c : choices) all += (all.empty() ? "" : "|") + c;
    if (!n.IsScalar()) return ErrorAt(n, PathOf(key), "expected one of " + all);
    for (size_t i = 0; i < choices.size(); ++i) {
      if (n.Scalar() == choices[i]) {
        *out = static_cast<int>(i);
        return Status::Ok();
      }
    }
    return ErrorAt(n, PathOf(key), "expected one of " + all + ", got '" + n.Scalar() + "'");
  }

  // Rejects keys that no reader asked for.
  Status Finish() const {
    if (!node_.IsMap()) return Status::Ok();
    for (auto it = node_.begin(); it != node_.end(); ++it) {
      const std::string key = it->first.Scalar();
      if (!seen_.count(key)) {
        const std::string near = Nearest(key);
        return ErrorAt(it->first, PathOf(key),
                       near.empty() ? "unknown key" : "unknown key (did you mean '" + near + "'?)");
      }
    }
    return Status::Ok();
  }

  // The known key of this section nearest to `key` in edit distance, when it is near enough
  // to be a typo (at most a third of the key's length, and 2), else "".
  std::string Nearest(const std::string& key) const {
    std::string best;
    size_t best_distance = std::min<size_t>(2, std::max<size_t>(1, key.size() / 3)) + 1;
    for (const std::string& known : asked_) {
      const size_t d = EditDistance(key, known);
      if (d < best_distance) {
        best_distance = d;
        best = known;
      }
    }
    return best;
  }

  Status ParseInt(const YAML::Node& n, const std::string& path, int64_t lo, int64_t hi,
                  int64_t* out) const {
    if (!n.IsScalar()) return ErrorAt(n, path, "expected an integer");
    const std::string& s = n.Scalar();
    char* end = nullptr;
    errno = 0;
    long long v = std::strtoll(s.c_str(), &end, 10);
    if (s.empty() || end != s.c_str() + s.size() || errno != 0) {
      return ErrorAt(n, path, "expected an integer, got '" + s + "'");
    }
    if (v < lo || v > hi) {
      return ErrorAt(n, path,
                     "value " + s + " is out of range [" + std::to_string(lo) + ", " +
                         std::to_string(hi) + "]");
    }
    *out = v;
    return Status::Ok();
  }

  // An unknown key's path has no entry in the field table, so only errors about a known key
  // end with the explain command.
  Status ErrorAt(const YAML::Node& n, const std::string& path, const std::string& what) const {
    const YAML::Mark m = n.Mark();
    std::string where = file_;
    if (m.line >= 0) {
      where += ':';
      where += std::to_string(m.line + 1);
      where += ':';
      where += std::to_string(m.column + 1);
    }
    return InvalidArgument(KeyError(where, path, what));
  }

 private:
  YAML::Node node_;
  std::string path_;
  const std::string& file_;
  std::set<std::string> seen_;
  mutable std::set<std::string> asked_;
};

std::string BaseDir(const std::string& file) {
  const size_t slash = file.rfind('/');
  return slash == std::string::npos ? std::string(".") : file.substr(0, slash);
}

std::string Resolve(const std::string& base, const std::string& path) {
  if (path.empty() || path[0] == '/') return path;
  return base + "/" + path;
}

Result<ServerAddress> ParseAddress(const std::string& text) {
  const size_t colon = text.rfind(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 == text.size()) {
    return InvalidArgument("expected host:port, got '" + text + "'");
  }
  ServerAddress addr;
  addr.host = text.substr(0, colon);
  const std::string port = text.substr(colon + 1);
  char* end = nullptr;
  long v = std::strtol(port.c_str(), &end, 10);
  if (end != port.c_str() + port.size() || v < 1 || v > 65535) {
    return InvalidArgument("port must be 1..65535 in '" + text + "'");
  }
  addr.port = static_cast<uint16_t>(v);
  return addr;
}

Status ParseJob(MapReader& root, JobOptions* job, const std::string& file) {
  if (!root.Has("job")) return Status::Ok();
  MapReader r(root.Child("job"), "job", file);
  PARASOL_RETURN_IF_ERROR(r.CheckIsMap());
  PARASOL_RETURN_IF_ERROR(r.String("name", &job->name));
  PARASOL_RETURN_IF_ERROR(
      r.Unsigned("seed", 0, std::numeric_limits<int64_t>::max(), &job->seed));
  return r.Finish();
}

Status ParseCluster(MapReader& root, ClusterOptions* c, const std::string& file) {
  if (!root.Has("cluster")) {
    return InvalidArgument(KeyError(file, "cluster", "missing (cluster.servers is required)"));
  }
  YAML::Node node = root.Child("cluster");
  MapReader r(node, "cluster", file);
  PARASOL_RETURN_IF_ERROR(r.CheckIsMap());
  if (!r.Has("servers")) {
    return r.ErrorAt(node, "cluster.servers", "missing: list the shards as host:port");
  }
  YAML::Node servers = r.Child("servers");
  if (!servers.IsSequence() || servers.size() == 0) {
    return r.ErrorAt(servers, "cluster.servers", "expected a non-empty list of host:port");
  }
  if (servers.size() > kMaxShards) {
    return r.ErrorAt(servers, "cluster.servers",
                     std::to_string(servers.size()) + " shards, more than " +
                         std::to_string(kMaxShards));
  }
  std::set<std::string> distinct;
  for (size_t i = 0; i < servers.size(); ++i) {
    const std::string path = "cluster.servers[" + std::to_string(i) + "]";
    if (!servers[i].IsScalar()) return r.ErrorAt(servers[i], path, "expected host:port");
    Result<ServerAddress> addr = ParseAddress(servers[i].Scalar());
    if (!addr.ok()) return r.ErrorAt(servers[i], path, addr.status().message());
    if (!distinct.insert(addr->ToString()).second) {
      return r.ErrorAt(servers[i], path, "duplicate server address " + addr->ToString());
    }
    c->servers.push_back(*addr);
  }
  c->initial_servers = static_cast<uint32_t>(c->servers.size());
  if (r.Has("initial_servers")) {
    PARASOL_RETURN_IF_ERROR(r.Unsigned("initial_servers", 1, 1 << 20, &c->initial_servers));
    if (c->initial_servers < c->servers.size() && c->servers.size() > kMaxReshardServers) {
      return r.ErrorAt(r.Child("initial_servers"), "cluster.initial_servers",
                       "a job whose shard count changes lists at most " +
                           std::to_string(kMaxReshardServers) + " shards");
    }
    if (c->initial_servers > c->servers.size()) {
      return r.ErrorAt(r.Child("initial_servers"), "cluster.initial_servers",
                       "is " + std::to_string(c->initial_servers) + ", more than the " +
                           std::to_string(c->servers.size()) + " shards cluster.servers lists");
    }
  }
  PARASOL_RETURN_IF_ERROR(r.Unsigned("workers", 1, 1 << 20, &c->workers));
  c->max_workers = c->workers;
  if (r.Has("max_workers")) {
    PARASOL_RETURN_IF_ERROR(r.Unsigned("max_workers", 1, 1 << 20, &c->max_workers));
    if (c->max_workers > c->workers && c->max_workers > 2048) {
      return r.ErrorAt(r.Child("max_workers"), "cluster.max_workers",
                       "is " + std::to_string(c->max_workers) +
                           "; a job whose size may change has at most 2048 worker ranks");
    }
    if (c->max_workers < c->workers) {
      return r.ErrorAt(r.Child("max_workers"), "cluster.max_workers",
                       "is " + std::to_string(c->max_workers) + ", below cluster.workers (" +
                           std::to_string(c->workers) + ")");
    }
  }
  if (r.Has("worker_hosts")) {
    YAML::Node hosts = r.Child("worker_hosts");
    if (!hosts.IsSequence() || hosts.size() != c->workers) {
      return r.ErrorAt(hosts, "cluster.worker_hosts",
                       "expected a list of " + std::to_string(c->workers) +
                           " hosts (one per worker)");
    }
    for (size_t i = 0; i < hosts.size(); ++i) {
      if (!hosts[i].IsScalar() || hosts[i].Scalar().empty()) {
        return r.ErrorAt(hosts[i], "cluster.worker_hosts[" + std::to_string(i) + "]",
                         "expected a host name or address");
      }
      c->worker_hosts.push_back(hosts[i].Scalar());
    }
  }
  PARASOL_RETURN_IF_ERROR(r.String("bind", &c->bind));
  PARASOL_RETURN_IF_ERROR(r.DurationMs("connect_timeout", &c->connect_timeout_ms));
  PARASOL_RETURN_IF_ERROR(r.DurationMs("request_timeout", &c->request_timeout_ms));
  PARASOL_RETURN_IF_ERROR(r.DurationMs("restore_timeout", &c->restore_timeout_ms));
  PARASOL_RETURN_IF_ERROR(r.Unsigned("request_retries", 0, 1000, &c->request_retries));
  PARASOL_RETURN_IF_ERROR(r.Bool("restart_servers", &c->restart_servers));
  PARASOL_RETURN_IF_ERROR(r.Bool("restart_workers", &c->restart_workers));
  return r.Finish();
}

Status ParseServer(MapReader& root, ServerOptions* s, const std::string& file) {
  if (!root.Has("server")) return Status::Ok();
  MapReader r(root.Child("server"), "server", file);
  PARASOL_RETURN_IF_ERROR(r.CheckIsMap());
  PARASOL_RETURN_IF_ERROR(r.Unsigned("engine_threads", 1, 256, &s->engine_threads));
  int after = static_cast<int>(s->apply_after_reply);
  PARASOL_RETURN_IF_ERROR(r.Choice("apply_after_reply", {"auto", "always", "never"}, &after));
  s->apply_after_reply = static_cast<ServerOptions::ApplyAfterReply>(after);
  PARASOL_RETURN_IF_ERROR(r.Bytes("max_request_bytes", 1024, &s->max_request_bytes));
  PARASOL_RETURN_IF_ERROR(r.Bytes("frame_bytes", 4096, &s->frame_bytes));
  PARASOL_RETURN_IF_ERROR(r.Unsigned("max_held_pulls", 1, 1 << 24, &s->max_held_pulls));
  PARASOL_RETURN_IF_ERROR(r.Bytes("max_held_bytes", 1024, &s->max_held_bytes));
  PARASOL_RETURN_IF_ERROR(r.Unsigned("max_pending_clocks", 2, 1 << 16, &s->max_pending_clocks));
  PARASOL_RETURN_IF_ERROR(r.Bytes("max_pending_bytes", 1024, &s->max_pending_bytes));
  PARASOL_RETURN_IF_ERROR(r.Unsigned("socket_hwm", 16, 1 << 24, &s->socket_hwm));
  PARASOL_RETURN_IF_ERROR(r.Bytes("max_queued_reply_bytes", 1 << 20, &s->max_queued_reply_bytes));
  PARASOL_RETURN_IF_ERROR(r.Bytes("memory_budget", 1024, &s->memory_budget));
  PARASOL_RETURN_IF_ERROR(r.DurationMs("idle_timeout", &s->idle_timeout_ms));
  PARASOL_RETURN_IF_ERROR(r.Unsigned("max_connections", 16, 1u << 20, &s->max_connections));
  std::string dir;
  PARASOL_RETURN_IF_ERROR(r.String("disk_dir", &dir));
  if (!dir.empty()) s->disk_dir = Resolve(BaseDir(file), dir);
  if (s->max_queued_reply_bytes < s->max_request_bytes) {
    return r.ErrorAt(root.Child("server"), "server.max_queued_reply_bytes",
                     "must be at least server.max_request_bytes (" +
                         std::to_string(s->max_request_bytes) + "), or a largest reply could "
                         "never be sent");
  }
  return r.Finish();
}

Status ParseTraining(MapReader& root, TrainingOptions* t, const std::string& file) {
  if (!root.Has("training")) return Status::Ok();
  YAML::Node node = root.Child("training");
  MapReader r(node, "training", file);
  PARASOL_RETURN_IF_ERROR(r.CheckIsMap());
  int mode = static_cast<int>(t->consistency);
  PARASOL_RETURN_IF_ERROR(r.Choice("consistency", {"bsp", "ssp", "asp"}, &mode));
  t->consistency = static_cast<TrainingOptions::Consistency>(mode);
  if (r.Has("staleness") && t->consistency != TrainingOptions::Consistency::kSsp) {
    return r.ErrorAt(node["staleness"], "training.staleness", "applies to consistency: ssp only");
  }
  PARASOL_RETURN_IF_ERROR(r.Unsigned("staleness", 0, 1 << 20, &t->staleness));
  PARASOL_RETURN_IF_ERROR(r.DurationMs("worker_timeout", &t->worker_timeout_ms));
  if (t->worker_timeout_ms <= 0) {
    return r.ErrorAt(node["worker_timeout"], "training.worker_timeout", "must be positive");
  }
  PARASOL_RETURN_IF_ERROR(r.Unsigned("batch_size", 1, 1 << 24, &t->batch_size));
  PARASOL_RETURN_IF_ERROR(r.Unsigned("epochs", 1, 1 << 20, &t->epochs));
  PARASOL_RETURN_IF_ERROR(r.Unsigned("max_steps", 0, int64_t{1} << 50, &t->max_steps));
  PARASOL_RETURN_IF_ERROR(r.Unsigned("eval_every", 0, int64_t{1} << 50, &t->eval_every));
  PARASOL_RETURN_IF_ERROR(r.Bool("prefetch", &t->prefetch));
  PARASOL_RETURN_IF_ERROR(r.Unsigned("accumulate", 1, 1 << 16, &t->accumulate));
  PARASOL_RETURN_IF_ERROR(r.Unsigned("prefetch_depth", 1, 64, &t->prefetch_depth));
  int nonfinite = static_cast<int>(t->on_nonfinite);
  PARASOL_RETURN_IF_ERROR(r.Choice("on_nonfinite", {"fail", "skip"}, &nonfinite));
  t->on_nonfinite = static_cast<TrainingOptions::OnNonfinite>(nonfinite);
  if (t->prefetch_depth > 1) {
    if (t->consistency == TrainingOptions::Consistency::kBsp) {
      return r.ErrorAt(node["prefetch_depth"], "training.prefetch_depth",
                       "applies to consistency: ssp or asp (bsp pulls after each tick)");
    }
    if (t->accumulate > 1) {
      return r.ErrorAt(node["prefetch_depth"], "training.prefetch_depth",
                       "does not apply with training.accumulate > 1 (which does not prefetch)");
    }
    if (t->consistency == TrainingOptions::Consistency::kSsp && t->prefetch_depth > t->staleness) {
      return r.ErrorAt(node["prefetch_depth"], "training.prefetch_depth",
                       "must be at most training.staleness (" + std::to_string(t->staleness) +
                           "): rows pulled k steps ahead miss the worker's own pushes of the "
                           "k steps before, which only a staleness of k allows");
    }
  }
  PARASOL_RETURN_IF_ERROR(r.DurationMs("progress_every", &t->progress_ms));
  int loss = static_cast<int>(t->on_worker_loss);
  PARASOL_RETURN_IF_ERROR(r.Choice("on_worker_loss", {"fail", "continue"}, &loss));
  t->on_worker_loss = static_cast<TrainingOptions::OnWorkerLoss>(loss);
  if (r.Has("on_overlapping_failure")) {
    int overlap = 0;
    PARASOL_RETURN_IF_ERROR(r.Choice("on_overlapping_failure", {"rollback", "fail"}, &overlap));
    t->on_overlapping_failure = overlap == 0 ? TrainingOptions::OnOverlappingFailure::kRollback
                                             : TrainingOptions::OnOverlappingFailure::kFail;
  }
  return r.Finish();
}

Status ParseOptimizerAt(MapReader& parent, const std::string& key, TableKind table_kind,
                        OptimizerOptions* opt, const std::string& file);

Status ParseWidths(MapReader& r, const YAML::Node& parent, const std::string& key,
                   std::vector<uint32_t>* out) {
  if (!r.Has(key)) return Status::Ok();
  YAML::Node n = r.Child(key);
  if (!n.IsSequence() || n.size() == 0) {
    return r.ErrorAt(n, r.PathOf(key), "expected a non-empty list of layer widths");
  }
  out->clear();
  for (size_t i = 0; i < n.size(); ++i) {
    int64_t v = 0;
    PARASOL_RETURN_IF_ERROR(
        r.ParseInt(n[i], r.PathOf(key) + "[" + std::to_string(i) + "]", 1, 1 << 16, &v));
    out->push_back(static_cast<uint32_t>(v));
  }
  (void)parent;
  return Status::Ok();
}

Status ParseModel(MapReader& root, ModelOptions* m, const std::string& file) {
  if (!root.Has("model")) return Status::Ok();
  YAML::Node node = root.Child("model");
  MapReader r(node, "model", file);
  PARASOL_RETURN_IF_ERROR(r.CheckIsMap());
  int kind = 0;
  PARASOL_RETURN_IF_ERROR(r.Choice("kind", {"none", "lr", "dlrm"}, &kind));
  m->kind = static_cast<ModelOptions::Kind>(kind);
  PARASOL_RETURN_IF_ERROR(r.Unsigned("embedding_dim", 1, 4096, &m->embedding_dim));
  PARASOL_RETURN_IF_ERROR(ParseWidths(r, node, "bottom", &m->bottom));
  PARASOL_RETURN_IF_ERROR(ParseWidths(r, node, "top", &m->top));
  PARASOL_RETURN_IF_ERROR(r.Double("embedding_init_scale", 0.0, 1e3, &m->embedding_init_scale));
  PARASOL_RETURN_IF_ERROR(
      ParseOptimizerAt(r, "sparse_optimizer", TableKind::kSparse, &m->sparse_optimizer, file));
  PARASOL_RETURN_IF_ERROR(
      ParseOptimizerAt(r, "dense_optimizer", TableKind::kDense, &m->dense_optimizer, file));
  int storage = 0, sparse_dtype = 0, sparse_state_dtype = 0;
  PARASOL_RETURN_IF_ERROR(r.Choice("sparse_storage", {"memory", "tiered"}, &storage));
  m->sparse_storage = static_cast<TableOptions::Storage>(storage);
  PARASOL_RETURN_IF_ERROR(r.Choice("sparse_dtype", {"f32", "bf16", "f16"}, &sparse_dtype));
  PARASOL_RETURN_IF_ERROR(
      r.Choice("sparse_state_dtype", {"f32", "bf16", "f16"}, &sparse_state_dtype));
  m->sparse_dtype = static_cast<DType>(sparse_dtype);
  m->sparse_state_dtype = static_cast<DType>(sparse_state_dtype);
  int dense_dtype = 0, dense_state_dtype = 0;
  PARASOL_RETURN_IF_ERROR(r.Choice("dense_dtype", {"f32", "bf16", "f16"}, &dense_dtype));
  PARASOL_RETURN_IF_ERROR(
      r.Choice("dense_state_dtype", {"f32", "bf16", "f16"}, &dense_state_dtype));
  m->dense_dtype = static_cast<DType>(dense_dtype);
  m->dense_state_dtype = static_cast<DType>(dense_state_dtype);
  if (m->kind == ModelOptions::Kind::kDlrm) {
    if (m->bottom.back() != m->embedding_dim) {
      return r.ErrorAt(node, "model.bottom", "the last bottom width (" +
                                                 std::to_string(m->bottom.back()) +
                                                 ") must equal embedding_dim (" +
                                                 std::to_string(m->embedding_dim) + ")");
    }
    if (m->top.back() != 1) {
      return r.ErrorAt(node, "model.top", "the last top width must be 1 (the logit)");
    }
  }
  return r.Finish();
}

Status ParseData(MapReader& root, DataOptions* d, const std::string& file) {
  if (!root.Has("data")) return Status::Ok();
  YAML::Node node = root.Child("data");
  MapReader r(node, "data", file);
  PARASOL_RETURN_IF_ERROR(r.CheckIsMap());
  int format = 0;
  PARASOL_RETURN_IF_ERROR(r.Choice("format", {"criteo", "libsvm"}, &format));
  d->format = static_cast<DataOptions::Format>(format);
  const std::string base = BaseDir(file);
  if (r.Has("train")) {
    YAML::Node t = r.Child("train");
    if (t.IsScalar()) {
      d->train.push_back(Resolve(base, t.Scalar()));
    } else if (t.IsSequence() && t.size() > 0) {
      for (size_t i = 0; i < t.size(); ++i) {
        if (!t[i].IsScalar()) {
          return r.ErrorAt(t[i], "data.train[" + std::to_string(i) + "]", "expected a path");
        }
        d->train.push_back(Resolve(base, t[i].Scalar()));
      }
    } else {
      return r.ErrorAt(t, "data.train", "expected a path or a list of paths");
    }
  }
  std::string eval;
  PARASOL_RETURN_IF_ERROR(r.String("eval", &eval));
  if (!eval.empty()) d->eval = Resolve(base, eval);
  int bad = 0;
  PARASOL_RETURN_IF_ERROR(r.Choice("on_bad_row", {"skip", "fail"}, &bad));
  d->on_bad_row = static_cast<DataOptions::OnBadRow>(bad);
  PARASOL_RETURN_IF_ERROR(r.Unsigned("queue_batches", 1, 1024, &d->queue_batches));
  PARASOL_RETURN_IF_ERROR(r.Unsigned("reader_threads", 1, 64, &d->reader_threads));
  return r.Finish();
}

Status ParsePathList(MapReader& r, const YAML::Node& node, const std::string& key,
                     const std::string& base, std::vector<std::string>* out) {
  if (!r.Has(key)) return Status::Ok();
  YAML::Node list = r.Child(key);
  if (!list.IsSequence()) return r.ErrorAt(list, r.PathOf(key), "expected a list of paths");
  for (size_t i = 0; i < list.size(); ++i) {
    if (!list[i].IsScalar()) {
      return r.ErrorAt(list[i], r.PathOf(key) + "[" + std::to_string(i) + "]", "expected a path");
    }
    out->push_back(Resolve(base, list[i].Scalar()));
  }
  (void)node;
  return Status::Ok();
}

Status ParseSecurity(MapReader& root, SecurityOptions* s, size_t servers, uint32_t workers,
                     const std::string& file) {
  if (!root.Has("security")) return Status::Ok();
  YAML::Node node = root.Child("security");
  MapReader r(node, "security", file);
  PARASOL_RETURN_IF_ERROR(r.CheckIsMap());
  const std::string base = BaseDir(file);
  PARASOL_RETURN_IF_ERROR(r.Bool("curve", &s->curve));
  PARASOL_RETURN_IF_ERROR(ParsePathList(r, node, "server_keys", base, &s->server_keys));
  PARASOL_RETURN_IF_ERROR(ParsePathList(r, node, "allowed_clients", base, &s->allowed_clients));
  PARASOL_RETURN_IF_ERROR(ParsePathList(r, node, "worker_keys", base, &s->worker_keys));
  PARASOL_RETURN_IF_ERROR(ParsePathList(r, node, "operator_keys", base, &s->operator_keys));
  int mode = static_cast<int>(s->mode);
  PARASOL_RETURN_IF_ERROR(r.Choice("mode", {"default", "insecure"}, &mode));
  s->mode = static_cast<SecurityOptions::Mode>(mode);
  if (s->curve && s->mode == SecurityOptions::Mode::kInsecure) {
    return r.ErrorAt(node["mode"], "security.mode", "insecure contradicts curve: true");
  }
  if (!s->operator_keys.empty() && !s->curve) {
    return r.ErrorAt(node["operator_keys"], "security.operator_keys", "operator keys need curve: true");
  }
  std::string client;
  PARASOL_RETURN_IF_ERROR(r.String("client_key", &client));
  if (!client.empty()) s->client_key = Resolve(base, client);
  if (s->curve) {
    if (s->server_keys.size() != servers) {
      return r.ErrorAt(node, "security.server_keys",
                       "curve needs one key pair per server (" + std::to_string(servers) +
                           "), found " + std::to_string(s->server_keys.size()));
    }
    if (s->client_key.empty()) {
      return r.ErrorAt(node, "security.client_key", "curve needs the workers' key pair");
    }
    if (s->allowed_clients.empty()) {
      return r.ErrorAt(node, "security.allowed_clients",
                       "curve needs the public keys the servers admit");
    }
  }
  if (!s->worker_keys.empty()) {
    const YAML::Node list = node["worker_keys"];
    if (!s->curve) {
      return r.ErrorAt(list, "security.worker_keys", "worker keys need curve: true");
    }
    if (s->worker_keys.size() != workers) {
      return r.ErrorAt(
          list, "security.worker_keys",
          "needs one key pair per worker rank (cluster.max_workers, default cluster.workers = " +
              std::to_string(workers) + "), found " + std::to_string(s->worker_keys.size()));
    }
  }
  return r.Finish();
}

Status ParseMetrics(MapReader& root, MetricsOptions* m, const std::string& file) {
  if (!root.Has("metrics")) return Status::Ok();
  MapReader r(root.Child("metrics"), "metrics", file);
  PARASOL_RETURN_IF_ERROR(r.CheckIsMap());
  PARASOL_RETURN_IF_ERROR(r.Bool("enabled", &m->enabled));
  PARASOL_RETURN_IF_ERROR(r.String("host", &m->host));
  PARASOL_RETURN_IF_ERROR(r.Unsigned("port", 1, 65535, &m->port));
  PARASOL_RETURN_IF_ERROR(r.Unsigned("worker_port", 1, 65535, &m->worker_port));
  return r.Finish();
}

Status ParseCheckpoint(MapReader& root, CheckpointOptions* c, uint64_t max_request_bytes,
                       const std::string& file) {
  if (!root.Has("checkpoint")) return Status::Ok();
  MapReader r(root.Child("checkpoint"), "checkpoint", file);
  PARASOL_RETURN_IF_ERROR(r.CheckIsMap());
  std::string dir;
  PARASOL_RETURN_IF_ERROR(r.String("dir", &dir));
  if (!dir.empty()) c->dir = Resolve(BaseDir(file), dir);
  PARASOL_RETURN_IF_ERROR(r.Unsigned("every_steps", 0, int64_t{1} << 40, &c->every_steps));
  int64_t ms = c->every_seconds * 1000;
  PARASOL_RETURN_IF_ERROR(r.DurationMs("every_seconds", &ms));
  c->every_seconds = ms / 1000;
  PARASOL_RETURN_IF_ERROR(r.Unsigned("keep", 1, 1000, &c->keep));
  PARASOL_RETURN_IF_ERROR(r.Bool("restore", &c->restore));
  PARASOL_RETURN_IF_ERROR(r.Bool("background", &c->background));
  PARASOL_RETURN_IF_ERROR(r.Bytes("copy_below", 0, &c->copy_below));
  PARASOL_RETURN_IF_ERROR(r.Unsigned("full_every", 1, 1000000, &c->full_every));
  PARASOL_RETURN_IF_ERROR(r.Bytes("max_log_bytes", 1 << 20, &c->max_log_bytes));
  PARASOL_RETURN_IF_ERROR(r.DurationMs("min_interval", &c->min_interval_ms));
  int dtype = c->bf16 ? 1 : 0;
  PARASOL_RETURN_IF_ERROR(r.Choice("dtype", {"f32", "bf16"}, &dtype));
  c->bf16 = dtype == 1;
  if (r.Has("min_interval") && (c->min_interval_ms < 0 || c->min_interval_ms > 3600 * 1000)) {
    return r.ErrorAt(root.Child("checkpoint")["min_interval"], "checkpoint.min_interval",
                     "must be between 0 and 1 h");
  }
  if (!c->dir.empty() && c->max_log_bytes / 2 < max_request_bytes) {
    return r.ErrorAt(root.Child("checkpoint"), "checkpoint.max_log_bytes",
                     std::to_string(c->max_log_bytes) + " must be at least twice "
                     "server.max_request_bytes (" + std::to_string(max_request_bytes) +
                     "): one push may be that large, and the push log must hold it beside "
                     "what the shards checkpoint at half the limit");
  }
  return r.Finish();
}

Status ParseWorker(MapReader& root, WorkerOptions* w, const std::string& file) {
  if (!root.Has("worker")) return Status::Ok();
  MapReader r(root.Child("worker"), "worker", file);
  PARASOL_RETURN_IF_ERROR(r.CheckIsMap());
  PARASOL_RETURN_IF_ERROR(r.Unsigned("blas_threads", 1, 1024, &w->blas_threads));
  PARASOL_RETURN_IF_ERROR(r.Unsigned("compute_threads", 1, 256, &w->compute_threads));
  PARASOL_RETURN_IF_ERROR(r.Bool("pin_compute_threads", &w->pin_compute_threads));
  PARASOL_RETURN_IF_ERROR(r.Unsigned("cache_rows", 0, int64_t{1} << 40, &w->cache_rows));
  PARASOL_RETURN_IF_ERROR(r.Bool("tf32", &w->tf32));
  PARASOL_RETURN_IF_ERROR(r.Bool("fuse_requests", &w->fuse_requests));
  int compute = static_cast<int>(w->compute);
  PARASOL_RETURN_IF_ERROR(r.Choice("compute", {"model", "none"}, &compute));
  w->compute = static_cast<WorkerOptions::Compute>(compute);
  if (r.Has("command")) {
    // The program a worker role runs instead of the built-in trainer, in the manifest's folder.
    YAML::Node c = r.Child("command");
    if (c.IsScalar() && !c.Scalar().empty()) {
      w->command.push_back(c.Scalar());
    } else if (c.IsSequence() && c.size() > 0) {
      for (size_t i = 0; i < c.size(); ++i) {
        if (!c[i].IsScalar() || c[i].Scalar().empty()) {
          return r.ErrorAt(c[i], "worker.command[" + std::to_string(i) + "]",
                           "expected a program or argument");
        }
        w->command.push_back(c[i].Scalar());
      }
    } else {
      return r.ErrorAt(c, "worker.command", "expected a program, or a list: program, arguments");
    }
  }
  std::string dir;
  PARASOL_RETURN_IF_ERROR(r.String("command_dir", &dir));
  w->command_dir = dir.empty() ? BaseDir(file) : Resolve(BaseDir(file), dir);
  if (r.Has("device")) {
    YAML::Node n = r.Child("device");
    const std::string d = n.IsScalar() ? n.Scalar() : "";
    bool ok = d == "cpu" || d == "cuda";
    if (d.rfind("cuda:", 0) == 0 && d.size() > 5) {
      ok = d.find_first_not_of("0123456789", 5) == std::string::npos && d.size() < 9;
    }
    if (!ok) return r.ErrorAt(n, "worker.device", "expected cpu, cuda or cuda:N, got '" + d + "'");
    w->device = d;
  }
  return r.Finish();
}

Status ParseWire(MapReader& root, WireOptions* w, const std::string& file) {
  if (!root.Has("wire")) return Status::Ok();
  MapReader r(root.Child("wire"), "wire", file);
  PARASOL_RETURN_IF_ERROR(r.CheckIsMap());
  int compression = 0;
  PARASOL_RETURN_IF_ERROR(r.Choice("compression", {"none", "bf16", "f16"}, &compression));
  w->compression = static_cast<WireOptions::Compression>(compression);
  return r.Finish();
}

Status ParseInit(MapReader& table, const std::string& path, InitOptions* init,
                 const std::string& file) {
  if (!table.Has("init")) return Status::Ok();
  MapReader r(table.Child("init"), path + ".init", file);
  PARASOL_RETURN_IF_ERROR(r.CheckIsMap());
  int kind = static_cast<int>(init->kind);
  PARASOL_RETURN_IF_ERROR(r.Choice("kind", {"zeros", "constant", "uniform", "normal"}, &kind));
  init->kind = static_cast<InitOptions::Kind>(kind);
  const double big = 1e30;
  PARASOL_RETURN_IF_ERROR(r.Double("value", -big, big, &init->value));
  PARASOL_RETURN_IF_ERROR(r.Double("scale", 0.0, big, &init->scale));
  PARASOL_RETURN_IF_ERROR(r.Double("mean", -big, big, &init->mean));
  PARASOL_RETURN_IF_ERROR(r.Double("stddev", 0.0, big, &init->stddev));
  return r.Finish();
}

Status ParseOptimizerAt(MapReader& parent, const std::string& key, TableKind table_kind,
                        OptimizerOptions* opt, const std::string& file) {
  if (!parent.Has(key)) return Status::Ok();
  YAML::Node node = parent.Child(key);
  MapReader r(node, parent.PathOf(key), file);
  PARASOL_RETURN_IF_ERROR(r.CheckIsMap());
  static const std::vector<std::string> kKinds = {"sgd", "adagrad", "adagrad_rowwise", "adam",
                                                  "ftrl"};
  int kind = static_cast<int>(opt->kind);
  PARASOL_RETURN_IF_ERROR(r.Choice("kind", kKinds, &kind));
  opt->kind = static_cast<OptimizerOptions::Kind>(kind);
  // The fields each optimizer reads; any other is a mistake worth naming.
  using K = OptimizerOptions::Kind;
  static const std::map<K, std::set<std::string>> kFields = {
      {K::kSgd, {"lr", "weight_decay"}},
      {K::kAdagrad, {"lr", "weight_decay", "eps", "initial_accumulator"}},
      {K::kAdagradRowwise, {"lr", "weight_decay", "eps", "initial_accumulator"}},
      {K::kAdam, {"lr", "weight_decay", "eps", "beta1", "beta2", "bias_correction"}},
      {K::kFtrl, {"weight_decay", "alpha", "beta", "l1", "l2"}},
  };
  for (auto it = node.begin(); it != node.end(); ++it) {
    const std::string key = it->first.Scalar();
    if (key != "kind" && !kFields.at(opt->kind).count(key) &&
        std::find(std::begin(kOptimizerKeys), std::end(kOptimizerKeys), key) !=
            std::end(kOptimizerKeys)) {
      return r.ErrorAt(it->first, r.PathOf(key),
                       "does not apply to optimizer '" + kKinds[kind] + "'");
    }
  }
  if (opt->kind == K::kAdagradRowwise && table_kind == TableKind::kDense) {
    return r.ErrorAt(node, r.PathOf("kind"),
                     "adagrad_rowwise keeps one accumulator per row: use it on sparse tables");
  }
  PARASOL_RETURN_IF_ERROR(r.Double("lr", 0.0, 1e6, &opt->lr));
  PARASOL_RETURN_IF_ERROR(r.Double("weight_decay", 0.0, 1e6, &opt->weight_decay));
  PARASOL_RETURN_IF_ERROR(r.Double("eps", 1e-30, 1.0, &opt->eps));
  PARASOL_RETURN_IF_ERROR(r.Double("initial_accumulator", 0.0, 1e6, &opt->initial_accumulator));
  PARASOL_RETURN_IF_ERROR(r.Double("beta1", 0.0, 0.999999, &opt->beta1));
  PARASOL_RETURN_IF_ERROR(r.Double("beta2", 0.0, 0.999999999, &opt->beta2));
  PARASOL_RETURN_IF_ERROR(r.Bool("bias_correction", &opt->bias_correction));
  PARASOL_RETURN_IF_ERROR(r.Double("alpha", 1e-12, 1e6, &opt->alpha));
  PARASOL_RETURN_IF_ERROR(r.Double("beta", 0.0, 1e6, &opt->beta));
  PARASOL_RETURN_IF_ERROR(r.Double("l1", 0.0, 1e6, &opt->l1));
  PARASOL_RETURN_IF_ERROR(r.Double("l2", 0.0, 1e6, &opt->l2));
  return r.Finish();
}

Status ParseAdmission(MapReader& table, const std::string& path, AdmissionOptions* a,
                      const std::string& file) {
  if (!table.Has("admission")) return Status::Ok();
  MapReader r(table.Child("admission"), path + ".admission", file);
  PARASOL_RETURN_IF_ERROR(r.CheckIsMap());
  PARASOL_RETURN_IF_ERROR(r.Unsigned("min_count", 1, 65535, &a->min_count));
  return r.Finish();
}

Status ParseEviction(MapReader& table, const std::string& path, EvictionOptions* e,
                     const std::string& file) {
  if (!table.Has("eviction")) return Status::Ok();
  MapReader r(table.Child("eviction"), path + ".eviction", file);
  PARASOL_RETURN_IF_ERROR(r.CheckIsMap());
  PARASOL_RETURN_IF_ERROR(r.Unsigned("ttl_clocks", 0, int64_t{1} << 40, &e->ttl_clocks));
  PARASOL_RETURN_IF_ERROR(r.Unsigned("max_rows", 0, int64_t{1} << 40, &e->max_rows));
  return r.Finish();
}

// Why a table name breaks the rule (empty: it keeps it). Names become file names in an
// export (NAME.rows) and appear in logs and errors: '/', '..' or a NUL would write outside
// the export folder or cut the name short.
std::string TableNameProblem(const std::string& name) {
  if (name.empty()) return "must not be empty";
  if (name.size() > kMaxTableNameLength) {
    return "is " + std::to_string(name.size()) + " characters long, over the limit of " +
           std::to_string(kMaxTableNameLength);
  }
  const auto letter = [](char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'); };
  const auto digit = [](char c) { return c >= '0' && c <= '9'; };
  if (!letter(name[0]) && name[0] != '_') return "must start with a letter or '_'";
  for (char c : name) {
    if (!letter(c) && !digit(c) && c != '_' && c != '.' && c != '-') {
      return "may hold only letters, digits, '_', '.' and '-'";
    }
  }
  if (name.find("..") != std::string::npos) return "must not contain '..'";
  return "";
}

Status ParseTable(const YAML::Node& node, size_t index, const JobOptions& job, TableOptions* t,
                  const std::string& file) {
  const std::string path = "tables[" + std::to_string(index) + "]";
  MapReader r(node, path, file);
  PARASOL_RETURN_IF_ERROR(r.CheckIsMap());
  if (!r.Has("name")) return r.ErrorAt(node, path + ".name", "missing: every table needs a name");
  PARASOL_RETURN_IF_ERROR(r.String("name", &t->name));
  if (const std::string problem = TableNameProblem(t->name); !problem.empty()) {
    return r.ErrorAt(node["name"], path + ".name",
                     "table name '" + PrintableName(t->name) + "' " + problem +
                         " (a name is letters, digits, '_', '.' and '-', starts with a letter "
                         "or '_', has no '..' and at most " +
                         std::to_string(kMaxTableNameLength) + " characters)");
  }
  int kind = 0;
  PARASOL_RETURN_IF_ERROR(r.Choice("kind", {"sparse", "dense"}, &kind));
  t->kind = kind == 0 ? TableKind::kSparse : TableKind::kDense;
  int dtype = 0, state_dtype = 0, rounding = 0;
  PARASOL_RETURN_IF_ERROR(r.Choice("dtype", {"f32", "bf16", "f16"}, &dtype));
  PARASOL_RETURN_IF_ERROR(r.Choice("state_dtype", {"f32", "bf16", "f16"}, &state_dtype));
  PARASOL_RETURN_IF_ERROR(r.Choice("rounding", {"nearest", "stochastic"}, &rounding));
  t->dtype = static_cast<DType>(dtype);
  t->state_dtype = static_cast<DType>(state_dtype);
  t->rounding = static_cast<TableOptions::Rounding>(rounding);
  PARASOL_RETURN_IF_ERROR(r.Unsigned("dim", 1, 1 << 16, &t->dim));
  int storage = 0;
  PARASOL_RETURN_IF_ERROR(r.Choice("storage", {"memory", "tiered"}, &storage));
  t->storage = static_cast<TableOptions::Storage>(storage);
  if (t->kind == TableKind::kDense && t->storage == TableOptions::Storage::kTiered) {
    return r.ErrorAt(node["storage"], path + ".storage", "tiered applies to sparse tables only");
  }
  if (t->kind == TableKind::kDense) {
    if (r.Has("dim")) return r.ErrorAt(node["dim"], path + ".dim", "dense tables take 'shape'");
    if (!r.Has("shape")) {
      return r.ErrorAt(node, path + ".shape", "missing: dense tables need a shape");
    }
    YAML::Node shape = r.Child("shape");
    if (!shape.IsSequence() || shape.size() == 0) {
      return r.ErrorAt(shape, path + ".shape", "expected a non-empty list of sizes");
    }
    uint64_t elements = 1;
    for (size_t i = 0; i < shape.size(); ++i) {
      int64_t v = 0;
      PARASOL_RETURN_IF_ERROR(r.ParseInt(shape[i], path + ".shape[" + std::to_string(i) + "]",
                                         1, int64_t{1} << 34, &v));
      t->shape.push_back(static_cast<uint64_t>(v));
      // Checked: two sizes of 2^32 would wrap the product to 0 and pass the bound.
      if (__builtin_mul_overflow(elements, static_cast<uint64_t>(v), &elements) ||
          elements > (uint64_t{1} << 34)) {
        return r.ErrorAt(shape, path + ".shape", "tensor has more than 2^34 elements");
      }
    }
  } else if (r.Has("shape")) {
    return r.ErrorAt(node["shape"], path + ".shape", "sparse tables take 'dim'");
  }
  t->seed = job.seed ^ HashBytes(t->name);
  PARASOL_RETURN_IF_ERROR(r.Unsigned("seed", 0, std::numeric_limits<int64_t>::max(), &t->seed));
  PARASOL_RETURN_IF_ERROR(ParseInit(r, path, &t->init, file));
  PARASOL_RETURN_IF_ERROR(ParseOptimizerAt(r, "optimizer", t->kind, &t->optimizer, file));
  if (t->kind == TableKind::kDense) {
    for (const char* key : {"admission", "eviction"}) {
      if (r.Has(key)) {
        return r.ErrorAt(node[key], path + "." + key, "applies to sparse tables only");
      }
    }
  }
  PARASOL_RETURN_IF_ERROR(ParseAdmission(r, path, &t->admission, file));
  PARASOL_RETURN_IF_ERROR(ParseEviction(r, path, &t->eviction, file));
  return r.Finish();
}

Status ParseTables(MapReader& root, std::vector<TableOptions>* tables, const JobOptions& job,
                   const std::string& file) {
  if (!root.Has("tables")) return Status::Ok();
  YAML::Node node = root.Child("tables");
  if (!node.IsSequence()) return root.ErrorAt(node, "tables", "expected a list of tables");
  std::set<std::string> names;
  for (size_t i = 0; i < node.size(); ++i) {
    TableOptions t;
    PARASOL_RETURN_IF_ERROR(ParseTable(node[i], i, job, &t, file));
    if (!names.insert(t.name).second) {
      return root.ErrorAt(node[i]["name"], "tables[" + std::to_string(i) + "].name",
                          "duplicate table name '" + t.name + "'");
    }
    tables->push_back(std::move(t));
  }
  return Status::Ok();
}

}  // namespace

uint64_t TableOptions::NumElements() const {
  if (kind == TableKind::kSparse) return dim;
  uint64_t n = 1;
  for (uint64_t s : shape) n *= s;
  return n;
}

int Manifest::FindTable(const std::string& name) const {
  for (size_t i = 0; i < tables.size(); ++i) {
    if (tables[i].name == name) return static_cast<int>(i);
  }
  return -1;
}

namespace {

// What defines the tables' values (not where they are served from), one line each.
void AppendTableDefinitions(const std::vector<TableOptions>& tables, std::ostringstream& s) {
  for (const auto& t : tables) {
    s << "table=" << t.name << "|" << static_cast<int>(t.kind) << "|" << t.dim << "|";
    for (uint64_t d : t.shape) s << d << "x";
    s << "|" << static_cast<int>(t.dtype);
    // Only when set: the fingerprints of manifests without them stay as they were.
    if (t.state_dtype != DType::kF32 || t.rounding != TableOptions::Rounding::kNearest) {
      s << "," << static_cast<int>(t.state_dtype) << "," << static_cast<int>(t.rounding);
    }
    s << "|" << t.seed << "|" << static_cast<int>(t.init.kind)
      << "," << t.init.value << "," << t.init.scale << "," << t.init.mean << ","
      << t.init.stddev << "|" << static_cast<int>(t.optimizer.kind) << "," << t.optimizer.lr
      << "," << t.optimizer.weight_decay << "," << t.optimizer.eps << ","
      << t.optimizer.initial_accumulator << "," << t.optimizer.beta1 << "," << t.optimizer.beta2
      << "," << t.optimizer.bias_correction << "," << t.optimizer.alpha << "," << t.optimizer.beta
      << "," << t.optimizer.l1 << "," << t.optimizer.l2 << "|" << t.admission.min_count << ","
      << t.eviction.ttl_clocks << "," << t.eviction.max_rows << ";";
  }
}

}  // namespace

uint64_t Manifest::Fingerprint() const {
  std::ostringstream s;
  s << "servers=";
  for (const auto& a : cluster.servers) s << a.ToString() << ",";
  s << ";curve=" << security.curve;
  s << ";workers=" << cluster.workers << ";consistency="
    << static_cast<int>(training.consistency) << "," << training.staleness << ";";
  // Only when set: the fingerprints of manifests without it stay as they were.
  if (cluster.max_workers > cluster.workers) s << "max_workers=" << cluster.max_workers << ";";
  if (cluster.InitialServers() < cluster.servers.size()) {
    s << "initial_servers=" << cluster.InitialServers() << ";";
  }
  if (training.prefetch && training.prefetch_depth > 1) {
    s << "prefetch_depth=" << training.prefetch_depth << ";";
  }
  if (training.on_overlapping_failure != TrainingOptions::OnOverlappingFailure::kDefault) {
    s << "overlap=" << static_cast<int>(training.on_overlapping_failure) << ";";
  }
  AppendTableDefinitions(tables, s);
  return HashBytes(s.str());
}

bool Manifest::RollsBack() const {
  using O = TrainingOptions::OnOverlappingFailure;
  if (training.on_overlapping_failure != O::kDefault) {
    return training.on_overlapping_failure == O::kRollback;
  }
  return training.consistency == TrainingOptions::Consistency::kBsp && !checkpoint.dir.empty() &&
         checkpoint.every_steps > 0;
}

uint64_t Manifest::TablesFingerprint() const {
  std::ostringstream s;
  AppendTableDefinitions(tables, s);
  return HashBytes(s.str());
}

Result<Manifest> ParseManifest(const std::string& text, const std::string& source) {
  YAML::Node doc;
  try {
    doc = YAML::Load(text);
  } catch (const YAML::Exception& e) {
    return InvalidArgument(source + ":" + std::to_string(e.mark.line + 1) + ":" +
                           std::to_string(e.mark.column + 1) + ": YAML syntax error: " + e.msg);
  }
  try {
    uint64_t visited = 0;
    PARASOL_RETURN_IF_ERROR(CheckYamlTree(doc, source, &visited));
  } catch (const YAML::Exception& e) {
    return InvalidArgument(source + ":" + std::to_string(e.mark.line + 1) + ": " + e.msg);
  }
  Manifest m;
  m.source = source;
  if (!doc.IsMap()) {
    return InvalidArgument(source + ": expected a mapping at the top level of the manifest");
  }
  try {
    MapReader root(doc, "", m.source);
    PARASOL_RETURN_IF_ERROR(ParseJob(root, &m.job, m.source));
    PARASOL_RETURN_IF_ERROR(ParseCluster(root, &m.cluster, m.source));
    PARASOL_RETURN_IF_ERROR(ParseServer(root, &m.server, m.source));
    PARASOL_RETURN_IF_ERROR(ParseTraining(root, &m.training, m.source));
    PARASOL_RETURN_IF_ERROR(ParseModel(root, &m.model, m.source));
    PARASOL_RETURN_IF_ERROR(ParseData(root, &m.data, m.source));
    PARASOL_RETURN_IF_ERROR(ParseWorker(root, &m.worker, m.source));
    PARASOL_RETURN_IF_ERROR(ParseWire(root, &m.wire, m.source));
    PARASOL_RETURN_IF_ERROR(
        ParseSecurity(root, &m.security, m.cluster.servers.size(), m.cluster.max_workers, m.source));
    PARASOL_RETURN_IF_ERROR(ParseMetrics(root, &m.metrics, m.source));
    PARASOL_RETURN_IF_ERROR(ParseCheckpoint(root, &m.checkpoint, m.server.max_request_bytes, m.source));
    if (m.cluster.restart_servers && (m.checkpoint.dir.empty() || !m.checkpoint.restore)) {
      return InvalidArgument(KeyError(m.source, "cluster.restart_servers",
                                      "a restarted server needs checkpoint.dir with "
                                      "checkpoint.restore: true, or it comes back empty and "
                                      "every update it held is lost"));
    }
    if (m.training.on_overlapping_failure == TrainingOptions::OnOverlappingFailure::kRollback &&
        (m.checkpoint.dir.empty() || m.checkpoint.every_steps == 0 ||
         m.training.consistency != TrainingOptions::Consistency::kBsp)) {
      return InvalidArgument(KeyError(m.source, "training.on_overlapping_failure",
                                      "rollback needs consistency: bsp with checkpoint.dir and "
                                      "checkpoint.every_steps (the shards roll back to a "
                                      "checkpoint they all took at one clock)"));
    }
    if (m.checkpoint.min_interval_ms < 0) {
      m.checkpoint.min_interval_ms = std::min<int64_t>(1000, m.cluster.request_timeout_ms / 2);
    } else if (!m.checkpoint.dir.empty() &&
               m.checkpoint.min_interval_ms >= m.cluster.request_timeout_ms) {
      // A restarted worker's Hello waits for the next forced checkpoint: within one request.
      return InvalidArgument(KeyError(
          m.source, "checkpoint.min_interval",
          std::to_string(m.checkpoint.min_interval_ms) +
              " ms must be below cluster.request_timeout (" +
              std::to_string(m.cluster.request_timeout_ms) +
              " ms), which a restarted worker's Hello may wait it out within"));
    }
    if (m.server.idle_timeout_ms < 0) {
      m.server.idle_timeout_ms = std::max<int64_t>(60000, 2 * m.cluster.request_timeout_ms);
    } else if (m.server.idle_timeout_ms <= m.cluster.request_timeout_ms ||
               m.server.idle_timeout_ms > 24 * 3600 * 1000) {
      // A tool waiting for its answer sends nothing until its request times out.
      return InvalidArgument(KeyError(
          m.source, "server.idle_timeout",
          std::to_string(m.server.idle_timeout_ms) +
              " ms must be above cluster.request_timeout (" +
              std::to_string(m.cluster.request_timeout_ms) +
              " ms), which a client waiting for a reply may stay silent for, and at most 24 h"));
    }
    PARASOL_RETURN_IF_ERROR(ParseTables(root, &m.tables, m.job, m.source));
    PARASOL_RETURN_IF_ERROR(root.Finish());
    PARASOL_RETURN_IF_ERROR(AddModelTables(&m));
    for (TableOptions& t : m.tables) t.keep_clock = m.checkpoint.full_every > 1;
  } catch (const YAML::Exception& e) {
    return InvalidArgument(source + ":" + std::to_string(e.mark.line + 1) + ": " + e.msg);
  }
  return m;
}

Result<Manifest> ParseManifestRecordingKeys(const std::string& text, const std::string& source,
                                            std::set<std::string>* asked) {
  // Restored however the parse ends (an escaped exception included).
  struct Recording {
    std::set<std::string>* before;
    ~Recording() { asked_keys = before; }
  } recording{asked_keys};
  asked_keys = asked;
  return ParseManifest(text, source);
}

Result<Manifest> LoadManifest(const std::string& path) {
  // Read in bounded pieces, at most the cap and one byte more: a manifest named /dev/zero or a
  // huge file is refused after that much, not read until memory runs out. O_NONBLOCK: opening
  // a FIFO without a writer does not wait for one (cleared below for the reads).
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) return NotFound("cannot read manifest '" + path + "': " + std::strerror(errno));
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    return IoError("cannot read manifest '" + path + "': " + std::strerror(errno));
  }
  if (S_ISDIR(st.st_mode)) return InvalidArgument("manifest '" + path + "' is a directory");
  const std::string too_large = "manifest '" + path + "' is larger than the limit of " +
                                std::to_string(kMaxManifestBytes) + " bytes (" +
                                std::to_string(kMaxManifestBytes >> 20) + " MiB)";
  if (S_ISREG(st.st_mode) && static_cast<uint64_t>(st.st_size) > kMaxManifestBytes) {
    return InvalidArgument(too_large);
  }
  const int flags = ::fcntl(fd, F_GETFL);
  if (flags >= 0) (void)::fcntl(fd, F_SETFL, flags & ~O_NONBLOCK);
  std::string text;
  char piece[64 * 1024];
  while (text.size() <= kMaxManifestBytes) {
    const ssize_t n = ::read(fd, piece, sizeof(piece));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return IoError("cannot read manifest '" + path + "': " + std::strerror(errno));
    if (n == 0) break;
    text.append(piece, static_cast<size_t>(n));
  }
  if (text.size() > kMaxManifestBytes) return InvalidArgument(too_large);
  return ParseManifest(text, path);
}

Result<int64_t> ParseDurationMs(const std::string& text) {
  size_t i = 0;
  while (i < text.size() && (std::isdigit(static_cast<unsigned char>(text[i])) || text[i] == '.')) {
    ++i;
  }
  const std::string number = text.substr(0, i);
  const std::string unit = text.substr(i);
  char* end = nullptr;
  const double v = std::strtod(number.c_str(), &end);
  if (number.empty() || end != number.c_str() + number.size()) {
    return InvalidArgument("expected a duration such as 30s or 250ms, got '" + text + "'");
  }
  double ms = 0;
  if (unit.empty() || unit == "s") {
    ms = v * 1000.0;
  } else if (unit == "ms") {
    ms = v;
  } else if (unit == "m") {
    ms = v * 60000.0;
  } else if (unit == "h") {
    ms = v * 3600000.0;
  } else {
    return InvalidArgument("unknown duration unit '" + unit + "' in '" + text +
                           "' (use ms, s, m or h)");
  }
  if (ms > 1e12) return InvalidArgument("duration '" + text + "' is too long");
  return static_cast<int64_t>(std::llround(ms));
}

Result<uint64_t> ParseBytes(const std::string& text) {
  size_t i = 0;
  while (i < text.size() && std::isdigit(static_cast<unsigned char>(text[i]))) ++i;
  const std::string number = text.substr(0, i);
  const std::string unit = text.substr(i);
  if (number.empty() || number.size() > 15) {
    return InvalidArgument("expected a size such as 4MiB, got '" + text + "'");
  }
  const uint64_t v = std::stoull(number);
  uint64_t mult = 1;
  if (unit.empty() || unit == "B") {
    mult = 1;
  } else if (unit == "KiB") {
    mult = 1ull << 10;
  } else if (unit == "MiB") {
    mult = 1ull << 20;
  } else if (unit == "GiB") {
    mult = 1ull << 30;
  } else {
    return InvalidArgument("unknown size unit '" + unit + "' in '" + text +
                           "' (use B, KiB, MiB or GiB)");
  }
  if (v > (uint64_t{1} << 50) / mult) return InvalidArgument("size '" + text + "' is too large");
  return v * mult;
}

}  // namespace parasol
