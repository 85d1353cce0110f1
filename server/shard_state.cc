#include "server/shard_state.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <exception>
#include <limits>
#include <new>
#include <unordered_set>
#include <utility>

#include "common/half.hpp"
#include "common/optimizer_layout.hpp"
#include "common/sharding.hpp"

namespace parasol {
namespace {

using Kind = CheckpointBlockKind;

template <typename T>
void Append(std::vector<char>& out, const T& v) {
  const char* p = reinterpret_cast<const char*>(&v);
  out.insert(out.end(), p, p + sizeof(T));
}

Kind KindOf(const CheckpointBlockHeader& b) { return static_cast<Kind>(b.kind); }
Kind KindOf(const CheckpointBlock& b) { return static_cast<Kind>(b.kind); }
bool IsPendingSparse(Kind k) { return k == Kind::kPendingSparse || k == Kind::kPendingSparseOf; }
bool IsPending(Kind k) {
  return IsPendingSparse(k) || k == Kind::kPendingDense || k == Kind::kPendingDenseOf;
}
// The bytes before a pending block's sums: its clock, and for one worker's, the worker.
uint64_t PendingPrefixBytes(Kind k) {
  return k == Kind::kPendingSparseOf || k == Kind::kPendingDenseOf ? 2 * sizeof(int64_t)
                                                                    : sizeof(int64_t);
}

// A pending block's clock: its payload's first 8 bytes (CheckBlockHeader() ensures them).
int64_t PendingClock(const CheckpointBlock& b) {
  int64_t clock = 0;
  std::memcpy(&clock, b.bytes.data(), sizeof(clock));
  return clock;
}

// Whose pushes a pending block sums: the 8 bytes after the clock, or no one worker's.
int64_t PendingWorker(const CheckpointBlock& b) {
  if (PendingPrefixBytes(KindOf(b)) == sizeof(int64_t)) return ClockAggregate::kNoWorker;
  int64_t worker = 0;
  std::memcpy(&worker, b.bytes.data() + sizeof(int64_t), sizeof(worker));
  return worker;
}

// Refuses `count` x `unit` bytes that overflow or differ from the block's `bytes`.
Status CheckProduct(uint64_t count, uint64_t unit, uint64_t bytes, const std::string& what) {
  const std::string product = what + ": " + std::to_string(count) + " x " + std::to_string(unit);
  uint64_t want = 0;
  if (__builtin_mul_overflow(count, unit, &want))
    return InvalidArgument(product + " bytes overflow");
  if (want != bytes) {
    return InvalidArgument(product + " bytes do not make the block's " + std::to_string(bytes) +
                           " bytes");
  }
  return Status::Ok();
}

}  // namespace

DenseRangeBlock ReadDenseRange(const CheckpointBlock& b) {
  int64_t v[3];
  std::memcpy(v, b.bytes.data(), sizeof(v));
  return DenseRangeBlock{static_cast<uint64_t>(v[0]), static_cast<uint64_t>(v[1]),
                         static_cast<uint64_t>(v[2]),
                         b.bytes.data() + kDenseRangeHeaderBytes};
}

Status CheckDenseRange(const Manifest& manifest, const CheckpointBlock& b) {
  const TableOptions& t = manifest.tables[b.table];
  const DenseRangeBlock r = ReadDenseRange(b);
  const uint64_t total = t.NumElements();
  if (r.begin > total || b.count > total - r.begin || r.live_begin > r.live_end ||
      r.live_begin < r.begin || r.live_end > r.begin + b.count) {
    return InvalidArgument("table '" + t.name + "': a dense range of " +
                           std::to_string(b.count) + " elements from " +
                           std::to_string(static_cast<int64_t>(r.begin)) + " serving [" +
                           std::to_string(static_cast<int64_t>(r.live_begin)) + ", " +
                           std::to_string(static_cast<int64_t>(r.live_end)) +
                           ") does not fit the tensor of " + std::to_string(total));
  }
  return Status::Ok();
}

const Placement& LivePlacement(const Membership& membership, const MigrationState& migration) {
  const auto& changes = membership.server_changes();
  if (changes.empty() || migration.installed >= changes.back().clock) {
    return membership.LastPlacement();
  }
  return membership.PlacementAt(changes.back().clock - 1);
}

Status CheckBlockHeader(const Manifest& manifest, uint32_t shard, const CheckpointBlockHeader& b) {
  switch (KindOf(b)) {
    case Kind::kClocks:
    case Kind::kDone:
    case Kind::kIncarnations:
      if (b.count != manifest.cluster.max_workers) {
        return InvalidArgument("clocks of " + std::to_string(b.count) +
                               " workers; the manifest has " +
                               std::to_string(manifest.cluster.max_workers) + " worker ranks");
      }
      return CheckProduct(b.count, sizeof(int64_t), b.bytes, "clocks");
    case Kind::kMembership:
      if (b.count > manifest.cluster.max_workers + kMaxServerChanges) {
        return InvalidArgument("membership of " + std::to_string(b.count) +
                               " entries; the manifest has " +
                               std::to_string(manifest.cluster.max_workers) + " worker ranks");
      }
      return CheckProduct(b.count, 3 * sizeof(int64_t), b.bytes, "membership");
    case Kind::kDeltaOf:
      if (b.count != 1) return InvalidArgument("a delta block of " + std::to_string(b.count));
      return CheckProduct(b.count, 3 * sizeof(int64_t), b.bytes, "delta");
    case Kind::kRemovedRows:
      if (b.table >= manifest.tables.size() || manifest.tables[b.table].kind != TableKind::kSparse) {
        return InvalidArgument("removed rows of table " + std::to_string(b.table) +
                               ", not a sparse table of the manifest");
      }
      return CheckProduct(b.count, sizeof(uint64_t), b.bytes, "removed rows");
    case Kind::kMigration:
      if (b.count != 2) return InvalidArgument("a migration block of " + std::to_string(b.count));
      return CheckProduct(b.count, sizeof(int64_t), b.bytes, "migration");
    case Kind::kBarrier:
      if (b.count != 1) return InvalidArgument("a barrier block of " + std::to_string(b.count));
      return CheckProduct(b.count, sizeof(int64_t), b.bytes, "barrier");
    case Kind::kCompleteThrough:
      if (b.count != 1) {
        return InvalidArgument("a complete-through block of " + std::to_string(b.count));
      }
      return CheckProduct(b.count, 2 * sizeof(uint64_t), b.bytes, "complete-through");
    case Kind::kPushRecord:
      return Status::Ok();  // PushRecord::Load() checks its own layout
    case Kind::kSparseRows:
    case Kind::kSparseRowsBf16:
    case Kind::kDenseSlice:
    case Kind::kDenseRange:
    case Kind::kPendingSparse:
    case Kind::kPendingDense:
    case Kind::kPendingSparseOf:
    case Kind::kPendingDenseOf:
      break;
    default:
      return InvalidArgument("unknown block kind " + std::to_string(b.kind));
  }
  if (b.table >= manifest.tables.size()) {
    return InvalidArgument("table " + std::to_string(b.table) + " is not in the manifest (" +
                           std::to_string(manifest.tables.size()) + " tables)");
  }
  const TableOptions& t = manifest.tables[b.table];
  const std::string name = "table '" + t.name + "'";
  // Pending sums: the clock they belong to (and whose they are), then the sums.
  const bool pending = IsPending(KindOf(b));
  const uint64_t clock_bytes = pending ? PendingPrefixBytes(KindOf(b)) : 0;
  if (b.bytes < clock_bytes) {
    return InvalidArgument(name + ": pending sums of " + std::to_string(b.bytes) +
                           " bytes, too few for their clock");
  }
  const uint64_t bytes = b.bytes - clock_bytes;
  if (IsSparseRows(KindOf(b)) || IsPendingSparse(KindOf(b))) {
    if (t.kind != TableKind::kSparse) {
      return InvalidArgument(std::string(pending ? "pending sums of sparse rows" : "sparse rows") +
                             " for dense " + name);
    }
    const uint64_t row_floats =
        pending ? uint64_t{t.dim}
                : 1 + uint64_t{t.dim} + SparseStateFloats(t.optimizer, t.dim);
    if (KindOf(b) == Kind::kSparseRowsBf16) {
      // The key, the clock word, the floats as bf16, then the raw words.
      const uint64_t raw = SparseStateRawWords(t.optimizer);
      return CheckProduct(b.count,
                          sizeof(uint64_t) + sizeof(uint32_t) * (1 + raw) +
                              2 * (row_floats - 1 - raw),
                          bytes, name + " bf16 rows");
    }
    return CheckProduct(b.count, sizeof(uint64_t) + sizeof(float) * row_floats, bytes,
                        name + (pending ? " pending sums after the clock" : " rows"));
  }
  if (t.kind != TableKind::kDense) {
    return InvalidArgument(std::string(pending ? "pending dense sums" : "a dense slice") +
                           " for sparse " + name);
  }
  const uint32_t shards = static_cast<uint32_t>(manifest.cluster.servers.size());
  // A slice of the listed shards' cut, or (pending sums, a range) any elements of the tensor
  // (ShardState::Verify() checks pending sums against their table's block).
  const uint64_t slice = KindOf(b) == Kind::kDenseSlice
                             ? DenseSlice(t.NumElements(), shard, shards).size()
                             : t.NumElements();
  if (KindOf(b) == Kind::kDenseSlice ? b.count != slice : b.count > slice) {
    return InvalidArgument(name + ": " + (pending ? "pending sums of " : "") + "a slice of " +
                           std::to_string(b.count) + " elements; this shard's slice has " +
                           std::to_string(slice));
  }
  if (pending) {
    return CheckProduct(b.count, sizeof(float), bytes, name + " pending sums after the clock");
  }
  const uint64_t header = KindOf(b) == Kind::kDenseRange ? kDenseRangeHeaderBytes : 0;
  if (b.bytes < header) {
    return InvalidArgument(name + ": a dense range of " + std::to_string(b.bytes) +
                           " bytes, too few for where it is");
  }
  return CheckProduct(b.count, sizeof(float) * (1 + uint64_t{DenseStateArrays(t.optimizer)}),
                      b.bytes - header, name + " slice");
}

Status WidenSparseRows(const Manifest& manifest, CheckpointBlock* b) {
  if (KindOf(*b) != Kind::kSparseRowsBf16) return Status::Ok();
  if (b->table >= manifest.tables.size()) return Internal("bf16 rows of no table");
  const TableOptions& t = manifest.tables[b->table];
  const uint64_t floats = 1 + uint64_t{t.dim} + SparseStateFloats(t.optimizer, t.dim);
  const uint64_t raw = SparseStateRawWords(t.optimizer);
  const uint64_t halves_n = floats - 1 - raw;
  const uint64_t narrow = sizeof(uint64_t) + sizeof(uint32_t) * (1 + raw) + 2 * halves_n;
  const uint64_t wide = sizeof(uint64_t) + sizeof(float) * floats;
  if (b->bytes.size() != b->count * narrow) {
    return Internal("table '" + t.name + "': bf16 rows do not match the table");
  }
  std::vector<char> out(b->count * wide);
  for (uint64_t i = 0; i < b->count; ++i) {
    const char* from = b->bytes.data() + i * narrow;
    char* to = out.data() + i * wide;
    std::memcpy(to, from, sizeof(uint64_t) + sizeof(uint32_t));  // the key, the clock word
    const char* halves = from + sizeof(uint64_t) + sizeof(uint32_t);
    char* rest = to + sizeof(uint64_t) + sizeof(uint32_t);
    for (uint64_t j = 0; j < halves_n; ++j) {
      uint16_t h;
      std::memcpy(&h, halves + 2 * j, sizeof(h));
      const float v = Bf16ToF32(h);
      std::memcpy(rest + sizeof(float) * j, &v, sizeof(v));
    }
    // The raw words (adam's step count), as they are.
    std::memcpy(rest + sizeof(float) * halves_n, halves + 2 * halves_n, sizeof(uint32_t) * raw);
  }
  b->bytes = std::move(out);
  b->kind = static_cast<uint32_t>(Kind::kSparseRows);
  return Status::Ok();
}

ShardState::ShardState(const Manifest& manifest, uint32_t shard,
                       std::vector<std::unique_ptr<SparseTable>>& sparse,
                       std::vector<std::unique_ptr<DenseTable>>& dense,
                       ConsistencyController& controller, PushRecord& record,
                       PendingAggregates& pending, uint32_t engines, Membership& membership,
                       MigrationState* migration, std::function<bool(uint64_t)> keeps_key)
    : manifest_(manifest),
      shard_(shard),
      fingerprint_(manifest.Fingerprint()),
      sparse_(sparse),
      dense_(dense),
      controller_(controller),
      record_(record),
      pending_(pending),
      engines_(engines),
      membership_(membership),
      migration_(migration),
      keeps_key_(std::move(keeps_key)) {}

Result<std::vector<CheckpointBlock>> ShardState::Save() const {
  std::vector<CheckpointBlock> blocks;
  PARASOL_RETURN_IF_ERROR(Save([&](const CheckpointBlock& b) {
    blocks.push_back(b);
    return Status::Ok();
  }));
  return blocks;
}

Status ShardState::Save(const CheckpointBlockSink& sink, size_t row_block_bytes,
                        const DeltaSpec* delta) const {
  if (delta) {
    CheckpointBlock d;
    d.kind = static_cast<uint32_t>(Kind::kDeltaOf);
    d.count = 1;
    Append(d.bytes, delta->base);
    Append(d.bytes, delta->previous);
    Append(d.bytes, static_cast<int64_t>(delta->since));
    PARASOL_RETURN_IF_ERROR(sink(d));
  }
  for (uint32_t t = 0; t < manifest_.tables.size(); ++t) {
    CheckpointBlock b;
    b.table = t;
    if (sparse_[t]) {
      // Rows in blocks of at most kRowBlockBytes, each written as it fills: a table (tiered,
      // larger than memory) is never copied whole.
      const bool bf16 = manifest_.checkpoint.bf16;
      b.kind = static_cast<uint32_t>(bf16 ? Kind::kSparseRowsBf16 : Kind::kSparseRows);
      const SparseTable& table = *sparse_[t];
      // A delta's removed rows come before its rows: a key removed and then created again
      // since the checkpoint before is in both, and its new row must be what stays.
      if (delta && t < delta->removed.size() && !delta->removed[t].empty()) {
        CheckpointBlock r;
        r.kind = static_cast<uint32_t>(Kind::kRemovedRows);
        r.table = t;
        r.count = delta->removed[t].size();
        r.bytes.resize(r.count * sizeof(uint64_t));
        std::memcpy(r.bytes.data(), delta->removed[t].data(), r.bytes.size());
        PARASOL_RETURN_IF_ERROR(sink(r));
      }
      bool sent = false;
      Status sink_status;
      for (uint32_t e = 0; e < table.engines(); ++e) {
        const SparseTable::Partition& part = table.partition(e);
        const size_t floats = part.stored_floats();
        const size_t raw = SparseStateRawWords(table.options().optimizer);
        const size_t row_bytes = bf16 ? sizeof(uint32_t) * (1 + raw) + 2 * (floats - 1 - raw)
                                      : sizeof(float) * floats;
        const size_t stride = sizeof(uint64_t) + row_bytes;
        // A delta: the rows updated since the checkpoint before it (by their clock word).
        const bool changed_only = delta && part.stores_clock();
        PARASOL_RETURN_IF_ERROR(part.ForEachRow([&](uint64_t key, const float* row) -> bool {
          if (!sink_status.ok()) return false;  // the file failed: no need to read on
          if (keeps_key_ && !keeps_key_(key)) return true;  // moved to another shard
          if (changed_only) {
            uint32_t last;
            std::memcpy(&last, row, sizeof(last));
            if (last < delta->since) return true;
          }
          if (b.bytes.empty()) b.bytes.reserve(std::min<size_t>(row_block_bytes, part.rows() * stride));
          Append(b.bytes, key);
          const char* p = reinterpret_cast<const char*>(row);
          if (bf16) {
            b.bytes.insert(b.bytes.end(), p, p + sizeof(uint32_t));  // the clock word
            const size_t at = b.bytes.size();
            const size_t halves = floats - 1 - raw;
            b.bytes.resize(at + 2 * halves);
            for (size_t j = 0; j < halves; ++j) {
              const uint16_t h = F32ToBf16(row[1 + j]);
              std::memcpy(b.bytes.data() + at + 2 * j, &h, sizeof(h));
            }
            // The raw words (adam's step count), as they are.
            b.bytes.insert(b.bytes.end(), p + sizeof(float) * (1 + halves),
                           p + sizeof(float) * floats);
          } else {
            b.bytes.insert(b.bytes.end(), p, p + row_bytes);
          }
          ++b.count;
          if (b.bytes.size() + stride > row_block_bytes) {
            sink_status = sink(b);
            sent = true;
            b.bytes.clear();
            b.count = 0;
          }
          return true;
        }));
        PARASOL_RETURN_IF_ERROR(sink_status);
      }
      if (b.count > 0 || !sent) PARASOL_RETURN_IF_ERROR(sink(b));
      continue;
    }
    PARASOL_RETURN_IF_ERROR(SaveDense(t, sink));
  }
  CheckpointBlock clocks;
  clocks.kind = static_cast<uint32_t>(Kind::kClocks);
  clocks.count = controller_.clocks().size();
  for (int64_t clock : controller_.clocks()) Append(clocks.bytes, clock);
  PARASOL_RETURN_IF_ERROR(sink(clocks));
  // Which pushes are in this checkpoint: a push resent after a restart is applied once.
  CheckpointBlock record;
  record.kind = static_cast<uint32_t>(Kind::kPushRecord);
  record.bytes = record_.Save();
  PARASOL_RETURN_IF_ERROR(sink(record));
  PARASOL_RETURN_IF_ERROR(SavePending(sink));
  // Which workers have left: one that has may have exited, and cannot say so again.
  CheckpointBlock done;
  done.kind = static_cast<uint32_t>(Kind::kDone);
  done.count = controller_.clocks().size();
  for (uint32_t w = 0; w < done.count; ++w) Append(done.bytes, controller_.DoneAt(w));
  PARASOL_RETURN_IF_ERROR(sink(done));
  CheckpointBlock barrier;
  barrier.kind = static_cast<uint32_t>(Kind::kBarrier);
  barrier.count = 1;
  Append(barrier.bytes, controller_.last_barrier());
  PARASOL_RETURN_IF_ERROR(sink(barrier));
  CheckpointBlock incarnations;
  incarnations.kind = static_cast<uint32_t>(Kind::kIncarnations);
  incarnations.count = controller_.clocks().size();
  for (uint32_t w = 0; w < incarnations.count; ++w) {
    Append(incarnations.bytes, controller_.incarnation(w));
  }
  PARASOL_RETURN_IF_ERROR(sink(incarnations));
  // Taken while a replay was owed: the count it holds every acknowledged push before.
  if (complete_through_) {
    CheckpointBlock complete;
    complete.kind = static_cast<uint32_t>(Kind::kCompleteThrough);
    complete.count = 1;
    Append(complete.bytes, *complete_through_);
    Append(complete.bytes, complete_writer_);
    PARASOL_RETURN_IF_ERROR(sink(complete));
  }
  // Where a change of the shard count stands (only when one was named).
  if (migration_ && !membership_.server_changes().empty()) {
    CheckpointBlock m;
    m.kind = static_cast<uint32_t>(Kind::kMigration);
    m.count = 2;
    Append(m.bytes, migration_->installed);
    Append(m.bytes, migration_->dropped);
    PARASOL_RETURN_IF_ERROR(sink(m));
  }
  // Which ranks joined or leave the running job, and when (only when any did).
  const std::vector<MemberEntry> entries = membership_.Entries();
  if (entries.empty()) return Status::Ok();
  CheckpointBlock members;
  members.kind = static_cast<uint32_t>(Kind::kMembership);
  for (const MemberEntry& e : entries) {
    Append(members.bytes, static_cast<int64_t>(e.worker));
    Append(members.bytes, e.join);
    Append(members.bytes, e.leave);
    ++members.count;
  }
  return sink(members);
}

Status ShardState::SaveDense(uint32_t t, const CheckpointBlockSink& sink) const {
  const DenseTable& d = *dense_[t];
  const uint64_t total = d.total_elements();
  const SliceRange held = d.slice();
  const SliceRange listed =
      DenseSlice(total, shard_, static_cast<uint32_t>(manifest_.cluster.servers.size()));
  SliceRange live =
      LiveDenseSlice(membership_, migration_ ? *migration_ : MigrationState{}, total, shard_);
  live = {std::max(live.begin, held.begin), std::min(live.end, held.end)};
  CheckpointBlock b;
  b.table = t;
  b.count = held.size();
  if (held.begin == listed.begin && held.end == listed.end && live.begin == held.begin &&
      live.end == held.end) {
    b.kind = static_cast<uint32_t>(Kind::kDenseSlice);
  } else {
    b.kind = static_cast<uint32_t>(Kind::kDenseRange);
    const bool any = live.begin < live.end;
    const int64_t bounds[3] = {static_cast<int64_t>(held.begin),
                               static_cast<int64_t>(any ? live.begin : held.begin),
                               static_cast<int64_t>(any ? live.end : held.begin)};
    b.bytes.resize(sizeof(bounds));
    std::memcpy(b.bytes.data(), bounds, sizeof(bounds));
  }
  d.AppendArrays(&b.bytes);
  return sink(b);
}

// After the clocks, which bound the pending clocks when they are loaded.
// Each worker's sums apart (a clock combined already, as no one worker's).
Status ShardState::SavePending(const CheckpointBlockSink& sink) const {
  auto save = [&](int64_t clock, int64_t worker, const ClockAggregate::Part& part) -> Status {
    for (uint32_t t = 0; t < manifest_.tables.size(); ++t) {
      CheckpointBlock b;
      b.table = t;
      b.bytes.resize(2 * sizeof(int64_t));  // the clock, then the worker
      std::memcpy(b.bytes.data(), &clock, sizeof(clock));
      std::memcpy(b.bytes.data() + sizeof(clock), &worker, sizeof(worker));
      if (sparse_[t]) {
        b.kind = static_cast<uint32_t>(Kind::kPendingSparseOf);
        const uint32_t dim = sparse_[t]->dim();
        for (uint32_t e = 0; e < engines_; ++e) {
          part.ForEachSparse(t, e, dim, [&](uint64_t key, const float* sum) {
            Append(b.bytes, key);
            const char* p = reinterpret_cast<const char*>(sum);
            b.bytes.insert(b.bytes.end(), p, p + dim * sizeof(float));
            ++b.count;
          });
        }
        if (b.count == 0) continue;
      } else {
        const float* sums = part.DenseSumIfAny(t);
        if (!sums) continue;
        b.kind = static_cast<uint32_t>(Kind::kPendingDenseOf);
        b.count = dense_[t]->slice().size();
        const size_t at = b.bytes.size();
        b.bytes.resize(at + b.count * sizeof(float));
        std::memcpy(b.bytes.data() + at, sums, b.count * sizeof(float));
      }
      PARASOL_RETURN_IF_ERROR(sink(b));
    }
    return Status::Ok();
  };
  for (const auto& [clock, agg] : pending_) {
    if (agg->combined()) {
      PARASOL_RETURN_IF_ERROR(save(clock, ClockAggregate::kNoWorker, agg->sums()));
      continue;
    }
    for (const auto& [worker, part] : agg->parts()) {
      PARASOL_RETURN_IF_ERROR(save(clock, worker, part));
    }
  }
  return Status::Ok();
}

Status ShardState::CheckHeader(const CheckpointHeader& h) const {
  const uint32_t shards = static_cast<uint32_t>(manifest_.cluster.servers.size());
  if (h.shard != shard_ || h.shards != shards || h.fingerprint != fingerprint_) {
    return FailedPrecondition("it belongs to shard " + std::to_string(h.shard) + " of " +
                              std::to_string(h.shards) +
                              " of another manifest or layout (this is shard " +
                              std::to_string(shard_) + " of " + std::to_string(shards) + ")");
  }
  if (h.clock < -1 || h.clock > kMaxCheckpointClock) {
    return InvalidArgument("its clock " + std::to_string(h.clock) + " is out of range");
  }
  return Status::Ok();
}

Status ShardState::Load(std::istream& in, const std::string& name, CheckpointHeader* header,
                        bool check_first, uint64_t onto) {
  // Whatever happens, no block is still being applied when this returns.
  struct Waiter {
    ShardState* self;
    ~Waiter() {
      if (self->applying_.valid()) self->applying_.wait();
      // Rows appended and not indexed (a failed load) are indexed: never invisible rows.
      try {
        (void)self->FinishRestoredRows();
      } catch (...) {
      }
      self->applying_ = {};
      std::vector<char>().swap(self->applying_block_.bytes);
    }
  } waiter{this};
  if (progress_) {
    in.seekg(0, std::ios::end);
    const std::streamoff end = in.tellg();
    in.clear();
    in.seekg(0, std::ios::beg);
    const uint64_t framing = kCheckpointHeaderBytes + kCheckpointFooterBytes;
    const uint64_t size = end > 0 ? static_cast<uint64_t>(end) : 0;
    progress_->bytes_total = size > framing ? (check_first ? 2 : 1) * (size - framing) : 0;
  }
  try {
    std::vector<int64_t> clocks, done, incarnations;
    int64_t barrier = -1;
    PushRecord record = record_;  // the same window
    std::vector<MemberEntry> members;
    MigrationState migration;
    std::vector<uint64_t> sparse_rows;
    const auto start = std::chrono::steady_clock::now();
    PendingAggregates pending;
    PARASOL_RETURN_IF_ERROR(Verify(in, name, header, check_first ? nullptr : &pending, onto,
                                   &sparse_rows, &clocks, &done, &barrier, &incarnations,
                                   &record, &members, &migration));
    if (!check_first) PARASOL_RETURN_IF_ERROR(WaitApplying());
    uint64_t rows_total = 0;
    for (uint64_t n : sparse_rows) rows_total += n;
    if (progress_) progress_->rows_total.store(rows_total, std::memory_order_relaxed);
    // Each index sized once for the rows the file states (its seed is random: the file's
    // order, another index's bucket order, is no order to it), not grown block by block.
    for (uint32_t t = 0; t < sparse_.size() && check_first; ++t) {
      if (!sparse_[t] || sparse_[t]->tiered() || t >= sparse_rows.size()) continue;
      SparseTable& table = *sparse_[t];
      const uint64_t share = sparse_rows[t] / table.engines();
      // Keys split among the engines by hash: a share within a few standard deviations.
      const uint64_t slack = 4 * static_cast<uint64_t>(std::sqrt(double(share))) + 64;
      for (uint32_t e = 0; e < table.engines(); ++e) {
        table.partition(e).Reserve(table.partition(e).rows() + share + slack);
      }
    }
    Membership membership = membership_;
    PARASOL_RETURN_IF_ERROR(
        membership.Merge(members).WithContext("checkpoint '" + name + "'"));
    const auto checked = std::chrono::steady_clock::now();
    if (check_first) {
      in.clear();
      in.seekg(0, std::ios::beg);
      PARASOL_RETURN_IF_ERROR(ApplyBlocks(in, name, &pending));
      PARASOL_RETURN_IF_ERROR(WaitApplying());
    }
    PARASOL_RETURN_IF_ERROR(FinishRestoredRows());
    if (progress_) {
      progress_->seconds_checking = std::chrono::duration<double>(checked - start).count();
      progress_->seconds_applying =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - checked).count();
    }
    // The ranks that had joined, before their clocks.
    membership_ = std::move(membership);
    for (uint32_t w = 0; w < membership_.max_ranks(); ++w) {
      if (membership_.Joined(w)) {
        controller_.Join(w, membership_.join(w), now_);
      }
    }
    for (size_t w = 0; w < clocks.size(); ++w) {
      if (!controller_.InJob(static_cast<uint32_t>(w))) continue;
      controller_.SetClock(static_cast<uint32_t>(w), clocks[w]);
      if (w < done.size() && done[w] >= 0) controller_.SetDone(static_cast<uint32_t>(w), done[w]);
      // A rank at its leave clock had trained every step it would: it owes nothing more, even
      // if its done came after this checkpoint (it may have exited; parasol_sim --elastic
      // --seed 1389: a shard restored from before the done waited for it for ever).
      const int64_t leave = membership_.leave(static_cast<uint32_t>(w));
      if (leave >= 0 && clocks[w] >= leave) {
        controller_.SetDone(static_cast<uint32_t>(w), leave);
      }
      if (w < incarnations.size()) {
        controller_.set_incarnation(static_cast<uint32_t>(w),
                                    static_cast<uint64_t>(incarnations[w]));
      }
    }
    controller_.set_last_barrier(barrier);
    if (migration_) *migration_ = migration;
    record_ = std::move(record);
    pending_ = std::move(pending);
    return Status::Ok();
  } catch (const std::bad_alloc&) {
    return ResourceExhausted("out of memory while loading checkpoint '" + name + "'");
  } catch (const std::exception& e) {
    return Internal("while loading checkpoint '" + name + "': " + e.what());
  }
}

Status ShardState::Verify(std::istream& in, const std::string& name, CheckpointHeader* header,
                          PendingAggregates* apply, uint64_t onto,
                          std::vector<uint64_t>* sparse_rows, std::vector<int64_t>* clocks,
                          std::vector<int64_t>* done,
                          int64_t* barrier, std::vector<int64_t>* incarnations,
                          PushRecord* record, std::vector<MemberEntry>* members,
                          MigrationState* migration) {
  Status identity;
  std::vector<char> table_seen(manifest_.tables.size(), 0);
  bool clocks_seen = false, record_seen = false, done_seen = false, barrier_seen = false,
       incarnations_seen = false, members_seen = false, migration_seen = false,
       complete_seen = false;
  complete_through_.reset();
  complete_writer_ = 0;
  std::set<std::tuple<int64_t, uint32_t, int64_t>> pending_seen;  // (clock, table, worker)
  int64_t last_sparse = -1;  // the table of the block before, when it held sparse rows
  uint64_t blocks_seen = 0;
  bool delta_seen = false;
  std::vector<char> removed_seen(manifest_.tables.size(), 0);
  // Per dense table, the elements of its block (its pending sums cover the same).
  std::vector<uint64_t> dense_count(manifest_.tables.size(), 0);
  // Per dense table, what its block holds and the elements it says the shard serves.
  struct DenseHeld {
    SliceRange held, live;
  };
  std::vector<DenseHeld> dense_held(manifest_.tables.size());
  sparse_rows->assign(manifest_.tables.size(), 0);
  auto check = [&](const CheckpointBlockHeader& b) -> Status {
    identity = CheckHeader(*header);
    if (!identity.ok()) return identity;
    PARASOL_RETURN_IF_ERROR(CheckBlockHeader(manifest_, shard_, b));
    PARASOL_RETURN_IF_ERROR(AddProgress(kCheckpointBlockHeaderBytes + b.bytes));
    if (IsSparseRows(KindOf(b))) (*sparse_rows)[b.table] += b.count;
    // A delta starts with what it is a delta of; a full checkpoint goes onto nothing.
    if (blocks_seen++ == 0) {
      if (header->delta != (KindOf(b) == Kind::kDeltaOf)) {
        return InvalidArgument(header->delta ? "a delta whose first block does not say of what"
                                             : "a full checkpoint that says it is a delta");
      }
      if (!header->delta && onto != 0) {
        return FailedPrecondition("a full checkpoint, loaded onto checkpoint " +
                                  std::to_string(onto));
      }
    }
    if (KindOf(b) == Kind::kDeltaOf) {
      if (std::exchange(delta_seen, true)) return InvalidArgument("a second delta block");
      last_sparse = -1;
      return Status::Ok();
    }
    if (KindOf(b) == Kind::kRemovedRows) {
      if (!header->delta) return InvalidArgument("removed rows in a full checkpoint");
      if (std::exchange(removed_seen[b.table], 1)) {
        return InvalidArgument("a second block of removed rows of table '" +
                               manifest_.tables[b.table].name + "'");
      }
      last_sparse = -1;
      return Status::Ok();
    }
    if (KindOf(b) == Kind::kClocks) {
      if (std::exchange(clocks_seen, true)) return InvalidArgument("a second block of clocks");
    } else if (KindOf(b) == Kind::kDone) {
      if (std::exchange(done_seen, true)) return InvalidArgument("a second block of done clocks");
    } else if (KindOf(b) == Kind::kBarrier) {
      if (std::exchange(barrier_seen, true)) return InvalidArgument("a second barrier block");
    } else if (KindOf(b) == Kind::kMembership) {
      if (std::exchange(members_seen, true)) return InvalidArgument("a second membership block");
    } else if (KindOf(b) == Kind::kMigration) {
      if (std::exchange(migration_seen, true)) return InvalidArgument("a second migration block");
    } else if (KindOf(b) == Kind::kCompleteThrough) {
      if (std::exchange(complete_seen, true)) {
        return InvalidArgument("a second complete-through block");
      }
    } else if (KindOf(b) == Kind::kIncarnations) {
      if (std::exchange(incarnations_seen, true)) {
        return InvalidArgument("a second block of incarnations");
      }
    } else if (KindOf(b) == Kind::kPushRecord) {
      if (std::exchange(record_seen, true)) return InvalidArgument("a second push record");
    } else if (IsPending(KindOf(b))) {
      if (!clocks_seen) return InvalidArgument("pending sums before the worker clocks");
      if (!IsPendingSparse(KindOf(b)) &&
          (!table_seen[b.table] || b.count != dense_count[b.table])) {
        return InvalidArgument("table '" + manifest_.tables[b.table].name + "': pending sums " +
                               "of " + std::to_string(b.count) + " elements; its block " +
                               (table_seen[b.table] ? "has " + std::to_string(dense_count[b.table])
                                                    : std::string("comes later")));
      }
    } else if (IsSparseRows(KindOf(b)) && last_sparse == static_cast<int64_t>(b.table)) {
      // A table's rows may come in several blocks, one after another.
    } else if (std::exchange(table_seen[b.table], 1)) {
      return InvalidArgument("a second block of table '" + manifest_.tables[b.table].name + "'");
    }
    last_sparse = IsSparseRows(KindOf(b)) ? static_cast<int64_t>(b.table) : -1;
    if (KindOf(b) == Kind::kDenseSlice || KindOf(b) == Kind::kDenseRange) {
      dense_count[b.table] = b.count;
    }
    return Status::Ok();
  };
  auto decode = [&](const CheckpointBlock& b) -> Status {
    if (KindOf(b) == Kind::kDeltaOf) {
      int64_t v[3];
      std::memcpy(v, b.bytes.data(), sizeof(v));
      const uint64_t base = static_cast<uint64_t>(v[0]), previous = static_cast<uint64_t>(v[1]);
      if (previous != onto || onto == 0 || base == 0 || base > previous ||
          (expected_base_ != 0 && base != expected_base_) ||
          previous + 1 != header->sequence || v[2] < 0 || v[2] > int64_t{UINT32_MAX}) {
        return FailedPrecondition(
            "a delta of checkpoint " + std::to_string(previous) + " (chain from " +
            std::to_string(base) + ", rows since clock " + std::to_string(v[2]) +
            "), loaded onto " + (onto ? "checkpoint " + std::to_string(onto) : "no checkpoint"));
      }
      return Status::Ok();
    }
    if (KindOf(b) == Kind::kClocks) {
      clocks->resize(b.count);
      std::memcpy(clocks->data(), b.bytes.data(), b.bytes.size());
      for (size_t w = 0; w < clocks->size(); ++w) {
        if ((*clocks)[w] < 0 || (*clocks)[w] > kMaxCheckpointClock) {
          return InvalidArgument("worker " + std::to_string(w) + "'s clock " +
                                 std::to_string((*clocks)[w]) + " is out of range");
        }
      }
    } else if (KindOf(b) == Kind::kDone) {
      done->resize(b.count);
      std::memcpy(done->data(), b.bytes.data(), b.bytes.size());
      for (size_t w = 0; w < done->size(); ++w) {
        if ((*done)[w] < -1 || (*done)[w] > kMaxCheckpointClock) {
          return InvalidArgument("worker " + std::to_string(w) + "'s done clock " +
                                 std::to_string((*done)[w]) + " is out of range");
        }
      }
    } else if (KindOf(b) == Kind::kMigration) {
      int64_t v[2];
      std::memcpy(v, b.bytes.data(), sizeof(v));
      for (int64_t c : v) {
        if (c < -1 || c > kMaxMemberClock) {
          return InvalidArgument("migration clock " + std::to_string(c) + " is out of range");
        }
      }
      *migration = MigrationState{v[0], v[1]};
    } else if (KindOf(b) == Kind::kMembership) {
      members->clear();
      for (uint64_t i = 0; i < b.count; ++i) {
        int64_t v[3];
        std::memcpy(v, b.bytes.data() + i * sizeof(v), sizeof(v));
        const bool servers = v[0] >= 0 && (v[0] & kServerEntry) != 0 &&
                             (v[0] & ~int64_t{kServerEntry}) >= 1 &&
                             (v[0] & ~int64_t{kServerEntry}) <=
                                 static_cast<int64_t>(manifest_.cluster.servers.size());
        if (v[0] < 0 || (!servers && v[0] >= static_cast<int64_t>(manifest_.cluster.max_workers)) ||
            v[1] < -1 || v[1] > kMaxMemberClock || v[2] < -1 || v[2] > kMaxMemberClock) {
          return InvalidArgument("membership entry " + std::to_string(i) + " (worker " +
                                 std::to_string(v[0]) + ", join " + std::to_string(v[1]) +
                                 ", leave " + std::to_string(v[2]) + ") is out of range");
        }
        members->push_back(MemberEntry{static_cast<uint32_t>(v[0]), v[1], v[2]});
      }
      Membership check = JobMembership(manifest_);
      PARASOL_RETURN_IF_ERROR(check.Merge(*members));
    } else if (KindOf(b) == Kind::kCompleteThrough) {
      uint64_t n = 0, writer = 0;
      std::memcpy(&n, b.bytes.data(), sizeof(n));
      std::memcpy(&writer, b.bytes.data() + sizeof(n), sizeof(writer));
      if (writer == 0) return InvalidArgument("a complete-through block that names no process");
      // Less than the file's own count: written only when it is.
      if (n >= header->sequence) {
        return InvalidArgument("complete-through count " + std::to_string(n) +
                               " is not below the checkpoint's sequence " +
                               std::to_string(header->sequence));
      }
      complete_through_ = n;
      complete_writer_ = writer;
    } else if (KindOf(b) == Kind::kIncarnations) {
      incarnations->resize(b.count);
      std::memcpy(incarnations->data(), b.bytes.data(), b.bytes.size());
    } else if (KindOf(b) == Kind::kBarrier) {
      std::memcpy(barrier, b.bytes.data(), sizeof(*barrier));
      if (*barrier < -1 || *barrier > kMaxCheckpointClock) {
        return InvalidArgument("barrier " + std::to_string(*barrier) + " is out of range");
      }
    } else if (KindOf(b) == Kind::kDenseRange) {
      PARASOL_RETURN_IF_ERROR(CheckDenseRange(manifest_, b));
      const DenseRangeBlock r = ReadDenseRange(b);
      dense_held[b.table] = {SliceRange{r.begin, r.begin + b.count},
                             SliceRange{r.live_begin, r.live_end}};
    } else if (KindOf(b) == Kind::kDenseSlice) {
      const SliceRange cut =
          DenseSlice(manifest_.tables[b.table].NumElements(), shard_,
                     static_cast<uint32_t>(manifest_.cluster.servers.size()));
      dense_held[b.table] = {cut, cut};
    } else if (KindOf(b) == Kind::kPushRecord && !record->Load(b.bytes)) {
      return InvalidArgument("malformed push record");
    } else if (IsPending(KindOf(b))) {
      return CheckPending(b, *clocks, &pending_seen);
    }
    return Status::Ok();
  };
  const Status read = ReadCheckpoint(
      in, name, header,
      [&](CheckpointBlock& b) -> Status {
        PARASOL_RETURN_IF_ERROR(decode(b));
        if (!apply) return Status::Ok();
        PARASOL_RETURN_IF_ERROR(WidenSparseRows(manifest_, &b));
        return ApplyBlock(b, apply);
      },
      check);
  if (read.ok() && header->delta && !delta_seen) {
    return InvalidArgument("checkpoint '" + name + "' is a delta of nothing");
  }
  if (!identity.ok()) return identity.WithContext("checkpoint '" + name + "'");
  PARASOL_RETURN_IF_ERROR(read);
  PARASOL_RETURN_IF_ERROR(CheckHeader(*header).WithContext("checkpoint '" + name + "'"));
  for (size_t t = 0; t < table_seen.size(); ++t) {
    if (!table_seen[t]) {
      return InvalidArgument("checkpoint '" + name + "' has no block of table '" +
                             manifest_.tables[t].name + "'");
    }
  }
  if (!clocks_seen || !record_seen) {
    return InvalidArgument("checkpoint '" + name + "' has no " +
                           (clocks_seen ? "push record" : "worker clocks"));
  }
  // Each dense table holds, and says it serves, the slice the file's own membership and
  // migration state say this shard serves (the workers route by them).
  Membership merged = membership_;
  if (merged.Merge(*members).ok()) {
    for (uint32_t t = 0; t < manifest_.tables.size(); ++t) {
      if (manifest_.tables[t].kind != TableKind::kDense) continue;
      const DenseHeld& d = dense_held[t];
      const SliceRange live =
          LiveDenseSlice(merged, *migration, manifest_.tables[t].NumElements(), shard_);
      const bool empty = live.begin >= live.end;
      const bool says = empty ? d.live.begin >= d.live.end
                              : d.live.begin == live.begin && d.live.end == live.end;
      if ((!empty && !d.held.Contains(live.begin, live.end)) || !says) {
        return InvalidArgument(
            "checkpoint '" + name + "': table '" + manifest_.tables[t].name + "' holds [" +
            std::to_string(d.held.begin) + ", " + std::to_string(d.held.end) + ") and serves [" +
            std::to_string(d.live.begin) + ", " + std::to_string(d.live.end) + "); by its " +
            "membership this shard serves [" + std::to_string(live.begin) + ", " +
            std::to_string(live.end) + ")");
      }
    }
  }
  return Status::Ok();
}

Status ShardState::CheckPending(const CheckpointBlock& b, const std::vector<int64_t>& clocks,
                                std::set<std::tuple<int64_t, uint32_t, int64_t>>* seen) const {
  const int64_t clock = PendingClock(b);
  // A shard applies a clock's sums once every worker has passed it: pending sums are of the
  // slowest worker's clock or later.
  const int64_t slowest = clocks.empty() ? 0 : *std::min_element(clocks.begin(), clocks.end());
  if (clock < slowest || clock > kMaxCheckpointClock) {
    return InvalidArgument("pending sums of clock " + std::to_string(clock) +
                           ", out of range (the slowest worker is at clock " +
                           std::to_string(slowest) + ")");
  }
  const std::string& table = manifest_.tables[b.table].name;
  const int64_t worker = PendingWorker(b);
  if (worker != ClockAggregate::kNoWorker &&
      (worker < 0 || worker >= int64_t{manifest_.cluster.max_workers})) {
    return InvalidArgument("pending sums of table '" + table + "' for clock " +
                           std::to_string(clock) + " of worker " + std::to_string(worker) +
                           "; the manifest has " + std::to_string(manifest_.cluster.max_workers) +
                           " worker ranks");
  }
  if (!seen->insert({clock, b.table, worker}).second) {
    return InvalidArgument("a second block of pending sums of table '" + table + "' for clock " +
                           std::to_string(clock) +
                           (worker == ClockAggregate::kNoWorker
                                ? std::string()
                                : " of worker " + std::to_string(worker)));
  }
  if (!IsPendingSparse(KindOf(b))) return Status::Ok();
  const size_t stride = sizeof(uint64_t) + sizeof(float) * manifest_.tables[b.table].dim;
  const uint64_t prefix = PendingPrefixBytes(KindOf(b));
  std::unordered_set<uint64_t> keys;
  keys.reserve(b.count);
  for (uint64_t i = 0; i < b.count; ++i) {
    uint64_t key;
    std::memcpy(&key, b.bytes.data() + prefix + i * stride, sizeof(key));
    if (!keys.insert(key).second) {
      return InvalidArgument("key " + std::to_string(key) + " twice in the pending sums of " +
                             "table '" + table + "' for clock " + std::to_string(clock));
    }
  }
  return Status::Ok();
}

// Every size is checked again as it is read: the file is read anew, not trusted.
Status ShardState::ApplyBlocks(std::istream& in, const std::string& name,
                               PendingAggregates* pending) {
  CheckpointHeader header;
  return ReadCheckpoint(
      in, name, &header,
      [&](CheckpointBlock& b) -> Status {
        PARASOL_RETURN_IF_ERROR(AddProgress(kCheckpointBlockHeaderBytes + b.bytes.size()));
        PARASOL_RETURN_IF_ERROR(WidenSparseRows(manifest_, &b));
        return ApplyBlock(b, pending);
      },
      [&](const CheckpointBlockHeader& b) { return CheckBlockHeader(manifest_, shard_, b); });
}

Status ShardState::ApplyBlock(CheckpointBlock& b, PendingAggregates* pending) {
  if (KindOf(b) == Kind::kSparseRows) {
    // Applied on the engines while the next block is read (and checked).
    PARASOL_RETURN_IF_ERROR(WaitApplying());
    applying_block_.kind = b.kind;
    applying_block_.table = b.table;
    applying_block_.count = b.count;
    std::swap(applying_block_.bytes, b.bytes);
    applying_ = std::async(std::launch::async, [this] { return ApplySparse(applying_block_); });
    return Status::Ok();
  }
  PARASOL_RETURN_IF_ERROR(WaitApplying());
  if (KindOf(b) == Kind::kRemovedRows) return ApplyRemoved(b);
  if (KindOf(b) == Kind::kDenseSlice || KindOf(b) == Kind::kDenseRange) return ApplyDense(b);
  if (IsPending(KindOf(b))) return ApplyPending(b, pending);
  return Status::Ok();
}

Status ShardState::WaitApplying() {
  if (!applying_.valid()) return Status::Ok();
  try {
    return applying_.get();
  } catch (const std::bad_alloc&) {
    return ResourceExhausted("out of memory while applying rows");
  }
}

Status ShardState::ApplyRemoved(const CheckpointBlock& b) {
  if (b.table >= sparse_.size() || !sparse_[b.table] ||
      b.bytes.size() != b.count * sizeof(uint64_t)) {
    return Internal("removed rows of table " + std::to_string(b.table) + " do not match it");
  }
  SparseTable& t = *sparse_[b.table];
  for (uint32_t e = 0; e < t.engines(); ++e) t.partition(e).FinishRestoredRows();
  for (uint64_t i = 0; i < b.count; ++i) {
    uint64_t key;
    std::memcpy(&key, b.bytes.data() + i * sizeof(key), sizeof(key));
    PARASOL_RETURN_IF_ERROR(t.partition(EngineOfKey(key, t.engines())).EraseKey(key));
  }
  return Status::Ok();
}

Status ShardState::FinishRestoredRows() {
  for (auto& table : sparse_) {
    if (!table) continue;
    std::vector<Status> failed(table->engines());
    auto finish = [&](uint32_t e) {
      try {
        table->partition(e).FinishRestoredRows();
      } catch (const std::bad_alloc&) {
        failed[e] = ResourceExhausted("table '" + table->options().name +
                                      "': out of memory while indexing its rows");
      }
    };
    if (run_engines_ && table->engines() > 1) {
      run_engines_(finish);
    } else {
      for (uint32_t e = 0; e < table->engines(); ++e) finish(e);
    }
    for (const Status& st : failed) PARASOL_RETURN_IF_ERROR(st);
  }
  return Status::Ok();
}

Status ShardState::ApplySparse(const CheckpointBlock& b) {
  if (b.table >= sparse_.size() || !sparse_[b.table]) {
    return Internal("no sparse table " + std::to_string(b.table) + " on this shard");
  }
  SparseTable& t = *sparse_[b.table];
  const size_t row_bytes = sizeof(float) * t.partition(0).stored_floats();
  const size_t stride = sizeof(uint64_t) + row_bytes;
  if (b.bytes.size() / stride != b.count || b.bytes.size() % stride != 0) {
    return Internal("table '" + t.options().name + "' rows do not match the table");
  }
  if (b.count > UINT32_MAX) {
    return InvalidArgument("table '" + t.options().name + "': a block of " +
                           std::to_string(b.count) + " rows, more than a block may hold");
  }
  const uint32_t engines = t.engines();
  // Rows start 8 bytes into the block and every stride is a multiple of 4: each row's floats
  // are aligned where they lie, and are read in place.
  auto key_at = [&](uint64_t i) {
    uint64_t key;
    std::memcpy(&key, b.bytes.data() + i * stride, sizeof(key));
    return key;
  };
  auto row_at = [&](uint64_t i) {
    return reinterpret_cast<const float*>(b.bytes.data() + i * stride + sizeof(uint64_t));
  };
  // Whatever an engine meets (out of memory) comes back as its status, not out of its thread.
  std::vector<Status> failed(engines);
  // Each engine's rows of the block, split here once (not by every engine reading every key).
  std::vector<std::vector<uint32_t>>& rows_of = rows_of_;
  rows_of.resize(engines);
  for (auto& r : rows_of) r.clear();
  if (engines > 1) {
    for (auto& r : rows_of) r.reserve(b.count / engines + 4 * std::sqrt(double(b.count)) + 64);
    for (uint64_t i = 0; i < b.count; ++i) {
      rows_of[EngineOfKey(key_at(i), engines)].push_back(static_cast<uint32_t>(i));
    }
  } else {
    rows_of[0].resize(b.count);
    for (uint64_t i = 0; i < b.count; ++i) rows_of[0][i] = static_cast<uint32_t>(i);
  }
  auto apply_one = [&](uint32_t e) {
    SparseTable::Partition& part = t.partition(e);
    // This engine's rows of the block, restored with the index buckets of the keys ahead
    // prefetched (their cache misses overlap).
    const std::vector<uint32_t>& mine = rows_of[e];
    size_t j = 0;
    // Into an empty partition: appended, the index built at the end (FinishRestoredRows()).
    while (j < mine.size() && part.AppendRestoredRow(key_at(mine[j]), row_at(mine[j]))) ++j;
    // Else one by one, in two stages: a key's index bucket 16 rows ahead, then (its bucket in
    // cache by then) the key of the row in it, which the insert compares, 8 ahead.
    constexpr size_t kIndexAhead = 16, kKeyAhead = 8;
    for (; j < mine.size(); ++j) {
      if (j + kIndexAhead < mine.size()) part.PrefetchIndex(key_at(mine[j + kIndexAhead]));
      if (j + kKeyAhead < mine.size()) part.PrefetchHomeKey(key_at(mine[j + kKeyAhead]));
      part.RestoreRow(key_at(mine[j]), row_at(mine[j]));
    }
  };
  auto apply = [&](uint32_t e) {
    try {
      apply_one(e);
    } catch (const std::bad_alloc&) {
      failed[e] = ResourceExhausted("table '" + t.options().name + "': out of memory");
    } catch (const std::exception& e2) {
      failed[e] = Internal("table '" + t.options().name + "': " + e2.what());
    }
  };
  if (run_engines_ && engines > 1) {
    run_engines_(apply);
  } else {
    for (uint32_t e = 0; e < engines; ++e) apply(e);
  }
  for (const Status& st : failed) PARASOL_RETURN_IF_ERROR(st);
  PARASOL_RETURN_IF_ERROR(AddProgress(0, b.count));
  if (t.tiered()) {
    for (uint32_t e = 0; e < engines; ++e) t.partition(e).Settle();
    PARASOL_RETURN_IF_ERROR(t.DiskStatus().WithContext("table '" + t.options().name + "'"));
  }
  return Status::Ok();
}

Status ShardState::ApplyDense(const CheckpointBlock& b) {
  if (b.table >= dense_.size() || !dense_[b.table]) {
    return Internal("no dense table " + std::to_string(b.table) + " on this shard");
  }
  // The table holds what the block does (a fresh table: nothing else to keep).
  const bool range = KindOf(b) == Kind::kDenseRange;
  if (range && b.bytes.size() < kDenseRangeHeaderBytes) {
    return Internal("table " + std::to_string(b.table) + ": a dense range without its bounds");
  }
  const uint64_t total = dense_[b.table]->total_elements();
  const uint64_t first = range ? ReadDenseRange(b).begin : 0;
  const SliceRange want =
      range ? SliceRange{first, first + b.count}
            : DenseSlice(total, shard_, static_cast<uint32_t>(manifest_.cluster.servers.size()));
  if (want.end > total || want.end < want.begin) {
    return Internal("table " + std::to_string(b.table) + ": a dense range outside the tensor");
  }
  if (dense_[b.table]->slice().begin != want.begin || dense_[b.table]->slice().end != want.end) {
    dense_[b.table] = dense_[b.table]->Resliced(want);
  }
  DenseTable& d = *dense_[b.table];
  const uint64_t n = d.slice().size();
  const uint64_t bytes = b.bytes.size() - (range ? kDenseRangeHeaderBytes : 0);
  if (b.count != n || bytes / sizeof(float) / (1 + d.state_array_count()) != n ||
      bytes % (sizeof(float) * (1 + d.state_array_count())) != 0) {
    return Internal("table '" + d.options().name + "' slice does not match the table");
  }
  d.RestoreArrays(b.bytes.data() + (range ? kDenseRangeHeaderBytes : 0));
  return Status::Ok();
}

Status ShardState::ApplyPending(const CheckpointBlock& b, PendingAggregates* pending) const {
  if (b.bytes.size() < sizeof(int64_t)) {
    return Internal("pending sums of table " + std::to_string(b.table) + " without a clock");
  }
  std::unique_ptr<ClockAggregate>& agg = (*pending)[PendingClock(b)];
  if (!agg) {
    agg = std::make_unique<ClockAggregate>(static_cast<uint32_t>(manifest_.tables.size()),
                                           engines_);
  }
  ClockAggregate::Part& part = agg->PartOf(PendingWorker(b));
  const uint64_t prefix = PendingPrefixBytes(KindOf(b));
  const char* sums = b.bytes.data() + prefix;
  const size_t bytes = b.bytes.size() - prefix;
  if (IsPendingSparse(KindOf(b))) {
    if (b.table >= sparse_.size() || !sparse_[b.table]) {
      return Internal("no sparse table " + std::to_string(b.table) + " on this shard");
    }
    const uint32_t dim = sparse_[b.table]->dim();
    const size_t row_bytes = sizeof(float) * dim;
    const size_t stride = sizeof(uint64_t) + row_bytes;
    if (bytes / stride != b.count || bytes % stride != 0) {
      return Internal("table '" + sparse_[b.table]->options().name +
                      "' pending sums do not match the table");
    }
    for (uint64_t i = 0; i < b.count; ++i) {
      const char* p = sums + i * stride;
      uint64_t key;
      std::memcpy(&key, p, sizeof(key));
      std::memcpy(part.SparseSum(b.table, EngineOfKey(key, engines_), key, dim),
                  p + sizeof(key), row_bytes);
    }
    return Status::Ok();
  }
  if (b.table >= dense_.size() || !dense_[b.table]) {
    return Internal("no dense table " + std::to_string(b.table) + " on this shard");
  }
  const uint64_t n = dense_[b.table]->slice().size();
  if (b.count != n || bytes != n * sizeof(float)) {
    return Internal("table '" + dense_[b.table]->options().name +
                    "' pending sums do not match the slice");
  }
  std::memcpy(part.DenseSum(b.table, n), sums, bytes);
  return Status::Ok();
}

}  // namespace parasol
