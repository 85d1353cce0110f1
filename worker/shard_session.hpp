// ShardSession: a worker's (or a tool's) session with every shard of its job.
//
// It is the request layer under PsClient (worker/ps_client.hpp), which builds tables' pulls and
// pushes on it. It holds one connection per shard (Env::LinkShards) and:
// - tracks every request until its reply (worker/request_tracker.hpp): a request with no reply
//   within cluster.request_timeout is resent with the same (worker id, incarnation, request id)
//   and push name, and what a reply means is one table (worker/reply_outcome.hpp);
// - gathers a step's requests into Steps (worker/step_batch.hpp);
// - finds restarted shards and replays to them (worker/shard_recovery.hpp, replay_sender.hpp);
// - greets the shards and continues where they know this worker (worker/shard_greeting.hpp);
// - makes and follows rollbacks (worker/job_rollback.hpp), and leaves (worker/departure.hpp);
// - relays the job's membership (worker/membership_relay.hpp).
//
// The invariant it keeps is the one of server/push_gate.hpp and worker/shard_recovery.hpp:
// every acknowledged push is applied exactly once, by every process of the shard that holds its
// rows, whatever restarts; where two failures overlap and a push's only copy is lost, the job
// rolls back (training.on_overlapping_failure) or the loss is reported, never silent.
//
// Asynchronous requests return a Ticket; Wait(ticket) completes it. Several tickets may be
// outstanding; waiting on any ticket also processes replies for the others.
//
// Thread-safety: none. One session per thread (each with its own worker id).
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include <zmq.hpp>

#include "common/curve_keys.hpp"
#include "common/env.hpp"
#include "common/manifest.hpp"
#include "common/sharding.hpp"
#include "common/status.hpp"
#include "common/transport.hpp"
#include "common/wire.hpp"
#include "worker/membership_relay.hpp"
#include "worker/request_tracker.hpp"
#include "worker/restore_watch.hpp"
#include "worker/shard_recovery.hpp"
#include "worker/step_batch.hpp"

namespace parasol {

class ShardSession {
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
  static Result<std::unique_ptr<ShardSession>> Connect(const Manifest& manifest,
                                                       uint32_t worker_id,
                                                       const std::string& key_path = "",
                                                       std::function<Status()> wait_interrupt = {},
                                                       bool join = false, Env* env = nullptr,
                                                       uint32_t rounds = 0);
  // Ends the error of a Connect that found lost updates under on_overlapping_failure: fail.
  static constexpr const char* kOverlapFailNote = " (training.on_overlapping_failure: fail)";
  // The most rollbacks one Connect makes or follows before it gives up.
  static constexpr uint32_t kMaxRollbackRounds = 8;

  ~ShardSession();
  ShardSession(const ShardSession&) = delete;
  ShardSession& operator=(const ShardSession&) = delete;

  const Manifest& manifest() const { return manifest_; }
  uint32_t worker_id() const { return worker_id_; }
  uint32_t num_shards() const { return num_shards_; }
  // The security mechanism of the connection to `shard` (ZMQ_NULL, ZMQ_CURVE, ...).
  int Mechanism(uint32_t shard) const;
  // The environment this session lives in: its clock is the one to time a tool's waits by.
  Env* env() const { return env_; }
  // A rank of the job (below cluster.max_workers), not a tool.
  bool JobRank() const { return worker_id_ < relay_.membership().max_ranks(); }
  // Whether this worker has left the job (Leave()).
  bool left() const { return left_; }

  // ---- Requests, for the layer above (PsClient's tables, the tools) ----
  Ticket NewTicket(Op op, uint32_t table) { return tracker_.Open(op, table); }
  // A request's header: this worker's names, clock, membership version and rollback generation.
  Header NewRequest(Op op, uint32_t table);
  // Tracks the request under `ticket` and sends it (or gathers it into the step's Step, between
  // BeginStep() and SendStep()). `payload`'s messages are moved out (the caller may reuse the
  // vector).
  void Send(Ticket ticket, uint32_t shard, Header header, std::vector<zmq::message_t>&& payload);
  // Sends a payload-less `op` to `shards` under one ticket; `offset` goes in the header's
  // offset field.
  Result<Ticket> Broadcast(Op op, uint64_t offset, const std::vector<uint32_t>& shards);
  // The next push's index at `shard` in this clock: a push is named by (worker, clock, index),
  // so a restarted worker that recomputes the step sends the same names
  // (server/push_record.hpp), and each shard sees its indexes without gaps.
  uint64_t NextPushIndex(uint32_t shard) { return push_index_[shard]++; }
  // The dtype values travel in (manifest wire.compression; worker/request_frames.hpp).
  wire::DType WireDType() const;
  // Whether acknowledged pushes are kept for replays (a push's frames must outlive its caller).
  bool logs_pushes() const { return recovery_.logs_pushes(); }
  // The tickets and the requests on their way.
  RequestTracker& tracker() { return tracker_; }
  // The clock requests made now carry: clock() plus the offset a prefetch sets.
  int64_t request_clock() const { return clock_ + request_clock_offset_; }
  void set_request_clock_offset(int64_t ahead) { request_clock_offset_ = ahead; }
  // Called on a completed ticket with its status ok, before Wait() returns it (a pull's rows
  // are in the caller's buffer then): PsClient's row cache takes the rows it pulled.
  void set_on_finished(std::function<void(TicketState&)> f) { on_finished_ = std::move(f); }

  // Completes `ticket`: its result, or the first error of any shard, naming the shard.
  Status Wait(Ticket ticket);
  // Called while Wait() (and Connect's handshake, Settle(), Collect()) waits, at least every
  // 100 ms: an error it returns ends the wait with that error and leaves the ticket outstanding
  // (a later Wait on it completes it). For callers that must react to a signal while they wait (the
  // Python module's Ctrl-C). It may also throw; the session is then left as after an error.
  void SetWaitInterrupt(std::function<Status()> check) { wait_interrupt_ = std::move(check); }
  // Waits until every request of `ticket` is answered, without completing it.
  Status Settle(Ticket ticket);
  // Lets `wait` pass on the environment's clock, taking in replies meanwhile (a tool's pause
  // before it asks again; the simulation's time moves on while it does).
  Status Idle(std::chrono::milliseconds wait);

  // A tool's request to one shard (a header from NewRequest()), answered with the reply's
  // header and payload frames; resent like any request, a refusal comes back as its status.
  struct Reply {
    Header header;
    std::vector<zmq::message_t> frames;  // the payload frames after the header
  };
  Result<Reply> Call(uint32_t shard, Header request, std::vector<zmq::message_t> payload);
  // The same in two halves, so that several requests are under way at once.
  Ticket CallAsync(uint32_t shard, Header request, std::vector<zmq::message_t> payload);
  Result<Reply> Collect(Ticket ticket, uint32_t shard);

  // ---- Steps and clocks ----
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
  // Waits until every live worker of the job has entered barrier `id` (on every shard).
  Status Barrier(int64_t id);
  // Records that every shard released barrier `id`, as the caller knows from elsewhere than a
  // Barrier() of this session (its ticks and replays say so, and a shard restored from before
  // the release lets it go).
  void NoteBarrierPassed(int64_t id) { barrier_passed_ = std::max(barrier_passed_, id); }

  // ---- Membership (worker/departure.hpp) ----
  // Which ranks train at which clock, as far as this session has heard (common/membership.hpp):
  // every reply of a shard that knows more brings it, and every tick passes it on.
  const Membership& membership() const { return relay_.membership(); }
  // This worker has finished its steps: the shards stop waiting for its clock (and, under BSP,
  // for its pushes). No more pushes may follow.
  Status Leave();
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
  // The placement a read routes by: the one of the request's clock for a worker training, the
  // newest for a tool or a worker done training.
  const Placement& ReadPlacement() const;
  // The placement a push routes by: the one of the request's clock.
  const Placement& WritePlacement() const;
  // Shards 0 .. n - 1 (at most the listed ones).
  std::vector<uint32_t> FirstShards(uint32_t n) const;
  // A tool's: the shards the newest placement has.
  std::vector<uint32_t> ServingShards() const;

  // ---- What this session knows of failures ----
  // The process of `shard` this session last heard from (0: none).
  uint64_t shard_epoch(uint32_t shard) const { return recovery_.epoch(shard); }
  // Push requests acknowledged (each counted once, however often it was resent).
  uint64_t pushes_acknowledged() const { return pushes_acknowledged_; }
  // Bytes of the replies to sparse pulls as they travelled (16-bit when compressed).
  uint64_t pulled_reply_bytes() const { return pulled_reply_bytes_; }
  // A worker that restarted: the clock the shards knew it at when it connected (it continues
  // from there), or -1 for a worker that starts afresh; and whether it had already left.
  int64_t resumed_clock() const { return resumed_clock_; }
  bool resumed_done() const { return resumed_done_; }
  // Whether a replay to a restarted shard was refused (every Wait then fails with it), and
  // whether one is due or under way: this session's log is then the only copy of updates.
  bool replay_failed() const { return !replay_failure_.ok(); }
  bool replay_pending() const { return !replay_tickets_.empty() || recovery_.any_replay_due(); }
  // Set when this worker restarted in a way that loses updates it had made (Handshake():
  // under BSP, its tick out of a step reached some shards only, and one of them applied the
  // step since); empty otherwise.
  const std::string& lost_step() const { return lost_step_; }
  // Set once a shard says the job rolled back past what this session did
  // (training.on_overlapping_failure: rollback): every Wait then fails with it (Aborted), and
  // the worker connects again (Connect) and redoes its steps from resumed_clock().
  const Status& rolled_back() const { return rolled_back_; }
  // The job's rollback generation this session works in (0: the job never rolled back).
  uint64_t rollback_generation() const { return rollback_gen_; }
  // The newest barrier any shard had released when this session connected (-1: none).
  int64_t last_barrier_seen() const { return last_barrier_seen_; }
  // The largest clock a shard knew this worker at when it connected (-1: none knew it).
  int64_t furthest_known_clock() const { return furthest_known_clock_; }
  // Bytes of pushes kept for replays to restarted shards (see worker/push_log.hpp), now, at
  // most so far, and added in all.
  uint64_t push_log_bytes() const { return recovery_.log().bytes(); }
  uint64_t push_log_peak_bytes() const { return recovery_.log().peak_bytes(); }
  uint64_t push_log_added_bytes() const { return recovery_.log().added_bytes(); }

 private:
  ShardSession(const Manifest& manifest, uint32_t worker_id, Env* env);
  Status LoadKeys(const std::string& key_path);
  // Greets the shards (worker/shard_greeting.hpp) and continues where they know this worker.
  Status Handshake();
  // The most shards any placement from `clock` on has (those serving a worker from there).
  uint32_t ShardsFrom(int64_t clock) const;

  // Sends `group` (requests to `shard`) as one Step, or alone when it is one request.
  void SendGathered(uint32_t shard, std::span<StepBatch::Entry> group);
  void OnStepReply(uint32_t shard, const Header& step, std::vector<zmq::message_t>& frames);
  // Receives what is waiting (up to `timeout`) and resends overdue requests.
  Status Pump(std::chrono::milliseconds timeout);
  void OnReply(uint32_t shard, std::vector<zmq::message_t>& frames);
  void FailRequest(TrackedRequest& r, Status status);
  // Restarted shards (worker/shard_recovery.hpp): each reply goes to recovery_, which finds
  // restarts; worker/replay_sender.hpp sends a due replay, in the order its plan says
  // (worker/replay_plan.hpp), with what was in flight to the old process after it.
  void NoteEpoch(uint32_t shard, const Header& reply);
  void NoteRestoring(uint32_t shard, const Header& reply);
  void SendDetached(uint32_t shard, Op op, bool done);
  // Rollbacks: what a reply says of one, and whether a rollback another shard says is owed is
  // one shard 0 would make (CheckOwedRollback()).
  void NoteRollback(uint32_t shard, const Header& reply);
  void RollBackAfter(uint32_t shard);
  void CheckOwedRollback();
  // Whether the shard count changed since the job started: no rollback crosses such a change.
  bool ShardCountChanged() const;
  // Whether `st` is a shard's refusal of a rollback past a change it cannot undo
  // (ShardServer::RollbackBarrier()).
  static bool RefusedAcrossChange(const Status& st);
  // The header of `shard`'s reply to ticket `t`, once it came and while the ticket is not
  // waited on; none otherwise.
  std::optional<Header> ReplyHeader(Ticket t, uint32_t shard) const;

  std::function<Status()> wait_interrupt_;
  std::function<void(TicketState&)> on_finished_;
  const Manifest manifest_;
  const uint64_t fingerprint_;  // manifest_.Fingerprint(), which every request carries
  const uint32_t worker_id_;
  Env* const env_;
  const uint32_t num_shards_;
  const uint64_t incarnation_;
  std::unique_ptr<ShardLinks> links_;  // one connection per shard
  CurveKeyPair curve_keys_;
  std::vector<std::string> server_public_keys_;
  uint64_t next_request_id_ = 1;
  // The tickets and the requests on their way, their deadlines and attempts.
  RequestTracker tracker_;
  int64_t clock_ = 0;
  int64_t request_clock_offset_ = 0;
  std::vector<uint64_t> push_index_;       // per shard: pushes sent to it at clock_ so far
  std::vector<uint64_t> last_push_count_;  // per shard: pushes sent to it at clock_ - 1
  std::vector<uint32_t> tick_shards_;
  // The step's requests gathered between BeginStep() and SendStep(), and the Steps on their
  // way; where SendStep() cuts a shard's queue (reused).
  StepBatch batch_;
  std::vector<size_t> step_starts_;
  // Reused from call to call: received frames, a Step reply's part, its parts and its parts'
  // ids, the frames of a message sent at once.
  std::vector<zmq::message_t> received_;
  std::vector<zmq::message_t> step_part_frames_;
  std::vector<StepPart> step_split_;
  std::vector<uint64_t> step_ids_;
  std::vector<zmq::message_t> send_frames_;

  MembershipRelay relay_;  // the job's membership as this worker knows it, and its relay
  bool joining_ = false;  // Hello and Membership requests ask to join (until the handshake ends)
  uint64_t pushes_acknowledged_ = 0;
  uint64_t pulled_reply_bytes_ = 0;
  bool left_ = false;
  int64_t resumed_clock_ = -1;
  int64_t last_barrier_seen_ = -1;
  int64_t furthest_known_clock_ = -1;
  int64_t barrier_passed_ = -1;  // the newest barrier this session has passed (every shard released it)
  bool resumed_done_ = false;
  // Restarted shards: the push log, each shard's process, and whether a replay to it is due.
  ShardRecovery recovery_;
  // Shards that answer that they are loading their checkpoint, and whether each still moves
  // (worker/restore_watch.hpp): requests to one that moves are resent without spending their
  // attempts.
  RestoreWatch restoring_;
  std::vector<Ticket> replay_tickets_;  // replays in progress (nobody waits on them)
  Status replay_failure_;               // sticky: a replay was refused; every Wait returns it
  std::string lost_step_;               // lost_step()
  // Rollbacks (protocols/message.fbs, Op.Rollback): the generation this session's requests
  // carry, whether a shard's Hello said updates were lost (rollback_needed), and once
  // connected, whether a shard has rolled back past this session.
  uint64_t rollback_gen_ = 0;
  bool rollback_needed_ = false;
  std::vector<uint32_t> rollback_needed_by_;  // the shards that said so
  bool connected_ = false;
  Status rolled_back_;
  bool rolling_back_ = false;     // in JobRollback's Follow() or Make()
  bool rollback_barred_ = false;  // shard 0 refused this session's rollback: it goes on
  // Connected, another shard than shard 0 said a rollback is owed while a worker has a leave
  // named: shard 0, which judges a leaver's end, is asked before this session drops its push
  // log to connect again (CheckOwedRollback()).
  std::optional<uint32_t> rollback_owed_at_;

  friend class JobRollback;    // worker/job_rollback.hpp: makes and follows rollbacks
  friend class Departure;      // worker/departure.hpp: leaves, and asks shard 0 about membership
  friend class ShardGreeting;  // worker/shard_greeting.hpp: the Hellos of a connect
  friend class ReplaySender;   // worker/replay_sender.hpp: carries out replays to restarted shards
};

}  // namespace parasol
