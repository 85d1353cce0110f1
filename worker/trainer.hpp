// Trainer: a worker's training loop.
//
// Each step: take a batch from the reader thread, deduplicate its keys, pull their rows and the
// model's dense tables, forward, backward, push the summed gradient of each unique row and the
// dense gradients, tick the clock. Under SSP (staleness >= 1) and ASP the next batch's rows are
// pulled while the current batch computes; under BSP they cannot be. At the end the worker
// leaves (the others stop waiting for its clock) and meets the others at a barrier; worker 0
// then evaluates the whole eval file. Thread-safety: one trainer per worker process.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "common/manifest.hpp"
#include "common/metrics_server.hpp"
#include "common/status.hpp"
#include "worker/backend.hpp"
#include "worker/model.hpp"
#include "worker/ps_client.hpp"

namespace parasol {

// Whether a worker of the job meets the others at barrier 0 before its first step, as the
// trainer does: a fresh one does; a restarted one that the others are known to be past does not,
// and records barrier 0 as passed (its ticks then say so to a shard restored from before it).
bool MeetsAtStart(PsClient& client, uint32_t rank);

// Where a worker's training time went (seconds), and its per-step waits: for its pulls, for
// its pushes' acknowledgements, and for its tick.
struct StepTimes {
  double data_seconds = 0, pull_seconds = 0, compute_seconds = 0, push_seconds = 0,
         wait_seconds = 0;
  LatencyHistogram pull_latency, push_latency, tick_latency;
};

// Steps a worker trains before its allocations per step are counted (TrainReport).
inline constexpr uint64_t kWarmSteps = 10;
// Steps a worker trains before its steady rate is timed
// (TrainReport::samples_per_second_after_warmup): as many as bench/torch_dlrm.py's warm-up.
inline constexpr uint64_t kRateWarmupSteps = 20;

struct TrainReport : StepTimes {
  uint32_t worker = 0;
  uint64_t steps = 0;
  uint64_t train_samples = 0;
  double train_seconds = 0;
  double samples_per_second = 0;
  // The rate over the steps after this run's first kRateWarmupSteps (its cold ones: rows
  // created on the shards, buffers sized, caches filled), as a benchmark that warms up
  // before its clock starts measures; -1: no step after them.
  double samples_per_second_after_warmup = -1;
  double seconds_after_warmup = 0;  // the time it is over
  double last_loss = 0;       // mean log loss of the last 100 steps
  uint64_t bad_rows = 0;
  uint64_t nonfinite_steps = 0;  // steps skipped for a non-finite loss or gradient
  uint64_t pushes = 0;        // push requests acknowledged by the shards
  uint64_t push_log_peak_bytes = 0;  // the most the push log held (worker/push_log.hpp)
  int64_t first_step = 0;             // the clock it started at (joined, or resumed)
  int64_t left_at = -1;               // the clock it left the running job at, or -1
  uint32_t rollbacks = 0;             // rollbacks of the job this worker redid its steps after
  uint64_t membership_changes = 0;    // membership versions it followed while training
  double push_log_bytes_per_step = 0;  // what each step added to it
  uint64_t cache_hits = 0;             // rows answered by the worker's row cache
  uint64_t cache_misses = 0;           // rows it pulled while the cache was on
  double pull_bytes_per_step = 0;      // sparse keys and rows pulled, per step
  uint32_t prefetch_ahead_max = 0;     // the most steps whose rows were pulled ahead at once
  uint64_t ticks_behind_pushes = 0;    // ticks sent before their step's pushes were acknowledged
  // Objects the training thread allocated per step after its first kWarmSteps steps (buffers
  // sized, pools filled), progress reports and evaluations left out; -1: not counted
  // (TrainerHooks::allocations unset, or too few steps).
  double allocations_per_step = -1;
  std::string first_bad_row;  // "file:line: why"
  bool evaluated = false;
  uint64_t eval_samples = 0;
  double eval_logloss = 0;
  double eval_auc = 0;
  std::string ToJson() const;
  std::string Summary() const;
};

// Where training stands, every few steps and after each evaluation (for metrics and plots).
struct ProgressPoint : StepTimes {  // StepTimes: for /metrics
  uint32_t worker = 0;
  uint64_t steps = 0;
  uint64_t samples = 0;
  double seconds = 0;
  double samples_per_second = 0;
  double loss = 0;  // mean of the last 100 steps
  uint64_t push_log_bytes = 0;  // what the push log holds now
  uint64_t cache_hits = 0;      // row cache: rows answered from it, and pulled, so far
  uint64_t cache_misses = 0;
  bool has_eval = false;
  double eval_logloss = 0;
  double eval_auc = 0;
  std::string ToJson() const;
  // The worker's /metrics text (Prometheus), with process metrics.
  std::string ToPrometheus() const;
};


// training.accumulate: the gradients of a step's micro-batches, each weighted by its size,
// summed per dense element and per key, then divided by the step's samples.
struct GradientSum {
  std::unordered_map<uint64_t, uint32_t> index;  // key -> position in keys
  std::vector<uint64_t> keys;
  std::vector<float> rows;                      // keys.size() x dim
  std::vector<std::vector<float>> dense;        // per dense table of the model
  uint64_t samples = 0;
  void Start(Model& model);
  void Add(Model& model, const std::vector<uint64_t>& unique, std::span<const float> row_grads,
           uint64_t batch, uint32_t dim);
  void Finish(uint32_t dim);
};

struct TrainerHooks {
  std::function<void(const std::string&)> line;     // a progress line, every progress_every
  std::function<void(const ProgressPoint&)> point;  // every 10 steps and after evaluations
  // The objects the calling thread has allocated so far (the process counts them), for
  // TrainReport::allocations_per_step; unset: not counted.
  std::function<uint64_t()> allocations;
  // Polled every step: true once the worker is asked to leave the job (SIGTERM): it asks shard 0
  // for a leave clock, trains the steps before it, and leaves.
  std::function<bool()> leave_requested;
  // Each batch trained (its step, micro-batch, and its samples' lines in the data stream), by
  // the time its step's pushes are acknowledged, before the tick: a worker killed after the
  // tick has reported the step. A step redone after a restart is reported again, the same.
  std::function<void(const Batch&)> trained;
  // After the job rolled back (training.on_overlapping_failure: rollback; the client's calls
  // fail with Aborted): a new client, connected afresh (PsClient::Connect), which the trainer
  // uses from then on; it redoes its steps from the client's resumed_clock(). Unset: the
  // rollback ends Run() with that error.
  std::function<Result<PsClient*>()> reconnect;
};

struct EvalResult {
  uint64_t samples = 0;
  double logloss = 0;
  double auc = 0;
};

class Trainer {
 public:
  Trainer(const Manifest& manifest, uint32_t rank, PsClient* client, Backend* backend,
          TrainerHooks hooks);

  // Trains until the data (or training.max_steps) ends, then meets the others and evaluates.
  // A rollback of the job redoes the steps from its clock on a new client (hooks.reconnect),
  // at most kMaxRollbacks times.
  Result<TrainReport> Run();
  static constexpr uint32_t kMaxRollbacks = 16;

  // Logloss and AUC of the current weights over every row of `file`, on the training model's
  // buffers (slot `slot`, which no pull may be filling).
  Result<EvalResult> Evaluate(const std::string& file, int slot = 0);

 private:
  const Manifest& manifest_;
  uint32_t rank_;
  PsClient* client_;
  Backend* backend_;
  TrainerHooks hooks_;
  // The model, made on first use; evaluation runs on its buffers too.
  Result<Model*> TheModel();
  // One pass of Run() on client_, from the step the client resumes at.
  Result<TrainReport> RunOnce();
  std::unique_ptr<Model> model_;
};

}  // namespace parasol
