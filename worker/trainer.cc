#include "worker/trainer.hpp"

#include <array>
#include <cmath>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <deque>
#include <filesystem>
#include <fstream>
#include <numeric>

#include <spdlog/spdlog.h>

#include "common/json_text.hpp"
#include "common/key_index.hpp"
#include "worker/data_reader.hpp"
#include "worker/metrics.hpp"
#include "worker/model.hpp"

namespace parasol {
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

Result<TrainReport> Trainer::RunOnce() {
  const TrainingOptions& t = manifest_.training;
  const uint32_t workers = manifest_.cluster.workers;
  if (manifest_.data.train.empty()) {
    return InvalidArgument(manifest_.source + ": key 'data.train': no training data given");
  }
  PARASOL_ASSIGN_OR_RETURN(Model * model, TheModel());
  ReaderOptions ro;
  ro.format = manifest_.data.format;
  ro.files = manifest_.data.train;
  ro.batch_size = t.batch_size;
  ro.epochs = t.epochs;
  ro.rank = rank_;
  ro.workers = workers;
  ro.on_bad_row = manifest_.data.on_bad_row;
  ro.queue_batches = manifest_.data.queue_batches;
  ro.deduplicate = true;  // on the reader's thread: each batch's keys arrive deduplicated
  // The data follows the job's membership (common/membership.hpp); a worker that restarted or
  // joined reads on from the step it continues at.
  Membership plan = client_->membership();
  const int64_t resume = std::max<int64_t>(0, client_->resumed_clock());
  ro.membership = plan;
  ro.start_step = resume;
  ro.batches_per_step = t.accumulate;
  const uint64_t expected_samples = EstimateLines(ro.files) * t.epochs / workers;
  BatchReader reader(ro);
  // The newest step whose batch the trainer has taken from the reader (-1: none).
  int64_t taken_step = -1;
  auto take = [&](Result<std::optional<Batch>> b) -> Result<std::optional<Batch>> {
    if (b.ok() && b->has_value()) taken_step = std::max(taken_step, (*b)->step);
    return b;
  };
  // Every key list the trainer hands the client is deduplicated (DeduplicateKeys, GradientSum).
  client_->AssumeUniqueKeys(true);

  const bool prefetch =
      t.prefetch && t.accumulate == 1 &&
      (t.consistency == TrainingOptions::Consistency::kAsp ||
       (t.consistency == TrainingOptions::Consistency::kSsp && t.staleness >= 1));
  // Steps ahead whose rows are pulled during compute (the next one's land in its slot; further
  // ones in buffers of their own, copied into their slot when their step starts).
  const uint32_t depth = prefetch ? std::max<uint32_t>(1, t.prefetch_depth) : 1;
  const uint32_t accumulate = t.accumulate;
  TrainReport report;
  report.worker = rank_;
  auto phase = SteadyClock::now();
  // A restarted worker skips barrier 0 when the others have passed it (a shard that restarted
  // since its release might hold it for them).
  if (client_->resumed_clock() < 0 && client_->last_barrier_seen() < 0) {
    PARASOL_RETURN_IF_ERROR(client_->Barrier(0));
  }
  report.wait_seconds += Since(phase);

  const auto start = SteadyClock::now();
  auto last_progress = start;
  AllocationWatch warm(hooks_.allocations);
  std::vector<PsClient::Ticket> pushes;  // a step's push tickets
  std::array<double, 100> recent_losses{};
  size_t recent_count = 0, recent_next = 0;
  BatchKeys cur_keys, next_keys;
  // A batch's distinct keys, deduplicated by the reader, into `keys`; the buffers `keys` had
  // go back with the batch when it is recycled.
  auto take_keys = [](Batch& b, BatchKeys* keys) { std::swap(b.distinct, *keys); };
  // The slot of the step about to run (cur_slot) and the one the next step's pulls fill.
  int cur_slot = 0, pull_slot = 0;
  GradientSum acc;  // training.accumulate > 1

  phase = SteadyClock::now();
  // A restarted worker continues at the clock the shards know it at (the reader starts at that
  // step's batch); a joining one at the clock it joined at.
  // Allocations are counted from this step on (TrainReport::allocations_per_step).
  const uint64_t counted_from = static_cast<uint64_t>(resume) + kWarmSteps;
  report.first_step = resume;
  if (resume > 0) {
    report.steps = static_cast<uint64_t>(resume);
    if (hooks_.line) {
      const bool joined = plan.join(rank_) == resume && rank_ >= plan.initial();
      hooks_.line("worker " + std::to_string(rank_) + (joined ? ": joined at step " : ": resuming at step ") +
                  std::to_string(resume) +
                  (joined ? "" : " (the batches before it were trained on)"));
    }
  }
  bool leave_asked = false;
  // After each tick: a membership that changed re-splits the data from the first step not read
  // yet (shard 0 names clocks far enough ahead that none of it was).
  auto follow_membership = [&]() -> Status {
    if (hooks_.leave_requested && !leave_asked && hooks_.leave_requested()) {
      leave_asked = true;
      Result<int64_t> at = client_->RequestLeave();
      if (!at.ok()) return at.status().WithContext("asking to leave the job");
      if (hooks_.line) {
        hooks_.line("worker " + std::to_string(rank_) + ": leaves the job at clock " +
                    std::to_string(*at));
      }
    }
    const Membership& now = client_->membership();
    if (now.version() == plan.version()) return Status::Ok();
    const int64_t first = FirstNewClock(plan, now);
    if (first <= taken_step) {
      return FailedPrecondition("worker " + std::to_string(rank_) + ": a membership change at " +
                                "clock " + std::to_string(first) + " arrived after this worker " +
                                "had read the batch of step " + std::to_string(taken_step));
    }
    plan = now;
    ++report.membership_changes;
    reader.Reposition(plan, taken_step + 1);
    return Status::Ok();
  };
  PARASOL_ASSIGN_OR_RETURN(std::optional<Batch> cur, take(reader.Next()));
  report.data_seconds += Since(phase);
  if (cur) take_keys(*cur, &cur_keys);
  const uint32_t dim = model->sparse_dim();
  const bool fuse = manifest_.worker.fuse_requests;
  // One shard, and the manifest lists no other that could join: the tick may go behind the
  // pushes without waiting for their acknowledgements (see the pushes below).
  const bool tick_behind_pushes = manifest_.cluster.servers.size() == 1;

  // The pulls of the step about to run land in the model's slot pull_slot (which becomes
  // cur_slot when the step starts): its rows and its dense weights. A step's pulls are issued as soon as the step
  // before has pushed (in the same flush: under BSP the shard answers them the moment the
  // tick is applied), or earlier under SSP/ASP with prefetch.
  std::optional<PsClient::Ticket> rows_pull;
  std::vector<PsClient::Ticket> dense_pulls;
  auto issue_pulls = [&](const Batch& batch, const BatchKeys& keys, bool sparse) -> Status {
    if (sparse) {
      float* rows = model->StepRows(pull_slot, static_cast<uint32_t>(keys.unique.size()),
                                    static_cast<uint32_t>(batch.keys.size()));
      if (!rows) return ResourceExhausted("no host memory for the step's rows");
      PARASOL_ASSIGN_OR_RETURN(PsClient::Ticket tk,
                               client_->PullSparseAsync(model->sparse_table(), keys.unique, rows));
      rows_pull = tk;
    }
    for (size_t i = 0; i < model->dense_tables().size(); ++i) {
      PARASOL_ASSIGN_OR_RETURN(
          PsClient::Ticket tk,
          client_->PullDenseAsync(model->dense_tables()[i], model->StepDense(pull_slot, i).data()));
      dense_pulls.push_back(tk);
    }
    return Status::Ok();
  };
  // training.prefetch_depth > 1: the batches after `next`, read ahead, each with its rows
  // pulled into a buffer of its own; `next` and `cur` keep theirs here, and a step's rows are
  // copied into its slot (at cur_rows) when it starts.
  struct Ahead {
    std::optional<Batch> batch;
    BatchKeys keys;
    std::vector<float> rows;
    std::optional<PsClient::Ticket> ticket;
  };
  std::deque<Ahead> further;
  Ahead next_ahead, cur_ahead;
  // An entry whose step has started, kept with its buffers (the step before's rows and keys)
  // for the next batch read ahead: no allocation per step in steady state.
  Ahead spare;
  float* cur_rows = nullptr;
  float* next_rows = nullptr;
  // On every way out, no pull may be left writing into these buffers.
  struct WaitOnExit {
    PsClient* client;
    std::deque<Ahead>* further;
    Ahead* next;
    Ahead* cur;
    ~WaitOnExit() {
      for (Ahead* a : {cur, next}) {
        if (a->ticket) (void)client->Wait(*a->ticket);
      }
      for (Ahead& a : *further) {
        if (a.ticket) (void)client->Wait(*a.ticket);
      }
    }
  } wait_on_exit{client_, &further, &next_ahead, &cur_ahead};
  auto wait_pulls = [&]() -> Status {
    Status first;
    if (rows_pull) first = client_->Wait(*rows_pull);
    rows_pull.reset();
    if (cur_ahead.ticket) {
      const Status st = client_->Wait(*cur_ahead.ticket);
      cur_ahead.ticket.reset();
      if (first.ok()) first = st;
      if (st.ok() && !cur_keys.unique.empty()) {
        std::memcpy(cur_rows, cur_ahead.rows.data(),
                    cur_keys.unique.size() * size_t{model->sparse_dim()} * sizeof(float));
      }
    }
    for (PsClient::Ticket tk : dense_pulls) {
      Status st = client_->Wait(tk);
      if (first.ok()) first = st;
    }
    dense_pulls.clear();
    return first;
  };
  if (cur) {
    if (fuse) client_->BeginStep();
    const Status st = issue_pulls(*cur, cur_keys, true);
    if (fuse) client_->SendStep();
    PARASOL_RETURN_IF_ERROR(st);
  }
  std::optional<Batch> next;
  bool next_read = false;

  while (cur && (t.max_steps == 0 || report.steps < t.max_steps)) {
    // The next batch is read and deduplicated while this step's pulls travel.
    phase = SteadyClock::now();
    if (!next_read) {
      if (!further.empty()) {  // read, and its rows pulled, ahead
        next = std::move(further.front().batch);
        std::swap(next_keys, further.front().keys);
        std::swap(next_ahead.rows, further.front().rows);
        next_ahead.ticket = further.front().ticket;
        spare = std::move(further.front());
        spare.ticket.reset();
        spare.batch.reset();
        further.pop_front();
      } else {
        PARASOL_ASSIGN_OR_RETURN(next, take(reader.Next()));
        if (next) take_keys(*next, &next_keys);
      }
      next_read = true;
    }
    report.data_seconds += Since(phase);
    phase = SteadyClock::now();
    PARASOL_RETURN_IF_ERROR(wait_pulls());
    cur_slot = pull_slot;
    pull_slot = cur_slot ^ 1;
    report.pull_seconds += Since(phase);
    report.pull_latency.Observe(Since(phase));
    const bool more = next && (t.max_steps == 0 || report.steps + 1 < t.max_steps);
    bool rows_prefetched = false;
    if (prefetch && more && depth == 1) {
      // SSP/ASP: the next step's rows travel during this step's compute, at the clock they
      // will be used at.
      float* rows = model->StepRows(pull_slot, static_cast<uint32_t>(next_keys.unique.size()),
                                    static_cast<uint32_t>(next->keys.size()));
      if (!rows) return ResourceExhausted("no host memory for the step's rows");
      PARASOL_ASSIGN_OR_RETURN(
          PsClient::Ticket ticket,
          client_->PrefetchSparseAsync(model->sparse_table(), next_keys.unique, rows));
      rows_pull = ticket;
      rows_prefetched = true;
      report.prefetch_ahead_max = std::max<uint32_t>(report.prefetch_ahead_max, 1);
    } else if (prefetch && more) {
      // Depth k: the rows of the next k steps travel during this one's compute, each pull at
      // the clock its step will run at. Batches past max_steps or the data are not read.
      phase = SteadyClock::now();
      while (further.size() + 1 < depth &&
             (t.max_steps == 0 || report.steps + 2 + further.size() < t.max_steps)) {
        PARASOL_ASSIGN_OR_RETURN(std::optional<Batch> b, take(reader.Next()));
        if (!b) break;
        Ahead a = std::move(spare);
        spare = Ahead();
        a.batch = std::move(b);
        take_keys(*a.batch, &a.keys);
        further.push_back(std::move(a));
      }
      report.data_seconds += Since(phase);
      auto prefetch_into = [&](Ahead& a, const BatchKeys& keys, uint32_t ahead) -> Status {
        if (a.ticket) return Status::Ok();
        a.rows.resize(keys.unique.size() * size_t{dim});
        PARASOL_ASSIGN_OR_RETURN(
            PsClient::Ticket ticket,
            client_->PrefetchSparseAsync(model->sparse_table(), keys.unique, a.rows.data(), ahead));
        a.ticket = ticket;
        return Status::Ok();
      };
      PARASOL_RETURN_IF_ERROR(prefetch_into(next_ahead, next_keys, 1));
      for (size_t j = 0; j < further.size(); ++j) {
        PARASOL_RETURN_IF_ERROR(prefetch_into(further[j], further[j].keys, 2 + j));
      }
      // The next step's slot takes its rows when it starts; sized now, before its dense pulls
      // (with the tick) write into the same slot.
      next_rows = model->StepRows(pull_slot, static_cast<uint32_t>(next_keys.unique.size()),
                                  static_cast<uint32_t>(next->keys.size()));
      if (!next_rows) return ResourceExhausted("no host memory for the step's rows");
      rows_prefetched = true;
      report.prefetch_ahead_max =
          std::max(report.prefetch_ahead_max, static_cast<uint32_t>(1 + further.size()));
    }

    phase = SteadyClock::now();
    // A batch whose every row was malformed is a step with nothing to push (the worker still
    // ticks: its place in the job's steps stays).
    double loss = 0;
    if (cur->size > 0) {
      model->Run(*cur, cur_slot, static_cast<uint32_t>(cur_keys.unique.size()),
                 cur_keys.indices.data(), /*train=*/true);
      if (Status st = model->Finish(cur_slot); !st.ok()) {
        return st.WithContext("step " + std::to_string(report.steps));
      }
      loss = model->Loss();
    }
    report.compute_seconds += Since(phase);
    uint64_t step_samples = cur->size;

    if (accumulate > 1) {
      // k micro-batches make one step: their gradients (each of its batch's mean loss) are
      // weighted by their sizes and averaged, which is the gradient of the mean loss over all
      // k x batch_size samples; one push and one tick for the k of them.
      acc.Start(*model);
      if (cur->size > 0) acc.Add(*model, cur_keys.unique, model->RowGrads(), cur->size, dim);
      double loss_sum = loss * cur->size;
      for (uint32_t j = 1; j < accumulate && next && next->step == cur->step; ++j) {
        // An earlier micro-batch of the step: reported now (a restart redoes the whole step).
        if (hooks_.trained) hooks_.trained(*cur);
        reader.Recycle(std::move(*cur));
        cur = std::move(next);
        std::swap(cur_keys, next_keys);
        phase = SteadyClock::now();
        // The step's slot: its dense weights stay, its rows are replaced.
        float* rows = model->StepRows(cur_slot, static_cast<uint32_t>(cur_keys.unique.size()),
                                      static_cast<uint32_t>(cur->keys.size()));
        if (!rows) return ResourceExhausted("no host memory for the step's rows");
        PARASOL_RETURN_IF_ERROR(
            client_->PullSparse(model->sparse_table(), cur_keys.unique, rows));
        report.pull_seconds += Since(phase);
        phase = SteadyClock::now();
        PARASOL_ASSIGN_OR_RETURN(next, take(reader.Next()));
        report.data_seconds += Since(phase);
        if (next) take_keys(*next, &next_keys);
        phase = SteadyClock::now();
        if (cur->size == 0) continue;  // every row malformed
        model->Run(*cur, cur_slot, static_cast<uint32_t>(cur_keys.unique.size()),
                   cur_keys.indices.data(), /*train=*/true);
        if (Status st = model->Finish(cur_slot); !st.ok()) {
          return st.WithContext("step " + std::to_string(report.steps));
        }
        const double l = model->Loss();
        report.compute_seconds += Since(phase);
        acc.Add(*model, cur_keys.unique, model->RowGrads(), cur->size, dim);
        loss_sum += l * cur->size;
        step_samples += cur->size;
      }
      if (acc.samples > 0) {
        acc.Finish(dim);
        loss = loss_sum / static_cast<double>(step_samples);
      }
    }
    const bool pull_next = next && (t.max_steps == 0 || report.steps + 1 < t.max_steps);

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
    phase = SteadyClock::now();
    pushes.clear();
    const bool acc_on = accumulate > 1;
    if (fuse) client_->BeginStep();
    bool push_nothing = acc_on ? acc.samples == 0 : cur->size == 0;
    if (!push_nothing) {
      // A step whose loss or gradients are not finite would poison rows every worker reads:
      // it stops the worker, or (on_nonfinite: skip) pushes nothing and is counted.
      std::string bad = NonfiniteIn(manifest_, loss, *model, acc_on ? std::span<const float>(acc.rows)
                                                         : model->RowGrads(),
                                    acc_on ? &acc.dense : nullptr);
      if (!bad.empty()) {
        if (t.on_nonfinite == TrainingOptions::OnNonfinite::kFail) {
          return FailedPrecondition(
              "step " + std::to_string(report.steps) + ": " + bad +
              "; nothing of it was pushed (training.on_nonfinite: skip would skip such steps)");
        }
        ++report.nonfinite_steps;
        if (report.nonfinite_steps == 1 || (report.nonfinite_steps & (report.nonfinite_steps - 1)) == 0) {
          spdlog::warn("worker {}: step {}: {}; skipped ({} such steps so far)", rank_,
                       report.steps, bad, report.nonfinite_steps);
        }
        push_nothing = true;
      }
    }
    Status sent = [&]() -> Status {
      if (push_nothing) return Status::Ok();
      PARASOL_ASSIGN_OR_RETURN(
          PsClient::Ticket sparse_push,
          client_->PushSparseAsync(model->sparse_table(), acc_on ? acc.keys : cur_keys.unique,
                                   acc_on ? std::span<const float>(acc.rows)
                                          : model->RowGrads()));
      pushes.push_back(sparse_push);
      for (size_t i = 0; i < model->dense_tables().size(); ++i) {
        PARASOL_ASSIGN_OR_RETURN(
            PsClient::Ticket tk,
            client_->PushDenseAsync(model->dense_tables()[i],
                                    acc_on ? std::span<const float>(acc.dense[i])
                                           : std::span<const float>(model->DenseGrads()[i])));
        pushes.push_back(tk);
      }
      return Status::Ok();
    }();
    if (fuse) client_->SendStep();
    // The tick and the next step's pulls (one message per shard when fused).
    Result<PsClient::Ticket> tick = Internal("no tick sent");
    Status pulled = Status::Ok();
    auto send_tick = [&] {
      // Before the tick: a worker killed after it restarts at the next step, so every step it
      // trained has been reported (a step redone after a restart is reported again, the same).
      // Behind the pushes, that is before they are acknowledged.
      if (hooks_.trained) hooks_.trained(*cur);
      if (fuse) client_->BeginStep();
      tick = client_->TickAsync();
      pulled = tick.ok() && pull_next ? issue_pulls(*next, next_keys, !rows_prefetched)
                                      : tick.status();
      if (fuse) client_->SendStep();
    };
    if (tick_behind_pushes && sent.ok()) {
      send_tick();
      ++report.ticks_behind_pushes;
    }
    // Wait for all of them: on a failure none may be left borrowing the gradients.
    for (PsClient::Ticket tk : pushes) {
      Status st = client_->Wait(tk);
      if (sent.ok()) sent = st;
    }
    PARASOL_RETURN_IF_ERROR(sent);
    report.push_seconds += Since(phase);
    report.push_latency.Observe(Since(phase));
    phase = SteadyClock::now();
    if (!tick_behind_pushes) send_tick();
    PARASOL_RETURN_IF_ERROR(pulled);
    PARASOL_RETURN_IF_ERROR(client_->Wait(*tick));
    report.wait_seconds += Since(phase);
    report.tick_latency.Observe(Since(phase));
    PARASOL_RETURN_IF_ERROR(follow_membership());

    ++report.steps;
    report.train_samples += step_samples;
    // The mean loss of the last (up to) 100 steps, in a ring (a skipped step's is not finite,
    // and left out).
    if (std::isfinite(loss)) {
      if (recent_count < recent_losses.size()) ++recent_count;
      recent_losses[recent_next] = loss;
      recent_next = (recent_next + 1) % recent_losses.size();
      report.last_loss =
          std::accumulate(recent_losses.begin(), recent_losses.begin() + recent_count, 0.0) /
          recent_count;
    }
    if (report.steps == counted_from) warm.Start();
    // What follows (progress, evaluation) is reporting: its allocations are not the step's.
    const uint64_t reporting_from = warm.Now();

    auto point = [&](const EvalResult* e) {
      if (hooks_.point) {
        hooks_.point(PointOf(report, Since(start), e, *client_));
      }
    };
    if (report.steps % 10 == 0) point(nullptr);
    if (hooks_.line && Since(last_progress) * 1000 >= t.progress_ms) {
      last_progress = SteadyClock::now();
      const double rate = report.train_samples / Since(start);
      const double left = expected_samples > report.train_samples
                              ? (expected_samples - report.train_samples) / rate
                              : 0.0;
      char buf[256];
      std::snprintf(buf, sizeof(buf),
                    "worker %u: step %llu, %llu samples, %.0f samples/s, loss %.4f, ETA %.0f s",
                    rank_, static_cast<unsigned long long>(report.steps),
                    static_cast<unsigned long long>(report.train_samples), rate,
                    report.last_loss, left);
      hooks_.line(buf);
    }
    if (t.eval_every > 0 && report.steps % t.eval_every == 0 && rank_ == 0 &&
        !manifest_.data.eval.empty()) {
      // The step's own slot is free (the next step's pulls fill the other).
      PARASOL_ASSIGN_OR_RETURN(EvalResult e, Evaluate(manifest_.data.eval, cur_slot));
      point(&e);
      if (hooks_.line) {
        char buf[160];
        std::snprintf(buf, sizeof(buf), "worker 0: step %llu: eval logloss %.4f, AUC %.4f",
                      static_cast<unsigned long long>(report.steps), e.logloss, e.auc);
        hooks_.line(buf);
      }
    }
    warm.Exclude(reporting_from);
    reader.Recycle(std::move(*cur));
    cur = std::move(next);
    std::swap(cur_keys, next_keys);
    std::swap(cur_ahead.rows, next_ahead.rows);
    cur_ahead.ticket = next_ahead.ticket;
    next_ahead.ticket.reset();
    cur_rows = next_rows;
    next_rows = nullptr;
    next_read = false;
  }
  PARASOL_RETURN_IF_ERROR(wait_pulls());
  report.allocations_per_step =
      warm.PerStep(report.steps > counted_from ? report.steps - counted_from : 0);
  report.train_seconds = Since(start);
  report.samples_per_second = report.train_samples / std::max(1e-9, report.train_seconds);
  report.bad_rows = reader.bad_rows();
  report.pushes = client_->pushes_acknowledged();
  report.push_log_peak_bytes = client_->push_log_peak_bytes();
  report.cache_hits = client_->cache_hits();
  report.cache_misses = client_->cache_misses();
  if (report.steps > static_cast<uint64_t>(resume)) {
    report.push_log_bytes_per_step = static_cast<double>(client_->push_log_added_bytes()) /
                                     static_cast<double>(report.steps - resume);
    report.pull_bytes_per_step = static_cast<double>(client_->pulled_row_bytes()) /
                                 static_cast<double>(report.steps - resume);
  }
  report.first_bad_row = reader.first_bad_row();

  // Done: the others stop waiting for this worker's clock; then all meet before evaluating. A
  // worker that left the running job early goes without meeting them.
  phase = SteadyClock::now();
  PARASOL_RETURN_IF_ERROR(client_->Leave());
  const int64_t leave_at = client_->membership().leave(rank_);
  if (leave_at >= 0 && client_->clock() >= leave_at) {
    report.left_at = leave_at;
    return report;
  }
  PARASOL_RETURN_IF_ERROR(client_->Barrier(1));
  report.wait_seconds += Since(phase);
  // The lowest rank still in the job evaluates (rank 0 unless it left).
  uint32_t evaluator = rank_;
  for (uint32_t r = 0; r < client_->membership().max_ranks(); ++r) {
    if (client_->membership().Joined(r) && client_->membership().leave(r) < 0) {
      evaluator = r;
      break;
    }
  }
  if (rank_ == evaluator && !manifest_.data.eval.empty()) {
    PARASOL_ASSIGN_OR_RETURN(EvalResult e, Evaluate(manifest_.data.eval));
    report.evaluated = true;
    report.eval_samples = e.samples;
    report.eval_logloss = e.logloss;
    report.eval_auc = e.auc;
  }
  if (hooks_.point) {
    EvalResult e{report.eval_samples, report.eval_logloss, report.eval_auc};
    hooks_.point(PointOf(report, report.train_seconds, report.evaluated ? &e : nullptr,
                         *client_));
  }
  return report;
}

}  // namespace parasol
