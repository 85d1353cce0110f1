#include <signal.h>
#include <sys/resource.h>

#include <spdlog/spdlog.h>

#include <exception>
#include <new>

#include "cli/commands.hpp"
#include "common/manifest.hpp"
#include "common/stop_signal.hpp"
#include "server/shard_server.hpp"
#include "server/startup_checks.hpp"

namespace parasol::cli {

namespace {

int Serve(const std::string& manifest_path, uint32_t rank) {
  StopSignal stop;
  Result<Manifest> manifest = LoadManifest(manifest_path);
  if (!manifest.ok()) {
    spdlog::error("{}", manifest.status().message());
    return 2;
  }
  if (rank >= manifest->cluster.servers.size()) {
    spdlog::error("--rank {} is out of range: {} lists {} servers", rank, manifest_path,
                  manifest->cluster.servers.size());
    return 2;
  }
  // Refused before anything is allocated or bound: tables that cannot fit would end in an
  // allocation failure part way, and a checkpoint.dir that cannot hold files only at the
  // first checkpoint.
  if (Status st = CheckTablesFitInMemory(*manifest, rank, DetectMachineMemory()); !st.ok()) {
    spdlog::error("{}", st.message());
    return 2;
  }
  if (Status st = CheckCheckpointDir(*manifest, rank); !st.ok()) {
    spdlog::error("shard {}: {}", rank, st.message());
    return 2;
  }
  // Every connection takes a descriptor: the soft open-file limit (often 1,024) is raised to
  // the hard one, so that idle peers cannot take the last descriptors the job's workers need.
  rlimit files{};
  if (::getrlimit(RLIMIT_NOFILE, &files) == 0 && files.rlim_cur < files.rlim_max) {
    const rlim_t before = files.rlim_cur;
    files.rlim_cur = files.rlim_max;
    if (::setrlimit(RLIMIT_NOFILE, &files) == 0) {
      spdlog::info("shard {}: open-file limit raised from {} to {}", rank, before,
                   files.rlim_cur);
    }
  }
  if (::getrlimit(RLIMIT_NOFILE, &files) == 0 && files.rlim_cur < 4096) {
    spdlog::warn("shard {}: the open-file limit is {} (hard limit); a few thousand idle "
                 "connections would stop this shard from accepting its workers (raise it: "
                 "ulimit -Hn, LimitNOFILE=)",
                 rank, files.rlim_cur);
  }
  // Background checkpoints are child processes this one waits for: an inherited SIGCHLD
  // disposition of "ignore" would reap them before it could.
  ::signal(SIGCHLD, SIG_DFL);
  ShardServer server(*manifest, rank);
  // Bound first: while it loads its checkpoint (in Serve()), the shard answers every request
  // with how far it is, so that workers wait for it instead of counting it silent.
  if (Status st = server.Bind(); !st.ok()) {
    spdlog::error("{}", st.ToString());
    return 1;
  }
  if (Status st = server.Serve(stop.flag()); !st.ok()) {
    spdlog::error("shard {}: {}", rank, st.ToString());
    return 1;
  }
  if (stop.signal() != 0) spdlog::info("shard {}: stopped by signal {}", rank, stop.signal());
  return 0;
}

}  // namespace

int RunServer(const std::string& manifest_path, uint32_t rank) {
  // An allocation that fails (a table, a request) ends the shard with its reason, not abort().
  try {
    return Serve(manifest_path, rank);
  } catch (const std::bad_alloc&) {
    spdlog::error("shard {}: out of memory (an allocation failed); the shard stops", rank);
  } catch (const std::exception& e) {
    spdlog::error("shard {}: stopped by an error: {}", rank, e.what());
  }
  return 1;
}

}  // namespace parasol::cli
