// The checkpoint side of ShardServer: writing its tables and clocks, and loading them back.
#include <spdlog/spdlog.h>

#include <cstring>

#include "server/checkpoint.hpp"
#include "server/shard_server.hpp"

namespace parasol {
namespace {

constexpr uint32_t kSparseBlock = 1, kDenseBlock = 2, kClockBlock = 3, kDedupBlock = 4;

template <typename T>
void Append(std::vector<char>& out, const T& v) {
  const char* p = reinterpret_cast<const char*>(&v);
  out.insert(out.end(), p, p + sizeof(T));
}

}  // namespace

Status ShardServer::SaveCheckpoint(const std::string& reason) {
  const CheckpointOptions& c = manifest_.checkpoint;
  if (c.dir.empty()) return FailedPrecondition("no checkpoint.dir in the manifest");
  const auto start = std::chrono::steady_clock::now();
  std::vector<CheckpointBlock> blocks;
  uint64_t bytes = 0;
  for (uint32_t t = 0; t < manifest_.tables.size(); ++t) {
    CheckpointBlock b;
    b.table = t;
    if (sparse_[t]) {
      b.kind = kSparseBlock;
      for (uint32_t e = 0; e < engines_.size(); ++e) {
        const SparseTable::Partition& part = sparse_[t]->partition(e);
        const size_t row_bytes = sizeof(float) * part.stored_floats();
        b.bytes.reserve(b.bytes.size() + part.rows() * (8 + row_bytes));
        part.ForEachRow([&](uint64_t key, const float* row) {
          Append(b.bytes, key);
          const char* p = reinterpret_cast<const char*>(row);
          b.bytes.insert(b.bytes.end(), p, p + row_bytes);
          ++b.count;
        });
      }
    } else {
      b.kind = kDenseBlock;
      DenseTable& d = *dense_[t];
      const uint64_t n = d.slice().size();
      b.count = n;
      std::shared_ptr<const float[]> values = d.Share();
      const char* v = reinterpret_cast<const char*>(values.get());
      b.bytes.insert(b.bytes.end(), v, v + n * sizeof(float));
      for (uint32_t a = 0; a < d.state_array_count(); ++a) {
        const char* s = reinterpret_cast<const char*>(d.state_arrays()[a]);
        b.bytes.insert(b.bytes.end(), s, s + n * sizeof(float));
      }
    }
    bytes += b.bytes.size();
    blocks.push_back(std::move(b));
  }
  CheckpointBlock clocks;
  clocks.kind = kClockBlock;
  clocks.count = controller_.clocks().size();
  for (int64_t clock : controller_.clocks()) Append(clocks.bytes, clock);
  blocks.push_back(std::move(clocks));
  // Which pushes are in this checkpoint: a push resent after a restart is applied once.
  CheckpointBlock dedup;
  dedup.kind = kDedupBlock;
  dedup.bytes = dedup_.Save();
  blocks.push_back(std::move(dedup));

  CheckpointHeader h;
  h.shard = rank_;
  h.shards = num_shards_;
  h.fingerprint = fingerprint_;
  h.clock = controller_.live_workers() ? controller_.MinClock() : controller_.MaxClock();
  h.sequence = ++checkpoint_sequence_;
  const std::string path = CheckpointPath(c.dir, rank_, h.sequence);
  PARASOL_RETURN_IF_ERROR(WriteCheckpointFile(path, h, blocks));
  PruneCheckpoints(c.dir, rank_, c.keep);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  ++counters_.checkpoints;
  last_checkpoint_ = std::chrono::steady_clock::now();
  checkpoint_clock_ = h.clock;
  spdlog::info("shard {}: checkpoint {} ({}) at clock {}: {:.1f} MB in {:.3f} s", rank_, path,
               reason, h.clock, bytes / 1e6, seconds);
  return Status::Ok();
}

Status ShardServer::LoadCheckpoint(const std::string& path) {
  CheckpointHeader h;
  // Verify the whole file before touching a table, so a damaged one changes nothing.
  PARASOL_RETURN_IF_ERROR(
      ReadCheckpointFile(path, &h, [](const CheckpointBlock&) { return Status::Ok(); }));
  if (h.shard != rank_ || h.shards != num_shards_ || h.fingerprint != fingerprint_) {
    return FailedPrecondition("checkpoint '" + path + "' belongs to shard " +
                              std::to_string(h.shard) + " of " + std::to_string(h.shards) +
                              " of another manifest or layout");
  }
  return ReadCheckpointFile(path, &h, [&](const CheckpointBlock& b) -> Status {
    if (b.kind == kClockBlock) {
      for (uint64_t w = 0; w < b.count && w < controller_.clocks().size(); ++w) {
        int64_t clock;
        std::memcpy(&clock, b.bytes.data() + w * 8, 8);
        controller_.SetClock(static_cast<uint32_t>(w), clock);
      }
      return Status::Ok();
    }
    if (b.kind == kDedupBlock) {
      if (!dedup_.Load(b.bytes)) return InvalidArgument("malformed push record in " + path);
      return Status::Ok();
    }
    if (b.table >= manifest_.tables.size()) return InvalidArgument("unknown table in " + path);
    if (b.kind == kSparseBlock && sparse_[b.table]) {
      SparseTable& t = *sparse_[b.table];
      const size_t row_bytes = sizeof(float) * t.partition(0).stored_floats();
      if (b.bytes.size() != b.count * (8 + row_bytes)) {
        return InvalidArgument("table '" + t.options().name + "' rows do not match " + path);
      }
      std::vector<float> row(row_bytes / sizeof(float));
      for (uint32_t e = 0; e < engines_.size(); ++e) {
        t.partition(e).Reserve(b.count / engines_.size() + b.count / 20 + 16);
      }
      for (uint64_t i = 0; i < b.count; ++i) {
        const char* p = b.bytes.data() + i * (8 + row_bytes);
        uint64_t key;
        std::memcpy(&key, p, 8);
        std::memcpy(row.data(), p + 8, row_bytes);
        t.partition(EngineOfKey(key, engines_.size())).RestoreRow(key, row.data());
      }
      return Status::Ok();
    }
    if (b.kind == kDenseBlock && dense_[b.table]) {
      DenseTable& d = *dense_[b.table];
      const uint64_t n = d.slice().size();
      if (b.count != n || b.bytes.size() != n * sizeof(float) * (1 + d.state_array_count())) {
        return InvalidArgument("table '" + d.options().name + "' slice does not match " + path);
      }
      std::memcpy(d.PrepareWrite(), b.bytes.data(), n * sizeof(float));
      for (uint32_t a = 0; a < d.state_array_count(); ++a) {
        std::memcpy(d.state_arrays()[a], b.bytes.data() + (1 + a) * n * sizeof(float),
                    n * sizeof(float));
      }
      return Status::Ok();
    }
    return InvalidArgument("block of table " + std::to_string(b.table) + " in " + path +
                           " does not match the table's kind");
  });
}

Status ShardServer::Restore() {
  const CheckpointOptions& c = manifest_.checkpoint;
  if (c.dir.empty() || !c.restore) return Status::Ok();
  const std::vector<std::string> files = ListCheckpoints(c.dir, rank_);
  for (const std::string& path : files) {
    Status st = LoadCheckpoint(path);
    if (st.ok()) {
      const std::string name = path.substr(path.rfind("ckpt-") + 5);
      checkpoint_sequence_ = std::stoull(name);
      CheckpointHeader h;
      (void)ReadCheckpointFile(path, &h, [](const CheckpointBlock&) { return Status::Ok(); });
      checkpoint_clock_ = h.clock;
      spdlog::info("shard {}: restored {} (worker clocks from it)", rank_, path);
      restored_from_ = path;
      return Status::Ok();
    }
    spdlog::error("shard {}: refused checkpoint: {}; trying the one before", rank_, st.ToString());
    // A partly loaded table would be wrong: start the tables again before the next try.
    ResetTables();
  }
  if (!files.empty()) {
    return FailedPrecondition("shard " + std::to_string(rank_) + ": none of the " +
                              std::to_string(files.size()) + " checkpoints in " + c.dir +
                              " could be loaded");
  }
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
    if (clock < std::numeric_limits<int64_t>::max() && clock >= checkpoint_clock_ + int64_t(c.every_steps) &&
        clock % int64_t(c.every_steps) == 0 && aggregates_.empty()) {
      due = true;
      reason = "every " + std::to_string(c.every_steps) + " steps";
    }
  }
  if (c.every_seconds > 0 &&
      std::chrono::steady_clock::now() - last_checkpoint_ > std::chrono::seconds(c.every_seconds)) {
    due = true;
    reason = "every " + std::to_string(c.every_seconds) + " s";
  }
  if (!due) return;
  if (Status st = SaveCheckpoint(reason); !st.ok()) {
    spdlog::error("shard {}: checkpoint failed: {}", rank_, st.ToString());
    last_checkpoint_ = std::chrono::steady_clock::now();  // retry at the next period, not now
  }
}

}  // namespace parasol
