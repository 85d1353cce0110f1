#include "server/connection_watch.hpp"

#include <spdlog/spdlog.h>
#include <zmq_addon.hpp>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <algorithm>
#include <cstring>
#include <iterator>
#include <new>
#include <vector>

#include "common/fatal.hpp"

namespace parasol {

ConnectionWatch::ConnectionWatch(zmq::context_t& context, std::string label, bool curve,
                                 int64_t cap, std::chrono::milliseconds idle_timeout,
                                 uint16_t port)
    : monitor_(context, zmq::socket_type::pair),
      label_(std::move(label)),
      curve_(curve),
      cap_(cap),
      idle_timeout_(idle_timeout),
      port_(port) {}

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
    // No event may be lost at a burst of connections (a count that drifts): the pipe holds
    // ZeroMQ's own 1,000 events plus this many.
    monitor_.set(zmq::sockopt::rcvhwm, 1 << 20);
    monitor_.connect(endpoint);
  } catch (const zmq::error_t& e) {
    return Unavailable(std::string("cannot watch connections: ") + e.what());
  }
  thread_ = std::thread([this] { Loop(); });
  return Status::Ok();
}

bool ConnectionWatch::ReadPeer(int fd, Connection* c) const {
  sockaddr_storage local{};
  socklen_t local_length = sizeof(local);
  if (::getsockname(fd, reinterpret_cast<sockaddr*>(&local), &local_length) != 0) return false;
  if (port_ != 0) {
    uint16_t port = 0;
    if (local.ss_family == AF_INET) {
      port = ntohs(reinterpret_cast<const sockaddr_in*>(&local)->sin_port);
    } else if (local.ss_family == AF_INET6) {
      port = ntohs(reinterpret_cast<const sockaddr_in6*>(&local)->sin6_port);
    }
    if (port != port_) return false;  // another socket of this process (a metrics client)
  }
  c->peer_length = sizeof(c->peer);
  if (::getpeername(fd, reinterpret_cast<sockaddr*>(&c->peer), &c->peer_length) != 0) {
    c->peer_length = 0;
    return false;
  }
  return true;
}

bool ConnectionWatch::ShutIfSame(int fd, const Connection& c) const {
  Connection now;
  if (c.peer_length == 0 || !ReadPeer(fd, &now) || now.peer_length != c.peer_length ||
      std::memcmp(&now.peer, &c.peer, c.peer_length) != 0) {
    return false;
  }
  ::shutdown(fd, SHUT_RDWR);
  return true;
}

std::string ConnectionWatch::AddressText(const Connection& c) {
  char host[INET6_ADDRSTRLEN] = "?";
  int port = 0;
  if (c.peer.ss_family == AF_INET) {
    const auto* in = reinterpret_cast<const sockaddr_in*>(&c.peer);
    ::inet_ntop(AF_INET, &in->sin_addr, host, sizeof(host));
    port = ntohs(in->sin_port);
  } else if (c.peer.ss_family == AF_INET6) {
    const auto* in = reinterpret_cast<const sockaddr_in6*>(&c.peer);
    ::inet_ntop(AF_INET6, &in->sin6_addr, host, sizeof(host));
    port = ntohs(in->sin6_port);
  }
  return std::string(host) + ":" + std::to_string(port);
}

void ConnectionWatch::HandleEvent() {
  std::vector<zmq::message_t> event;
  if (!zmq::recv_multipart(monitor_, std::back_inserter(event), zmq::recv_flags::dontwait)) return;
  if (event.size() < 2 || event[0].size() < 6) return;
  uint16_t id;
  uint32_t value;
  std::memcpy(&id, event[0].data(), 2);
  std::memcpy(&value, static_cast<const char*>(event[0].data()) + 2, 4);
  const int fd = static_cast<int>(value);
  if (id == ZMQ_EVENT_ACCEPTED) {
    ++accepted_;
    ++connections_;
    Connection c;
    c.last_seen = std::chrono::steady_clock::now();
    const bool there = ReadPeer(fd, &c);  // else gone already (or the number reused)
    {
      std::lock_guard<std::mutex> lock(mutex_);
      auto it = open_.find(fd);
      // A request handled before this event left an entry: its peer was read then (Seen), or
      // not at all when the connection was gone by that time.
      if (it != open_.end() && there && it->second.peer_length == c.peer_length &&
          std::memcmp(&it->second.peer, &c.peer, c.peer_length) == 0) {
        c.worker = it->second.worker;  // its first request was handled before this event
        c.heard = it->second.heard;
        c.last_seen = it->second.last_seen;
      }
      open_[fd] = c;
    }
    if (cap_ > 0 && connections_.load() > cap_ && there) MakeRoom(fd, c);
    return;
  }
  if (id == ZMQ_EVENT_DISCONNECTED) {
    if (connections_.load() > 0) --connections_;
    std::lock_guard<std::mutex> lock(mutex_);
    open_.erase(fd);
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

void ConnectionWatch::MakeRoom(int fd, const Connection& newcomer) {
  // A connection that is no worker's, the new one aside (see the header for which); tried
  // until one is still what it was (a few at most: those closed meanwhile go).
  for (int attempt = 0; attempt < 8; ++attempt) {
    int victim = -1;
    Connection v;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      for (const auto& [other, c] : open_) {
        if (other == fd || c.worker || c.shut || c.peer_length == 0) continue;
        // Never heard from before heard from; then the quietest (or oldest).
        if (victim < 0 || (!c.heard && v.heard) ||
            (c.heard == v.heard && c.last_seen < v.last_seen)) {
          victim = other;
          v = c;
        }
      }
      if (victim >= 0) open_[victim].shut = true;
    }
    if (victim < 0) break;
    if (!ShutIfSame(victim, v)) {
      std::lock_guard<std::mutex> lock(mutex_);
      open_.erase(victim);  // not what it was: ZeroMQ's DISCONNECTED is on its way
      continue;
    }
    ++evicted_over_cap_;
    uint64_t left_out = 0;
    if (cap_log_.Allow(std::chrono::steady_clock::now(), &left_out)) {
      spdlog::warn("{}: {} connections are open, its cap (server.max_connections, or the "
                   "open-file limit less what it keeps for its own files); to let one from {} "
                   "in, the one from {}, no worker's and {}, is shut{}",
                   label_, cap_, AddressText(newcomer), AddressText(v),
                   v.heard ? "quiet longest" : "never heard from",
                   left_out ? " (and " + std::to_string(left_out) + " more since)" : "");
    }
    return;
  }
  // Every other connection is a worker's: the new one is shut.
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = open_.find(fd);
    if (it != open_.end()) it->second.shut = true;
  }
  if (!ShutIfSame(fd, newcomer)) return;
  ++refused_over_cap_;
  uint64_t left_out = 0;
  if (cap_log_.Allow(std::chrono::steady_clock::now(), &left_out)) {
    spdlog::warn("{}: {} connections are open, its cap, all of them workers'; a new one from {} "
                 "is shut{}",
                 label_, cap_, AddressText(newcomer),
                 left_out ? " (and " + std::to_string(left_out) + " more since)" : "");
  }
}

void ConnectionWatch::Seen(int fd, bool worker) {
  if (fd < 0) return;
  const auto now = std::chrono::steady_clock::now();
  std::lock_guard<std::mutex> lock(mutex_);
  auto [it, added] = open_.try_emplace(fd);
  Connection& c = it->second;
  // A request may come before its ACCEPTED event is read: the peer is read now, so that the
  // event finds this entry to be its connection's and keeps what it says.
  if (added) ReadPeer(fd, &c);
  c.last_seen = now;
  c.heard = true;
  c.worker = c.worker || worker;
}

void ConnectionWatch::ShutIdle(std::chrono::steady_clock::time_point now) {
  // Chosen under the lock, checked and shut outside it (system calls).
  std::vector<std::pair<int, Connection>> idle;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    for (auto& [fd, c] : open_) {
      if (c.worker || c.shut || c.peer_length == 0 || now - c.last_seen <= idle_timeout_) {
        continue;
      }
      c.shut = true;
      idle.emplace_back(fd, c);
    }
  }
  uint64_t shut = 0;
  std::string example;
  std::vector<int> gone;
  for (const auto& [fd, c] : idle) {
    if (!ShutIfSame(fd, c)) {
      gone.push_back(fd);
      continue;
    }
    ++shut;
    if (example.empty()) example = AddressText(c);
  }
  if (!gone.empty()) {
    std::lock_guard<std::mutex> lock(mutex_);
    for (int fd : gone) open_.erase(fd);
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
    } catch (const std::bad_alloc&) {
      ExitOutOfMemory("a shard's connection watch");
    }
  }
}

}  // namespace parasol
