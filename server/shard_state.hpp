// ShardState: the part of a shard its checkpoints hold (each table's rows or slice with the
// optimizer state, the workers' clocks, the record of applied pushes, and under BSP the sums
// of the clocks not yet applied), turned into checkpoint blocks (server/checkpoint.hpp) and
// loaded back from them. The pending sums belong with the push record: a push summed into
// them is recorded as applied, so a checkpoint without them would lose it (its resend after a
// restart is answered as a duplicate).
//
// A ShardState borrows the shard's tables, consistency controller, push record and pending
// aggregates; they must outlive it. Load() reads a file twice. The first pass checks
// everything without touching the shard: checksums, every size against the file, every block
// against its table in the manifest (kind, slice, row size), the clocks, push record and
// pending sums for what they claim, and that each table, the clocks and the push record come
// exactly once (the pending sums at most once per clock and table, after the clocks). Only a
// file that passes is read again and applied, so a refused file changes nothing.
// Thread-safety: none; the shard's request thread owns it.
#pragma once

#include <atomic>
#include <chrono>
#include <thread>
#include <cstdint>
#include <functional>
#include <future>
#include <istream>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "common/manifest.hpp"
#include "common/membership.hpp"
#include "common/status.hpp"
#include "server/checkpoint.hpp"
#include "server/clock_aggregate.hpp"
#include "server/consistency_controller.hpp"
#include "server/dense_table.hpp"
#include "server/push_record.hpp"
#include "server/sparse_table.hpp"

namespace parasol {

// What a block of a shard's checkpoint holds (CheckpointBlock::kind).
enum class CheckpointBlockKind : uint32_t {
  kSparseRows = 1,
  kDenseSlice = 2,
  kClocks = 3,
  kPushRecord = 4,
  kPendingSparse = 5,  // BSP: one clock's summed rows of one sparse table
  kPendingDense = 6,   // BSP: one clock's summed slice of one dense table
  kDone = 7,           // count workers x i64: the clock each worker left at, -1 if it has not
  kBarrier = 8,        // count 1 x i64: the newest barrier released, -1 if none
  kIncarnations = 9,   // count workers x u64: each worker's process last heard from, 0 if none
  kMembership = 10,    // count entries x (i64 worker, join, leave): common/membership.hpp
  kMigration = 11,     // count 2 x i64: MigrationState (installed, dropped)
  // A dense table's elements [begin, begin + count), of which [live begin, live end) serve the
  // workers now (the others are held for a change of the shard count): i64 begin, live begin,
  // live end, then as kDenseSlice. Written for any table whose elements are not this shard's
  // slice among every listed shard.
  kDenseRange = 12,
  // A delta's first block: count 1 x (u64 the full checkpoint it builds on, u64 the checkpoint
  // it is applied onto, i64 the shard clock its rows were updated at or after).
  kDeltaOf = 13,
  // A delta's rows of a sparse table removed since the checkpoint before it (evicted, moved
  // away): count keys x u64. At most one per table, before the table's rows (a key removed and
  // created again is in both: removed first, then its new row).
  kRemovedRows = 14,
  // As kSparseRows, written with checkpoint.dtype: bf16: per row the u64 key, the u32 clock
  // word as it is, the row's values and float optimizer state as bf16, then the state words
  // that are no floats (adam's step count) as they are, 32 bits each.
  // Widened into a kSparseRows block as it is read (WidenSparseRows()).
  kSparseRowsBf16 = 15,
  // As kPendingSparse and kPendingDense, for one worker's pushes of the clock: the i64 clock,
  // the i64 worker rank (-1: of no one worker), then the sums. A shard folds the workers' sums
  // in rank order when it applies the clock (server/clock_aggregate.hpp), so it keeps them
  // apart until then, across a restart too. The two kinds above are read as worker -1's.
  kPendingSparseOf = 16,
  kPendingDenseOf = 17,
  // count 1 x (u64 N, u64 the epoch of the process that took it, never 0): every push any
  // process of this shard acknowledged before its checkpoint
  // N began is in this one; the pushes acknowledged later by processes before the one that
  // wrote it may not be. Written only when N is less than the file's sequence: the state was
  // taken while a worker's replay to that restarted process was still owed (those pushes were
  // acknowledged by the process before it, and are only in that worker's log). Absent, N is the
  // file's sequence. A process that restores it says N as its restored_count, by which
  // workers trim their entries of earlier processes (worker/push_log.hpp), and the writer's
  // epoch as restored_writer, for their loss check (parasol_sim --elastic --seed 7053).
  kCompleteThrough = 18,
};

// A block of sparse rows, either width.
inline bool IsSparseRows(CheckpointBlockKind kind) {
  return kind == CheckpointBlockKind::kSparseRows || kind == CheckpointBlockKind::kSparseRowsBf16;
}

// Turns a kSparseRowsBf16 block (its size checked by CheckBlockHeader()) into the kSparseRows
// block of the same rows, widened; any other block is left as it is.
Status WidenSparseRows(const Manifest& manifest, CheckpointBlock* b);

// What a delta checkpoint holds besides the rows (ShardState::Save()).
struct DeltaSpec {
  uint64_t base = 0;      // the full checkpoint of the chain
  uint64_t previous = 0;  // the checkpoint it is applied onto
  // Rows whose stored clock word is at least this are written (a table whose rows keep no
  // clock writes them all).
  uint32_t since = 0;
  // Per table id: the keys removed since the previous checkpoint.
  std::vector<std::vector<uint64_t>> removed;
};

// The bytes before a kDenseRange block's arrays.
inline constexpr uint64_t kDenseRangeHeaderBytes = 3 * sizeof(int64_t);

// Where a shard stands in the newest change of the job's shard count (server/shard_server.hpp):
// the clock of the newest change whose gained rows it has committed, and of the newest whose
// lost rows it has dropped (-1: none).
struct MigrationState {
  int64_t installed = -1;
  int64_t dropped = -1;
  bool operator==(const MigrationState&) const = default;
};

// A kDenseRange block's bounds and arrays. REQUIRES: CheckBlockHeader() passed.
struct DenseRangeBlock {
  uint64_t begin = 0, live_begin = 0, live_end = 0;
  const char* arrays = nullptr;
};
DenseRangeBlock ReadDenseRange(const CheckpointBlock& b);
// Refuses bounds outside the tensor, or live elements outside the block's.
Status CheckDenseRange(const Manifest& manifest, const CheckpointBlock& b);

// The placement a shard serves its workers by now: the one after the newest change of the
// shard count once it has committed the change, the one before it until then.
const Placement& LivePlacement(const Membership& membership, const MigrationState& migration);
// The slice of a dense tensor of `total` elements that shard `shard` serves from now.
inline SliceRange LiveDenseSlice(const Membership& membership, const MigrationState& migration,
                                 uint64_t total, uint32_t shard) {
  return LivePlacement(membership, migration).DenseSliceOf(total, shard);
}

// The largest clock a checkpoint may carry: far past any job, and low enough that the clock
// arithmetic of the shard (a clock plus a staleness or a checkpoint period) cannot overflow.
inline constexpr int64_t kMaxCheckpointClock = int64_t{1} << 62;

// Whether a block header agrees with `manifest` for shard `shard`: a known kind, a table of
// that kind, and the sizes the table implies (sparse rows: bytes = count x (key + clock word +
// row floats); dense slice: count = this shard's slice, bytes = count x (1 + state arrays)
// floats; clocks: count = workers, bytes = count x 8; pending sums: an 8-byte clock, then
// count x (key + dim floats) of a sparse table or count = this shard's slice floats of a dense
// one), products checked for overflow. Says what disagrees.
Status CheckBlockHeader(const Manifest& manifest, uint32_t shard,
                        const CheckpointBlockHeader& block);

class ShardState {
 public:
  // `sparse` and `dense` are indexed by table id (null where the table is of the other kind),
  // built from manifest.tables for shard `shard`, as ShardServer holds them. `pending` are the
  // shard's BSP aggregates, each built for `engines` engines (the tables' engine count).
  ShardState(const Manifest& manifest, uint32_t shard,
             std::vector<std::unique_ptr<SparseTable>>& sparse,
             std::vector<std::unique_ptr<DenseTable>>& dense, ConsistencyController& controller,
             PushRecord& record, PendingAggregates& pending, uint32_t engines,
             Membership& membership, MigrationState* migration = nullptr,
             std::function<bool(uint64_t)> keeps_key = nullptr);

  // Every table, the clocks, the push record and the pending sums, as blocks for
  // WriteCheckpointFile().
  // Fails when a tiered table's disk rows cannot be read (no checkpoint may miss rows).
  Result<std::vector<CheckpointBlock>> Save() const;
  // The same, block by block into `sink` (a table's rows in blocks of at most
  // kRowBlockBytes), so that a checkpoint of a table larger than memory streams to its file.
  // `delta`: only what a delta holds (DeltaSpec); the header says delta.
  Status Save(const CheckpointBlockSink& sink, size_t row_block_bytes = kRowBlockBytes,
              const DeltaSpec* delta = nullptr) const;
  static constexpr size_t kRowBlockBytes = 64 << 20;

  // Loads the checkpoint in `in` (`name` names it in errors) and sets *header. Refuses a file
  // of another shard, layout or manifest, and any damaged or inconsistent one, naming what is
  // wrong and where; a refused file changes nothing. Nothing throws out of it: running out of
  // memory while applying comes back as kResourceExhausted, with the tables partly loaded
  // (reset them before trying another file).
  // The file's pending sums replace the shard's aggregates.
  // REQUIRES: the tables hold no rows yet (restored rows would mix with them).
  // `check_first`: true reads the file twice, checking all of it before applying anything (a
  // refused file changes nothing); false reads it once, each block applied once it is checked
  // (a refused file leaves the tables partly loaded: reset them before trying another file),
  // which is what a restarting shard does.
  // A block of rows is applied on the engines (set_engine_runner()) while the next is read.
  // `onto`: the sequence of the checkpoint the tables hold (0: none, they are empty); a delta
  // is taken only onto the checkpoint it names, a full checkpoint only onto nothing.
  Status Load(std::istream& in, const std::string& name, CheckpointHeader* header,
              bool check_first = true, uint64_t onto = 0);

  // Runs fn(e) for every engine e and returns when all are done (the shard's EnginePool).
  // Set, Load() applies each block of rows on the engines (in parallel where their threads
  // are free), each engine its own partitions' rows; unset, on the calling thread.
  using EngineRunner = std::function<void(const std::function<void(uint32_t)>&)>;
  void set_engine_runner(EngineRunner run) { run_engines_ = std::move(run); }
  // What Load() has done so far, readable from any thread while it runs: bytes of the file
  // read (each byte counts twice: once checked, once applied), and rows in the file (known
  // once the first pass is done) and rows applied.
  struct LoadProgress {
    std::atomic<uint64_t> bytes_done{0};
    std::atomic<uint64_t> bytes_total{0};  // what bytes_done goes to (set as the load starts)
    std::atomic<uint64_t> rows_total{0};
    std::atomic<uint64_t> rows_done{0};
    // Set from any thread: the load stops at its next block (Unavailable), the tables partly
    // loaded (the shard then stops without writing anything).
    std::atomic<bool> cancel{false};
    // Once it is done: how long each pass took.
    double seconds_checking = 0, seconds_applying = 0;
  };
  void set_progress(LoadProgress* progress) { progress_ = progress; }
  // A delta loaded must name this full checkpoint as its chain's (0: not checked).
  void set_expected_base(uint64_t base) { expected_base_ = base; }
  // Each block of the file waits this long before it is checked, and again before it is
  // applied (a test's stand-in for a huge table's load).
  void set_block_delay(std::chrono::milliseconds delay) { block_delay_ = delay; }
  // The shard's time (its Env's): workers that joined are heard from as of then.
  void set_now(std::chrono::steady_clock::time_point now) { now_ = now; }
  // Save(): the count the checkpoint holds every acknowledged push before
  // (CheckpointBlockKind::kCompleteThrough), when less than its sequence (unset: none).
  // `writer`: the epoch of the shard process taking it (a worker that trimmed its log by that
  // process's own counts lost nothing to a restart from it).
  void set_complete_through(std::optional<uint64_t> n, uint64_t writer = 0) {
    complete_through_ = n;
    complete_writer_ = writer;
  }
  // After Load(): that count, as the file says it (unset: the file's sequence).
  std::optional<uint64_t> complete_through() const { return complete_through_; }
  uint64_t complete_writer() const { return complete_writer_; }  // 0 when unset

 private:
  Status CheckHeader(const CheckpointHeader& h) const;
  // The first pass: checks the whole file, decodes the clocks and the push record.
  // `sparse_rows`: per table, the rows the file holds. `apply`: each block is applied once it
  // is checked, pending sums into *apply (null: only checked).
  Status Verify(std::istream& in, const std::string& name, CheckpointHeader* header,
                PendingAggregates* apply, uint64_t onto,
                std::vector<uint64_t>* sparse_rows, std::vector<int64_t>* clocks,
                std::vector<int64_t>* done, int64_t* barrier,
                std::vector<int64_t>* incarnations, PushRecord* record,
                std::vector<MemberEntry>* members, MigrationState* migration);
  // The second pass: the rows and slices into the tables, the pending sums into `pending`.
  Status ApplyBlocks(std::istream& in, const std::string& name, PendingAggregates* pending);
  Status ApplySparse(const CheckpointBlock& b);
  // A checked block into the tables (rows, slices) or *pending (sums). A block of rows is
  // taken (its bytes swapped out) and applied on the engines in the background while the
  // caller reads on; WaitApplying() returns its status.
  Status ApplyBlock(CheckpointBlock& b, PendingAggregates* pending);
  Status WaitApplying();
  std::future<Status> applying_;
  CheckpointBlock applying_block_;
  // ApplySparse()'s rows of a block by engine, kept from block to block (its memory touched
  // once per restore, not once per block).
  std::vector<std::vector<uint32_t>> rows_of_;
  // Builds the indexes of the rows ApplySparse() appended (on the engines).
  Status FinishRestoredRows();
  // A delta's removed rows: taken out of the table.
  Status ApplyRemoved(const CheckpointBlock& b);
  Status ApplyDense(const CheckpointBlock& b);
  // A dense table's block: a kDenseSlice of the listed shards' cut, or a kDenseRange.
  Status SaveDense(uint32_t t, const CheckpointBlockSink& sink) const;
  Status ApplyPending(const CheckpointBlock& b, PendingAggregates* pending) const;
  // A pending block's clock (at or after the slowest of `clocks`, once per table) and keys.
  Status CheckPending(const CheckpointBlock& b, const std::vector<int64_t>& clocks,
                      std::set<std::tuple<int64_t, uint32_t, int64_t>>* seen) const;
  Status SavePending(const CheckpointBlockSink& sink) const;

  const Manifest& manifest_;
  const uint32_t shard_;
  const uint64_t fingerprint_;
  std::vector<std::unique_ptr<SparseTable>>& sparse_;
  std::vector<std::unique_ptr<DenseTable>>& dense_;
  ConsistencyController& controller_;
  PushRecord& record_;
  PendingAggregates& pending_;
  const uint32_t engines_;
  Membership& membership_;
  MigrationState* migration_;
  // Which sparse rows a checkpoint holds (null: all).
  std::function<bool(uint64_t)> keeps_key_;
  EngineRunner run_engines_;
  LoadProgress* progress_ = nullptr;
  uint64_t expected_base_ = 0;
  std::optional<uint64_t> complete_through_;
  uint64_t complete_writer_ = 0;
  std::chrono::milliseconds block_delay_{0};
  std::chrono::steady_clock::time_point now_ = std::chrono::steady_clock::now();
  // Unavailable once the load is cancelled (LoadProgress::cancel).
  Status AddProgress(uint64_t bytes, uint64_t rows = 0) const {
    if (block_delay_.count() > 0 && bytes > 0) std::this_thread::sleep_for(block_delay_);
    if (!progress_) return Status::Ok();
    progress_->bytes_done.fetch_add(bytes, std::memory_order_relaxed);
    if (rows) progress_->rows_done.fetch_add(rows, std::memory_order_relaxed);
    if (progress_->cancel.load(std::memory_order_relaxed)) {
      return Unavailable("the load of the checkpoint was stopped");
    }
    return Status::Ok();
  }
};

}  // namespace parasol
