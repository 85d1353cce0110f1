#include "server/startup_checks.hpp"

#include <fcntl.h>
#include <stdlib.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "common/optimizer_layout.hpp"
#include "common/placement.hpp"

namespace parasol {
namespace {

// The first line of a small file under /sys or /proc, as an unsigned number; 0 when it is
// missing, "max" or not a number.
uint64_t ReadLimit(const std::string& path) {
  std::ifstream in(path);
  std::string text;
  if (!in || !std::getline(in, text)) return 0;
  uint64_t v = 0;
  for (char c : text) {
    if (c < '0' || c > '9') return 0;
    if (v > (UINT64_MAX - 9) / 10) return 0;
    v = v * 10 + static_cast<uint64_t>(c - '0');
  }
  return text.empty() ? 0 : v;
}

// This process's cgroup folder of `controller` ("" for v2's unified line "0::PATH").
std::string CgroupPath(const std::string& controller) {
  std::ifstream in("/proc/self/cgroup");
  std::string line;
  while (std::getline(in, line)) {
    const size_t a = line.find(':'), b = line.find(':', a + 1);
    if (a == std::string::npos || b == std::string::npos) continue;
    const std::string controllers = line.substr(a + 1, b - a - 1);
    bool match = controllers == controller;
    std::stringstream list(controllers);
    for (std::string c; !match && std::getline(list, c, ',');) match = c == controller;
    if (match) return line.substr(b + 1);
  }
  return "";
}

std::string Bytes(uint64_t b) {
  char text[64];
  std::snprintf(text, sizeof(text), "%llu bytes (%.1f GiB)", static_cast<unsigned long long>(b),
                static_cast<double>(b) / (1ull << 30));
  return text;
}

uint64_t DTypeBytes(DType d) { return d == DType::kF32 ? 4 : 2; }

}  // namespace

MachineMemory DetectMachineMemory() {
  MachineMemory out;
  const long pages = ::sysconf(_SC_PHYS_PAGES), page = ::sysconf(_SC_PAGE_SIZE);
  if (pages > 0 && page > 0) {
    out.bytes = static_cast<uint64_t>(pages) * static_cast<uint64_t>(page);
    out.source = "physical memory";
  }
  // A limit of its own cgroup first, else the root's (what a container shows as its own).
  // v1 reports "no limit" as a huge number: above physical memory, it changes nothing.
  const std::string v2 = CgroupPath(""), v1 = CgroupPath("memory");
  const std::pair<std::string, std::string> candidates[] = {
      {"/sys/fs/cgroup" + v2 + "/memory.max", "cgroup memory.max"},
      {"/sys/fs/cgroup/memory.max", "cgroup memory.max"},
      {"/sys/fs/cgroup/memory" + v1 + "/memory.limit_in_bytes", "cgroup memory.limit_in_bytes"},
      {"/sys/fs/cgroup/memory/memory.limit_in_bytes", "cgroup memory.limit_in_bytes"}};
  for (const auto& [path, source] : candidates) {
    const uint64_t limit = ReadLimit(path);
    if (limit > 0 && (out.bytes == 0 || limit < out.bytes)) {
      out.bytes = limit;
      out.source = source + " (" + path + ")";
    }
  }
  return out;
}

uint64_t DenseTableBytes(const Manifest& m, const TableOptions& t, uint32_t rank) {
  if (t.kind != TableKind::kDense) return 0;
  // The slice a shard holds from the start (ShardServer builds its tables the same way).
  const uint64_t elements =
      Placement(m.cluster.InitialServers()).DenseSliceOf(t.NumElements(), rank).size();
  uint64_t per_element = DTypeBytes(t.dtype);
  const uint32_t arrays = DenseStateArrays(t.optimizer);
  for (uint32_t a = 0; a < arrays; ++a) {
    // Adam's step count (its third array) is a 32-bit word whatever state_dtype says.
    const bool raw = t.optimizer.kind == OptimizerOptions::Kind::kAdam && a == 2;
    per_element += raw ? 4 : DTypeBytes(t.state_dtype);
  }
  // At most 2^34 elements of at most 4 + 3 x 4 bytes: no overflow.
  return elements * per_element;
}

Status CheckTablesFitInMemory(const Manifest& m, uint32_t rank, const MachineMemory& memory) {
  if (memory.bytes == 0) return Status::Ok();  // unknown: nothing to check against
  uint64_t total = 0;
  for (const TableOptions& t : m.tables) {
    const uint64_t need = DenseTableBytes(m, t, rank);
    total += need;
    if (total <= memory.bytes) continue;
    std::string what = "shard " + std::to_string(rank) + ": dense table '" + t.name + "' needs " +
                       Bytes(need) + " for its values and optimizer state on this shard";
    if (total != need) what += " (" + Bytes(total) + " with the dense tables before it)";
    return ResourceExhausted(what + ", more than this machine has: " + Bytes(memory.bytes) +
                             " of " + memory.source +
                             "; give the job more shards (cluster.servers) or a smaller table");
  }
  return Status::Ok();
}

Status CheckCheckpointDir(const Manifest& m, uint32_t rank) {
  const std::string& dir = m.checkpoint.dir;
  if (dir.empty()) return Status::Ok();
  const std::string where = "checkpoint.dir '" + dir + "'";
  std::error_code ec;
  const std::filesystem::file_status st = std::filesystem::status(dir, ec);
  if (std::filesystem::exists(st) && !std::filesystem::is_directory(st)) {
    return FailedPrecondition(where + " is not a directory");
  }
  const std::string shard_dir = dir + "/shard-" + std::to_string(rank);
  std::filesystem::create_directories(shard_dir, ec);
  if (ec) return FailedPrecondition(where + ": cannot create " + shard_dir + ": " + ec.message());
  if (!std::filesystem::is_directory(shard_dir, ec)) {
    return FailedPrecondition(where + ": " + shard_dir + " is not a directory");
  }
  // Written and removed: permissions, a read-only mount and a full inode table all show here.
  std::string probe = shard_dir + "/.write-check-XXXXXX";
  const int fd = ::mkstemp(probe.data());
  if (fd < 0) {
    return FailedPrecondition(where + ": cannot write in " + shard_dir + ": " +
                              std::strerror(errno));
  }
  ::close(fd);
  ::unlink(probe.c_str());
  return Status::Ok();
}

}  // namespace parasol
