// Small networking helpers.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/status.hpp"

namespace parasol {

// A TCP port on `host` that was free a moment ago (the kernel picked it for a socket bound to
// port 0, which is then closed). For tests and local launches; another process may take it.
Result<uint16_t> PickFreePort(const std::string& host = "127.0.0.1");

// `n` distinct free ports: the sockets stay open until all are picked, so the kernel cannot
// hand out the same port twice.
Result<std::vector<uint16_t>> PickFreePorts(size_t n, const std::string& host = "127.0.0.1");

// Whether `host` (a name or an address) resolves: Ok, or an error saying
// "cannot resolve 'HOST': WHY" (a host the workers cannot find is named as such, not left to
// look like a shard that does not answer).
Status CheckResolves(const std::string& host);

// Whether every address `host` resolves to is a loopback one (127.0.0.0/8, ::1); false when it
// resolves to none, or is empty or a wildcard. By what it resolves to, not by its spelling (a
// name that begins with "127." may be anywhere).
bool IsLoopbackHost(const std::string& host);

}  // namespace parasol
