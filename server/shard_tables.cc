// The table side of ShardServer: pulls, pushes (applied at once or summed per clock under
// BSP), BSP application and eviction sweeps. Split from shard_server.cc, which holds the
// request loop, dispatch and the consistency glue.
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstdlib>
#include <limits>
#include <cstring>

#include "common/hash.hpp"
#include "common/initializer.hpp"
#include "common/sharding.hpp"
#include "common/small_copy.hpp"
#include "common/transport.hpp"
#include "server/optimizer.hpp"
#include "server/shard_server.hpp"

namespace parasol {
namespace {

// Below this many floats a request is handled on the request thread: waking the engines
// would cost more than the work.
constexpr uint64_t kInlineFloats = 32 * 1024;

// Names of writes (with the table's seed, they seed stochastic rounding; RoundingBitsFor): a
// BSP clock's apply, and one push, named as exactly-once names it (worker, clock, index), so a
// restarted shard that applies the replayed pushes rounds them as the first process did.
uint64_t ClockWrite(int64_t clock) { return Fmix64(static_cast<uint64_t>(clock)); }
uint64_t PushWrite(const Header& req) {
  return Fmix64(Fmix64(Fmix64(uint64_t{req.worker_id} + 1) ^ static_cast<uint64_t>(req.clock)) ^
                req.seq);
}

// Calls fn(partition, i, key) for every key of the request, on the engine that owns the key,
// with the lookahead of Partition::ForEachKey.
template <typename Fn>
void ForEachOwnedKey(EnginePool& engines, SparseTable& table,
                     const std::vector<std::vector<uint32_t>>& positions, const PayloadView& p,
                     bool run_inline, Fn&& fn) {
  engines.RunOnAll(
      [&](uint32_t e) {
        SparseTable::Partition& part = table.partition(e);
        part.ForEachKey(positions[e], [&](uint32_t i) { return p.Key(i); },
                        [&](uint32_t i, uint64_t key) { fn(part, i, key); });
        part.Settle();  // tiered: back to the memory budget
      },
      run_inline);
}

}  // namespace

Status ShardServer::PrefaultKeys(SparseTable& table, const PayloadView& p) {
  if (!table.tiered()) return Status::Ok();
  std::vector<Status> status(engines_.size());
  engines_.RunOnAll([&](uint32_t e) {
    status[e] = table.partition(e).Prefault(engine_positions_[e],
                                            [&](uint32_t i) { return p.Key(i); });
  });
  for (const Status& st : status) {
    PARASOL_RETURN_IF_ERROR(st.WithContext("table '" + table.options().name + "'"));
  }
  return Status::Ok();
}

void ShardServer::MaybeSweep() {
  const auto now = std::chrono::steady_clock::now();
  if (now - last_sweep_ < std::chrono::milliseconds(10)) return;
  last_sweep_ = now;
  bool any = false;
  for (const auto& t : sparse_) any |= t && t->evicts();
  if (!any) return;
  // A bounded slice of every evicting table per call, on the engines that own the rows, so
  // eviction never races an update and never holds requests up for long.
  constexpr size_t kBucketsPerSweep = 1 << 15;
  const uint32_t clock = ShardClock();
  engines_.RunOnAll([&](uint32_t e) {
    for (const auto& t : sparse_) {
      if (t && t->evicts()) t->partition(e).Sweep(kBucketsPerSweep, clock);
    }
  });
}

void ShardServer::SplitByEngine(const PayloadView& p) {
  engine_positions_.resize(engines_.size());
  for (auto& v : engine_positions_) v.clear();
  const uint32_t engines = engines_.size();
  for (uint64_t i = 0; i < p.rows(); ++i) {
    engine_positions_[EngineOfKey(p.Key(i), engines)].push_back(static_cast<uint32_t>(i));
  }
}

Result<SparseTable*> ShardServer::SparseTableFor(const Header& req) {
  if (req.table_id >= sparse_.size()) {
    return NotFound(std::string(OpName(req.op)) + ": no table with id " +
                    std::to_string(req.table_id) + " (the manifest has " +
                    std::to_string(sparse_.size()) + ")");
  }
  SparseTable* t = sparse_[req.table_id].get();
  if (!t) {
    return InvalidArgument(std::string(OpName(req.op)) + ": table '" +
                           manifest_.tables[req.table_id].name + "' is dense, not sparse");
  }
  if (req.with_state && req.op != Op::PullSparse) {
    return InvalidArgument(std::string(OpName(req.op)) + ": with_state applies to pulls only");
  }
  const uint32_t want = req.with_state ? t->row_floats() : t->dim();
  if (req.value_dim != want) {
    return InvalidArgument(std::string(OpName(req.op)) + ": table '" + t->options().name +
                           "' has dim " + std::to_string(t->dim()) +
                           (req.with_state ? " (" + std::to_string(want) + " with state)" : "") +
                           ", request says " + std::to_string(req.value_dim));
  }
  return t;
}

Result<DenseTable*> ShardServer::DenseTableFor(const Header& req, uint64_t count) {
  if (req.table_id >= dense_.size()) {
    return NotFound(std::string(OpName(req.op)) + ": no table with id " +
                    std::to_string(req.table_id));
  }
  DenseTable* t = dense_[req.table_id].get();
  if (!t) {
    return InvalidArgument(std::string(OpName(req.op)) + ": table '" +
                           manifest_.tables[req.table_id].name + "' is sparse, not dense");
  }
  const SliceRange s = t->slice();
  if (req.offset > s.end || count > s.end - req.offset || req.offset < s.begin) {
    return InvalidArgument(std::string(OpName(req.op)) + ": elements [" +
                           std::to_string(req.offset) + ", +" + std::to_string(count) +
                           ") of table '" + t->options().name + "' are outside this shard's " +
                           "slice [" + std::to_string(s.begin) + ", " + std::to_string(s.end) +
                           ")");
  }
  return t;
}

Status ShardServer::HandlePullSparse(const Header& req, const PayloadView& p, Header* reply,
                                     std::vector<zmq::message_t>* payload) {
  PARASOL_ASSIGN_OR_RETURN(SparseTable * table, SparseTableFor(req));
  const uint64_t n = p.rows();
  const uint32_t dim = table->dim();
  const uint32_t out_floats = req.value_dim;  // dim, or dim + state with_state
  const size_t out_bytes = size_t{out_floats} * sizeof(float);
  // A reply is dim times larger than its keys: bound it like a request, before allocating.
  if (n > manifest_.server.max_request_bytes / out_bytes) {
    return ResourceExhausted("PullSparse: " + std::to_string(n) + " rows of " +
                             std::to_string(out_bytes) + " bytes would exceed the limit of " +
                             std::to_string(manifest_.server.max_request_bytes) +
                             " bytes (server.max_request_bytes)");
  }
  const FramePlan plan = PlanValueFrames(n, out_floats, manifest_.server.frame_bytes);
  std::vector<OwnedBuffer> buffers;
  buffers.reserve(plan.frames);
  for (uint32_t f = 0; f < plan.frames; ++f) {
    buffers.push_back(OwnedBuffer::Allocate(plan.RowsInFrame(f, n) * out_bytes));
  }
  const uint32_t clock = ShardClock();
  // Observers (tools, exports) read without creating rows: only the job's workers train them.
  // So do workers evaluating (read_only): a model is what training made it, and a row an
  // evaluation touched would be lost with a restart anyway.
  const bool create =
      table->admits_on_pull() && controller_.InJob(req.worker_id) && !req.read_only;
  // Once this shard has dropped the keys a change of the shard count moved away, it creates no
  // row for them: a pull of one (a worker redoing a step before the change) reads its initial
  // value and leaves nothing behind.
  const Placement* placed =
      create && ChangeClock() >= 0 && migration_.dropped >= ChangeClock() ? &PlacementAfter()
                                                                          : nullptr;
  const TableOptions& options = table->options();
  const Optimizer& opt = table->optimizer();
  SplitByEngine(p);
  PARASOL_RETURN_IF_ERROR(PrefaultKeys(*table, p));
  for (uint32_t e = 0; e < table->engines(); ++e) table->partition(e).SetWrite(PushWrite(req));
  ForEachOwnedKey(engines_, *table, engine_positions_, p, n * out_floats < kInlineFloats,
                  [&](SparseTable::Partition& part, uint32_t i, uint64_t key) {
                    const uint64_t f = i / plan.rows_per_frame;
                    float* dst = reinterpret_cast<float*>(
                        buffers[f].data() + (i - f * plan.rows_per_frame) * out_bytes);
                    const bool mine = !placed || placed->ShardOf(key) == rank_;
                    const float* row =
                        create && mine ? part.FindOrCreate(key, clock) : part.Find(key);
                    if (row) {
                      CopyFloats(dst, row, out_floats);
                      return;
                    }
                    // Not admitted yet: the initial value, and no row is created.
                    InitSparseRow(options.init, options.seed, key, std::span<float>(dst, dim));
                    if (req.with_state) opt.InitState(dst, opt.SparseState(dst, dim), dim);
                  });
  reply->key_count = n;
  reply->value_dim = out_floats;
  // Every update of the clocks before the slowest worker's is in these rows.
  const int64_t slowest = controller_.MinClock();
  reply->read_clock =
      slowest == std::numeric_limits<int64_t>::max() ? controller_.MaxClock() : slowest;
  reply->value_frames = plan.frames;
  reply->rows_per_frame = plan.rows_per_frame;
  for (auto& b : buffers) payload->push_back(std::move(b).ToMessage());
  counters_.rows_pulled += n;
  return Status::Ok();
}

Status ShardServer::HandlePushSparse(const Header& req, const PayloadView& p) {
  PARASOL_ASSIGN_OR_RETURN(SparseTable * table, SparseTableFor(req));
  const uint64_t n = p.rows();
  const uint32_t dim = table->dim();
  const uint32_t clock = ShardClock();
  const Optimizer& opt = table->optimizer();
  SplitByEngine(p);
  PARASOL_RETURN_IF_ERROR(PrefaultKeys(*table, p));
  for (uint32_t e = 0; e < table->engines(); ++e) table->partition(e).SetWrite(PushWrite(req));
  ForEachOwnedKey(engines_, *table, engine_positions_, p, n * dim < kInlineFloats,
                  [&](SparseTable::Partition& part, uint32_t i, uint64_t key) {
                    float* row = part.Find(key);
                    if (!row) row = part.CountPush(key, clock);
                    if (!row) return;  // counted towards admission only
                    opt.Apply(row, opt.SparseState(row, dim), p.Row(i), dim, 1.0);
                    SparseTable::Partition::LastClock(row) = clock;
                    part.Store(row);
                  });
  counters_.rows_pushed += n;
  return Status::Ok();
}

Status ShardServer::HandlePullDense(const Header& req, Header* reply,
                                    std::vector<zmq::message_t>* payload) {
  PARASOL_ASSIGN_OR_RETURN(DenseTable * table, DenseTableFor(req, req.key_count));
  const uint64_t n = req.key_count;
  const uint64_t local = req.offset - table->slice().begin;
  reply->key_count = n;
  reply->offset = req.offset;
  counters_.dense_elements_pulled += n;
  if (req.with_state) {
    // Rows of [value, state 0, state 1, ...] per element: a copy, for checks and exports.
    const uint32_t k = table->state_array_count();
    const uint32_t row = 1 + k;
    if (n > manifest_.server.max_request_bytes / (uint64_t{row} * sizeof(float))) {
      return ResourceExhausted("PullDense: " + std::to_string(n) + " elements with state would "
                               "exceed the limit of " +
                               std::to_string(manifest_.server.max_request_bytes) +
                               " bytes (server.max_request_bytes)");
    }
    const FramePlan plan = PlanValueFrames(n, row, manifest_.server.frame_bytes);
    for (uint32_t f = 0; f < plan.frames; ++f) {
      const uint64_t rows = plan.RowsInFrame(f, n);
      OwnedBuffer b = OwnedBuffer::Allocate(rows * row * sizeof(float));
      table->ReadWithState(local + uint64_t{f} * plan.rows_per_frame, rows, b.floats());
      payload->push_back(std::move(b).ToMessage());
    }
    reply->value_dim = row;
    reply->value_frames = plan.frames;
    reply->rows_per_frame = plan.rows_per_frame;
    return Status::Ok();
  }
  const FramePlan plan = PlanValueFrames(n, 1, manifest_.server.frame_bytes);
  std::shared_ptr<const float[]> values = table->Share();
  if (n < table->slice().size() || !values) {
    // A part (a chunk of a chunked pull) is copied: a shared reply keeps the whole slice
    // alive, and the next push (of the next chunk, right behind it) would copy all of it while
    // the reply waits to be sent. Copying the chunk costs its size once; that copy, the
    // slice's size per chunk. 16-bit values are widened into the copy.
    for (uint32_t f = 0; f < plan.frames; ++f) {
      const uint64_t rows = plan.RowsInFrame(f, n);
      OwnedBuffer b = OwnedBuffer::Allocate(rows * sizeof(float));
      table->ReadValues(local + uint64_t{f} * plan.rows_per_frame, rows, b.floats());
      payload->push_back(std::move(b).ToMessage());
    }
    reply->value_dim = 1;
    reply->value_frames = plan.frames;
    reply->rows_per_frame = plan.rows_per_frame;
    return Status::Ok();
  }
  const float* first = values.get() + local;
  // Zero-copy: every frame shares the table's current buffer until it has been sent.
  for (uint32_t f = 0; f < plan.frames; ++f) {
    payload->push_back(SharedMessage(values, first + uint64_t{f} * plan.rows_per_frame,
                                     plan.RowsInFrame(f, n) * sizeof(float)));
  }
  reply->value_dim = 1;
  reply->value_frames = plan.frames;
  reply->rows_per_frame = plan.rows_per_frame;
  return Status::Ok();
}

Status ShardServer::HandlePushDense(const Header& req, const PayloadView& p) {
  if (req.value_dim != 1) {
    return InvalidArgument("PushDense: value_dim must be 1, got " + std::to_string(req.value_dim));
  }
  if (req.with_state) return InvalidArgument("PushDense: with_state applies to pulls only");
  PARASOL_ASSIGN_OR_RETURN(DenseTable * table, DenseTableFor(req, p.rows()));
  PARASOL_RETURN_IF_ERROR(CheckDensePush(req, p.rows()));
  const uint32_t engines = engines_.size();
  const uint64_t local = req.offset - table->slice().begin;
  table->PrepareWrite(PushWrite(req));
  struct FrameRef {
    uint64_t first;
    const std::byte* data;
    uint64_t rows;
  };
  std::vector<FrameRef> frames;
  p.ForEachValueFrame([&](uint64_t first, const std::byte* data, uint64_t rows) {
    frames.push_back({first, data, rows});
  });
  // Engines take frames round-robin: disjoint element ranges, no locks.
  engines_.RunOnAll(
      [&](uint32_t e) {
        for (size_t f = e; f < frames.size(); f += engines) {
          table->Apply(local + frames[f].first, frames[f].data, frames[f].rows, 1.0);
        }
      },
      p.rows() < kInlineFloats || frames.size() < 2);
  counters_.dense_elements_pushed += p.rows();
  return Status::Ok();
}

Status ShardServer::AggregatePushSparse(const Header& req, const PayloadView& p,
                                        ClockAggregate& agg) {
  PARASOL_ASSIGN_OR_RETURN(SparseTable * table, SparseTableFor(req));
  const uint32_t dim = table->dim();
  SplitByEngine(p);
  ClockAggregate::Part& part = agg.PartOf(req.worker_id);
  engines_.RunOnAll(
      [&](uint32_t e) {
        part.ReserveSparse(req.table_id, e, engine_positions_[e].size(), dim);
        for (uint32_t i : engine_positions_[e]) {
          float* sum = part.SparseSum(req.table_id, e, p.Key(i), dim);
          const std::byte* g = p.Row(i);
          for (uint32_t d = 0; d < dim; ++d) sum[d] += LoadF32(g + d * sizeof(float));
        }
      },
      p.rows() * dim < kInlineFloats);
  counters_.rows_pushed += p.rows();
  return Status::Ok();
}

Status ShardServer::AggregatePushDense(const Header& req, const PayloadView& p,
                                       ClockAggregate& agg) {
  if (req.value_dim != 1) {
    return InvalidArgument("PushDense: value_dim must be 1, got " + std::to_string(req.value_dim));
  }
  PARASOL_ASSIGN_OR_RETURN(DenseTable * table, DenseTableFor(req, p.rows()));
  PARASOL_RETURN_IF_ERROR(CheckDensePush(req, p.rows()));
  float* sums = agg.PartOf(req.worker_id).DenseSum(req.table_id, table->slice().size()) +
                (req.offset - table->slice().begin);
  p.ForEachValueFrame([&](uint64_t first, const std::byte* data, uint64_t rows) {
    for (uint64_t i = 0; i < rows; ++i) sums[first + i] += LoadF32(data + i * sizeof(float));
  });
  counters_.dense_elements_pushed += p.rows();
  return Status::Ok();
}

void ShardServer::ApplySparseSums(uint32_t e, int64_t clock, const ClockAggregate& agg,
                                  DeferredApply* split, bool rest, double scale, uint32_t now,
                                  const std::atomic<bool>* stop) {
  const uint32_t engines = engines_.size();
  // Applies the sums at `count` positions among table t's keys on this engine (positions
  // null: the first `count`); with `until`, stops (checked every kStopEvery keys) once it is
  // set. Returns the keys applied.
  constexpr size_t kStopEvery = 64;
  auto apply = [&](size_t t, const uint32_t* positions, size_t count,
                   const std::atomic<bool>* until = nullptr) -> size_t {
    SparseTable& table = *sparse_[t];
    SparseTable::Partition& part = table.partition(e);
    part.SetWrite(ClockWrite(clock));
    const uint32_t dim = table.dim();
    const Optimizer& opt = table.optimizer();
    // The clock's keys in the order they were first pushed, and their sums.
    const std::span<const uint64_t> keys = agg.sums().SparseKeys(static_cast<uint32_t>(t), e);
    const float* sums = agg.sums().SparseSumsOf(static_cast<uint32_t>(t), e);
    auto at = [&](size_t j) -> size_t { return positions ? positions[j] : j; };
    if (part.tiered()) {
      if (Status st = part.Prefault(keys); !st.ok()) {
        // The clock's sums cannot be applied without the rows: the shard stops, and its
        // restart (from its checkpoint, with the workers' replays) redoes this clock.
        spdlog::critical("shard {}: cannot apply clock {} to table '{}': {}", rank_, clock,
                         table.options().name, st.ToString());
        spdlog::shutdown();
        std::_Exit(1);
      }
    }
    // With the index buckets and rows of the keys ahead prefetched.
    const size_t done = part.ForEachKeyAt(
        count, [&](size_t j) { return keys[at(j)]; },
        [&](size_t j, uint64_t key) -> bool {
          if (until && j % kStopEvery == 0 && until->load(std::memory_order_relaxed)) {
            return false;
          }
          float* row = part.Find(key);
          if (!row) row = part.CountPush(key, now);
          if (!row) return true;
          opt.Apply(row, opt.SparseState(row, dim),
                    reinterpret_cast<const std::byte*>(sums + at(j) * dim), dim, scale);
          SparseTable::Partition::LastClock(row) = now;
          part.Store(row);
          return true;
        });
    part.Settle();
    return done;
  };
  if (!split) {
    for (size_t t = 0; t < sparse_.size(); ++t) {
      if (!sparse_[t]) continue;
      const size_t n = agg.sums().SparseKeys(static_cast<uint32_t>(t), e).size();
      apply(t, nullptr, n);
      counters_.bsp_rows_before_reply += n;
    }
    return;
  }
  if (!rest) {
    // The first pass: the rows the pulls read (every row of a table that does not split);
    // the others' positions are kept for the second.
    std::vector<uint8_t> read;
    std::vector<uint32_t> now_rows;
    for (size_t t = 0; t < sparse_.size(); ++t) {
      if (!sparse_[t]) continue;
      const std::span<const uint64_t> keys = agg.sums().SparseKeys(static_cast<uint32_t>(t), e);
      if (!TableSplits(*sparse_[t])) {
        apply(t, nullptr, keys.size());
        counters_.bsp_rows_before_reply += keys.size();
        continue;
      }
      read.assign(keys.size(), 0);
      if (t < pull_keys_.size()) {
        for (uint64_t key : pull_keys_[t]) {
          if (EngineOfKey(key, engines) != e) continue;
          const uint32_t at = agg.sums().FindSparse(static_cast<uint32_t>(t), e, key);
          if (at != KeyIndex::kAbsent) read[at] = 1;
        }
      }
      now_rows.clear();
      std::vector<uint32_t>& later = split->rest[t][e];
      later.clear();
      for (uint32_t j = 0; j < keys.size(); ++j) (read[j] ? now_rows : later).push_back(j);
      apply(t, now_rows.data(), now_rows.size());
      counters_.bsp_rows_before_reply += now_rows.size();
    }
    return;
  }
  // The second pass, resumed where it stopped. It may stop every kStopEvery keys: few, as the
  // request thread waits for those under way at the background's idle priority. A table's
  // keys are one walk, so that the prefetches run ahead across those stops.
  DeferredApply::Progress& p = split->progress[e];
  for (; p.table < sparse_.size(); ++p.table, p.next = 0) {
    if (!sparse_[p.table]) continue;
    const std::vector<uint32_t>& later = split->rest[p.table][e];
    if (p.next >= later.size()) continue;
    const size_t left = later.size() - p.next;
    const size_t n = apply(p.table, later.data() + p.next, left, stop);
    counters_.bsp_rows_after_reply += n;
    p.next += n;
    if (n < left) return;  // stopped
  }
}

void ShardServer::ApplyAggregate(int64_t clock, ClockAggregate& agg, DeferredApply* split) {
  const auto start = env_->Now();
  // The average over the workers expected at this clock (live, and not finished before it).
  const double scale = 1.0 / std::max<uint32_t>(1, controller_.ActiveAt(clock));
  const uint32_t now = ShardClock();
  // The workers' sums folded in rank order: the same bits whatever order they arrived in.
  if (!agg.combined()) {
    agg.PrepareCombine();
    engines_.RunOnAll([&](uint32_t e) { agg.CombineOn(e); });
    agg.EndCombine();
  }
  if (split) {
    split->scale = scale;
    split->now = now;
    split->rest.assign(sparse_.size(), std::vector<std::vector<uint32_t>>(engines_.size()));
    split->progress.assign(engines_.size(), DeferredApply::Progress{});
  }
  // The dense sums are applied whole, with a split's first pass.
  std::vector<uint8_t> dense_pushed(dense_.size(), 0);
  // Per dense table, the local elements this shard held at the clock (while the table spans
  // two slices during a change of the shard count, the others are not this clock's).
  std::vector<SliceRange> dense_at(dense_.size());
  for (size_t t = 0; t < dense_.size(); ++t) {
    if (dense_[t] && agg.sums().DenseSumIfAny(static_cast<uint32_t>(t))) {
      dense_[t]->PrepareWrite(ClockWrite(clock));
      dense_pushed[t] = 1;
      const SliceRange at = DenseSliceAt(static_cast<uint32_t>(t), clock);
      const SliceRange held = dense_[t]->slice();
      const uint64_t first = std::min(std::max(at.begin, held.begin), held.end) - held.begin;
      const uint64_t last = std::max(std::min(at.end, held.end), held.begin) - held.begin;
      dense_at[t] = SliceRange{first, std::max(first, last)};
    }
  }
  const uint32_t engines = engines_.size();
  engines_.RunOnAll([&](uint32_t e) {
    ApplySparseSums(e, clock, agg, split, /*rest=*/false, scale, now);
    for (size_t t = 0; t < dense_.size(); ++t) {
      if (!dense_pushed[t]) continue;
      // Engine e updates its contiguous share.
      DenseTable& table = *dense_[t];
      const uint64_t first = dense_at[t].begin, n = dense_at[t].size();
      const uint64_t b = first + n * e / engines, end = first + n * (e + 1) / engines;
      const float* sums = agg.sums().DenseSumIfAny(static_cast<uint32_t>(t));
      table.Apply(b, reinterpret_cast<const std::byte*>(sums + b), end - b, scale);
    }
  });
  ++counters_.bsp_clocks_applied;
  counters_.seconds_applying_clocks +=
      std::max(0.0, std::chrono::duration<double>(env_->Now() - start).count());
  spdlog::debug("shard {}: applied the pushes of clock {}", rank_, clock);
}

bool ShardServer::TableSplits(const SparseTable& table) {
  return !table.evicts() && !table.partition(0).tiered();
}

bool ApplyAfterReply(const ServerOptions& options, size_t cores) {
  switch (options.apply_after_reply) {
    case ServerOptions::ApplyAfterReply::kAlways:
      return true;
    case ServerOptions::ApplyAfterReply::kNever:
      return false;
    case ServerOptions::ApplyAfterReply::kAuto:
      break;
  }
  return cores > options.engine_threads;
}

bool ShardServer::CanSplitApply() const {
  if (!apply_after_reply_) return false;
  for (const auto& t : sparse_) {
    if (t && TableSplits(*t)) return true;
  }
  return false;
}

void ShardServer::NotePullKeys(const Header& pull, std::span<zmq::message_t> payload) {
  if (pull.op != Op::PullSparse || pull.table_id >= sparse_.size()) return;
  // A pull that does not parse is refused when it is answered; it reads nothing.
  Result<PayloadView> view = PayloadView::Parse(pull, payload, manifest_.server.max_request_bytes);
  if (!view.ok() || !view->has_keys()) return;
  if (pull_keys_.size() < sparse_.size()) pull_keys_.resize(sparse_.size());
  std::vector<uint64_t>& keys = pull_keys_[pull.table_id];
  for (uint64_t i = 0; i < view->rows(); ++i) keys.push_back(view->Key(i));
}

void ShardServer::NoteHeldPullKeys() {
  for (HeldPull& h : held_pulls_) {
    const std::span<zmq::message_t> frames = std::span<zmq::message_t>(h.frames).subspan(2);
    if (h.request.op != Op::Step) {
      NotePullKeys(h.request, frames);
      continue;
    }
    Result<std::vector<StepPart>> parts = SplitStep(h.request, frames);
    if (!parts.ok()) continue;
    for (const StepPart& part : *parts) {
      NotePullKeys(part.header, frames.subspan(part.header_frame + 1, part.payload_frames));
    }
  }
}

void ShardServer::StartDeferredApply() {
  if (!deferred_apply_ || deferred_apply_->started) return;
  deferred_apply_->started = true;
  DeferredApply* d = &*deferred_apply_;
  engines_.StartBackground([this, d](uint32_t e, const std::atomic<bool>& stop) {
    ApplySparseSums(e, d->clock, *d->aggregate, d, /*rest=*/true, d->scale, d->now, &stop);
  });
}

void ShardServer::FinishDeferredApply() {
  if (!deferred_apply_) return;
  // The rest of a clock: the ticks' time, and applying clocks, whatever waits for it.
  ServingAs ticks(this, kServeTicks, &counters_.seconds_applying_clocks);
  if (deferred_apply_->started) {
    engines_.FinishBackground();
  } else {
    DeferredApply* d = &*deferred_apply_;
    engines_.RunOnAll([&](uint32_t e) {
      ApplySparseSums(e, d->clock, *d->aggregate, d, /*rest=*/true, d->scale, d->now);
    });
  }
  deferred_apply_->aggregate->Recycle();
  deferred_apply_.reset();
}

}  // namespace parasol
