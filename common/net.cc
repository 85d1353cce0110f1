#include "common/net.hpp"

#include <netdb.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace parasol {

namespace {

// Binds a socket to `host`:0; returns its fd and the port the kernel chose.
Result<std::pair<int, uint16_t>> BindEphemeral(const std::string& host) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return IoError(std::string("socket: ") + std::strerror(errno));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = 0;
  if (::inet_pton(AF_INET, host.c_str(), &addr.sin_addr) != 1) {
    ::close(fd);
    return InvalidArgument("not an IPv4 address: " + host);
  }
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    const int err = errno;
    ::close(fd);
    return IoError("bind " + host + ":0: " + std::strerror(err));
  }
  socklen_t len = sizeof(addr);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  return std::make_pair(fd, static_cast<uint16_t>(ntohs(addr.sin_port)));
}

}  // namespace

Result<uint16_t> PickFreePort(const std::string& host) {
  PARASOL_ASSIGN_OR_RETURN(auto bound, BindEphemeral(host));
  ::close(bound.first);
  return bound.second;
}

Result<std::vector<uint16_t>> PickFreePorts(size_t n, const std::string& host) {
  std::vector<int> fds;
  std::vector<uint16_t> ports;
  Status failure;
  for (size_t i = 0; i < n; ++i) {
    auto bound = BindEphemeral(host);
    if (!bound.ok()) {
      failure = bound.status();
      break;
    }
    fds.push_back(bound->first);
    ports.push_back(bound->second);
  }
  for (int fd : fds) ::close(fd);
  if (!failure.ok()) return failure;
  return ports;
}

Status CheckResolves(const std::string& host) {
  if (host.empty() || host == "*" || host == "0.0.0.0") return Status::Ok();
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  const int rc = ::getaddrinfo(host.c_str(), nullptr, &hints, &found);
  if (found) ::freeaddrinfo(found);
  if (rc == 0) return Status::Ok();
  return Unavailable("cannot resolve '" + host + "': " + ::gai_strerror(rc));
}

bool IsLoopbackHost(const std::string& host) {
  if (host.empty() || host == "*" || host == "0.0.0.0" || host == "::") return false;
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (::getaddrinfo(host.c_str(), nullptr, &hints, &found) != 0 || found == nullptr) {
    if (found) ::freeaddrinfo(found);
    return false;
  }
  bool all = true;
  for (const addrinfo* a = found; a; a = a->ai_next) {
    if (a->ai_family == AF_INET) {
      const auto* in = reinterpret_cast<const sockaddr_in*>(a->ai_addr);
      all = all && (ntohl(in->sin_addr.s_addr) >> 24) == 127;
    } else if (a->ai_family == AF_INET6) {
      const auto* in = reinterpret_cast<const sockaddr_in6*>(a->ai_addr);
      all = all && IN6_IS_ADDR_LOOPBACK(&in->sin6_addr);
    } else {
      all = false;
    }
  }
  ::freeaddrinfo(found);
  return all;
}

}  // namespace parasol
