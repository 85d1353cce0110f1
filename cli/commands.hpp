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
int RunStats(const std::string& manifest_path, const std::string& key_path);
// `parasol scale`: asks shard 0 for `workers` workers; prints the membership it names.
int RunScale(const std::string& manifest_path, uint64_t workers, const std::string& key_path);
// `parasol scale --servers`: changes the shard count and moves the rows (worker/reshard.hpp).
int RunScaleServers(const std::string& manifest_path, uint32_t servers, double timeout_s,
                    const std::string& key_path);

// parasol shutdown --manifest M
int RunShutdown(const std::string& manifest_path, const std::string& key_path);

// parasol checkpoint --manifest M
int RunCheckpoint(const std::string& manifest_path, const std::string& key_path);

// parasol keygen --out DIR [--name NAME] [--count N]: one key pair NAME, or with N > 0 the N
// pairs NAME0 .. NAME<N-1> (one per worker rank, for security.worker_keys).
int RunKeygen(const std::string& dir, const std::string& name, uint32_t count);

// The most processes (servers and workers together) `parasol launch` starts on one machine.
inline constexpr uint64_t kMaxLaunchProcesses = 256;

// parasol launch --manifest M: every server and worker of the job on this machine, their output
// prefixed with their role; everything stops if one fails. A job of more than
// kMaxLaunchProcesses roles is refused.
int RunLaunch(const std::string& self_path, const std::string& manifest_path,
              const WorkloadOptions& options, const std::string& summary,
              const std::string& metrics_log);

// Objects allocated (global operator new) by the calling thread so far, when this build counts
// them (AllocationsCounted(): not under a sanitizer).
bool AllocationsCounted();
uint64_t ThreadAllocations();

// The exit code of a worker that fails while acknowledged updates are only in its memory (a
// replay to a restarted shard refused, due or unfinished, or a shard unreachable): `parasol
// launch` does not restart it, so the job fails instead of losing them.
inline constexpr int kExitUpdatesWouldBeLost = 3;

// parasol worker --manifest M --rank J: trains the manifest's model.
int RunWorker(const std::string& manifest_path, uint32_t rank, const std::string& summary,
              const std::string& key_path, const std::string& metrics_log, bool join = false,
              const std::string& trace_rows = "", const std::string& step_times = "");

// parasol gen-data --rows N --out FILE
int RunGenData(uint64_t rows, const std::string& out, uint64_t seed,
               uint64_t vocabulary = 2000000);

// parasol convert --in TEXT --out BINARY [--no-label] [--on-bad-row skip|fail]
int RunConvert(const std::string& in, const std::string& out, bool has_label, bool fail_on_bad);

// parasol manifest explain KEY: a field's type, default and meaning (KEY as tables.dim,
// tables[].dim or tables[0].dim), or a section's fields; 1 with the nearest paths for an
// unknown KEY.
int RunManifestExplain(const std::string& key);
// parasol manifest reference: the Markdown reference (docs/manifest.md).
int RunManifestReference();
// parasol manifest example: the commented example manifest (examples/manifest.yaml).
int RunManifestExample();

}  // namespace parasol::cli
