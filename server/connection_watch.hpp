// ConnectionWatch: how many peers are connected to a shard's socket, from ZeroMQ's socket
// monitor (accepted and disconnected connections), and, with CURVE, the handshakes that failed
// before authentication (a client without CURVE, or with the wrong server key), each logged at
// a rate. A socket has one monitor: this is it.
//
// It also caps the connections: one accepted past `cap` is shut down at once (its descriptor
// shut, so ZeroMQ closes it), which keeps the descriptors between the cap and the open-file
// limit for what the shard itself opens: checkpoint files, the metrics server's connections,
// a background checkpoint's pipe. The connections already open, the job's workers', go on.
// Runs on its own thread; connections() and handshake_failures() may be read from any thread.
#pragma once

#include <atomic>
#include <string>
#include <thread>

#include <zmq.hpp>

#include "common/log_limiter.hpp"
#include "common/status.hpp"

namespace parasol {

class ConnectionWatch {
 public:
  // `cap`: the most connections open at once (0: no cap).
  ConnectionWatch(zmq::context_t& context, std::string label, bool curve, int64_t cap = 0);
  ~ConnectionWatch();
  ConnectionWatch(const ConnectionWatch&) = delete;
  ConnectionWatch& operator=(const ConnectionWatch&) = delete;

  // Watches `socket` (before it binds, so that no connection is missed).
  Status Start(zmq::socket_t& socket);
  // Connections open now: accepted and not yet disconnected.
  int64_t connections() const { return connections_.load(); }
  uint64_t accepted() const { return accepted_.load(); }
  uint64_t handshake_failures() const { return handshake_failures_.load(); }
  uint64_t refused_over_cap() const { return refused_over_cap_.load(); }
  int64_t cap() const { return cap_; }

 private:
  void Loop();
  void HandleEvent();

  zmq::socket_t monitor_;
  std::string label_;
  bool curve_;
  int64_t cap_;
  std::atomic<bool> stop_{false};
  std::atomic<uint64_t> refused_over_cap_{0};
  LogLimiter cap_log_;
  std::atomic<int64_t> connections_{0};
  std::atomic<uint64_t> accepted_{0};
  std::atomic<uint64_t> handshake_failures_{0};
  LogLimiter log_;  // the watch's thread only
  std::thread thread_;
};

}  // namespace parasol
