// ShardServer: changes of the job's shard count (`parasol scale --servers`; see Op.Migrate in
// protocols/message.fbs and MigrationState in server/shard_state.hpp).
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "common/protocol.hpp"
#include "common/sharding.hpp"
#include "server/shard_server.hpp"

namespace parasol {
namespace {

// Op.Migrate's steps (the request's `seq`).
enum MigrateStep : uint64_t { kExport = 1, kInstall = 2, kCommit = 3, kDrop = 4 };

// An export cursor: the engine in the top 16 bits, the slot within it below.
constexpr int kCursorShift = 48;

}  // namespace

Status ShardServer::CheckInstallGeneration(const Header& req) const {
  if (MigrateReadAtRollback(req) == rollback_gen_) return Status::Ok();
  return Aborted("Migrate: rows read at rollback " + std::to_string(MigrateReadAtRollback(req)) +
                 ", and this shard is at rollback " + std::to_string(rollback_gen_) +
                 ": the job rolled back between their reading and their install; read them "
                 "again");
}

int64_t ShardServer::ChangeClock() const {
  const auto& changes = membership_.server_changes();
  return changes.empty() ? -1 : changes.back().clock;
}

const Placement& ShardServer::LivePlacement() const {
  return parasol::LivePlacement(membership_, migration_);
}

const Placement& ShardServer::PlacementBefore() const {
  const int64_t c = ChangeClock();
  return membership_.PlacementAt(c < 0 ? 0 : c - 1);
}

bool ShardServer::GainsRows() const {
  if (ChangeClock() < 0) return false;
  const Placement& before = PlacementBefore();
  const Placement& after = PlacementAfter();
  // A range of `after` held here that `before` holds elsewhere, anywhere in it: compare at
  // every boundary of either placement.
  std::vector<uint64_t> points;
  for (size_t i = 0; i < before.ranges(); ++i) points.push_back(before.begin(i));
  for (size_t i = 0; i < after.ranges(); ++i) points.push_back(after.begin(i));
  for (uint64_t h : points) {
    if (after.ShardOfHash(h) == rank_ && before.ShardOfHash(h) != rank_) return true;
  }
  for (const TableOptions& t : manifest_.tables) {
    if (t.kind != TableKind::kDense) continue;
    const SliceRange was = before.DenseSliceOf(t.NumElements(), rank_);
    const SliceRange now = after.DenseSliceOf(t.NumElements(), rank_);
    if (now.size() > 0 && !was.Contains(now.begin, now.end)) return true;
  }
  return false;
}

SliceRange ShardServer::DenseSliceAt(uint32_t table, int64_t clock) const {
  return membership_.PlacementAt(clock).DenseSliceOf(manifest_.tables[table].NumElements(), rank_);
}

Status ShardServer::CheckDensePush(const Header& req, uint64_t count) const {
  const SliceRange s = DenseSliceAt(req.table_id, req.clock);
  if (!s.Contains(req.offset, req.offset + count) || req.offset + count < req.offset) {
    return InvalidArgument("PushDense: elements [" + std::to_string(req.offset) + ", +" +
                           std::to_string(count) + ") of table '" +
                           manifest_.tables[req.table_id].name + "' at clock " +
                           std::to_string(req.clock) + " are outside this shard's slice [" +
                           std::to_string(s.begin) + ", " + std::to_string(s.end) +
                           ") at that clock");
  }
  return Status::Ok();
}

void ShardServer::ResliceDense(uint32_t table, SliceRange slice) {
  const SliceRange was = dense_[table]->slice();
  if (was.begin == slice.begin && was.end == slice.end) return;
  dense_[table] = dense_[table]->Resliced(slice);
  for (auto& [clock, agg] : aggregates_) agg->ResliceDense(table, was, slice);
}

bool ShardServer::ReadAllowed(uint32_t worker, int64_t clock, uint64_t known) const {
  if (!controller_.PullAllowed(clock)) return false;
  // A shard restarted from an older checkpoint may lack a change its workers route by: until
  // their replays (whose ticks carry the membership) have reached it, a pull sent by one that
  // knew more waits.
  if (known > membership_.version() && controller_.ReplayOwed()) return false;
  const int64_t change = ChangeClock();
  if (change < 0 || migration_.installed >= change || !gains_rows_) return true;
  return clock < change && !controller_.IsDone(worker);
}

void ShardServer::SettleUninvolved() {
  const int64_t change = ChangeClock();
  if (change < 0 || rank_ < PlacementBefore().count() || rank_ < PlacementAfter().count()) return;
  // Outside both placements: nothing of this change is here to install or drop.
  migration_.installed = std::max(migration_.installed, change);
  migration_.dropped = std::max(migration_.dropped, change);
}

bool ShardServer::ChangeClockReached() const {
  const int64_t change = ChangeClock();
  // A shard that serves nothing after committing the change takes no more pushes before it.
  if (change >= 0 && !Entered() && migration_.installed >= change) return true;
  return change >= 0 && !controller_.ReplayOwed() && controller_.MinClock() >= change;
}

Status ShardServer::ChangeClockNotReached(int64_t change) const {
  std::string m = "Migrate: shard " + std::to_string(rank_) +
                  " has not applied every push before clock " + std::to_string(change) + " yet";
  if (!lost_updates_of_.empty()) {
    std::string workers;
    for (uint32_t w : lost_updates_of_) workers += (workers.empty() ? "" : ", ") + std::to_string(w);
    m += "; it lost pushes of worker" + std::string(lost_updates_of_.size() > 1 ? "s " : " ") +
         workers + " (restarted before their replays to it ended: two failures overlapped), " +
         "which will not come, and a rollback across a change of the shard count is not " +
         "supported";
  }
  return Unavailable(m);
}

bool ShardServer::KeepsKey(uint64_t key) const {
  const int64_t change = ChangeClock();
  const uint64_t h = HashKey(key, kShardSalt);
  // Rows copied ahead of a change not named yet are not this shard's.
  if (change < 0) return PlacementAfter().ShardOfHash(h) == rank_;
  if (PlacementBefore().ShardOfHash(h) == rank_ && migration_.dropped < change) return true;
  return PlacementAfter().ShardOfHash(h) == rank_ &&
         (migration_.installed >= change || !gains_rows_);
}

Status ShardServer::NameServerChange(uint32_t count, int64_t at, Header* reply) {
  const auto& changes = membership_.server_changes();
  const uint32_t now = membership_.LastPlacement().count();
  if (count == now && !changes.empty()) {
    // Asked again (a tool that resumes, or one whose first ask found the clock not kept yet).
    if (named_unkept_) {
      PARASOL_RETURN_IF_ERROR(KeepNamedClocks("the change to " + std::to_string(count) +
                                              " shards at clock " +
                                              std::to_string(changes.back().clock)));
    }
    reply->worker_clock = changes.back().clock;
    reply->shard_count = count;
    return Status::Ok();
  }
  if (count == now) {
    return FailedPrecondition("the job has " + std::to_string(count) + " shards already");
  }
  // One change at a time: the one before must be over everywhere (its rows dropped here too).
  if (!changes.empty() && migration_.dropped < changes.back().clock) {
    return FailedPrecondition("the change to " + std::to_string(now) + " shards at clock " +
                              std::to_string(changes.back().clock) +
                              " is not finished; run `parasol scale --servers " +
                              std::to_string(now) + "` to finish it first");
  }
  for (const auto& t : manifest_.tables) {
    if (t.kind == TableKind::kSparse && t.storage == TableOptions::Storage::kTiered) {
      return FailedPrecondition("table '" + t.name + "' is tiered; its rows on disk cannot move "
                                "between shards, so the job's shard count cannot change");
    }
  }
  PARASOL_RETURN_IF_ERROR(membership_.SetServers(at, count));
  gains_rows_ = GainsRows();
  // A named clock never changes: kept before it is answered (the workers learn it from shard
  // 0's replies, so a restart before they have would lose it), as a join's is.
  PARASOL_RETURN_IF_ERROR(KeepNamedClocks("the change to " + std::to_string(count) +
                                          " shards at clock " + std::to_string(at)));
  spdlog::info("shard 0: the job has {} shards from clock {} (it had {})", count, at, now);
  reply->worker_clock = at;
  reply->shard_count = count;
  return Status::Ok();
}

Status ShardServer::HandleMigrate(const Header& req, const PayloadView& p, Header* reply,
                                  std::vector<zmq::message_t>* payload) {
  if (controller_.InJob(req.worker_id)) {
    return FailedPrecondition("Migrate: a tool's request (`parasol scale --servers`); worker " +
                              std::to_string(req.worker_id) + " is in the job");
  }
  const int64_t change = ChangeClock();
  if (req.clock < 0) {
    // A copy ahead of a change not named yet (to req.shard_count shards): the rows as they are
    // now, for the shards that will hold them; the change's copy then sends only those updated
    // since. Nothing here depends on it until the change is named.
    const uint32_t listed = static_cast<uint32_t>(manifest_.cluster.servers.size());
    const Placement& now = membership_.LastPlacement();
    if (listed > kMaxReshardServers) {
      return FailedPrecondition("Migrate: the job lists " + std::to_string(listed) +
                                " shards; one whose shard count changes lists at most " +
                                std::to_string(kMaxReshardServers));
    }
    if (req.shard_count < 1 || req.shard_count > listed || req.shard_count == now.count()) {
      return InvalidArgument("Migrate: a copy ahead of a change to " +
                             std::to_string(req.shard_count) + " shards (the job has " +
                             std::to_string(now.count()) + ", of " + std::to_string(listed) +
                             " listed)");
    }
    if (change >= 0 && migration_.dropped < change) {
      return FailedPrecondition("Migrate: the change of the shard count at clock " +
                                std::to_string(change) + " is not finished here");
    }
    const Placement after = now.Resized(req.shard_count);
    if (req.table_id < dense_.size() && dense_[req.table_id]) {
      return FailedPrecondition("Migrate: dense table '" + manifest_.tables[req.table_id].name +
                                "' moves in the change itself, not ahead of it");
    }
    if (req.seq == kExport) return ExportRows(req, now, after, -1, reply, payload);
    if (req.seq != kInstall) {
      return BadMessage("Migrate: a copy ahead of a change exports or installs (step " +
                        std::to_string(req.seq) + ")");
    }
    reply->value_dim = 1;
    payload->emplace_back();
    PARASOL_RETURN_IF_ERROR(CheckInstallGeneration(req));
    staged_rows_ = true;
    return InstallRows(req, p, now, after, reply);
  }
  if (req.clock > change && req.clock <= kMaxMemberClock) {
    // Named by shard 0; this shard learns it from the workers' next requests.
    return Unavailable("Migrate: shard " + std::to_string(rank_) + " has not heard of the " +
                       "change of the shard count at clock " + std::to_string(req.clock) + " yet");
  }
  if (change < 0 || req.clock != change) {
    return FailedPrecondition("Migrate: the newest change of the shard count here is at clock " +
                              std::to_string(change) + ", not " + std::to_string(req.clock) +
                              " (ask shard 0 for it first; this shard learns it from the "
                              "workers' ticks)");
  }
  reply->clock = change;
  if (req.seq == kExport) {
    if (!ChangeClockReached()) return ChangeClockNotReached(change);
    if (req.table_id < dense_.size() && dense_[req.table_id]) {
      return ExportDense(req, reply, payload);
    }
    // req.worker_clock: only the rows updated at that shard clock or later (the rest were
    // copied ahead).
    return ExportRows(req, PlacementBefore(), PlacementAfter(), req.worker_clock, reply, payload);
  }
  if (req.seq == kCommit) return Commit(req, p, reply, payload);
  // The other steps answer with no rows (an empty keys frame), and a count in `offset`.
  reply->value_dim = 1;
  payload->emplace_back();
  return MigrateStepAnswer(req, p, reply);
}

namespace {

// A commit's rows: a rank that left the job (key) and the clock it left at, or kLostRank for
// one lost (an i64 in the row's two f32 words).
constexpr uint32_t kLeftRowFloats = 2;

}  // namespace

Status ShardServer::Commit(const Header& req, const PayloadView& p, Header* reply,
                           std::vector<zmq::message_t>* payload) {
  const int64_t change = ChangeClock();
  // The request: the ranks that left the job and when, as shard 0 knows them (for a shard that
  // starts serving here, no worker having ticked it).
  std::vector<int64_t> left(membership_.max_ranks(), -1);
  if (p.rows() > 0 && p.dim() != kLeftRowFloats) {
    return InvalidArgument("Migrate: a commit's rows are a rank and the clock it left at (" +
                           std::to_string(kLeftRowFloats) + " floats), not " +
                           std::to_string(p.dim()) + " floats");
  }
  for (uint64_t i = 0; i < p.rows(); ++i) {
    int64_t at = 0;
    std::memcpy(&at, p.Row(i), sizeof(at));
    if (p.Key(i) >= left.size() || (at < 0 && at != ConsistencyController::kLostRank) ||
        at > kMaxMemberClock) {
      return InvalidArgument("Migrate: commit row " + std::to_string(i) + " says rank " +
                             std::to_string(p.Key(i)) + " left at clock " + std::to_string(at) +
                             ", out of range");
    }
    left[p.Key(i)] = at;
  }
  if (migration_.installed >= change) {
    reply->duplicate = true;
  } else if (gains_rows_ && req.known_epoch != epoch_) {
    // The rows were installed in one process: a restarted one lacks them.
    return FailedPrecondition("Migrate: shard " + std::to_string(rank_) + " restarted after "
                              "the rows it gains at clock " + std::to_string(change) +
                              " were installed; install them again");
  } else {
    PARASOL_RETURN_IF_ERROR(CheckDenseInstalled());
    const bool entered = Entered();
    const int64_t was = migration_.installed;
    migration_.installed = change;
    if (!entered && Entered()) {
      // Serving from the change's clock: every worker is there (every push before it is
      // applied on the shards that served it), or left before.
      controller_.Enter(change, left, env_->Now());
      if (req.last_barrier > controller_.last_barrier()) {
        controller_.set_last_barrier(req.last_barrier);
      }
      spdlog::info("shard {}: serves the job from clock {}", rank_, change);
    }
    // What this shard gained is only here until a checkpoint holds it: the old holders drop
    // their copies once every shard has committed.
    if (!manifest_.checkpoint.dir.empty()) {
      if (Status saved = SaveCheckpoint("rows gained at clock " + std::to_string(change));
          !saved.ok()) {
        migration_.installed = was;
        return saved.WithContext("committing the rows gained at clock " + std::to_string(change));
      }
    }
    spdlog::info("shard {}: holds its keys of the {}-shard placement from clock {}", rank_,
                 PlacementAfter().count(), change);
    AfterClockChange();
  }
  // The answer: the ranks that left or were lost, as this shard knows them, and its newest
  // barrier.
  std::vector<uint64_t> keys;
  std::vector<float> rows;
  for (uint32_t w = 0; w < membership_.max_ranks(); ++w) {
    const int64_t at = controller_.IsLost(w) ? ConsistencyController::kLostRank
                                             : controller_.DoneAt(w);
    if (at < 0 && at != ConsistencyController::kLostRank) continue;
    keys.push_back(w);
    float words[kLeftRowFloats];
    std::memcpy(words, &at, sizeof(at));
    rows.insert(rows.end(), words, words + kLeftRowFloats);
  }
  AnswerPage(req, keys, rows, kLeftRowFloats, reply, payload);
  reply->last_barrier = controller_.last_barrier();
  return Status::Ok();
}

Status ShardServer::MigrateStepAnswer(const Header& req, const PayloadView& p, Header* reply) {
  const int64_t change = ChangeClock();
  switch (req.seq) {
    case kInstall:
      if (migration_.installed >= change) {
        reply->duplicate = true;  // committed already: what it holds has moved on since
        return Status::Ok();
      }
      PARASOL_RETURN_IF_ERROR(CheckInstallGeneration(req));
      if (req.table_id < dense_.size() && dense_[req.table_id]) {
        return InstallDense(req, p, reply);
      }
      return InstallRows(req, p, PlacementBefore(), PlacementAfter(), reply);
    case kDrop: {
      if (migration_.dropped >= change) {
        reply->duplicate = true;
        return Status::Ok();
      }
      if (!ChangeClockReached()) return ChangeClockNotReached(change);
      uint64_t dropped = 0;
      const Placement& after = PlacementAfter();
      for (auto& table : sparse_) {
        if (!table) continue;
        for (uint32_t e = 0; e < table->engines(); ++e) {
          dropped += table->partition(e).EraseRowsIf(
              [&](uint64_t key) { return after.ShardOf(key) != rank_; });
        }
      }
      for (uint32_t t = 0; t < dense_.size(); ++t) {
        if (dense_[t]) ResliceDense(t, after.DenseSliceOf(dense_[t]->total_elements(), rank_));
      }
      migration_.dropped = change;
      if (!manifest_.checkpoint.dir.empty()) {
        // The chain after the change starts here (once a background checkpoint that would
        // say otherwise is written).
        WaitForBackgroundCheckpoint();
        force_full_ = true;
        PARASOL_RETURN_IF_ERROR(
            SaveCheckpoint("rows moved at clock " + std::to_string(change) + " dropped"));
      }
      spdlog::info("shard {}: dropped {} rows that other shards hold from clock {}", rank_,
                   dropped, change);
      reply->offset = dropped;
      return Status::Ok();
    }
    default:
      return BadMessage("Migrate: unknown step " + std::to_string(req.seq));
  }
}

Result<SparseTable*> ShardServer::MovableTable(uint32_t id) {
  if (id >= sparse_.size() || !sparse_[id]) {
    return InvalidArgument("Migrate: table " + std::to_string(id) +
                           " is not a sparse table of this job");
  }
  if (sparse_[id]->tiered()) {
    return FailedPrecondition("Migrate: table '" + sparse_[id]->options().name +
                              "' is tiered; its rows on disk cannot move between shards");
  }
  return sparse_[id].get();
}

Status ShardServer::ExportRows(const Header& req, const Placement& before,
                               const Placement& after, int64_t updated_since, Header* reply,
                               std::vector<zmq::message_t>* payload) {
  PARASOL_ASSIGN_OR_RETURN(SparseTable * moving, MovableTable(req.table_id));
  SparseTable& table = *moving;
  const uint32_t engine = static_cast<uint32_t>(req.offset >> kCursorShift);
  const uint64_t from = req.offset & ((uint64_t{1} << kCursorShift) - 1);
  if (engine > table.engines() || from > std::numeric_limits<uint32_t>::max()) {
    return InvalidArgument("Migrate: export cursor " + std::to_string(req.offset) +
                           " is out of range");
  }
  const uint32_t floats = table.engines() > 0 ? table.partition(0).stored_floats() : 0;
  // Rows keep the shard clock of their last update only in tables that store it.
  const bool since = updated_since >= 0 && table.partition(0).stores_clock();
  const uint32_t threshold = static_cast<uint32_t>(
      std::clamp<int64_t>(updated_since, 0, std::numeric_limits<uint32_t>::max()));
  // A page: about 2 MiB of rows, so that the training's requests between pages wait little.
  const uint64_t max_rows =
      std::max<uint64_t>(1, (2u << 20) / (sizeof(uint64_t) + sizeof(float) * uint64_t{floats}));
  std::vector<uint64_t> keys;
  std::vector<float> rows;
  uint32_t e = engine;
  uint64_t slot = from;
  for (; e < table.engines(); ++e, slot = 0) {
    const SparseTable::Partition& part = table.partition(e);
    slot = part.ForEachRowFromSlot(static_cast<uint32_t>(slot), [&](uint64_t key,
                                                                    const float* row) {
      if (keys.size() >= max_rows) return false;
      const uint64_t h = HashKey(key, kShardSalt);
      if (before.ShardOfHash(h) == rank_ && after.ShardOfHash(h) != rank_) {
        keys.push_back(key);
        rows.insert(rows.end(), row, row + floats);
      }
      return true;
    }, since ? threshold : 0);
    if (slot < part.slot_end()) break;  // the page is full
  }
  const bool complete = e >= table.engines();
  reply->offset = complete ? 0 : (uint64_t{e} << kCursorShift) | slot;
  reply->done = complete;
  AnswerPage(req, keys, rows, floats, reply, payload);
  return Status::Ok();
}

void ShardServer::AnswerPage(const Header& req, const std::vector<uint64_t>& keys,
                             const std::vector<float>& rows, uint32_t floats, Header* reply,
                             std::vector<zmq::message_t>* payload) const {
  reply->table_id = req.table_id;
  // Every row updated after this page was read is stamped with this clock or a later one.
  reply->worker_clock = ShardClock();
  reply->key_count = keys.size();
  reply->value_dim = floats;
  const FramePlan plan = PlanValueFrames(keys.size(), floats, manifest_.server.frame_bytes);
  reply->value_frames = plan.frames;
  reply->rows_per_frame = plan.rows_per_frame;
  payload->emplace_back(keys.data(), keys.size() * sizeof(uint64_t));
  for (uint32_t f = 0; f < plan.frames; ++f) {
    const uint64_t first = f * plan.rows_per_frame;
    payload->emplace_back(rows.data() + first * floats,
                          plan.RowsInFrame(f, keys.size()) * floats * sizeof(float));
  }
}

namespace {

// The elements of `was` not in `now`: at most two ranges, the one before `now` first.
std::vector<SliceRange> Minus(SliceRange was, SliceRange now) {
  if (now.size() == 0) return was.size() > 0 ? std::vector<SliceRange>{was} : std::vector<SliceRange>{};
  std::vector<SliceRange> out;
  if (was.begin < std::min(was.end, now.begin)) out.push_back({was.begin, std::min(was.end, now.begin)});
  if (std::max(was.begin, now.end) < was.end) out.push_back({std::max(was.begin, now.end), was.end});
  return out;
}

}  // namespace

Status ShardServer::ExportDense(const Header& req, Header* reply,
                                std::vector<zmq::message_t>* payload) {
  DenseTable& table = *dense_[req.table_id];
  if (migration_.dropped >= ChangeClock()) {
    // Dropped already (a tool that resumes the change): every shard has committed, so nothing
    // needs these elements any more.
    reply->done = true;
    reply->offset = 0;
    AnswerPage(req, {}, {}, 1 + table.state_array_count(), reply, payload);
    return Status::Ok();
  }
  const uint64_t total = table.total_elements();
  const SliceRange was = PlacementBefore().DenseSliceOf(total, rank_);
  const SliceRange held = table.slice();
  // The first moving element at or after the cursor.
  std::vector<SliceRange> moving = Minus(was, PlacementAfter().DenseSliceOf(total, rank_));
  SliceRange run{0, 0};
  for (const SliceRange& m : moving) {
    if (req.offset < m.end) {
      run = {std::max(req.offset, m.begin), m.end};
      break;
    }
  }
  const uint32_t floats = 1 + table.state_array_count();
  const uint64_t max_rows =
      std::max<uint64_t>(1, (2u << 20) / (sizeof(uint64_t) + sizeof(float) * uint64_t{floats}));
  const uint64_t n = std::min(run.size(), max_rows);
  if (n > 0 && !held.Contains(run.begin, run.begin + n)) {
    return FailedPrecondition("Migrate: shard " + std::to_string(rank_) + " no longer holds " +
                              "elements [" + std::to_string(run.begin) + ", +" +
                              std::to_string(n) + ") of table '" + table.options().name +
                              "' (it holds [" + std::to_string(held.begin) + ", " +
                              std::to_string(held.end) + "))");
  }
  std::vector<uint64_t> keys(n);
  std::vector<float> rows(n * floats);
  for (uint64_t i = 0; i < n; ++i) keys[i] = run.begin + i;
  if (n > 0) table.ReadWithState(run.begin - held.begin, n, rows.data());
  const uint64_t next = run.begin + n;
  reply->done = std::none_of(moving.begin(), moving.end(),
                             [&](const SliceRange& m) { return m.end > next && n > 0; });
  reply->offset = reply->done ? 0 : next;
  AnswerPage(req, keys, rows, floats, reply, payload);
  return Status::Ok();
}

Status ShardServer::InstallDense(const Header& req, const PayloadView& p, Header* reply) {
  const uint32_t t = req.table_id;
  DenseTable& table = *dense_[t];
  const uint64_t total = table.total_elements();
  const uint32_t floats = 1 + table.state_array_count();
  const uint64_t n = p.rows();
  if (n == 0) {
    reply->offset = 0;
    return Status::Ok();
  }
  if (p.dim() != floats) {
    return InvalidArgument("Migrate: elements of " + std::to_string(p.dim()) +
                           " floats for dense table '" + table.options().name + "', whose " +
                           "elements are " + std::to_string(floats) + " with their state");
  }
  const uint64_t first = p.Key(0);
  for (uint64_t i = 0; i < n; ++i) {
    if (p.Key(i) != first + i) {
      return InvalidArgument("Migrate: the elements of a dense page are not consecutive (row " +
                             std::to_string(i) + " is element " + std::to_string(p.Key(i)) +
                             " after " + std::to_string(first) + ")");
    }
  }
  const SliceRange now = PlacementAfter().DenseSliceOf(total, rank_);
  const SliceRange was = PlacementBefore().DenseSliceOf(total, rank_);
  if (first > std::numeric_limits<uint64_t>::max() - n) {
    return InvalidArgument("Migrate: dense elements from " + std::to_string(first) + " wrap");
  }
  const uint64_t last = first + n;
  if (!now.Contains(first, last) || std::max(first, was.begin) < std::min(last, was.end)) {
    return InvalidArgument("Migrate: elements [" + std::to_string(first) + ", " +
                           std::to_string(last) + ") of table '" + table.options().name +
                           "' do not move to shard " + std::to_string(rank_) + " in a change " +
                           "to " + std::to_string(PlacementAfter().count()) + " shards");
  }
  // The table spans both slices until the drop.
  const SliceRange held = table.slice();
  const SliceRange span = held.size() == 0 ? now
                                           : SliceRange{std::min(held.begin, now.begin),
                                                        std::max(held.end, now.end)};
  ResliceDense(t, span);
  std::vector<float> rows(n * floats);
  for (uint64_t i = 0; i < n; ++i) std::memcpy(&rows[i * floats], p.Row(i), sizeof(float) * floats);
  dense_[t]->WriteWithState(first - span.begin, n, rows.data());
  // Which elements are in (merged ranges), for the commit's check.
  if (dense_installed_clock_ != ChangeClock()) {
    dense_installed_.assign(dense_.size(), {});
    dense_installed_clock_ = ChangeClock();
  }
  std::map<uint64_t, uint64_t>& in = dense_installed_[t];
  uint64_t b = first, e = last;
  auto it = in.upper_bound(b);
  if (it != in.begin() && std::prev(it)->second >= b) --it;
  while (it != in.end() && it->first <= e) {
    b = std::min(b, it->first);
    e = std::max(e, it->second);
    it = in.erase(it);
  }
  in[b] = e;
  reply->offset = n;
  return Status::Ok();
}

Status ShardServer::CheckDenseInstalled() const {
  for (uint32_t t = 0; t < dense_.size(); ++t) {
    if (!dense_[t]) continue;
    const uint64_t total = dense_[t]->total_elements();
    for (const SliceRange& gained : Minus(PlacementAfter().DenseSliceOf(total, rank_),
                                          PlacementBefore().DenseSliceOf(total, rank_))) {
      bool in = false;
      if (dense_installed_clock_ == ChangeClock() && t < dense_installed_.size()) {
        const auto& ranges = dense_installed_[t];
        auto it = ranges.upper_bound(gained.begin);
        in = it != ranges.begin() && std::prev(it)->second >= gained.end;
      }
      if (!in) {
        return FailedPrecondition("Migrate: shard " + std::to_string(rank_) + " gains elements [" +
                                  std::to_string(gained.begin) + ", " +
                                  std::to_string(gained.end) + ") of table '" +
                                  dense_[t]->options().name + "' at clock " +
                                  std::to_string(ChangeClock()) + ", not all installed here; " +
                                  "install them first");
      }
    }
  }
  return Status::Ok();
}

Status ShardServer::InstallRows(const Header& req, const PayloadView& p,
                                const Placement& before, const Placement& after, Header* reply) {
  PARASOL_ASSIGN_OR_RETURN(SparseTable * moving, MovableTable(req.table_id));
  SparseTable& table = *moving;
  const uint32_t floats = table.partition(0).stored_floats();
  if (p.rows() > 0 && p.dim() != floats) {
    return InvalidArgument("Migrate: rows of " + std::to_string(p.dim()) + " floats for table '" +
                           table.options().name + "', whose rows are " + std::to_string(floats));
  }
  for (uint64_t i = 0; i < p.rows(); ++i) {
    const uint64_t h = HashKey(p.Key(i), kShardSalt);
    if (after.ShardOfHash(h) != rank_ || before.ShardOfHash(h) == rank_) {
      return InvalidArgument("Migrate: key " + std::to_string(p.Key(i)) + " (row " +
                             std::to_string(i) + ") does not move to shard " +
                             std::to_string(rank_) + " in a change to " +
                             std::to_string(after.count()) + " shards");
    }
  }
  // The rows' values must be finite, as a push's must (nothing is installed otherwise).
  const uint32_t dim = table.dim();
  for (uint64_t i = 0; i < p.rows(); ++i) {
    float v[1];
    for (uint32_t d = 0; d < dim; ++d) {
      std::memcpy(v, p.Row(i) + d * sizeof(float), sizeof(float));
      if (!std::isfinite(v[0])) {
        ++counters_.nonfinite_pushes;
        return InvalidArgument("Migrate: row of key " + std::to_string(p.Key(i)) + " of table '" +
                               table.options().name + "': element " + std::to_string(d) +
                               " is not finite; nothing is installed");
      }
    }
  }
  std::vector<float> row(floats);
  for (uint64_t i = 0; i < p.rows(); ++i) {
    const uint64_t key = p.Key(i);
    std::memcpy(row.data(), p.Row(i), sizeof(float) * floats);
    table.partition(EngineOfKey(key, table.engines())).RestoreRow(key, row.data());
  }
  reply->offset = p.rows();
  return Status::Ok();
}

}  // namespace parasol
