#include "server/zap_handler.hpp"

#include <spdlog/spdlog.h>

#include <zmq_addon.hpp>

#include <cstring>

#include "common/curve_keys.hpp"

namespace parasol {

ZapHandler::ZapHandler(zmq::context_t& context, std::set<std::string> allowed_z85,
                       std::string label)
    : socket_(context, zmq::socket_type::rep),
      monitor_(context, zmq::socket_type::pair),
      allowed_(std::move(allowed_z85)),
      label_(std::move(label)) {}

ZapHandler::~ZapHandler() {
  stop_.store(true);
  if (thread_.joinable()) thread_.join();
}

Status ZapHandler::Start(zmq::socket_t& router) {
  const std::string endpoint = "inproc://parasol-handshakes-" + label_;
  try {
    socket_.set(zmq::sockopt::linger, 0);
    socket_.bind("inproc://zeromq.zap.01");
    if (zmq_socket_monitor(router.handle(), endpoint.c_str(),
                           ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL |
                               ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL) != 0) {
      return Unavailable(std::string("cannot watch handshakes: ") + zmq_strerror(zmq_errno()));
    }
    monitor_.set(zmq::sockopt::linger, 0);
    monitor_.connect(endpoint);
  } catch (const zmq::error_t& e) {
    return Unavailable(std::string("cannot start the CURVE authenticator: ") + e.what());
  }
  thread_ = std::thread([this] { Loop(); });
  return Status::Ok();
}

void ZapHandler::HandleMonitorEvent() {
  std::vector<zmq::message_t> event;
  if (!zmq::recv_multipart(monitor_, std::back_inserter(event), zmq::recv_flags::dontwait)) return;
  if (event.size() < 2 || event[0].size() < 6) return;
  uint16_t id;
  uint32_t value;
  std::memcpy(&id, event[0].data(), 2);
  std::memcpy(&value, static_cast<const char*>(event[0].data()) + 2, 4);
  ++refusals_;
  std::string why = "no detail";
  if (id == ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL) {
    why = value == ZMQ_PROTOCOL_ERROR_ZMTP_MECHANISM_MISMATCH ? "mechanism mismatch"
                                                              : "protocol error " +
                                                                    std::to_string(value);
  }
  uint64_t left_out = 0;
  if (!refusal_log_.Allow(std::chrono::steady_clock::now(), &left_out)) return;
  spdlog::warn("{}: refused a connection on {}: the handshake failed ({}): a client without "
               "CURVE, or with the wrong server key{}",
               label_, event[1].to_string(), why,
               left_out ? " (and " + std::to_string(left_out) + " more refusals since)" : "");
}

void ZapHandler::Loop() {
  zmq::pollitem_t items[] = {{socket_.handle(), 0, ZMQ_POLLIN, 0},
                             {monitor_.handle(), 0, ZMQ_POLLIN, 0}};
  while (!stop_.load()) {
    try {
      zmq::poll(items, 2, std::chrono::milliseconds(100));
      if (items[1].revents & ZMQ_POLLIN) HandleMonitorEvent();
      if (items[0].revents & ZMQ_POLLIN) HandleZap();
    } catch (const zmq::error_t& e) {
      if (e.num() == ETERM) return;
      spdlog::warn("{}: authenticator: {}", label_, e.what());
    }
  }
}

void ZapHandler::HandleZap() {
  {
    {
      std::vector<zmq::message_t> req;
      if (!zmq::recv_multipart(socket_, std::back_inserter(req))) return;
      // version, request id, domain, address, identity, mechanism, credentials...
      const std::string request_id = req.size() > 1 ? req[1].to_string() : "";
      const std::string address = req.size() > 3 ? req[3].to_string() : "?";
      const std::string mechanism = req.size() > 5 ? req[5].to_string() : "";
      std::string key;
      if (mechanism == "CURVE" && req.size() > 6 && req[6].size() == 32) key = Z85Key(req[6].data());
      const bool ok = !key.empty() && allowed_.count(key) > 0;
      if (ok) {
        ++admissions_;
      } else {
        ++refusals_;
        uint64_t left_out = 0;
        if (refusal_log_.Allow(std::chrono::steady_clock::now(), &left_out)) {
          spdlog::warn("{}: refused a connection from {}: {}{}", label_, address,
                       key.empty() ? "no CURVE key (mechanism " + mechanism + ")"
                                   : "unknown client key " + key,
                       left_out ? " (and " + std::to_string(left_out) + " more refusals since)"
                                : "");
        }
      }
      std::vector<zmq::message_t> reply;
      reply.emplace_back(std::string("1.0"));
      reply.emplace_back(request_id);
      reply.emplace_back(std::string(ok ? "200" : "400"));
      reply.emplace_back(std::string(ok ? "OK" : "client key not allowed"));
      reply.emplace_back(key);  // the User-Id of the connection's messages
      reply.emplace_back();
      zmq::send_multipart(socket_, reply);
    }
  }
}

}  // namespace parasol
