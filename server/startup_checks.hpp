// What a shard checks before it is built and serves, so that a job that cannot run fails at
// once with the reason instead of later (an uncaught std::bad_alloc while its tables are
// allocated, or a checkpoint.dir that fails only at the first checkpoint).
#pragma once

#include <cstdint>
#include <string>

#include "common/manifest.hpp"
#include "common/status.hpp"

namespace parasol {

// The memory this process may use: the machine's physical memory, or its cgroup's limit (v2
// memory.max, v1 memory.limit_in_bytes) where that is lower. `source` says which.
struct MachineMemory {
  uint64_t bytes = 0;
  std::string source;
};
MachineMemory DetectMachineMemory();

// The bytes shard `rank` allocates up front for dense table `t`: its slice's values and
// optimizer state. Sparse tables allocate as rows arrive: 0.
uint64_t DenseTableBytes(const Manifest& m, const TableOptions& t, uint32_t rank);

// Refuses a shard whose dense tables together need more than `memory`, naming the table that
// takes them over it, what it and all need, and what the machine has.
Status CheckTablesFitInMemory(const Manifest& m, uint32_t rank, const MachineMemory& memory);

// With checkpoint.dir set: creates it and the shard's folder in it (as the first checkpoint
// would) and checks a file can be written there. Refuses a path that is not a directory (say,
// /dev/null) or is not writable, naming it.
Status CheckCheckpointDir(const Manifest& m, uint32_t rank);

}  // namespace parasol
