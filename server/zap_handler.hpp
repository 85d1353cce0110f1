// ZapHandler: the ZeroMQ authentication (ZAP) handler of a shard running CURVE. It admits a
// connection only when the client's public key is in the allowed set, and logs every refusal.
// An admitted connection's User-Id is the client's Z85 public key: ZeroMQ attaches it to each
// of its messages (the "User-Id" property), which WorkerKeyBinding checks.
// Runs on its own thread, on a REP socket at inproc://zeromq.zap.01 of the shard's context;
// it must exist before the shard's socket binds.
#pragma once

#include <atomic>
#include <set>
#include <string>
#include <thread>

#include <zmq.hpp>

#include "common/log_limiter.hpp"
#include "common/status.hpp"

namespace parasol {

class ZapHandler {
 public:
  ZapHandler(zmq::context_t& context, std::set<std::string> allowed_z85, std::string label);
  ~ZapHandler();
  ZapHandler(const ZapHandler&) = delete;
  ZapHandler& operator=(const ZapHandler&) = delete;

  // Starts answering ZAP requests (`router`'s failed handshakes, of clients without CURVE at
  // all, are ConnectionWatch's).
  Status Start(zmq::socket_t& router);
  uint64_t refusals() const { return refusals_.load(); }
  uint64_t admissions() const { return admissions_.load(); }

 private:
  void Loop();
  void HandleZap();

  zmq::socket_t socket_;
  std::set<std::string> allowed_;
  std::string label_;
  std::atomic<bool> stop_{false};
  std::atomic<uint64_t> refusals_{0};
  LogLimiter refusal_log_;  // the handler's thread only: refusals are rate-limited in the log
  std::atomic<uint64_t> admissions_{0};
  std::thread thread_;
};

}  // namespace parasol
