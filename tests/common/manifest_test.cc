#include "common/manifest.hpp"

#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <sstream>

namespace parasol {
namespace {

constexpr const char* kGood = R"(job:
  name: ctr
  seed: 11
cluster:
  servers: [10.0.0.1:7000, "10.0.0.2:7001"]
  workers: 4
  connect_timeout: 45s
  request_timeout: 1500ms
  request_retries: 5
server:
  engine_threads: 3
  frame_bytes: 2MiB
tables:
  - name: emb
    kind: sparse
    dim: 16
    init: {kind: normal, stddev: 0.05}
    optimizer: {kind: sgd, lr: 0.1, weight_decay: 0.001}
  - name: mlp
    kind: dense
    shape: [64, 13]
    seed: 99
    init: {kind: zeros}
)";

// Parses `text` and returns the error message, or "" if it parsed.
std::string ErrorOf(const std::string& text) {
  Result<Manifest> m = ParseManifest(text, "job.yaml");
  return m.ok() ? "" : m.status().message();
}

TEST(ManifestTest, ParsesEveryFieldOfAGoodFile) {
  Result<Manifest> r = ParseManifest(kGood, "job.yaml");
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  const Manifest& m = *r;
  EXPECT_EQ(m.job.name, "ctr");
  ASSERT_EQ(m.cluster.servers.size(), 2u);
  EXPECT_EQ(m.cluster.servers[1].host, "10.0.0.2");
  EXPECT_EQ(m.cluster.servers[1].port, 7001);
  EXPECT_EQ(m.cluster.workers, 4u);
  EXPECT_EQ(m.cluster.connect_timeout_ms, 45000);
  EXPECT_EQ(m.cluster.request_timeout_ms, 1500);
  EXPECT_EQ(m.cluster.request_retries, 5u);
  EXPECT_EQ(m.server.engine_threads, 3u);
  EXPECT_EQ(m.server.frame_bytes, 2u << 20);
  ASSERT_EQ(m.tables.size(), 2u);
  EXPECT_EQ(m.tables[0].kind, TableKind::kSparse);
  EXPECT_EQ(m.tables[0].dim, 16u);
  EXPECT_EQ(m.tables[0].init.kind, InitOptions::Kind::kNormal);
  EXPECT_DOUBLE_EQ(m.tables[0].init.stddev, 0.05);
  EXPECT_DOUBLE_EQ(m.tables[0].optimizer.lr, 0.1);
  EXPECT_DOUBLE_EQ(m.tables[0].optimizer.weight_decay, 0.001);
  EXPECT_EQ(m.tables[1].kind, TableKind::kDense);
  EXPECT_EQ(m.tables[1].NumElements(), 64u * 13u);
  EXPECT_EQ(m.tables[1].seed, 99u);
  EXPECT_EQ(m.FindTable("mlp"), 1);
  EXPECT_EQ(m.FindTable("nope"), -1);
}

TEST(ManifestTest, MinimalFileGetsDocumentedDefaults) {
  Result<Manifest> r = ParseManifest("cluster:\n  servers: [127.0.0.1:9000]\n", "min.yaml");
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->cluster.workers, 1u);
  EXPECT_EQ(r->cluster.connect_timeout_ms, 30000);
  EXPECT_EQ(r->cluster.request_timeout_ms, 30000);
  EXPECT_EQ(r->cluster.request_retries, 2u);
  EXPECT_EQ(r->server.engine_threads, 2u);
  EXPECT_EQ(r->server.frame_bytes, 1u << 20);
  EXPECT_EQ(r->server.max_request_bytes, 1u << 30);
  EXPECT_EQ(r->job.seed, 2026u);
  EXPECT_TRUE(r->tables.empty());
}

TEST(ManifestTest, WireCompressionIsNoneBf16OrF16) {
  Result<Manifest> none = ParseManifest("cluster:\n  servers: [127.0.0.1:9000]\n", "w.yaml");
  ASSERT_TRUE(none.ok());
  EXPECT_EQ(none->wire.compression, WireOptions::Compression::kNone);
  Result<Manifest> f16 = ParseManifest(
      "cluster:\n  servers: [127.0.0.1:9000]\nwire: {compression: f16}\n", "w.yaml");
  ASSERT_TRUE(f16.ok()) << f16.status().ToString();
  EXPECT_EQ(f16->wire.compression, WireOptions::Compression::kF16);
  Result<Manifest> bad = ParseManifest(
      "cluster:\n  servers: [127.0.0.1:9000]\nwire:\n  compression: fp8\n", "w.yaml");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("w.yaml:4"), std::string::npos) << bad.status().ToString();
  EXPECT_NE(bad.status().message().find("wire.compression"), std::string::npos);
  EXPECT_NE(bad.status().message().find("fp8"), std::string::npos);
  Result<Manifest> typo = ParseManifest(
      "cluster:\n  servers: [127.0.0.1:9000]\nwire: {compresion: bf16}\n", "w.yaml");
  ASSERT_FALSE(typo.ok());
  EXPECT_NE(typo.status().message().find("compresion"), std::string::npos);
}

// Values and optimizer state may be 16-bit in sparse and dense tables alike; the model
// shorthand sets its dense layers' with model.dense_dtype and dense_state_dtype.
TEST(ManifestTest, TablesStoreF32Bf16OrF16ValuesAndState) {
  Result<Manifest> m = ParseManifest(
      "cluster:\n  servers: [127.0.0.1:9000]\ntables:\n"
      "  - {name: emb, kind: sparse, dim: 4, dtype: bf16, state_dtype: f16}\n"
      "  - {name: w, kind: dense, shape: [8], dtype: f16, state_dtype: bf16, rounding: "
      "stochastic}\n",
      "t.yaml");
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  EXPECT_EQ(m->tables[0].dtype, DType::kBf16);
  EXPECT_EQ(m->tables[0].state_dtype, DType::kF16);
  EXPECT_EQ(m->tables[1].dtype, DType::kF16);
  EXPECT_EQ(m->tables[1].state_dtype, DType::kBf16);
  EXPECT_EQ(m->tables[1].rounding, TableOptions::Rounding::kStochastic);
  Result<Manifest> model = ParseManifest(
      "cluster:\n  servers: [127.0.0.1:9000]\nmodel:\n  kind: dlrm\n  dense_dtype: bf16\n"
      "  dense_state_dtype: f16\n",
      "m.yaml");
  ASSERT_TRUE(model.ok()) << model.status().ToString();
  int dense = 0;
  for (const TableOptions& t : model->tables) {
    EXPECT_EQ(t.dtype, t.kind == TableKind::kDense ? DType::kBf16 : DType::kF32) << t.name;
    EXPECT_EQ(t.state_dtype, t.kind == TableKind::kDense ? DType::kF16 : DType::kF32) << t.name;
    dense += t.kind == TableKind::kDense;
  }
  EXPECT_GE(dense, 4);
  Result<Manifest> bad = ParseManifest(
      "cluster:\n  servers: [127.0.0.1:9000]\ntables:\n"
      "  - {name: w, kind: dense, shape: [8], dtype: fp8}\n",
      "b.yaml");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("tables[0].dtype"), std::string::npos)
      << bad.status().ToString();
  EXPECT_NE(bad.status().message().find("fp8"), std::string::npos);
}

TEST(ManifestTest, MaxWorkersIsAtLeastWorkersAndBounded) {
  EXPECT_EQ(ErrorOf("cluster:\n  servers: [127.0.0.1:9000]\n  workers: 3\n  max_workers: 2\n"),
            "job.yaml:4:16: key 'cluster.max_workers': is 2, below cluster.workers (3)"
            " (parasol manifest explain cluster.max_workers)");
  EXPECT_EQ(ErrorOf("cluster:\n  servers: [127.0.0.1:9000]\n  max_workers: 5000\n"),
            "job.yaml:3:16: key 'cluster.max_workers': is 5000; a job whose size may change "
            "has at most 2048 worker ranks"
            " (parasol manifest explain cluster.max_workers)");
  auto m = ParseManifest("cluster:\n  servers: [127.0.0.1:9000]\n  workers: 2\n", "job.yaml");
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  EXPECT_EQ(m->cluster.max_workers, 2u);  // default: no joins
  auto e = ParseManifest(
      "cluster:\n  servers: [127.0.0.1:9000]\n  workers: 2\n  max_workers: 4\n", "job.yaml");
  ASSERT_TRUE(e.ok()) << e.status().ToString();
  EXPECT_EQ(e->cluster.max_workers, 4u);
  EXPECT_NE(e->Fingerprint(), m->Fingerprint());  // every role must agree on it
}

TEST(ManifestTest, InitialServersIsAtMostTheListedShards) {
  EXPECT_EQ(ErrorOf("cluster:\n  servers: [127.0.0.1:9000, 127.0.0.1:9001]\n  initial_servers: 3\n"),
            "job.yaml:3:20: key 'cluster.initial_servers': is 3, more than the 2 shards "
            "cluster.servers lists"
            " (parasol manifest explain cluster.initial_servers)");
  EXPECT_NE(ErrorOf("cluster:\n  servers: [127.0.0.1:9000]\n  initial_servers: 0\n"), "");
  auto all = ParseManifest("cluster:\n  servers: [127.0.0.1:9000, 127.0.0.1:9001]\n", "job.yaml");
  ASSERT_TRUE(all.ok()) << all.status().ToString();
  EXPECT_EQ(all->cluster.InitialServers(), 2u);  // default: every listed shard
  auto one = ParseManifest(
      "cluster:\n  servers: [127.0.0.1:9000, 127.0.0.1:9001]\n  initial_servers: 1\n", "job.yaml");
  ASSERT_TRUE(one.ok()) << one.status().ToString();
  EXPECT_EQ(one->cluster.InitialServers(), 1u);
  EXPECT_NE(one->Fingerprint(), all->Fingerprint());  // every role must agree on it
  // A job whose shard count may change lists at most kMaxReshardServers shards.
  std::string many = "cluster:\n  servers: [";
  for (int i = 0; i < 300; ++i) many += (i ? ", " : "") + std::string("127.0.0.1:") + std::to_string(9000 + i);
  EXPECT_NE(ErrorOf(many + "]\n  initial_servers: 2\n").find("at most 256 shards"), std::string::npos);
}

TEST(ManifestTest, UnknownKeyNamesFileLineAndKey) {
  // A typo of a known key of the same section is suggested; anything else is not.
  EXPECT_EQ(ErrorOf("cluster:\n  servers: [127.0.0.1:9000]\n  wrokers: 2\n"),
            "job.yaml:3:3: key 'cluster.wrokers': unknown key (did you mean 'workers'?)");
  EXPECT_EQ(ErrorOf("cluster:\n  servers: [127.0.0.1:9000]\nsecurity2: {}\n"),
            "job.yaml:3:1: key 'security2': unknown key (did you mean 'security'?)");
  EXPECT_EQ(ErrorOf("cluster:\n  servers: [127.0.0.1:9000]\ntrainng: {epochs: 2}\n"),
            "job.yaml:3:1: key 'trainng': unknown key (did you mean 'training'?)");
  EXPECT_EQ(ErrorOf("cluster:\n  servers: [127.0.0.1:9000]\n  colour: blue\n"),
            "job.yaml:3:3: key 'cluster.colour': unknown key");
  // A key of another section is not suggested here.
  EXPECT_EQ(ErrorOf("cluster:\n  servers: [127.0.0.1:9000]\n  epochs: 2\n"),
            "job.yaml:3:3: key 'cluster.epochs': unknown key");
}

TEST(ManifestTest, WorkerCommandIsAProgramOrAListRunInTheManifestsFolder) {
  const std::string head = "cluster:\n  servers: [127.0.0.1:9000]\n";
  Result<Manifest> list =
      ParseManifest(head + "worker:\n  command: [python3, train.py, --lr, '0.1']\n", "jobs/a.yaml");
  ASSERT_TRUE(list.ok()) << list.status().ToString();
  EXPECT_EQ(list->worker.command, (std::vector<std::string>{"python3", "train.py", "--lr", "0.1"}));
  EXPECT_EQ(list->worker.command_dir, "jobs");
  Result<Manifest> one = ParseManifest(head + "worker: {command: ./train}\n", "a.yaml");
  ASSERT_TRUE(one.ok()) << one.status().ToString();
  EXPECT_EQ(one->worker.command, std::vector<std::string>{"./train"});
  EXPECT_EQ(one->worker.command_dir, ".");
  Result<Manifest> none = ParseManifest(head, "a.yaml");
  ASSERT_TRUE(none.ok());
  EXPECT_TRUE(none->worker.command.empty());
  EXPECT_EQ(ErrorOf(head + "worker: {command: []}\n"),
            "job.yaml:3:19: key 'worker.command': expected a program, or a list: program, "
            "arguments"
            " (parasol manifest explain worker.command)");
  EXPECT_EQ(ErrorOf(head + "worker: {command: [python3, {a: 1}]}\n"),
            "job.yaml:3:29: key 'worker.command[1]': expected a program or argument"
            " (parasol manifest explain worker.command)");
  EXPECT_EQ(ErrorOf(head + "worker: {command: [python3, '']}\n"),
            "job.yaml:3:29: key 'worker.command[1]': expected a program or argument"
            " (parasol manifest explain worker.command)");
}

TEST(ManifestTest, UnknownKeyInsideATableNamesTheTable) {
  const std::string e = ErrorOf(
      "cluster:\n  servers: [127.0.0.1:9000]\ntables:\n  - name: a\n    dimm: 4\n");
  EXPECT_EQ(e, "job.yaml:5:5: key 'tables[0].dimm': unknown key (did you mean 'dim'?)");
}

TEST(ManifestTest, WrongTypeNamesTheLine) {
  EXPECT_EQ(ErrorOf("cluster:\n  servers: [127.0.0.1:9000]\n  workers: many\n"),
            "job.yaml:3:12: key 'cluster.workers': expected an integer, got 'many'"
            " (parasol manifest explain cluster.workers)");
  EXPECT_EQ(ErrorOf("cluster:\n  servers: [127.0.0.1:9000]\n  workers: [1]\n"),
            "job.yaml:3:12: key 'cluster.workers': expected an integer"
            " (parasol manifest explain cluster.workers)");
}

TEST(ManifestTest, BadValuesAreRefused) {
  EXPECT_EQ(ErrorOf("cluster:\n  servers: [127.0.0.1:9000]\n  workers: 0\n"),
            "job.yaml:3:12: key 'cluster.workers': value 0 is out of range [1, 1048576]"
            " (parasol manifest explain cluster.workers)");
  EXPECT_EQ(ErrorOf("cluster:\n  servers: [nohost]\n"),
            "job.yaml:2:13: key 'cluster.servers[0]': expected host:port, got 'nohost'"
            " (parasol manifest explain cluster.servers)");
  EXPECT_EQ(ErrorOf("cluster:\n  servers: [a:70000]\n"),
            "job.yaml:2:13: key 'cluster.servers[0]': port must be 1..65535 in 'a:70000'"
            " (parasol manifest explain cluster.servers)");
  EXPECT_EQ(ErrorOf("cluster:\n  servers: [a:1, a:1]\n"),
            "job.yaml:2:18: key 'cluster.servers[1]': duplicate server address a:1"
            " (parasol manifest explain cluster.servers)");
  EXPECT_EQ(ErrorOf("cluster:\n  servers: [a:1]\n  connect_timeout: 3 days\n"),
            "job.yaml:3:20: key 'cluster.connect_timeout': unknown duration unit ' days' in "
            "'3 days' (use ms, s, m or h)"
            " (parasol manifest explain cluster.connect_timeout)");
  EXPECT_EQ(
      ErrorOf("cluster:\n  servers: [a:1]\ntables:\n  - name: t\n    kind: tree\n"),
      "job.yaml:5:11: key 'tables[0].kind': expected one of sparse|dense, got 'tree'"
      " (parasol manifest explain tables.kind)");
  EXPECT_EQ(ErrorOf("cluster:\n  servers: [a:1]\ntables:\n  - name: t\n    optimizer: {lr: -1}\n"),
            "job.yaml:5:21: key 'tables[0].optimizer.lr': value -1 is out of range [0, 1e+06]"
            " (parasol manifest explain tables.optimizer.lr)");
}

TEST(ManifestTest, MissingRequiredFieldsAreNamed) {
  EXPECT_EQ(ErrorOf("job: {name: x}\n"),
            "job.yaml: key 'cluster': missing (cluster.servers is required)"
            " (parasol manifest explain cluster)");
  EXPECT_EQ(ErrorOf("cluster:\n  workers: 2\n"),
            "job.yaml:2:3: key 'cluster.servers': missing: list the shards as host:port"
            " (parasol manifest explain cluster.servers)");
  EXPECT_EQ(ErrorOf("cluster:\n  servers: [a:1]\ntables:\n  - name: t\n    kind: dense\n"),
            "job.yaml:4:5: key 'tables[0].shape': missing: dense tables need a shape"
            " (parasol manifest explain tables.shape)");
}

TEST(ManifestTest, AShapeWhoseProductWrapsAroundIsRefused) {
  // 2^32 x 2^32 is 2^64, which an unchecked product wraps to 0 (under the 2^34 bound).
  EXPECT_EQ(ErrorOf("cluster:\n  servers: [a:1]\ntables:\n  - name: t\n    kind: dense\n"
                    "    shape: [4294967296, 4294967296, 3]\n"),
            "job.yaml:6:12: key 'tables[0].shape': tensor has more than 2^34 elements"
            " (parasol manifest explain tables.shape)");
}

TEST(ManifestTest, DuplicateTableNamesAreRefused) {
  EXPECT_EQ(ErrorOf("cluster:\n  servers: [a:1]\ntables:\n  - name: t\n  - name: t\n"),
            "job.yaml:5:11: key 'tables[1].name': duplicate table name 't'"
            " (parasol manifest explain tables.name)");
}

TEST(ManifestTest, YamlSyntaxErrorNamesTheLine) {
  const std::string e = ErrorOf("cluster:\n  servers: [a:1\n  workers: 2\n");
  EXPECT_NE(e.find("job.yaml:"), std::string::npos) << e;
  EXPECT_NE(e.find("YAML syntax error"), std::string::npos) << e;
}

TEST(ManifestTest, MissingFileIsNotFound) {
  Result<Manifest> r = LoadManifest("/nonexistent/parasol/job.yaml");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kNotFound);
  EXPECT_NE(r.status().message().find("/nonexistent/parasol/job.yaml"), std::string::npos);
}

TEST(ManifestTest, FingerprintFollowsJobDefiningFieldsOnly) {
  Result<Manifest> a = ParseManifest(kGood, "a.yaml");
  ASSERT_TRUE(a.ok());
  Manifest b = *a;
  b.cluster.request_timeout_ms = 1;  // not job-defining
  b.cluster.bind = "0.0.0.0";
  EXPECT_EQ(a->Fingerprint(), b.Fingerprint());
  b.tables[0].dim = 8;
  EXPECT_NE(a->Fingerprint(), b.Fingerprint());
}

TEST(ManifestTest, DurationsAndSizes) {
  EXPECT_EQ(*ParseDurationMs("250ms"), 250);
  EXPECT_EQ(*ParseDurationMs("2"), 2000);
  EXPECT_EQ(*ParseDurationMs("1.5s"), 1500);
  EXPECT_EQ(*ParseDurationMs("2m"), 120000);
  EXPECT_FALSE(ParseDurationMs("fast").ok());
  EXPECT_EQ(*ParseBytes("4MiB"), 4u << 20);
  EXPECT_EQ(*ParseBytes("123"), 123u);
  EXPECT_FALSE(ParseBytes("4MB").ok());
  EXPECT_FALSE(ParseBytes("-1").ok());
}

TEST(ManifestTrainingTest, ConsistencyFieldsAndDefaults) {
  Result<Manifest> d = ParseManifest("cluster:\n  servers: [a:1]\n", "t.yaml");
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d->training.consistency, TrainingOptions::Consistency::kBsp);
  EXPECT_EQ(d->training.worker_timeout_ms, 120000);
  EXPECT_EQ(d->training.on_worker_loss, TrainingOptions::OnWorkerLoss::kFail);
  Result<Manifest> m = ParseManifest(
      "cluster:\n  servers: [a:1]\ntraining:\n  consistency: ssp\n  staleness: 3\n"
      "  worker_timeout: 10s\n  on_worker_loss: continue\n",
      "t.yaml");
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  EXPECT_EQ(m->training.consistency, TrainingOptions::Consistency::kSsp);
  EXPECT_EQ(m->training.staleness, 3u);
  EXPECT_EQ(m->training.worker_timeout_ms, 10000);
  EXPECT_EQ(m->training.on_worker_loss, TrainingOptions::OnWorkerLoss::kContinue);
}

TEST(ManifestTrainingTest, PrefetchDepthIsAtMostTheStalenessAndNotForBsp) {
  const std::string base = "cluster:\n  servers: [127.0.0.1:9000]\ntraining:\n";
  Result<Manifest> ok = ParseManifest(
      base + "  consistency: ssp\n  staleness: 3\n  prefetch_depth: 3\n", "p.yaml");
  ASSERT_TRUE(ok.ok()) << ok.status().ToString();
  EXPECT_EQ(ok->training.prefetch_depth, 3u);
  Result<Manifest> plain = ParseManifest("cluster:\n  servers: [127.0.0.1:9000]\n", "p.yaml");
  ASSERT_TRUE(plain.ok()) << plain.status().ToString();
  EXPECT_EQ(plain->training.prefetch_depth, 1u);
  Result<Manifest> asp =
      ParseManifest(base + "  consistency: asp\n  prefetch_depth: 8\n", "p.yaml");
  ASSERT_TRUE(asp.ok()) << asp.status().ToString();
  struct Bad {
    const char* yaml;
    const char* says;
  };
  for (const Bad& b : {Bad{"  consistency: ssp\n  staleness: 1\n  prefetch_depth: 2\n",
                           "must be at most training.staleness (1)"},
                       Bad{"  consistency: bsp\n  prefetch_depth: 2\n", "ssp or asp"},
                       Bad{"  consistency: asp\n  prefetch_depth: 0\n", "prefetch_depth"},
                       Bad{"  consistency: asp\n  accumulate: 2\n  prefetch_depth: 2\n",
                           "training.accumulate"},
                       Bad{"  consistency: asp\n  prefetch_depth: 65\n", "prefetch_depth"}}) {
    Result<Manifest> m = ParseManifest(base + b.yaml, "p.yaml");
    ASSERT_FALSE(m.ok()) << b.yaml;
    EXPECT_NE(m.status().message().find(b.says), std::string::npos) << m.status().ToString();
    EXPECT_NE(m.status().message().find("training.prefetch_depth"), std::string::npos)
        << m.status().ToString();
  }
  // Shards and workers must agree on it: it is part of the job's fingerprint.
  Result<Manifest> two =
      ParseManifest(base + "  consistency: ssp\n  staleness: 3\n  prefetch_depth: 2\n", "p.yaml");
  ASSERT_TRUE(two.ok());
  EXPECT_NE(two->Fingerprint(), ok->Fingerprint());
}

TEST(ManifestWorkerTest, DeviceMustBeCpuOrCuda) {
  Result<Manifest> m = ParseManifest("cluster:\n  servers: [a:1]\nworker: {device: 'cuda:1', tf32: true}\n", "w.yaml");
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  EXPECT_EQ(m->worker.device, "cuda:1");
  EXPECT_TRUE(m->worker.tf32);
  EXPECT_EQ(ErrorOf("cluster:\n  servers: [a:1]\nworker:\n  device: gpu\n"),
            "job.yaml:4:11: key 'worker.device': expected cpu, cuda or cuda:N, got 'gpu'"
            " (parasol manifest explain worker.device)");
}

TEST(ManifestTest, ApplyAfterReplyIsAutoAlwaysOrNever) {
  Result<Manifest> m = ParseManifest("cluster:\n  servers: [a:1]\n", "s.yaml");
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  EXPECT_EQ(m->server.apply_after_reply, ServerOptions::ApplyAfterReply::kAuto);
  const uint64_t fingerprint = m->Fingerprint();
  for (const auto& [text, want] :
       std::vector<std::pair<std::string, ServerOptions::ApplyAfterReply>>{
           {"auto", ServerOptions::ApplyAfterReply::kAuto},
           {"always", ServerOptions::ApplyAfterReply::kAlways},
           {"never", ServerOptions::ApplyAfterReply::kNever}}) {
    m = ParseManifest("cluster:\n  servers: [a:1]\nserver: {apply_after_reply: " + text + "}\n",
                      "s.yaml");
    ASSERT_TRUE(m.ok()) << m.status().ToString();
    EXPECT_EQ(m->server.apply_after_reply, want) << text;
    EXPECT_EQ(m->Fingerprint(), fingerprint) << "the model is the same either way";
  }
  EXPECT_EQ(ErrorOf("cluster:\n  servers: [a:1]\nserver:\n  apply_after_reply: yes\n"),
            "job.yaml:4:22: key 'server.apply_after_reply': expected one of auto|always|never, "
            "got 'yes' (parasol manifest explain server.apply_after_reply)");
}

TEST(ManifestWorkerTest, ComputeIsModelOrNone) {
  Result<Manifest> m = ParseManifest("cluster:\n  servers: [a:1]\n", "w.yaml");
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  EXPECT_EQ(m->worker.compute, WorkerOptions::Compute::kModel);
  m = ParseManifest("cluster:\n  servers: [a:1]\nworker: {compute: none}\n", "w.yaml");
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  EXPECT_EQ(m->worker.compute, WorkerOptions::Compute::kNone);
  EXPECT_EQ(ErrorOf("cluster:\n  servers: [a:1]\nworker:\n  compute: gpu\n"),
            "job.yaml:4:12: key 'worker.compute': expected one of model|none, got 'gpu'"
            " (parasol manifest explain worker.compute)");
}

TEST(ManifestWorkerTest, ComputeThreadsAreBoundedAndPinningIsABool) {
  Result<Manifest> m = ParseManifest("cluster:\n  servers: [a:1]\n", "w.yaml");
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  EXPECT_EQ(m->worker.compute_threads, 1u);
  EXPECT_FALSE(m->worker.pin_compute_threads);
  m = ParseManifest(
      "cluster:\n  servers: [a:1]\nworker: {compute_threads: 8, pin_compute_threads: true}\n",
      "w.yaml");
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  EXPECT_EQ(m->worker.compute_threads, 8u);
  EXPECT_TRUE(m->worker.pin_compute_threads);
  EXPECT_EQ(ErrorOf("cluster:\n  servers: [a:1]\nworker:\n  compute_threads: 0\n"),
            "job.yaml:4:20: key 'worker.compute_threads': value 0 is out of range [1, 256]"
            " (parasol manifest explain worker.compute_threads)");
  EXPECT_EQ(ErrorOf("cluster:\n  servers: [a:1]\nworker:\n  compute_threads: 257\n"),
            "job.yaml:4:20: key 'worker.compute_threads': value 257 is out of range [1, 256]"
            " (parasol manifest explain worker.compute_threads)");
  EXPECT_EQ(ErrorOf("cluster:\n  servers: [a:1]\nworker:\n  pin_compute_threads: maybe\n"),
            "job.yaml:4:24: key 'worker.pin_compute_threads': expected true or false, got "
            "'maybe' (parasol manifest explain worker.pin_compute_threads)");
  EXPECT_EQ(ErrorOf("cluster:\n  servers: [a:1]\nworker:\n  pin_compute_threads: [1]\n"),
            "job.yaml:4:24: key 'worker.pin_compute_threads': expected true or false"
            " (parasol manifest explain worker.pin_compute_threads)");
}

TEST(ManifestTrainingTest, BadConsistencyFieldsAreRefused) {
  EXPECT_EQ(ErrorOf("cluster:\n  servers: [a:1]\ntraining:\n  consistency: eventual\n"),
            "job.yaml:4:16: key 'training.consistency': expected one of bsp|ssp|asp, got "
            "'eventual'"
            " (parasol manifest explain training.consistency)");
  EXPECT_EQ(ErrorOf("cluster:\n  servers: [a:1]\ntraining:\n  staleness: 2\n"),
            "job.yaml:4:14: key 'training.staleness': applies to consistency: ssp only"
            " (parasol manifest explain training.staleness)");
  EXPECT_EQ(ErrorOf("cluster:\n  servers: [a:1]\ntraining:\n  consistency: ssp\n  staleness: -1\n"),
            "job.yaml:5:14: key 'training.staleness': value -1 is out of range [0, 1048576]"
            " (parasol manifest explain training.staleness)");
}

TEST(ManifestOptimizerTest, FieldsOfAnotherOptimizerAreRefused) {
  EXPECT_EQ(ErrorOf("cluster:\n  servers: [a:1]\ntables:\n  - name: t\n"
                    "    optimizer: {kind: sgd, beta1: 0.9}\n"),
            "job.yaml:5:28: key 'tables[0].optimizer.beta1': does not apply to optimizer 'sgd'"
            " (parasol manifest explain tables.optimizer.beta1)");
  EXPECT_EQ(ErrorOf("cluster:\n  servers: [a:1]\ntables:\n  - name: t\n    kind: dense\n"
                    "    shape: [4]\n    optimizer: {kind: adagrad_rowwise}\n"),
            "job.yaml:7:16: key 'tables[0].optimizer.kind': adagrad_rowwise keeps one "
            "accumulator per row: use it on sparse tables"
            " (parasol manifest explain tables.optimizer.kind)");
  EXPECT_EQ(ErrorOf("cluster:\n  servers: [a:1]\ntables:\n  - name: t\n    kind: dense\n"
                    "    shape: [4]\n    eviction: {ttl_clocks: 3}\n"),
            "job.yaml:7:15: key 'tables[0].eviction': applies to sparse tables only"
            " (parasol manifest explain tables.eviction)");
  Result<Manifest> m = ParseManifest(
      "cluster:\n  servers: [a:1]\ntables:\n  - name: t\n    optimizer: {kind: adam, lr: 0.1, "
      "beta1: 0.8, bias_correction: false}\n    admission: {min_count: 4}\n"
      "    eviction: {ttl_clocks: 10, max_rows: 1000}\n",
      "t.yaml");
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  EXPECT_EQ(m->tables[0].optimizer.kind, OptimizerOptions::Kind::kAdam);
  EXPECT_DOUBLE_EQ(m->tables[0].optimizer.beta1, 0.8);
  EXPECT_FALSE(m->tables[0].optimizer.bias_correction);
  EXPECT_EQ(m->tables[0].admission.min_count, 4u);
  EXPECT_EQ(m->tables[0].eviction.ttl_clocks, 10u);
  EXPECT_EQ(m->tables[0].eviction.max_rows, 1000u);
}


}  // namespace
}  // namespace parasol

namespace parasol {
namespace {

TEST(ManifestExamplesTest, EveryExampleManifestLoads) {
  for (const char* name : {"pushpull.yaml", "manifest.yaml", "criteo-dlrm.yaml"}) {
    Result<Manifest> m = LoadManifest(std::string(PARASOL_SOURCE_DIR) + "/examples/" + name);
    EXPECT_TRUE(m.ok()) << name << ": " << m.status().ToString();
  }
}

}  // namespace
}  // namespace parasol

namespace parasol {
namespace {

constexpr const char* kCurveCluster =
    "cluster:\n"
    "  servers: [127.0.0.1:9000]\n"
    "  workers: 2\n"
    "security:\n"
    "  curve: true\n"
    "  server_keys: [keys/server0]\n"
    "  client_key: keys/tool\n"
    "  allowed_clients: [keys/tool.pub]\n";

TEST(ManifestSecurityTest, WorkerKeysAreResolvedAgainstTheManifestFolder) {
  Result<Manifest> m = ParseManifest(
      std::string(kCurveCluster) + "  worker_keys: [keys/w0, /abs/w1]\n", "conf/job.yaml");
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  EXPECT_EQ(m->security.worker_keys, (std::vector<std::string>{"conf/keys/w0", "/abs/w1"}));
}

TEST(ManifestSecurityTest, WorkerKeysDefaultToNone) {
  Result<Manifest> m = ParseManifest(kCurveCluster, "job.yaml");
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  EXPECT_TRUE(m->security.worker_keys.empty());
}

TEST(ManifestSecurityTest, WorkerKeysNeedOnePairPerWorker) {
  EXPECT_EQ(ErrorOf(std::string(kCurveCluster) + "  worker_keys: [keys/w0]\n"),
            "job.yaml:9:16: key 'security.worker_keys': needs one key pair per worker rank "
            "(cluster.max_workers, default cluster.workers = 2), found 1"
            " (parasol manifest explain security.worker_keys)");
}

TEST(ManifestSecurityTest, WorkerKeysNeedCurve) {
  EXPECT_EQ(ErrorOf("cluster:\n  servers: [127.0.0.1:9000]\n  workers: 1\n"
                    "security:\n  worker_keys: [keys/w0]\n"),
            "job.yaml:5:16: key 'security.worker_keys': worker keys need curve: true"
            " (parasol manifest explain security.worker_keys)");
}

TEST(ManifestTest, ServerLimitsHaveDefaultsAndAReplyBudgetMustHoldTheLargestReply) {
  Result<Manifest> m = ParseManifest("cluster:\n  servers: [127.0.0.1:9000]\n", "min.yaml");
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  EXPECT_EQ(m->server.max_held_pulls, 1024u);
  EXPECT_EQ(m->server.max_held_bytes, 256ull << 20);
  EXPECT_EQ(m->server.max_pending_clocks, 4u);
  EXPECT_EQ(m->server.max_pending_bytes, 2ull << 30);
  EXPECT_EQ(m->server.socket_hwm, 1000u);
  EXPECT_EQ(m->server.max_queued_reply_bytes, 1ull << 30);
  Result<Manifest> bad = ParseManifest(
      "cluster:\n  servers: [127.0.0.1:9000]\nserver:\n  max_queued_reply_bytes: 32MiB\n",
      "job.yaml");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("server.max_queued_reply_bytes"), std::string::npos)
      << bad.status().ToString();
  EXPECT_NE(bad.status().message().find("job.yaml:"), std::string::npos)
      << bad.status().ToString();
  // Idle connections: at least a minute and twice the request timeout, unless set; a set one
  // must leave a client waiting out its request timeout alone.
  EXPECT_EQ(m->server.idle_timeout_ms, 60000);
  Result<Manifest> slow = ParseManifest(
      "cluster:\n  servers: [127.0.0.1:9000]\n  request_timeout: 45s\n", "job.yaml");
  ASSERT_TRUE(slow.ok());
  EXPECT_EQ(slow->server.idle_timeout_ms, 90000);
  Result<Manifest> idle = ParseManifest(
      "cluster:\n  servers: [127.0.0.1:9000]\n  request_timeout: 10s\nserver:\n"
      "  idle_timeout: 10s\n",
      "job.yaml");
  ASSERT_FALSE(idle.ok());
  EXPECT_NE(idle.status().message().find("server.idle_timeout': 10000 ms must be above "
                                         "cluster.request_timeout (10000 ms)"),
            std::string::npos)
      << idle.status().ToString();
  EXPECT_FALSE(ParseManifest("cluster:\n  servers: [127.0.0.1:9000]\nserver:\n"
                             "  max_pending_clocks: 1\n",
                             "job.yaml")
                   .ok());
}

TEST(ManifestTest, ThePushLogBoundMustHoldTheLargestPush) {
  Result<Manifest> m = ParseManifest(
      "cluster:\n  servers: [127.0.0.1:9000]\n  restart_workers: true\n"
      "checkpoint: {dir: ckpt}\n",
      "min.yaml");
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  EXPECT_EQ(m->checkpoint.max_log_bytes, 2ull << 30);
  EXPECT_TRUE(m->cluster.restart_workers);
  Result<Manifest> bad = ParseManifest(
      "cluster:\n  servers: [127.0.0.1:9000]\ncheckpoint:\n  dir: ckpt\n"
      "  max_log_bytes: 1GiB\n",
      "job.yaml");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("checkpoint.max_log_bytes"), std::string::npos)
      << bad.status().ToString();
  EXPECT_NE(bad.status().message().find("server.max_request_bytes (1073741824)"),
            std::string::npos)
      << bad.status().ToString();
  // With a smaller largest request the same bound is fine; without checkpoints there is no log.
  EXPECT_TRUE(ParseManifest("cluster:\n  servers: [127.0.0.1:9000]\nserver:\n"
                            "  max_request_bytes: 256MiB\ncheckpoint:\n  dir: ckpt\n"
                            "  max_log_bytes: 1GiB\n",
                            "job.yaml")
                  .ok());
  EXPECT_TRUE(ParseManifest("cluster:\n  servers: [127.0.0.1:9000]\ncheckpoint:\n"
                            "  max_log_bytes: 1MiB\n",
                            "job.yaml")
                  .ok());
  // A server restarted without a checkpoint to restore would come back empty.
  for (const char* ckpt : {"", "checkpoint: {dir: ckpt, restore: false}\n"}) {
    Result<Manifest> r = ParseManifest(
        std::string("cluster:\n  servers: [127.0.0.1:9000]\n  restart_servers: true\n") + ckpt,
        "job.yaml");
    ASSERT_FALSE(r.ok()) << ckpt;
    EXPECT_NE(r.status().message().find("cluster.restart_servers"), std::string::npos)
        << r.status().ToString();
  }
}

}  // namespace
}  // namespace parasol

namespace parasol {
namespace {

TEST(ManifestTest, IncrementalAndBackgroundCheckpointsAndTheRestoreWait) {
  Result<Manifest> m = ParseManifest("cluster:\n  servers: [127.0.0.1:9000]\n", "min.yaml");
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  EXPECT_EQ(m->checkpoint.full_every, 1u);
  EXPECT_TRUE(m->checkpoint.background);
  EXPECT_EQ(m->cluster.restore_timeout_ms, 3600000);
  m = ParseManifest(
      "cluster:\n  servers: [127.0.0.1:9000]\n  restore_timeout: 20m\n"
      "checkpoint: {dir: ckpt, full_every: 8, background: false}\n"
      "tables:\n  - {name: emb, dim: 4, dtype: bf16}\n",
      "job.yaml");
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  EXPECT_EQ(m->checkpoint.full_every, 8u);
  EXPECT_FALSE(m->checkpoint.background);
  EXPECT_EQ(m->cluster.restore_timeout_ms, 20 * 60 * 1000);
  // Rows keep their clock word for the deltas, 16-bit ones too.
  EXPECT_TRUE(m->tables[0].keep_clock);
  Result<Manifest> bad =
      ParseManifest("cluster:\n  servers: [127.0.0.1:9000]\ncheckpoint: {full_every: 0}\n",
                    "job.yaml");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("checkpoint.full_every"), std::string::npos)
      << bad.status().ToString();
}


constexpr const char* kCluster = "cluster:\n  servers: [127.0.0.1:7000]\n";

std::string WithTable(const std::string& name) {
  return std::string(kCluster) + "tables:\n  - {name: emb}\n  - name: \"" + name + "\"\n";
}

TEST(ManifestTest, DeviceManifestIsRefusedAfterTheCapPromptly) {
  const auto start = std::chrono::steady_clock::now();
  Result<Manifest> m = LoadManifest("/dev/zero");
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  ASSERT_FALSE(m.ok());
  EXPECT_NE(m.status().message().find("manifest '/dev/zero' is larger than the limit of " +
                                      std::to_string(kMaxManifestBytes) + " bytes (16 MiB)"),
            std::string::npos)
      << m.status().message();
  EXPECT_LT(seconds, 10.0);
}

TEST(ManifestTest, OversizedRegularFileIsRefusedBeforeItIsRead) {
  const std::string path = ::testing::TempDir() + "/parasol_huge_manifest.yaml";
  {
    std::ofstream f(path, std::ios::binary);
    f << kCluster;
  }
  // Sparse: the size says it is too large without a byte of it read.
  ASSERT_EQ(::truncate(path.c_str(), static_cast<off_t>(kMaxManifestBytes + 1)), 0);
  Result<Manifest> m = LoadManifest(path);
  std::remove(path.c_str());
  ASSERT_FALSE(m.ok());
  EXPECT_NE(m.status().message().find("manifest '" + path + "' is larger than the limit"),
            std::string::npos)
      << m.status().message();
}

TEST(ManifestTest, DirectoryAsManifestIsNamed) {
  Result<Manifest> m = LoadManifest("/tmp");
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().message(), "manifest '/tmp' is a directory");
}

TEST(ManifestTest, TableNamesInUseStayValid) {
  for (const char* name : {"emb2", "model.embeddings", "model.bottom.0.weight", "lin.bias",
                           "_private", "mlp_top", "a-b"}) {
    EXPECT_EQ(ErrorOf(WithTable(name)), "") << name;
  }
}

TEST(ManifestTest, TableNamesThatCouldEscapeAFolderAreRefused) {
  const std::string rule = "(a name is letters, digits, '_', '.' and '-', starts with a letter";
  for (const std::string& name :
       {std::string("../../esc"), std::string("a/b"), std::string("a..b"), std::string(".hidden"),
        std::string("1st"), std::string("has space"), std::string(129, 'x')}) {
    const std::string error = ErrorOf(WithTable(name));
    EXPECT_NE(error.find("job.yaml:5:"), std::string::npos) << name << ": " << error;
    EXPECT_NE(error.find("key 'tables[1].name': table name '"), std::string::npos) << error;
    EXPECT_NE(error.find(rule), std::string::npos) << error;
  }
  EXPECT_NE(ErrorOf(WithTable(std::string(129, 'x'))).find("129 characters long"),
            std::string::npos);
  // A NUL (YAML's "\0" escape) is shown, not cut at.
  const std::string nul = ErrorOf(std::string(kCluster) + "tables:\n  - name: \"a\\0b\"\n");
  EXPECT_NE(nul.find("table name 'a\\x00b' may hold only letters"), std::string::npos) << nul;
}

TEST(ManifestTest, DuplicateKeysAreRefusedWithTheirLine) {
  EXPECT_EQ(ErrorOf(std::string(kCluster) + "tables:\n  - name: emb\n    dim: 8\n    dim: 16\n"),
            "job.yaml:6:5: duplicate key 'dim' (it appears earlier in the same mapping)");
  EXPECT_EQ(ErrorOf(std::string(kCluster) + "cluster:\n  workers: 2\n"),
            "job.yaml:3:1: duplicate key 'cluster' (it appears earlier in the same mapping)");
}

TEST(ManifestTest, CustomTagsAreRefusedWithTheirLine) {
  const std::string python = ErrorOf(std::string(kCluster) +
                                     "job:\n  name: !!python/object:os.system ls\n");
  EXPECT_EQ(python, "job.yaml:4:9: tag 'tag:yaml.org,2002:python/object:os.system' is not "
                    "allowed in a manifest (only YAML's standard tags are)");
  const std::string custom = ErrorOf(std::string(kCluster) + "job: !foo {name: x}\n");
  EXPECT_NE(custom.find("job.yaml:3:6: tag '!foo' is not allowed"), std::string::npos) << custom;
  // The standard ones mean what the plain value means.
  EXPECT_EQ(ErrorOf(std::string(kCluster) + "job: {name: !!str x, seed: !!int 3}\n"), "");
}

TEST(ManifestTest, AliasesThatExpandWithoutBoundAreRefused) {
  // Each level 8 uses of the one before: 8^9 nodes from 9 lines.
  std::ostringstream yaml;
  yaml << kCluster << "a0: &a0 [x, x, x, x, x, x, x, x]\n";
  for (int i = 1; i < 9; ++i) {
    yaml << 'a' << i << ": &a" << i << " [";
    for (int j = 0; j < 8; ++j) yaml << (j ? ", " : "") << "*a" << i - 1;
    yaml << "]\n";
  }
  const std::string text = yaml.str();
  const auto start = std::chrono::steady_clock::now();
  const std::string error = ErrorOf(text);
  EXPECT_NE(error.find("nodes (counting each use of an alias)"), std::string::npos) << error;
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), 10.0);
}

TEST(ManifestTest, AnAliasInsideTheNodeItNamesIsACycleAndRefused) {
  for (const char* cycle : {"foo: &a [*a]\n", "foo: &a {k: *a}\n", "foo: &a [1, [2, *a]]\n"}) {
    const std::string error = ErrorOf(std::string(kCluster) + cycle);
    EXPECT_NE(error.find("nests deeper than 64 levels"), std::string::npos) << cycle << error;
  }
}

}  // namespace
}  // namespace parasol
