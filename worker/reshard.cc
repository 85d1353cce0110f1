#include "worker/reshard.hpp"

#include <spdlog/spdlog.h>

#include <cstring>
#include <optional>
#include <vector>

#include "common/protocol.hpp"
#include "common/wire.hpp"

namespace parasol {
namespace {

// The client's environment's clock (the simulation's in tests/sim).
using SteadyClock = Env::Clock;

// Op.Migrate's steps (protocols/message.fbs).
constexpr uint64_t kExport = 1, kInstall = 2, kCommit = 3, kDrop = 4;

double Since(Env* env, SteadyClock::time_point t) {
  return std::chrono::duration<double>(env->Now() - t).count();
}

// Refusals that pass: the shard restarts, is behind, or has not heard of the change yet.
bool Transient(const Status& st) {
  return st.code() == StatusCode::kUnavailable || st.code() == StatusCode::kTimeout;
}

class Mover {
 public:
  Mover(PsClient& client, uint32_t servers, SteadyClock::time_point deadline)
      : client_(client), servers_(servers), deadline_(deadline) {}

  // One Migrate request, repeated while the refusal passes, until the deadline.
  // The change's clock (-1: a copy ahead of it, for `servers` shards).
  void set_clock(int64_t clock) { clock_ = clock; }
  // The newest barrier shard 0 released, for a shard that starts serving at a commit.
  void set_last_barrier(int64_t id) { last_barrier_ = id; }

  // An export page's request, sent now; Page() waits for it (and repeats it while the shard's
  // refusal passes).
  struct Pending {
    PsClient::Ticket ticket = 0;
    uint32_t shard = 0;
    uint32_t table = 0;
    uint64_t offset = 0;
    int64_t since = -1;
  };
  Pending StartExport(uint32_t shard, uint32_t table, uint64_t offset, int64_t since) {
    Header h = Request(table, 1, offset, 0, since, 1, 0);
    std::vector<zmq::message_t> payload;
    payload.emplace_back();
    return Pending{client_.CallAsync(shard, std::move(h), std::move(payload)), shard, table,
                   offset, since};
  }
  // A page no longer wanted (the copy failed): its reply is taken and dropped.
  void Abandon(const Pending& p) { (void)client_.Collect(p.ticket, p.shard); }
  Result<PsClient::Reply> Page(const Pending& p) {
    Result<PsClient::Reply> r = client_.Collect(p.ticket, p.shard);
    if (r.ok() || !Transient(r.status())) return r;
    return Call(p.shard, 1, p.table, p.offset, 0, nullptr, nullptr, 1, p.since);
  }

  Header Request(uint32_t table, uint64_t step, uint64_t offset, uint64_t known_epoch,
                 int64_t updated_since, uint32_t floats, uint64_t rows,
                 uint64_t read_at_rollback = 0) {
    Header h = client_.ToolRequest(Op::Migrate, table);
    h.clock = clock_;
    h.shard_count = servers_;
    h.worker_clock = updated_since;
    h.seq = step;
    h.offset = offset;
    h.known_epoch = known_epoch;
    h.value_dim = floats;
    h.key_count = rows;
    h.last_barrier = last_barrier_;
    SetMigrateReadAtRollback(h, read_at_rollback);
    return h;
  }

  Result<PsClient::Reply> Call(uint32_t shard, uint64_t step, uint32_t table, uint64_t offset,
                               uint64_t known_epoch = 0, const std::vector<uint64_t>* keys = nullptr,
                               const std::vector<float>* rows = nullptr, uint32_t floats = 1,
                               int64_t updated_since = -1, uint64_t read_at_rollback = 0) {
    for (int attempt = 0;; ++attempt) {
      const uint64_t n = keys ? keys->size() : 0;
      Header h = Request(table, step, offset, known_epoch, updated_since, floats, n,
                         read_at_rollback);
      std::vector<zmq::message_t> payload;
      payload.emplace_back(keys ? keys->data() : nullptr, n * sizeof(uint64_t));
      if (n > 0) {
        const FramePlan plan = PlanValueFrames(n, floats, 1u << 20);
        h.value_frames = plan.frames;
        h.rows_per_frame = plan.rows_per_frame;
        for (uint32_t f = 0; f < plan.frames; ++f) {
          payload.emplace_back(rows->data() + f * plan.rows_per_frame * floats,
                               plan.RowsInFrame(f, n) * floats * sizeof(float));
        }
      }
      Result<PsClient::Reply> r = client_.Call(shard, std::move(h), std::move(payload));
      if (r.ok() || !Transient(r.status()) || client_.env()->Now() > deadline_) {
        if (!r.ok()) {
          return r.status().WithContext("shard " + std::to_string(shard) +
                                        ", moving the rows for clock " + std::to_string(clock_));
        }
        return r;
      }
      if (attempt % 100 == 99) spdlog::info("scale: waiting for shard {}: {}", shard, r.status().ToString());
      PARASOL_RETURN_IF_ERROR(client_.Idle(std::chrono::milliseconds(20)));
    }
  }

 private:
  PsClient& client_;
  const uint32_t servers_;
  int64_t clock_ = -1;
  int64_t last_barrier_ = -1;
  const SteadyClock::time_point deadline_;
};

}  // namespace

std::string ReshardReport::ToString() const {
  char buf[480];
  std::snprintf(buf, sizeof(buf),
                "%u -> %u shards from clock %lld: %llu rows copied ahead in %.2f s (%.0f rows/s) "
                "while training went on, then %llu rows updated since and %llu dense elements "
                "in %.2f s from the change's naming to the last commit; %llu rows dropped by "
                "the old holders, %llu pass(es), %.2f s in all",
                from, to, static_cast<long long>(clock),
                static_cast<unsigned long long>(ahead_rows), ahead_seconds,
                ahead_seconds > 0 ? ahead_rows / ahead_seconds : 0.0,
                static_cast<unsigned long long>(rows_moved),
                static_cast<unsigned long long>(elements_moved), copy_seconds,
                static_cast<unsigned long long>(rows_dropped),
                static_cast<unsigned long long>(passes), total_seconds);
  return buf;
}

namespace {

// Where a copy stands: per table and source shard, the process read and the shard clock of its
// first page (rows updated since carry that clock or a later one); per target, the process that
// took rows.
struct CopyState {
  std::vector<std::vector<uint64_t>> source_epoch;   // [table][shard]
  std::vector<std::vector<int64_t>> source_clock;    // [table][shard]
  std::vector<uint64_t> target_epoch;                // [shard] (0: took none)
  bool target_restarted = false;
  // The job's rollback generation every page and install answer carried; `rolled_back`: they
  // did not all carry the same (or the one of the copy ahead), so the job rolled back while
  // they were copied, and targets dropped what was copied before (server/shard_checkpoint.cc,
  // SettleRollback): the copy stopped, to be made again in full.
  std::optional<uint64_t> rollback_gen;
  bool rolled_back = false;
  uint64_t rows = 0;
  uint64_t elements = 0;  // of dense tensors
};

// Notes the rollback generation a reply carries; false once the job rolled back during the copy
// (or since the copy ahead).
bool SameGeneration(const Header& reply, const CopyState* ahead_state, CopyState* state) {
  if (!state->rollback_gen) state->rollback_gen = reply.rollback_gen;
  if (*state->rollback_gen != reply.rollback_gen ||
      (ahead_state && ahead_state->rollback_gen && *ahead_state->rollback_gen != reply.rollback_gen)) {
    if (!state->rolled_back) {
      spdlog::info("scale: the job rolled back while its rows were copied; copying them all again");
    }
    state->rolled_back = true;
  }
  return !state->rolled_back;
}

// Copies every row of the sparse tables that `before` places on one shard and `after` on
// another, from its shard to its new one, and (`change`: in the change itself, not ahead of
// it) every element of the dense tensors alike. In the change, from a source whose process is
// the one `ahead_state` read, only the rows updated since.
Status CopyRows(Mover& mover, const Manifest& manifest, const Placement& before,
                const Placement& after, bool change, const CopyState* ahead_state,
                CopyState* state) {
  const uint32_t listed = static_cast<uint32_t>(manifest.cluster.servers.size());
  const size_t tables = manifest.tables.size();
  state->source_epoch.assign(tables, std::vector<uint64_t>(listed, 0));
  state->source_clock.assign(tables, std::vector<int64_t>(listed, -1));
  if (state->target_epoch.empty()) state->target_epoch.assign(listed, 0);
  for (uint32_t t = 0; t < tables; ++t) {
    // A dense page's keys are its elements' indices.
    const bool dense = manifest.tables[t].kind == TableKind::kDense;
    if (dense && !change) continue;
    const uint64_t elements = manifest.tables[t].NumElements();
    for (uint32_t s = 0; s < before.count(); ++s) {
      int64_t since = -1;
      if (ahead_state) since = ahead_state->source_clock[t][s];
      uint64_t cursor = 0;
      bool first = true;
      // The next page is read while this one's rows are installed.
      // (A flag beside a plain Pending rather than an optional: GCC 12 takes the optional's
      // fields for uninitialized.)
      Mover::Pending next;
      bool reading_ahead = false;
      while (true) {
        Result<PsClient::Reply> got =
            reading_ahead ? mover.Page(next)
                 : mover.Call(s, kExport, t, cursor, 0, nullptr, nullptr, 1, since);
        reading_ahead = false;
        if (!got.ok()) {
          return got.status().WithContext("shard " + std::to_string(s) +
                                          ", reading the rows that move");
        }
        PsClient::Reply page = std::move(*got);
        const uint64_t epoch = page.header.server_epoch;
        if (!SameGeneration(page.header, ahead_state, state)) {
          return Status::Ok();
        }
        // Another process than the one read ahead, or than the one this copy began with: read
        // it all, from the start.
        const bool other_ahead = first && ahead_state && since >= 0 &&
                                 ahead_state->source_epoch[t][s] != epoch;
        const bool other_now = !first && state->source_epoch[t][s] != epoch;
        if (other_ahead || other_now) {
          spdlog::info("scale: shard {} restarted while its rows were copied; reading them all",
                       s);
          since = -1;
          cursor = 0;
          first = true;
          state->source_epoch[t][s] = 0;
          continue;
        }
        if (first) {
          state->source_epoch[t][s] = epoch;
          state->source_clock[t][s] = page.header.worker_clock;
          first = false;
        }
        const uint64_t n = page.header.key_count;
        const uint32_t floats = page.header.value_dim;
        if (page.frames.empty() || page.frames[0].size() != n * sizeof(uint64_t)) {
          return BadMessage("shard " + std::to_string(s) + ": an export page of " +
                            std::to_string(n) + " rows without its keys");
        }
        // The page's rows by the shard that holds them after the change.
        std::vector<std::vector<uint64_t>> keys(listed);
        std::vector<std::vector<float>> rows(listed);
        const auto* k = page.frames[0].data<uint64_t>();
        uint64_t row = 0;
        for (size_t f = 1; f < page.frames.size(); ++f) {
          const float* v = page.frames[f].data<float>();
          const uint64_t in_frame = page.frames[f].size() / (sizeof(float) * floats);
          for (uint64_t i = 0; i < in_frame && row < n; ++i, ++row) {
            uint64_t key;
            std::memcpy(&key, k + row, sizeof(key));
            if (dense && key >= elements) {
              return BadMessage("shard " + std::to_string(s) + ": element " +
                                std::to_string(key) + " of a tensor of " +
                                std::to_string(elements));
            }
            const uint32_t d = dense ? after.DenseShardOf(elements, key) : after.ShardOf(key);
            if (d >= listed) return BadMessage("a key placed beyond the listed shards");
            keys[d].push_back(key);
            rows[d].insert(rows[d].end(), v + i * floats, v + (i + 1) * floats);
          }
        }
        if (row != n) {
          return BadMessage("shard " + std::to_string(s) + ": an export page of " +
                            std::to_string(n) + " rows carried " + std::to_string(row));
        }
        if (!page.header.done) {
          next = mover.StartExport(s, t, page.header.offset, since);
          reading_ahead = true;
          page.frames.clear();  // copied out above
        }
        for (uint32_t d = 0; d < listed; ++d) {
          if (keys[d].empty()) continue;
          Result<PsClient::Reply> installed = mover.Call(
              d, kInstall, t, 0, 0, &keys[d], &rows[d], floats, -1, page.header.rollback_gen);
          if (!installed.ok() && installed.status().code() == StatusCode::kAborted &&
              !state->rolled_back) {
            // The target is at another generation than the source.
            spdlog::info("scale: the job rolled back while its rows were copied; copying them "
                         "all again");
            state->rolled_back = true;
          }
          if (!installed.ok() || !SameGeneration(installed->header, ahead_state, state)) {
            if (reading_ahead) mover.Abandon(next);
            if (state->rolled_back) return Status::Ok();
            return installed.status();
          }
          const PsClient::Reply& ack = *installed;
          if (ack.header.duplicate) continue;  // committed already
          uint64_t& target = state->target_epoch[d];
          if (target != 0 && target != ack.header.server_epoch) state->target_restarted = true;
          target = ack.header.server_epoch;
          (dense ? state->elements : state->rows) += keys[d].size();
        }
        if (page.header.done) break;
        cursor = page.header.offset;
      }
    }
  }
  return Status::Ok();
}

}  // namespace

Result<ReshardReport> Reshard(PsClient& client, uint32_t servers,
                              std::chrono::milliseconds timeout) {
  Env* const env = client.env();
  const auto start = env->Now();
  const auto deadline = start + timeout;
  ReshardReport report;
  const Manifest& manifest = client.manifest();
  Mover mover(client, servers, deadline);
  PARASOL_RETURN_IF_ERROR(client.SyncMembership());
  const Membership& m = client.membership();

  // Ahead of the change, while training goes on: every row that moves, as it is now. Only for
  // tables that evict nothing (a row evicted after its copy would stay on its new shard), and
  // not when a change is under way (the tool resumes it).
  bool evicts = false;
  for (const TableOptions& t : manifest.tables) {
    evicts = evicts || (t.kind == TableKind::kSparse &&
                        (t.eviction.ttl_clocks > 0 || t.eviction.max_rows > 0));
  }
  const auto& changes = m.server_changes();
  const bool resuming = !changes.empty() && m.LastPlacement().count() == servers;
  CopyState ahead;
  bool copied_ahead = false;
  Placement ahead_from;  // the placement the copy ahead moved rows from
  if (!evicts && !resuming && servers != m.LastPlacement().count()) {
    const auto t0 = env->Now();
    const Placement before = m.LastPlacement();
    ahead_from = before;
    Status st = CopyRows(mover, manifest, before, before.Resized(servers), /*change=*/false,
                         nullptr, &ahead);
    if (!st.ok()) return st.WithContext("copying the rows ahead of the change");
    copied_ahead = !ahead.target_restarted && !ahead.rolled_back;
    report.ahead_rows = ahead.rows;
    report.ahead_seconds = Since(env, t0);
  }

  Result<int64_t> clock = client.ScaleServers(servers);
  while (!clock.ok() && Transient(clock.status()) && env->Now() < deadline) {
    PARASOL_RETURN_IF_ERROR(client.Idle(std::chrono::milliseconds(100)));
    clock = client.ScaleServers(servers);
  }
  if (!clock.ok()) return clock.status();
  report.clock = *clock;
  const Placement before = m.PlacementAt(report.clock - 1);
  const Placement after = m.PlacementAt(report.clock);
  report.from = before.count();
  report.to = after.count();
  if (report.to != servers) {
    return FailedPrecondition("shard 0 answered a change to " + std::to_string(report.to) +
                              " shards, not " + std::to_string(servers));
  }
  spdlog::info("scale: {} -> {} shards from clock {}", report.from, report.to, report.clock);
  // The shards either placement has; the others hold nothing and need not run.
  const uint32_t involved = std::max(report.from, report.to);
  mover.set_clock(report.clock);
  // Another change named meanwhile (by another tool): what was copied ahead is not this one's.
  if (copied_ahead && !(ahead_from == before)) copied_ahead = false;

  const auto named = env->Now();
  while (true) {
    ++report.passes;
    CopyState state;
    if (copied_ahead) state.target_epoch = ahead.target_epoch;
    PARASOL_RETURN_IF_ERROR(
        CopyRows(mover, manifest, before, after, /*change=*/true, copied_ahead ? &ahead : nullptr,
                 &state));
    bool again = state.target_restarted || state.rolled_back;
    // Commit: every shard of either placement, each to the process that took its rows; shard 0
    // first, whose answer says which workers have left the job and when (a shard that starts
    // serving takes them with the workers' clocks).
    std::vector<uint64_t> left_ranks;
    std::vector<float> left_clocks;
    for (uint32_t s = 0; s < involved && !again; ++s) {
      const uint64_t epoch = state.target_epoch[s] ? state.target_epoch[s] : client.shard_epoch(s);
      Result<PsClient::Reply> ack =
          mover.Call(s, kCommit, 0, 0, epoch, &left_ranks, &left_clocks, 2);
      if (!ack.ok() && ack.status().code() == StatusCode::kFailedPrecondition &&
          state.target_epoch[s] != 0 && client.shard_epoch(s) != state.target_epoch[s]) {
        spdlog::info("scale: shard {} restarted before it committed its rows; copying again", s);
        again = true;
        break;
      }
      if (!ack.ok()) return ack.status();
      if (s == 0) {
        const PsClient::Reply& r = *ack;
        const uint64_t n = r.header.key_count;
        if (r.header.value_dim != 2 || r.frames.empty() ||
            r.frames[0].size() != n * sizeof(uint64_t)) {
          return BadMessage("shard 0: a commit's answer without the ranks that left");
        }
        left_ranks.assign(r.frames[0].data<uint64_t>(), r.frames[0].data<uint64_t>() + n);
        left_clocks.clear();
        for (size_t f = 1; f < r.frames.size(); ++f) {
          const float* v = r.frames[f].data<float>();
          left_clocks.insert(left_clocks.end(), v, v + r.frames[f].size() / sizeof(float));
        }
        if (left_clocks.size() != 2 * n) {
          return BadMessage("shard 0: a commit's answer of " + std::to_string(n) +
                            " ranks carried " + std::to_string(left_clocks.size()) + " words");
        }
        mover.set_last_barrier(r.header.last_barrier);
      }
    }
    report.rows_moved = state.rows;
    report.elements_moved = state.elements;
    if (!again) break;
    copied_ahead = false;  // a target lost what was copied ahead: all of it again
    if (env->Now() > deadline) {
      return Timeout("scale: shards kept restarting while the rows were copied");
    }
  }
  report.copy_seconds = Since(env, named);
  // Every shard: one that lost no rows drops none, and marks the change finished. Shard 0
  // last: it names the next change only once its own drop is done.
  for (uint32_t s = involved; s-- > 0;) {
    PARASOL_ASSIGN_OR_RETURN(PsClient::Reply ack, mover.Call(s, kDrop, 0, 0));
    if (!ack.header.duplicate) report.rows_dropped += ack.header.offset;
  }
  report.total_seconds = Since(env, start);
  return report;
}

}  // namespace parasol
