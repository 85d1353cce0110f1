// ExitOutOfMemory: what a thread that cannot hand an allocation failure back to a caller does
// with it (an engine's task, a background loop, a watcher): one line naming where, and the
// process exits with status 1 instead of std::terminate's abort. A shard that exits so restarts
// from its checkpoint, with the workers' push logs holding every update acknowledged since.
#pragma once

#include <cstdlib>

#include <spdlog/spdlog.h>

namespace parasol {

[[noreturn]] inline void ExitOutOfMemory(const char* where) {
  spdlog::critical("out of memory in {}; the process exits", where);
  spdlog::shutdown();
  std::_Exit(1);
}

}  // namespace parasol
