// A deterministic simulation of whole jobs, after FoundationDB's simulator: the real shards
// (ShardServer) and the real worker client (PsClient) of a BSP job run in one process on a
// simulated environment (common/env.hpp), driven by one seeded scheduler. From the seed come
// the job's shape (workers, shards, steps, checkpoint period, fused steps or not), the network's
// delays, and the faults: kills and restarts of any shard or worker at any moment (during a
// replay, several at once, in the middle of a worker's sends), connections cut and made again,
// and single messages lost on their way.
//
// The network delivers in order per connection, with random delays; a connection that breaks
// drops what was on its way; what a worker sends while it is down is queued for the new
// connection (a ZeroMQ DEALER's pipe outlives its connections). A killed shard restarts from its
// newest checkpoint. In 3 seeds of 4 shards write their periodic checkpoints in the background:
// the state copied at the checkpoint's moment, the file written by an event of the schedule 1 to
// 100 ms later (Env::RunAside), so requests, kills and crashes land while it is being written.
//
// Checks as it runs: every pull a worker makes at step s returns the values a run without
// faults pulled there (so no push is applied twice or lost, and clocks release in order), a
// worker's clock only moves forward, each worker's push log stays within its bound, a replay is
// sent in clock order (its Clocks up one at a time). At the end:
// every table's rows and dense values equal the run without faults, bit for bit. When two
// failures overlap so that acknowledged updates are lost (a worker died with the log a
// restarted shard needed), the job must say so (a shard's lost_replays, or a worker's error
// naming lost updates): a difference nobody reported fails the seed.
//
// Each simulated worker runs its steps on a thread of its own, but only one thread runs at a
// time: a worker runs until it waits for the network (ShardLinks::Wait), then the scheduler
// takes the next event in virtual time. So a seed replays exactly.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace parasol::sim {

struct SimOptions {
  uint64_t seed = 1;
  // Faults of the seed's schedule are drawn up to this many (0: a run without faults).
  uint32_t max_faults = 4;
  // Kill a worker and a shard at the same moment now and then (overlapping failures).
  bool overlap = true;
  // Shards also die at the points where durability is decided (a checkpoint written but not
  // synced or renamed, a push applied and not acknowledged), and hosts crash, losing what was
  // not synced (tests/sim/sim_file_system.hpp). Off: the schedules of seeds found before these
  // faults existed.
  bool disk_faults = true;
  // Shards write their periodic checkpoints in the background (in 3 seeds of 4, drawn from the
  // seed): the state copied at the checkpoint's moment, its file written by an event of the
  // schedule some milliseconds later (Env::RunAside), a kill meanwhile leaving it unwritten.
  // Off: always in the foreground, the schedules of seeds found before this existed.
  bool background = true;
  // Jobs under SSP (staleness 1 to 3, drawn from the seed) rather than BSP.
  bool ssp = false;
  // Jobs under ASP: as under SSP, without a bound on how stale a pull may be.
  bool asp = false;
  // BSP jobs whose shard count changes while they train: the scale tool (worker/reshard.hpp)
  // runs as a process of the job, from a drawn moment, and may be killed and run again.
  bool reshard = false;
  // BSP jobs whose workers change while they train: one more rank joins (cluster.max_workers)
  // and the highest of the first ones leaves, at clocks drawn from the seed. Both are named by
  // shard 0 before the first step (the joiner asks first and the others start once it is in;
  // the leaver asks for its clock before the first barrier), so that the run without faults
  // repeats them; the faults land while they take effect.
  bool elastic = false;
  bool verbose = false;  // every event, and the processes' log lines
};

// The job a seed runs (drawn from the seed).
struct SimJob {
  uint32_t workers = 2, shards = 2, steps = 8, every_steps = 2;
  bool fused = false;
  bool background = false;  // checkpoints written in the background (SimOptions::background)
  // Under SSP no run repeats another's pulls, so gradients depend on the worker and the step
  // only, and every value is a small multiple of a power of two (tables start at zero): sums
  // are exact in any order, and the final model equals the reference's exactly when the same
  // set of updates was applied, each once. Pulls are checked against the staleness bound.
  // ASP is checked as SSP is (ssp is set too), with no lower bound on what a pull sees.
  bool ssp = false;
  bool asp = false;
  uint32_t staleness = 0;
  // With a change of the shard count: `shards` are listed, `serving` of them serve from the
  // start (cluster.initial_servers), and the scale tool changes that to `scale_to`. Rows and
  // dense elements are compared wherever they end up.
  uint32_t serving = 0, scale_to = 0;
  // Workers that change (SimOptions::elastic): rank `workers` joins at clock 2 (the first
  // shard 0 names), and rank `workers - 1` leaves at `leave_at` (0: no change; 4 or later).
  bool elastic = false;
  uint32_t leave_at = 0;
  std::string ToString() const;
};

// A run without faults of the same job: what every other run must end in.
struct Reference {
  // (worker, step) -> hash of what the worker pulled at that step.
  std::map<std::pair<uint32_t, uint32_t>, uint64_t> pulls;
  // Every table's rows and dense values: (table, key or element offset) -> bytes.
  std::map<std::pair<uint32_t, uint64_t>, std::string> model;
  double seconds = 0;  // the job's virtual duration
};

struct SimOutcome {
  enum class Kind {
    kEqual,       // the model is the reference's, bit for bit
    kReported,    // failures lost updates no rollback could undo, and the job stopped saying so
    kFailed,      // a check failed (failure says which)
  };
  Kind kind = Kind::kFailed;
  std::string failure;
  SimJob job;
  uint32_t shard_kills = 0, worker_kills = 0, cuts = 0, drops = 0, overlaps = 0;
  uint32_t host_crashes = 0;  // shard kills whose host crashed too
  uint32_t point_deaths = 0;  // shard kills at a fault point (checkpoint.write, shard.applied...)
  uint32_t worker_rollbacks = 0;  // times a worker connected again after a rollback
  uint32_t reshards = 0;          // changes of the shard count the scale tool finished
  uint32_t aside_writes = 0;      // background checkpoints' writes that ran
  uint32_t tool_kills = 0;        // kills of the scale tool (counted in worker_kills too)
  bool single_failure = false;  // kReported with no failures overlapping
  uint64_t events = 0;
  double seconds = 0;    // virtual
};

SimJob JobOf(uint64_t seed, bool ssp = false, bool asp = false, bool reshard = false,
             bool background = false, bool elastic = false);
// A run of the seed's job without faults (with the seed's network delays).
Reference RunReference(const SimJob& job, uint64_t seed, std::string* failure);
// A run with the seed's faults, checked against `reference`.
SimOutcome RunSeed(const SimOptions& options, const Reference& reference);

}  // namespace parasol::sim
