// PsClient: a worker's tables on the parameter servers.
//
// A facade over the worker's session with every shard (worker/shard_session.hpp), which sends
// and tracks the requests, resends them, replays to restarted shards and rolls the job back.
// What PsClient adds is the tables:
// - Sparse requests are deduplicated (a key asked for twice is fetched once; gradients of a
//   repeated key are summed), split by shard (worker/key_split.hpp), sent to all shards at
//   once, and reassembled in the caller's key order.
// - Dense tensors are cut into the shards' slices, in chunks of server.frame_bytes.
// - Under SSP with worker.cache_rows, rows are answered from a row cache while the read bound
//   allows (worker/row_cache.hpp).
// - The tools' requests: stats, checkpoints, shutdown, a change of the shard count.
// The session's calls (steps, ticks, barriers, membership, what it knows of failures) are
// passed through unchanged.
//
// Asynchronous calls return a Ticket; Wait(ticket) completes it. Several tickets may be
// outstanding; waiting on any ticket also processes replies for the others.
//
// Thread-safety: none. Use one PsClient per thread (each with its own worker id).
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include <zmq.hpp>

#include "common/env.hpp"
#include "common/key_index.hpp"
#include "common/manifest.hpp"
#include "common/status.hpp"
#include "common/wire.hpp"
#include "worker/key_split.hpp"
#include "worker/request_frames.hpp"
#include "worker/row_cache.hpp"
#include "worker/shard_session.hpp"

namespace parasol {

class PsClient {
 public:
  using Ticket = ShardSession::Ticket;
  using Reply = ShardSession::Reply;
  static constexpr uint32_t kObserver = ShardSession::kObserver;
  static constexpr const char* kOverlapFailNote = ShardSession::kOverlapFailNote;
  static constexpr uint32_t kMaxRollbackRounds = ShardSession::kMaxRollbackRounds;

  // Connects the session (ShardSession::Connect, whose comment says what each argument does).
  static Result<std::unique_ptr<PsClient>> Connect(const Manifest& manifest, uint32_t worker_id,
                                                   const std::string& key_path = "",
                                                   std::function<Status()> wait_interrupt = {},
                                                   bool join = false, Env* env = nullptr);

  PsClient(const PsClient&) = delete;
  PsClient& operator=(const PsClient&) = delete;

  // Table id by name, or NotFound.
  Result<uint32_t> TableId(const std::string& name) const;

  // Rows of `keys` into out[i * dim .. (i + 1) * dim).
  // REQUIRES: `out` holds keys.size() * dim floats and stays valid until Wait() returns.
  // With read_only, keys the shards do not have are read as their initial values and not
  // created (evaluation).
  Result<Ticket> PullSparseAsync(uint32_t table, std::span<const uint64_t> keys, float* out,
                                 bool with_state = false, bool read_only = false);
  // Gradient rows for `keys` (keys.size() * dim floats). Copied before the call returns.
  Result<Ticket> PushSparseAsync(uint32_t table, std::span<const uint64_t> keys,
                                 std::span<const float> grads);
  // The whole tensor into `out` (NumElements() floats).
  // REQUIRES: `out` stays valid until Wait() returns.
  Result<Ticket> PullDenseAsync(uint32_t table, float* out, bool with_state = false);
  // A gradient for the whole tensor. Sent without a copy.
  // REQUIRES: `grads` stays valid and unchanged until Wait() returns.
  Result<Ticket> PushDenseAsync(uint32_t table, std::span<const float> grads);
  // A gradient for the whole tensor, then the tensor into `out` as the shards hold it after
  // applying it (and whatever else they applied before): chunk by chunk, each pull right behind
  // its push, so the weights come down while the gradient still goes up. Under BSP the pull
  // reads the weights before this clock's sums are applied, as any pull of this clock does.
  // REQUIRES: `grads` and `out` stay valid (and `grads` unchanged) until Wait() returns.
  Result<Ticket> PushPullDenseAsync(uint32_t table, std::span<const float> grads, float* out);
  // A pull for a later step, issued before this one has ticked: it carries clock() + ahead
  // (1 for the next step; up to training.prefetch_depth), the clock its rows will be used at,
  // so the shards hold it to the consistency bound of that step (under SSP a prefetch at
  // clock() would read staler than the bound).
  Result<Ticket> PrefetchSparseAsync(uint32_t table, std::span<const uint64_t> keys, float* out,
                                     uint32_t ahead = 1);
  // The caller's sparse keys are deduplicated already (the trainer's are): the client splits
  // them by shard without hashing them again. REQUIRES, while on: no key twice in one call.
  void AssumeUniqueKeys(bool on) { keys_unique_ = on; }

  // The same, waited for.
  Status PullSparse(uint32_t table, std::span<const uint64_t> keys, float* out);
  Status PushSparse(uint32_t table, std::span<const uint64_t> keys, std::span<const float> grads);
  Status PullDense(uint32_t table, float* out);
  Status PushDense(uint32_t table, std::span<const float> grads);
  // A pull that creates no rows (see PullSparseAsync).
  Status PullSparseReadOnly(uint32_t table, std::span<const uint64_t> keys, float* out);
  // Rows with their optimizer state: RowFloats(table) floats per key (values, then state as
  // laid out in server/optimizer.hpp). For checks and exports.
  Status PullSparseWithState(uint32_t table, std::span<const uint64_t> keys, float* out);
  // Each element as [value, state arrays...]: RowFloats(table) floats per element.
  Status PullDenseWithState(uint32_t table, float* out);
  // Floats per key (sparse) or element (dense) of a pull with state.
  uint32_t RowFloats(uint32_t table) const;

  // ---- Tools (observers) ----
  // The stats (JSON) of each shard the newest placement has, in rank order; StatsOf(): one
  // shard's, any listed one (a shard outside the placement holds nothing, and may not run).
  Result<std::vector<std::string>> Stats();
  Result<std::string> StatsOf(uint32_t shard);
  // Asks shard 0 for `servers` shards (worker/reshard.hpp moves the rows); returns the clock
  // the change takes effect at.
  Result<int64_t> ScaleServers(uint32_t servers);
  // Asks every shard to stop.
  Status Shutdown();
  // Asks every shard to write a checkpoint now.
  Status Checkpoint();

  // The row cache (worker.cache_rows, SSP with staleness >= 1; worker/row_cache.hpp): rows
  // answered from it and pulled, and the bytes of sparse rows (keys and values) pulled.
  uint64_t cache_hits() const { return cache_hits_; }
  uint64_t cache_misses() const { return cache_misses_; }
  uint64_t pulled_row_bytes() const {
    return pulled_key_bytes_ + session_->pulled_reply_bytes();
  }

  // ---- The session's, passed through (worker/shard_session.hpp says what each does) ----
  ShardSession& session() { return *session_; }
  const Manifest& manifest() const { return session_->manifest(); }
  uint32_t worker_id() const { return session_->worker_id(); }
  uint32_t num_shards() const { return session_->num_shards(); }
  int Mechanism(uint32_t shard) const { return session_->Mechanism(shard); }
  Env* env() const { return session_->env(); }
  Status Wait(Ticket ticket) { return session_->Wait(ticket); }
  void SetWaitInterrupt(std::function<Status()> check) {
    session_->SetWaitInterrupt(std::move(check));
  }
  Status Idle(std::chrono::milliseconds wait) { return session_->Idle(wait); }
  Result<Reply> Call(uint32_t shard, Header request, std::vector<zmq::message_t> payload) {
    return session_->Call(shard, std::move(request), std::move(payload));
  }
  Ticket CallAsync(uint32_t shard, Header request, std::vector<zmq::message_t> payload) {
    return session_->CallAsync(shard, std::move(request), std::move(payload));
  }
  Result<Reply> Collect(Ticket ticket, uint32_t shard) { return session_->Collect(ticket, shard); }
  Header ToolRequest(Op op, uint32_t table) { return session_->NewRequest(op, table); }
  void BeginStep() { session_->BeginStep(); }
  void SendStep() { session_->SendStep(); }
  int64_t clock() const { return session_->clock(); }
  Status Tick() { return session_->Tick(); }
  Result<Ticket> TickAsync() { return session_->TickAsync(); }
  Status Leave() { return session_->Leave(); }
  Status Barrier(int64_t id) { return session_->Barrier(id); }
  void NoteBarrierPassed(int64_t id) { session_->NoteBarrierPassed(id); }
  const Membership& membership() const { return session_->membership(); }
  Result<int64_t> RequestLeave(int64_t not_before = -1) {
    return session_->RequestLeave(not_before);
  }
  Result<uint64_t> Scale(uint64_t workers, int64_t not_before = -1) {
    return session_->Scale(workers, not_before);
  }
  Status SyncMembership() { return session_->SyncMembership(); }
  uint64_t shard_epoch(uint32_t shard) const { return session_->shard_epoch(shard); }
  uint64_t pushes_acknowledged() const { return session_->pushes_acknowledged(); }
  int64_t resumed_clock() const { return session_->resumed_clock(); }
  bool resumed_done() const { return session_->resumed_done(); }
  bool replay_failed() const { return session_->replay_failed(); }
  bool replay_pending() const { return session_->replay_pending(); }
  const std::string& lost_step() const { return session_->lost_step(); }
  const Status& rolled_back() const { return session_->rolled_back(); }
  uint64_t rollback_generation() const { return session_->rollback_generation(); }
  int64_t last_barrier_seen() const { return session_->last_barrier_seen(); }
  int64_t furthest_known_clock() const { return session_->furthest_known_clock(); }
  uint64_t push_log_bytes() const { return session_->push_log_bytes(); }
  uint64_t push_log_peak_bytes() const { return session_->push_log_peak_bytes(); }
  uint64_t push_log_added_bytes() const { return session_->push_log_added_bytes(); }

 private:
  explicit PsClient(std::unique_ptr<ShardSession> session);

  Result<const TableOptions*> CheckTable(uint32_t table, TableKind kind) const;
  Status CheckDenseGrads(const TableOptions& t, std::span<const float> grads) const;
  // Splits `keys` by the shards of `placement` into `split` (deduplicating unless the caller's
  // keys are unique already).
  void Split(std::span<const uint64_t> keys, const Placement& placement, KeySplit& split);
  // One chunk's request of a dense pull or push, tracked under `ticket`.
  void SendDensePull(Ticket ticket, uint32_t table, uint32_t shard, const SliceRange& chunk,
                     uint32_t dim, bool with_state);
  void SendDensePush(Ticket ticket, uint32_t table, uint32_t shard, const SliceRange& chunk,
                     std::span<const float> grads);
  // The ticket's frames borrow the caller's memory (its tracker made once, then reused).
  static void StartBorrowing(TicketState& p);

  // The row cache: whether it serves this client, the rows a pull answers from it (a unique key
  // answered from it has shard kNoShard in the split), a push's SGD update of the rows it
  // holds, and the rows a finished pull brings.
  bool CacheActive() const;
  void LookUpCached(uint32_t table, uint32_t dim, std::span<const uint64_t> keys,
                    KeySplit& split, TicketState& p);
  void ApplyToCache(uint32_t table, const TableOptions& t, std::span<const uint64_t> keys,
                    std::span<const float> grads);
  void CachePulled(TicketState& p);

  std::unique_ptr<ShardSession> session_;
  ShardSession& s_;  // *session_
  const Manifest& manifest_;  // session_->manifest()
  bool keys_unique_ = false;
  KeyIndex dedup_;
  RowCache cache_;
  int64_t cache_cleared_for_ = -1;  // the shard count change the cache was last emptied for
  uint64_t cache_hits_ = 0;
  uint64_t cache_misses_ = 0;
  uint64_t pulled_key_bytes_ = 0;
  // Scratch of the sparse requests (pulls swap the split's vectors with their ticket's, so the
  // ticket keeps them).
  KeySplit split_, push_split_;
  std::vector<zmq::message_t> payload_;
  std::vector<zmq::message_t> key_bufs_;
  PushFrames push_frames_;
  std::vector<uint8_t> first_seen_;
};

}  // namespace parasol
