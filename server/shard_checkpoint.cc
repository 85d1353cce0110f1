// The checkpoint side of ShardServer: writing its tables, clocks, push record and pending BSP
// sums, and loading them back.
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <exception>
#include <filesystem>
#include <fstream>
#include <limits>
#include <new>

#include "server/checkpoint.hpp"
#include "server/shard_server.hpp"
#include "server/shard_state.hpp"

namespace parasol {

Status ShardServer::SaveCheckpoint(const std::string& reason, bool final) {
  const CheckpointOptions& c = manifest_.checkpoint;
  if (c.dir.empty()) return FailedPrecondition("no checkpoint.dir in the manifest");
  FinishDeferredApply();  // a checkpoint holds whole clocks
  const auto start = std::chrono::steady_clock::now();
  std::function<bool(uint64_t)> keeps;
  if (!membership_.server_changes().empty() || staged_rows_) {
    keeps = [this](uint64_t key) { return KeepsKey(key); };
  }
  const ShardState state(manifest_, rank_, sparse_, dense_, controller_, push_record_, aggregates_,
                         engines_.size(), membership_, &migration_, std::move(keeps));
  uint64_t bytes = 0;

  CheckpointHeader h;
  h.shard = rank_;
  h.shards = num_shards_;
  h.fingerprint = fingerprint_;
  // Every push of the clocks before the slowest worker's is in; with every worker done (or
  // none live), everything is.
  const int64_t min_clock = controller_.MinClock();
  h.clock = min_clock != std::numeric_limits<int64_t>::max() ? min_clock : controller_.MaxClock();
  // The count in replies moves on only once the file is in place: workers drop from their
  // logs what a checkpoint holds, so a failed one must not look written.
  h.sequence = checkpoint_sequence_ + 1;
  h.final = final;
  const std::string path = CheckpointPath(c.dir, rank_, h.sequence);
  // Streamed: each block is written as the state produces it (a tiered table's rows need not
  // fit in memory).
  const Status st = WriteCheckpointFile(path, h, [&](const CheckpointBlockSink& sink) {
    return state.Save([&](const CheckpointBlock& b) {
      bytes += b.bytes.size();
      return sink(b);
    });
  });
  if (!st.ok()) {
    checkpoint_owed_ = true;  // retried by MaybeCheckpoint() in a second
    last_checkpoint_failure_ = std::chrono::steady_clock::now();
    return st;
  }
  checkpoint_sequence_ = h.sequence;
  checkpoint_owed_ = false;
  PruneCheckpoints(c.dir, rank_, c.keep);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  ++counters_.checkpoints;
  last_checkpoint_ = std::chrono::steady_clock::now();
  saved_stamp_ = StateStamp();
  std::fill(pushed_since_checkpoint_.begin(), pushed_since_checkpoint_.end(), 0);
  checkpoint_clock_ = h.clock;
  spdlog::info("shard {}: checkpoint {} ({}) at clock {}: {:.1f} MB in {:.3f} s", rank_, path,
               reason, h.clock, bytes / 1e6, seconds);
  return Status::Ok();
}

// Never throws: Restore() tries the next file on any error.
Status ShardServer::LoadCheckpoint(const std::string& path) {
  try {
    std::ifstream in(path, std::ios::binary);
    if (!in) return NotFound("cannot read checkpoint '" + path + "': " + std::strerror(errno));
    ShardState state(manifest_, rank_, sparse_, dense_, controller_, push_record_, aggregates_,
                     engines_.size(), membership_, &migration_);
    CheckpointHeader h;
    PARASOL_RETURN_IF_ERROR(state.Load(in, path, &h));
    gains_rows_ = GainsRows();
    SettleUninvolved();
    if (!Entered()) {
      // Serving nothing, this shard is owed no replay: every push it took is in this
      // checkpoint, or (rows it held before a change) on the shards that hold them now.
      for (uint32_t w = 0; w < membership_.max_ranks(); ++w) (void)controller_.AbandonReplay(w);
    }
    checkpoint_sequence_ = h.sequence;
    restored_sequence_ = h.sequence;
    checkpoint_clock_ = h.clock;
    if (h.final) {
      // The shard had stopped cleanly: its workers' clocks are as they were, and nothing is due.
      for (uint32_t w = 0; w < membership_.max_ranks(); ++w) (void)controller_.AbandonReplay(w);
    }
    return Status::Ok();
  } catch (const std::bad_alloc&) {
    return ResourceExhausted("out of memory while loading checkpoint '" + path + "'");
  } catch (const std::exception& e) {
    return Internal("while loading checkpoint '" + path + "': " + e.what());
  }
}

Status ShardServer::Restore() {
  const CheckpointOptions& c = manifest_.checkpoint;
  if (c.dir.empty() || !c.restore) return Status::Ok();
  const std::vector<std::string> files = ListCheckpoints(c.dir, rank_);
  for (const std::string& path : files) {
    const Status st = LoadCheckpoint(path);
    if (st.ok()) {
      spdlog::info("shard {}: restored {} (worker clocks from it)", rank_, path);
      restored_from_ = path;
      return Status::Ok();
    }
    spdlog::error("shard {}: refused checkpoint: {}; trying the one before", rank_, st.ToString());
    // A partly loaded table would be wrong: start the tables again before the next try.
    try {
      PARASOL_RETURN_IF_ERROR(ResetTables());
    } catch (const std::exception& e) {
      return ResourceExhausted(
          "shard " + std::to_string(rank_) +
          ": cannot allocate the tables again after a refused checkpoint: " + e.what());
    }
  }
  if (!files.empty()) {
    return FailedPrecondition("shard " + std::to_string(rank_) + ": none of the " +
                              std::to_string(files.size()) + " checkpoints in " + c.dir +
                              " could be loaded");
  }
  // No checkpoint yet. If this shard ran before (its mark is there), it died before its first
  // checkpoint: every worker's clock counts as restored at 0, so that only its replay (which
  // holds everything it pushed) moves it, not a tick that was on its way to the old process.
  const std::string mark = c.dir + "/shard-" + std::to_string(rank_) + "/started";
  std::error_code ec;
  if (std::filesystem::exists(mark, ec)) {
    for (uint32_t w = 0; w < membership_.max_ranks(); ++w) controller_.SetClock(w, 0);
    spdlog::warn("shard {}: restarted before its first checkpoint; the workers replay everything",
                 rank_);
    return Status::Ok();
  }
  std::filesystem::create_directories(std::filesystem::path(mark).parent_path(), ec);
  std::ofstream(mark) << "started\n";
  return Status::Ok();
}

void ShardServer::MaybeCheckpoint() {
  const CheckpointOptions& c = manifest_.checkpoint;
  if (c.dir.empty()) return;
  bool due = false;
  std::string reason;
  if (c.every_steps > 0 && controller_.live_workers() > 0) {
    const int64_t clock = controller_.MinClock();
    // At a clock boundary: every push of earlier clocks is applied (under BSP, too).
    // clock - checkpoint_clock_ cannot overflow: clock >= 0 and checkpoint_clock_ >= -1.
    if (clock < std::numeric_limits<int64_t>::max() &&
        clock - checkpoint_clock_ >= int64_t(c.every_steps) &&
        clock % int64_t(c.every_steps) == 0 && aggregates_.empty()) {
      due = true;
      reason = "every " + std::to_string(c.every_steps) + " steps";
    }
  }
  if (c.every_seconds > 0 &&
      std::chrono::steady_clock::now() - last_checkpoint_ > std::chrono::seconds(c.every_seconds)) {
    if (StateStamp() == saved_stamp_) {
      last_checkpoint_ = std::chrono::steady_clock::now();  // nothing new to save
    } else {
      due = true;
      reason = "every " + std::to_string(c.every_seconds) + " s";
    }
  }
  // A checkpoint that had to be written (a worker restarted, every worker left, the push log
  // bound) and failed is tried again every second.
  if (checkpoint_owed_ &&
      std::chrono::steady_clock::now() - last_checkpoint_failure_ > std::chrono::seconds(1)) {
    due = true;
    reason = "retrying the one that failed";
  }
  // Bounds each worker's push log (checkpoint.max_log_bytes): what it pushed here since the
  // last checkpoint is what it would have to replay.
  const uint64_t log_share = c.max_log_bytes / (2 * uint64_t{num_shards_});
  for (uint32_t w = 0; w < pushed_since_checkpoint_.size() && !due && !checkpoint_owed_; ++w) {
    if (pushed_since_checkpoint_[w] >= log_share) {
      due = true;
      reason = "worker " + std::to_string(w) + " pushed " +
               std::to_string(pushed_since_checkpoint_[w]) +
               " bytes since the last one (checkpoint.max_log_bytes)";
    }
  }
  if (!due) return;
  if (Status st = SaveCheckpoint(reason); !st.ok()) {
    spdlog::error("shard {}: checkpoint failed: {}", rank_, st.ToString());
    last_checkpoint_ = std::chrono::steady_clock::now();  // retry at the next period, not now
  }
}

}  // namespace parasol
