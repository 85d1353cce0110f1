// PsClient: a worker's connection to every server shard.
//
// Holds one DEALER socket per shard. Sparse requests are deduplicated (a key asked for twice is
// fetched once; gradients of a repeated key are summed), split by shard, sent to all shards at
// once, and reassembled in the caller's key order. Dense tensors are cut into the shards'
// slices. Every request carries (worker id, incarnation, sequence number); a request with no
// reply within cluster.request_timeout is resent with the same numbers, and the shard applies a
// resent push only once.
//
// Asynchronous calls return a Ticket; Wait(ticket) completes it. Several tickets may be
// outstanding; waiting on any ticket also processes replies for the others.
//
// Thread-safety: none. Use one PsClient per thread (each with its own worker id).
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <tuple>
#include <vector>

#include <zmq.hpp>

#include "common/curve_keys.hpp"
#include "common/env.hpp"
#include "common/key_index.hpp"
#include "common/manifest.hpp"
#include "common/sharding.hpp"
#include "common/status.hpp"
#include "common/transport.hpp"
#include "common/wire.hpp"
#include "worker/push_log.hpp"
#include "worker/membership_relay.hpp"
#include "worker/request_frames.hpp"
#include "worker/request_tracker.hpp"
#include "worker/restore_watch.hpp"
#include "worker/shard_recovery.hpp"
#include "worker/row_cache.hpp"
#include "worker/step_batch.hpp"

namespace parasol {

class PsClient {
 public:
  using Ticket = uint64_t;

  // The worker id of tools that only read (stats, shutdown, exports): outside the job, so its
  // pulls are not bound by the consistency mode and it may not push.
  static constexpr uint32_t kObserver = 0xffffffffu;

  // Connects to every shard and completes the Hello handshake (protocol version and manifest
  // fingerprint must match), waiting up to cluster.connect_timeout for shards to come up.
  // With security.curve, the client authenticates with the key pair `key_path` (default:
  // security.worker_keys[worker_id] for a job worker when that list is set, else
  // security.client_key) and checks each server's public key.
  // `wait_interrupt`: as SetWaitInterrupt(), from the handshake on.
  // `join`: rank `worker_id` (below cluster.max_workers) joins the running job: shard 0 names the
  // clock it starts at (resumed_clock() then says which), and every shard learns it.
  // `env`: where the time, the incarnation and the connections come from (Env::Real() if null).
  // Under training.on_overlapping_failure: rollback, a worker of the job first completes a
  // rollback shard 0 has made; and when its Hellos show that two failures overlapped (a shard
  // lost its updates, or lost_step()), it rolls the job back and connects again (`rounds`:
  // how many times so far). Under `fail` that is an error.
  static Result<std::unique_ptr<PsClient>> Connect(const Manifest& manifest, uint32_t worker_id,
                                                   const std::string& key_path = "",
                                                   std::function<Status()> wait_interrupt = {},
                                                   bool join = false, Env* env = nullptr,
                                                   uint32_t rounds = 0);
  // Ends the error of a Connect that found lost updates under on_overlapping_failure: fail.
  static constexpr const char* kOverlapFailNote = " (training.on_overlapping_failure: fail)";
  // The most rollbacks one Connect makes or follows before it gives up.
  static constexpr uint32_t kMaxRollbackRounds = 8;

  // The security mechanism of the connection to `shard` (ZMQ_NULL, ZMQ_CURVE, ...).
  int Mechanism(uint32_t shard) const;

  ~PsClient();
  PsClient(const PsClient&) = delete;
  PsClient& operator=(const PsClient&) = delete;

  const Manifest& manifest() const { return manifest_; }
  uint32_t worker_id() const { return worker_id_; }
  uint32_t num_shards() const { return num_shards_; }
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

  // Completes `ticket`: its result, or the first error of any shard, naming the shard.
  Status Wait(Ticket ticket);
  // Called while Wait() (and Connect's handshake, Stats()) waits, at least every 100 ms: an
  // error it returns ends the wait with that error and leaves the ticket outstanding (a later
  // Wait on it completes it). For callers that must react to a signal while they wait (the
  // Python module's Ctrl-C). It may also throw; the client is then left as after an error.
  void SetWaitInterrupt(std::function<Status()> check) { wait_interrupt_ = std::move(check); }

  Status PullSparse(uint32_t table, std::span<const uint64_t> keys, float* out);
  // A pull for a later step, issued before this one has ticked: it carries clock() + ahead
  // (1 for the next step; up to training.prefetch_depth), the clock its rows will be used at,
  // so the shards hold it to the consistency bound of that step (under SSP a prefetch at
  // clock() would read staler than the bound).
  Result<Ticket> PrefetchSparseAsync(uint32_t table, std::span<const uint64_t> keys, float* out,
                                     uint32_t ahead = 1);
  // The caller's sparse keys are deduplicated already (the trainer's are): the client splits
  // them by shard without hashing them again. REQUIRES, while on: no key twice in one call.
  void AssumeUniqueKeys(bool on) { keys_unique_ = on; }
  // A pull that creates no rows (see PullSparseAsync).
  Status PullSparseReadOnly(uint32_t table, std::span<const uint64_t> keys, float* out);
  // Rows with their optimizer state: RowFloats(table) floats per key (values, then state as
  // laid out in server/optimizer.hpp). For checks and exports.
  Status PullSparseWithState(uint32_t table, std::span<const uint64_t> keys, float* out);
  // Each element as [value, state arrays...]: RowFloats(table) floats per element.
  Status PullDenseWithState(uint32_t table, float* out);
  // Floats per key (sparse) or element (dense) of a pull with state.
  uint32_t RowFloats(uint32_t table) const;
  Status PushSparse(uint32_t table, std::span<const uint64_t> keys, std::span<const float> grads);
  Status PullDense(uint32_t table, float* out);
  Status PushDense(uint32_t table, std::span<const float> grads);

  // Requests made from BeginStep() until SendStep() travel as one message per shard and kind
  // (protocols/message.fbs, Step): a step's pulls of one clock in one, its pushes and the Tick
  // that ends them in another. Each request keeps its own ticket, its own push name and its own
  // time-out, and is resent on its own, so exactly-once and replays work as for single
  // requests. Only pulls, pushes and ticks are gathered; other requests go out at once.
  void BeginStep();
  void SendStep();

  // This worker's clock: the step it is on. Every request carries it; a pull at clock c is
  // answered when the job's consistency mode allows (bsp: every worker at >= c).
  int64_t clock() const { return clock_; }
  // Ends this worker's step: advances its clock and tells every shard (also those its pushes
  // did not touch). Call after the step's pushes have been acknowledged.
  Status Tick();
  // The same without waiting: the shards apply it after the requests sent before it on the
  // same connection; between BeginStep() and SendStep() it leads a Step of the pulls that
  // follow it. Send it once the step's pushes are acknowledged (or, with one shard, right
  // behind them); wait on the ticket before relying on it. Each shard's tick names the pushes
  // this client sent it at the clock it leaves, and is refused for now (and sent again, within
  // its attempts) until the shard has applied them all: after a push failed, the step cannot
  // be ticked by this client (a new one redoes it, naming its pushes afresh).
  Result<Ticket> TickAsync();
  // This worker has finished its steps: the shards stop waiting for its clock (and, under BSP,
  // for its pushes). No more pushes may follow.
  Status Leave();
  // Waits until every live worker of the job has entered barrier `id` (on every shard).
  Status Barrier(int64_t id);

  // Which ranks train at which clock, as far as this client has heard (common/membership.hpp):
  // every reply of a shard that knows more brings it, and every tick passes it on.
  const Membership& membership() const { return relay_.membership(); }
  // Asks shard 0 to name the clock at which this worker leaves (it trains the steps before it,
  // then calls Leave()): the next it can name, or `not_before` if that is later. Returns that
  // clock (one named before, if this worker asked already).
  Result<int64_t> RequestLeave(int64_t not_before = -1);
  // A tool's request (observer): the job should have `workers` workers; shard 0 names a leave
  // clock (as RequestLeave() does) for each of the highest ranks beyond that. Returns how many
  // stay.
  Result<uint64_t> Scale(uint64_t workers, int64_t not_before = -1);
  // Asks shard 0 for the membership it knows (it arrives with the reply).
  Status SyncMembership();
  // The stats (JSON) of each shard the newest placement has, in rank order; StatsOf(): one
  // shard's, any listed one (a shard outside the placement holds nothing, and may not run).
  Result<std::vector<std::string>> Stats();
  Result<std::string> StatsOf(uint32_t shard);
  // A tool's request to one shard (a header from ToolRequest()), answered with the reply's
  // header and payload frames; resent like any request, a refusal comes back as its status.
  struct Reply {
    Header header;
    std::vector<zmq::message_t> frames;  // the payload frames after the header
  };
  Result<Reply> Call(uint32_t shard, Header request, std::vector<zmq::message_t> payload);
  // The same in two halves, so that several requests are under way at once.
  Ticket CallAsync(uint32_t shard, Header request, std::vector<zmq::message_t> payload);
  Result<Reply> Collect(Ticket ticket, uint32_t shard);
  Header ToolRequest(Op op, uint32_t table) { return NewRequest(op, table); }
  // The process of `shard` this client last heard from (0: none).
  uint64_t shard_epoch(uint32_t shard) const { return recovery_.epoch(shard); }
  // The environment this client lives in: its clock is the one to time a tool's waits by.
  Env* env() const { return env_; }
  // Lets `wait` pass on the environment's clock, taking in replies meanwhile (a tool's pause
  // before it asks again; the simulation's time moves on while it does).
  Status Idle(std::chrono::milliseconds wait);
  // Tool: asks shard 0 for `servers` shards (worker/reshard.hpp moves the rows); returns the
  // clock the change takes effect at.
  Result<int64_t> ScaleServers(uint32_t servers);
  // Asks every shard to stop.
  Status Shutdown();
  // Asks every shard to write a checkpoint now.
  Status Checkpoint();

  // Push requests acknowledged (each counted once, however often it was resent).
  uint64_t pushes_acknowledged() const { return pushes_acknowledged_; }

  // A worker that restarted: the clock the shards knew it at when it connected (it continues
  // from there), or -1 for a worker that starts afresh; and whether it had already left.
  int64_t resumed_clock() const { return resumed_clock_; }
  bool resumed_done() const { return resumed_done_; }
  // Whether a replay to a restarted shard was refused (every Wait then fails with it), and
  // whether one is due or under way: this client's log is then the only copy of updates.
  bool replay_failed() const { return !replay_failure_.ok(); }
  // Set when this worker restarted in a way that loses updates it had made (Handshake():
  // under BSP, its tick out of a step reached some shards only, and one of them applied the
  // step since); empty otherwise.
  const std::string& lost_step() const { return lost_step_; }
  // Set once a shard says the job rolled back past what this client did
  // (training.on_overlapping_failure: rollback): every Wait then fails with it (Aborted), and
  // the worker connects again (Connect) and redoes its steps from resumed_clock().
  const Status& rolled_back() const { return rolled_back_; }
  // The job's rollback generation this client works in (0: the job never rolled back).
  uint64_t rollback_generation() const { return rollback_gen_; }
  bool replay_pending() const {
    return !replay_tickets_.empty() ||
           recovery_.any_replay_due();
  }
  // The row cache (worker.cache_rows, SSP with staleness >= 1; worker/row_cache.hpp): rows
  // answered from it and pulled, and the bytes of sparse rows (keys and values) pulled.
  uint64_t cache_hits() const { return cache_hits_; }
  uint64_t cache_misses() const { return cache_misses_; }
  uint64_t pulled_row_bytes() const { return pulled_row_bytes_; }
  // The newest barrier any shard had released when this client connected (-1: none).
  int64_t last_barrier_seen() const { return last_barrier_seen_; }
  // The largest clock a shard knew this worker at when it connected (-1: none knew it).
  int64_t furthest_known_clock() const { return furthest_known_clock_; }
  // Records that every shard released barrier `id`, as the caller knows from elsewhere than a
  // Barrier() of this client (its ticks and replays say so, and a shard restored from before
  // the release lets it go).
  void NoteBarrierPassed(int64_t id);
  // Bytes of pushes kept for replays to restarted shards (see worker/push_log.hpp), now and at
  // most so far.
  uint64_t push_log_bytes() const { return recovery_.log().bytes(); }
  uint64_t push_log_peak_bytes() const { return recovery_.log().peak_bytes(); }
  uint64_t push_log_added_bytes() const { return recovery_.log().added_bytes(); }

 private:
  // The step's requests gathered between BeginStep() and SendStep(), and the Steps on their
  // way (worker/step_batch.hpp).
  StepBatch batch_;
  std::vector<size_t> step_starts_;  // where SendStep() cuts a shard's queue (reused)
  // Sends `group` (requests to `shard`) as one Step, or alone when it is one request.
  void SendGathered(uint32_t shard, std::span<StepBatch::Entry> group);
  void OnStepReply(uint32_t shard, const Header& step, std::vector<zmq::message_t>& frames);

  PsClient(const Manifest& manifest, uint32_t worker_id, Env* env);
  Status LoadKeys(const std::string& key_path);
  // Opens (or reopens) the socket of `shard` with its options, and connects it.
  Status OpenShard(uint32_t shard);
  // Greets the shards (worker/shard_greeting.hpp) and continues where they know this worker.
  Status Handshake();
  // The most shards any placement from `clock` on has (those serving a worker from there).
  uint32_t ShardsFrom(int64_t clock) const;
  // Shards 0 .. n - 1 (at most the listed ones).
  std::vector<uint32_t> FirstShards(uint32_t n);
  // A tool's: the shards the newest placement has.
  std::vector<uint32_t> ServingShards();
  // Sends a payload-less `op` to `shards`; `offset` goes in the header's offset field.
  Result<Ticket> Broadcast(Op op, uint64_t offset, const std::vector<uint32_t>& shards);
  // The placement a read routes by: the one of the request's clock for a worker training, the
  // newest for a tool or a worker done training.
  const Placement& ReadPlacement() const;
  // The placement a push routes by: the one of the request's clock.
  const Placement& WritePlacement() const;
  // One chunk's request of a dense pull or push, tracked under `ticket`.
  void SendDensePull(Ticket ticket, uint32_t table, uint32_t shard, const SliceRange& chunk,
                     uint32_t dim, bool with_state);
  void SendDensePush(Ticket ticket, uint32_t table, uint32_t shard, const SliceRange& chunk,
                     std::span<const float> grads);
  Status CheckDenseGrads(const TableOptions& t, std::span<const float> grads) const;
  Result<const TableOptions*> CheckTable(uint32_t table, TableKind kind) const;

  Ticket NewTicket(Op op, uint32_t table);
  Header NewRequest(Op op, uint32_t table);
  // The dtype values travel in (manifest wire.compression; worker/request_frames.hpp).
  wire::DType WireDType() const;
  // `payload`'s messages are moved out (the caller may reuse the vector).
  void Send(Ticket ticket, uint32_t shard, Header header, std::vector<zmq::message_t>&& payload);
  // Receives what is waiting (up to `timeout`) and resends overdue requests.
  Status Pump(std::chrono::milliseconds timeout);
  void OnReply(uint32_t shard, std::vector<zmq::message_t>& frames);
  void Finish(TicketState& p);
  void FailRequest(TrackedRequest& r, Status status);

  std::function<Status()> wait_interrupt_;
  const Manifest manifest_;
  const uint64_t fingerprint_;  // manifest_.Fingerprint(), which every request carries
  const uint32_t worker_id_;
  Env* const env_;
  const uint32_t num_shards_;
  const uint64_t incarnation_;
  std::unique_ptr<ShardLinks> links_;  // one connection per shard
  int64_t clock_ = 0;
  std::vector<uint64_t> push_index_;  // per shard: pushes sent to it at clock_ so far
  std::vector<uint64_t> last_push_count_;  // per shard: pushes sent to it at clock_ - 1
  uint64_t NextPushIndex(uint32_t shard);
  int64_t request_clock_offset_ = 0;
  bool keys_unique_ = false;
  // The row cache (a unique key answered from it has shard kNoShard in the split).
  bool CacheActive() const;
  void ApplyToCache(uint32_t table, const TableOptions& t, std::span<const uint64_t> keys,
                    std::span<const float> grads);
  RowCache cache_;
  int64_t cache_cleared_for_ = -1;  // the shard count change the cache was last emptied for
  uint64_t cache_hits_ = 0;
  uint64_t cache_misses_ = 0;
  uint64_t pulled_row_bytes_ = 0;  // added to clock_ in the requests made (PrefetchSparseAsync)
  uint64_t next_request_id_ = 1;
  // The tickets and the requests on their way, their deadlines and attempts
  // (worker/request_tracker.hpp).
  RequestTracker tracker_;
  // Reused from call to call: Pump's poll items and received frames, a Step reply's part, its
  // parts and its parts' ids, the frames of a message sent at once.
  std::vector<zmq::message_t> received_;
  std::vector<zmq::message_t> step_part_frames_;
  std::vector<StepPart> step_split_;
  std::vector<uint64_t> step_ids_;
  std::vector<zmq::message_t> send_frames_;
  // Scratch of the sparse requests and the sends (pulls swap the split's vectors with their
  // ticket's, so the ticket keeps them).
  KeySplit split_, push_split_;
  std::vector<zmq::message_t> payload_;
  std::vector<zmq::message_t> key_bufs_;
  PushFrames push_frames_;
  std::vector<uint8_t> first_seen_;
  std::vector<uint32_t> tick_shards_;
  // The ticket's frames borrow the caller's memory (its tracker made once, then reused).
  void StartBorrowing(TicketState& p);
  // Restarted shards (worker/shard_recovery.hpp): each reply goes to recovery_, which finds
  // restarts; worker/replay_sender.hpp sends a due replay, in the order its plan says
  // (worker/replay_plan.hpp), with what was in flight to the old process after it.
  void NoteEpoch(uint32_t shard, const Header& reply);
  void SendDetached(uint32_t shard, Op op, bool done);

  // A rank of the job (below cluster.max_workers), not a tool.
  bool JobRank() const { return worker_id_ < relay_.membership().max_ranks(); }
  MembershipRelay relay_;  // the job's membership as this worker knows it, and its relay
  bool joining_ = false;  // Hello and Membership requests ask to join (until the handshake ends)
  KeyIndex dedup_;
  uint64_t pushes_acknowledged_ = 0;
  bool left_ = false;
  int64_t resumed_clock_ = -1;
  int64_t last_barrier_seen_ = -1;
  int64_t furthest_known_clock_ = -1;
  int64_t barrier_passed_ = -1;  // the newest barrier this client has passed (every shard released it)
  bool resumed_done_ = false;
  // Restarted shards: the push log, each shard's process, and whether a replay to it is due
  // (worker/shard_recovery.hpp); worker/replay_sender.hpp carries a replay out.
  ShardRecovery recovery_;
  // Shards that answer that they are loading their checkpoint, and whether each still moves
  // (worker/restore_watch.hpp): requests to one that moves are resent without spending their
  // attempts.
  RestoreWatch restoring_;
  void NoteRestoring(uint32_t shard, const Header& reply);
  std::vector<Ticket> replay_tickets_;  // replays in progress (nobody waits on them)
  Status replay_failure_;               // sticky: a replay was refused; every Wait returns it
  std::string lost_step_;               // lost_step()
  // Rollbacks (protocols/message.fbs, Op.Rollback): the generation this client's requests
  // carry, whether a shard's Hello said updates were lost (rollback_needed), and once
  // connected, whether a shard has rolled back past this client.
  uint64_t rollback_gen_ = 0;
  bool rollback_needed_ = false;
  std::vector<uint32_t> rollback_needed_by_;  // the shards that said so
  bool connected_ = false;
  Status rolled_back_;
  void NoteRollback(uint32_t shard, const Header& reply);
  // Whether the shard count changed since the job started: no rollback crosses such a change.
  bool ShardCountChanged() const;
  // Whether `st` is a shard's refusal of a rollback past a change it cannot undo
  // (ShardServer::RollbackBarrier()).
  static bool RefusedAcrossChange(const Status& st);
  bool rolling_back_ = false;  // in JobRollback's Follow() or Make()
  bool rollback_barred_ = false;  // shard 0 refused this client's rollback: it goes on
  // Connected, another shard than shard 0 said a rollback is owed while a worker has a leave
  // named: shard 0, which judges a leaver's end, is asked before this client drops its push
  // log to connect again (CheckOwedRollback()).
  std::optional<uint32_t> rollback_owed_at_;
  void CheckOwedRollback();
  void RollBackAfter(uint32_t shard);
  friend class JobRollback;    // worker/job_rollback.hpp: makes and follows rollbacks
  friend class Departure;      // worker/departure.hpp: leaves, and asks shard 0 about membership
  friend class ShardGreeting;  // worker/shard_greeting.hpp: the Hellos of a connect
  friend class ReplaySender;   // worker/replay_sender.hpp: carries out replays to restarted shards
  // The header of `shard`'s reply to ticket `t`, once it came and while the ticket is not
  // waited on; none otherwise.
  std::optional<Header> ReplyHeader(Ticket t, uint32_t shard) const;
  CurveKeyPair curve_keys_;
  std::vector<std::string> server_public_keys_;
};

}  // namespace parasol
