// ShardServer: one server shard. Holds its part of every table in host memory and answers
// requests from workers on a single ZeroMQ ROUTER socket.
//
// The job's consistency mode is enforced here: a pull whose read bound is not met is held and
// answered once the workers' clocks allow it; under BSP, pushes of a clock are summed and
// their average applied once every live worker has moved past that clock. Workers silent past
// training.worker_timeout are reported and either fail the job or are dropped from it.
//
// The request thread (the one that calls Serve()) receives, verifies and dispatches every
// message; table work is split across the EnginePool. Any malformed message gets an error
// reply naming the problem and the shard keeps serving. Pushes carry (worker, incarnation,
// seq) and a resent push is acknowledged without being applied again.
// Thread-safety: Bind() and Serve() are called from one thread; `stop` may be set from any.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <memory>
#include <set>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include <zmq.hpp>

#include "common/env.hpp"
#include "common/log_limiter.hpp"
#include "common/manifest.hpp"
#include "common/membership.hpp"
#include "common/status.hpp"
#include "common/wire.hpp"
#include "common/metrics_server.hpp"
#include "server/checkpoint.hpp"
#include "server/clock_aggregate.hpp"
#include "server/consistency_controller.hpp"
#include "server/dense_table.hpp"
#include "server/engine_pool.hpp"
#include "server/push_gate.hpp"
#include "server/push_record.hpp"
#include "server/shard_metrics.hpp"
#include "server/shard_state.hpp"
#include "server/sparse_table.hpp"
#include "server/worker_key_binding.hpp"
#include "common/membership_macs.hpp"
#include "server/connection_watch.hpp"
#include "server/zap_handler.hpp"

namespace parasol {

// BSP: the last clock a tick completes is applied in two passes (ShardServer). First the dense
// sums and the rows that the pulls about to be answered read (the tick's own Step and the held
// pulls), so that those pulls are answered at once; then, once the message that ticked has
// been answered and before the shard handles anything else, the rest (FinishDeferredApply).
// Every row ends as one pass would leave it: each row's update reads only that row and its
// sum, and the same clock names both passes' writes.
struct DeferredBspApply {
  int64_t clock = -1;
  std::unique_ptr<ClockAggregate> aggregate;
  uint32_t now = 0;   // the shard clock the rows are stamped with
  double scale = 1;   // the average's factor
  // [table][engine]: the positions among the aggregate's keys the second pass applies.
  std::vector<std::vector<std::vector<uint32_t>>> rest;
  // Per engine, where its second pass got to: a table, and a position in its rest.
  struct Progress {
    size_t table = 0;
    size_t next = 0;
  };
  std::vector<Progress> progress;
  bool started = false;  // the second pass runs in the engines' background
};

// Whether a shard applies a BSP clock in two passes, the second after the reply
// (server.apply_after_reply): always, never, or (auto) where `cores`, the cores its process may
// keep busy (UsableCores(): its affinity within its cgroup's CPU quota; 0 where unknown), are
// more than its engine threads.
bool ApplyAfterReply(const ServerOptions& options, size_t cores);

// How a shard with tiered tables spends server.memory_budget.
struct MemoryShares {
  uint64_t disk_cache = 0;         // RocksDB's one cache: blocks read, memtables
  uint64_t replies = 0;            // replies queued for their peers (server.max_queued_reply_bytes)
  uint64_t checkpoint_blocks = 0;  // a checkpoint's blocks of rows (two at a time)
  uint64_t rows = 0;               // the in-memory rows and their index
};
MemoryShares SplitMemoryBudget(const ServerOptions& server);

class ShardServer {
 public:
  // REQUIRES: rank < manifest.cluster.servers.size().
  // `env`: where the time and the epoch come from (Env::Real() if null).
  ShardServer(const Manifest& manifest, uint32_t rank, Env* env = nullptr);
  ~ShardServer();

  // Binds the ROUTER socket: to cluster.bind when set ("listed": this shard's listed address);
  // otherwise to the listed address with CURVE on, and to loopback with security off. With
  // CURVE, starts the authenticator first.
  Status Bind();
  const std::string& endpoint() const { return endpoint_; }

  // Loads the newest good checkpoint of this shard, when checkpoint.dir has one and
  // checkpoint.restore is on. A damaged file is refused (logged) and the one before it tried.
  Status Restore();
  // Writes a checkpoint of every table, the worker clocks, the push record and the pending
  // BSP sums now.
  // `final`: written as the shard stops; nothing is applied after it.
  Status SaveCheckpoint(const std::string& reason, bool final = false);
  const std::string& restored_from() const { return restored_from_; }

  // Serves requests until `stop` becomes true or a Shutdown request arrives. With
  // checkpoint.dir set, a stop by `stop` (a signal) writes a last checkpoint.
  Status Serve(const std::atomic<bool>& stop);

  // Handles one message as if it had arrived on the socket: frames[0] is the peer's identity.
  // Serve() calls it for every message; in-process drivers (the request-path fuzzer) call it
  // directly, with RunPeriodic() for the serve loop's timed work and a reply sink.
  void HandleMessage(std::vector<zmq::message_t>& frames);
  // The serve loop's timed work: eviction sweeps, worker liveness, timed checkpoints.
  void RunPeriodic();
  // Where replies go instead of the socket (identity frame first), for in-process drivers.
  using ReplySink = std::function<void(std::vector<zmq::message_t>& frames)>;
  void set_reply_sink(ReplySink sink) { reply_sink_ = std::move(sink); }

  // Counters and table sizes as a JSON object (the Stats op's reply): the rows of Metrics()
  // and of each table's TableMetrics(), with the membership, the ops and the clocks.
  std::string StatsJson() const;
  // What this shard counts, one row per value (server/shard_metrics.hpp); and what it holds
  // of model table `t`.
  MetricTable Metrics() const;
  MetricTable TableMetrics(size_t t) const;
  // Calls `visit` with each block of the model this shard holds now: every table's rows (with
  // their optimizer state) and dense slice, as a checkpoint holds them (for comparing models
  // bit for bit in tests).
  Status VisitModel(const std::function<void(const CheckpointBlock&)>& visit);
  // The same rows in Prometheus text format (GET /metrics with metrics.enabled), with the
  // counts by op, the warnings, the pull wait histogram and the process's memory and CPU.
  std::string MetricsText() const;

 private:
  struct Counters {
    uint64_t requests = 0;
    uint64_t bad_messages = 0;
    uint64_t errors = 0;
    uint64_t duplicate_pushes = 0;
    uint64_t peer_refusals = 0;  // requests of peers over their reply share, not served
    uint64_t conflicting_resends = 0;  // a push's name again with another payload: refused
    uint64_t unsigned_member_entries = 0;  // relayed membership entries without shard 0's MAC
    uint64_t nonfinite_pushes = 0;     // pushes with a NaN or Inf: refused whole
    int64_t pull_ahead_max = 0;  // the most clocks a pull was ahead of its sender's (prefetch)
    uint64_t replayed_pushes = 0;    // pushes and clocks of workers' replays after a restart
    uint64_t replayed_clocks = 0;
    uint64_t refused_replays = 0;    // of those, refused (the worker stops with the error)
    uint64_t rows_pulled = 0;
    uint64_t rows_pushed = 0;
    uint64_t dense_elements_pulled = 0;
    uint64_t dense_elements_pushed = 0;
    uint64_t pulls_held = 0;
    double pull_wait_ms = 0;
    uint64_t lost_workers = 0;
    uint64_t bsp_clocks_applied = 0;
    // Rows of BSP clocks applied before the tick's reply, and after it (a split apply's
    // second pass, in the background).
    std::atomic<uint64_t> bsp_rows_before_reply{0};
    std::atomic<uint64_t> bsp_rows_after_reply{0};
    uint64_t checkpoints = 0;
    double checkpoint_pause_ms_max = 0;   // the longest a checkpoint stopped serving
    double checkpoint_seconds_last = 0;   // how long the newest took to be durable
    uint64_t delta_checkpoints = 0;       // of the checkpoints, deltas
    uint64_t delta_bytes_last = 0;        // payload bytes of the newest delta
    uint64_t full_bytes_last = 0;         // and of the newest full one
    // Pushes answered only once a background checkpoint was durable (a worker's push log
    // neared its bound, checkpoint.max_log_bytes).
    uint64_t checkpoint_log_waits = 0;
    // Multiples of every_steps reached while the checkpoint before was still being written:
    // none was taken at them (every_steps comes round faster than a checkpoint is written).
    uint64_t checkpoint_steps_skipped = 0;
    uint64_t worker_restarts = 0;
    uint64_t lost_replays = 0;
    uint64_t rollbacks = 0;             // Op.Rollback acted on (this process)
    // Losses no rollback could undo here, as it would go back past a change no rollback
    // crosses (RollbackBarrier()): refused, or never owed.
    uint64_t rollbacks_barred = 0;
    // Of them, those barred by the shard that decides (shard 0, or any shard across a change
    // of the shard count): the job's rollback, not only this shard's view of it.
    uint64_t rollbacks_refused = 0;
    uint64_t rolled_back_requests = 0;  // refused as of a rolled-back generation
    uint64_t stale_replays = 0;  // meant for an earlier process of this shard: dropped
    uint64_t tick_pushes_checked = 0;  // pushes ticks named, found applied before they passed
    // The request thread's time, the shard's side of the worker's time split: by what it did
    // (ServeKind: serving each kind of message, the rest, or waiting for a message), cut at
    // each change (CutTime()); and, of that time, applying BSP clocks.
    double seconds[5] = {};  // by ServeKind
    double seconds_applying_clocks = 0;
  };
  // What the request thread does, for its time: serving pushes (a Step of them, or one), ticks
  // (a Step that starts with one, with the pulls behind it, or a Clock; and the end of a clock
  // applied after a reply), pulls (and held pulls when they are answered), other messages and
  // periodic work, or waiting for a message.
  enum ServeKind : uint8_t {
    kServePushes = 0,
    kServeTicks,
    kServePulls,
    kServeOther,
    kServeWaiting
  };
  static ServeKind ServeKindOf(Op op);
  // Gives the request thread's time since the last cut to `kind`; returns it.
  double CutTime(ServeKind kind);
  // While it lives, the request thread's time goes to `kind` (and is added to *also, if given);
  // the time before it, to what the thread was doing, which it does again after.
  class ServingAs {
   public:
    ServingAs(ShardServer* shard, ServeKind kind, double* also = nullptr)
        : shard_(shard), kind_(kind), outer_(shard->serving_), also_(also) {
      shard_->CutTime(outer_);
      shard_->serving_ = kind_;
    }
    ~ServingAs() {
      const double seconds = shard_->CutTime(kind_);
      if (also_) *also_ += seconds;
      shard_->serving_ = outer_;
    }
    ServingAs(const ServingAs&) = delete;
    ServingAs& operator=(const ServingAs&) = delete;

   private:
    ShardServer* shard_;
    ServeKind kind_, outer_;
    double* also_;
  };
  struct HeldReply {
    zmq::message_t identity;
    Header request;
    std::optional<Header> reply;  // the answer prepared (a Hello's), else ReplyTo(request)
  };
  // Sends a held request's answer: its prepared reply, or one with `st` (a failed checkpoint).
  void AnswerHeld(HeldReply& held, const Status& st);
  // A pull waiting for the read bound: its frames, kept until it is answered.
  struct HeldPull {
    std::vector<zmq::message_t> frames;
    Header request;
    std::chrono::steady_clock::time_point since;
    uint32_t pulls = 1;  // a Step's pulls count one each against server.max_held_pulls
    uint64_t known = 0;  // the membership version its sender knew
  };

  // Checks common to every request of a job op: the worker is in the job, not lost, and the
  // job has not failed; notes that the worker was heard.
  Status Admit(const Header& req);
  // A Step (protocols/message.fbs): checked, held when its pulls must wait, else answered.
  void HandleStep(const Header& step, std::vector<zmq::message_t>& frames);
  // HandleMessage() as the serve loop calls it: a split apply's second pass is left running
  // in the background (the next message, or the loop's timed work, finishes it).
  void ServeMessage(std::vector<zmq::message_t>& frames);
  // What the request thread does now (the kind of the message ServeMessage() serves, once its
  // header is decoded), and when its time was last cut (counters_.seconds).
  ServeKind serving_ = kServeOther;
  std::chrono::steady_clock::time_point time_cut_{};
  // The message alone, answered (a split apply's second pass not started).
  void HandleOneMessage(std::vector<zmq::message_t>& frames);
  // Its parts, split and checked, or the error naming what is wrong.
  Result<std::vector<StepPart>> CheckStep(const Header& step,
                                          std::span<const zmq::message_t> frames) const;
  // Dispatches each part as its own request and replies with all of them in one message.
  // `checked`: the parts as CheckStep() returned them (null: split them again).
  void AnswerStep(const Header& step, std::vector<zmq::message_t>& frames,
                  std::vector<StepPart>* checked = nullptr);
  // Counts a failed request (a bad message too, for those codes) and logs it, rate-limited.
  void NoteFailure(const std::string& what, uint32_t worker, const Status& st);
  // The reply with the shard's epoch and checkpoint counts.
  Header Stamped(const Header& reply) const;
  Status Dispatch(const Header& req, std::vector<zmq::message_t>& frames, Header* reply,
                  std::vector<zmq::message_t>* payload, bool* held);
  Status HandlePull(const Header& req, const PayloadView& p, Header* reply,
                    std::vector<zmq::message_t>* payload);
  Status HandlePush(const Header& req, const PayloadView& p, Header* reply);
  // A push carrying a NaN or an infinity is refused whole, naming the table, row or element
  // and worker (a diverging or hostile worker would poison the rows every worker reads).
  Status CheckFinite(const Header& req, const PayloadView& p);
  // The checksum a push is recorded with: its table, place and payload bytes (never 0).
  static uint64_t PushChecksum(const Header& req, const std::vector<zmq::message_t>& frames);
  std::string TableName(uint32_t table_id) const;  // 'name', or #id when out of range
  // Connections refused for their key, or whose handshake failed (CURVE).
  uint64_t CurveRefusals() const;

  // After any change of clocks or live workers: applies finished BSP clocks, then answers the
  // held pulls and barriers the bound now allows.
  // Applies the BSP sums of every clock all workers have passed.
  void ApplyReadyAggregates();
  void AfterClockChange();
  void ReleaseHeldPulls();
  void ReleaseBarriers();
  // After a worker's replay was given up (AbandonReplay): releases what waited for it only,
  // and says so in the Hello reply being made.
  void ReleaseAfterGivingUpAReplay(Header* reply);
  // BSP: the last clock a tick completes is applied in two passes (DeferredBspApply).
  using DeferredApply = DeferredBspApply;
  // Engine e's rows of a clock's sparse sums: all of them (split null), or a split's pass; the
  // second stops between chunks once *stop is true, and resumes where it stopped.
  void ApplySparseSums(uint32_t e, int64_t clock, const ClockAggregate& aggregate,
                       DeferredApply* split, bool rest, double scale, uint32_t now,
                       const std::atomic<bool>* stop = nullptr);
  // Hands what a split apply's first pass left to the engines' background (idle priority).
  void StartDeferredApply();
  // split: nullptr applies everything; else its first pass (the second: ApplySparseSums).
  void ApplyAggregate(int64_t clock, ClockAggregate& aggregate, DeferredApply* split = nullptr);
  // Whether a table's rows may be applied in two passes: not tiered and not evicting (the
  // order its rows are created in decides what stays in memory); such tables are applied whole
  // in the first pass.
  static bool TableSplits(const SparseTable& table);
  // Whether any table's may.
  bool CanSplitApply() const;
  // Adds the keys of a PullSparse (its header and payload frames) to pull_keys_.
  void NotePullKeys(const Header& pull, std::span<zmq::message_t> payload);
  // Adds the keys of every held sparse pull to pull_keys_.
  void NoteHeldPullKeys();
  // Applies what the first pass left (nothing when no apply is split), helping the background
  // with what it has not begun, and returns once it is all applied.
  void FinishDeferredApply();
  void CheckWorkers();
  void MaybeCheckpoint();
  // Checkpoints in the background (checkpoint.background): the shard forks, and the child, a
  // copy-on-write image of the shard at that moment, writes the file while this process goes
  // on serving. The count in replies moves on once the child has made the file durable.
  // A small state's checkpoint, copied into memory at its moment and written beside the
  // request thread (Env::RunAside: a thread of this process, or an event of the simulation's
  // schedule). A fork costs more than such a state's whole write: its page tables, and a page
  // copied at each first write while the child lives.
  struct StagedCheckpoint {
    std::vector<CheckpointBlock> blocks;  // the file's blocks, as the state produced them
    uint64_t bytes = 0;                   // their payload bytes
    // Set by the work (WriteCheckpointFile) before the task is done; not set: it never ran.
    bool written = false;
    Status status;
    std::unique_ptr<AsideTask> task;
  };
  struct BackgroundCheckpoint {
    pid_t pid = -1;
    int result_fd = -1;  // the child writes the bytes it wrote, or "!" and its error
    std::shared_ptr<StagedCheckpoint> staged;  // instead of a child: joined before it goes
    CheckpointHeader header;
    std::string path;
    std::string reason;
    uint64_t stamp = 0;                     // StateStamp() when it was begun
    std::vector<uint64_t> pushed_at_start;  // push_gate_.pushed_since_checkpoint() then
    std::chrono::steady_clock::time_point start;
    double pause_ms = 0;                    // how long serving stopped to begin it
    uint32_t begun_clock = 0;               // ShardClock() when it was begun
    std::optional<uint64_t> complete_through;  // CompleteThroughNow() when it was begun
    std::vector<HeldReply> waiting;         // Checkpoint requests, answered once it is durable
    // A tiered shard's child: the disk tier's rows at its moment, fed from a snapshot.
    std::unique_ptr<DiskTier::Feed> feed;
  };
  std::optional<BackgroundCheckpoint> background_;
  // Checkpoint requests waiting for a checkpoint begun after them (one was being written).
  std::vector<HeldReply> checkpoint_waiters_;
  static constexpr size_t kMaxCheckpointWaiters = 1024;
  // Why a checkpoint is due once the one being written is (empty: none is).
  std::string next_checkpoint_reason_;
  // Forced checkpoints (requested, or for a restarted worker) begin at most once per
  // checkpoint.min_interval; those asked sooner wait (StartRequestedCheckpoint).
  std::chrono::steady_clock::time_point last_forced_checkpoint_{};
  bool ForcedCheckpointDue() const;
  void NoteForcedCheckpoint() { last_forced_checkpoint_ = env_->Now(); }
  LogLimiter restart_log_;  // "worker W restarted" lines (a Hello may claim a restart)
  // Checkpoints whose state was taken (durable or being written): checkpoints_begun in replies.
  uint64_t checkpoints_begun_ = 0;
  // Whether checkpoints may be written in the background (not with a tiered table).
  bool CanCheckpointInBackground() const;
  // A checkpoint begun now: in the background when it can be, else written at once. Nothing
  // when one is being written already (it holds the state up to when it was begun).
  Status BeginCheckpoint(const std::string& reason);
  // Reaps a finished background checkpoint (waits for it with `wait`): moves the count on, or
  // marks one owed; answers the requests waiting for it.
  void PollBackgroundCheckpoint(bool wait);
  // A background checkpoint ended (`st`): counted and pruned, or owed again; its waiters answered.
  void FinishBackgroundCheckpoint(BackgroundCheckpoint& bg, const Status& st, uint64_t bytes);
  void WaitForBackgroundCheckpoint();
  // Begins a checkpoint for the requests in checkpoint_waiters_, once none is being written.
  void StartRequestedCheckpoint();
  // Whether kMaxCheckpointWaiters requests wait for a checkpoint already.
  bool CheckpointWaitersFull() const;
  // A worker's Hello reply says its updates were lost (under on_overlapping_failure: fail).
  void TellLostUpdates(uint32_t worker, Header* reply) const;
  CheckpointHeader NextCheckpointHeader(bool final) const;
  // Writes the shard's state as the checkpoint `h` at `path`; adds the payload bytes to *bytes.
  Status WriteState(const std::string& path, const CheckpointHeader& h, const DeltaSpec* delta,
                    std::optional<uint64_t> complete_through, uint64_t* bytes);
  // The shard's state (or its delta) as checkpoint blocks, each handed to `sink` in file order.
  // `complete_through`: CompleteThroughNow() as the state is taken.
  Status SaveState(const std::function<Status(const CheckpointBlock&)>& sink,
                   const DeltaSpec* delta, std::optional<uint64_t> complete_through);
  // Whether the state's tables take at most checkpoint.copy_below bytes: its background
  // checkpoint is then a copy written by a thread (StagedCheckpoint), else a forked child.
  bool StagedCheckpointFits() const;
  // Copies the state and starts the thread that writes it; `bg` is moved into background_
  // once both are done (an exception, out of memory or out of threads, leaves it as it was).
  Status BeginStagedCheckpoint(BackgroundCheckpoint& bg, const DeltaSpec* delta);
  // The blocks of the last staged checkpoint written: their memory, reused by the next one.
  std::vector<CheckpointBlock> staged_spare_;
  // Incremental checkpoints (checkpoint.full_every > 1): the next checkpoint, `sequence`, is a
  // delta (returned) when the chain allows it, else full. Takes the removed rows recorded.
  std::optional<DeltaSpec> NextDelta(uint64_t sequence);
  uint64_t chain_base_ = 0;         // the newest durable full checkpoint (0: none)
  uint32_t chain_since_clock_ = 0;  // the shard clock when the newest durable one was begun
  bool force_full_ = true;          // a failed checkpoint, or none yet: the next is full
  // A checkpoint is durable: the count moves on, older ones are pruned.
  void CheckpointWritten(const CheckpointHeader& h, const std::string& path,
                         const std::string& reason, uint64_t stamp,
                         const std::vector<uint64_t>& pushed_at_start, double seconds,
                         double pause_ms, uint64_t bytes, uint32_t begun_clock);
  // `onto`: the checkpoint the tables hold (a delta is loaded onto it; 0: none).
  // `base`: the full checkpoint its chain starts from (a delta must name it; 0: any).
  Status LoadCheckpoint(const std::string& path, uint64_t onto = 0, uint64_t base = 0);
  // Empty tables (and an empty disk tier for the tiered ones).
  Status ResetTables();
  // The disk tier's folder of this shard.
  std::string DiskDir() const;
  // Tiered tables: brings the rows of a request's keys into memory, on every engine, before
  // the request changes anything; fails (changing nothing) when the disk cannot be read.
  Status PrefaultKeys(SparseTable& table, const PayloadView& p);

  // `identity`: the sender's, for a reply held until a checkpoint is durable (*held).
  Status HandleHello(const Header& req, const zmq::message_t& identity, Header* reply,
                     bool* held);
  Status HandlePullSparse(const Header& req, const PayloadView& p, Header* reply,
                          std::vector<zmq::message_t>* payload);
  Status HandlePushSparse(const Header& req, const PayloadView& p);
  Status AggregatePushSparse(const Header& req, const PayloadView& p, ClockAggregate& agg);
  Status AggregatePushDense(const Header& req, const PayloadView& p, ClockAggregate& agg);
  Status HandlePullDense(const Header& req, Header* reply, std::vector<zmq::message_t>* payload);
  Status HandlePushDense(const Header& req, const PayloadView& p);
  Status HandleClock(const Header& req);
  // Refuses a tick whose worker's pushes of the clock it leaves (req.key_count of them) have
  // not all been applied here.
  Status CheckTickPushes(const Header& req);
  // What this shard knows of `worker`, for the push gate.
  PushGate::Sender SenderOf(uint32_t worker) const;
  // Holds the request until every live worker has arrived; returns whether it was held
  // (a resend of the barrier released last is answered at once).
  Result<bool> HandleBarrier(const Header& req, const zmq::message_t& identity);
  // Holds a pull until the read bound allows it, within server.max_held_pulls/bytes.
  // `known`: the membership version its sender knew (see ReadAllowed).
  Status HoldPull(const Header& req, std::vector<zmq::message_t>& frames, uint64_t known,
                  uint32_t pulls = 1);
  Status CheckPendingLimits(int64_t clock, uint64_t new_bytes) const;

  // The shard's clock: the newest clock any worker has reported.
  uint32_t ShardClock() const;
  mutable uint32_t shard_clock_high_ = 0;
  // Runs a bounded eviction sweep when one is due.
  void MaybeSweep();

  // Positions of the request's keys owned by each engine, in request order; reused buffers.
  void SplitByEngine(const PayloadView& p);

  Result<SparseTable*> SparseTableFor(const Header& req);
  Result<DenseTable*> DenseTableFor(const Header& req, uint64_t count);
  void SendReply(const zmq::message_t& identity, const Header& reply,
                 std::vector<zmq::message_t> payload);

  const Manifest manifest_;
  const uint32_t rank_;
  Env* const env_;
  const uint32_t num_shards_;
  const uint64_t fingerprint_;
  std::string endpoint_;

  zmq::context_t context_;
  std::unique_ptr<ZapHandler> zap_;  // declared after context_: destroyed before it
  std::unique_ptr<ConnectionWatch> watch_;  // the socket's monitor: connections, their cap
  // security.worker_keys: which CURVE key may act as which worker (set by Bind()).
  WorkerKeyBinding worker_keys_;
  MembershipMacs membership_macs_;  // with worker keys: shard 0 signs, the others check
  zmq::socket_t router_;
  EnginePool engines_;

  // Declared before the tables, so destroyed after them.
  std::unique_ptr<DiskTier> disk_;  // the tiered tables' disk tier (null: none)
  Status tables_status_;            // why ResetTables() failed at construction
  std::vector<std::unique_ptr<SparseTable>> sparse_;  // by table id; null for dense tables
  std::vector<std::unique_ptr<DenseTable>> dense_;    // by table id; null for sparse tables
  std::vector<std::vector<uint32_t>> engine_positions_;  // per engine, see SplitByEngine
  // Whether a push or a tick is admitted; the push record; the bytes each worker pushed since
  // this shard's last checkpoint (what its push log holds for this shard).
  PushGate push_gate_;
  // Checkpoints once every worker has left: their push logs end with their processes.
  void CheckpointWhenAllDone();
  // Whether every rank in the job here has finished (or is counted lost): no tick comes again.
  bool EveryWorkerFinished() const;
  bool all_done_checkpointed_ = false;
  // Shard 0 named a join or leave clock that no checkpoint holds yet (its checkpoint failed):
  // the next request about it tries again before it is answered (KeepNamedClocks()).
  bool named_unkept_ = false;
  // A checkpoint failed: the next is due a second later, whatever the period.
  bool checkpoint_owed_ = false;
  std::chrono::steady_clock::time_point last_checkpoint_failure_{};
  ConsistencyController controller_;
  // Which ranks train at which clock (common/membership.hpp); shard 0 names the clocks.
  Membership membership_;
  // Takes in the membership entries `req` carries (from a worker of the job, or a joining one's
  // Hello): the controller counts newly joined ranks from their clocks on.
  Status MergeMembership(const Header& req);
  // Takes in `entries` (checked by the caller): new joins enter the controller (as a lower
  // bound in a restarted process), and the placements are settled again.
  Status TakeMembership(std::span<const MemberEntry> entries);
  // A restarted shard 0: the clocks its earlier processes named (KeepNamedClocks), which the
  // checkpoint it restored may lack.
  Status TakeNamedClocks();
  // Shard 0: a Membership request (or a Hello asking to join): names the clocks asked for.
  Status HandleMembership(const Header& req, Header* reply);
  // Shard 0, having named a join or leave clock: a file holds it before the reply goes.
  Status KeepNamedClocks(const std::string& what);
  // The first clock shard 0 may name now: no worker can have read that step's batch yet.
  int64_t NextMembershipClock() const;
  // The furthest clock a membership entry may name now: shard 0 names none beyond it, and the
  // other shards take none beyond it from a worker's copy.
  int64_t MembershipReach() const;
  // Dispatch() with the membership taken in first and, for a sender that knew less, sent back.
  Status DispatchOp(const Header& req, std::vector<zmq::message_t>& frames, Header* reply,
                    std::vector<zmq::message_t>* payload, bool* held);
  // Changes of the shard count (`parasol scale --servers`; protocols/message.fbs Op.Migrate).
  // At a change's clock C the keys move from the placement before it to the one after it. The
  // tool copies each moving row (with its optimizer state, as every push of the clocks before C
  // left it) from the shard that held it to the one that holds it from C on, has every shard
  // commit, then has the old holders drop them. A shard that gains rows answers no pull of
  // clock C or later before it has committed. In checkpoints (MigrationState).
  MigrationState migration_;
  // The newest change (its clock, or -1 with none), and the placements around it.
  int64_t ChangeClock() const;
  const Placement& PlacementBefore() const;
  const Placement& PlacementAfter() const { return membership_.LastPlacement(); }
  // The placement this shard serves by now: the one after the newest change once it has
  // committed it, the one before until then.
  const Placement& LivePlacement() const;
  // Whether this shard is within LivePlacement(): only then do workers tick it, and only then
  // does it watch them for silence. A shard outside it serves nothing, needs not run (it may
  // stop, and start again before a change gives it rows), and takes the workers' clocks when it
  // commits a change that gives it rows (ConsistencyController::Enter()).
  bool Entered() const { return rank_ < LivePlacement().count(); }
  // A shard that the newest change removes, once every worker has passed its clock: checkpoints
  // every push it took (no worker will replay them to it), once per change.
  void CheckpointWhenRemoved();
  // A worker that leaves the running job has said it is done: a checkpoint holds its pushes.
  void CheckpointWhenALeaverIsDone(uint32_t w);
  // Begins the checkpoint a leaver waits for once none is being written (RunPeriodic).
  void KeepLeaversDone();
  // Why one is owed (empty: none), and the count it must pass: the largest a done tick's reply
  // carried (unset: taken at the next KeepLeaversDone, which no reply precedes).
  std::string leaver_checkpoint_reason_;
  std::optional<uint64_t> leaver_checkpoint_past_;
  int64_t removed_checkpointed_ = -1;
  // A shard outside both placements of the newest change has nothing of it to install or drop:
  // marks it done here (called whenever the membership changes).
  void SettleUninvolved();
  // The clock this shard serves the job from: 0, or the newest change that gave it rows when
  // it held none (the workers' clocks and the membership before it are nothing to it).
  int64_t ServingFrom() const { return membership_.ServingFrom(rank_); }
  // Whether this shard gains keys at the newest change (kept in gains_rows_, recomputed
  // whenever the membership changes).
  bool GainsRows() const;
  bool gains_rows_ = false;
  // Rows were copied here ahead of a change (checkpoints then hold only this shard's rows).
  bool staged_rows_ = false;
  // Whether a pull of `clock` by `worker` may be answered: the read bound allows it, and the
  // rows this shard gains at a change at or before that clock are in. A worker done training
  // (evaluating) reads by the newest placement: its pulls wait for the rows of any change.
  // `known`: the membership version the request's sender knew; a pull waits until this shard
  // knows as much (a shard restarted from an older checkpoint learns a change of the shard
  // count from the workers' replays before it answers a pull routed by it).
  bool ReadAllowed(uint32_t worker, int64_t clock, uint64_t known) const;
  // Whether every push of the clocks before the newest change is applied here.
  bool ChangeClockReached() const;
  // The refusal of a Migrate step while !ChangeClockReached(): naming the workers whose
  // pushes this shard lost, when it lost some (they will not come).
  Status ChangeClockNotReached(int64_t change) const;
  // Whether a row of `key` belongs in this shard's checkpoints now (the rows it held before
  // the newest change until it drops them, and those it gains once it has committed them).
  bool KeepsKey(uint64_t key) const;
  // Shard 0, asked by a tool for `count` shards: names the change at clock `at`, unless the
  // newest change is to `count` already (its clock is the reply's worker_clock either way).
  Status NameServerChange(uint32_t count, int64_t at, Header* reply);
  Status HandleMigrate(const Header& req, const PayloadView& p, Header* reply,
                       std::vector<zmq::message_t>* payload);
  // Sparse table `id`, whose rows can move between shards (not tiered).
  Result<SparseTable*> MovableTable(uint32_t id);
  Status MigrateStepAnswer(const Header& req, const PayloadView& p, Header* reply);
  // Step 3: this shard serves by the placement after the change from now on. A shard that
  // served nothing before takes the workers' clocks then (the request's rows: the ranks that
  // left, and when); the answer's rows are the ranks this shard knows to have left.
  Status Commit(const Header& req, const PayloadView& p, Header* reply,
                std::vector<zmq::message_t>* payload);
  // The rows of table req.table_id that `before` places here and `after` elsewhere, one page
  // from cursor req.offset; `updated_since` >= 0: only those updated at that shard clock or
  // later.
  Status ExportRows(const Header& req, const Placement& before, const Placement& after,
                    int64_t updated_since, Header* reply, std::vector<zmq::message_t>* payload);
  // Rows that `after` places here and `before` elsewhere, as ExportRows() gave them.
  Status InstallRows(const Header& req, const PayloadView& p, const Placement& before,
                     const Placement& after, Header* reply);
  // Answers an export page: `keys` and their `rows` of `floats` each.
  void AnswerPage(const Header& req, const std::vector<uint64_t>& keys,
                  const std::vector<float>& rows, uint32_t floats, Header* reply,
                  std::vector<zmq::message_t>* payload) const;
  // Dense tensors are re-cut at every change: each shard's slice is its DenseSlice() among the
  // placement's shards. The elements a shard holds before the change and not after move in the
  // change's copy (not ahead of it: dense tensors are updated every clock), in pages whose keys
  // are the elements' indices. A shard's table holds the span of both slices from the first
  // elements installed until the drop, which cuts it to the new slice.
  // This shard's slice of dense table `table` at `clock`.
  SliceRange DenseSliceAt(uint32_t table, int64_t clock) const;
  // The moving elements this shard held before the change, one page from the first at or after
  // req.offset.
  Status ExportDense(const Header& req, Header* reply, std::vector<zmq::message_t>* payload);
  Status InstallDense(const Header& req, const PayloadView& p, Header* reply);
  // Rows an install brings were read at this shard's rollback generation (Aborted otherwise).
  Status CheckInstallGeneration(const Header& req) const;
  // Commit: every element this shard gains was installed by this process.
  Status CheckDenseInstalled() const;
  // Replaces dense table `table` by one holding `slice` (the elements of both kept) and re-cuts
  // its pending sums alike.
  void ResliceDense(uint32_t table, SliceRange slice);
  // A push of elements [req.offset, + count) of a dense table at req.clock: this shard's slice
  // at that clock holds them.
  Status CheckDensePush(const Header& req, uint64_t count) const;
  // Per dense table, the element ranges installed by this process for the change at
  // dense_installed_clock_ (merged: begin -> end).
  std::vector<std::map<uint64_t, uint64_t>> dense_installed_;
  int64_t dense_installed_clock_ = -1;
  // BSP: applied clocks' sum buffers, for the next clocks' (before the aggregates that use it).
  SpareParts spare_parts_;
  PendingAggregates aggregates_;  // BSP: by clock; in checkpoints
  // The second pass of a split apply, run before the shard handles anything else.
  std::optional<DeferredApply> deferred_apply_;
  // Set while a tick is handled: only then may ApplyReadyAggregates() split its last clock.
  bool may_split_apply_ = false;
  // ApplyAfterReply() for this shard's options and process: false, and no clock is split.
  bool apply_after_reply_ = false;
  // [table id]: the keys of the sparse pulls a split apply's first pass serves.
  std::vector<std::vector<uint64_t>> pull_keys_;
  std::vector<HeldPull> held_pulls_;
  uint64_t held_bytes_ = 0;  // request bytes of held_pulls_
  Status job_failure_;  // set when a worker is lost under on_worker_loss: fail
  std::map<int64_t, std::vector<HeldReply>> barriers_;  // by barrier id; one entry per worker
  Counters counters_;
  uint64_t op_counts_[16] = {};
  uint64_t op_bytes_[16] = {};
  // Pull wait in seconds: bucket upper bounds and counts (the last bucket is +Inf).
  LatencyHistogram pull_wait_;
  void ObserveWait(double seconds);
  std::unique_ptr<MetricsServer> metrics_;
  std::chrono::steady_clock::time_point last_publish_{};
  uint64_t checkpoint_sequence_ = 0;
  uint64_t restored_sequence_ = 0;  // of the checkpoint this process started from
  // The count the checkpoint this process started from holds every acknowledged push before
  // (CheckpointBlockKind::kCompleteThrough; its sequence unless it was taken while a replay was
  // owed): restored_count in replies, which workers drop their entries of earlier processes by.
  uint64_t restored_complete_ = 0;
  uint64_t restored_writer_ = 0;  // when it holds less than its sequence: the process that took it
  // This process started from a checkpoint, or after an earlier one that had none: workers may
  // hold pushes the process before acknowledged.
  bool restarted_process_ = false;
  // Ranks this restarted process took into the job from a membership copy (it restored a
  // checkpoint from before their join): neither replayed nor said they hold nothing of an
  // earlier process yet. Unlike the checkpoint's workers, the shard does not wait for them.
  std::set<uint32_t> joined_since_restore_;
  // For a checkpoint taken now: unset when it holds every push acknowledged before it began
  // (no worker may still hold a push for this process that it has not replayed), else the
  // count it holds them before.
  std::optional<uint64_t> CompleteThroughNow() const;
  int64_t checkpoint_clock_ = -1;
  uint64_t epoch_;  // random per start and per rollback: tells workers this shard restarted
  // Rollbacks (protocols/message.fbs, Op.Rollback): the generation this shard is at, the clock
  // its newest rollback went back to, and whether a Hello revealed lost updates that only a
  // rollback can undo (every Hello reply says so until one is made).
  uint64_t rollback_gen_ = 0;
  int64_t rollback_clock_ = -1;
  bool rollback_owed_ = false;
  std::chrono::steady_clock::time_point rollback_owed_since_{};
  // A multiple of every_steps reached while another checkpoint was being written (-1: none):
  // counted in checkpoint_steps_skipped once the clock moves on with none begun at it.
  int64_t step_waiting_clock_ = -1;
  bool rollback_pending_ = false;  // a worker asked where to go back to (Op.Rollback, done)
  std::chrono::steady_clock::time_point rollback_pending_since_{};
  std::set<uint32_t> lost_updates_of_;  // workers a Hello showed lost updates of
  std::optional<RollbackMark> rollback_mark_;  // read by Restore(), written by a rollback
  // A job request of another generation: refused (Aborted when older, Unavailable when newer).
  Status CheckGeneration(const Header& req);
  // After each request: a refusal that showed lost updates makes a rollback owed.
  void NoteBehind();
  // Op.Rollback: the question (read_only) or the act.
  Status HandleRollback(const Header& req, Header* reply);
  // The newest checkpoint this shard can restore whose clock is at most `clock` (exactly
  // `clock` when `exact`): its path and header; NotFound when there is none.
  Result<std::pair<std::string, CheckpointHeader>> CheckpointAtOrBefore(int64_t clock,
                                                                        bool exact) const;
  // Goes back to checkpoint `path` (taken at `clock`) and enters generation `generation`.
  Status RollBackTo(const std::string& path, const CheckpointHeader& h, uint64_t generation);
  // After a rollback's checkpoint is loaded (also at a restart from it): every worker at its
  // clock, no pending sums, no push record, no replay owed.
  // `restarted`: this process restarted from it (the workers then replay what they did since).
  void SettleRollback(int64_t clock, bool restarted);
  // Why no rollback can be made now, or empty: the shard count changed (rows moved between
  // shards), or a worker that left the running job has finished (it may have exited, and
  // could not redo its steps). A join, or a leave not yet reached, is no obstacle: the ranks
  // keep the clocks they were named, and a leaver still training redoes its steps like anyone.
  // The loss is then reported as without a rollback.
  // A leaver's end is shard 0's to judge: another shard may know of it before shard 0 does,
  // when the leaver is still there to redo its steps. So on the others only a change of the
  // shard count bars a rollback; LeaverBarrier() says what this shard knows of leavers.
  std::string RollbackBarrier() const;
  std::string LeaverBarrier() const;
  // RollbackBarrier(), counted (counters_.rollbacks_barred) when it bars one: empty when none.
  std::string BarRollback();
  // Owes the job a rollback (every reply says so, rollback_needed, until one is made).
  void OweRollback();
  // How long a worker waits on one request, all its attempts together.
  std::chrono::milliseconds WorkerPatience() const;
  // Loads checkpoint `path` with the files it builds on, oldest first.
  Status LoadChain(const std::string& path);
  std::chrono::steady_clock::time_point last_checkpoint_ = env_->Now();
  std::string restored_from_;
  // How far the checkpoint being loaded is (ShardState::Load()).
  ShardState::LoadProgress restore_progress_;
  std::atomic<uint64_t> restoring_requests_{0};  // answered while loading
  bool restore_attempted_ = false;  // Restore() was called
  // Restore() on a thread of its own while this thread answers every request with its progress
  // (Unavailable; Stats with a JSON of it), until it is done.
  Status RestoreWhileAnswering(const std::atomic<bool>& stop);
  bool restore_abandoned_ = false;  // stopped while loading: nothing more is done
  void AnswerWhileRestoring(std::vector<zmq::message_t>& frames);
  std::string RestoreProgressText() const;
  std::string RestoringMetricsText() const;
  bool shutdown_requested_ = false;
  std::chrono::steady_clock::time_point last_sweep_{};
  ReplySink reply_sink_;
  // Held pulls per worker (server.max_held_pulls and max_held_bytes are per worker).
  std::vector<uint32_t> held_count_;
  std::vector<uint64_t> held_worker_bytes_;
  // Per worker: since when a reply to it was dropped (it counts as waiting until it resends).
  std::vector<std::optional<std::chrono::steady_clock::time_point>> reply_dropped_since_;
  struct PeerAccount;
  void DroppedReply(const Header& reply, const std::string& why, PeerAccount* peer = nullptr);
  void HeardAfterDrop(uint32_t worker);
  // Bytes of reply frames handed to ZeroMQ and not yet sent: released on ZeroMQ's I/O thread.
  std::shared_ptr<std::atomic<uint64_t>> queued_reply_bytes_ =
      std::make_shared<std::atomic<uint64_t>>(0);
  // A peer (a connection, by its routing identity) and the replies queued for it. Each peer's
  // queued bytes are bounded by its share: a job's worker that said Hello (a member) gets an
  // equal part of 11/16 of server.max_queued_reply_bytes, which the others cannot take; any
  // other peer a sixteenth, and all of those together a quarter (a sixteenth more for small
  // replies). A peer holding its whole share is not served until it reads.
  struct PeerAccount {
    std::shared_ptr<std::atomic<uint64_t>> queued = std::make_shared<std::atomic<uint64_t>>(0);
    int64_t member_of = -1;  // the job worker whose Hello came over it, or -1
    LogLimiter log{3, std::chrono::seconds(10)};  // its own lines: one peer cannot use up all
    std::chrono::steady_clock::time_point last_seen{};
  };
  static constexpr size_t kMaxPeers = 1 << 16;
  static constexpr uint64_t kSmallReplyBytes = 16 << 10;  // a stats reply, an error
  std::unordered_map<std::string, PeerAccount> peers_;
  PeerAccount overflow_peer_;  // every peer past kMaxPeers shares this one
  std::vector<std::string> member_identity_;  // by worker: the identity of its Hello
  uint32_t members_ = 0;
  // Queued bytes of all non-member peers together.
  std::shared_ptr<std::atomic<uint64_t>> other_peers_queued_ =
      std::make_shared<std::atomic<uint64_t>>(0);
  PeerAccount* Peer(const zmq::message_t& identity, bool create);
  uint64_t PeerShare(const PeerAccount& peer) const;
  void MarkMember(const zmq::message_t& identity, uint32_t worker);
  void ForgetIdlePeers();
  std::chrono::steady_clock::time_point last_peer_sweep_{};
  // Tells the connection watch that `frames` came over its descriptor, and whether from a
  // job worker (never shut for being idle).
  void NoteConnectionSeen(std::vector<zmq::message_t>& frames);
  bool request_well_formed_ = false;  // the message handled last had a header that decoded
  zmq::message_t QueuedReplyFrame(zmq::message_t m, PeerAccount* peer = nullptr);
  // Dense value buffers that a push replaced while replies held them (see DenseTable).
  std::shared_ptr<std::atomic<uint64_t>> retired_dense_bytes_ =
      std::make_shared<std::atomic<uint64_t>>(0);
  // What replies waiting for their peers keep alive: their frames and retired buffers.
  uint64_t QueuedReplyBytes() const {
    return queued_reply_bytes_->load() + retired_dense_bytes_->load();
  }
  // server.max_queued_reply_bytes, or less for tiered tables (SplitMemoryBudget).
  uint64_t max_queued_reply_bytes_ = manifest_.server.max_queued_reply_bytes;
  // The most bytes of rows a checkpoint block holds.
  uint64_t checkpoint_block_bytes_ = ShardState::kRowBlockBytes;
  // Changes whenever pushes, clocks or checkpoints change what a checkpoint would hold.
  uint64_t StateStamp() const;
  uint64_t requested_checkpoint_stamp_ = ~uint64_t{0};
  uint64_t saved_stamp_ = ~uint64_t{0};  // StateStamp() of the newest checkpoint written
  // How far past the last released barrier a new one may be.
  static constexpr int64_t kMaxBarrierStride = 16;
  // Warnings that peers can trigger, rate-limited; their counts are in /metrics.
  LogLimiter bad_message_log_;
  // Updates not made because they would not have been finite (Optimizer::Apply): logged from
  // RunPeriodic() when the tables' counts grow.
  void ReportNonfiniteUpdates();
  uint64_t NonfiniteUpdatesKept() const;
  std::vector<uint64_t> nonfinite_reported_;  // by table: the count last logged
  LogLimiter nonfinite_log_;
  LogLimiter failed_request_log_;
  LogLimiter undelivered_log_;
  uint64_t replies_dropped_ = 0;  // a peer's queue was full (it does not read its replies)
};

}  // namespace parasol
