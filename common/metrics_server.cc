#include "common/metrics_server.hpp"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <atomic>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <cmath>
#include <cstdint>
#include <list>
#include <mutex>
#include <optional>
#include <sstream>
#include <sys/resource.h>
#include <fstream>

namespace parasol {

namespace {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;
using Response = http::response<http::string_body>;

class Connection;

// What the connections share with the owner's thread and with each other.
struct ServerState {
  ServerState(MetricsServer::Limits l, uint16_t requested_port) : limits(l), port(requested_port) {}

  const MetricsServer::Limits limits;
  std::mutex mu;
  std::string text;  // GUARDED_BY(mu)
  std::atomic<bool> healthy{true};
  std::string health_note;  // GUARDED_BY(mu): said before "ok" or "unhealthy" when set
  std::atomic<uint16_t> port;
  std::atomic<uint64_t> served{0};
  std::atomic<uint64_t> refused{0};
  std::atomic<uint64_t> timed_out{0};
  // The rest is touched by the io thread only.
  size_t open = 0;                 // connections holding a socket
  std::list<Connection*> waiting;  // those still waiting for their request, oldest first
};

Response PlainText(http::status status, std::string body) {
  Response res(status, 11);
  res.set(http::field::content_type, "text/plain; charset=utf-8");
  res.body() = std::move(body);
  return res;
}

// The answer to a well-formed request header.
Response Answer(ServerState& state, const http::request_parser<http::empty_body>& parser) {
  const auto& req = parser.get();
  if (req.method() != http::verb::get) {
    Response res = PlainText(http::status::method_not_allowed, "GET only\n");
    res.set(http::field::allow, "GET");
    return res;
  }
  if (parser.chunked()) return PlainText(http::status::payload_too_large, "no body, please\n");
  if (req.target() == "/metrics") {
    Response res = PlainText(http::status::ok, "");
    res.set(http::field::content_type, "text/plain; version=0.0.4");
    std::lock_guard<std::mutex> lock(state.mu);
    res.body() = state.text;
    return res;
  }
  if (req.target() == "/healthz") {
    const bool ok = state.healthy.load();
    std::string note;
    {
      std::lock_guard<std::mutex> lock(state.mu);
      note = state.health_note;
    }
    return PlainText(ok ? http::status::ok : http::status::service_unavailable,
                     (ok ? "ok" : "unhealthy") + (note.empty() ? "" : ": " + note) + "\n");
  }
  return PlainText(http::status::not_found, "try /metrics or /healthz\n");
}

// One client connection: reads one request header, answers it, closes. Owned by the handlers
// of its pending operation, so it lives exactly as long as there is something to wait for.
class Connection : public std::enable_shared_from_this<Connection> {
 public:
  Connection(tcp::socket socket, ServerState& state)
      : stream_(std::move(socket)), state_(state), buffer_(state.limits.max_request_bytes) {
    ++state_.open;
  }
  ~Connection() {
    LeaveWaiting();
    if (holds_socket_) --state_.open;
  }
  Connection(const Connection&) = delete;
  Connection& operator=(const Connection&) = delete;

  void Start() {
    waiting_ = state_.waiting.insert(state_.waiting.end(), this);
    parser_.header_limit(
        static_cast<uint32_t>(std::min<size_t>(state_.limits.max_request_bytes, UINT32_MAX)));
    parser_.body_limit(0);
    stream_.expires_after(state_.limits.read_timeout);
    http::async_read_header(
        stream_, buffer_, parser_,
        [self = shared_from_this()](beast::error_code ec, size_t) { self->OnRead(ec); });
  }

  // Closes a connection still waiting for its request, to make room for a newer one. Its
  // pending read then completes (aborted) and drops the last reference.
  void PushOut() {
    LeaveWaiting();
    ++state_.refused;
    stream_.close();
    holds_socket_ = false;
    --state_.open;
  }

 private:
  void OnRead(beast::error_code ec) {
    LeaveWaiting();
    if (ec == beast::error::timeout) {
      ++state_.timed_out;  // the stream has closed the socket
    } else if (ec == http::error::header_limit || ec == http::error::buffer_overflow) {
      Send(PlainText(http::status::request_header_fields_too_large, "request too large\n"));
    } else if (ec == http::error::body_limit) {
      Send(PlainText(http::status::payload_too_large, "no body, please\n"));
    } else if (ec == http::error::end_of_stream || ec == http::error::partial_message) {
      // The client left.
    } else if (ec && ec.category() == http::make_error_code(http::error::bad_target).category()) {
      Send(PlainText(http::status::bad_request, "not an HTTP request\n"));
    } else if (!ec) {
      Response res = Answer(state_, parser_);
      res.version(parser_.get().version());
      Send(std::move(res));
    }
    // Otherwise a socket error, or pushed out: nothing to answer.
  }

  void Send(Response res) {
    response_ = std::move(res);
    response_.keep_alive(false);
    response_.prepare_payload();
    stream_.expires_after(state_.limits.write_timeout);
    http::async_write(
        stream_, response_,
        [self = shared_from_this()](beast::error_code ec, size_t) { self->OnWrite(ec); });
  }

  void OnWrite(beast::error_code ec) {
    if (ec == beast::error::timeout) ++state_.timed_out;
    if (ec) return;
    ++state_.served;
    // The socket closes with this object, after the answer.
    stream_.socket().shutdown(tcp::socket::shutdown_send, ec);
  }

  void LeaveWaiting() {
    if (!waiting_) return;
    state_.waiting.erase(*waiting_);
    waiting_.reset();
  }

  beast::tcp_stream stream_;
  ServerState& state_;
  beast::flat_buffer buffer_;
  http::request_parser<http::empty_body> parser_;
  Response response_;
  std::optional<std::list<Connection*>::iterator> waiting_;
  bool holds_socket_ = true;
};

}  // namespace

struct MetricsServer::Impl {
  Impl(Limits limits, uint16_t port) : state(limits, port) {}

  void Accept();
  void Admit(tcp::socket socket);

  // Declared before `io`: connections destroyed along with io's pending handlers still reach
  // it on their way out.
  ServerState state;
  asio::io_context io{1};
  tcp::acceptor acceptor{io};
  asio::steady_timer retry{io};
};

void MetricsServer::Impl::Accept() {
  acceptor.async_accept([this](beast::error_code ec, tcp::socket socket) {
    if (ec == asio::error::operation_aborted) return;  // stopping
    if (ec) {
      // Out of descriptors, say: wait a little rather than spin.
      spdlog::debug("metrics endpoint: accept failed: {}", ec.message());
      retry.expires_after(std::chrono::milliseconds(100));
      retry.async_wait([this](beast::error_code wait_ec) {
        if (!wait_ec) Accept();
      });
      return;
    }
    Accept();
    Admit(std::move(socket));
  });
}

void MetricsServer::Impl::Admit(tcp::socket socket) {
  if (state.open >= state.limits.max_connections) {
    if (state.waiting.empty()) {
      ++state.refused;
      return;  // `socket` closes here
    }
    state.waiting.front()->PushOut();
  }
  std::make_shared<Connection>(std::move(socket), state)->Start();
}

MetricsServer::MetricsServer(std::string host, uint16_t port, Limits limits)
    : host_(std::move(host)), impl_(std::make_unique<Impl>(limits, port)) {}

MetricsServer::MetricsServer(std::string host, uint16_t port)
    : MetricsServer(std::move(host), port, Limits()) {}

MetricsServer::~MetricsServer() {
  impl_->io.stop();
  if (thread_.joinable()) thread_.join();
}

Status MetricsServer::Start() {
  boost::system::error_code ec;
  const auto address = asio::ip::make_address(host_, ec);
  if (ec) return InvalidArgument("metrics.host '" + host_ + "' is not an address");
  const uint16_t port = impl_->state.port.load();
  const tcp::endpoint endpoint(address, port);
  tcp::acceptor& acceptor = impl_->acceptor;
  acceptor.open(endpoint.protocol(), ec);
  if (!ec) acceptor.set_option(asio::socket_base::reuse_address(true), ec);
  if (!ec) acceptor.bind(endpoint, ec);
  if (!ec) acceptor.listen(asio::socket_base::max_listen_connections, ec);
  if (ec) {
    return Unavailable("cannot serve metrics on " + host_ + ":" + std::to_string(port) + ": " +
                       ec.message());
  }
  impl_->state.port.store(acceptor.local_endpoint().port());
  impl_->Accept();
  thread_ = std::thread([impl = impl_.get()] {
    // A handler that throws loses its connection, not the endpoint.
    while (true) {
      try {
        impl->io.run();
        return;
      } catch (const std::exception& e) {
        spdlog::error("metrics endpoint: {}", e.what());
      }
    }
  });
  return Status::Ok();
}

void MetricsServer::Publish(std::string text) {
  std::lock_guard<std::mutex> lock(impl_->state.mu);
  impl_->state.text = std::move(text);
}

void MetricsServer::SetHealthy(bool healthy) { impl_->state.healthy.store(healthy); }

void MetricsServer::SetHealthNote(std::string note) {
  std::lock_guard<std::mutex> lock(impl_->state.mu);
  impl_->state.health_note = std::move(note);
}

uint16_t MetricsServer::port() const { return impl_->state.port.load(); }

uint64_t MetricsServer::requests_served() const { return impl_->state.served.load(); }

uint64_t MetricsServer::connections_refused() const { return impl_->state.refused.load(); }

uint64_t MetricsServer::connections_timed_out() const { return impl_->state.timed_out.load(); }

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

void LatencyHistogram::Observe(double seconds) {
  size_t b = 0;
  while (b < std::size(kBuckets) && seconds > kBuckets[b]) ++b;
  ++counts_[b];
  sum_ += seconds;
}

void LatencyHistogram::Write(PrometheusText& t, const std::string& name, const std::string& help,
                             const std::string& labels) const {
  t.Type(name, "histogram", help);
  const std::string sep = labels.empty() ? "" : ",";
  uint64_t cumulative = 0;
  for (size_t b = 0; b <= std::size(kBuckets); ++b) {
    cumulative += counts_[b];
    std::ostringstream le;
    if (b < std::size(kBuckets)) {
      le << kBuckets[b];
    } else {
      le << "+Inf";
    }
    t.Sample(name + "_bucket", static_cast<double>(cumulative),
             labels + sep + "le=\"" + le.str() + "\"");
  }
  t.Sample(name + "_sum", sum_, labels);
  t.Sample(name + "_count", static_cast<double>(cumulative), labels);
}

void WriteProcessMetrics(PrometheusText& t, const std::string& labels) {
  uint64_t rss_kib = 0;
  std::ifstream status("/proc/self/status");
  for (std::string line; std::getline(status, line);) {
    if (line.rfind("VmRSS:", 0) == 0) rss_kib = std::strtoull(line.c_str() + 6, nullptr, 10);
  }
  t.Type("process_resident_memory_bytes", "gauge", "Resident memory of this process.");
  t.Sample("process_resident_memory_bytes", static_cast<double>(rss_kib) * 1024, labels);
  rusage u{};
  ::getrusage(RUSAGE_SELF, &u);
  const double cpu = static_cast<double>(u.ru_utime.tv_sec + u.ru_stime.tv_sec) +
                     static_cast<double>(u.ru_utime.tv_usec + u.ru_stime.tv_usec) / 1e6;
  t.Type("process_cpu_seconds_total", "counter", "User and system CPU time of this process.");
  t.Sample("process_cpu_seconds_total", cpu, labels);
}

}  // namespace parasol
