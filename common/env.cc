#include "common/env.hpp"

#include <zmq_addon.hpp>

#include <atomic>
#include <cstdio>
#include <cstring>
#include <iterator>
#include <random>
#include <thread>

#include "common/transport.hpp"

namespace parasol {
namespace {

// One DEALER socket per shard, each with a monitor whose HANDSHAKE_SUCCEEDED events tell
// reconnections.
class ZmqShardLinks final : public ShardLinks {
 public:
  ZmqShardLinks(const Manifest& manifest, uint32_t worker, const CurveKeyPair* keys,
                std::vector<std::string> server_public_keys)
      : servers_(manifest.cluster.servers),
        worker_(worker),
        curve_(keys != nullptr),
        server_public_keys_(std::move(server_public_keys)),
        context_(1) {
    if (keys) keys_ = *keys;
    const size_t n = servers_.size();
    for (size_t s = 0; s < n; ++s) shards_.emplace_back(context_, zmq::socket_type::dealer);
    monitors_.resize(n);
    connects_.assign(n, 0);
    reconnected_.assign(n, false);
    readable_.assign(n, true);
  }

  ~ZmqShardLinks() override {
    for (auto& m : monitors_) {
      if (m) m.close();
    }
    // Frames may still borrow memory of callers; drop them now, and end the context (it returns
    // once its I/O threads have let go of every frame).
    for (auto& s : shards_) {
      s.set(zmq::sockopt::linger, 0);
      s.close();
    }
    context_.close();
  }

  Status Open(uint32_t s) override {
    const ServerAddress& a = servers_[s];
    try {
      if (shards_[s]) {
        shards_[s].set(zmq::sockopt::linger, 0);
        shards_[s].close();
      }
      shards_[s] = zmq::socket_t(context_, zmq::socket_type::dealer);
      ConfigureDataSocket(shards_[s]);
      if (curve_) {
        shards_[s].set(zmq::sockopt::curve_serverkey, server_public_keys_[s]);
        shards_[s].set(zmq::sockopt::curve_publickey, keys_.public_key);
        shards_[s].set(zmq::sockopt::curve_secretkey, keys_.secret_key);
      }
      Watch(s);
      shards_[s].connect(TcpEndpoint(a.host, a.port));
    } catch (const zmq::error_t& e) {
      return Unavailable("worker " + std::to_string(worker_) + ": cannot connect to shard " +
                         std::to_string(s) + " at " + a.ToString() + ": " + e.what());
    }
    return Status::Ok();
  }

  Status Send(uint32_t s, std::vector<zmq::message_t>& frames, bool dontwait) override {
    return SendFrames(shards_[s], frames, dontwait);
  }

  Status Wait(std::chrono::milliseconds wait) override {
    items_.clear();
    for (auto& s : shards_) items_.push_back({s.handle(), 0, ZMQ_POLLIN, 0});
    try {
      zmq::poll(items_.data(), items_.size(), wait);
    } catch (const zmq::error_t& e) {
      if (e.num() != EINTR) return Unavailable(std::string("poll failed: ") + e.what());
    }
    for (size_t s = 0; s < shards_.size(); ++s) {
      readable_[s] = (items_[s].revents & ZMQ_POLLIN) != 0;
    }
    PollMonitors();
    return Status::Ok();
  }

  Result<bool> Receive(uint32_t s, std::vector<zmq::message_t>* frames) override {
    if (!readable_[s]) return false;
    Result<bool> got = RecvFramesInto(shards_[s], /*dontwait=*/true, frames);
    if (got.ok() && !*got) readable_[s] = false;
    return got;
  }

  bool TakeReconnect(uint32_t s) override {
    const bool r = reconnected_[s];
    reconnected_[s] = false;
    return r;
  }

  int Mechanism(uint32_t s) const override {
    return const_cast<zmq::socket_t&>(shards_[s]).get(zmq::sockopt::mechanism);
  }

 private:
  void Watch(uint32_t s) {
    if (monitors_[s]) monitors_[s].close();
    char endpoint[96];
    std::snprintf(endpoint, sizeof(endpoint), "inproc://parasol-client-%p-%u-%d",
                  static_cast<void*>(this), s, opened_++);
    // A connection counts once its handshake succeeded: one the shard refuses at the handshake
    // (a client without CURVE, or with a key it does not know) is made again and again, and
    // would otherwise stretch the deadlines of the requests waiting on it for ever.
    if (zmq_socket_monitor(shards_[s].handle(), endpoint, ZMQ_EVENT_HANDSHAKE_SUCCEEDED) != 0) {
      return;  // without the monitor, restarts are still found by resends
    }
    monitors_[s] = zmq::socket_t(context_, zmq::socket_type::pair);
    monitors_[s].set(zmq::sockopt::linger, 0);
    monitors_[s].connect(endpoint);
  }

  void PollMonitors() {
    for (size_t s = 0; s < monitors_.size(); ++s) {
      if (!monitors_[s]) continue;
      while (true) {
        std::vector<zmq::message_t> event;
        auto n = zmq::recv_multipart(monitors_[s], std::back_inserter(event),
                                     zmq::recv_flags::dontwait);
        if (!n || event.empty() || event[0].size() < 2) break;
        uint16_t id;
        std::memcpy(&id, event[0].data(), 2);
        if (id == ZMQ_EVENT_HANDSHAKE_SUCCEEDED && ++connects_[s] > 1) reconnected_[s] = true;
      }
    }
  }

  const std::vector<ServerAddress> servers_;
  const uint32_t worker_;
  const bool curve_;
  CurveKeyPair keys_;
  const std::vector<std::string> server_public_keys_;
  zmq::context_t context_;
  std::vector<zmq::socket_t> shards_;
  std::vector<zmq::socket_t> monitors_;
  std::vector<int> connects_;
  std::vector<bool> reconnected_;
  std::vector<bool> readable_;
  std::vector<zmq::pollitem_t> items_;
  int opened_ = 0;
};

class RealEnv final : public Env {
 public:
  Clock::time_point Now() override { return Clock::now(); }
  uint64_t Random64() override {
    std::random_device rd;
    return rd() | (uint64_t{rd()} << 32);
  }
  Result<std::unique_ptr<ShardLinks>> LinkShards(
      const Manifest& manifest, uint32_t worker, const CurveKeyPair* keys,
      const std::vector<std::string>& server_public_keys) override {
    return std::unique_ptr<ShardLinks>(
        new ZmqShardLinks(manifest, worker, keys, server_public_keys));
  }
};

// A thread of its own; joined by Wait() or when dropped.
class ThreadTask final : public AsideTask {
 public:
  explicit ThreadTask(std::function<void()> work)
      : thread_([this, work = std::move(work)] {
          work();
          done_.store(true, std::memory_order_release);
        }) {}
  ~ThreadTask() override { Wait(); }
  bool Done() override { return done_.load(std::memory_order_acquire); }
  void Wait() override {
    if (thread_.joinable()) thread_.join();
  }

 private:
  std::atomic<bool> done_{false};
  std::thread thread_;  // after done_: started once it exists
};

}  // namespace

std::unique_ptr<AsideTask> Env::RunAside(std::function<void()> work) {
  return std::make_unique<ThreadTask>(std::move(work));
}

Env* Env::Real() {
  static RealEnv env;
  return &env;
}

}  // namespace parasol
