#include <signal.h>

#include <spdlog/spdlog.h>

#include "cli/commands.hpp"
#include "common/manifest.hpp"
#include "common/stop_signal.hpp"
#include "server/shard_server.hpp"

namespace parasol::cli {

int RunServer(const std::string& manifest_path, uint32_t rank) {
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

}  // namespace parasol::cli
