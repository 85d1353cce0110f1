#include <spdlog/spdlog.h>

#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <chrono>
#include <fstream>
#include <iomanip>

#include "cli/commands.hpp"
#include "common/manifest.hpp"
#include "common/metrics_server.hpp"
#include "worker/backend.hpp"
#include "worker/binary_data.hpp"
#include "worker/data_generator.hpp"
#include "worker/ps_client.hpp"
#include "worker/trainer.hpp"
#include "common/stop_signal.hpp"

namespace parasol::cli {
namespace {

// worker.command: this role becomes that program (in the manifest's folder), which learns its
// job from the environment. Returns only when it cannot be started.
int ExecWorkerCommand(const Manifest& manifest, const std::string& manifest_path, uint32_t rank,
                      const std::string& summary, const std::string& key_path) {
  std::error_code ec;
  const std::string absolute = std::filesystem::absolute(manifest_path, ec).string();
  ::setenv("PARASOL_MANIFEST", ec ? manifest_path.c_str() : absolute.c_str(), 1);
  ::setenv("PARASOL_WORKER", std::to_string(rank).c_str(), 1);
  // Unset when not given: values inherited from the caller's environment must not leak in.
  ::unsetenv("PARASOL_SUMMARY");
  ::unsetenv("PARASOL_KEY");
  if (!summary.empty()) {
    const std::string s = std::filesystem::absolute(summary, ec).string();
    ::setenv("PARASOL_SUMMARY", ec ? summary.c_str() : s.c_str(), 1);
  }
  if (!key_path.empty()) {
    const std::string k = std::filesystem::absolute(key_path, ec).string();
    ::setenv("PARASOL_KEY", ec ? key_path.c_str() : k.c_str(), 1);
  }
  // Run from a build tree, the Python package beside this program comes first on the path.
  const std::filesystem::path python_dir =
      std::filesystem::read_symlink("/proc/self/exe", ec).parent_path() / "python";
  if (!ec && std::filesystem::exists(python_dir / "parasol" / "__init__.py", ec)) {
    const char* old = std::getenv("PYTHONPATH");
    const std::string path =
        python_dir.string() + (old && *old ? std::string(":") + old : std::string());
    ::setenv("PYTHONPATH", path.c_str(), 1);
  }
  const std::vector<std::string>& command = manifest.worker.command;
  if (::chdir(manifest.worker.command_dir.c_str()) != 0) {
    spdlog::error("worker {}: worker.command: cannot enter '{}': {}", rank,
                  manifest.worker.command_dir, std::strerror(errno));
    return 2;
  }
  std::vector<char*> argv;
  for (const std::string& a : command) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  std::fflush(stdout);
  ::execvp(argv[0], argv.data());
  spdlog::error("worker {}: worker.command: cannot run '{}' (in '{}'): {}", rank, command[0],
                manifest.worker.command_dir, std::strerror(errno));
  return 2;
}

}  // namespace

int RunWorker(const std::string& manifest_path, uint32_t rank, const std::string& summary,
              const std::string& key_path, const std::string& metrics_log, bool join,
              const std::string& trace_rows, const std::string& step_times) {
  Result<Manifest> manifest = LoadManifest(manifest_path);
  if (!manifest.ok()) {
    spdlog::error("{}", manifest.status().message());
    return 2;
  }
  if (rank >= manifest->cluster.max_workers) {
    spdlog::error("--rank {} is out of range: cluster.workers is {}, cluster.max_workers {}", rank,
                  manifest->cluster.workers, manifest->cluster.max_workers);
    return 2;
  }
  // A rank beyond the first cluster.workers joins the running job.
  join = join || rank >= manifest->cluster.workers;
  // In a job whose size may change, SIGTERM and SIGINT ask the worker to leave at a clock
  // boundary (it trains the steps before it; SIGKILL stops it at once).
  std::unique_ptr<StopSignal> leave_signal;
  if (manifest->cluster.max_workers > manifest->cluster.workers) {
    leave_signal = std::make_unique<StopSignal>();
  }
  if (!manifest->worker.command.empty()) {
    return ExecWorkerCommand(*manifest, manifest_path, rank, summary, key_path);
  }
  if (manifest->model.kind == ModelOptions::Kind::kNone) {
    spdlog::error("{}: key 'model': no model to train (use `parasol loadgen` to drive the tables,"
                  " or set worker.command)",
                  manifest_path);
    return 2;
  }
  // The device first: a worker that cannot compute fails before it joins the job.
  Result<std::unique_ptr<Backend>> backend = MakeBackend(manifest->worker);
  if (!backend.ok()) {
    spdlog::error("worker {}: {}", rank, backend.status().ToString());
    return 2;
  }
  spdlog::info("worker {}: computing on {}", rank, manifest->worker.device);
  auto client = PsClient::Connect(*manifest, rank, key_path, {}, join);
  if (!client.ok()) {
    spdlog::error("worker {}: {}", rank, client.status().ToString());
    // Updates were lost and the job said to fail on that: a restart would find the same.
    const std::string& what = client.status().message();
    const std::string note = PsClient::kOverlapFailNote;
    if (what.size() >= note.size() &&
        what.compare(what.size() - note.size(), note.size(), note) == 0) {
      return kExitUpdatesWouldBeLost;
    }
    return 1;
  }
  std::unique_ptr<MetricsServer> metrics;
  if (manifest->metrics.enabled) {
    metrics = std::make_unique<MetricsServer>(manifest->metrics.host,
                                              manifest->metrics.worker_port + rank);
    if (Status st = metrics->Start(); !st.ok()) {
      spdlog::error("worker {}: {}", rank, st.ToString());
      return 1;
    }
  }
  std::ofstream log;
  if (!metrics_log.empty()) {
    log.open(metrics_log, std::ios::app);
    if (!log) {
      spdlog::error("worker {}: cannot write the metrics log '{}'", rank, metrics_log);
      return 1;
    }
  }
  TrainerHooks hooks;
  hooks.line = [](const std::string& line) {
    std::printf("%s\n", line.c_str());
    std::fflush(stdout);
  };
  hooks.point = [&](const ProgressPoint& p) {
    if (log.is_open()) log << p.ToJson() << "\n" << std::flush;
    if (metrics) metrics->Publish(p.ToPrometheus());
  };
  if (AllocationsCounted()) hooks.allocations = ThreadAllocations;
  if (leave_signal) hooks.leave_requested = [&] { return leave_signal->flag().load(); };
  // Diagnostics: each trained step's data-stream lines, and when it ended.
  std::ofstream trace, times;
  for (auto [path, out] : {std::pair{&trace_rows, &trace}, std::pair{&step_times, &times}}) {
    if (path->empty()) continue;
    out->open(*path, std::ios::app);
    if (!*out) {
      spdlog::error("worker {}: cannot write '{}'", rank, *path);
      return 1;
    }
  }
  if (trace.is_open() || times.is_open()) {
    hooks.trained = [&](const Batch& b) {
      if (trace.is_open()) {
        trace << b.step << ' ' << b.micro;
        for (uint64_t p : b.positions) trace << ' ' << p;
        trace << '\n' << std::flush;  // whole lines, also when the worker is killed
      }
      if (times.is_open()) {
        const double now = std::chrono::duration<double>(
                               std::chrono::steady_clock::now().time_since_epoch())
                               .count();
        times << b.step << ' ' << std::fixed << std::setprecision(6) << now << '\n' << std::flush;
      }
    };
  }
  // After a rollback the worker connects as a new process of its rank would.
  hooks.reconnect = [&]() -> Result<PsClient*> {
    auto again = PsClient::Connect(*manifest, rank, key_path, {}, /*join=*/false);
    if (!again.ok()) return again.status();
    *client = std::move(*again);
    return client->get();
  };
  Trainer trainer(*manifest, rank, client->get(), backend->get(), hooks);
  Result<TrainReport> report = trainer.Run();
  if (!report.ok()) {
    spdlog::error("worker {}: {}", rank, report.status().ToString());
    // Its push log would die with it: a restart could not replay what the shard refused.
    // So is a failure while a replay is due, or with a shard unreachable (it may be restarting
    // and need this worker's log).
    const StatusCode code = report.status().code();
    if ((*client)->replay_failed() || (*client)->replay_pending() ||
        code == StatusCode::kTimeout || code == StatusCode::kUnavailable) {
      return kExitUpdatesWouldBeLost;
    }
    return 1;
  }
  if (report->bad_rows > 0) {
    spdlog::warn("worker {}: skipped {} malformed rows; the first: {}", rank, report->bad_rows,
                 report->first_bad_row);
  }
  std::printf("%s\n", report->Summary().c_str());
  if (!summary.empty()) {
    std::ofstream out(summary);
    out << report->ToJson() << "\n";
    if (!out) {
      spdlog::error("cannot write the summary to '{}'", summary);
      return 1;
    }
  }
  return 0;
}

int RunGenData(uint64_t rows, const std::string& out, uint64_t seed, uint64_t vocabulary) {
  GeneratorOptions o;
  o.rows = rows;
  o.seed = seed;
  o.vocabulary = vocabulary;
  Status st = GenerateCriteo(out, o);
  if (!st.ok()) {
    spdlog::error("{}", st.ToString());
    return 1;
  }
  std::printf("wrote %llu Criteo-format rows to %s\n", static_cast<unsigned long long>(rows),
              out.c_str());
  return 0;
}

int RunConvert(const std::string& in, const std::string& out, bool has_label, bool fail_on_bad) {
  Result<ConvertReport> r =
      ConvertCriteo(in, out, has_label,
                    fail_on_bad ? DataOptions::OnBadRow::kFail : DataOptions::OnBadRow::kSkip);
  if (!r.ok()) {
    spdlog::error("{}", r.status().ToString());
    return 1;
  }
  std::printf("wrote %llu rows of %s to %s (binary)", static_cast<unsigned long long>(r->rows),
              in.c_str(), out.c_str());
  if (r->bad_rows > 0) {
    std::printf("; left out %llu malformed rows, the first at %s",
                static_cast<unsigned long long>(r->bad_rows), r->first_bad.c_str());
  }
  std::printf("\n");
  return 0;
}

}  // namespace parasol::cli
