// The cores this process may run on, as read when the program started (before any of its
// threads kept itself to one core), and the calls that keep a thread to a core or give it all of
// them back. A new thread starts with its creator's cores: one started by a thread kept to one
// core stays on it unless it calls UseProcessCores().
#pragma once

#include <pthread.h>

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

}  // namespace parasol
