#include "server/connection_watch.hpp"

#include <spdlog/spdlog.h>
#include <zmq_addon.hpp>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <algorithm>
#include <cstring>
#include <iterator>
#include <vector>

namespace parasol {

ConnectionWatch::ConnectionWatch(zmq::context_t& context, std::string label, bool curve,
                                 int64_t cap, std::chrono::milliseconds idle_timeout)
    : monitor_(context, zmq::socket_type::pair),
      label_(std::move(label)),
      curve_(curve),
      cap_(cap),
      idle_timeout_(idle_timeout) {}

ConnectionWatch::~ConnectionWatch() {
  stop_.store(true);
  if (thread_.joinable()) thread_.join();
}

Status ConnectionWatch::Start(zmq::socket_t& socket) {
  const std::string endpoint = "inproc://parasol-connections-" + label_;
  int events = ZMQ_EVENT_ACCEPTED | ZMQ_EVENT_DISCONNECTED;
  if (curve_) events |= ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL | ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL;
  try {
    if (zmq_socket_monitor(socket.handle(), endpoint.c_str(), events) != 0) {
      return Unavailable(std::string("cannot watch connections: ") + zmq_strerror(zmq_errno()));
    }
    monitor_.set(zmq::sockopt::linger, 0);
    monitor_.connect(endpoint);
  } catch (const zmq::error_t& e) {
    return Unavailable(std::string("cannot watch connections: ") + e.what());
  }
  thread_ = std::thread([this] { Loop(); });
  return Status::Ok();
}

void ConnectionWatch::HandleEvent() {
  std::vector<zmq::message_t> event;
  if (!zmq::recv_multipart(monitor_, std::back_inserter(event), zmq::recv_flags::dontwait)) return;
  if (event.size() < 2 || event[0].size() < 6) return;
  uint16_t id;
  uint32_t value;
  std::memcpy(&id, event[0].data(), 2);
  std::memcpy(&value, static_cast<const char*>(event[0].data()) + 2, 4);
  if (id == ZMQ_EVENT_ACCEPTED) {
    ++accepted_;
    if (cap_ > 0 && connections_.load() >= cap_) {
      // Past the cap: shut (not closed: the descriptor stays ZeroMQ's, which closes it on the
      // end of the stream it now reads, and says DISCONNECTED).
      ++connections_;
      ++refused_over_cap_;
      ::shutdown(static_cast<int>(value), SHUT_RDWR);
      uint64_t left_out = 0;
      if (cap_log_.Allow(std::chrono::steady_clock::now(), &left_out)) {
        spdlog::warn("{}: {} connections are open, its cap (the open-file limit less what it "
                     "keeps for its own files); a new one from {} is shut{}",
                     label_, cap_, event[1].to_string(),
                     left_out ? " (and " + std::to_string(left_out) + " more since)" : "");
      }
      return;
    }
    ++connections_;
    // Its descriptor's number may have been another connection's: everything is new.
    Connection c;
    c.last_seen = std::chrono::steady_clock::now();
    c.peer_length = sizeof(c.peer);
    if (::getpeername(static_cast<int>(value), reinterpret_cast<sockaddr*>(&c.peer),
                      &c.peer_length) != 0) {
      c.peer_length = 0;  // already gone: never shut by number
    }
    std::lock_guard<std::mutex> lock(mutex_);
    open_[static_cast<int>(value)] = c;
    return;
  }
  if (id == ZMQ_EVENT_DISCONNECTED) {
    if (connections_.load() > 0) --connections_;
    std::lock_guard<std::mutex> lock(mutex_);
    open_.erase(static_cast<int>(value));
    return;
  }
  ++handshake_failures_;
  std::string why = "no detail";
  if (id == ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL) {
    why = value == ZMQ_PROTOCOL_ERROR_ZMTP_MECHANISM_MISMATCH ? "mechanism mismatch"
                                                              : "protocol error " +
                                                                    std::to_string(value);
  }
  uint64_t left_out = 0;
  if (!log_.Allow(std::chrono::steady_clock::now(), &left_out)) return;
  spdlog::warn("{}: refused a connection on {}: the handshake failed ({}): a client without "
               "CURVE, or with the wrong server key{}",
               label_, event[1].to_string(), why,
               left_out ? " (and " + std::to_string(left_out) + " more refusals since)" : "");
}

void ConnectionWatch::Seen(int fd, bool worker) {
  if (fd < 0) return;
  const auto now = std::chrono::steady_clock::now();
  std::lock_guard<std::mutex> lock(mutex_);
  Connection& c = open_[fd];  // (a message may come before its ACCEPTED event is read)
  c.last_seen = now;
  c.worker = c.worker || worker;
}

void ConnectionWatch::ShutIdle(std::chrono::steady_clock::time_point now) {
  uint64_t shut = 0;
  std::string example;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    for (auto it = open_.begin(); it != open_.end();) {
      Connection& c = it->second;
      if (c.worker || c.shut || c.peer_length == 0 || now - c.last_seen <= idle_timeout_) {
        ++it;
        continue;
      }
      // Still the connection accepted under this number? Else ZeroMQ closed it (its
      // DISCONNECTED event is on its way) and the number may be anything's now.
      sockaddr_storage peer{};
      socklen_t length = sizeof(peer);
      if (::getpeername(it->first, reinterpret_cast<sockaddr*>(&peer), &length) != 0 ||
          length != c.peer_length || std::memcmp(&peer, &c.peer, length) != 0) {
        it = open_.erase(it);
        continue;
      }
      ::shutdown(it->first, SHUT_RDWR);
      c.shut = true;
      ++shut;
      if (example.empty()) {
        char host[INET6_ADDRSTRLEN] = "?";
        int port = 0;
        if (peer.ss_family == AF_INET) {
          const auto* in = reinterpret_cast<const sockaddr_in*>(&peer);
          ::inet_ntop(AF_INET, &in->sin_addr, host, sizeof(host));
          port = ntohs(in->sin_port);
        } else if (peer.ss_family == AF_INET6) {
          const auto* in = reinterpret_cast<const sockaddr_in6*>(&peer);
          ::inet_ntop(AF_INET6, &in->sin6_addr, host, sizeof(host));
          port = ntohs(in->sin6_port);
        }
        example = std::string(host) + ":" + std::to_string(port);
      }
      ++it;
    }
  }
  if (shut == 0) return;
  idle_shut_ += shut;
  uint64_t left_out = 0;
  if (!idle_log_.Allow(now, &left_out)) return;
  spdlog::info("{}: shut {} connection{} that sent nothing for {} s and are no worker's (one "
               "from {}){}",
               label_, shut, shut == 1 ? "" : "s", idle_timeout_.count() / 1000.0, example,
               left_out ? " (and " + std::to_string(left_out) + " such lines not logged)" : "");
}

void ConnectionWatch::Loop() {
  zmq::pollitem_t items[] = {{monitor_.handle(), 0, ZMQ_POLLIN, 0}};
  auto last_sweep = std::chrono::steady_clock::now();
  const auto sweep_every = std::min<std::chrono::milliseconds>(
      std::chrono::milliseconds(1000), std::max(idle_timeout_ / 4, std::chrono::milliseconds(10)));
  while (!stop_.load()) {
    try {
      zmq::poll(items, 1, std::chrono::milliseconds(100));
      if (items[0].revents & ZMQ_POLLIN) HandleEvent();
      const auto now = std::chrono::steady_clock::now();
      if (idle_timeout_.count() > 0 && now - last_sweep >= sweep_every) {
        last_sweep = now;
        ShutIdle(now);
      }
    } catch (const zmq::error_t& e) {
      if (e.num() == ETERM) return;
      spdlog::warn("{}: connection watch: {}", label_, e.what());
    }
  }
}

}  // namespace parasol
