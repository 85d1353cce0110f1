// The cores this process may run on, as read when the program started (before any of its
// threads kept itself to one core), and the calls that keep a thread to a core or give it all of
// them back. A new thread starts with its creator's cores: one started by a thread kept to one
// core stays on it unless it calls UseProcessCores().
#pragma once

#include <pthread.h>

#include <cstdint>
#include <optional>
#include <string_view>
#include <vector>

namespace parasol {

// The cores the process could use at start, ascending (empty where the system did not say).
const std::vector<int>& ProcessCores();

// Keeps `thread` to ProcessCores()[i % size]; false where refused or unknown.
bool PinThreadToCore(pthread_t thread, int i);

// Lets `thread` run on every core of ProcessCores() again; false where refused or unknown.
bool UnpinThread(pthread_t thread);

// UnpinThread(pthread_self()).
bool UseProcessCores();

// The cores a CPU quota of `quota` microseconds every `period` allows, rounded up (at least 1);
// nullopt for no quota (a negative quota, as cgroup v1 writes it) or a period that is not
// positive.
std::optional<uint32_t> CoresOfQuota(int64_t quota, int64_t period);
// The same for the text of a cgroup v2 `cpu.max` ("QUOTA PERIOD", or "max PERIOD" for none);
// nullopt where it sets none or does not parse.
std::optional<uint32_t> CoresOfCpuMax(std::string_view text);

// The cores this process may keep busy: its affinity (ProcessCores(), or the machine's where
// that is unknown), at most what its cgroup's CPU quota allows (cgroup v2 `cpu.max`, or v1
// `cpu.cfs_quota_us` over `cpu.cfs_period_us`), as a container's CPU limit sets it; 0 where
// neither is known. Read on each call.
uint32_t UsableCores();

}  // namespace parasol
