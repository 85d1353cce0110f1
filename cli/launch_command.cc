// parasol launch: every role of a job on this machine, as child processes.
#include <poll.h>
#include <signal.h>
#include <spdlog/spdlog.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <vector>

#include "cli/commands.hpp"
#include "common/json_text.hpp"
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

// A worker's summary, read back from `path`: any JSON object (a worker.command program writes
// its own). The error names the file and shows the start of what it holds.
// `optional`: a worker.command program need not write one (its figures are then absent).
Result<Json> ReadSummary(uint32_t worker, const std::string& path, bool optional) {
  const std::string what = "worker " + std::to_string(worker) + "'s summary " + path;
  std::ifstream in(path);
  if (!in.is_open() && optional) {
    spdlog::info("launch: worker {} wrote no summary (PARASOL_SUMMARY)", worker);
    return Json::object();
  }
  if (!in.is_open()) return IoError(what + " was not written");
  std::stringstream s;
  s << in.rdbuf();
  const std::string text = s.str();
  std::string problem;
  Json summary;
  try {
    summary = Json::parse(text);
    if (!summary.is_object()) problem = std::string("a JSON ") + summary.type_name();
  } catch (const Json::exception& e) {
    problem = e.what();
  }
  if (problem.empty()) return summary;
  const size_t kShown = 200;
  return InvalidArgument(what + " is not a JSON object (" + problem + "); it holds: " +
                         CompactJson(Json(text.substr(0, kShown))) +
                         (text.size() > kShown ? "..." : ""));
}

// A figure of a worker's summary: 0 when absent, NaN when null (how JSON writes a NaN).
Result<double> Figure(const Json& summary, const char* key) {
  const auto it = summary.find(key);
  if (it == summary.end()) return 0.0;
  if (it->is_null()) return std::nan("");
  if (!it->is_number()) return InvalidArgument(std::string("\"") + key + "\" is not a number");
  return it->get<double>();
}

// A count in a worker's summary: 0 when absent, else a whole number >= 0.
Result<uint64_t> Count(const Json& summary, const char* key) {
  const auto it = summary.find(key);
  if (it == summary.end()) return uint64_t{0};
  if (it->is_number_unsigned()) return it->get<uint64_t>();
  if (it->is_number_float()) {
    const double v = it->get<double>();
    if (v >= 0 && v < 1.8e19 && v == std::floor(v)) return static_cast<uint64_t>(v);
  }
  return InvalidArgument(std::string("\"") + key + "\" is not a whole number >= 0");
}

// One object for the whole job, from the workers' own summaries: the sums over the workers,
// worker 0's evaluation, and each worker's summary as it wrote it.
Result<Json> CombineSummaries(const std::vector<Json>& workers) {
  uint64_t samples = 0, bad = 0;
  double rate = 0, seconds = 0;
  for (size_t w = 0; w < workers.size(); ++w) {
    const Json& s = workers[w];
    const std::string where = "worker " + std::to_string(w) + "'s summary: ";
    Result<uint64_t> n = Count(s, "train_samples");
    Result<uint64_t> b = Count(s, "bad_rows");
    Result<double> r = Figure(s, "samples_per_second");
    Result<double> t = Figure(s, "train_seconds");
    for (const Status& st : {n.status(), b.status(), r.status(), t.status()}) {
      if (!st.ok()) return InvalidArgument(where + st.message());
    }
    samples += *n;
    bad += *b;
    rate += *r;
    seconds = std::max(seconds, *t);
  }
  const Json w0 = workers.empty() ? Json::object() : workers[0];
  Result<double> logloss = Figure(w0, "eval_logloss");
  Result<double> auc = Figure(w0, "eval_auc");
  Result<uint64_t> eval_samples = Count(w0, "eval_samples");
  for (const Status& st : {logloss.status(), auc.status(), eval_samples.status()}) {
    if (!st.ok()) return InvalidArgument("worker 0's summary: " + st.message());
  }
  Json o;
  o["eval_logloss"] = *logloss;
  o["eval_auc"] = *auc;
  o["eval_samples"] = *eval_samples;
  o["train_samples"] = samples;
  o["train_seconds"] = seconds;
  o["samples_per_second"] = rate;
  o["bad_rows"] = bad;
  o["workers"] = workers;
  return o;
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
  // Every role is a process on this machine: a manifest listing thousands would start them
  // all. A job that large runs across machines (parasol render), one role per host.
  const uint64_t processes = manifest->cluster.servers.size() + uint64_t{manifest->cluster.workers};
  if (processes > kMaxLaunchProcesses) {
    spdlog::error("launch: {} lists {} servers and {} workers: {} processes, over the limit of {} "
                  "that launch starts on one machine (run a job this large across machines: "
                  "parasol render k8s|slurm)",
                  manifest_path, manifest->cluster.servers.size(), manifest->cluster.workers,
                  processes, kMaxLaunchProcesses);
    return 2;
  }
  const bool training =
      manifest->model.kind != ModelOptions::Kind::kNone || !manifest->worker.command.empty();
  char tmpl[] = "/tmp/parasol-launch-XXXXXX";
  const std::string dir = ::mkdtemp(tmpl) ? tmpl : "";
  std::vector<Role> roles;
  // Each role dies with this process (cli/main.cc): none is left behind by a launcher killed.
  ::setenv("PARASOL_LAUNCHER_PID", std::to_string(::getpid()).c_str(), 1);
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
    } else if (failure.empty() && !r.finished && !r.is_worker && WIFSIGNALED(*status) &&
               WTERMSIG(*status) == SIGTERM) {
      // Killed by our SIGTERM before it had set up its handler (the workers were done before it
      // had started): it had served nothing.
      spdlog::info("launch: {} stopped before it had started", r.name);
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
    std::vector<Json> workers;
    Status problem;
    for (uint32_t w = 0; w < manifest->cluster.workers && problem.ok(); ++w) {
      Result<Json> s = ReadSummary(w, dir + "/worker" + std::to_string(w) + ".json",
                                    !manifest->worker.command.empty());
      if (s.ok()) {
        workers.push_back(std::move(*s));
      } else {
        problem = s.status();
      }
    }
    Result<Json> combined = problem.ok() ? CombineSummaries(workers) : Result<Json>(problem);
    if (!combined.ok()) {
      spdlog::error("launch: no job summary: {}", combined.status().message());
      std::filesystem::remove_all(dir);
      return 1;
    }
    const Json& c = *combined;
    std::printf("job: %llu samples, %.0f samples/s, eval logloss %.4f, AUC %.4f, %llu bad rows\n",
                static_cast<unsigned long long>(c["train_samples"].get<uint64_t>()),
                c["samples_per_second"].get<double>(), c["eval_logloss"].get<double>(),
                c["eval_auc"].get<double>(),
                static_cast<unsigned long long>(c["bad_rows"].get<uint64_t>()));
    if (!summary.empty()) {
      std::ofstream out(summary);
      out << SpacedJson(c) << "\n";
    }
  } else {
    spdlog::info("launch: job finished; every worker's check passed");
  }
  std::filesystem::remove_all(dir);
  return 0;
}

}  // namespace parasol::cli
