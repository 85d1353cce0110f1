#include "common/cpu_affinity.hpp"

#include <sched.h>

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

}  // namespace parasol
