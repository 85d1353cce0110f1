#include "server/connection_watch.hpp"

#include <spdlog/spdlog.h>
#include <zmq_addon.hpp>

#include <sys/socket.h>

#include <cstring>
#include <iterator>
#include <vector>

namespace parasol {

ConnectionWatch::ConnectionWatch(zmq::context_t& context, std::string label, bool curve,
                                 int64_t cap)
    : monitor_(context, zmq::socket_type::pair),
      label_(std::move(label)),
      curve_(curve),
      cap_(cap) {}

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
    return;
  }
  if (id == ZMQ_EVENT_DISCONNECTED) {
    if (connections_.load() > 0) --connections_;
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

void ConnectionWatch::Loop() {
  zmq::pollitem_t items[] = {{monitor_.handle(), 0, ZMQ_POLLIN, 0}};
  while (!stop_.load()) {
    try {
      zmq::poll(items, 1, std::chrono::milliseconds(100));
      if (items[0].revents & ZMQ_POLLIN) HandleEvent();
    } catch (const zmq::error_t& e) {
      if (e.num() == ETERM) return;
      spdlog::warn("{}: connection watch: {}", label_, e.what());
    }
  }
}

}  // namespace parasol
