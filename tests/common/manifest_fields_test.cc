// The field table (common/manifest_fields.hpp) against the parser: the parser asks for exactly
// the fields the table lists, each default is what the parser leaves when the field is absent,
// and docs/manifest.md and examples/manifest.yaml are what the generators print. A field added
// to common/manifest.cc without its entry fails here.
#include "common/manifest_fields.hpp"

#include <gtest/gtest.h>

#include <fstream>
#include <iomanip>
#include <set>
#include <sstream>
#include <string>

#include "common/manifest.hpp"

namespace parasol {
namespace {

std::string ReadSourceFile(const std::string& relative) {
  std::ifstream in(std::string(PARASOL_SOURCE_DIR) + "/" + relative, std::ios::binary);
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

// Every member of the parsed manifest, one per line: two manifests that mean the same describe
// alike. A member added to a struct in common/manifest.hpp belongs here too.
std::string Describe(const Manifest& m) {
  std::ostringstream s;
  s << std::setprecision(17);
  const auto optimizer = [&s](const char* name, const OptimizerOptions& o) {
    s << name << ": " << static_cast<int>(o.kind) << " " << o.lr << " " << o.weight_decay << " "
      << o.eps << " " << o.initial_accumulator << " " << o.beta1 << " " << o.beta2 << " "
      << o.bias_correction << " " << o.alpha << " " << o.beta << " " << o.l1 << " " << o.l2 << "\n";
  };
  const auto list = [&s](const char* name, const auto& items) {
    s << name << ":";
    for (const auto& item : items) s << " " << item;
    s << "\n";
  };
  s << "job: " << m.job.name << " " << m.job.seed << "\n";
  const ClusterOptions& c = m.cluster;
  s << "cluster.servers:";
  for (const ServerAddress& a : c.servers) s << " " << a.ToString();
  s << "\ncluster: " << c.initial_servers << " " << c.workers << " " << c.max_workers << " ["
    << c.bind << "] " << c.connect_timeout_ms << " " << c.request_timeout_ms << " "
    << c.request_retries << " " << c.restore_timeout_ms << " " << c.restart_servers << " "
    << c.restart_workers << "\n";
  list("cluster.worker_hosts", c.worker_hosts);
  const ServerOptions& v = m.server;
  s << "server: " << v.engine_threads << " " << static_cast<int>(v.apply_after_reply) << " "
    << v.max_request_bytes << " " << v.frame_bytes << " "
    << v.max_held_pulls << " " << v.max_held_bytes << " " << v.max_pending_clocks << " "
    << v.max_pending_bytes << " " << v.socket_hwm << " " << v.max_queued_reply_bytes << " "
    << v.max_connections << " " << v.idle_timeout_ms << " " << v.memory_budget << " [" << v.disk_dir
    << "]\n";
  const TrainingOptions& t = m.training;
  s << "training: " << static_cast<int>(t.consistency) << " " << t.staleness << " "
    << t.worker_timeout_ms << " " << static_cast<int>(t.on_worker_loss) << " " << t.batch_size
    << " " << t.epochs << " " << t.max_steps << " " << t.eval_every << " " << t.prefetch << " "
    << t.prefetch_depth << " " << t.accumulate << " " << t.progress_ms << " "
    << static_cast<int>(t.on_nonfinite) << " " << static_cast<int>(t.on_overlapping_failure)
    << "\n";
  const ModelOptions& md = m.model;
  s << "model: " << static_cast<int>(md.kind) << " " << md.embedding_dim << " "
    << md.embedding_init_scale << " " << static_cast<int>(md.sparse_storage) << " "
    << static_cast<int>(md.sparse_dtype) << " " << static_cast<int>(md.sparse_state_dtype) << " "
    << static_cast<int>(md.dense_dtype) << " " << static_cast<int>(md.dense_state_dtype) << "\n";
  list("model.bottom", md.bottom);
  list("model.top", md.top);
  optimizer("model.sparse_optimizer", md.sparse_optimizer);
  optimizer("model.dense_optimizer", md.dense_optimizer);
  const DataOptions& d = m.data;
  s << "data: " << static_cast<int>(d.format) << " [" << d.eval << "] "
    << static_cast<int>(d.on_bad_row) << " " << d.queue_batches << " " << d.reader_threads << "\n";
  list("data.train", d.train);
  const WorkerOptions& w = m.worker;
  s << "worker: " << w.device << " " << w.tf32 << " " << static_cast<int>(w.compute) << " "
    << w.blas_threads << " " << w.compute_threads << " " << w.pin_compute_threads << " " << w.cache_rows << " " << w.fuse_requests << " [" << w.command_dir
    << "]\n";
  list("worker.command", w.command);
  s << "wire: " << static_cast<int>(m.wire.compression) << "\n";
  const SecurityOptions& sec = m.security;
  s << "security: " << sec.curve << " [" << sec.client_key << "] " << static_cast<int>(sec.mode)
    << "\n";
  list("security.server_keys", sec.server_keys);
  list("security.allowed_clients", sec.allowed_clients);
  list("security.worker_keys", sec.worker_keys);
  list("security.operator_keys", sec.operator_keys);
  s << "metrics: " << m.metrics.enabled << " " << m.metrics.host << " " << m.metrics.port << " "
    << m.metrics.worker_port << "\n";
  const CheckpointOptions& k = m.checkpoint;
  s << "checkpoint: [" << k.dir << "] " << k.every_steps << " " << k.every_seconds << " " << k.keep
    << " " << k.restore << " " << k.background << " " << k.copy_below << " " << k.full_every << " "
    << k.max_log_bytes << " " << k.min_interval_ms << " " << k.bf16 << "\n";
  for (const TableOptions& tb : m.tables) {
    s << "table " << tb.name << ": " << static_cast<int>(tb.kind) << " " << tb.dim << " "
      << static_cast<int>(tb.dtype) << " " << static_cast<int>(tb.state_dtype) << " "
      << static_cast<int>(tb.rounding) << " " << static_cast<int>(tb.storage) << " " << tb.seed
      << " " << tb.keep_clock << " | " << static_cast<int>(tb.init.kind) << " " << tb.init.value
      << " " << tb.init.scale << " " << tb.init.mean << " " << tb.init.stddev << " | "
      << tb.admission.min_count << " " << tb.eviction.ttl_clocks << " " << tb.eviction.max_rows
      << "\n";
    list("  shape", tb.shape);
    optimizer("  optimizer", tb.optimizer);
  }
  return s.str();
}

// A default the parser can be given as text (not "required", not derived from other fields).
bool HasYamlDefault(const ManifestField& f) {
  return !f.section && !f.default_value.empty() && f.default_value != "required";
}

bool CommentedInExample(const ManifestField& f) { return f.example.rfind("# ", 0) == 0; }

constexpr const char* kSource = "examples/manifest.yaml";

TEST(ManifestFieldsTest, TheTableIsWellFormed) {
  std::set<std::string> paths;
  for (const ManifestField& f : ManifestFields()) {
    EXPECT_TRUE(paths.insert(f.path).second) << "twice: " << f.path;
    EXPECT_EQ(ManifestFieldKey(f.path), f.path) << "a list element is written []: " << f.path;
    EXPECT_FALSE(f.type.empty()) << f.path;
    EXPECT_FALSE(f.meaning.empty()) << f.path;
    if (!f.section) {
      EXPECT_FALSE(f.default_value.empty() && f.default_note.empty())
          << f.path << ": a field says its default (YAML text, \"required\" or a note)";
    }
    // A field comes after the section it is in.
    const size_t dot = f.path.rfind('.');
    if (dot != std::string::npos) {
      std::string parent = f.path.substr(0, dot);
      if (parent.size() > 2 && parent.substr(parent.size() - 2) == "[]") {
        parent.resize(parent.size() - 2);
      }
      const ManifestField* section = FindManifestField(parent);
      ASSERT_NE(section, nullptr) << f.path;
      EXPECT_TRUE(section->section) << f.path;
      EXPECT_TRUE(paths.count(section->path)) << f.path << " comes before its section";
    }
  }
}

// The point of the table: the parser asks for exactly its fields. The example has every
// section (and both a sparse and a dense table), and a section's reader asks for each of its
// keys whether present or not, so one parse of it asks for every key the parser knows.
TEST(ManifestFieldsTest, TheParserAsksForExactlyTheTablesFields) {
  std::set<std::string> asked;
  Result<Manifest> m = ParseManifestRecordingKeys(ManifestExampleYaml(), kSource, &asked);
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  for (const std::string& path : asked) {
    const ManifestField* f = FindManifestField(path);
    EXPECT_TRUE(f != nullptr && f->path == path)
        << "the parser reads '" << path << "', which common/manifest_fields.cc does not list: "
        << "add its entry (path, type, default, meaning)";
  }
  for (const ManifestField& f : ManifestFields()) {
    EXPECT_TRUE(asked.count(f.path))
        << "common/manifest_fields.cc lists '" << f.path << "', which the parser never reads";
  }
  // Recording is for the call that asks for it only.
  asked.clear();
  ASSERT_TRUE(ParseManifest(ManifestExampleYaml(), kSource).ok());
  EXPECT_TRUE(asked.empty());
}

TEST(ManifestFieldsTest, TheExampleParsesWithTheToursTables) {
  Result<Manifest> m = ParseManifest(ManifestExampleYaml(), kSource);
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  ASSERT_EQ(m->cluster.servers.size(), 2u);
  EXPECT_EQ(m->cluster.servers[0].ToString(), "127.0.0.1:47400");
  const int embeddings = m->FindTable("embeddings");
  ASSERT_GE(embeddings, 0);
  EXPECT_EQ(m->tables[embeddings].kind, TableKind::kSparse);
  EXPECT_EQ(m->tables[embeddings].dim, 16u);
  const int mlp_top = m->FindTable("mlp_top");
  ASSERT_GE(mlp_top, 0);
  EXPECT_EQ(m->tables[mlp_top].kind, TableKind::kDense);
  EXPECT_EQ(m->tables[mlp_top].shape, (std::vector<uint64_t>{64, 367}));
}

// Each default written as YAML means what leaving the field out means: the example with the
// field at its default and the example without it parse alike. (Fields the example shows
// only as a comment do not apply to its job as written; staleness is checked below.)
TEST(ManifestFieldsTest, EachDefaultIsWhatTheParserLeaves) {
  size_t checked = 0;
  for (const ManifestField& f : ManifestFields()) {
    if (!HasYamlDefault(f) || CommentedInExample(f)) continue;
    ManifestExampleOptions without, at_default;
    without.omit = f.path;
    at_default.at_default = f.path;
    Result<Manifest> absent = ParseManifest(ManifestExampleYaml(without), kSource);
    Result<Manifest> given = ParseManifest(ManifestExampleYaml(at_default), kSource);
    ASSERT_TRUE(absent.ok()) << f.path << ": " << absent.status().ToString();
    ASSERT_TRUE(given.ok()) << f.path << ": " << given.status().ToString();
    EXPECT_EQ(Describe(*given), Describe(*absent))
        << f.path << ": the table's default '" << f.default_value
        << "' is not what the parser leaves when the field is absent";
    ++checked;
    // Where the example gives another value, it must show (or Describe misses the field).
    if (!f.example.empty()) {
      Result<Manifest> example = ParseManifest(ManifestExampleYaml(), kSource);
      ASSERT_TRUE(example.ok());
      EXPECT_NE(Describe(*example), Describe(*given)) << f.path;
    }
  }
  // Every scalar of training, server, cluster, checkpoint, worker and data among them.
  EXPECT_GE(checked, 100u);
  const std::string head = "cluster: {servers: [127.0.0.1:47400]}\n";
  Result<Manifest> ssp = ParseManifest(head + "training: {consistency: ssp}\n", kSource);
  Result<Manifest> ssp_default =
      ParseManifest(head + "training: {consistency: ssp, staleness: " +
                        FindManifestField("training.staleness")->default_value + "}\n",
                    kSource);
  ASSERT_TRUE(ssp.ok() && ssp_default.ok());
  EXPECT_EQ(Describe(*ssp), Describe(*ssp_default));
}

TEST(ManifestFieldsTest, TheCommittedFilesAreWhatTheGeneratorsPrint) {
  EXPECT_EQ(ReadSourceFile("docs/manifest.md"), ManifestReferenceMarkdown())
      << "docs/manifest.md is generated: change common/manifest_fields.cc, then run "
         "`parasol manifest reference > docs/manifest.md`";
  EXPECT_EQ(ReadSourceFile("examples/manifest.yaml"), ManifestExampleYaml())
      << "examples/manifest.yaml is generated: change common/manifest_fields.cc, then run "
         "`parasol manifest example > examples/manifest.yaml`";
}

TEST(ManifestFieldsTest, PathsAreFoundInEachSpelling) {
  const ManifestField* dim = FindManifestField("tables[].dim");
  ASSERT_NE(dim, nullptr);
  EXPECT_EQ(FindManifestField("tables.dim"), dim);
  EXPECT_EQ(FindManifestField("tables[3].dim"), dim);
  EXPECT_EQ(FindManifestField("tables[0].optimizer.lr")->path, "tables[].optimizer.lr");
  EXPECT_EQ(FindManifestField("cluster.servers[1]")->path, "cluster.servers");
  EXPECT_EQ(FindManifestField("model.sparse_optimizer.lr")->default_value, "0.05");
  EXPECT_EQ(FindManifestField("training.batchsize"), nullptr);
  EXPECT_EQ(ManifestFieldKey("tables[12].optimizer.lr"), "tables[].optimizer.lr");
  EXPECT_EQ(NearestManifestFields("training.batchsize", 3),
            std::vector<std::string>{"training.batch_size"});
  EXPECT_EQ(NearestManifestFields("batchsize", 3), std::vector<std::string>{"training.batch_size"});
  EXPECT_TRUE(NearestManifestFields("zzzzzzzzzz", 3).empty());
  EXPECT_NE(ExplainManifestField(*dim).find("default: 8"), std::string::npos);
  const std::string training = ExplainManifestField(*FindManifestField("training"));
  EXPECT_NE(training.find("training.batch_size"), std::string::npos) << training;
  EXPECT_NE(training.find("training.progress_every"), std::string::npos) << training;
}

TEST(ManifestFieldsTest, ErrorsAboutAKnownKeyNameTheExplainCommand) {
  const std::string head = "cluster:\n  servers: [127.0.0.1:9000]\n";
  const auto error = [](const std::string& text) {
    Result<Manifest> m = ParseManifest(text, "job.yaml");
    return m.ok() ? std::string() : m.status().message();
  };
  EXPECT_EQ(error(head + "training: {batch_size: 0}\n"),
            "job.yaml:3:24: key 'training.batch_size': value 0 is out of range [1, 16777216] "
            "(parasol manifest explain training.batch_size)");
  EXPECT_EQ(error(head + "tables:\n  - name: t\n    optimizer: {lr: x}\n"),
            "job.yaml:5:21: key 'tables[0].optimizer.lr': expected a number, got 'x' "
            "(parasol manifest explain tables.optimizer.lr)");
  EXPECT_EQ(error("cluster:\n  servers: [nohost]\n"),
            "job.yaml:2:13: key 'cluster.servers[0]': expected host:port, got 'nohost' "
            "(parasol manifest explain cluster.servers)");
  // An unknown key has nothing to explain: the nearest known key of its section, as before.
  EXPECT_EQ(error(head + "  wrokers: 2\n"),
            "job.yaml:3:3: key 'cluster.wrokers': unknown key (did you mean 'workers'?)");
}

}  // namespace
}  // namespace parasol
