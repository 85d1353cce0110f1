// CURVE authentication and encryption, and the metrics endpoint, with real processes.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include <boost/asio/connect.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/read.hpp>
#include <boost/asio/write.hpp>
#include <regex>
#include <thread>

#include "common/curve_keys.hpp"
#include "common/net.hpp"
#include "common/subprocess.hpp"
#include "worker/data_generator.hpp"
#include "tests/support/test_cluster.hpp"

namespace parasol {
namespace {

using testing::TestCluster;

constexpr const char* kTables =
    "  - name: emb\n    dim: 4\n    init: {kind: constant, value: 1.0}\n";

class CurveTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!CurveAvailable()) GTEST_SKIP() << "this libzmq has no CURVE support";
    keys_ = testing::MakeTempDir();
    for (const char* name : {"server0", "server1", "worker", "intruder"}) {
      auto k = GenerateCurveKeyPair();
      ASSERT_TRUE(k.ok());
      ASSERT_TRUE(WriteCurveKeyPair(keys_, name, *k).ok());
    }
    security_ = "security:\n  curve: true\n  server_keys: [" + keys_ + "/server0, " + keys_ +
                "/server1]\n  client_key: " + keys_ + "/worker\n  allowed_clients: [" + keys_ +
                "/worker.pub]\n";
  }
  void TearDown() override { testing::RemoveTree(keys_); }
  std::string keys_, security_;
};

TEST_F(CurveTest, AnAllowedWorkerTalksOverCurve) {
  TestCluster cluster(2, 1, kTables, security_);
  ASSERT_TRUE(cluster.Start());
  auto client = PsClient::Connect(cluster.manifest(), 0);
  ASSERT_TRUE(client.ok()) << client.status().ToString();
  for (uint32_t s = 0; s < 2; ++s) EXPECT_EQ((*client)->Mechanism(s), ZMQ_CURVE);
  std::vector<uint64_t> keys = {1, 2, 3};
  std::vector<float> rows(12);
  ASSERT_TRUE((*client)->PullSparse(0, keys, rows.data()).ok());
  EXPECT_EQ(rows, std::vector<float>(12, 1.0f));
}

TEST_F(CurveTest, AJobWithSecurityOnTrains) {
  GeneratorOptions g;
  g.rows = 8000;
  ASSERT_TRUE(GenerateCriteo(keys_ + "/train.tsv", g).ok());
  g.rows = 2000;
  g.seed = 5;
  ASSERT_TRUE(GenerateCriteo(keys_ + "/eval.tsv", g).ok());
  const std::vector<uint16_t> ports = *PickFreePorts(2);
  std::string y = "cluster:\n  servers: [127.0.0.1:" + std::to_string(ports[0]) +
                  ", 127.0.0.1:" + std::to_string(ports[1]) + "]\n  workers: 2\n";
  y += security_;
  y += "model: {kind: lr, sparse_optimizer: {kind: adagrad, lr: 0.3}}\n";
  y += "data: {train: " + keys_ + "/train.tsv, eval: " + keys_ + "/eval.tsv}\n";
  testing::WriteFile(keys_ + "/job.yaml", y);
  auto p = Subprocess::Spawn({PARASOL_BINARY, "launch", keys_ + "/job.yaml", "--summary",
                              keys_ + "/summary.json"},
                             keys_ + "/launch.log");
  ASSERT_TRUE(p.ok());
  auto st = p->Wait(std::chrono::seconds(120));
  const std::string out = testing::ReadFile(keys_ + "/launch.log");
  ASSERT_TRUE(st && WIFEXITED(*st) && WEXITSTATUS(*st) == 0) << out;
  const std::string summary = testing::ReadFile(keys_ + "/summary.json");
  EXPECT_NE(summary.find("\"train_samples\": 8000"), std::string::npos) << summary;
  EXPECT_EQ(out.find("refused a connection"), std::string::npos) << out;
}

TEST_F(CurveTest, UnknownAndMissingKeysGetNoAnswerAndAreLogged) {
  TestCluster cluster(2, 1, kTables, security_);
  ASSERT_TRUE(cluster.Start());
  Manifest m = cluster.manifest();
  m.cluster.connect_timeout_ms = 1500;
  // A client with a key pair the servers do not know.
  auto intruder = PsClient::Connect(m, 0, keys_ + "/intruder");
  ASSERT_FALSE(intruder.ok());
  EXPECT_EQ(intruder.status().code(), StatusCode::kTimeout) << intruder.status().ToString();
  // A plain client with no key at all.
  Manifest plain = m;
  plain.security.curve = false;
  auto none = PsClient::Connect(plain, 0);
  ASSERT_FALSE(none.ok());
  std::string log;
  for (int i = 0; i < 100; ++i) {
    log = cluster.ServerLog(0);
    if (log.find("unknown client key") != std::string::npos &&
        log.find("the handshake failed") != std::string::npos) {
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_NE(log.find("refused a connection from"), std::string::npos) << log;
  EXPECT_NE(log.find("unknown client key"), std::string::npos) << log;
  EXPECT_NE(log.find("the handshake failed"), std::string::npos) << log;  // the plain client
  // The allowed worker still gets in.
  auto worker = PsClient::Connect(cluster.manifest(), 0);
  EXPECT_TRUE(worker.ok()) << worker.status().ToString();
}

TEST_F(CurveTest, ASecretKeyOpenToOthersIsRefused) {
  ::chmod((keys_ + "/worker.key").c_str(), 0644);
  TestCluster cluster(2, 1, kTables, security_);
  ASSERT_TRUE(cluster.Start());
  auto client = PsClient::Connect(cluster.manifest(), 0);
  ASSERT_FALSE(client.ok());
  EXPECT_NE(client.status().message().find("is open to others (mode 0644); run chmod 600"),
            std::string::npos)
      << client.status().message();
}

// GET `path` from 127.0.0.1:port: status line and body.
std::pair<std::string, std::string> HttpGet(uint16_t port, const std::string& path) {
  namespace asio = boost::asio;
  asio::io_context io;
  asio::ip::tcp::socket socket(io);
  boost::system::error_code ec;
  socket.connect({asio::ip::make_address("127.0.0.1"), port}, ec);
  if (ec) return {"", ""};
  const std::string req = "GET " + path + " HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n";
  asio::write(socket, asio::buffer(req), ec);
  std::string response;
  char buf[4096];
  while (true) {
    const size_t n = socket.read_some(asio::buffer(buf), ec);
    response.append(buf, n);
    if (ec) break;
  }
  const size_t head_end = response.find("\r\n\r\n");
  return {response.substr(0, response.find("\r\n")),
          head_end == std::string::npos ? "" : response.substr(head_end + 4)};
}

double MetricValue(const std::string& text, const std::string& sample) {
  const size_t p = text.find(sample + " ");
  return p == std::string::npos ? -1 : std::atof(text.c_str() + p + sample.size() + 1);
}

TEST(MetricsTest, ScrapesParseAsPrometheusTextAndCountersMove) {
  const std::vector<uint16_t> ports = *PickFreePorts(2);  // metrics, then the server
  const uint16_t port = ports[0];
  TestCluster cluster(1, 1, kTables,
                      "metrics:\n  enabled: true\n  port: " + std::to_string(port) + "\n",
                      {ports[1]});
  ASSERT_TRUE(cluster.Start());
  auto client = cluster.Connect(0);
  ASSERT_NE(client, nullptr);
  auto [status, health] = HttpGet(port, "/healthz");
  EXPECT_EQ(status, "HTTP/1.1 200 OK");
  EXPECT_EQ(health, "ok\n");
  std::vector<uint64_t> keys = {1, 2, 3, 4};
  std::vector<float> rows(16), grads(16, 0.5f);
  const std::string pulls = "parasol_requests_total{shard=\"0\",op=\"PullSparse\"}";
  // The shard publishes a snapshot every 250 ms: scrape until it shows `want` pulls (10 s).
  auto scrape_until = [&](double want) {
    std::string text;
    for (int i = 0; i < 200 && MetricValue(text, pulls) != want; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      text = HttpGet(port, "/metrics").second;
    }
    return text;
  };
  ASSERT_TRUE(client->PullSparse(0, keys, rows.data()).ok());
  const std::string before = scrape_until(1);
  ASSERT_TRUE(client->PushSparse(0, keys, grads).ok());
  ASSERT_TRUE(client->PullSparse(0, keys, rows.data()).ok());
  const std::string after = scrape_until(2);
  // Every line is a comment or `name{labels} value`.
  const std::regex sample(R"(^[a-zA-Z_:][a-zA-Z0-9_:]*(\{[^}]*\})? [-+0-9.eEInf]+$)");
  size_t samples = 0;
  std::istringstream lines(after);
  for (std::string line; std::getline(lines, line);) {
    if (line.rfind("# HELP ", 0) == 0 || line.rfind("# TYPE ", 0) == 0) continue;
    EXPECT_TRUE(std::regex_match(line, sample)) << "not Prometheus text: " << line;
    ++samples;
  }
  EXPECT_GT(samples, 20u);
  EXPECT_EQ(MetricValue(before, pulls), 1) << before;
  EXPECT_EQ(MetricValue(after, pulls), MetricValue(before, pulls) + 1) << after;
  const std::string pushes = "parasol_requests_total{shard=\"0\",op=\"PushSparse\"}";
  EXPECT_EQ(MetricValue(after, pushes), MetricValue(before, pushes) + 1);
  EXPECT_EQ(MetricValue(after, "parasol_table_rows{shard=\"0\",table=\"emb\"}"), 4);
  EXPECT_GT(MetricValue(after, "parasol_request_bytes_total{shard=\"0\",op=\"PushSparse\"}"), 0);
  EXPECT_NE(after.find("parasol_pull_wait_seconds_bucket{shard=\"0\",le=\"+Inf\"}"),
            std::string::npos);
  EXPECT_EQ(MetricValue(after, "parasol_checkpoint_age_seconds{shard=\"0\"}"), -1);
  EXPECT_EQ(HttpGet(port, "/nope").first, "HTTP/1.1 404 Not Found");
}

}  // namespace
}  // namespace parasol
