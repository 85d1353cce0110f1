// TcpProbe: a plain TCP client socket to 127.0.0.1 for tests that play an idle, slow or
// hostile client of a server: connect, send raw bytes, wait (bounded) for the peer to close.
// Header-only, so unit tests that link only parasol_common can use it.
// Thread-safety: one owner at a time.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>

namespace parasol::testing {

class TcpProbe {
 public:
  // A probe connected to 127.0.0.1:`port`, or an unconnected one (connected() false). Connecting
  // gives up after 5 s.
  static TcpProbe Connect(uint16_t port) {
    TcpProbe probe(::socket(AF_INET, SOCK_STREAM, 0));
    if (!probe.connected()) return probe;
    timeval limit{5, 0};  // bounds connect() and send()
    ::setsockopt(probe.fd_, SOL_SOCKET, SO_SNDTIMEO, &limit, sizeof(limit));
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(port);
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (::connect(probe.fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
      probe.Close();
    }
    return probe;
  }

  TcpProbe(TcpProbe&& other) noexcept : fd_(std::exchange(other.fd_, -1)) {}
  TcpProbe& operator=(TcpProbe&& other) noexcept {
    if (this != &other) {
      Close();
      fd_ = std::exchange(other.fd_, -1);
    }
    return *this;
  }
  TcpProbe(const TcpProbe&) = delete;
  TcpProbe& operator=(const TcpProbe&) = delete;
  ~TcpProbe() { Close(); }

  bool connected() const { return fd_ >= 0; }

  // False when the bytes could not all be sent (the peer closed, say).
  bool Send(const std::string& bytes) {
    size_t sent = 0;
    while (connected() && sent < bytes.size()) {
      const ssize_t n = ::send(fd_, bytes.data() + sent, bytes.size() - sent, MSG_NOSIGNAL);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) return false;
      sent += static_cast<size_t>(n);
    }
    return connected();
  }

  // Everything the peer sends until it closes (an orderly close or a reset); an empty optional
  // when it has not closed within `timeout`.
  std::optional<std::string> ReadUntilClosed(std::chrono::milliseconds timeout) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    std::string received;
    char buf[4096];
    while (connected()) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
          deadline - std::chrono::steady_clock::now());
      pollfd p{fd_, POLLIN, 0};
      const int ready = ::poll(&p, 1, static_cast<int>(std::max<int64_t>(left.count(), 0)));
      if (ready < 0 && errno == EINTR) continue;
      if (ready <= 0) return std::nullopt;
      const ssize_t n = ::recv(fd_, buf, sizeof(buf), 0);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) return received;
      received.append(buf, static_cast<size_t>(n));
    }
    return received;
  }

 private:
  explicit TcpProbe(int fd) : fd_(fd) {}
  void Close() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }

  int fd_ = -1;
};

// An HTTP answer split into its status line ("HTTP/1.1 200 OK") and body.
struct HttpAnswer {
  std::string status_line;
  std::string body;
};

// GET `path` from 127.0.0.1:`port` (Connection: close). An empty optional when the server did
// not answer and close within `timeout`.
inline std::optional<HttpAnswer> HttpGetWithin(uint16_t port, const std::string& path,
                                               std::chrono::milliseconds timeout) {
  TcpProbe probe = TcpProbe::Connect(port);
  if (!probe.Send("GET " + path + " HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")) {
    return std::nullopt;
  }
  std::optional<std::string> raw = probe.ReadUntilClosed(timeout);
  if (!raw) return std::nullopt;
  const size_t head_end = raw->find("\r\n\r\n");
  return HttpAnswer{raw->substr(0, raw->find("\r\n")),
                    head_end == std::string::npos ? "" : raw->substr(head_end + 4)};
}

}  // namespace parasol::testing
