// The `parasol` program's subcommands. Each Run* returns the process exit code.
#pragma once

#include <cstdint>
#include <string>

#include "worker/workload.hpp"

namespace parasol::cli {

// parasol server --manifest M --rank I
int RunServer(const std::string& manifest_path, uint32_t rank);

// parasol loadgen --manifest M --worker J: a generated push/pull workload, checked.
int RunLoadgen(const std::string& manifest_path, uint32_t worker, WorkloadOptions options);

// parasol stats --manifest M
int RunStats(const std::string& manifest_path);

// parasol shutdown --manifest M
int RunShutdown(const std::string& manifest_path);

// parasol launch --manifest M: every server and worker of the job on this machine.
int RunLaunch(const std::string& self_path, const std::string& manifest_path,
              const WorkloadOptions& options);

}  // namespace parasol::cli
