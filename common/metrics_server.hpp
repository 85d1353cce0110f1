// MetricsServer: a small HTTP endpoint (Boost.Beast on its own thread) serving
//   GET /metrics  the latest text the process published, in Prometheus text format
//   GET /healthz  200 "ok" while the process says it is healthy, 503 otherwise
// The owner publishes a fresh snapshot now and then; requests never touch the owner's state.
// Thread-safety: Publish() and SetHealthy() from any thread.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "common/status.hpp"

namespace parasol {

class MetricsServer {
 public:
  MetricsServer(std::string host, uint16_t port);
  ~MetricsServer();
  MetricsServer(const MetricsServer&) = delete;
  MetricsServer& operator=(const MetricsServer&) = delete;

  Status Start();
  void Publish(std::string text);
  void SetHealthy(bool healthy) { healthy_.store(healthy); }
  uint64_t requests_served() const { return served_.load(); }

 private:
  struct Impl;
  void Accept();

  std::string host_;
  uint16_t port_;
  std::unique_ptr<Impl> impl_;
  std::mutex mu_;
  std::string text_;  // guarded by mu_
  std::atomic<bool> healthy_{true};
  std::atomic<uint64_t> served_{0};
  std::thread thread_;
};

// Prometheus text helpers: "# TYPE name type" once, then samples.
class PrometheusText {
 public:
  void Type(const std::string& name, const char* type, const std::string& help);
  void Sample(const std::string& name, double value, const std::string& labels = "");
  const std::string& str() const { return out_; }

 private:
  std::string out_;
};

}  // namespace parasol
