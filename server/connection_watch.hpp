// ConnectionWatch: how many peers are connected to a shard's socket, from ZeroMQ's socket
// monitor (accepted and disconnected connections), and, with CURVE, the handshakes that failed
// before authentication (a client without CURVE, or with the wrong server key), each logged at
// a rate. A socket has one monitor: this is it.
//
// It also caps the connections: one accepted past `cap` is shut down at once (its descriptor
// shut, so ZeroMQ closes it), which keeps the descriptors between the cap and the open-file
// limit for what the shard itself opens: checkpoint files, the metrics server's connections,
// a background checkpoint's pipe. The connections already open, the job's workers', go on.
//
// And it shuts idle connections: one that is not a job worker's (Seen() says which) and has
// sent nothing for `idle_timeout` is shut as one past the cap is, so that peers which connect
// and then only answer ZeroMQ's heartbeats do not keep their descriptors. Before it shuts a
// descriptor it checks that it is still the connection it watched (getpeername() against the
// address read when it was accepted): ZeroMQ may have closed it and the number been reused.
// Runs on its own thread; every method but Start() may be called from any thread.
#pragma once

#include <sys/socket.h>

#include <atomic>
#include <chrono>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>

#include <zmq.hpp>

#include "common/log_limiter.hpp"
#include "common/status.hpp"

namespace parasol {

class ConnectionWatch {
 public:
  // `cap`: the most connections open at once (0: no cap). `idle_timeout`: how long a
  // connection that is not a worker's may send nothing (zero: forever).
  ConnectionWatch(zmq::context_t& context, std::string label, bool curve, int64_t cap = 0,
                  std::chrono::milliseconds idle_timeout = std::chrono::milliseconds(0));
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
  uint64_t idle_shut() const { return idle_shut_.load(); }

  // A message came over descriptor `fd` (ZMQ_SRCFD); `worker`: its sender is a job worker,
  // whose connection is never shut for being idle (a worker may compute for long).
  void Seen(int fd, bool worker);
 private:
  void Loop();
  void HandleEvent();
  // Shuts the connections idle for longer than idle_timeout_.
  void ShutIdle(std::chrono::steady_clock::time_point now);

  // A connection open now, by descriptor.
  struct Connection {
    std::chrono::steady_clock::time_point last_seen;
    sockaddr_storage peer{};  // its address when accepted (peer_length 0: not read yet)
    socklen_t peer_length = 0;
    bool worker = false;
    bool shut = false;  // shut for being idle; ZeroMQ says DISCONNECTED when it closes it
  };

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
  std::chrono::milliseconds idle_timeout_;
  std::atomic<uint64_t> idle_shut_{0};
  LogLimiter idle_log_;  // the watch's thread only
  std::mutex mutex_;  // guards open_
  std::unordered_map<int, Connection> open_;
  std::thread thread_;
};

}  // namespace parasol
