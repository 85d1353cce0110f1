// parasol_sim: runs the deterministic simulation (tests/sim/simulation.hpp) over many seeds.
//   parasol_sim [--seeds N] [--first S] [--max-faults K] [--no-overlap] [--no-disk-faults]
//               [--no-background] [--cpu C]
//   parasol_sim --seed S [--verbose]      one seed again, every event printed with --verbose
//   parasol_sim --seed-list S1,S2,...     these seeds (those long runs found, in a ctest)
// --stop-at-failure: ends at the first failed seed (scripts/sim_mutations.sh).
// --equal: a seed that ends with a reported loss fails too (seeds found to end equal, such as
// those whose loss a rollback undoes, stay so).
// --no-overlap: a fault waits until the one before it is over (no process is killed while
// another is down or a connection is cut). --no-disk-faults: shards are killed only as before
// the simulated disk had faults (no deaths at fault points, no crashes of their hosts): the
// schedules of the seeds found before then. --ssp: jobs under SSP (staleness 1 to 3 from the
// seed), their final model compared exactly as a set of updates. --asp: the same under ASP (no
// staleness bound on the pulls). --cpu: the process runs on that CPU only (of those it may
// use, modulo their number): only one of its threads runs at a time, and handing the turn
// between threads on one CPU is about twice as fast. --reshard: BSP jobs whose shard count
// grows or shrinks by one while they train (the scale tool runs from a drawn moment, and may
// be killed and run again), every row and dense element compared wherever it ends up.
// --elastic: BSP jobs whose workers change while they train (a rank joins, another leaves, at
// clocks drawn from the seed); it combines with --reshard.
// --no-background: checkpoints always in the foreground (in 3 seeds of 4 they are written in the
// background otherwise): the schedules of the seeds found before.
// Prints each failed seed with the command that replays it, and a summary; exits 1 when any
// seed failed.
#include <sched.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "tests/sim/simulation.hpp"

namespace {

void Usage() {
  std::fprintf(stderr,
               "usage: parasol_sim [--seeds N] [--first S] [--max-faults K] [--no-overlap] "
               "[--no-disk-faults] [--no-background] [--ssp | --asp | --reshard] [--elastic] "
               "[--cpu C] [--stop-at-failure] [--equal]\n"
               "       parasol_sim --seed S [--verbose]\n"
               "       parasol_sim --seed-list S1,S2,... [--no-overlap]\n");
}

}  // namespace

int main(int argc, char** argv) {
  using namespace parasol::sim;
  uint64_t seeds = 200, first = 1;
  SimOptions base;
  bool one = false;
  int cpu = -1;
  bool stop_at_failure = false;
  bool require_equal = false;
  std::vector<uint64_t> list;  // --seed-list
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> uint64_t {
      if (i + 1 >= argc) {
        Usage();
        std::exit(2);
      }
      char* end = nullptr;
      const uint64_t v = std::strtoull(argv[++i], &end, 10);
      if (*end != '\0') {
        std::fprintf(stderr, "parasol_sim: %s wants a number, got '%s'\n", a.c_str(), argv[i]);
        std::exit(2);
      }
      return v;
    };
    if (a == "--seeds") {
      seeds = value();
    } else if (a == "--first") {
      first = value();
    } else if (a == "--seed") {
      first = value();
      seeds = 1;
      one = true;
    } else if (a == "--seed-list") {
      if (i + 1 >= argc) {
        Usage();
        return 2;
      }
      const std::string text = argv[++i];
      for (size_t at = 0; at <= text.size();) {
        const size_t comma = std::min(text.find(',', at), text.size());
        const std::string one_seed = text.substr(at, comma - at);
        char* end = nullptr;
        const uint64_t v = std::strtoull(one_seed.c_str(), &end, 10);
        if (one_seed.empty() || *end != '\0') {
          std::fprintf(stderr, "parasol_sim: --seed-list wants numbers, got '%s'\n",
                       one_seed.c_str());
          return 2;
        }
        list.push_back(v);
        at = comma + 1;
      }
    } else if (a == "--max-faults") {
      base.max_faults = static_cast<uint32_t>(value());
    } else if (a == "--no-overlap") {
      base.overlap = false;
    } else if (a == "--no-disk-faults") {
      base.disk_faults = false;
    } else if (a == "--no-background") {
      base.background = false;
    } else if (a == "--ssp") {
      base.ssp = true;
    } else if (a == "--asp") {
      base.asp = true;
    } else if (a == "--reshard") {
      base.reshard = true;
    } else if (a == "--elastic") {
      base.elastic = true;
    } else if (a == "--stop-at-failure") {
      stop_at_failure = true;
    } else if (a == "--equal") {
      require_equal = true;
    } else if (a == "--cpu") {
      cpu = static_cast<int>(value());
    } else if (a == "--verbose") {
      base.verbose = true;
    } else {
      Usage();
      return 2;
    }
  }
  if ((base.reshard || base.elastic) && (base.ssp || base.asp)) {
    // SSP's checks read each shard's dense slice as counters, which a change would move (and
    // count the workers of the job's start).
    std::fprintf(stderr, "parasol_sim: --reshard and --elastic run BSP jobs only\n");
    return 2;
  }
  if (cpu >= 0) {
    cpu_set_t allowed;
    if (sched_getaffinity(0, sizeof(allowed), &allowed) == 0 && CPU_COUNT(&allowed) > 0) {
      int n = cpu % CPU_COUNT(&allowed), chosen = -1;
      for (int c = 0; c < CPU_SETSIZE && chosen < 0; ++c) {
        if (CPU_ISSET(c, &allowed) && n-- == 0) chosen = c;
      }
      cpu_set_t one_cpu;
      CPU_ZERO(&one_cpu);
      CPU_SET(chosen, &one_cpu);
      if (sched_setaffinity(0, sizeof(one_cpu), &one_cpu) != 0) {
        std::fprintf(stderr, "parasol_sim: could not keep to CPU %d; running on all\n", chosen);
      }
    }
  }
  // What a replay of a seed needs besides the seed.
  std::string flags = base.overlap ? "" : " --no-overlap";
  if (!base.disk_faults) flags += " --no-disk-faults";
  if (!base.background) flags += " --no-background";
  if (base.ssp) flags += " --ssp";
  if (base.asp) flags += " --asp";
  if (base.reshard) flags += " --reshard";
  if (base.elastic) flags += " --elastic";
  if (base.max_faults != SimOptions().max_faults) flags += " --max-faults " + std::to_string(base.max_faults);
  spdlog::set_level(base.verbose ? spdlog::level::info : spdlog::level::off);
  const auto start = std::chrono::steady_clock::now();
  // By the whole job (its faults' moments are drawn within the reference's duration, which
  // fused steps, the checkpoint period and background writes change): a seed's run is the same
  // alone or in a list.
  std::map<std::tuple<uint32_t, uint32_t, uint32_t, uint32_t, bool, uint32_t, uint32_t, uint32_t,
                      bool, uint32_t>,
           Reference>
      references;
  uint64_t equal = 0, reported = 0, single = 0, failed = 0;
  uint64_t point_deaths = 0, host_crashes = 0, shard_kills = 0, worker_kills = 0, cuts = 0, drops = 0, overlaps = 0, faulted = 0;
  uint64_t rolled_back = 0, equal_after_rollback = 0, reshards = 0, tool_kills = 0;
  uint64_t aside_writes = 0, background_seeds = 0;
  uint64_t ran = 0;
  if (list.empty()) {
    for (uint64_t seed = first; seed < first + seeds; ++seed) list.push_back(seed);
  } else {
    first = list.front();  // for the summary
  }
  for (size_t next = 0; next < list.size() && !(stop_at_failure && failed > 0); ++next) {
    const uint64_t seed = list[next];
    ++ran;
    SimOptions o = base;
    o.seed = seed;
    const SimJob job =
        JobOf(seed, base.ssp, base.asp, base.reshard, base.background, base.elastic);
    const auto key = std::make_tuple(job.workers, job.shards, job.steps, job.every_steps,
                                     job.fused, job.asp ? 100u : job.ssp ? job.staleness : 0u,
                                     job.serving, job.scale_to, job.background, job.leave_at);
    auto it = references.find(key);
    if (it == references.end()) {
      std::string failure;
      Reference ref = RunReference(job, std::get<0>(key) * 1000 + std::get<1>(key) * 100 +
                                            std::get<2>(key), &failure);
      if (!failure.empty()) {
        std::printf("FAIL seed %llu (%s): %s\n  replay: parasol_sim --seed %llu%s --verbose\n",
                    static_cast<unsigned long long>(seed), job.ToString().c_str(),
                    failure.c_str(), static_cast<unsigned long long>(seed), flags.c_str());
        ++failed;
        continue;
      }
      it = references.emplace(key, std::move(ref)).first;
    }
    const SimOutcome out = RunSeed(o, it->second);
    shard_kills += out.shard_kills;
    host_crashes += out.host_crashes;
    point_deaths += out.point_deaths;
    worker_kills += out.worker_kills;
    cuts += out.cuts;
    drops += out.drops;
    overlaps += out.overlaps;
    faulted += out.shard_kills + out.worker_kills + out.cuts + out.drops > 0;
    rolled_back += out.worker_rollbacks > 0;
    reshards += out.reshards;
    tool_kills += out.tool_kills;
    aside_writes += out.aside_writes;
    background_seeds += out.job.background;
    equal_after_rollback += out.worker_rollbacks > 0 && out.kind == SimOutcome::Kind::kEqual;
    const char* kind = "equal";
    switch (out.kind) {
      case SimOutcome::Kind::kEqual:
        ++equal;
        break;
      case SimOutcome::Kind::kReported:
        ++reported;
        single += out.single_failure;
        kind = out.single_failure ? "reported loss (one failure)" : "reported loss";
        if (!one) {
          std::printf("reported loss, seed %llu (%s; %s): %s\n", static_cast<unsigned long long>(seed),
                      out.job.ToString().c_str(), out.single_failure ? "one failure" : "overlapping failures",
                      out.failure.c_str());
        }
        break;
      case SimOutcome::Kind::kFailed:
        ++failed;
        kind = "FAIL";
        std::printf("FAIL seed %llu (%s; %u shard kills, %u worker kills, %u cuts, %u overlaps): "
                    "%s\n  replay: parasol_sim --seed %llu%s --verbose\n",
                    static_cast<unsigned long long>(seed), out.job.ToString().c_str(),
                    out.shard_kills, out.worker_kills, out.cuts, out.overlaps,
                    out.failure.c_str(), static_cast<unsigned long long>(seed), flags.c_str());
        break;
    }
    if (one) {
      std::printf("seed %llu (%s): %s after %.3f s of virtual time; %u shard kills, %u worker "
                  "kills, %u cuts, %u overlaps%s%s\n",
                  static_cast<unsigned long long>(seed), out.job.ToString().c_str(), kind,
                  out.seconds, out.shard_kills, out.worker_kills, out.cuts, out.overlaps,
                  out.failure.empty() ? "" : ": ", out.failure.c_str());
    }
  }
  const double wall =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  auto u = [](uint64_t v) { return static_cast<unsigned long long>(v); };
  std::printf("%llu seeds from %llu: %llu equal to the run without faults, %llu with a reported "
              "loss (%llu of them after one failure), %llu failed; %llu seeds with faults: %llu "
              "shard kills (%llu with their host, %llu at a fault point), %llu worker kills, %llu connection cuts, %llu lost messages, %llu kills "
              "while another process was down or a connection cut; %llu seeds rolled back (%llu "
              "of them ended equal); %.1f s\n",
              u(ran), u(first), u(equal), u(reported), u(single), u(failed), u(faulted),
              u(shard_kills), u(host_crashes), u(point_deaths), u(worker_kills), u(cuts), u(drops), u(overlaps), u(rolled_back),
              u(equal_after_rollback), wall);
  if (base.background) {
    std::printf("%llu seeds wrote their checkpoints in the background: %llu background writes "
                "ran\n", u(background_seeds), u(aside_writes));
  }
  if (base.reshard) {
    std::printf("%llu changes of the shard count finished by the scale tool, which was killed "
                "%llu times\n", u(reshards), u(tool_kills));
  }
  if (require_equal && reported > 0) {
    std::printf("--equal: %llu seeds ended with a reported loss\n", u(reported));
    return 1;
  }
  return failed == 0 ? 0 : 1;
}
