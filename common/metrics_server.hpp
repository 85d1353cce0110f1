// MetricsServer: a small HTTP endpoint (Boost.Beast, asynchronous, on its own thread) serving
//   GET /metrics  the latest text the process published, in Prometheus text format
//   GET /healthz  200 "ok" while the process says it is healthy, 503 otherwise
// Any other target is 404, any other method 405. One request per connection (the answer says
// `Connection: close`); a request may not carry a body (413) and its header is bounded (431).
//
// The owner publishes a fresh snapshot now and then; requests never touch the owner's state.
// The port faces the network, so no client can hold it: each connection has a read and a
// write time-out, at most `max_connections` are open at once, and a connection beyond the cap
// pushes out the oldest one still waiting for its request (or, when none waits, is closed at
// once). Idle or slow clients delay neither other clients nor the destructor.
//
// Thread-safety: Publish(), SetHealthy() and the counters from any thread; Start() once, from
// the owner.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <iterator>
#include <string>
#include <thread>

#include "common/status.hpp"

namespace parasol {

class MetricsServer {
 public:
  struct Limits {
    // A client must deliver its whole request header within this time of connecting.
    std::chrono::milliseconds read_timeout{5000};
    // ... and take the whole answer within this time of its request.
    std::chrono::milliseconds write_timeout{5000};
    // Connections open at once; one more pushes out the oldest that has not sent its request.
    size_t max_connections = 64;
    // Request line plus header fields; a larger request is answered 431 and closed.
    size_t max_request_bytes = 8 * 1024;
  };

  // `port` 0: the kernel picks one (see port()).
  MetricsServer(std::string host, uint16_t port, Limits limits);
  MetricsServer(std::string host, uint16_t port);  // default Limits
  // Stops at once: open connections are closed, answers in flight are dropped.
  ~MetricsServer();
  MetricsServer(const MetricsServer&) = delete;
  MetricsServer& operator=(const MetricsServer&) = delete;

  // Binds and starts serving. REQUIRES: called at most once.
  Status Start();
  void Publish(std::string text);
  void SetHealthy(bool healthy);
  // A line /healthz adds after "ok" or "unhealthy" (a shard loading its checkpoint says how
  // far it is); empty: none.
  void SetHealthNote(std::string note);

  // The bound port (after Start), or the port asked for.
  uint16_t port() const;
  // Requests answered (any status, the answer fully sent).
  uint64_t requests_served() const;
  // Connections closed unanswered because `max_connections` were open: new ones closed at
  // once, and waiting ones pushed out by a newer one.
  uint64_t connections_refused() const;
  // Connections closed because the client was slower than read_timeout or write_timeout.
  uint64_t connections_timed_out() const;

 private:
  struct Impl;

  std::string host_;
  std::unique_ptr<Impl> impl_;
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

// Durations in seconds, counted in fixed buckets (1 ms to 10 s), written as a Prometheus
// histogram (NAME_bucket{le}, NAME_sum, NAME_count).
class LatencyHistogram {
 public:
  static constexpr double kBuckets[] = {0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5, 10};
  void Observe(double seconds);
  // `labels`: the sample's other labels ("" or `a="b"`).
  void Write(PrometheusText& t, const std::string& name, const std::string& help,
             const std::string& labels) const;

 private:
  uint64_t counts_[std::size(kBuckets) + 1] = {};
  double sum_ = 0;
};

// This process's resident memory (process_resident_memory_bytes) and CPU time
// (process_cpu_seconds_total), as Prometheus' client libraries name them.
void WriteProcessMetrics(PrometheusText& t, const std::string& labels);

}  // namespace parasol
