#include "common/metrics_server.hpp"

#include <spdlog/spdlog.h>

#include <boost/asio/ip/tcp.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <cmath>
#include <sstream>

namespace parasol {

namespace asio = boost::asio;
namespace http = boost::beast::http;
using tcp = asio::ip::tcp;

struct MetricsServer::Impl {
  asio::io_context io;
  tcp::acceptor acceptor{io};
};

MetricsServer::MetricsServer(std::string host, uint16_t port)
    : host_(std::move(host)), port_(port), impl_(std::make_unique<Impl>()) {}

MetricsServer::~MetricsServer() {
  impl_->io.stop();
  if (thread_.joinable()) thread_.join();
}

Status MetricsServer::Start() {
  boost::system::error_code ec;
  const auto address = asio::ip::make_address(host_, ec);
  if (ec) return InvalidArgument("metrics.host '" + host_ + "' is not an address");
  const tcp::endpoint endpoint(address, port_);
  impl_->acceptor.open(endpoint.protocol(), ec);
  if (!ec) impl_->acceptor.set_option(asio::socket_base::reuse_address(true), ec);
  if (!ec) impl_->acceptor.bind(endpoint, ec);
  if (!ec) impl_->acceptor.listen(asio::socket_base::max_listen_connections, ec);
  if (ec) {
    return Unavailable("cannot serve metrics on " + host_ + ":" + std::to_string(port_) + ": " +
                       ec.message());
  }
  Accept();
  thread_ = std::thread([this] { impl_->io.run(); });
  return Status::Ok();
}

void MetricsServer::Publish(std::string text) {
  std::lock_guard<std::mutex> lock(mu_);
  text_ = std::move(text);
}

void MetricsServer::Accept() {
  impl_->acceptor.async_accept([this](boost::system::error_code ec, tcp::socket socket) {
    if (ec) return;  // stopped
    // One small request per connection, answered at once.
    boost::beast::flat_buffer buffer;
    http::request<http::string_body> req;
    http::read(socket, buffer, req, ec);
    if (!ec) {
      http::response<http::string_body> res;
      res.version(req.version());
      res.keep_alive(false);
      const std::string target(req.target());
      if (req.method() != http::verb::get) {
        res.result(http::status::method_not_allowed);
        res.body() = "GET only\n";
      } else if (target == "/metrics") {
        res.result(http::status::ok);
        res.set(http::field::content_type, "text/plain; version=0.0.4");
        std::lock_guard<std::mutex> lock(mu_);
        res.body() = text_;
      } else if (target == "/healthz") {
        const bool ok = healthy_.load();
        res.result(ok ? http::status::ok : http::status::service_unavailable);
        res.body() = ok ? "ok\n" : "unhealthy\n";
      } else {
        res.result(http::status::not_found);
        res.body() = "try /metrics or /healthz\n";
      }
      res.prepare_payload();
      http::write(socket, res, ec);
      ++served_;
    }
    socket.shutdown(tcp::socket::shutdown_both, ec);
    Accept();
  });
}

void PrometheusText::Type(const std::string& name, const char* type, const std::string& help) {
  out_ += "# HELP " + name + " " + help + "\n# TYPE " + name + " " + type + "\n";
}

void PrometheusText::Sample(const std::string& name, double value, const std::string& labels) {
  std::ostringstream s;
  s << name;
  if (!labels.empty()) s << "{" << labels << "}";
  if (std::isinf(value)) {
    s << (value > 0 ? " +Inf" : " -Inf");
  } else {
    s.precision(17);
    s << " " << value;
  }
  out_ += s.str() + "\n";
}

}  // namespace parasol
