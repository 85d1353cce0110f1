#include "common/cluster_render.hpp"

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <yaml-cpp/yaml.h>

#include <fstream>
#include <sstream>

#include "common/manifest.hpp"
#include "common/subprocess.hpp"
#include "tests/support/test_cluster.hpp"

namespace parasol {
namespace {

class ClusterRenderTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = testing::MakeTempDir();
    testing::WriteFile(dir_ + "/job.yaml",
                       "job: {name: Ctr_Job}\n"
                       "cluster:\n  servers: [10.0.0.1:7000, 10.0.0.2:7001, 10.0.0.3:7002]\n"
                       "  workers: 4\n  worker_hosts: [a, b, c, d]\n"
                       "model: {kind: dlrm}\n"
                       "data: {train: data/train.tsv, eval: /abs/eval.tsv}\n"
                       "checkpoint: {dir: ckpt}\n");
  }
  void TearDown() override { testing::RemoveTree(dir_); }
  std::string dir_;
};

// A job whose shard count may change: the StatefulSet starts the shards that hold the model at
// the start, and the manifest it carries lists every shard the job may use.
TEST_F(ClusterRenderTest, TheServerReplicasAreTheInitialShards) {
  testing::WriteFile(dir_ + "/grow.yaml",
                     "job: {name: grow}\n"
                     "cluster:\n  servers: [10.0.0.1:7000, 10.0.0.2:7001, 10.0.0.3:7002]\n"
                     "  initial_servers: 2\n  workers: 2\n"
                     "model: {kind: dlrm}\n"
                     "data: {train: /abs/train.tsv}\n");
  Result<std::string> text = RenderKubernetes(dir_ + "/grow.yaml", RenderOptions{});
  ASSERT_TRUE(text.ok()) << text.status().ToString();
  std::vector<YAML::Node> docs = YAML::LoadAll(*text);
  ASSERT_EQ(docs.size(), 5u);  // with the Secret of the job's keys
  EXPECT_EQ(docs[3]["spec"]["replicas"].as<int>(), 2);
  Result<Manifest> m = ParseManifest(docs[0]["data"]["manifest.yaml"].as<std::string>(), "cm");
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  EXPECT_EQ(m->cluster.servers.size(), 3u);
  EXPECT_EQ(m->cluster.InitialServers(), 2u);
}

TEST_F(ClusterRenderTest, KubernetesObjectsHaveTheExpectedStructure) {
  RenderOptions o;
  o.worker_gpus = 1;
  o.image = "registry.example/parasol:1";
  Result<std::string> text = RenderKubernetes(dir_ + "/job.yaml", o);
  ASSERT_TRUE(text.ok()) << text.status().ToString();
  std::vector<YAML::Node> docs = YAML::LoadAll(*text);
  ASSERT_EQ(docs.size(), 5u);
  EXPECT_EQ(docs[0]["kind"].as<std::string>(), "ConfigMap");
  EXPECT_EQ(docs[1]["kind"].as<std::string>(), "Secret");
  EXPECT_EQ(docs[2]["kind"].as<std::string>(), "Service");
  EXPECT_EQ(docs[3]["kind"].as<std::string>(), "StatefulSet");
  EXPECT_EQ(docs[4]["kind"].as<std::string>(), "Job");
  // Secure by default: the manifest had no keys, so the job gets its own, one pair per server
  // and the client's, in a Secret every pod mounts for its owner alone.
  const YAML::Node keys = docs[1]["stringData"];
  for (const char* pair : {"server0", "server1", "server2", "client"}) {
    for (const char* ext : {".key", ".pub"}) {
      ASSERT_TRUE(keys[std::string(pair) + ext].IsDefined()) << pair << ext;
      EXPECT_EQ(keys[std::string(pair) + ext].as<std::string>().size(), 41u) << pair << ext;
    }
  }
  EXPECT_NE(keys["server0.key"].as<std::string>(), keys["server1.key"].as<std::string>());
  // The other objects, in order (YAML::Node copies refer to the same node: no erase).
  const std::vector<YAML::Node> objects{docs[0], docs[2], docs[3], docs[4]};

  // The manifest in the ConfigMap names the servers by their stable DNS names.
  const std::string carried = objects[0]["data"]["manifest.yaml"].as<std::string>();
  Result<Manifest> m = ParseManifest(carried, "configmap");
  ASSERT_TRUE(m.ok()) << m.status().ToString() << "\n" << carried;
  ASSERT_EQ(m->cluster.servers.size(), 3u);
  EXPECT_EQ(m->cluster.servers[2].host, "ctr-job-server-2.ctr-job-server");
  EXPECT_EQ(m->cluster.bind, "0.0.0.0");
  EXPECT_EQ(m->data.train[0], dir_ + "/data/train.tsv");  // made absolute
  EXPECT_TRUE(m->security.curve);
  ASSERT_EQ(m->security.server_keys.size(), 3u);
  EXPECT_EQ(m->security.server_keys[2], "/etc/parasol-keys/server2");
  EXPECT_EQ(m->security.client_key, "/etc/parasol-keys/client");

  EXPECT_EQ(objects[1]["spec"]["clusterIP"].as<std::string>(), "None");
  EXPECT_EQ(objects[1]["metadata"]["name"].as<std::string>(), "ctr-job-server");
  const YAML::Node sts = objects[2]["spec"];
  EXPECT_EQ(sts["replicas"].as<int>(), 3);
  EXPECT_EQ(sts["serviceName"].as<std::string>(), "ctr-job-server");
  const YAML::Node server = sts["template"]["spec"]["containers"][0];
  EXPECT_EQ(server["image"].as<std::string>(), "registry.example/parasol:1");
  EXPECT_NE(server["command"][2].as<std::string>().find("server --manifest"), std::string::npos);
  EXPECT_TRUE(server["resources"]["requests"]["cpu"].IsDefined());
  EXPECT_TRUE(server["resources"]["requests"]["memory"].IsDefined());
  const YAML::Node job = objects[3]["spec"];
  EXPECT_EQ(job["completionMode"].as<std::string>(), "Indexed");
  EXPECT_EQ(job["completions"].as<int>(), 4);
  EXPECT_EQ(job["parallelism"].as<int>(), 4);
  const YAML::Node worker = job["template"]["spec"]["containers"][0];
  EXPECT_NE(worker["command"][2].as<std::string>().find("--rank ${JOB_COMPLETION_INDEX}"),
            std::string::npos);
  EXPECT_EQ(worker["resources"]["requests"]["nvidia.com/gpu"].as<std::string>(), "1");
  EXPECT_EQ(worker["resources"]["limits"]["nvidia.com/gpu"].as<std::string>(), "1");
  EXPECT_EQ(job["template"]["spec"]["volumes"][0]["configMap"]["name"].as<std::string>(),
            "ctr-job-manifest");
  for (const YAML::Node& pod : {sts["template"]["spec"], job["template"]["spec"]}) {
    EXPECT_EQ(pod["volumes"][1]["secret"]["secretName"].as<std::string>(), "ctr-job-keys");
    EXPECT_EQ(pod["volumes"][1]["secret"]["defaultMode"].as<int>(), 0400);
    EXPECT_EQ(pod["containers"][0]["volumeMounts"][1]["mountPath"].as<std::string>(),
              "/etc/parasol-keys");
  }
}

TEST_F(ClusterRenderTest, AManifestThatStatesInsecureStaysSoWithoutKeys) {
  std::ifstream in(dir_ + "/job.yaml");
  std::stringstream text;
  text << in.rdbuf();
  testing::WriteFile(dir_ + "/open.yaml", text.str() + "security: {mode: insecure}\n");
  Result<std::string> k8s = RenderKubernetes(dir_ + "/open.yaml", RenderOptions());
  ASSERT_TRUE(k8s.ok()) << k8s.status().ToString();
  std::vector<YAML::Node> docs = YAML::LoadAll(*k8s);
  ASSERT_EQ(docs.size(), 4u);
  for (const YAML::Node& d : docs) EXPECT_NE(d["kind"].as<std::string>(), "Secret");
  Result<Manifest> m = ParseManifest(docs[0]["data"]["manifest.yaml"].as<std::string>(), "cm");
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  EXPECT_FALSE(m->security.curve);
  EXPECT_EQ(m->security.mode, SecurityOptions::Mode::kInsecure);
  Result<std::string> slurm = RenderSlurm(dir_ + "/open.yaml", RenderOptions());
  ASSERT_TRUE(slurm.ok()) << slurm.status().ToString();
  EXPECT_EQ(slurm->find("keygen"), std::string::npos);
}

TEST_F(ClusterRenderTest, SlurmScriptIsAValidHeterogeneousJob) {
  Result<std::string> text = RenderSlurm(dir_ + "/job.yaml", RenderOptions());
  ASSERT_TRUE(text.ok()) << text.status().ToString();
  const std::string& s = *text;
  EXPECT_EQ(s.rfind("#!/bin/bash\n", 0), 0u);
  EXPECT_NE(s.find("#SBATCH --nodes=3 --ntasks=3"), std::string::npos);
  EXPECT_NE(s.find("#SBATCH hetjob\n#SBATCH --nodes=4 --ntasks=4"), std::string::npos);
  EXPECT_NE(s.find("--mem=16G\n"), std::string::npos);
  EXPECT_NE(s.find("srun --het-group=0"), std::string::npos);
  EXPECT_NE(s.find("srun --het-group=1"), std::string::npos);
  // Valid bash.
  testing::WriteFile(dir_ + "/job.sbatch", s);
  auto p = Subprocess::Spawn({"/bin/bash", "-n", dir_ + "/job.sbatch"}, dir_ + "/bash.log");
  ASSERT_TRUE(p.ok());
  auto st = p->Wait(std::chrono::seconds(10));
  ASSERT_TRUE(st && WIFEXITED(*st) && WEXITSTATUS(*st) == 0) << testing::ReadFile(dir_ + "/bash.log");
  // The manifest it writes, with the nodes Slurm would give component 0.
  const size_t begin = s.find("<<PARASOL_MANIFEST\n") + 19;
  std::string manifest = s.substr(begin, s.find("PARASOL_MANIFEST\n", begin) - begin);
  for (int i = 0; i < 3; ++i) {
    const std::string ph = "${SERVER_HOSTS[" + std::to_string(i) + "]}";
    manifest.replace(manifest.find(ph), ph.size(), "node" + std::to_string(i));
  }
  // (bash expands the job's folder)
  for (size_t at; (at = manifest.find("${JOB_DIR}")) != std::string::npos;) {
    manifest.replace(at, 10, "/jobdir");
  }
  Result<Manifest> m = ParseManifest(manifest, "sbatch");
  ASSERT_TRUE(m.ok()) << m.status().ToString() << "\n" << manifest;
  EXPECT_EQ(m->cluster.servers[1].ToString(), "node1:7001");
  EXPECT_EQ(m->cluster.workers, 4u);
  // Every path absolute, from the original manifest's folder (the copy lives elsewhere).
  EXPECT_EQ(m->checkpoint.dir, dir_ + "/ckpt");
  ASSERT_EQ(m->data.train.size(), 1u);
  EXPECT_EQ(m->data.train[0], dir_ + "/data/train.tsv");
  EXPECT_EQ(m->data.eval, "/abs/eval.tsv");
  EXPECT_TRUE(m->worker.command.empty());
  // Secure by default: the job's key pairs are made at its start in its folder.
  EXPECT_TRUE(m->security.curve);
  ASSERT_EQ(m->security.server_keys.size(), 3u);
  EXPECT_EQ(m->security.server_keys[1], "/jobdir/keys/server1");
  EXPECT_EQ(m->security.client_key, "/jobdir/keys/client");
  EXPECT_NE(s.find("\"$PARASOL\" keygen --out \"$JOB_DIR/keys\" --name server --count 3"),
            std::string::npos);
  EXPECT_LT(s.find("keygen --out"), s.find("srun --het-group=0"));
  // A clean stop, the job's own folder, the servers' nodes its alone, no requeue.
  EXPECT_NE(s.find("\"$PARASOL\" shutdown --manifest \"$MANIFEST\""), std::string::npos);
  EXPECT_NE(s.find("scancel --signal=TERM"), std::string::npos);
  EXPECT_EQ(s.find("kill -TERM"), std::string::npos);
  EXPECT_NE(s.find("JOB_DIR=\"${SLURM_SUBMIT_DIR:-$PWD}/parasol-ctr-job-${SLURM_JOB_ID}\""),
            std::string::npos);
  EXPECT_NE(s.find("rm -rf \"$JOB_DIR\""), std::string::npos);
  EXPECT_NE(s.find("#SBATCH --exclusive\n#SBATCH hetjob"), std::string::npos);
  EXPECT_NE(s.find("#SBATCH --no-requeue\n"), std::string::npos);
  EXPECT_EQ(s.find("#SBATCH --time"), std::string::npos);
}

TEST_F(ClusterRenderTest, SlurmOptionsBecomeSbatchLines) {
  RenderOptions o;
  o.time = "1:30:00";
  o.partition = "gpu";
  o.account = "ranking";
  o.output = "logs/parasol-%j.out";
  o.sbatch_lines = {"--qos=high", "--mail-type=END"};
  o.exclusive = false;
  o.server_memory = "1.5Gi";
  o.worker_memory = "1024Mi";
  Result<std::string> text = RenderSlurm(dir_ + "/job.yaml", o);
  ASSERT_TRUE(text.ok()) << text.status().ToString();
  const std::string& s = *text;
  for (const char* line : {"#SBATCH --time=1:30:00\n", "#SBATCH --partition=gpu\n",
                           "#SBATCH --account=ranking\n", "#SBATCH --output=logs/parasol-%j.out\n",
                           "#SBATCH --qos=high\n", "#SBATCH --mail-type=END\n",
                           "--mem=1536M\n", "--mem=1G\n"}) {
    EXPECT_NE(s.find(line), std::string::npos) << line << " missing from\n" << s;
  }
  EXPECT_EQ(s.find("--exclusive"), std::string::npos);
  // Job-wide options come before the first component's lines (later components inherit them);
  // the partition is per component, so each has it.
  EXPECT_LT(s.find("--qos=high"), s.find("#SBATCH --nodes=3"));
  const size_t het = s.find("#SBATCH hetjob");
  EXPECT_LT(s.find("#SBATCH --partition=gpu"), het);
  EXPECT_NE(s.find("#SBATCH --partition=gpu", het), std::string::npos);
  EXPECT_NE(s.find("PARASOL='parasol'\n"), std::string::npos);
  o.sbatch_lines = {"--qos=high\nrm -rf /"};
  EXPECT_FALSE(RenderSlurm(dir_ + "/job.yaml", o).ok());
  o.sbatch_lines.clear();
  o.partition = "gpu --qos=x";
  EXPECT_FALSE(RenderSlurm(dir_ + "/job.yaml", o).ok());
}

// Several shards per node: the nodes, tasks per node and memory per node follow, each node's
// address fills as many hosts as it holds shards (block distribution), and shards that would
// share a node and a port are refused before anything is written.
TEST_F(ClusterRenderTest, SlurmPlacesSeveralShardsPerNode) {
  RenderOptions o;
  o.servers_per_node = 2;
  o.server_memory = "8Gi";
  // 3 shards do not split evenly over nodes of 2.
  Result<std::string> uneven = RenderSlurm(dir_ + "/job.yaml", o);
  ASSERT_FALSE(uneven.ok());
  EXPECT_NE(uneven.status().message().find("does not divide the 3 shards"), std::string::npos)
      << uneven.status().message();
  EXPECT_FALSE(RenderKubernetes(dir_ + "/job.yaml", o).ok());  // Slurm's option only
  testing::WriteFile(dir_ + "/four.yaml",
                     "cluster:\n  servers: [h:7000, h:7001, h:7002, h:7003]\n  workers: 1\n");
  Result<std::string> text = RenderSlurm(dir_ + "/four.yaml", o);
  ASSERT_TRUE(text.ok()) << text.status().ToString();
  const std::string& s = *text;
  EXPECT_NE(s.find("#SBATCH --nodes=2 --ntasks=4 --ntasks-per-node=2\n"), std::string::npos) << s;
  EXPECT_NE(s.find("--mem=16G\n"), std::string::npos) << s;  // two shards of 8Gi
  EXPECT_NE(s.find("for ((k = 0; k < 2; ++k)); do SERVER_HOSTS+="), std::string::npos) << s;
  EXPECT_NE(s.find("srun --het-group=0 --distribution=block"), std::string::npos) << s;
  // The script's host list, run with a node list of two nodes, gives n1 n1 n2 n2.
  const size_t a = s.find("SERVER_HOSTS=()"), b = s.find("\ndone\n", a) + 6;  // the outer loop's
  testing::WriteFile(dir_ + "/hosts.sh",
                     "scontrol() { if [ \"$2\" = hostnames ]; then echo n1; echo n2; fi; }\n" +
                         s.substr(a, b - a) + "echo \"${SERVER_HOSTS[@]}\"\n");
  auto p = Subprocess::Spawn({"/bin/bash", dir_ + "/hosts.sh"}, dir_ + "/hosts.out");
  ASSERT_TRUE(p.ok());
  auto st = p->Wait(std::chrono::seconds(10));
  ASSERT_TRUE(st && WIFEXITED(*st) && WEXITSTATUS(*st) == 0) << testing::ReadFile(dir_ + "/hosts.out");
  EXPECT_EQ(testing::ReadFile(dir_ + "/hosts.out"), "n1 n1 n2 n2\n");
  // One per node by default.
  Result<std::string> one = RenderSlurm(dir_ + "/job.yaml", RenderOptions());
  ASSERT_TRUE(one.ok());
  EXPECT_NE(one->find("#SBATCH --nodes=3 --ntasks=3 --ntasks-per-node=1\n"), std::string::npos);
  // Two shards of one node on one port.
  testing::WriteFile(dir_ + "/same_port.yaml",
                     "cluster:\n  servers: [h1:7000, h2:7000, h3:7001, h4:7002]\n  workers: 1\n");
  Result<std::string> clash = RenderSlurm(dir_ + "/same_port.yaml", o);
  ASSERT_FALSE(clash.ok());
  EXPECT_NE(clash.status().message().find("servers 0 and 1 share a node"), std::string::npos)
      << clash.status().message();
  o.servers_per_node = 1;  // each on a node of its own: the same port is fine
  EXPECT_TRUE(RenderSlurm(dir_ + "/same_port.yaml", o).ok());
}

TEST_F(ClusterRenderTest, SlurmScriptQuotesWhatItCannotTrust) {
  // A job name and manifest strings with shell syntax, a binary path with a space and a quote.
  testing::WriteFile(dir_ + "/odd.yaml",
                     "job: {name: \"x\\n$(touch pwned)\"}\n"
                     "cluster:\n  servers: [10.0.0.1:7000]\n  workers: 1\n"
                     "model: {kind: dlrm}\n"
                     "data: {train: \"/d/${SERVER_HOSTS[0]}/`id`/t.tsv\"}\n");
  RenderOptions o;
  o.binary = "/opt/my tools/it's/parasol";
  Result<std::string> text = RenderSlurm(dir_ + "/odd.yaml", o);
  ASSERT_TRUE(text.ok()) << text.status().ToString();
  const std::string& s = *text;
  // Every "$" of the manifest's own text is escaped.
  for (size_t at = s.find("$(touch"); at != std::string::npos; at = s.find("$(touch", at + 1)) {
    EXPECT_TRUE(at > 0 && s[at - 1] == '\\') << "an unescaped $(touch at " << at << ":\n" << s;
  }
  EXPECT_EQ(s.find("\n$(touch"), std::string::npos) << s;
  EXPECT_NE(s.find("PARASOL='/opt/my tools/it'\\''s/parasol'\n"), std::string::npos) << s;
  // The here-document expands the servers' hosts and nothing else.
  EXPECT_NE(s.find("\\${SERVER_HOSTS[0]}/\\`id\\`/t.tsv"), std::string::npos) << s;
  EXPECT_NE(s.find("${SERVER_HOSTS[0]}:7000"), std::string::npos) << s;
  testing::WriteFile(dir_ + "/odd.sbatch", s);
  auto p = Subprocess::Spawn({"/bin/bash", "-n", dir_ + "/odd.sbatch"}, dir_ + "/bash.log");
  ASSERT_TRUE(p.ok());
  auto st = p->Wait(std::chrono::seconds(10));
  ASSERT_TRUE(st && WIFEXITED(*st) && WEXITSTATUS(*st) == 0) << testing::ReadFile(dir_ + "/bash.log");
}

TEST_F(ClusterRenderTest, AWorkerCommandRunsInTheOriginalManifestsFolder) {
  testing::WriteFile(dir_ + "/py.yaml",
                     "cluster: {servers: [10.0.0.1:7000], workers: 2}\n"
                     "worker: {command: [/usr/bin/python3, train.py]}\n");
  testing::WriteFile(dir_ + "/py-dir.yaml",
                     "cluster: {servers: [10.0.0.1:7000], workers: 2}\n"
                     "worker: {command: [./train], command_dir: scripts}\n");
  for (const char* name : {"py", "py-dir"}) {
    Result<std::string> text = RenderSlurm(dir_ + "/" + name + ".yaml", RenderOptions());
    ASSERT_TRUE(text.ok()) << text.status().ToString();
    const size_t begin = text->find("<<PARASOL_MANIFEST\n") + 19;
    std::string manifest = text->substr(begin, text->find("PARASOL_MANIFEST\n", begin) - begin);
    const std::string ph = "${SERVER_HOSTS[0]}";
    manifest.replace(manifest.find(ph), ph.size(), "node0");
    Result<Manifest> m = ParseManifest(manifest, "/elsewhere/sbatch.yaml");
    ASSERT_TRUE(m.ok()) << m.status().ToString() << "\n" << manifest;
    EXPECT_EQ(m->worker.command_dir,
              std::string(name) == "py" ? dir_ : dir_ + "/scripts") << manifest;
    EXPECT_EQ(m->worker.command.size(), std::string(name) == "py" ? 2u : 1u);
  }
  Result<std::string> k8s = RenderKubernetes(dir_ + "/py.yaml", RenderOptions());
  ASSERT_TRUE(k8s.ok()) << k8s.status().ToString();
  EXPECT_NE(k8s->find("command_dir: " + dir_), std::string::npos) << *k8s;
}

TEST(SlurmMemoryTest, SizesAreConvertedExactlyOrRefused) {
  const std::pair<const char*, const char*> good[] = {
      {"16Gi", "16G"},    {"1.5Gi", "1536M"},  {"0.25Gi", "256M"}, {"256Mi", "256M"},
      {"1Ti", "1T"},      {"2048Ki", "2M"},    {"1024Mi", "1G"},   {"1.048576M", "1M"},
      {"4.194304M", "4M"}};
  for (const auto& [in, want] : good) {
    Result<std::string> got = SlurmMemory(in);
    ASSERT_TRUE(got.ok()) << in << ": " << got.status().ToString();
    EXPECT_EQ(*got, want) << in;
  }
  // Not a whole number of MiB (Slurm's --mem unit), a bare number (bytes to Kubernetes,
  // megabytes to Slurm), not understood, or nothing at all: refused, naming the size.
  for (const char* bad : {"1000", "1024", "1048576", "16G", "1.3Gi", "3Ki", "16GB", "16g", "",
                          "Gi", "-1Gi", "0Mi", "1.5", "99999999999999999999Gi", "1e9"}) {
    Result<std::string> got = SlurmMemory(bad);
    EXPECT_FALSE(got.ok()) << bad << " gave " << (got.ok() ? *got : "");
    if (!got.ok()) {
      EXPECT_NE(got.status().message().find(std::string("'") + bad + "'"), std::string::npos)
          << got.status().message();
    }
  }
}

}  // namespace
}  // namespace parasol
