#include "tests/support/test_cluster.hpp"

#include <gtest/gtest.h>
#include <signal.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "common/json_text.hpp"
#include "common/net.hpp"

namespace parasol::testing {

int64_t NewestWorkerClock(PsClient& observer) {
  Result<std::vector<std::string>> stats = observer.Stats();
  if (!stats.ok()) return -1;
  int64_t newest = -1;
  for (const std::string& text : *stats) {
    const Json s = Json::parse(text, nullptr, false);
    if (s.is_discarded() || !s.contains("worker_clocks")) continue;
    for (const auto& c : s["worker_clocks"]) newest = std::max<int64_t>(newest, c.get<int64_t>());
  }
  return newest;
}

bool WaitForWorkerClock(PsClient& observer, int64_t clock, std::chrono::seconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < deadline) {
    if (NewestWorkerClock(observer) >= clock) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  return false;
}

std::string MakeTempDir() {
  std::string tmpl = (std::filesystem::temp_directory_path() / "parasol-test-XXXXXX").string();
  char* made = ::mkdtemp(tmpl.data());
  return made ? std::string(made) : std::string();
}

void RemoveTree(const std::string& path) {
  std::error_code ec;
  std::filesystem::remove_all(path, ec);
}

Status TrainSparseSteps(PsClient& c, uint64_t first_key, int steps) {
  std::vector<uint64_t> keys(64);
  std::vector<float> grads(keys.size() * 4, 0.01f), rows(keys.size() * 4);
  for (size_t i = 0; i < keys.size(); ++i) keys[i] = first_key + i;
  for (int step = 0; step < steps; ++step) {
    PARASOL_RETURN_IF_ERROR(c.PushSparse(0, keys, grads));
    PARASOL_RETURN_IF_ERROR(c.Tick());
    PARASOL_RETURN_IF_ERROR(c.PullSparse(0, keys, rows.data()));
  }
  return Status::Ok();
}

Status TrainWorkersTogether(const std::vector<PsClient*>& workers, int steps, double* seconds) {
  const auto start = std::chrono::steady_clock::now();
  std::vector<Status> got(workers.size());
  std::vector<std::thread> threads;
  for (size_t i = 0; i < workers.size(); ++i) {
    threads.emplace_back([&, i] { got[i] = TrainSparseSteps(*workers[i], 100000 * (i + 1), steps); });
  }
  for (std::thread& t : threads) t.join();
  *seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  for (const Status& st : got) PARASOL_RETURN_IF_ERROR(st);
  return Status::Ok();
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

void WriteFile(const std::string& path, const std::string& text) {
  std::ofstream out(path);
  out << text;
}

TestCluster::TestCluster(int shards, int workers, const std::string& tables_yaml,
                         const std::string& extra_yaml, std::vector<uint16_t> ports,
                         uint32_t max_workers)
    : shards_(shards), dir_(MakeTempDir()) {
  // A `cluster:` section of extra_yaml goes into the one made here (a manifest refuses a key
  // given twice); its keys replace the defaults below.
  std::string extra, cluster_extra;
  {
    std::istringstream lines(extra_yaml);
    bool in_cluster = false;
    for (std::string line; std::getline(lines, line);) {
      if (line == "cluster:") {
        in_cluster = true;
        continue;
      }
      if (in_cluster && line.rfind("  ", 0) == 0) {
        cluster_extra += line + "\n";
        continue;
      }
      in_cluster = false;
      extra += line + "\n";
    }
  }
  auto overridden = [&cluster_extra](const std::string& key) {
    return cluster_extra.find("  " + key + ":") != std::string::npos;
  };
  std::ostringstream y;
  y << "job:\n  name: test\n  seed: 7\ncluster:\n  servers:\n";
  if (ports.empty()) ports = PickFreePorts(shards).value();
  for (int s = 0; s < shards; ++s) y << "    - 127.0.0.1:" << ports[s] << "\n";
  y << "  workers: " << workers << "\n";
  if (!overridden("connect_timeout")) y << "  connect_timeout: 20s\n";
  if (!overridden("request_timeout")) y << "  request_timeout: 20s\n";
  if (max_workers > 0) y << "  max_workers: " << max_workers << "\n";
  y << cluster_extra;
  // Tests of the tables themselves see pushes applied on arrival; consistency tests say so.
  if (extra_yaml.find("training:") == std::string::npos) {
    y << "training:\n  consistency: asp\n";
  }
  y << "tables:\n" << tables_yaml << extra;
  manifest_path_ = dir_ + "/manifest.yaml";
  WriteFile(manifest_path_, y.str());
  Result<Manifest> m = LoadManifest(manifest_path_);
  if (!m.ok()) {
    ADD_FAILURE() << "test manifest does not load: " << m.status().ToString() << "\n" << y.str();
    return;
  }
  manifest_ = *m;
}

bool TestCluster::Start() {
  servers_.resize(shards_);
  for (int r = 0; r < shards_; ++r) {
    if (!Respawn(r, faults_)) return false;
  }
  return true;
}

bool TestCluster::Respawn(int rank, const std::string& faults) {
  std::vector<std::string> argv = {PARASOL_BINARY, "server", "--manifest", manifest_path_,
                                   "--rank", std::to_string(rank)};
  if (!faults.empty()) argv.insert(argv.begin(), {"/usr/bin/env", "PARASOL_FAULTS=" + faults});
  auto p = Subprocess::Spawn(argv, dir_ + "/server" + std::to_string(rank) + ".log");
  if (!p.ok()) {
    ADD_FAILURE() << p.status().ToString();
    return false;
  }
  servers_[rank] = std::move(*p);
  return true;
}

std::unique_ptr<PsClient> TestCluster::Connect(uint32_t worker) {
  auto c = PsClient::Connect(manifest_, worker);
  if (!c.ok()) {
    ADD_FAILURE() << "worker " << worker << " cannot connect: " << c.status().ToString();
    return nullptr;
  }
  return std::move(*c);
}

std::string TestCluster::ServerLog(int rank) const {
  return ReadFile(dir_ + "/server" + std::to_string(rank) + ".log");
}

TestCluster::~TestCluster() {
  bool any_running = false;
  for (auto& s : servers_) any_running |= s.running();
  if (any_running) {
    for (auto& s : servers_) s.Signal(SIGTERM);
    for (auto& s : servers_) s.Wait(std::chrono::seconds(10));
  }
  servers_.clear();  // kills whatever still runs
  if (!dir_.empty()) RemoveTree(dir_);
}

}  // namespace parasol::testing
