#include "worker/trainer.hpp"

#include "worker/binary_data.hpp"

#include <array>
#include <cmath>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <deque>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <optional>

#include <spdlog/spdlog.h>

#include "common/json_text.hpp"
#include "common/key_index.hpp"
#include "worker/data_reader.hpp"
#include "worker/metrics.hpp"
#include "worker/model.hpp"

namespace parasol {

bool MeetsAtStart(PsClient& client, uint32_t rank) {
  // A restarted worker skips barrier 0 when the others have passed it (a shard that restarted
  // since its release might hold it for them). One that a shard knows past clock 0 ticked out of
  // step 0 there, so every shard had released barrier 0 before: its ticks say so, and a shard
  // restored from before the release lets the others go (parasol_sim --ssp --seed 3935: such a
  // worker, known at clock 0 on the restored shard, waited at barrier 0 there for a worker that
  // had skipped it, which waited on that worker's clock). A joiner is known at its join clock
  // before it ticks, and never enters barrier 0.
  const bool ticked_past_start =
      client.membership().join(rank) <= 0 && client.furthest_known_clock() > 0;
  if (ticked_past_start) client.NoteBarrierPassed(0);
  return client.resumed_clock() < 0 && client.last_barrier_seen() < 0 && !ticked_past_start;
}

namespace {

// The index of the first NaN or infinity in `v`, or v.size().
size_t FirstNonfinite(std::span<const float> v) {
  for (size_t i = 0; i < v.size(); ++i) {
    if (!std::isfinite(v[i])) return i;
  }
  return v.size();
}

// What is not finite in a step (its loss, a row gradient or a dense gradient), or "".
std::string NonfiniteIn(const Manifest& m, double loss, const Model& model,
                        std::span<const float> rows,
                        const std::vector<std::vector<float>>* dense_sums) {
  auto name = [&m](uint32_t table) {
    return table < m.tables.size() ? "'" + m.tables[table].name + "'" : std::to_string(table);
  };
  if (!std::isfinite(loss)) return "the loss is " + std::to_string(loss);
  if (size_t i = FirstNonfinite(rows); i < rows.size()) {
    return "the gradient of table " + name(model.sparse_table()) + " is not finite at value " +
           std::to_string(i) + " of the step's rows";
  }
  for (size_t t = 0; t < model.dense_tables().size(); ++t) {
    const std::span<const float> g =
        dense_sums ? std::span<const float>((*dense_sums)[t]) : model.DenseGrads()[t];
    if (size_t i = FirstNonfinite(g); i < g.size()) {
      return "the gradient of table " + name(model.dense_tables()[t]) +
             " is not finite at element " + std::to_string(i);
    }
  }
  return "";
}

// The training thread's allocations from Start() on, less the excluded stretches
// (TrainReport::allocations_per_step). Without a counter, nothing is counted.
class AllocationWatch {
 public:
  explicit AllocationWatch(std::function<uint64_t()> count) : count_(std::move(count)) {}
  uint64_t Now() const { return count_ ? count_() : 0; }
  void Start() {
    started_ = static_cast<bool>(count_);
    start_ = Now();
  }
  // Leaves out what was allocated since `from` (a Now() of this stretch's start).
  void Exclude(uint64_t from) { excluded_ += started_ ? Now() - from : 0; }
  // Per step over `steps` steps since Start(), or -1.
  double PerStep(uint64_t steps) const {
    if (!started_ || steps == 0) return -1;
    return static_cast<double>(Now() - start_ - excluded_) / static_cast<double>(steps);
  }

 private:
  std::function<uint64_t()> count_;
  bool started_ = false;
  uint64_t start_ = 0, excluded_ = 0;
};

using SteadyClock = std::chrono::steady_clock;

double Since(SteadyClock::time_point t) {
  return std::chrono::duration<double>(SteadyClock::now() - t).count();
}

// About how many lines the training files hold, for the progress line's time left: the files'
// size over the mean length of the first lines (reading them all would cost a whole pass).
uint64_t EstimateLines(const std::vector<std::string>& files) {
  uint64_t lines = 0;
  for (const std::string& f : files) {
    if (BinaryData::IsBinary(f)) {  // its header says (worker/binary_data.hpp)
      if (auto d = BinaryData::Open(f); d.ok()) lines += (*d)->rows();
      continue;
    }
    std::error_code ec;
    const uint64_t size = std::filesystem::file_size(f, ec);
    if (ec || size == 0) continue;
    std::ifstream in(f, std::ios::binary);
    std::vector<char> head(1 << 20);
    in.read(head.data(), head.size());
    const std::streamsize got = in.gcount();
    uint64_t n = 0;
    for (std::streamsize i = 0; i < got; ++i) n += head[i] == '\n';
    lines += n == 0 ? 1 : static_cast<uint64_t>(static_cast<double>(size) * n / got);
  }
  return lines;
}

// Pulls every dense table of the model into slot `slot`.
Status PullDense(PsClient& client, Model& model, int slot) {
  std::vector<PsClient::Ticket> tickets;
  for (size_t i = 0; i < model.dense_tables().size(); ++i) {
    PARASOL_ASSIGN_OR_RETURN(
        PsClient::Ticket t,
        client.PullDenseAsync(model.dense_tables()[i], model.StepDense(slot, i).data()));
    tickets.push_back(t);
  }
  Status first;
  for (PsClient::Ticket t : tickets) {
    Status st = client.Wait(t);
    if (first.ok()) first = st;
  }
  return first;
}

ProgressPoint PointOf(const TrainReport& report, double seconds, const EvalResult* eval,
                      const PsClient& client) {
  ProgressPoint p;
  p.push_log_bytes = client.push_log_bytes();
  p.cache_hits = client.cache_hits();
  p.cache_misses = client.cache_misses();
  p.worker = report.worker;
  p.steps = report.steps;
  p.samples = report.train_samples;
  p.seconds = seconds;
  p.samples_per_second = report.train_samples / std::max(1e-9, seconds);
  p.loss = report.last_loss;
  static_cast<StepTimes&>(p) = report;
  if (eval) {
    p.has_eval = true;
    p.eval_logloss = eval->logloss;
    p.eval_auc = eval->auc;
  }
  return p;
}

}  // namespace

void GradientSum::Start(Model& model) {
  index.clear();
  keys.clear();
  rows.clear();
  samples = 0;
  dense.resize(model.DenseGrads().size());
  for (size_t i = 0; i < dense.size(); ++i) dense[i].assign(model.DenseGrads()[i].size(), 0.0f);
}

void GradientSum::Add(Model& model, const std::vector<uint64_t>& unique,
                      std::span<const float> row_grads, uint64_t batch, uint32_t dim) {
  const float w = static_cast<float>(batch);
  for (size_t i = 0; i < dense.size(); ++i) {
    const auto& g = model.DenseGrads()[i];
    for (size_t e = 0; e < g.size(); ++e) dense[i][e] += w * g[e];
  }
  for (size_t u = 0; u < unique.size(); ++u) {
    auto [it, inserted] = index.try_emplace(unique[u], static_cast<uint32_t>(keys.size()));
    if (inserted) {
      keys.push_back(unique[u]);
      rows.resize(rows.size() + dim, 0.0f);
    }
    float* dst = rows.data() + size_t{it->second} * dim;
    for (uint32_t d = 0; d < dim; ++d) dst[d] += w * row_grads[u * dim + d];
  }
  samples += batch;
}

void GradientSum::Finish(uint32_t /*dim*/) {
  const float inv = samples > 0 ? 1.0f / static_cast<float>(samples) : 0.0f;
  for (auto& d : dense) {
    for (float& v : d) v *= inv;
  }
  for (float& v : rows) v *= inv;
}

std::string TrainReport::ToJson() const {
  Json s;
  s["worker"] = worker;
  s["steps"] = steps;
  s["train_samples"] = train_samples;
  s["train_seconds"] = train_seconds;
  s["samples_per_second"] = samples_per_second;
  s["samples_per_second_after_warmup"] = samples_per_second_after_warmup;
  s["seconds_after_warmup"] = seconds_after_warmup;
  s["train_loss"] = last_loss;
  s["bad_rows"] = bad_rows;
  s["nonfinite_steps"] = nonfinite_steps;
  s["pushes"] = pushes;
  s["push_log_peak_bytes"] = push_log_peak_bytes;
  s["first_step"] = first_step;
  s["left_at"] = left_at;
  s["rollbacks"] = rollbacks;
  s["membership_changes"] = membership_changes;
  s["push_log_bytes_per_step"] = push_log_bytes_per_step;
  s["cache_hits"] = cache_hits;
  s["cache_misses"] = cache_misses;
  s["pull_bytes_per_step"] = pull_bytes_per_step;
  s["prefetch_ahead_max"] = prefetch_ahead_max;
  s["ticks_behind_pushes"] = ticks_behind_pushes;
  s["allocations_per_step"] = allocations_per_step;
  s["evaluated"] = evaluated;
  s["eval_samples"] = eval_samples;
  s["eval_logloss"] = eval_logloss;
  s["eval_auc"] = eval_auc;
  Json& split = s["time_split"];
  split["data"] = data_seconds;
  split["pull"] = pull_seconds;
  split["compute"] = compute_seconds;
  split["push"] = push_seconds;
  split["wait"] = wait_seconds;
  return SpacedJson(s);
}

std::string TrainReport::Summary() const {
  char buf[512];
  std::snprintf(buf, sizeof(buf),
                "worker %u: %llu steps, %llu samples in %.1f s (%.0f samples/s), train loss "
                "%.4f, %llu bad rows",
                worker, static_cast<unsigned long long>(steps),
                static_cast<unsigned long long>(train_samples), train_seconds,
                samples_per_second, last_loss, static_cast<unsigned long long>(bad_rows));
  std::string out = buf;
  if (nonfinite_steps > 0) {
    out += ", " + std::to_string(nonfinite_steps) + " steps skipped (a non-finite loss or gradient)";
  }
  if (evaluated) {
    std::snprintf(buf, sizeof(buf), "; eval over %llu samples: logloss %.4f, AUC %.4f",
                  static_cast<unsigned long long>(eval_samples), eval_logloss, eval_auc);
    out += buf;
  }
  return out;
}

std::string ProgressPoint::ToPrometheus() const {
  const ProgressPoint& p = *this;
  PrometheusText t;
  const std::string w = "worker=\"" + std::to_string(p.worker) + "\"";
  t.Type("parasol_worker_samples_total", "counter", "Training samples processed.");
  t.Sample("parasol_worker_samples_total", static_cast<double>(p.samples), w);
  t.Type("parasol_worker_steps_total", "counter", "Training steps done.");
  t.Sample("parasol_worker_steps_total", static_cast<double>(p.steps), w);
  t.Type("parasol_worker_samples_per_second", "gauge", "Training throughput since the start.");
  t.Sample("parasol_worker_samples_per_second", p.samples_per_second, w);
  t.Type("parasol_worker_loss", "gauge", "Mean log loss of the last 100 steps.");
  t.Sample("parasol_worker_loss", p.loss, w);
  t.Type("parasol_worker_push_log_bytes", "gauge",
         "Bytes of pushes kept for replays to restarted shards (checkpoint.max_log_bytes).");
  t.Sample("parasol_worker_push_log_bytes", static_cast<double>(p.push_log_bytes), w);
  t.Type("parasol_worker_cache_rows_total", "counter",
         "Sparse rows the row cache answered (hit) or had to pull (miss; worker.cache_rows).");
  t.Sample("parasol_worker_cache_rows_total", static_cast<double>(p.cache_hits),
           w + ",result=\"hit\"");
  t.Sample("parasol_worker_cache_rows_total", static_cast<double>(p.cache_misses),
           w + ",result=\"miss\"");
  t.Type("parasol_worker_seconds_total", "counter",
         "Training time by phase: reading data, waiting for pulls, computing, waiting for the "
         "pushes' acknowledgements, waiting for the tick (with the next step's pulls).");
  const std::pair<const char*, double> phases[] = {{"data", p.data_seconds},
                                                   {"pull", p.pull_seconds},
                                                   {"compute", p.compute_seconds},
                                                   {"push", p.push_seconds},
                                                   {"wait", p.wait_seconds}};
  for (const auto& [phase, seconds] : phases) {
    t.Sample("parasol_worker_seconds_total", seconds, w + ",phase=\"" + phase + "\"");
  }
  p.pull_latency.Write(t, "parasol_worker_pull_seconds",
                       "Per step: the wait for its rows and dense weights.", w);
  p.push_latency.Write(t, "parasol_worker_push_seconds",
                       "Per step: the wait for its pushes' acknowledgements.", w);
  p.tick_latency.Write(t, "parasol_worker_tick_seconds",
                       "Per step: the wait for its tick (and the next step's pulls with it).", w);
  WriteProcessMetrics(t, w);
  if (p.has_eval) {
    t.Type("parasol_worker_eval_auc", "gauge", "AUC of the last evaluation.");
    t.Sample("parasol_worker_eval_auc", p.eval_auc, w);
    t.Type("parasol_worker_eval_logloss", "gauge", "Log loss of the last evaluation.");
    t.Sample("parasol_worker_eval_logloss", p.eval_logloss, w);
  }
  return t.str();
}


std::string ProgressPoint::ToJson() const {
  Json s;
  s["worker"] = worker;
  s["steps"] = steps;
  s["samples"] = samples;
  s["seconds"] = seconds;
  s["samples_per_second"] = samples_per_second;
  s["loss"] = loss;
  s["push_log_bytes"] = push_log_bytes;
  if (has_eval) {
    s["eval_logloss"] = eval_logloss;
    s["eval_auc"] = eval_auc;
  }
  return SpacedJson(s);
}

Trainer::Trainer(const Manifest& manifest, uint32_t rank, PsClient* client, Backend* backend,
                 TrainerHooks hooks)
    : manifest_(manifest),
      rank_(rank),
      client_(client),
      backend_(backend),
      hooks_(std::move(hooks)) {}

Result<Model*> Trainer::TheModel() {
  if (!model_) {
    PARASOL_ASSIGN_OR_RETURN(model_,
                             Model::Create(manifest_, backend_, manifest_.training.batch_size));
  }
  return model_.get();
}

Result<EvalResult> Trainer::Evaluate(const std::string& file, int slot) {
  const uint32_t batch_size = manifest_.training.batch_size;
  PARASOL_ASSIGN_OR_RETURN(Model * model, TheModel());
  uint64_t bad = 0;
  PARASOL_ASSIGN_OR_RETURN(std::vector<Batch> batches,
                           ReadAll(manifest_.data.format, file, batch_size, true, &bad));
  std::vector<float> probs, labels;
  KeyIndex index;
  BatchKeys keys;
  bool dense_pulled = false;
  for (const Batch& b : batches) {
    DeduplicateKeys(b.keys, index, &keys);
    const auto unique = static_cast<uint32_t>(keys.unique.size());
    float* rows = model->StepRows(slot, unique, static_cast<uint32_t>(b.keys.size()));
    if (!rows) return ResourceExhausted("evaluation: no host memory for the batch's rows");
    if (!dense_pulled) {  // after StepRows, which may move the slot
      PARASOL_RETURN_IF_ERROR(PullDense(*client_, *model, slot));
      dense_pulled = true;
    }
    PARASOL_RETURN_IF_ERROR(client_->PullSparseReadOnly(model->sparse_table(), keys.unique, rows));
    model->Run(b, slot, unique, keys.indices.data(), /*train=*/false);
    PARASOL_RETURN_IF_ERROR(model->Finish(slot).WithContext("evaluation"));
    probs.insert(probs.end(), model->Probabilities().begin(), model->Probabilities().end());
    labels.insert(labels.end(), b.labels.begin(), b.labels.end());
  }
  EvalResult r;
  r.samples = probs.size();
  r.logloss = LogLoss(probs, labels);
  r.auc = Auc(probs, labels);
  return r;
}

Result<TrainReport> Trainer::Run() {
  for (uint32_t rollbacks = 0;; ++rollbacks) {
    Result<TrainReport> report = RunOnce();
    if (report.ok() || report.status().code() != StatusCode::kAborted || !hooks_.reconnect) {
      if (report.ok()) report->rollbacks = rollbacks;
      return report;
    }
    if (rollbacks >= kMaxRollbacks) {
      return report.status().WithContext("after " + std::to_string(rollbacks) + " rollbacks");
    }
    PARASOL_ASSIGN_OR_RETURN(client_, hooks_.reconnect());
    if (hooks_.line) {
      hooks_.line("worker " + std::to_string(rank_) + ": the job rolled back; redoing the steps "
                  "from step " + std::to_string(std::max<int64_t>(0, client_->resumed_clock())));
    }
  }
}

namespace {

// Where a worker reads its share of the training data: from step `start_step` on, for the
// membership `plan`.
ReaderOptions TrainReaderOptions(const Manifest& manifest, uint32_t rank, const Membership& plan,
                                 int64_t start_step) {
  const TrainingOptions& t = manifest.training;
  ReaderOptions ro;
  ro.format = manifest.data.format;
  ro.files = manifest.data.train;
  ro.batch_size = t.batch_size;
  ro.epochs = t.epochs;
  ro.rank = rank;
  ro.workers = manifest.cluster.workers;
  ro.on_bad_row = manifest.data.on_bad_row;
  ro.queue_batches = manifest.data.queue_batches;
  ro.reader_threads = manifest.data.reader_threads;
  ro.deduplicate = true;  // on the reader's thread: each batch's keys arrive deduplicated
  ro.membership = plan;
  ro.start_step = start_step;
  ro.batches_per_step = t.accumulate;
  return ro;
}

// One pass of Trainer::RunOnce() on one client, from the step the client resumes at: the state
// its phases share, and the phases. In order: MeetAtStart, TakeFirstBatch, Step while HasStep,
// Tally, LeaveAndEvaluate; an error in any of them ends the pass.
class TrainRun {
 public:
  // Starts reading this worker's share of the data at the step the client resumes at.
  TrainRun(Trainer& trainer, const Manifest& manifest, uint32_t rank, PsClient& client,
           const TrainerHooks& hooks, Model& model);
  // On every way out, no pull may be left writing into the buffers of the batches read ahead.
  ~TrainRun();
  TrainRun(const TrainRun&) = delete;
  TrainRun& operator=(const TrainRun&) = delete;

  // Meets the others at barrier 0 (unless this worker resumes), then starts the training clock.
  Status MeetAtStart();
  // Notes the step training starts at, takes that step's batch and issues its pulls.
  Status TakeFirstBatch();
  // Whether a step is left to train: a batch taken, and training.max_steps not reached.
  bool HasStep() const;
  // Trains one step, from its pulls to its tick, then reports it and moves to the next batch.
  Status Step();
  // After the last step: waits for the pulls left, and fills in the report's totals.
  Status Tally();
  // Leaves the job, meets the others at barrier 1, and evaluates if this is the lowest rank left.
  Result<TrainReport> LeaveAndEvaluate();

 private:
  // training.prefetch_depth > 1: the batches after `next_`, read ahead, each with its rows
  // pulled into a buffer of its own; `next_` and `cur_` keep theirs in next_ahead_ and
  // cur_ahead_, and a step's rows are copied into its slot (at cur_rows_) when it starts.
  struct Ahead {
    std::optional<Batch> batch;
    BatchKeys keys;
    std::vector<float> rows;
    std::optional<PsClient::Ticket> ticket;
  };

  // The phases of a step, in the order Step() runs them.
  // Reads the next batch (or takes the one read ahead) while this step's pulls travel.
  Status ReadNext();
  // Waits for this step's pulls; their slot becomes the step's, the other the next step's.
  Status StartStep();
  // Under prefetch: sends the pulls of the next steps' rows; whether it did.
  Result<bool> PullAhead();
  // Forward and backward over the step's batches: its mean loss and its samples.
  Status Compute(double* loss, uint64_t* samples);
  // Pushes the step's gradients, then ticks with the next step's pulls behind the tick.
  Status PushAndTick(double loss, bool rows_prefetched);
  // After each tick: follows a request to leave, and a change of the job's membership.
  Status FollowMembership();
  // Counts the step: its samples, and its loss in the mean of the last 100 steps.
  void CountStep(double loss, uint64_t samples);
  // Reports where training stands (points, progress lines), and evaluates every eval_every.
  Status ReportProgress();
  // Gives the step's batch back to the reader; the next batch becomes the current one.
  void MoveToNextBatch();

  // What the phases use.
  // Notes the step of a batch taken from the reader.
  Result<std::optional<Batch>> Take(Result<std::optional<Batch>> b);
  // A batch's distinct keys, deduplicated by the reader, into `keys`; the buffers `keys` had
  // go back with the batch when it is recycled.
  static void TakeKeys(Batch& b, BatchKeys* keys) { std::swap(b.distinct, *keys); }
  // Sends the pulls of a step into slot pull_slot_: its rows (if `sparse`) and dense weights.
  Status IssuePulls(const Batch& batch, const BatchKeys& keys, bool sparse);
  // Waits for the pulls of the step about to run, and copies rows pulled ahead into its slot.
  Status WaitPulls();
  // Pulls the rows of `keys` into a's buffer, for the step `ahead` steps on, unless sent.
  Status PrefetchInto(Ahead& a, const BatchKeys& keys, uint32_t ahead);
  // Forward and backward over the current batch in the step's slot; its mean loss.
  Result<double> ForwardBackward();
  // training.accumulate > 1: the step's other micro-batches, and the sum of their gradients.
  Status AccumulateMicroBatches(double* loss, uint64_t* step_samples);
  // Whether the step's loss or gradients are not finite, which skips it (or fails it).
  Result<bool> SkipNonfinite(double loss, bool acc_on);
  // Sends the step's pushes: its sparse gradient and its dense ones.
  Status SendPushes(bool acc_on);
  // Hands hooks.point where training stands, with evaluation `e` if not null.
  void Point(const EvalResult* e);

  Trainer& trainer_;  // for evaluations
  const Manifest& manifest_;
  const TrainingOptions& training_;
  const uint32_t rank_;
  PsClient& client_;
  const TrainerHooks& hooks_;
  Model& model_;
  // The data follows the job's membership (common/membership.hpp); a worker that restarted or
  // joined reads on from the step it continues at.
  Membership plan_;
  const int64_t resume_;
  const uint64_t expected_samples_;
  BatchReader reader_;
  // The newest step whose batch the trainer has taken from the reader (-1: none).
  int64_t taken_step_ = -1;
  const bool prefetch_;
  // Steps ahead whose rows are pulled during compute (the next one's land in its slot; further
  // ones in buffers of their own, copied into their slot when their step starts).
  const uint32_t depth_;
  const uint32_t accumulate_;
  const uint32_t dim_;
  const bool fuse_;
  // One shard, and the manifest lists no other that could join: the tick may go behind the
  // pushes without waiting for their acknowledgements (see PushAndTick).
  const bool tick_behind_pushes_;
  // Allocations are counted from this step on (TrainReport::allocations_per_step).
  const uint64_t counted_from_;
  // The steady rate is timed from this step on, from rate_start_ and rate_samples_from_
  // (TrainReport::samples_per_second_after_warmup).
  const uint64_t rate_from_;
  std::optional<SteadyClock::time_point> rate_start_;  // once step rate_from_ is done
  uint64_t rate_samples_from_ = 0;
  TrainReport report_;
  SteadyClock::time_point start_, last_progress_;
  AllocationWatch warm_;
  std::vector<PsClient::Ticket> pushes_;  // a step's push tickets
  std::array<double, 100> recent_losses_{};
  size_t recent_count_ = 0, recent_next_ = 0;
  BatchKeys cur_keys_, next_keys_;
  // The slot of the step about to run (cur_slot) and the one the next step's pulls fill.
  int cur_slot_ = 0, pull_slot_ = 0;
  GradientSum acc_;  // training.accumulate > 1
  bool leave_asked_ = false;
  std::optional<Batch> cur_, next_;
  bool next_read_ = false;
  std::optional<PsClient::Ticket> rows_pull_;
  std::vector<PsClient::Ticket> dense_pulls_;
  std::deque<Ahead> further_;
  Ahead next_ahead_, cur_ahead_;
  // An entry whose step has started, kept with its buffers (the step before's rows and keys)
  // for the next batch read ahead: no allocation per step in steady state.
  Ahead spare_;
  float* cur_rows_ = nullptr;
  float* next_rows_ = nullptr;
};

TrainRun::TrainRun(Trainer& trainer, const Manifest& manifest, uint32_t rank, PsClient& client,
                   const TrainerHooks& hooks, Model& model)
    : trainer_(trainer),
      manifest_(manifest),
      training_(manifest.training),
      rank_(rank),
      client_(client),
      hooks_(hooks),
      model_(model),
      plan_(client.membership()),
      resume_(std::max<int64_t>(0, client.resumed_clock())),
      expected_samples_(EstimateLines(manifest.data.train) * manifest.training.epochs /
                        manifest.cluster.workers),
      reader_(TrainReaderOptions(manifest, rank, plan_, resume_)),
      prefetch_(training_.prefetch && training_.accumulate == 1 &&
                (training_.consistency == TrainingOptions::Consistency::kAsp ||
                 (training_.consistency == TrainingOptions::Consistency::kSsp &&
                  training_.staleness >= 1))),
      depth_(prefetch_ ? std::max<uint32_t>(1, training_.prefetch_depth) : 1),
      accumulate_(training_.accumulate),
      dim_(model.sparse_dim()),
      fuse_(manifest.worker.fuse_requests),
      tick_behind_pushes_(manifest.cluster.servers.size() == 1),
      counted_from_(static_cast<uint64_t>(resume_) + kWarmSteps),
      rate_from_(static_cast<uint64_t>(resume_) + kRateWarmupSteps),
      warm_(hooks.allocations) {
  // Every key list the trainer hands the client is deduplicated (DeduplicateKeys, GradientSum).
  client_.AssumeUniqueKeys(true);
  report_.worker = rank_;
}

TrainRun::~TrainRun() {
  for (Ahead* a : {&cur_ahead_, &next_ahead_}) {
    if (a->ticket) (void)client_.Wait(*a->ticket);
  }
  for (Ahead& a : further_) {
    if (a.ticket) (void)client_.Wait(*a.ticket);
  }
}

Status TrainRun::MeetAtStart() {
  const auto phase = SteadyClock::now();
  if (MeetsAtStart(client_, rank_)) {
    PARASOL_RETURN_IF_ERROR(client_.Barrier(0));
  }
  report_.wait_seconds += Since(phase);
  start_ = SteadyClock::now();
  last_progress_ = start_;
  return Status::Ok();
}

Status TrainRun::TakeFirstBatch() {
  const auto phase = SteadyClock::now();
  // A restarted worker continues at the clock the shards know it at (the reader starts at that
  // step's batch); a joining one at the clock it joined at.
  report_.first_step = resume_;
  if (resume_ > 0) {
    report_.steps = static_cast<uint64_t>(resume_);
    if (hooks_.line) {
      const bool joined = plan_.join(rank_) == resume_ && rank_ >= plan_.initial();
      hooks_.line("worker " + std::to_string(rank_) +
                  (joined ? ": joined at step " : ": resuming at step ") + std::to_string(resume_) +
                  (joined ? "" : " (the batches before it were trained on)"));
    }
  }
  PARASOL_ASSIGN_OR_RETURN(cur_, Take(reader_.Next()));
  report_.data_seconds += Since(phase);
  if (cur_) {
    TakeKeys(*cur_, &cur_keys_);
    if (fuse_) client_.BeginStep();
    const Status st = IssuePulls(*cur_, cur_keys_, true);
    if (fuse_) client_.SendStep();
    PARASOL_RETURN_IF_ERROR(st);
  }
  return Status::Ok();
}

bool TrainRun::HasStep() const {
  return cur_ && (training_.max_steps == 0 || report_.steps < training_.max_steps);
}

Status TrainRun::Step() {
  PARASOL_RETURN_IF_ERROR(ReadNext());
  PARASOL_RETURN_IF_ERROR(StartStep());
  PARASOL_ASSIGN_OR_RETURN(const bool rows_prefetched, PullAhead());
  double loss = 0;
  uint64_t samples = 0;
  PARASOL_RETURN_IF_ERROR(Compute(&loss, &samples));
  PARASOL_RETURN_IF_ERROR(PushAndTick(loss, rows_prefetched));
  PARASOL_RETURN_IF_ERROR(FollowMembership());
  CountStep(loss, samples);
  // What follows (progress, evaluation) is reporting: its allocations are not the step's.
  const uint64_t reporting_from = warm_.Now();
  PARASOL_RETURN_IF_ERROR(ReportProgress());
  warm_.Exclude(reporting_from);
  MoveToNextBatch();
  return Status::Ok();
}

Status TrainRun::Tally() {
  PARASOL_RETURN_IF_ERROR(WaitPulls());
  report_.allocations_per_step =
      warm_.PerStep(report_.steps > counted_from_ ? report_.steps - counted_from_ : 0);
  report_.train_seconds = Since(start_);
  report_.samples_per_second = report_.train_samples / std::max(1e-9, report_.train_seconds);
  if (rate_start_ && report_.steps > rate_from_) {
    report_.seconds_after_warmup = Since(*rate_start_);
    report_.samples_per_second_after_warmup =
        static_cast<double>(report_.train_samples - rate_samples_from_) /
        std::max(1e-9, report_.seconds_after_warmup);
  }
  report_.bad_rows = reader_.bad_rows();
  report_.pushes = client_.pushes_acknowledged();
  report_.push_log_peak_bytes = client_.push_log_peak_bytes();
  report_.cache_hits = client_.cache_hits();
  report_.cache_misses = client_.cache_misses();
  if (report_.steps > static_cast<uint64_t>(resume_)) {
    report_.push_log_bytes_per_step = static_cast<double>(client_.push_log_added_bytes()) /
                                      static_cast<double>(report_.steps - resume_);
    report_.pull_bytes_per_step = static_cast<double>(client_.pulled_row_bytes()) /
                                  static_cast<double>(report_.steps - resume_);
  }
  report_.first_bad_row = reader_.first_bad_row();
  return Status::Ok();
}

Result<TrainReport> TrainRun::LeaveAndEvaluate() {
  // Done: the others stop waiting for this worker's clock; then all meet before evaluating. A
  // worker that left the running job early goes without meeting them.
  const auto phase = SteadyClock::now();
  PARASOL_RETURN_IF_ERROR(client_.Leave());
  const int64_t leave_at = client_.membership().leave(rank_);
  if (leave_at >= 0 && client_.clock() >= leave_at) {
    report_.left_at = leave_at;
    return report_;
  }
  PARASOL_RETURN_IF_ERROR(client_.Barrier(1));
  report_.wait_seconds += Since(phase);
  // The lowest rank still in the job evaluates (rank 0 unless it left).
  uint32_t evaluator = rank_;
  for (uint32_t r = 0; r < client_.membership().max_ranks(); ++r) {
    if (client_.membership().Joined(r) && client_.membership().leave(r) < 0) {
      evaluator = r;
      break;
    }
  }
  if (rank_ == evaluator && !manifest_.data.eval.empty()) {
    PARASOL_ASSIGN_OR_RETURN(EvalResult e, trainer_.Evaluate(manifest_.data.eval));
    report_.evaluated = true;
    report_.eval_samples = e.samples;
    report_.eval_logloss = e.logloss;
    report_.eval_auc = e.auc;
  }
  if (hooks_.point) {
    EvalResult e{report_.eval_samples, report_.eval_logloss, report_.eval_auc};
    hooks_.point(
        PointOf(report_, report_.train_seconds, report_.evaluated ? &e : nullptr, client_));
  }
  return report_;
}

Status TrainRun::ReadNext() {
  // The next batch is read and deduplicated while this step's pulls travel.
  const auto phase = SteadyClock::now();
  if (!next_read_) {
    if (!further_.empty()) {  // read, and its rows pulled, ahead
      next_ = std::move(further_.front().batch);
      std::swap(next_keys_, further_.front().keys);
      std::swap(next_ahead_.rows, further_.front().rows);
      next_ahead_.ticket = further_.front().ticket;
      spare_ = std::move(further_.front());
      spare_.ticket.reset();
      spare_.batch.reset();
      further_.pop_front();
    } else {
      PARASOL_ASSIGN_OR_RETURN(next_, Take(reader_.Next()));
      if (next_) TakeKeys(*next_, &next_keys_);
    }
    next_read_ = true;
  }
  report_.data_seconds += Since(phase);
  return Status::Ok();
}

Status TrainRun::StartStep() {
  const auto phase = SteadyClock::now();
  PARASOL_RETURN_IF_ERROR(WaitPulls());
  cur_slot_ = pull_slot_;
  pull_slot_ = cur_slot_ ^ 1;
  report_.pull_seconds += Since(phase);
  report_.pull_latency.Observe(Since(phase));
  return Status::Ok();
}

Result<bool> TrainRun::PullAhead() {
  const bool more = next_ && (training_.max_steps == 0 || report_.steps + 1 < training_.max_steps);
  if (!prefetch_ || !more) return false;
  if (depth_ == 1) {
    // SSP/ASP: the next step's rows travel during this step's compute, at the clock they
    // will be used at.
    float* rows = model_.StepRows(pull_slot_, static_cast<uint32_t>(next_keys_.unique.size()),
                                  static_cast<uint32_t>(next_->keys.size()));
    if (!rows) return ResourceExhausted("no host memory for the step's rows");
    PARASOL_ASSIGN_OR_RETURN(
        PsClient::Ticket ticket,
        client_.PrefetchSparseAsync(model_.sparse_table(), next_keys_.unique, rows));
    rows_pull_ = ticket;
    report_.prefetch_ahead_max = std::max<uint32_t>(report_.prefetch_ahead_max, 1);
    return true;
  }
  // Depth k: the rows of the next k steps travel during this one's compute, each pull at
  // the clock its step will run at. Batches past max_steps or the data are not read.
  const auto phase = SteadyClock::now();
  while (further_.size() + 1 < depth_ &&
         (training_.max_steps == 0 || report_.steps + 2 + further_.size() < training_.max_steps)) {
    PARASOL_ASSIGN_OR_RETURN(std::optional<Batch> b, Take(reader_.Next()));
    if (!b) break;
    Ahead a = std::move(spare_);
    spare_ = Ahead();
    a.batch = std::move(b);
    TakeKeys(*a.batch, &a.keys);
    further_.push_back(std::move(a));
  }
  report_.data_seconds += Since(phase);
  PARASOL_RETURN_IF_ERROR(PrefetchInto(next_ahead_, next_keys_, 1));
  for (size_t j = 0; j < further_.size(); ++j) {
    PARASOL_RETURN_IF_ERROR(PrefetchInto(further_[j], further_[j].keys, 2 + j));
  }
  // The next step's slot takes its rows when it starts; sized now, before its dense pulls
  // (with the tick) write into the same slot.
  next_rows_ = model_.StepRows(pull_slot_, static_cast<uint32_t>(next_keys_.unique.size()),
                               static_cast<uint32_t>(next_->keys.size()));
  if (!next_rows_) return ResourceExhausted("no host memory for the step's rows");
  report_.prefetch_ahead_max =
      std::max(report_.prefetch_ahead_max, static_cast<uint32_t>(1 + further_.size()));
  return true;
}

Status TrainRun::Compute(double* loss, uint64_t* samples) {
  const auto phase = SteadyClock::now();
  // A batch whose every row was malformed is a step with nothing to push (the worker still
  // ticks: its place in the job's steps stays).
  *loss = 0;
  if (cur_->size > 0) {
    PARASOL_ASSIGN_OR_RETURN(*loss, ForwardBackward());
  }
  report_.compute_seconds += Since(phase);
  *samples = cur_->size;
  if (accumulate_ > 1) PARASOL_RETURN_IF_ERROR(AccumulateMicroBatches(loss, samples));
  return Status::Ok();
}

Status TrainRun::PushAndTick(double loss, bool rows_prefetched) {
  const bool pull_next =
      next_ && (training_.max_steps == 0 || report_.steps + 1 < training_.max_steps);

  // The pushes travel in one message per shard (fused), then, once every shard has
  // acknowledged them, the tick with the next step's pulls in one message per shard (under
  // BSP the shard answers them the moment the tick is applied). The tick waits for the
  // acknowledgements so that a worker restarted between two shards' ticks redoes a step
  // whose pushes every shard has (and answers as duplicates). A job of one shard has no two
  // shards' ticks: its tick goes right behind the pushes, on the same connection, and the
  // step saves a round trip. The tick names the pushes it follows, and the shard refuses it
  // unless it has applied them all (a push lost on its way is resent, then the tick; a push
  // refused fails the step): no push is left behind the clock. A restarted shard gets them
  // again before the tick (PsClient::Replay). Then the push time includes sending the tick
  // and the next step's pulls, and the wait is what is left of the tick's round trip.
  auto phase = SteadyClock::now();
  pushes_.clear();
  const bool acc_on = accumulate_ > 1;
  if (fuse_) client_.BeginStep();
  bool push_nothing = acc_on ? acc_.samples == 0 : cur_->size == 0;
  if (!push_nothing) {
    PARASOL_ASSIGN_OR_RETURN(push_nothing, SkipNonfinite(loss, acc_on));
  }
  Status sent = push_nothing ? Status::Ok() : SendPushes(acc_on);
  if (fuse_) client_.SendStep();
  // The tick and the next step's pulls (one message per shard when fused).
  Result<PsClient::Ticket> tick = Internal("no tick sent");
  Status pulled = Status::Ok();
  auto send_tick = [&] {
    // Before the tick: a worker killed after it restarts at the next step, so every step it
    // trained has been reported (a step redone after a restart is reported again, the same).
    // Behind the pushes, that is before they are acknowledged.
    if (hooks_.trained) hooks_.trained(*cur_);
    if (fuse_) client_.BeginStep();
    tick = client_.TickAsync();
    pulled =
        tick.ok() && pull_next ? IssuePulls(*next_, next_keys_, !rows_prefetched) : tick.status();
    if (fuse_) client_.SendStep();
  };
  if (tick_behind_pushes_ && sent.ok()) {
    send_tick();
    ++report_.ticks_behind_pushes;
  }
  // Wait for all of them: on a failure none may be left borrowing the gradients.
  for (PsClient::Ticket tk : pushes_) {
    Status st = client_.Wait(tk);
    if (sent.ok()) sent = st;
  }
  PARASOL_RETURN_IF_ERROR(sent);
  report_.push_seconds += Since(phase);
  report_.push_latency.Observe(Since(phase));
  phase = SteadyClock::now();
  if (!tick_behind_pushes_) send_tick();
  PARASOL_RETURN_IF_ERROR(pulled);
  PARASOL_RETURN_IF_ERROR(client_.Wait(*tick));
  report_.wait_seconds += Since(phase);
  report_.tick_latency.Observe(Since(phase));
  return Status::Ok();
}

Status TrainRun::FollowMembership() {
  if (hooks_.leave_requested && !leave_asked_ && hooks_.leave_requested()) {
    leave_asked_ = true;
    Result<int64_t> at = client_.RequestLeave();
    if (!at.ok()) return at.status().WithContext("asking to leave the job");
    if (hooks_.line) {
      hooks_.line("worker " + std::to_string(rank_) + ": leaves the job at clock " +
                  std::to_string(*at));
    }
  }
  // A membership that changed re-splits the data from the first step not read yet (shard 0
  // names clocks far enough ahead that none of it was).
  const Membership& now = client_.membership();
  if (now.version() == plan_.version()) return Status::Ok();
  const int64_t first = FirstNewClock(plan_, now);
  if (first <= taken_step_) {
    return FailedPrecondition("worker " + std::to_string(rank_) + ": a membership change at " +
                              "clock " + std::to_string(first) + " arrived after this worker " +
                              "had read the batch of step " + std::to_string(taken_step_));
  }
  plan_ = now;
  ++report_.membership_changes;
  reader_.Reposition(plan_, taken_step_ + 1);
  return Status::Ok();
}

void TrainRun::CountStep(double loss, uint64_t samples) {
  ++report_.steps;
  report_.train_samples += samples;
  // The mean loss of the last (up to) 100 steps, in a ring (a skipped step's is not finite,
  // and left out).
  if (std::isfinite(loss)) {
    if (recent_count_ < recent_losses_.size()) ++recent_count_;
    recent_losses_[recent_next_] = loss;
    recent_next_ = (recent_next_ + 1) % recent_losses_.size();
    report_.last_loss =
        std::accumulate(recent_losses_.begin(), recent_losses_.begin() + recent_count_, 0.0) /
        recent_count_;
  }
  if (report_.steps == counted_from_) warm_.Start();
  if (report_.steps == rate_from_) {
    rate_start_ = SteadyClock::now();
    rate_samples_from_ = report_.train_samples;
  }
}

Status TrainRun::ReportProgress() {
  if (report_.steps % 10 == 0) Point(nullptr);
  if (hooks_.line && Since(last_progress_) * 1000 >= training_.progress_ms) {
    last_progress_ = SteadyClock::now();
    const double rate = report_.train_samples / Since(start_);
    const double left = expected_samples_ > report_.train_samples
                            ? (expected_samples_ - report_.train_samples) / rate
                            : 0.0;
    char buf[256];
    std::snprintf(buf, sizeof(buf),
                  "worker %u: step %llu, %llu samples, %.0f samples/s, loss %.4f, ETA %.0f s",
                  rank_, static_cast<unsigned long long>(report_.steps),
                  static_cast<unsigned long long>(report_.train_samples), rate, report_.last_loss,
                  left);
    hooks_.line(buf);
  }
  if (training_.eval_every > 0 && report_.steps % training_.eval_every == 0 && rank_ == 0 &&
      !manifest_.data.eval.empty()) {
    // The step's own slot is free (the next step's pulls fill the other).
    PARASOL_ASSIGN_OR_RETURN(EvalResult e, trainer_.Evaluate(manifest_.data.eval, cur_slot_));
    Point(&e);
    if (hooks_.line) {
      char buf[160];
      std::snprintf(buf, sizeof(buf), "worker 0: step %llu: eval logloss %.4f, AUC %.4f",
                    static_cast<unsigned long long>(report_.steps), e.logloss, e.auc);
      hooks_.line(buf);
    }
  }
  return Status::Ok();
}

void TrainRun::MoveToNextBatch() {
  reader_.Recycle(std::move(*cur_));
  cur_ = std::move(next_);
  std::swap(cur_keys_, next_keys_);
  std::swap(cur_ahead_.rows, next_ahead_.rows);
  cur_ahead_.ticket = next_ahead_.ticket;
  next_ahead_.ticket.reset();
  cur_rows_ = next_rows_;
  next_rows_ = nullptr;
  next_read_ = false;
}

Result<std::optional<Batch>> TrainRun::Take(Result<std::optional<Batch>> b) {
  if (b.ok() && b->has_value()) taken_step_ = std::max(taken_step_, (*b)->step);
  return b;
}

// The pulls of the step about to run land in the model's slot pull_slot (which becomes
// cur_slot when the step starts): its rows and its dense weights. A step's pulls are issued as
// soon as the step before has pushed (in the same flush: under BSP the shard answers them the
// moment the tick is applied), or earlier under SSP/ASP with prefetch.
Status TrainRun::IssuePulls(const Batch& batch, const BatchKeys& keys, bool sparse) {
  if (sparse) {
    float* rows = model_.StepRows(pull_slot_, static_cast<uint32_t>(keys.unique.size()),
                                  static_cast<uint32_t>(batch.keys.size()));
    if (!rows) return ResourceExhausted("no host memory for the step's rows");
    PARASOL_ASSIGN_OR_RETURN(PsClient::Ticket tk,
                             client_.PullSparseAsync(model_.sparse_table(), keys.unique, rows));
    rows_pull_ = tk;
  }
  for (size_t i = 0; i < model_.dense_tables().size(); ++i) {
    PARASOL_ASSIGN_OR_RETURN(
        PsClient::Ticket tk,
        client_.PullDenseAsync(model_.dense_tables()[i], model_.StepDense(pull_slot_, i).data()));
    dense_pulls_.push_back(tk);
  }
  return Status::Ok();
}

Status TrainRun::WaitPulls() {
  Status first;
  if (rows_pull_) first = client_.Wait(*rows_pull_);
  rows_pull_.reset();
  if (cur_ahead_.ticket) {
    const Status st = client_.Wait(*cur_ahead_.ticket);
    cur_ahead_.ticket.reset();
    if (first.ok()) first = st;
    if (st.ok() && !cur_keys_.unique.empty()) {
      std::memcpy(cur_rows_, cur_ahead_.rows.data(),
                  cur_keys_.unique.size() * size_t{model_.sparse_dim()} * sizeof(float));
    }
  }
  for (PsClient::Ticket tk : dense_pulls_) {
    Status st = client_.Wait(tk);
    if (first.ok()) first = st;
  }
  dense_pulls_.clear();
  return first;
}

Status TrainRun::PrefetchInto(Ahead& a, const BatchKeys& keys, uint32_t ahead) {
  if (a.ticket) return Status::Ok();
  a.rows.resize(keys.unique.size() * size_t{dim_});
  PARASOL_ASSIGN_OR_RETURN(
      PsClient::Ticket ticket,
      client_.PrefetchSparseAsync(model_.sparse_table(), keys.unique, a.rows.data(), ahead));
  a.ticket = ticket;
  return Status::Ok();
}

Result<double> TrainRun::ForwardBackward() {
  model_.Run(*cur_, cur_slot_, static_cast<uint32_t>(cur_keys_.unique.size()),
             cur_keys_.indices.data(), /*train=*/true);
  if (Status st = model_.Finish(cur_slot_); !st.ok()) {
    return st.WithContext("step " + std::to_string(report_.steps));
  }
  return model_.Loss();
}

Status TrainRun::AccumulateMicroBatches(double* loss, uint64_t* step_samples) {
  // k micro-batches make one step: their gradients (each of its batch's mean loss) are
  // weighted by their sizes and averaged, which is the gradient of the mean loss over all
  // k x batch_size samples; one push and one tick for the k of them.
  acc_.Start(model_);
  if (cur_->size > 0) acc_.Add(model_, cur_keys_.unique, model_.RowGrads(), cur_->size, dim_);
  double loss_sum = *loss * cur_->size;
  for (uint32_t j = 1; j < accumulate_ && next_ && next_->step == cur_->step; ++j) {
    // An earlier micro-batch of the step: reported now (a restart redoes the whole step).
    if (hooks_.trained) hooks_.trained(*cur_);
    reader_.Recycle(std::move(*cur_));
    cur_ = std::move(next_);
    std::swap(cur_keys_, next_keys_);
    auto phase = SteadyClock::now();
    // The step's slot: its dense weights stay, its rows are replaced.
    float* rows = model_.StepRows(cur_slot_, static_cast<uint32_t>(cur_keys_.unique.size()),
                                  static_cast<uint32_t>(cur_->keys.size()));
    if (!rows) return ResourceExhausted("no host memory for the step's rows");
    PARASOL_RETURN_IF_ERROR(client_.PullSparse(model_.sparse_table(), cur_keys_.unique, rows));
    report_.pull_seconds += Since(phase);
    phase = SteadyClock::now();
    PARASOL_ASSIGN_OR_RETURN(next_, Take(reader_.Next()));
    report_.data_seconds += Since(phase);
    if (next_) TakeKeys(*next_, &next_keys_);
    phase = SteadyClock::now();
    if (cur_->size == 0) continue;  // every row malformed
    PARASOL_ASSIGN_OR_RETURN(const double l, ForwardBackward());
    report_.compute_seconds += Since(phase);
    acc_.Add(model_, cur_keys_.unique, model_.RowGrads(), cur_->size, dim_);
    loss_sum += l * cur_->size;
    *step_samples += cur_->size;
  }
  if (acc_.samples > 0) {
    acc_.Finish(dim_);
    *loss = loss_sum / static_cast<double>(*step_samples);
  }
  return Status::Ok();
}

Result<bool> TrainRun::SkipNonfinite(double loss, bool acc_on) {
  // A step whose loss or gradients are not finite would poison rows every worker reads:
  // it stops the worker, or (on_nonfinite: skip) pushes nothing and is counted.
  std::string bad = NonfiniteIn(manifest_, loss, model_,
                                acc_on ? std::span<const float>(acc_.rows) : model_.RowGrads(),
                                acc_on ? &acc_.dense : nullptr);
  if (bad.empty()) return false;
  if (training_.on_nonfinite == TrainingOptions::OnNonfinite::kFail) {
    return FailedPrecondition(
        "step " + std::to_string(report_.steps) + ": " + bad +
        "; nothing of it was pushed (training.on_nonfinite: skip would skip such steps)");
  }
  ++report_.nonfinite_steps;
  if (report_.nonfinite_steps == 1 ||
      (report_.nonfinite_steps & (report_.nonfinite_steps - 1)) == 0) {
    spdlog::warn("worker {}: step {}: {}; skipped ({} such steps so far)", rank_, report_.steps,
                 bad, report_.nonfinite_steps);
  }
  return true;
}

Status TrainRun::SendPushes(bool acc_on) {
  PARASOL_ASSIGN_OR_RETURN(
      PsClient::Ticket sparse_push,
      client_.PushSparseAsync(model_.sparse_table(), acc_on ? acc_.keys : cur_keys_.unique,
                              acc_on ? std::span<const float>(acc_.rows) : model_.RowGrads()));
  pushes_.push_back(sparse_push);
  for (size_t i = 0; i < model_.dense_tables().size(); ++i) {
    PARASOL_ASSIGN_OR_RETURN(
        PsClient::Ticket tk,
        client_.PushDenseAsync(model_.dense_tables()[i],
                               acc_on ? std::span<const float>(acc_.dense[i])
                                      : std::span<const float>(model_.DenseGrads()[i])));
    pushes_.push_back(tk);
  }
  return Status::Ok();
}

void TrainRun::Point(const EvalResult* e) {
  if (hooks_.point) {
    hooks_.point(PointOf(report_, Since(start_), e, client_));
  }
}

}  // namespace

Result<TrainReport> Trainer::RunOnce() {
  if (manifest_.data.train.empty()) {
    return InvalidArgument(manifest_.source + ": key 'data.train': no training data given");
  }
  PARASOL_ASSIGN_OR_RETURN(Model * model, TheModel());
  TrainRun run(*this, manifest_, rank_, *client_, hooks_, *model);
  PARASOL_RETURN_IF_ERROR(run.MeetAtStart());
  PARASOL_RETURN_IF_ERROR(run.TakeFirstBatch());
  while (run.HasStep()) {
    PARASOL_RETURN_IF_ERROR(run.Step());
  }
  PARASOL_RETURN_IF_ERROR(run.Tally());
  return run.LeaveAndEvaluate();
}

}  // namespace parasol
