#include "common/metrics_server.hpp"

#include <gtest/gtest.h>

#include <chrono>
#include <functional>
#include <future>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "tests/support/tcp_probe.hpp"

namespace parasol {
namespace {

using std::chrono::milliseconds;
using testing::HttpGetWithin;
using testing::TcpProbe;
using Clock = std::chrono::steady_clock;

constexpr const char* kText = "# TYPE up gauge\nup 1\n";

// A started server on a port the kernel picks, with kText published.
std::unique_ptr<MetricsServer> StartServer(MetricsServer::Limits limits = MetricsServer::Limits()) {
  auto server = std::make_unique<MetricsServer>("127.0.0.1", 0, limits);
  const Status st = server->Start();
  EXPECT_TRUE(st.ok()) << st.ToString();
  server->Publish(kText);
  return server;
}

std::vector<TcpProbe> ConnectIdle(uint16_t port, int n) {
  std::vector<TcpProbe> probes;
  for (int i = 0; i < n; ++i) {
    probes.push_back(TcpProbe::Connect(port));
    EXPECT_TRUE(probes.back().connected()) << "probe " << i;
  }
  return probes;
}

// Polls `done` for up to `timeout`; its last answer.
bool Eventually(const std::function<bool()>& done, milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  while (!done() && Clock::now() < deadline) std::this_thread::sleep_for(milliseconds(5));
  return done();
}

// The whole answer to `request` sent on a fresh connection ("" when the server closed without
// one); a failure when the server neither answers nor closes within 2 s.
std::string RawExchange(uint16_t port, const std::string& request) {
  TcpProbe probe = TcpProbe::Connect(port);
  EXPECT_TRUE(probe.connected());
  probe.Send(request);
  std::optional<std::string> answer = probe.ReadUntilClosed(milliseconds(2000));
  EXPECT_TRUE(answer.has_value()) << "no answer and no close within 2 s";
  return answer.value_or("");
}

TEST(MetricsServerTest, ServesThePublishedTextAndHealth) {
  auto server = StartServer();
  auto metrics = HttpGetWithin(server->port(), "/metrics", milliseconds(2000));
  ASSERT_TRUE(metrics.has_value());
  EXPECT_EQ(metrics->status_line, "HTTP/1.1 200 OK");
  EXPECT_EQ(metrics->body, kText);
  auto health = HttpGetWithin(server->port(), "/healthz", milliseconds(2000));
  ASSERT_TRUE(health.has_value());
  EXPECT_EQ(health->status_line, "HTTP/1.1 200 OK");
  EXPECT_EQ(health->body, "ok\n");
  server->SetHealthy(false);
  health = HttpGetWithin(server->port(), "/healthz", milliseconds(2000));
  ASSERT_TRUE(health.has_value());
  EXPECT_EQ(health->status_line, "HTTP/1.1 503 Service Unavailable");
  EXPECT_TRUE(Eventually([&] { return server->requests_served() == 3; }, milliseconds(1000)))
      << server->requests_served();
}

TEST(MetricsServerTest, UnknownTargetsAre404AndOtherMethods405) {
  auto server = StartServer();
  auto other = HttpGetWithin(server->port(), "/metrics/../etc", milliseconds(2000));
  ASSERT_TRUE(other.has_value());
  EXPECT_EQ(other->status_line, "HTTP/1.1 404 Not Found");
  const std::string answer =
      RawExchange(server->port(), "DELETE /metrics HTTP/1.1\r\nHost: x\r\n\r\n");
  EXPECT_EQ(answer.rfind("HTTP/1.1 405 Method Not Allowed\r\n", 0), 0u) << answer;
}

TEST(MetricsServerTest, ARequestWithABodyIsRefused) {
  auto server = StartServer();
  const std::string sized =
      RawExchange(server->port(), "GET /metrics HTTP/1.1\r\nContent-Length: 5\r\n\r\nhello");
  EXPECT_EQ(sized.rfind("HTTP/1.1 413 Payload Too Large\r\n", 0), 0u) << sized;
  const std::string chunked = RawExchange(
      server->port(), "GET /metrics HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n");
  EXPECT_EQ(chunked.rfind("HTTP/1.1 413 Payload Too Large\r\n", 0), 0u) << chunked;
}

TEST(MetricsServerTest, IdleConnectionsBeyondTheCapDoNotDelayAScrape) {
  auto server = StartServer();  // default limits: 64 connections, 5 s to send a request
  std::vector<TcpProbe> idle = ConnectIdle(server->port(), 100);
  const auto start = Clock::now();
  auto metrics = HttpGetWithin(server->port(), "/metrics", milliseconds(2000));
  const auto took = Clock::now() - start;
  ASSERT_TRUE(metrics.has_value()) << "no answer within 2 s with 100 idle connections open";
  EXPECT_EQ(metrics->status_line, "HTTP/1.1 200 OK");
  EXPECT_EQ(metrics->body, kText);
  EXPECT_LT(took, milliseconds(2000));
  // 36 idle connections beyond the cap, then the scrape, each pushed out an older idle one.
  EXPECT_EQ(server->connections_refused(), 37u);
  EXPECT_EQ(server->connections_timed_out(), 0u);
}

TEST(MetricsServerTest, ANewConnectionOverTheCapPushesOutTheOldestIdleOne) {
  MetricsServer::Limits limits;
  limits.max_connections = 4;
  auto server = StartServer(limits);
  std::vector<TcpProbe> idle = ConnectIdle(server->port(), 4);
  TcpProbe newest = TcpProbe::Connect(server->port());
  ASSERT_TRUE(newest.connected());
  EXPECT_TRUE(idle[0].ReadUntilClosed(milliseconds(1000)).has_value()) << "oldest not closed";
  for (size_t i = 1; i < idle.size(); ++i) {
    EXPECT_FALSE(idle[i].ReadUntilClosed(milliseconds(50)).has_value()) << "probe " << i;
  }
  EXPECT_EQ(server->connections_refused(), 1u);
}

TEST(MetricsServerTest, AnIdleConnectionIsClosedAfterTheReadTimeout) {
  MetricsServer::Limits limits;
  limits.read_timeout = milliseconds(300);
  auto server = StartServer(limits);
  TcpProbe idle = TcpProbe::Connect(server->port());
  ASSERT_TRUE(idle.connected());
  const auto start = Clock::now();
  std::optional<std::string> answer = idle.ReadUntilClosed(milliseconds(3000));
  const auto took = Clock::now() - start;
  ASSERT_TRUE(answer.has_value()) << "still open after 3 s";
  EXPECT_EQ(*answer, "");
  EXPECT_GE(took, milliseconds(250));
  EXPECT_LT(took, milliseconds(1500));
  EXPECT_TRUE(Eventually([&] { return server->connections_timed_out() == 1; }, milliseconds(500)));
}

TEST(MetricsServerTest, ARequestDribbledInSlowerThanTheReadTimeoutIsCut) {
  MetricsServer::Limits limits;
  limits.read_timeout = milliseconds(300);
  auto server = StartServer(limits);
  TcpProbe slow = TcpProbe::Connect(server->port());
  ASSERT_TRUE(slow.Send("GET /metrics HTTP/1.1\r\n"));
  // A header line every 50 ms keeps the connection busy but never finishes the request.
  const auto start = Clock::now();
  bool closed = false;
  while (!closed && Clock::now() - start < milliseconds(3000)) {
    closed = !slow.Send("X-Slow: 1\r\n") || slow.ReadUntilClosed(milliseconds(50)).has_value();
  }
  const auto took = Clock::now() - start;
  EXPECT_TRUE(closed) << "a dribbling client held its connection for 3 s";
  EXPECT_LT(took, milliseconds(1500));
  EXPECT_TRUE(Eventually([&] { return server->connections_timed_out() == 1; }, milliseconds(500)));
}

TEST(MetricsServerTest, AnOversizedRequestHeaderIsRefusedAndTheServerServesOn) {
  MetricsServer::Limits limits;
  limits.max_request_bytes = 1024;
  auto server = StartServer(limits);
  const std::string big =
      "GET /metrics HTTP/1.1\r\nHost: x\r\nX-Pad: " + std::string(4000, 'a') + "\r\n\r\n";
  const std::string answer = RawExchange(server->port(), big);
  // 431, or a reset that swallowed it: never the metrics.
  EXPECT_TRUE(answer.empty() || answer.rfind("HTTP/1.1 431 ", 0) == 0) << answer.substr(0, 80);
  auto metrics = HttpGetWithin(server->port(), "/metrics", milliseconds(2000));
  ASSERT_TRUE(metrics.has_value());
  EXPECT_EQ(metrics->status_line, "HTTP/1.1 200 OK");
  EXPECT_EQ(metrics->body, kText);
}

TEST(MetricsServerTest, DestructionWithIdleConnectionsOpenReturnsWithinASecond) {
  auto server = StartServer();  // default limits: idle connections would live 5 s
  std::vector<TcpProbe> idle = ConnectIdle(server->port(), 50);
  idle.push_back(TcpProbe::Connect(server->port()));
  ASSERT_TRUE(idle.back().Send("GET /metr"));  // half a request
  // Non-fatal: the destructor is checked even when this fails.
  EXPECT_TRUE(HttpGetWithin(server->port(), "/healthz", milliseconds(2000)).has_value());
  std::promise<void> destroyed;
  std::future<void> done = destroyed.get_future();
  const auto start = Clock::now();
  std::thread destroyer([&] {
    server.reset();
    destroyed.set_value();
  });
  const bool in_time = done.wait_for(milliseconds(1000)) == std::future_status::ready;
  const auto took = Clock::now() - start;
  idle.clear();  // frees a destructor stuck on a client, so the test ends either way
  destroyer.join();
  EXPECT_TRUE(in_time) << "the destructor waited on idle clients";
  EXPECT_LT(took, milliseconds(1000));
}

}  // namespace
}  // namespace parasol
