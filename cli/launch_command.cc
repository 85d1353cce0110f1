// parasol launch: every role of a job on this machine, as child processes.
#include <poll.h>
#include <signal.h>
#include <spdlog/spdlog.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <vector>

#include "cli/commands.hpp"
#include "common/json_number.hpp"
#include "common/manifest.hpp"
#include "common/subprocess.hpp"

namespace parasol::cli {
namespace {

struct Role {
  std::string name;  // "server 0", "worker 1"
  bool is_worker = false;
  std::vector<std::string> argv;
  int restarts = 0;
  Subprocess process;
  std::string pending;  // output not yet ended by a newline
  bool finished = false;
};

// Prints what `role` wrote, line by line, behind its name. Returns false at end of output.
bool Relay(Role& role) {
  if (role.process.output_fd() < 0) return false;
  char buf[65536];
  const ssize_t n = ::read(role.process.output_fd(), buf, sizeof(buf));
  if (n <= 0) {
    if (!role.pending.empty()) std::printf("[%s] %s\n", role.name.c_str(), role.pending.c_str());
    role.pending.clear();
    return false;
  }
  role.pending.append(buf, static_cast<size_t>(n));
  size_t start = 0;
  for (size_t nl; (nl = role.pending.find('\n', start)) != std::string::npos; start = nl + 1) {
    std::printf("[%s] %s\n", role.name.c_str(), role.pending.substr(start, nl - start).c_str());
  }
  role.pending.erase(0, start);
  std::fflush(stdout);
  return true;
}

// One object for the whole job, from the workers' own summaries.
std::string CombineSummaries(const std::vector<std::string>& workers) {
  double samples = 0, rate = 0, seconds = 0, bad = 0;
  std::string w0 = workers.empty() ? "" : workers[0];
  for (const std::string& s : workers) {
    samples += JsonNumber(s, "train_samples");
    rate += JsonNumber(s, "samples_per_second");
    seconds = std::max(seconds, JsonNumber(s, "train_seconds"));
    bad += JsonNumber(s, "bad_rows");
  }
  std::ostringstream o;
  o.precision(6);
  o << "{\"eval_logloss\": " << JsonNumber(w0, "eval_logloss")
    << ", \"eval_auc\": " << JsonNumber(w0, "eval_auc")
    << ", \"eval_samples\": " << JsonNumber(w0, "eval_samples")
    << ", \"train_samples\": " << samples << ", \"train_seconds\": " << seconds
    << ", \"samples_per_second\": " << rate << ", \"bad_rows\": " << bad << ", \"workers\": [";
  for (size_t i = 0; i < workers.size(); ++i) o << (i ? ", " : "") << workers[i];
  o << "]}";
  return o.str();
}

}  // namespace

int RunLaunch(const std::string& self_path, const std::string& manifest_path,
              const WorkloadOptions& options, const std::string& summary,
              const std::string& metrics_log) {
  Result<Manifest> manifest = LoadManifest(manifest_path);
  if (!manifest.ok()) {
    spdlog::error("{}", manifest.status().message());
    return 2;
  }
  const bool training =
      manifest->model.kind != ModelOptions::Kind::kNone || !manifest->worker.command.empty();
  char tmpl[] = "/tmp/parasol-launch-XXXXXX";
  const std::string dir = ::mkdtemp(tmpl) ? tmpl : "";
  std::vector<Role> roles;
  auto start = [&](const std::string& name, bool is_worker,
                   const std::vector<std::string>& argv) -> bool {
    auto p = Subprocess::SpawnPiped(argv);
    if (!p.ok()) {
      spdlog::error("launch: {}: {}", name, p.status().ToString());
      return false;
    }
    roles.push_back({name, is_worker, argv, 0, std::move(*p), "", false});
    return true;
  };
  bool ok = true;
  for (uint32_t r = 0; r < manifest->cluster.servers.size() && ok; ++r) {
    ok = start("server " + std::to_string(r), false,
               {self_path, "server", "--manifest", manifest_path, "--rank", std::to_string(r)});
  }
  for (uint32_t w = 0; w < manifest->cluster.workers && ok; ++w) {
    std::vector<std::string> argv;
    if (training) {
      argv = {self_path, "worker", "--manifest", manifest_path, "--rank", std::to_string(w),
              "--summary", dir + "/worker" + std::to_string(w) + ".json"};
      if (!metrics_log.empty()) {
        argv.push_back("--metrics-log");
        argv.push_back(metrics_log + ".worker" + std::to_string(w) + ".jsonl");
      }
    } else {
      argv = {self_path, "loadgen", "--manifest", manifest_path, "--worker", std::to_string(w),
              "--steps", std::to_string(options.steps), "--batch-keys",
              std::to_string(options.batch_keys), "--key-space", std::to_string(options.key_space),
              "--zipf", std::to_string(options.zipf_s), "--seed", std::to_string(options.seed)};
    }
    ok = start("worker " + std::to_string(w), true, argv);
  }

  // Relay output until every worker has finished, or stop everything on the first failure.
  std::string failure = ok ? "" : "a role could not be started";
  size_t workers_left = manifest->cluster.workers;
  while (failure.empty() && workers_left > 0) {
    std::vector<pollfd> fds;
    for (Role& r : roles) fds.push_back({r.process.output_fd(), POLLIN, 0});
    ::poll(fds.data(), fds.size(), 200);
    for (size_t i = 0; i < roles.size(); ++i) {
      if (fds[i].revents & (POLLIN | POLLHUP)) Relay(roles[i]);
    }
    for (Role& r : roles) {
      if (r.finished) continue;
      std::optional<int> status = r.process.Poll();
      if (!status) continue;
      while (Relay(r)) {
      }
      r.finished = true;
      const bool clean = WIFEXITED(*status) && WEXITSTATUS(*status) == 0;
      if (r.is_worker && clean) {
        --workers_left;
      } else if (r.restarts < 10 &&
                 (r.is_worker ? manifest->cluster.restart_workers &&
                                    !(WIFEXITED(*status) &&
                                      WEXITSTATUS(*status) == kExitUpdatesWouldBeLost)
                              : manifest->cluster.restart_servers)) {
        // A server comes back from its newest checkpoint and the workers replay the rest; a
        // worker learns its clock from the shards, skips the batches it trained on and redoes
        // the step it died in (the pushes that arrived are answered as duplicates).
        spdlog::warn("launch: {} {}; restarting it", r.name, DescribeWaitStatus(*status));
        auto p = Subprocess::SpawnPiped(r.argv);
        if (!p.ok()) {
          failure = r.name + " could not be restarted: " + p.status().ToString();
          break;
        }
        r.process = std::move(*p);
        r.finished = false;
        ++r.restarts;
      } else {
        failure = r.name + " " + DescribeWaitStatus(*status);
        break;
      }
    }
  }
  // Servers stop cleanly on SIGTERM (after the workers, or at once on a failure).
  for (Role& r : roles) r.process.Signal(SIGTERM);
  for (Role& r : roles) {
    auto status = r.process.Wait(std::chrono::seconds(30));
    while (Relay(r)) {
    }
    if (!status) {
      r.process.Signal(SIGKILL);
      if (failure.empty()) failure = r.name + " did not stop";
    } else if (failure.empty() && !r.finished &&
               (!WIFEXITED(*status) || WEXITSTATUS(*status) != 0)) {
      failure = r.name + " " + DescribeWaitStatus(*status);
    }
  }
  if (!failure.empty()) {
    spdlog::error("launch: the job failed: {}", failure);
    std::filesystem::remove_all(dir);
    return 1;
  }
  if (training) {
    std::vector<std::string> workers;
    for (uint32_t w = 0; w < manifest->cluster.workers; ++w) {
      std::ifstream in(dir + "/worker" + std::to_string(w) + ".json");
      std::stringstream s;
      s << in.rdbuf();
      std::string text = s.str();
      while (!text.empty() && text.back() == '\n') text.pop_back();
      workers.push_back(text);
    }
    const std::string combined = CombineSummaries(workers);
    std::printf("job: %.0f samples, %.0f samples/s, eval logloss %.4f, AUC %.4f, %.0f bad rows\n",
                JsonNumber(combined, "train_samples"), JsonNumber(combined, "samples_per_second"),
                JsonNumber(combined, "eval_logloss"), JsonNumber(combined, "eval_auc"),
                JsonNumber(combined, "bad_rows"));
    if (!summary.empty()) {
      std::ofstream out(summary);
      out << combined << "\n";
    }
  } else {
    spdlog::info("launch: job finished; every worker's check passed");
  }
  std::filesystem::remove_all(dir);
  return 0;
}

}  // namespace parasol::cli
