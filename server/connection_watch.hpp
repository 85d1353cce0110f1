// ConnectionWatch: how many peers are connected to a shard's socket, from ZeroMQ's socket
// monitor (accepted and disconnected connections), and, with CURVE, the handshakes that failed
// before authentication (a client without CURVE, or with the wrong server key), each logged at
// a rate. A socket has one monitor: this is it.
//
// It caps the connections. When one is accepted at the cap, a connection that is no job
// worker's is shut to make room: the oldest of those that never sent a well-formed request,
// else the one quiet longest. A restarted worker or a tool gets in past a crowd of idle peers
// (which reconnect in vain); only when every connection is a worker's is the new one shut. The cap keeps the descriptors between
// it and the open-file limit for what the shard itself opens: checkpoint files, the metrics
// server's connections, a background checkpoint's pipe.
//
// And it shuts idle connections: one that is not a job worker's (Seen() says which) and has
// sent no well-formed request for `idle_timeout` is shut, so that peers which connect and
// then only answer ZeroMQ's heartbeats (or send junk) do not keep their descriptors.
//
// A connection is shut (shutdown(), not close(): the descriptor stays ZeroMQ's, which closes
// it on the end of the stream and says DISCONNECTED) only after checking that its descriptor
// is still that connection: a socket on this shard's port whose peer is the address read when
// it was accepted. ZeroMQ may have closed it and the number been reused meanwhile.
// Runs on its own thread; every method but Start() may be called from any thread.
#pragma once

#include <sys/socket.h>

#include <atomic>
#include <chrono>
#include <cstdint>
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
  // connection that is not a worker's may send nothing (zero: forever). `port`: the port the
  // watched socket listens on (0: not checked before a connection is shut).
  ConnectionWatch(zmq::context_t& context, std::string label, bool curve, int64_t cap = 0,
                  std::chrono::milliseconds idle_timeout = std::chrono::milliseconds(0),
                  uint16_t port = 0);
  ~ConnectionWatch();
  ConnectionWatch(const ConnectionWatch&) = delete;
  ConnectionWatch& operator=(const ConnectionWatch&) = delete;

  // Watches `socket` (before it binds, so that no connection is missed).
  Status Start(zmq::socket_t& socket);
  // Connections open now: accepted and not yet disconnected.
  int64_t connections() const { return connections_.load(); }
  uint64_t accepted() const { return accepted_.load(); }
  uint64_t handshake_failures() const { return handshake_failures_.load(); }
  // New connections shut at the cap (every open one a worker's).
  uint64_t refused_over_cap() const { return refused_over_cap_.load(); }
  // Connections shut at the cap to make room for a new one.
  uint64_t evicted_over_cap() const { return evicted_over_cap_.load(); }
  int64_t cap() const { return cap_; }
  uint64_t idle_shut() const { return idle_shut_.load(); }

  // A well-formed request came over descriptor `fd` (ZMQ_SRCFD); `worker`: its sender is a
  // job worker, whose connection is never shut for being idle (a worker may compute for long)
  // nor to make room.
  void Seen(int fd, bool worker);

 private:
  // A connection open now, by descriptor.
  struct Connection {
    std::chrono::steady_clock::time_point last_seen;
    sockaddr_storage peer{};  // its address when accepted (peer_length 0: not read yet)
    socklen_t peer_length = 0;
    bool worker = false;
    bool heard = false;  // it sent a well-formed request
    bool shut = false;  // shut by this watch; ZeroMQ says DISCONNECTED when it closes it
  };

  void Loop();
  void HandleEvent();
  // A connection at the cap: room is made, or it is shut.
  void MakeRoom(int fd, const Connection& newcomer);
  // Shuts the connections idle for longer than idle_timeout_.
  void ShutIdle(std::chrono::steady_clock::time_point now);
  // Reads the peer of `fd` into *c; false when `fd` is no connection to this shard's port.
  bool ReadPeer(int fd, Connection* c) const;
  // Shuts `fd` when it is still the connection `c` describes.
  bool ShutIfSame(int fd, const Connection& c) const;
  static std::string AddressText(const Connection& c);

  zmq::socket_t monitor_;
  std::string label_;
  bool curve_;
  int64_t cap_;
  std::chrono::milliseconds idle_timeout_;
  uint16_t port_;
  std::atomic<bool> stop_{false};
  std::atomic<uint64_t> refused_over_cap_{0};
  std::atomic<uint64_t> evicted_over_cap_{0};
  std::atomic<int64_t> connections_{0};
  std::atomic<uint64_t> accepted_{0};
  std::atomic<uint64_t> handshake_failures_{0};
  std::atomic<uint64_t> idle_shut_{0};
  // The watch's thread only:
  LogLimiter log_;
  LogLimiter cap_log_;
  LogLimiter idle_log_;
  std::mutex mutex_;  // guards open_
  std::unordered_map<int, Connection> open_;
  std::thread thread_;
};

}  // namespace parasol
