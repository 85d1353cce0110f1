#include "server/zap_handler.hpp"

#include <spdlog/spdlog.h>

#include <zmq_addon.hpp>

#include <cstring>

#include "common/curve_keys.hpp"

namespace parasol {

ZapHandler::ZapHandler(zmq::context_t& context, std::set<std::string> allowed_z85,
                       std::string label)
    : socket_(context, zmq::socket_type::rep),
      allowed_(std::move(allowed_z85)),
      label_(std::move(label)) {}

ZapHandler::~ZapHandler() {
  stop_.store(true);
  if (thread_.joinable()) thread_.join();
}

Status ZapHandler::Start(zmq::socket_t& /*router*/) {
  try {
    socket_.set(zmq::sockopt::linger, 0);
    socket_.bind("inproc://zeromq.zap.01");
  } catch (const zmq::error_t& e) {
    return Unavailable(std::string("cannot start the CURVE authenticator: ") + e.what());
  }
  thread_ = std::thread([this] { Loop(); });
  return Status::Ok();
}

void ZapHandler::Loop() {
  zmq::pollitem_t items[] = {{socket_.handle(), 0, ZMQ_POLLIN, 0}};
  while (!stop_.load()) {
    try {
      zmq::poll(items, 1, std::chrono::milliseconds(100));
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
