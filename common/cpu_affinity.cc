#include "common/cpu_affinity.hpp"

#include <sched.h>

#include <algorithm>
#include <charconv>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>

namespace parasol {
namespace {

std::vector<int> ReadCores() {
  std::vector<int> cores;
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) != 0) return cores;
  for (int c = 0; c < CPU_SETSIZE; ++c) {
    if (CPU_ISSET(c, &set)) cores.push_back(c);
  }
  return cores;
}

// Read while the program loads, on its main thread, before main() starts any thread.
const std::vector<int> g_process_cores = ReadCores();

}  // namespace

const std::vector<int>& ProcessCores() { return g_process_cores; }

bool PinThreadToCore(pthread_t thread, int i) {
  const std::vector<int>& cores = ProcessCores();
  if (cores.empty() || i < 0) return false;
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cores[static_cast<size_t>(i) % cores.size()], &set);
  return pthread_setaffinity_np(thread, sizeof set, &set) == 0;
}

bool UnpinThread(pthread_t thread) {
  const std::vector<int>& cores = ProcessCores();
  if (cores.empty()) return false;
  cpu_set_t set;
  CPU_ZERO(&set);
  for (int c : cores) CPU_SET(c, &set);
  return pthread_setaffinity_np(thread, sizeof set, &set) == 0;
}

bool UseProcessCores() { return UnpinThread(pthread_self()); }

std::optional<uint32_t> CoresOfQuota(int64_t quota, int64_t period) {
  if (quota < 0 || period <= 0) return std::nullopt;
  const int64_t cores = (quota + period - 1) / period;
  return static_cast<uint32_t>(std::clamp<int64_t>(cores, 1, 1 << 20));
}

std::optional<uint32_t> CoresOfCpuMax(std::string_view text) {
  while (!text.empty() && (text.back() == '\n' || text.back() == ' ')) text.remove_suffix(1);
  const size_t space = text.find(' ');
  if (space == std::string_view::npos) return std::nullopt;
  const std::string_view q = text.substr(0, space), p = text.substr(space + 1);
  if (q == "max") return std::nullopt;
  int64_t quota = 0, period = 0;
  auto whole = [](std::string_view s, int64_t* v) {
    const auto r = std::from_chars(s.data(), s.data() + s.size(), *v);
    return r.ec == std::errc() && r.ptr == s.data() + s.size();
  };
  if (!whole(q, &quota) || !whole(p, &period)) return std::nullopt;
  return CoresOfQuota(quota, period);
}

namespace {

std::string ReadSmallFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// This process's cgroup CPU quota in cores, where one is set.
std::optional<uint32_t> CgroupCores() {
  // v2: the unified hierarchy's path of this process ("0::/PATH" in /proc/self/cgroup).
  std::istringstream lines(ReadSmallFile("/proc/self/cgroup"));
  std::string line;
  while (std::getline(lines, line)) {
    if (line.rfind("0::", 0) != 0) continue;
    const std::string dir = "/sys/fs/cgroup" + line.substr(3);
    for (const std::string& d : {dir, std::string("/sys/fs/cgroup")}) {
      const std::string text = ReadSmallFile(d + "/cpu.max");
      if (!text.empty()) return CoresOfCpuMax(text);
    }
  }
  // v1, as a container sees its own cgroup.
  for (const char* d : {"/sys/fs/cgroup/cpu", "/sys/fs/cgroup/cpu,cpuacct"}) {
    const std::string quota = ReadSmallFile(std::string(d) + "/cpu.cfs_quota_us");
    const std::string period = ReadSmallFile(std::string(d) + "/cpu.cfs_period_us");
    if (quota.empty() || period.empty()) continue;
    try {
      return CoresOfQuota(std::stoll(quota), std::stoll(period));
    } catch (const std::exception&) {
      return std::nullopt;
    }
  }
  return std::nullopt;
}

}  // namespace

uint32_t UsableCores() {
  uint32_t cores = ProcessCores().empty() ? std::thread::hardware_concurrency()
                                          : static_cast<uint32_t>(ProcessCores().size());
  if (const std::optional<uint32_t> quota = CgroupCores()) {
    cores = cores == 0 ? *quota : std::min(cores, *quota);
  }
  return cores;
}

}  // namespace parasol
