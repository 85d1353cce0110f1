// parasol: the one command-line program. Subcommands start a role or talk to a running job.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <spdlog/spdlog.h>
#include <signal.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <climits>
#include <cstdlib>
#include <exception>
#include <new>
#include <cstdint>
#include <limits>
#include <string>

#include "cli/commands.hpp"
#include "cli/strict_numbers.hpp"
#include "common/cluster_render.hpp"
#include "server/checkpoint.hpp"
#include "server/model_export.hpp"
#include "worker/backend.hpp"
#include "common/transport.hpp"
#include "common/wire.hpp"

namespace {

std::string SelfPath(const char* argv0) {
  char buf[PATH_MAX];
  const ssize_t n = ::readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  if (n > 0) return std::string(buf, static_cast<size_t>(n));
  return argv0;
}

// The checked push/pull workload's options, listed under `group` in --help.
void AddWorkloadOptions(CLI::App* cmd, parasol::WorkloadOptions* w, const std::string& group) {
  using parasol::cli::Count;
  cmd->add_option("--steps", w->steps, "push/pull rounds")
      ->capture_default_str()
      ->check(Count(0, 1000000000))
      ->group(group);
  cmd->add_option("--batch-keys", w->batch_keys, "sparse keys per round")
      ->capture_default_str()
      ->check(Count(1, uint64_t{1} << 24))
      ->group(group);
  cmd->add_option("--key-space", w->key_space, "distinct keys drawn from")
      ->capture_default_str()
      ->check(Count(1, uint64_t{1} << 62))
      ->group(group);
  cmd->add_option("--zipf", w->zipf_s, "Zipf exponent of the key draws")
      ->capture_default_str()
      ->check(parasol::cli::FiniteNumber(0, 100))
      ->group(group);
  cmd->add_option("--seed", w->seed, "random seed")
      ->capture_default_str()
      ->check(Count(0, UINT64_MAX))
      ->group(group);
}

int Main(int argc, char** argv) {
  // A role `parasol launch` started dies with it: a launcher killed leaves no process holding
  // the job's ports, and launching the manifest again resumes the job from its checkpoints.
  if (const char* launcher = std::getenv("PARASOL_LAUNCHER_PID")) {
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (std::to_string(::getppid()) != launcher) return 1;  // it died before the line above
    ::unsetenv("PARASOL_LAUNCHER_PID");                      // not for what this one starts
  }
  using parasol::cli::Count;
  using parasol::cli::FiniteNumber;
  // Ranks are checked against the manifest once it is read; this bounds the text.
  const CLI::Validator kRank = Count(0, UINT32_MAX);
  parasol::TuneAllocatorForLargeMessages();
  spdlog::set_pattern("[%H:%M:%S.%e] [%l] %v");
  spdlog::flush_on(spdlog::level::info);  // logs reach a pipe or file as they happen
  CLI::App app{"Parasol: a parameter server for recommendation models"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "parasol 0.1.0 (wire protocol " +
                                        std::to_string(parasol::kProtocolVersion) + ")");

  std::string manifest;
  uint32_t rank = 0;
  uint32_t worker = 0;
  parasol::WorkloadOptions workload;

  auto* server = app.add_subcommand("server", "run one server shard");
  server->add_option("--manifest,-m", manifest, "job manifest (YAML)")->required();
  server->add_option("--rank,-r", rank, "this shard's index in cluster.servers")
      ->required()
      ->check(kRank);

  auto* loadgen = app.add_subcommand("loadgen", "push and pull a generated workload, checked");
  loadgen->add_option("--manifest,-m", manifest, "job manifest (YAML)")->required();
  loadgen->add_option("--worker,-w", worker, "worker id")->capture_default_str()->check(kRank);
  AddWorkloadOptions(loadgen, &workload, "Options");

  std::string summary;
  auto* launch = app.add_subcommand("launch", "run every server and worker on this machine");
  launch->add_option("manifest,--manifest,-m", manifest, "job manifest (YAML)")->required();
  launch->add_option("--summary", summary, "write the job's summary (JSON) here");
  AddWorkloadOptions(launch, &workload,
                     "Without a model in the manifest: the workers run loadgen's checked "
                     "push/pull workload");

  auto* worker_cmd = app.add_subcommand("worker", "train the manifest's model as one worker");
  worker_cmd->add_option("--manifest,-m", manifest, "job manifest (YAML)")->required();
  worker_cmd->add_option("--rank,-r", rank,
                         "this worker's id, 0 .. cluster.workers-1; a rank up to "
                         "cluster.max_workers-1 joins the running job")
      ->required()
      ->check(kRank);
  bool join = false;
  worker_cmd->add_flag("--join", join,
                       "join the running job (implied by a rank of cluster.workers or more)");
  std::string trace_rows;
  worker_cmd->add_option("--trace-rows", trace_rows,
                         "write each trained batch's step, micro-batch and data-stream lines here");
  std::string step_times;
  worker_cmd->add_option("--step-times", step_times,
                         "write each trained step and when it ended (steady clock, seconds)");
  worker_cmd->add_option("--summary", summary, "write this worker's summary (JSON) here");
  std::string metrics_log;
  worker_cmd->add_option("--metrics-log", metrics_log,
                         "append progress and eval figures here, one JSON object a line");
  launch->add_option("--metrics-log", metrics_log,
                     "each worker appends its figures to PREFIX.workerJ.jsonl");

  uint64_t rows = 100000;
  uint64_t seed = 1;
  std::string out;
  auto* gen = app.add_subcommand("gen-data", "write Criteo-format synthetic data");
  // 10^10 rows are about 2 TB of text.
  gen->add_option("--rows,-n", rows, "rows to write")
      ->capture_default_str()
      ->check(Count(1, 10000000000ull));
  gen->add_option("--out,-o", out, "output file")->required();
  gen->add_option("--seed", seed, "random seed")->capture_default_str()->check(Count(0, UINT64_MAX));
  uint64_t vocabulary = 2000000;
  gen->add_option("--vocabulary", vocabulary,
                  "the largest categorical field's cardinality (the others log-spaced from 10)")
      ->capture_default_str()
      ->check(Count(10, uint64_t{1} << 62));

  std::string convert_in, convert_out, convert_bad = "skip";
  bool convert_unlabeled = false;
  auto* convert = app.add_subcommand(
      "convert", "write a binary, pre-parsed copy of Criteo-format text data, which workers "
                 "read through mmap without parsing (give it as data.train or data.eval)");
  convert->add_option("--in,-i", convert_in, "Criteo-format text file")->required();
  convert->add_option("--out,-o", convert_out, "the binary file to write")->required();
  convert->add_flag("--no-label", convert_unlabeled,
                    "rows have no label (39 fields, as Criteo's test file)");
  convert->add_option("--on-bad-row", convert_bad, "skip (count) or fail on a malformed row")
      ->capture_default_str()
      ->check(CLI::IsMember({"skip", "fail"}));

  auto* stats = app.add_subcommand("stats", "print every shard's counters");
  stats->add_option("--manifest,-m", manifest, "job manifest (YAML)")->required();

  uint64_t scale_workers = 0;
  uint32_t scale_servers = 0;
  double scale_timeout = 600;
  auto* scale = app.add_subcommand(
      "scale", "change a running job's worker count (the highest ranks beyond it leave at a "
               "clock shard 0 names; start joining workers with `parasol worker --rank R`) or "
               "its shard count (rows move to their new shards while it trains)");
  scale->add_option("--manifest,-m", manifest, "job manifest (YAML)")->required();
  // A job has at least one worker and one shard; the manifest bounds them further.
  auto* scale_w = scale->add_option("--workers,-w", scale_workers, "the number of workers wanted")
                      ->check(Count(1, UINT32_MAX));
  auto* scale_s = scale->add_option("--servers,-s", scale_servers,
                                    "the number of shards wanted, of those cluster.servers lists")
                      ->check(Count(1, UINT32_MAX));
  scale_w->excludes(scale_s);
  scale->add_option("--timeout", scale_timeout,
                    "seconds a change of the shard count may take before the tool gives up "
                    "(running it again finishes the change)")
      ->capture_default_str()
      ->check(FiniteNumber(0.001, 1e9));

  auto* shutdown = app.add_subcommand("shutdown", "stop every shard of a running job");
  shutdown->add_option("--manifest,-m", manifest, "job manifest (YAML)")->required();

  std::string target;
  parasol::RenderOptions render_options;
  auto* render = app.add_subcommand("render", "print Kubernetes objects or a Slurm script for a job");
  render->add_option("target", target, "k8s or slurm")
      ->required()
      ->check(CLI::IsMember({"k8s", "slurm"}));
  render->add_option("manifest", manifest, "job manifest (YAML)")->required();
  render->add_option("--image", render_options.image, "container image (k8s)")
      ->capture_default_str();
  render->add_option("--namespace", render_options.k8s_namespace, "namespace (k8s)")
      ->capture_default_str();
  render->add_option("--binary", render_options.binary, "path of parasol in the image or on nodes")
      ->capture_default_str();
  render->add_option("--server-cpus", render_options.server_cpus)
      ->capture_default_str()
      ->check(Count(1, 1 << 16));
  render->add_option("--servers-per-node", render_options.servers_per_node,
                     "slurm: shards per node (ports of their own each)")
      ->capture_default_str()
      ->check(Count(1, 1 << 10));
  render->add_option("--server-memory", render_options.server_memory)->capture_default_str();
  render->add_option("--worker-cpus", render_options.worker_cpus)
      ->capture_default_str()
      ->check(Count(1, 1 << 16));
  render->add_option("--worker-memory", render_options.worker_memory)->capture_default_str();
  render->add_option("--worker-gpus", render_options.worker_gpus, "GPUs per worker")
      ->capture_default_str()
      ->check(Count(0, 1 << 10));
  render->add_option("--time", render_options.time, "slurm: the job's time limit (sbatch --time)");
  render->add_option("--partition", render_options.partition, "slurm: sbatch --partition");
  render->add_option("--account", render_options.account, "slurm: sbatch --account");
  render->add_option("--output", render_options.output,
                     "slurm: the job's output file (sbatch --output, e.g. parasol-%j.out)");
  render->add_option("--sbatch", render_options.sbatch_lines,
                     "slurm: an extra #SBATCH line, e.g. --sbatch '--qos=high' (repeatable)");
  render->add_flag("!--no-exclusive", render_options.exclusive,
                   "slurm: let other jobs share the servers' nodes (by default they are the "
                   "job's alone: the servers listen on the manifest's fixed ports)");

  std::string keys_out, key_name = "parasol";
  auto* keygen = app.add_subcommand("keygen", "write a CURVE key pair (NAME.key, NAME.pub)");
  keygen->add_option("--out,-o", keys_out, "folder for the key files")->required();
  keygen->add_option("--name", key_name, "key pair name")->capture_default_str();
  uint32_t key_count = 0;
  keygen->add_option("--count", key_count,
                     "write N pairs NAME0 .. NAME<N-1> (e.g. one per worker, for "
                     "security.worker_keys)")
      ->check(Count(0, 1 << 16));

  auto* checkpoint = app.add_subcommand("checkpoint", "ask every shard to write a checkpoint now");
  checkpoint->add_option("--manifest,-m", manifest, "job manifest (YAML)")->required();

  parasol::ExportOptions export_options;
  auto* export_cmd = app.add_subcommand("export", "write the model of a checkpoint for serving");
  export_cmd->add_option("--manifest,-m", manifest, "job manifest (YAML)")->required();
  export_cmd->add_option("--checkpoint", export_options.checkpoint_dir,
                         "checkpoint folder (default checkpoint.dir)");
  export_cmd->add_option("--sequence", export_options.sequence,
                         "checkpoint sequence (default: each shard's newest)")
      ->check(Count(0, parasol::kMaxCheckpointSequence));
  export_cmd->add_option("--since", export_options.since,
                         "only the rows changed since this checkpoint sequence")
      ->check(Count(0, parasol::kMaxCheckpointSequence));
  export_cmd->add_option("--out,-o", out, "output folder")->required();

  std::string model_a, model_b;
  double tolerance = 0;
  auto* compare = app.add_subcommand(
      "compare-models", "how far one exported model is from another (JSON on stdout)");
  compare->add_option("--manifest,-m", manifest, "job manifest (YAML)")->required();
  compare->add_option("a", model_a, "exported model folder")->required();
  compare->add_option("b", model_b, "exported model folder to compare against")->required();
  compare->add_option("--tolerance", tolerance,
                      "exit 1 when the largest relative difference is above this")
      ->capture_default_str()
      ->check(FiniteNumber(0, std::numeric_limits<double>::max()));

  auto* manifest_cmd = app.add_subcommand(
      "manifest", "describe the manifest's fields (from the table the reference is generated "
                  "from)");
  manifest_cmd->require_subcommand(1);
  std::string field_key;
  auto* explain = manifest_cmd->add_subcommand(
      "explain", "print a field's type, default and meaning, or a section's fields");
  explain->add_option("key", field_key, "e.g. training.batch_size, tables.dim or tables[0].dim")
      ->required();
  auto* reference = manifest_cmd->add_subcommand(
      "reference", "print the Markdown reference of every field (docs/manifest.md)");
  auto* example = manifest_cmd->add_subcommand(
      "example", "print a commented manifest naming every field (examples/manifest.yaml)");

  std::string key_path;
  for (auto* cmd : {worker_cmd, stats, shutdown, checkpoint, scale}) {
    cmd->add_option("--key", key_path, "this client's CURVE key pair (default security.client_key)");
  }
  std::string log_level = "info";
  app.add_option("--log-level", log_level, "trace, debug, info, warn, error or off")
      ->capture_default_str()
      ->check(CLI::IsMember({"trace", "debug", "info", "warn", "error", "off"}));

  CLI11_PARSE(app, argc, argv);
  spdlog::set_level(spdlog::level::from_str(log_level));
  // Every line names the role and rank that wrote it.
  if (*server) {
    spdlog::set_pattern("[%H:%M:%S.%e] [%l] [server " + std::to_string(rank) + "] %v");
  } else if (*worker_cmd) {
    spdlog::set_pattern("[%H:%M:%S.%e] [%l] [worker " + std::to_string(rank) + "] %v");
  }
  if (*keygen) return parasol::cli::RunKeygen(keys_out, key_name, key_count);
  if (*explain) return parasol::cli::RunManifestExplain(field_key);
  if (*reference) return parasol::cli::RunManifestReference();
  if (*example) return parasol::cli::RunManifestExample();

  if (*server) return parasol::cli::RunServer(manifest, rank);
  if (*loadgen) return parasol::cli::RunLoadgen(manifest, worker, workload);
  if (*launch) {
    return parasol::cli::RunLaunch(SelfPath(argv[0]), manifest, workload, summary, metrics_log);
  }
  if (*worker_cmd) {
    return parasol::cli::RunWorker(manifest, rank, summary, key_path, metrics_log, join,
                                   trace_rows, step_times);
  }
  if (*scale && *scale_s) {
    return parasol::cli::RunScaleServers(manifest, scale_servers, scale_timeout, key_path);
  }
  if (*scale && !*scale_w) {
    std::fprintf(stderr, "scale: give --workers N or --servers N\n");
    return 2;
  }
  if (*scale) return parasol::cli::RunScale(manifest, scale_workers, key_path);
  if (*gen) return parasol::cli::RunGenData(rows, out, seed, vocabulary);
  if (*convert) {
    return parasol::cli::RunConvert(convert_in, convert_out, !convert_unlabeled,
                                    convert_bad == "fail");
  }
  if (*render) {
    auto text = target == "k8s" ? parasol::RenderKubernetes(manifest, render_options)
                                : parasol::RenderSlurm(manifest, render_options);
    if (!text.ok()) {
      spdlog::error("{}", text.status().message());
      return 2;
    }
    std::fputs(text->c_str(), stdout);
    return 0;
  }
  if (*stats) return parasol::cli::RunStats(manifest, key_path);
  if (*shutdown) return parasol::cli::RunShutdown(manifest, key_path);
  if (*checkpoint) return parasol::cli::RunCheckpoint(manifest, key_path);
  if (*compare) {
    auto m = parasol::LoadManifest(manifest);
    if (!m.ok()) {
      spdlog::error("{}", m.status().ToString());
      return 2;
    }
    auto a = parasol::LoadExportedModel(*m, model_a);
    auto b = a.ok() ? parasol::LoadExportedModel(*m, model_b) : a;
    if (!a.ok() || !b.ok()) {
      spdlog::error("{}", (a.ok() ? b : a).status().ToString());
      return 2;
    }
    if (parasol::Status st = parasol::CheckComparable(*a, model_a, *b, model_b); !st.ok()) {
      spdlog::error("{}", st.ToString());
      return 2;
    }
    const parasol::ModelDifference d = parasol::CompareModels(*a, *b);
    std::printf("%s\n", d.ToJson().c_str());
    return d.max_relative > tolerance ? 1 : 0;
  }
  if (*export_cmd) {
    auto m = parasol::LoadManifest(manifest);
    parasol::Status st = m.ok() ? parasol::ExportModel(*m, export_options, out) : m.status();
    if (!st.ok()) {
      spdlog::error("{}", st.ToString());
      return 1;
    }
    std::printf("exported the model to %s\n", out.c_str());
    return 0;
  }
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  // No role keeps a core busy with OpenBLAS threads it does not use (worker/backend.hpp).
  parasol::EndIdleBlasThreads();
  // Any command: a failed allocation or another escaped exception is reported, not an abort().
  try {
    return Main(argc, argv);
  } catch (const std::bad_alloc&) {
    spdlog::error("out of memory (an allocation failed)");
  } catch (const std::exception& e) {
    spdlog::error("stopped by an error: {}", e.what());
  }
  return 1;
}
