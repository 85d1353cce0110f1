// Idle and half-sent HTTP connections held against a real shard's metrics endpoint.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>

#include <chrono>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include "common/net.hpp"
#include "tests/support/tcp_probe.hpp"
#include "tests/support/test_cluster.hpp"

namespace parasol {
namespace {

using std::chrono::milliseconds;
using testing::HttpGetWithin;
using testing::TcpProbe;
using testing::TestCluster;
using Clock = std::chrono::steady_clock;

constexpr const char* kTables =
    "  - name: emb\n    dim: 4\n    init: {kind: constant, value: 1.0}\n";

// Waits (10 s at most) for the shard's endpoint to answer /healthz.
bool EndpointUp(uint16_t port) {
  const auto deadline = Clock::now() + std::chrono::seconds(10);
  while (Clock::now() < deadline) {
    if (HttpGetWithin(port, "/healthz", milliseconds(500))) return true;
    std::this_thread::sleep_for(milliseconds(50));
  }
  return false;
}

TEST(HostileMetricsTest, IdleConnectionsNeitherBlockScrapesNorDelayShutdown) {
  const std::vector<uint16_t> ports = *PickFreePorts(2);  // metrics, then the server
  const uint16_t metrics_port = ports[0];                 // rank 0: metrics.port + 0
  TestCluster cluster(1, 1, kTables,
                      "metrics:\n  enabled: true\n  port: " + std::to_string(metrics_port) + "\n",
                      {ports[1]});
  ASSERT_TRUE(cluster.Start());
  ASSERT_TRUE(EndpointUp(metrics_port)) << cluster.ServerLog(0);

  // More idle connections than the endpoint keeps open, and one that sends half a request.
  std::vector<TcpProbe> idle;
  for (int i = 0; i < 100; ++i) {
    idle.push_back(TcpProbe::Connect(metrics_port));
    ASSERT_TRUE(idle.back().connected()) << "probe " << i;
  }
  ASSERT_TRUE(idle.back().Send("GET /metrics HTTP/1.1\r\nHost: x\r\n"));

  // Failures here are not fatal: the shutdown below is checked either way.
  const auto health = HttpGetWithin(metrics_port, "/healthz", milliseconds(2000));
  EXPECT_TRUE(health.has_value()) << "/healthz did not answer within 2 s";
  if (health) {
    EXPECT_EQ(health->status_line, "HTTP/1.1 200 OK");
    EXPECT_EQ(health->body, "ok\n");
  }
  const auto metrics = HttpGetWithin(metrics_port, "/metrics", milliseconds(2000));
  EXPECT_TRUE(metrics.has_value()) << "/metrics did not answer within 2 s";
  if (metrics) {
    EXPECT_EQ(metrics->status_line, "HTTP/1.1 200 OK");
    EXPECT_NE(metrics->body.find("parasol_requests_total{shard=\"0\""), std::string::npos)
        << metrics->body;
  }

  // The newest connections are still held open by the shard when it is told to stop.
  ASSERT_FALSE(idle.back().ReadUntilClosed(milliseconds(0)).has_value());
  const auto start = Clock::now();
  cluster.server(0).Signal(SIGTERM);
  const std::optional<int> exit_status = cluster.server(0).Wait(std::chrono::seconds(10));
  const auto took = Clock::now() - start;
  ASSERT_TRUE(exit_status.has_value()) << "the shard still runs 10 s after SIGTERM\n"
                                       << cluster.ServerLog(0);
  EXPECT_TRUE(WIFEXITED(*exit_status) && WEXITSTATUS(*exit_status) == 0)
      << DescribeWaitStatus(*exit_status) << "\n"
      << cluster.ServerLog(0);
  EXPECT_LT(took, std::chrono::seconds(10));
  std::printf("shard exited %lld ms after SIGTERM with idle metrics connections open\n",
              static_cast<long long>(std::chrono::duration_cast<milliseconds>(took).count()));
}

}  // namespace
}  // namespace parasol
