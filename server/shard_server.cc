#include "server/shard_server.hpp"

#include "common/protocol.hpp"
#include "common/net.hpp"

#include "common/fault_points.hpp"

#include <spdlog/spdlog.h>

#include <thread>
#include <signal.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>

#include <filesystem>

#include <algorithm>
#include <limits>
#include <cmath>
#include <random>
#include <cinttypes>
#include <set>

#include "common/cpu_affinity.hpp"
#include "common/curve_keys.hpp"
#include "common/fatal.hpp"
#include "common/json_text.hpp"
#include "common/sharding.hpp"
#include "common/transport.hpp"
#include "common/initializer.hpp"
#include "server/checkpoint.hpp"
#include "server/optimizer.hpp"

// Header-only (inlined here), as in server/checkpoint.cc.
#define XXH_INLINE_ALL
#include <xxhash.h>

namespace parasol {
namespace {

std::string Hex(uint64_t v) {
  char buf[24];
  std::snprintf(buf, sizeof(buf), "%016" PRIx64, v);
  return buf;
}

// Whether every part is a sparse pull (only those may be prefetches).
bool OnlySparsePulls(std::span<const StepPart> parts) {
  return std::all_of(parts.begin(), parts.end(),
                     [](const StepPart& p) { return p.header.op == Op::PullSparse; });
}

// Ops that take part in the job (and are refused once it has failed).
bool IsJobOp(Op op) {
  return op == Op::PullSparse || op == Op::PushSparse || op == Op::PullDense ||
         op == Op::PushDense || op == Op::Clock || op == Op::Barrier || op == Op::Step;
}

}  // namespace

ShardServer::ShardServer(const Manifest& manifest, uint32_t rank, Env* env)
    : manifest_(manifest),
      rank_(rank),
      env_(env ? env : Env::Real()),
      num_shards_(static_cast<uint32_t>(manifest.cluster.servers.size())),
      fingerprint_(manifest.Fingerprint()),
      context_(1),
      router_(context_, zmq::socket_type::router),
      engines_(manifest.server.engine_threads),
      push_gate_(std::max(manifest.cluster.workers, manifest.cluster.max_workers)),
      controller_(manifest.training, manifest.cluster.workers, env_->Now(),
                  manifest.cluster.max_workers),
      membership_(JobMembership(manifest)),
      epoch_(env_->Random64() | 1),
      held_count_(membership_.max_ranks(), 0),
      held_worker_bytes_(membership_.max_ranks(), 0),
      reply_dropped_since_(membership_.max_ranks()) {
  // A clock has a part per worker; what the spares keep is bounded like the pending sums.
  spare_parts_.max_parts = membership_.max_ranks() + 1;
  spare_parts_.max_bytes = manifest_.server.max_pending_bytes / 4;
  apply_after_reply_ = ApplyAfterReply(manifest_.server, UsableCores());
  tables_status_ = ResetTables();
}

MemoryShares SplitMemoryBudget(const ServerOptions& server) {
  const uint64_t budget = server.memory_budget;
  MemoryShares m;
  m.disk_cache = std::clamp<uint64_t>(budget / 8, 2 << 20, 256 << 20);
  m.replies = std::min<uint64_t>(server.max_queued_reply_bytes,
                                 std::clamp<uint64_t>(budget / 8, 1 << 20, 256 << 20));
  // Two blocks at a time (one being read or written, one applied).
  m.checkpoint_blocks = std::clamp<uint64_t>(budget / 32, 1 << 20, ShardState::kRowBlockBytes);
  const uint64_t others = m.disk_cache + m.replies + 2 * m.checkpoint_blocks;
  m.rows = budget > others ? budget - others : budget / 4;
  return m;
}

std::string ShardServer::DiskDir() const {
  const std::string shard = "shard-" + std::to_string(rank_);
  if (!manifest_.server.disk_dir.empty()) return manifest_.server.disk_dir + "/" + shard;
  std::error_code ec;
  std::filesystem::path tmp = std::filesystem::temp_directory_path(ec);
  if (ec) tmp = "/tmp";
  // The process id keeps two jobs of one name on this host apart; the folders of this shard's
  // processes that died without removing theirs (kill -9) go now.
  const std::string prefix = "parasol-disk-" + manifest_.job.name + "-" + shard + "-";
  for (const auto& e : std::filesystem::directory_iterator(tmp, ec)) {
    const std::string name = e.path().filename().string();
    if (name.rfind(prefix, 0) != 0) continue;
    const std::string pid_text = name.substr(prefix.size());
    if (pid_text.empty() || pid_text.find_first_not_of("0123456789") != std::string::npos) continue;
    const long pid = std::strtol(pid_text.c_str(), nullptr, 10);
    if (pid > 0 && ::kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH) {
      std::error_code rm;
      std::filesystem::remove_all(e.path(), rm);
    }
  }
  return (tmp / (prefix + std::to_string(::getpid()))).string();
}

Status ShardServer::ResetTables() {
  sparse_.clear();
  dense_.clear();
  disk_.reset();  // closes the old store (a new one starts empty)
  std::vector<std::string> families;
  std::vector<std::pair<uint32_t, uint32_t>> tiered;  // (table id, its first column family)
  const uint32_t engines = engines_.size();
  for (const TableOptions& t : manifest_.tables) {
    if (t.kind == TableKind::kSparse) {
      sparse_.push_back(std::make_unique<SparseTable>(t, engines));
      dense_.push_back(nullptr);
      // Incremental checkpoints: a delta lists the rows removed since the one before it.
      if (manifest_.checkpoint.full_every > 1 && !manifest_.checkpoint.dir.empty()) {
        for (uint32_t e = 0; e < engines; ++e) sparse_.back()->partition(e).RecordRemovals(true);
      }
      if (t.storage == TableOptions::Storage::kTiered) {
        tiered.emplace_back(static_cast<uint32_t>(sparse_.size() - 1),
                            static_cast<uint32_t>(families.size()));
        for (uint32_t e = 0; e < engines; ++e) {
          families.push_back(t.name + "#" + std::to_string(e));
        }
      }
    } else {
      sparse_.push_back(nullptr);
      dense_.push_back(
          std::make_unique<DenseTable>(
              t, Placement(manifest_.cluster.InitialServers()).DenseSliceOf(t.NumElements(), rank_),
              retired_dense_bytes_));
    }
  }
  if (tiered.empty()) return Status::Ok();
  // server.memory_budget covers all this shard holds for its tiered tables: RocksDB (one cache
  // with a strict capacity: blocks read and memtables), replies queued for their peers, the
  // blocks a checkpoint is written and read in, and the in-memory rows with their index.
  const MemoryShares shares = SplitMemoryBudget(manifest_.server);
  PARASOL_ASSIGN_OR_RETURN(disk_, DiskTier::Open(DiskDir(), families, shares.disk_cache));
  // The rows' share, among the tiered tables equally, in rows: a row's bytes in memory are its
  // stored words (values, state, clock word), its index entry (4-byte buckets at a load of
  // 0.35 or more: at most 12 bytes a row), its key and its referenced flag (for CLOCK).
  const uint64_t share = shares.rows / tiered.size();
  for (const auto& [id, family] : tiered) {
    SparseTable& table = *sparse_[id];
    const uint64_t row_bytes = sizeof(float) * table.partition(0).stored_words() + 12 + 8 + 1;
    table.SetDiskTier(disk_.get(), family, std::max<uint64_t>(engines, share / row_bytes));
  }
  max_queued_reply_bytes_ = shares.replies;
  checkpoint_block_bytes_ = shares.checkpoint_blocks;
  spdlog::info("shard {}: disk tier of {} table(s) in {}, memory budget {} bytes", rank_,
               tiered.size(), disk_->dir(), manifest_.server.memory_budget);
  return Status::Ok();
}

ShardServer::~ShardServer() {
  FinishDeferredApply();  // the background reads the tables
  WaitForBackgroundCheckpoint();  // its file is in place, or its failure logged
}

Status ShardServer::Bind() {
  PARASOL_RETURN_IF_ERROR(tables_status_.WithContext("shard " + std::to_string(rank_)));
  const ServerAddress& me = manifest_.cluster.servers[rank_];
  const SecurityOptions& sec = manifest_.security;
  std::string host = manifest_.cluster.bind;
  if (host == "listed" || (host.empty() && sec.curve)) host = me.host;
  if (host.empty()) {
    host = "127.0.0.1";
    if (me.host != "127.0.0.1" && me.host != "localhost") {
      spdlog::warn("shard {}: security is off, so it binds loopback ({}) instead of {}; set "
                   "cluster.bind (listed, or an address) to serve other hosts",
                   rank_, host, me.host);
    }
  }
  endpoint_ = TcpEndpoint(host, me.port);
  if (Status resolves = CheckResolves(host); !resolves.ok()) {
    return resolves.WithContext("shard " + std::to_string(rank_) + ": cannot bind " + endpoint_);
  }
  const bool loopback = IsLoopbackHost(host);
  if (!sec.curve && !loopback) {
    // As Redis's protected mode: a shard reachable from other hosts without keys lets anyone
    // who reaches the port control the job; it starts so only when the manifest says so.
    if (sec.mode != SecurityOptions::Mode::kInsecure) {
      return FailedPrecondition(
          "shard " + std::to_string(rank_) + ": refusing to bind " + endpoint_ +
          " without security: anyone who reaches it could read, push, checkpoint and stop this "
          "job. Set security.curve: true with keys (parasol keygen), bind loopback, or state "
          "security.mode: insecure to accept that");
    }
    spdlog::warn("shard {}: binds {} without security (security.mode: insecure): any host that "
                 "reaches it may read, push and stop this job",
                 rank_, endpoint_);
  }
  try {
    if (sec.curve) {
      if (!CurveAvailable()) return FailedPrecondition("this libzmq has no CURVE support");
      PARASOL_ASSIGN_OR_RETURN(CurveKeyPair keys, ReadCurveKeyPair(sec.server_keys[rank_]));
      std::set<std::string> allowed;
      for (const std::string& path : sec.allowed_clients) {
        PARASOL_ASSIGN_OR_RETURN(std::string key, ReadCurvePublicKey(path));
        allowed.insert(key);
      }
      PARASOL_ASSIGN_OR_RETURN(worker_keys_,
                               WorkerKeyBinding::Load(sec, std::max(manifest_.cluster.max_workers,
                                                             manifest_.cluster.workers)));
      allowed.insert(worker_keys_.keys().begin(), worker_keys_.keys().end());
      allowed.insert(worker_keys_.operator_keys().begin(), worker_keys_.operator_keys().end());
      PARASOL_ASSIGN_OR_RETURN(
          membership_macs_,
          MembershipMacs::ForShard(sec, rank_,
                                   static_cast<uint32_t>(manifest_.cluster.servers.size()),
                                   fingerprint_));
      zap_ = std::make_unique<ZapHandler>(context_, std::move(allowed),
                                          "shard " + std::to_string(rank_));
      PARASOL_RETURN_IF_ERROR(zap_->Start(router_));
      router_.set(zmq::sockopt::curve_server, true);
      router_.set(zmq::sockopt::curve_secretkey, keys.secret_key);
      router_.set(zmq::sockopt::zap_domain, "parasol");
    }
    ConfigureDataSocket(router_);
    // Peers that went away without closing (half-open) or never finish the handshake are
    // dropped: a ping every 10 s, gone after 30 s unanswered; 10 s for a handshake.
    router_.set(zmq::sockopt::heartbeat_ivl, 10000);
    router_.set(zmq::sockopt::heartbeat_timeout, 30000);
    router_.set(zmq::sockopt::handshake_ivl, 10000);
    router_.set(zmq::sockopt::sndhwm, static_cast<int>(manifest_.server.socket_hwm));
    router_.set(zmq::sockopt::rcvhwm, static_cast<int>(manifest_.server.socket_hwm));
    router_.set(zmq::sockopt::router_mandatory, true);
    router_.set(zmq::sockopt::maxmsgsize,
                static_cast<int64_t>(manifest_.server.max_request_bytes + kMaxHeaderBytes));
    // The connections' cap: the open-file limit less what the shard keeps for itself (its
    // checkpoint files and pipe, the metrics server, RocksDB's files, ZeroMQ's own).
    {
      rlimit files{};
      int64_t cap = 0;
      if (::getrlimit(RLIMIT_NOFILE, &files) == 0 && files.rlim_cur != RLIM_INFINITY) {
        const int64_t limit = static_cast<int64_t>(files.rlim_cur);
        cap = std::max<int64_t>(16, limit - std::max<int64_t>(256, limit / 8));
      }
      cap = cap > 0 ? std::min<int64_t>(cap, manifest_.server.max_connections)
                    : manifest_.server.max_connections;
      watch_ = std::make_unique<ConnectionWatch>(
          context_, "shard " + std::to_string(rank_), sec.curve, cap,
          std::chrono::milliseconds(std::max<int64_t>(0, manifest_.server.idle_timeout_ms)),
          manifest_.cluster.servers[rank_].port);
      PARASOL_RETURN_IF_ERROR(watch_->Start(router_));
    }
    // A process of this shard that was just killed may hold the port a moment longer (its
    // background checkpoint's writer dies with it, and a large one takes time to go): tried
    // again for up to 10 s while the address is in use.
    for (int attempt = 0;; ++attempt) {
      try {
        router_.bind(endpoint_);
        break;
      } catch (const zmq::error_t& e) {
        if (e.num() != EADDRINUSE || attempt >= 100) throw;
        if (attempt == 0) {
          spdlog::warn("shard {}: {} is in use; trying again for up to 10 s", rank_, endpoint_);
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
      }
    }
  } catch (const zmq::error_t& e) {
    return Unavailable("shard " + std::to_string(rank_) + ": cannot bind " + endpoint_ + ": " +
                       e.what());
  }
  return Status::Ok();
}

Status ShardServer::Serve(const std::atomic<bool>& stop) {
  spdlog::info("shard {}/{} serving on {} ({} tables, {} engine threads, manifest {})", rank_,
               num_shards_, endpoint_, manifest_.tables.size(), engines_.size(),
               Hex(fingerprint_));
  if (manifest_.metrics.enabled) {
    metrics_ = std::make_unique<MetricsServer>(manifest_.metrics.host,
                                               manifest_.metrics.port + rank_);
    PARASOL_RETURN_IF_ERROR(metrics_->Start());
    if (restore_attempted_) metrics_->Publish(MetricsText());
  }
  // Started without a restore (parasol server): the checkpoint is loaded now, on a thread of
  // its own, while this thread answers every request with how far it is.
  if (!restore_attempted_) PARASOL_RETURN_IF_ERROR(RestoreWhileAnswering(stop));
  if (restore_abandoned_) {
    spdlog::info("shard {}: stopped while loading its checkpoint ({}); its checkpoints are as "
                 "they were",
                 rank_, RestoreProgressText());
    return Status::Ok();
  }
  if (metrics_) {
    metrics_->SetHealthNote("");
    metrics_->SetHealthy(true);
    metrics_->Publish(MetricsText());
  }
  zmq::pollitem_t items[] = {{router_.handle(), 0, ZMQ_POLLIN, 0}};
  time_cut_ = env_->Now();
  serving_ = kServeOther;
  while (!stop.load() && !shutdown_requested_) {
    if (metrics_ && env_->Now() - last_publish_ >
                        std::chrono::milliseconds(250)) {
      FinishDeferredApply();
      last_publish_ = env_->Now();
      metrics_->Publish(MetricsText());
    }
    CutTime(kServeOther);
    try {
      zmq::poll(items, 1, std::chrono::milliseconds(100));
    } catch (const zmq::error_t& e) {
      CutTime(kServeWaiting);
      if (e.num() == EINTR) continue;
      return Unavailable(std::string("poll failed: ") + e.what());
    }
    CutTime(kServeWaiting);
    RunPeriodic();
    if (!(items[0].revents & ZMQ_POLLIN)) continue;
    // Drain what is queued before polling again.
    for (int i = 0; i < 256; ++i) {
      auto frames = RecvFrames(router_, /*dontwait=*/true);
      if (!frames.ok()) return frames.status();
      if (!frames->has_value()) break;
      ServeMessage(**frames);
      if (shutdown_requested_) break;
    }
  }
  FinishDeferredApply();
  if (metrics_) metrics_->SetHealthy(false);
  // Stopped by a signal or asked to stop (parasol shutdown): the last checkpoint holds every
  // update this shard acknowledged, so nothing is due from the workers' logs after it (it is
  // final) -- unless a worker still owes this process a replay: those updates are only in
  // its log, and a restore from this checkpoint must still expect them.
  Status last;
  if (!manifest_.checkpoint.dir.empty()) {
    const bool owed = controller_.ReplayOwed();
    last = SaveCheckpoint(std::string(shutdown_requested_ ? "on shutdown" : "on stop") +
                              (owed ? ", a worker's replay still due" : ""),
                          /*final=*/!owed);
    if (!last.ok()) {
      spdlog::error("shard {}: the last checkpoint failed: {}", rank_, last.ToString());
    }
    // Requests waiting for a checkpoint: this one holds everything.
    for (HeldReply& w : checkpoint_waiters_) AnswerHeld(w, last);
    checkpoint_waiters_.clear();
  }
  spdlog::info("shard {} stopping: {}", rank_, StatsJson());
  return last.WithContext("the last checkpoint");
}

Status ShardServer::RestoreWhileAnswering(const std::atomic<bool>& stop) {
  const CheckpointOptions& c = manifest_.checkpoint;
  // Nothing to load: nothing to wait for.
  if (c.dir.empty() || !c.restore || ListCheckpoints(c.dir, rank_, env_->Files()).empty()) {
    return Restore();
  }
  std::atomic<bool> done{false};
  Status restored;
  std::thread loader([&] {
    try {
      restored = Restore();
    } catch (const std::bad_alloc&) {
      ExitOutOfMemory("a shard's checkpoint loader");
    }
    done.store(true);
  });
  zmq::pollitem_t items[] = {{router_.handle(), 0, ZMQ_POLLIN, 0}};
  Status failed;
  auto last_note = std::chrono::steady_clock::time_point{};
  uint64_t last_bytes = ~uint64_t{0};
  auto progressed = env_->Now();
  bool said_stop = false;
  while (!done.load()) {
    const auto now = env_->Now();
    const uint64_t bytes = restore_progress_.bytes_done.load();
    if (bytes != last_bytes) {
      last_bytes = bytes;
      progressed = now;
    }
    if (now - last_note > std::chrono::milliseconds(250)) {
      last_note = now;
      if (metrics_) {
        // Alive while it moves: a load that stops moving for request_timeout is unhealthy.
        metrics_->SetHealthy(now - progressed <=
                             std::chrono::milliseconds(manifest_.cluster.request_timeout_ms));
        metrics_->SetHealthNote(RestoreProgressText());
        metrics_->Publish(RestoringMetricsText());
      }
    }
    if (stop.load() && !said_stop) {
      // The load is abandoned at its next block: this process has taken no update yet, so
      // its checkpoints hold everything, and it stops without writing one.
      said_stop = true;
      restore_progress_.cancel.store(true);
      spdlog::info("shard {}: asked to stop while loading its checkpoint; the load is "
                   "abandoned and nothing is written",
                   rank_);
    }
    try {
      zmq::poll(items, 1, std::chrono::milliseconds(20));
    } catch (const zmq::error_t& e) {
      if (e.num() == EINTR) continue;
      failed = Unavailable(std::string("poll failed: ") + e.what());
      break;
    }
    if (!(items[0].revents & ZMQ_POLLIN)) continue;
    for (int i = 0; i < 256 && !done.load(); ++i) {
      auto frames = RecvFrames(router_, /*dontwait=*/true);
      if (!frames.ok()) {
        failed = frames.status();
        break;
      }
      if (!frames->has_value()) break;
      AnswerWhileRestoring(**frames);
      NoteConnectionSeen(**frames);
    }
    if (!failed.ok()) break;
  }
  loader.join();
  PARASOL_RETURN_IF_ERROR(failed);
  if (!restored.ok() && restore_progress_.cancel.load()) {
    restore_abandoned_ = true;
    return Status::Ok();
  }
  return restored;
}

std::string ShardServer::RestoreProgressText() const {
  const uint64_t done = restore_progress_.bytes_done.load();
  const uint64_t total = std::max<uint64_t>(1, restore_progress_.bytes_total.load());
  const uint64_t rows_total = restore_progress_.rows_total.load();
  char pct[32];
  std::snprintf(pct, sizeof(pct), "%.1f%%", 100.0 * static_cast<double>(done) / total);
  return "loading its checkpoint: " + std::string(pct) + " (" +
         std::to_string(restore_progress_.rows_done.load()) + " of " +
         (rows_total ? std::to_string(rows_total) : std::string("?")) + " rows)";
}

std::string ShardServer::RestoringMetricsText() const {
  PrometheusText t;
  auto gauge = [&](const std::string& name, const std::string& help, double value) {
    t.Type(name, "gauge", help);
    t.Sample(name, value);
  };
  gauge("parasol_restoring", "1 while the shard loads its checkpoint", 1);
  gauge("parasol_restore_bytes_done",
        "bytes of the checkpoint read (each twice: checked, then applied)",
        static_cast<double>(restore_progress_.bytes_done.load()));
  gauge("parasol_restore_bytes_total", "what parasol_restore_bytes_done goes up to",
        static_cast<double>(restore_progress_.bytes_total.load()));
  gauge("parasol_restore_rows_done", "rows applied",
        static_cast<double>(restore_progress_.rows_done.load()));
  gauge("parasol_restore_rows_total", "rows in the checkpoint (0 until it is checked)",
        static_cast<double>(restore_progress_.rows_total.load()));
  return t.str();
}

// Touches nothing the loading thread writes: the socket, and the progress counters.
void ShardServer::AnswerWhileRestoring(std::vector<zmq::message_t>& frames) {
  if (frames.empty()) return;
  restoring_requests_.fetch_add(1, std::memory_order_relaxed);
  Header reply;
  reply.is_reply = true;
  reply.op = Op::Error;
  Result<Header> req = frames.size() < 2 ? Result<Header>(BadMessage("message has no header frame"))
                                         : DecodeHeader(frames[1].data(), frames[1].size());
  request_well_formed_ = req.ok();
  if (!req.ok()) {
    reply.status = req.status().code();
    reply.message = "shard " + std::to_string(rank_) + ": " + req.status().message();
  } else {
    reply = ReplyTo(*req, Status::Ok());
    if (req->op == Op::Stats && !req->is_reply) {
      Json s;
      s["shard"] = rank_;
      s["shards"] = num_shards_;
      s["restoring"] = true;
      s["restore_bytes_done"] = restore_progress_.bytes_done.load();
      s["restore_bytes_total"] = restore_progress_.bytes_total.load();
      s["restore_rows_done"] = restore_progress_.rows_done.load();
      s["restore_rows_total"] = restore_progress_.rows_total.load();
      reply.message = s.dump();
    } else {
      reply.status = StatusCode::kUnavailable;
      reply.message = "shard " + std::to_string(rank_) + " is " + RestoreProgressText() +
                      "; ask again";
    }
  }
  // No epoch: the process a worker will hear from once it is loaded is what it compares.
  reply.shard_rank = rank_;
  reply.shard_count = num_shards_;
  reply.restore_done = restore_progress_.bytes_done.load();
  reply.restore_total = std::max<uint64_t>(1, restore_progress_.bytes_total.load());
  reply.restore_rows = restore_progress_.rows_done.load();
  reply.restore_rows_total = restore_progress_.rows_total.load();
  std::vector<zmq::message_t> out;
  out.emplace_back(frames[0].data(), frames[0].size());
  out.push_back(EncodeHeader(reply));
  if (reply_sink_) {
    reply_sink_(out);
    return;
  }
  // Never blocks: a peer that does not read its answers loses them.
  (void)SendFrames(router_, out, /*dontwait=*/true);
}

uint64_t ShardServer::StateStamp() const {
  uint64_t stamp = counters_.rows_pushed + counters_.dense_elements_pushed +
                   counters_.bsp_clocks_applied;
  for (int64_t c : controller_.clocks()) stamp = stamp * 31 + static_cast<uint64_t>(c);
  return stamp;
}

void ShardServer::RunPeriodic() {
  // The serve loop has just cut the time before (its wait); an in-process driver's time between
  // calls is its own.
  time_cut_ = env_->Now();
  FinishDeferredApply();  // before anything else reads the tables
  // (At most once a second: a scan of up to kMaxPeers accounts.)
  if (peers_.size() > 1024 &&
      env_->Now() - last_peer_sweep_ > std::chrono::seconds(1)) {
    last_peer_sweep_ = env_->Now();
    ForgetIdlePeers();
  }
  PollBackgroundCheckpoint(/*wait=*/false);
  StartRequestedCheckpoint();
  KeepLeaversDone();
  MaybeSweep();
  CheckWorkers();
  // Owed before this shard heard of a change no rollback crosses (a change of the shard count
  // shard 0 had named, or a leaver's end): none will come. Kept owed, it would stop this
  // shard's checkpoints (they wait for the rollback) and the workers' logs would grow until
  // they fail. The loss stays reported. (A leaver's end known here is shard 0's to judge: the
  // workers ask it within their patience for a request, and it refuses or rolls back.)
  std::string barrier;
  if (rollback_owed_) barrier = BarRollback();
  if (rollback_owed_ && barrier.empty() &&
      env_->Now() - rollback_owed_since_ > WorkerPatience()) {
    barrier = LeaverBarrier();
  }
  if (!barrier.empty()) {
    rollback_owed_ = false;
    spdlog::error("shard {}: the rollback the job owed cannot go back past {}; the updates lost "
                  "stay lost (reported), and the job goes on", rank_, barrier);
  }
  MaybeCheckpoint();
  ReportNonfiniteUpdates();
}

uint64_t ShardServer::NonfiniteUpdatesKept() const {
  uint64_t kept = 0;
  for (const auto& t : sparse_) kept += t ? t->optimizer().nonfinite_kept() : 0;
  for (const auto& t : dense_) kept += t ? t->optimizer().nonfinite_kept() : 0;
  return kept;
}

void ShardServer::ReportNonfiniteUpdates() {
  nonfinite_reported_.resize(manifest_.tables.size(), 0);
  std::string which;
  for (size_t t = 0; t < manifest_.tables.size(); ++t) {
    const Optimizer* opt = sparse_[t]  ? &sparse_[t]->optimizer()
                           : dense_[t] ? &dense_[t]->optimizer()
                                       : nullptr;
    if (!opt || opt->nonfinite_kept() == nonfinite_reported_[t]) continue;
    which += (which.empty() ? "" : ", ") + std::string("'") + manifest_.tables[t].name + "' " +
             std::to_string(opt->nonfinite_kept() - nonfinite_reported_[t]);
    nonfinite_reported_[t] = opt->nonfinite_kept();
  }
  uint64_t left_out = 0;
  if (which.empty() || !nonfinite_log_.Allow(env_->Now(), &left_out)) return;
  spdlog::warn("shard {}: updates that would have made values or their optimizer state "
               "infinite or NaN (finite gradients that overflow: a learning rate or gradients "
               "too large) were not made; those elements keep their values: table {} "
               "elements{}",
               rank_, which,
               left_out ? " (" + std::to_string(left_out) + " such lines not logged)" : "");
}

void ShardServer::HandleMessage(std::vector<zmq::message_t>& frames) {
  time_cut_ = env_->Now();  // the time between two calls is the driver's
  ServeMessage(frames);
  FinishDeferredApply();  // an in-process driver reads the shard next
}

void ShardServer::ServeMessage(std::vector<zmq::message_t>& frames) {
  CutTime(serving_);  // receiving it, and what came before
  serving_ = kServeOther;
  HandleOneMessage(frames);
  NoteConnectionSeen(frames);
  // The message is answered: what a split apply left is applied in the background while its
  // sender reads the reply, and finished before anything else is handled.
  StartDeferredApply();
  CutTime(serving_);
  serving_ = kServeOther;
  for (std::vector<uint64_t>& keys : pull_keys_) {
    keys.clear();
    // A large pull's keys are not held after it.
    if (keys.capacity() > (size_t{1} << 20)) keys.shrink_to_fit();
  }
}

void ShardServer::NoteConnectionSeen(std::vector<zmq::message_t>& frames) {
  // Only a well-formed request counts: junk keeps no connection from being idle.
  if (!watch_ || frames.empty() || !request_well_formed_) return;
  // The descriptor it came over (for the idle check; its sender's Hello has been taken in,
  // so a worker's connection counts as one from its Hello on).
  // (Frames from the wire carry it; the routing id frame, the ROUTER's own, does not.)
  const int fd = zmq_msg_get(frames.back().handle(), ZMQ_SRCFD);
  const PeerAccount* peer = Peer(frames[0], /*create=*/false);
  watch_->Seen(fd, peer != nullptr && peer->member_of >= 0);
}

void ShardServer::HandleOneMessage(std::vector<zmq::message_t>& frames) {
  FinishDeferredApply();
  request_well_formed_ = false;
  if (frames.empty()) return;
  ++counters_.requests;
  if (frames.size() < 2) {
    ++counters_.bad_messages;
    Header err;
    err.op = Op::Error;
    err.is_reply = true;
    err.status = StatusCode::kBadMessage;
    err.message = "message has no header frame";
    SendReply(frames[0], err, {});
    return;
  }
  const zmq::message_t& identity = frames[0];
  if (!reply_sink_) {
    // A peer over its share of queued replies is not served until it reads them: nothing it
    // asks adds to what it holds.
    PeerAccount* peer = Peer(identity, /*create=*/true);
    peer->last_seen = env_->Now();
    // (Outside the job: once it holds half its share, as a peer that reads holds almost none.)
    const uint64_t mine = peer->queued->load();
    const uint64_t share = PeerShare(*peer);
    if (mine > 0 && mine >= (peer->member_of >= 0 ? share : share / 2)) {
      ++counters_.peer_refusals;
      uint64_t left_out = 0;
      if (peer->log.Allow(peer->last_seen, &left_out)) {
        const char* from = zmq_msg_gets(frames[1].handle(), "Peer-Address");
        spdlog::warn("shard {}: a peer{}{} has not read {} bytes of replies (its share: {}); its "
                     "requests are not served until it does{}",
                     rank_, from ? std::string(" at ") + from : std::string(),
                     peer->member_of >= 0 ? " (worker " + std::to_string(peer->member_of) + ")"
                                          : std::string(),
                     mine, PeerShare(*peer),
                     left_out ? " (" + std::to_string(left_out) + " more not logged)" : "");
      }
      // Told so in a reply of a few bytes, sent only while its ZeroMQ queue takes it.
      Header refused;
      refused.op = Op::Error;
      refused.is_reply = true;
      refused.status = StatusCode::kUnavailable;
      refused.message = "shard " + std::to_string(rank_) + ": this connection has " +
                        std::to_string(mine) + " bytes of replies unread; read them first";
      std::vector<zmq::message_t> f;
      f.emplace_back(identity.data(), identity.size());
      f.push_back(EncodeHeader(Stamped(refused)));
      (void)SendFrames(router_, f, /*dontwait=*/true);
      return;
    }
  }
  Result<Header> decoded = DecodeHeader(frames[1].data(), frames[1].size());
  if (!decoded.ok()) {
    ++counters_.bad_messages;
    uint64_t left_out = 0;
    if (bad_message_log_.Allow(env_->Now(), &left_out)) {
      spdlog::warn("shard {}: rejected a message: {}{}", rank_, decoded.status().ToString(),
                   left_out ? " (and " + std::to_string(left_out) + " more since the last line)"
                            : std::string());
    }
    Header err;
    err.op = Op::Error;
    err.is_reply = true;
    err.status = decoded.status().code();
    err.message = "shard " + std::to_string(rank_) + ": " + decoded.status().message();
    SendReply(identity, err, {});
    return;
  }
  const Header& req = *decoded;
  request_well_formed_ = true;
  serving_ = ServeKindOf(req.op);
  uint64_t bytes = 0;
  for (size_t i = 1; i < frames.size(); ++i) bytes += frames[i].size();
  op_bytes_[static_cast<int>(req.op) & 15] += bytes;
  Header reply = ReplyTo(req, Status::Ok());
  std::vector<zmq::message_t> payload;
  bool held = false;
  // With security.worker_keys, a request is served only from the claimed worker's key (the
  // connection's ZAP User-Id); a refused one is answered with the error and not applied.
  Status st = worker_keys_.Check(req, zmq_msg_gets(frames[1].handle(), "User-Id"));
  const bool replayable =
      req.op == Op::Clock || req.op == Op::PushSparse || req.op == Op::PushDense;
  if (st.ok() && req.replay && replayable && req.known_epoch != epoch_) {
    // Part of a replay to an earlier process of this shard, left in the worker's queue when
    // that process died: applying it here would take this process's clocks past pushes it
    // never had. The worker replays to this process on its own.
    ++counters_.stale_replays;
    return;
  }
  if (st.ok()) st = CheckGeneration(req);
  if (st.ok() && req.op == Op::Step) {
    HandleStep(req, frames);
    NoteBehind();
    return;
  }
  if (st.ok()) st = Dispatch(req, frames, &reply, &payload, &held);
  NoteBehind();
  if (req.replay) {
    ++(req.op == Op::Clock ? counters_.replayed_clocks : counters_.replayed_pushes);
    if (!st.ok()) ++counters_.refused_replays;
  }
  if (held) return;  // `frames` now belong to a held request
  if (!st.ok()) {
    NoteFailure(OpName(req.op), req.worker_id, st);
    reply = ReplyTo(req, st.WithContext("shard " + std::to_string(rank_)));
    payload.clear();
  }
  if (env_->Hit("shard.reply") == Fault::kDrop ||
      (req.replay && env_->Hit("shard.replay_reply") == Fault::kDrop)) {
    return;  // the worker resends after cluster.request_timeout
  }
  SendReply(identity, reply, std::move(payload));
}


void ShardServer::NoteBehind() {
  if (!controller_.TakeBehind() || !manifest_.RollsBack() || rollback_owed_ ||
      !BarRollback().empty()) {
    return;
  }
  // A worker's clock is behind where the others had seen it: two failures overlapped and its
  // updates since a checkpoint are lost. Every reply says so until the job has rolled back.
  OweRollback();
  spdlog::error("shard {}: the slowest worker is behind where the others had seen it (two "
                "failures overlapped); the job rolls back to a checkpoint every shard holds",
                rank_);
}

Status ShardServer::CheckGeneration(const Header& req) {
  // Tools and the rollback itself speak across generations; a worker's requests do not.
  if (!IsJobOp(req.op) && req.op != Op::Hello && req.op != Op::Membership) return Status::Ok();
  if (!controller_.InJob(req.worker_id)) return Status::Ok();
  if (req.rollback_gen == rollback_gen_) return Status::Ok();
  if (req.rollback_gen < rollback_gen_) {
    ++counters_.rolled_back_requests;
    return Aborted("the job rolled back to clock " + std::to_string(rollback_clock_) +
                   " (rollback " + std::to_string(rollback_gen_) + "): this " + OpName(req.op) +
                   " of worker " + std::to_string(req.worker_id) + " belongs to the history " +
                   "that was undone; the worker connects again and redoes its steps from there");
  }
  return Unavailable("worker " + std::to_string(req.worker_id) + " is at rollback " +
                     std::to_string(req.rollback_gen) + " and this shard at " +
                     std::to_string(rollback_gen_) + " (the rollback has not reached it yet)");
}

Status ShardServer::Admit(const Header& req) {
  const bool in_job = controller_.InJob(req.worker_id);
  if (in_job) {
    controller_.Heard(req.worker_id, env_->Now());
    HeardAfterDrop(req.worker_id);
    // Which process is this worker: a Hello of another one means it restarted.
    // (Not a Rollback: it comes from the process about to be replaced by a new one.)
    if (controller_.incarnation(req.worker_id) == 0 && req.op != Op::Hello &&
        req.op != Op::Rollback) {
      controller_.set_incarnation(req.worker_id, req.incarnation);
    }
  }
  if (IsJobOp(req.op)) {
    if (controller_.IsLost(req.worker_id)) {
      return FailedPrecondition("worker " + std::to_string(req.worker_id) +
                                " was dropped from the job after going silent longer than "
                                "training.worker_timeout");
    }
    if (!job_failure_.ok()) return job_failure_;
  }
  return Status::Ok();
}

// The dtype a pull asks its reply's values in (wire.compression); state travels in f32.
static Status CheckPullDType(const Header& req) {
  if (req.dtype == wire::DType::F32) return Status::Ok();
  if (req.dtype != wire::DType::F16 && req.dtype != wire::DType::BF16) {
    return BadMessage(std::string(OpName(req.op)) + ": dtype " +
                      std::to_string(static_cast<int>(req.dtype)) +
                      " is not one of f32, f16, bf16");
  }
  if (req.with_state) {
    return BadMessage(std::string(OpName(req.op)) + ": a pull with state travels in f32");
  }
  return Status::Ok();
}

Status ShardServer::Dispatch(const Header& req, std::vector<zmq::message_t>& frames,
                             Header* reply, std::vector<zmq::message_t>* payload, bool* held) {
  // Only the pulls a split apply's first pass served may run before its second.
  if (req.op != Op::PullSparse && req.op != Op::PullDense) FinishDeferredApply();
  if (!req.is_reply && !req.members.empty()) PARASOL_RETURN_IF_ERROR(MergeMembership(req));
  PARASOL_RETURN_IF_ERROR(DispatchOp(req, frames, reply, payload, held));
  // A sender that knows fewer clocks learns them (its request's version says how many it knows).
  if (!*held && req.membership_version < membership_.version()) {
    reply->members = membership_.Entries();
    reply->member_macs = membership_macs_.Sign(reply->members);  // shard 0, with worker keys
  }
  return Status::Ok();
}

Status ShardServer::DispatchOp(const Header& req, std::vector<zmq::message_t>& frames,
                               Header* reply, std::vector<zmq::message_t>* payload, bool* held) {
  if (req.is_reply) return BadMessage(std::string(OpName(req.op)) + ": expected a request");
  if (req.status != StatusCode::kOk) {
    return BadMessage(std::string(OpName(req.op)) + ": a request must not carry a status");
  }
  Result<PayloadView> view = PayloadView::Parse(req, std::span<zmq::message_t>(frames).subspan(2),
                                                manifest_.server.max_request_bytes);
  if (!view.ok()) return view.status();
  op_counts_[static_cast<int>(req.op) & 15]++;
  const bool in_job = controller_.InJob(req.worker_id);
  PARASOL_RETURN_IF_ERROR(Admit(req));
  // A job request of the worker's process this shard knows (its incarnation) makes its
  // connection the worker's, as its Hello does: a restarted shard may hear a worker's resent
  // and replayed requests, or a Step, before any Hello of it (one sent while the shard was
  // still loading its checkpoint is answered with progress only), and would refuse their
  // replies as over what a connection outside the job may have queued (parasol_bench --only
  // scale --quick: a Step's reply refused so, the worker waited two minutes and was lost).
  if (!reply_sink_ && in_job && IsJobOp(req.op) && req.incarnation != 0 &&
      req.incarnation == controller_.incarnation(req.worker_id)) {
    MarkMember(frames[0], req.worker_id);
  }
  switch (req.op) {
    case Op::Hello: {
      const Status st = HandleHello(req, frames[0], reply, held);
      TellLostUpdates(req.worker_id, reply);  // (a held Hello's prepared reply was told so)
      return st;
    }
    case Op::Rollback:
      return HandleRollback(req, reply);
    case Op::PullSparse:
    case Op::PullDense:
      // Workers outside the job (observers) read without a bound. A shard that serves nothing
      // yet has no clocks of the workers: their pulls of the clocks it will serve wait for
      // its commit (ReadAllowed()).
      if (in_job && Entered()) {
        PARASOL_RETURN_IF_ERROR(controller_.CheckRequestClock(
            req.worker_id, req.clock, /*prefetch=*/req.op == Op::PullSparse));
        // Checked: a clock past the sender's is at most prefetch_depth past it (no overflow);
        // one before it (any, down to INT64_MIN) is not a prefetch.
        const int64_t own = controller_.clocks()[req.worker_id];
        if (req.clock > own) {
          counters_.pull_ahead_max = std::max(counters_.pull_ahead_max, req.clock - own);
        }
      }
      PARASOL_RETURN_IF_ERROR(CheckPullDType(req));  // before it may be held
      if (in_job && !ReadAllowed(req.worker_id, req.clock, req.membership_version)) {
        PARASOL_RETURN_IF_ERROR(HoldPull(req, frames, req.membership_version));
        *held = true;
        return Status::Ok();
      }
      if (in_job) ObserveWait(0);
      return HandlePull(req, *view, reply, payload);
    case Op::PushSparse:
    case Op::PushDense: {
      if (!in_job) {
        return InvalidArgument(std::string(OpName(req.op)) + ": worker " +
                               std::to_string(req.worker_id) + " is not in this job (cluster." +
                               "workers = " + std::to_string(manifest_.cluster.workers) + ", and it has not joined)");
      }
      // Whether it is new, a duplicate or a conflicting resend: server/push_gate.hpp.
      const uint64_t checksum = PushChecksum(req, frames);
      const bool moved_away = !Entered() && ChangeClock() >= 0 &&
                              migration_.installed >= ChangeClock() && req.clock < ChangeClock();
      const PushGate::Decision d = push_gate_.AdmitPush(req, checksum, SenderOf(req.worker_id),
                                                        moved_away);
      if (d.admission == PushGate::Admission::kConflict) {
        // The same name from the same worker process with another payload: a client that
        // reuses a push's name, or a forgery. Neither is applied over the first.
        ++counters_.conflicting_resends;
        return FailedPrecondition(std::string(OpName(req.op)) + " " + std::to_string(req.seq) +
                                  " of clock " + std::to_string(req.clock) + " of worker " +
                                  std::to_string(req.worker_id) + " to table " +
                                  TableName(req.table_id) + " was applied before with another "
                                  "payload; this resend is refused");
      }
      if (d.admission == PushGate::Admission::kDuplicate) {
        ++counters_.duplicate_pushes;
        reply->duplicate = true;
        return Status::Ok();
      }
      PARASOL_RETURN_IF_ERROR(push_gate_.CanMark(req));
      PARASOL_RETURN_IF_ERROR(controller_.CheckRequestClock(req.worker_id, req.clock));
      PARASOL_RETURN_IF_ERROR(CheckFinite(req, *view));
      PARASOL_RETURN_IF_ERROR(HandlePush(req, *view, reply));
      uint64_t payload_bytes = 0;
      for (size_t f = 2; f < frames.size(); ++f) payload_bytes += frames[f].size();
      PARASOL_RETURN_IF_ERROR(push_gate_.Mark(req, checksum, payload_bytes));
      const std::vector<uint64_t>& since = push_gate_.pushed_since_checkpoint();
      const uint64_t pushed = req.worker_id < since.size() ? since[req.worker_id] : 0;
      // The push log bound is checked at once, not at the next poll: a burst of large pushes
      // would otherwise grow the workers' logs past it. A worker logs what it pushed here
      // since the newest durable checkpoint began: once that nears its share of the bound
      // (max_log_bytes / shards, less room for one more push) while a checkpoint is written
      // in the background, this reply waits for that checkpoint to be durable.
      if (!manifest_.checkpoint.dir.empty()) {
        const uint64_t share = manifest_.checkpoint.max_log_bytes / num_shards_;
        const uint64_t room = std::min(share / 2, manifest_.server.max_request_bytes);
        if (background_ && pushed + room > share) {
          ++counters_.checkpoint_log_waits;
          WaitForBackgroundCheckpoint();
        }
        if (pushed >= share / 2) MaybeCheckpoint();
      }
      (void)env_->Hit("shard.applied");
      if (req.replay) (void)env_->Hit("shard.replay_applied");
      return Status::Ok();
    }
    case Op::Clock:
      PARASOL_RETURN_IF_ERROR(HandleClock(req));
      // Before anything is released: a worker passes the last barrier and exits, its push log
      // with it, only once this checkpoint holds everything it pushed (a checkpoint finishes
      // a split apply first).
      may_split_apply_ = true;
      ApplyReadyAggregates();
      may_split_apply_ = false;
      if (req.done) CheckpointWhenAllDone();
      if (req.done) CheckpointWhenALeaverIsDone(req.worker_id);
      CheckpointWhenRemoved();
      AfterClockChange();
      // A checkpoint every N steps is begun at the tick that completes its clock: the next
      // poll may come clocks later (a loop drains every message that waits).
      if (manifest_.checkpoint.every_steps > 0) {
        PollBackgroundCheckpoint(/*wait=*/false);  // one that has finished is no obstacle
        MaybeCheckpoint();
      }
      return Status::Ok();
    case Op::Barrier: {
      PARASOL_ASSIGN_OR_RETURN(*held, HandleBarrier(req, frames[0]));
      return Status::Ok();
    }
    case Op::Stats:
      reply->message = StatsJson();
      return Status::Ok();
    case Op::Shutdown:
      spdlog::info("shard {}: shutdown requested by {}", rank_,
                   controller_.InJob(req.worker_id) ? "worker " + std::to_string(req.worker_id)
                                                    : std::string("a client outside the job"));
      shutdown_requested_ = true;
      return Status::Ok();
    case Op::Checkpoint: {
      // Any client may ask; a flood of requests writes nothing new while nothing changes.
      const uint64_t stamp = StateStamp();
      if (requested_checkpoint_stamp_ == stamp && !background_) {
        reply->message = "nothing changed since the last requested checkpoint";
        return Status::Ok();
      }
      if (!CanCheckpointInBackground() && ForcedCheckpointDue()) {
        NoteForcedCheckpoint();
        PARASOL_RETURN_IF_ERROR(
            SaveCheckpoint("requested by worker " + std::to_string(req.worker_id)));
        requested_checkpoint_stamp_ = stamp;
        return Status::Ok();
      }
      // Answered once a checkpoint holding the state of now is durable: the one being written,
      // if it was begun with nothing new since, else the next.
      if (CheckpointWaitersFull()) {
        return Unavailable("shard " + std::to_string(rank_) + ": " +
                           std::to_string(kMaxCheckpointWaiters) +
                           " checkpoint requests are waiting already; ask again later");
      }
      HeldReply waiter;
      waiter.identity.copy(frames[0]);
      waiter.request = req;
      if (background_ && background_->stamp == stamp) {
        background_->waiting.push_back(std::move(waiter));
      } else {
        // Begun now, or once checkpoint.min_interval has passed since the last forced one.
        checkpoint_waiters_.push_back(std::move(waiter));
        StartRequestedCheckpoint();
      }
      *held = true;
      return Status::Ok();
    }
    case Op::Error:
      return BadMessage("Error is a reply op, not a request");
    case Op::Step:
      return BadMessage("a Step inside a Step");
    case Op::Membership:
      return HandleMembership(req, reply);
    case Op::Migrate:
      return HandleMigrate(req, *view, reply, payload);
  }
  return BadMessage("unknown op " + std::to_string(static_cast<int>(req.op)));
}

Status ShardServer::HandlePull(const Header& req, const PayloadView& p, Header* reply,
                               std::vector<zmq::message_t>* payload) {
  PARASOL_RETURN_IF_ERROR(CheckPullDType(req));
  PARASOL_RETURN_IF_ERROR(req.op == Op::PullSparse ? HandlePullSparse(req, p, reply, payload)
                                                   : HandlePullDense(req, reply, payload));
  if (req.dtype == wire::DType::F32) return Status::Ok();
  // 16-bit copies of the value frames (f16: one power-of-two scale for the whole reply).
  const int scale = NarrowValueFrames(*payload, req.dtype);
  reply->dtype = req.dtype;
  reply->value_scale = static_cast<int16_t>(scale);
  return Status::Ok();
}

uint64_t ShardServer::CurveRefusals() const {
  return (zap_ ? zap_->refusals() : 0) + (watch_ ? watch_->handshake_failures() : 0);
}

std::string ShardServer::TableName(uint32_t table_id) const {
  if (table_id < manifest_.tables.size()) return "'" + manifest_.tables[table_id].name + "'";
  return "#" + std::to_string(table_id);
}

uint64_t ShardServer::PushChecksum(const Header& req, const std::vector<zmq::message_t>& frames) {
  // What names the push's effect: its table, place and payload as they travelled.
  // XXH3: it runs on the request thread for every push's every byte, where Checksum64's serial
  // multiply chain (about 3 GB/s) took a third of a millisecond of each step of a batch of
  // 4096 (3.6 MB of pushes) while the engines waited.
  // Every header field that changes what the payload does: the same f16 bytes under another
  // scale are another update.
  const uint64_t where[7] = {static_cast<uint64_t>(req.op),
                             req.table_id,
                             req.key_count,
                             req.offset,
                             static_cast<uint64_t>(req.dtype),
                             req.value_dim,
                             static_cast<uint64_t>(static_cast<int64_t>(req.value_scale))};
  XXH3_state_t state;
  XXH3_INITSTATE(&state);
  XXH3_64bits_reset(&state);
  XXH3_64bits_update(&state, where, sizeof(where));
  for (size_t f = 2; f < frames.size(); ++f) {
    if (frames[f].size() > 0) XXH3_64bits_update(&state, frames[f].data(), frames[f].size());
  }
  const uint64_t h = XXH3_64bits_digest(&state);
  return h == 0 ? 1 : h;  // 0 means "not checked"
}

Status ShardServer::CheckFinite(const Header& req, const PayloadView& p) {
  const uint64_t bad = p.FirstNonfinite();
  if (bad == PayloadView::kAllFinite) return Status::Ok();
  ++counters_.nonfinite_pushes;
  const uint64_t dim = std::max<uint32_t>(1, p.dim());
  const std::string what =
      req.op == Op::PushSparse && p.has_keys()
          ? "row of key " + std::to_string(p.Key(bad / dim)) + ", element " +
                std::to_string(bad % dim)
          : "element " + std::to_string(req.offset + bad);
  return InvalidArgument(std::string(OpName(req.op)) + " of worker " +
                         std::to_string(req.worker_id) + " at clock " +
                         std::to_string(req.clock) + " to table " + TableName(req.table_id) +
                         ": the " + what + " is not finite; the push is refused whole");
}

Status ShardServer::HandlePush(const Header& req, const PayloadView& p, Header* /*reply*/) {
  if (manifest_.training.consistency != TrainingOptions::Consistency::kBsp) {
    return req.op == Op::PushSparse ? HandlePushSparse(req, p) : HandlePushDense(req, p);
  }
  // BSP: sum into the clock's aggregate; applied once every live worker has passed it.
  if (req.clock < controller_.MinClock()) {
    if (controller_.MinClock() == std::numeric_limits<int64_t>::max()) {
      // No worker of the job is still training here: every one finished, left or was lost.
      return FailedPrecondition(
          std::string(OpName(req.op)) + " of worker " + std::to_string(req.worker_id) +
          " for clock " + std::to_string(req.clock) + ": job '" + manifest_.job.name +
          "' is over on this shard (every worker finished or left it). To train again, start "
          "fresh servers (with another checkpoint.dir, or none, if they should not restore "
          "this job), or give the new run another job.name and servers of its own");
    }
    return FailedPrecondition(std::string(OpName(req.op)) + " of worker " +
                              std::to_string(req.worker_id) + " for clock " +
                              std::to_string(req.clock) + " arrived after every worker had " +
                              "moved past it (the slowest is at clock " +
                              std::to_string(controller_.MinClock()) + ")");
  }
  // What this push may add: a sum row and its key per sparse row; a dense table's first push
  // of the clock allocates the sums of its whole slice.
  uint64_t new_bytes = p.rows() * (uint64_t{p.dim()} + 2) * sizeof(float);
  if (req.op == Op::PushDense && req.table_id < dense_.size() && dense_[req.table_id]) {
    const auto it = aggregates_.find(req.clock);
    if (it == aggregates_.end() || !it->second->HasDense(req.worker_id, req.table_id)) {
      new_bytes = dense_[req.table_id]->slice().size() * sizeof(float);
    }
  }
  PARASOL_RETURN_IF_ERROR(CheckPendingLimits(req.clock, new_bytes));
  auto& agg = aggregates_[req.clock];
  if (!agg) {
    agg = std::make_unique<ClockAggregate>(static_cast<uint32_t>(manifest_.tables.size()),
                                           engines_.size(), &spare_parts_);
  }
  return req.op == Op::PushSparse ? AggregatePushSparse(req, p, *agg)
                                  : AggregatePushDense(req, p, *agg);
}

Status ShardServer::CheckPendingLimits(int64_t clock, uint64_t new_bytes) const {
  const ServerOptions& o = manifest_.server;
  // While a restored shard waits for the workers' replays, pushes of many clocks arrive before
  // the clocks that apply them: only the bytes bound them then. Nor is a clock older than every
  // pending one refused: the pending ones wait for it (a joiner's replay ahead of the workers
  // that redo their steps from the start: parasol_sim --elastic --reshard --seed 646).
  if (!aggregates_.count(clock) && aggregates_.size() >= o.max_pending_clocks &&
      controller_.ClocksKnown() && clock > aggregates_.begin()->first) {
    return ResourceExhausted("push for clock " + std::to_string(clock) + ": " +
                             std::to_string(aggregates_.size()) +
                             " clocks already have pushes being summed (server.max_pending_clocks"
                             " = " + std::to_string(o.max_pending_clocks) + ")");
  }
  uint64_t bytes = new_bytes;  // at most: a new sum row and its key per pushed row
  for (const auto& [c, agg] : aggregates_) bytes += agg->SumBytes();
  if (bytes > o.max_pending_bytes) {
    return ResourceExhausted("push for clock " + std::to_string(clock) + ": the summed pushes "
                             "would take " + std::to_string(bytes) + " bytes (server." +
                             "max_pending_bytes = " + std::to_string(o.max_pending_bytes) + ")");
  }
  return Status::Ok();
}

Status ShardServer::HoldPull(const Header& req, std::vector<zmq::message_t>& frames, uint64_t known,
                             uint32_t pulls) {
  // Per worker: one client posing as a worker cannot crowd the others out.
  const ServerOptions& o = manifest_.server;
  const uint32_t w = req.worker_id;
  uint64_t bytes = 0;
  for (const zmq::message_t& f : frames) bytes += f.size();
  if (held_count_[w] + pulls > o.max_held_pulls) {
    return ResourceExhausted(std::string(OpName(req.op)) + " at clock " +
                             std::to_string(req.clock) + " cannot wait for the read bound: " +
                             "worker " + std::to_string(w) + " has " +
                             std::to_string(held_count_[w]) + " pulls held already " +
                             "(server.max_held_pulls = " + std::to_string(o.max_held_pulls) + ")");
  }
  if (held_worker_bytes_[w] + bytes > o.max_held_bytes) {
    return ResourceExhausted(std::string(OpName(req.op)) + " at clock " +
                             std::to_string(req.clock) + " cannot wait for the read bound: " +
                             "worker " + std::to_string(w) + "'s held pulls would take " +
                             std::to_string(held_worker_bytes_[w] + bytes) +
                             " bytes (server.max_held_bytes = " +
                             std::to_string(o.max_held_bytes) + ")");
  }
  held_count_[w] += pulls;
  held_worker_bytes_[w] += bytes;
  held_bytes_ += bytes;
  held_pulls_.push_back(
      {std::move(frames), req, env_->Now(), pulls, known});
  controller_.AddHeld(req.worker_id, +1);
  ++counters_.pulls_held;
  return Status::Ok();
}

void ShardServer::ApplyReadyAggregates() {
  while (!aggregates_.empty() && aggregates_.begin()->first < controller_.MinClock()) {
    FinishDeferredApply();  // an earlier clock's rows first
    const auto it = aggregates_.begin();
    const auto after = std::next(it);
    const bool last = after == aggregates_.end() || after->first >= controller_.MinClock();
    if (last && may_split_apply_ && CanSplitApply()) {
      // The pulls the tick releases are answered once their rows are applied.
      NoteHeldPullKeys();
      deferred_apply_.emplace();
      deferred_apply_->clock = it->first;
      deferred_apply_->aggregate = std::move(it->second);
      aggregates_.erase(it);
      ApplyAggregate(deferred_apply_->clock, *deferred_apply_->aggregate, &*deferred_apply_);
      continue;
    }
    ApplyAggregate(it->first, *it->second);
    it->second->Recycle();
    aggregates_.erase(it);
  }
}

void ShardServer::AfterClockChange() {
  ApplyReadyAggregates();
  ReleaseHeldPulls();
  ReleaseBarriers();
}

void ShardServer::ReleaseHeldPulls() {
  const auto now = env_->Now();
  std::vector<HeldPull> still;
  std::vector<HeldPull> ready;
  for (HeldPull& h : held_pulls_) {
    const bool go = !job_failure_.ok() || controller_.IsLost(h.request.worker_id) ||
                    ReadAllowed(h.request.worker_id, h.request.clock, h.known);
    (go ? ready : still).push_back(std::move(h));
  }
  held_pulls_ = std::move(still);
  if (ready.empty()) return;
  // Answering them is the pulls' time, whatever released them.
  ServingAs pulls(this, kServePulls);
  for (const HeldPull& h : ready) {
    uint64_t bytes = 0;
    for (const zmq::message_t& f : h.frames) bytes += f.size();
    held_bytes_ -= bytes;
    held_worker_bytes_[h.request.worker_id] -= bytes;
    held_count_[h.request.worker_id] -= h.pulls;
  }
  for (HeldPull& h : ready) {
    // Waiting on the shard was not silence: the worker's timer starts again now.
    controller_.AddHeld(h.request.worker_id, -1);
    controller_.Heard(h.request.worker_id, now);
    const double waited = std::chrono::duration<double>(now - h.since).count();
    counters_.pull_wait_ms += waited * 1000;
    ObserveWait(waited);
    Header reply = ReplyTo(h.request, Status::Ok());
    std::vector<zmq::message_t> payload;
    Status st = job_failure_;
    if (st.ok() && controller_.IsLost(h.request.worker_id)) {
      st = FailedPrecondition("worker " + std::to_string(h.request.worker_id) +
                              " was dropped from the job (training.on_worker_loss: continue)");
    }
    if (st.ok() && h.request.op == Op::Step) {
      AnswerStep(h.request, h.frames);
      continue;
    }
    if (st.ok()) {
      Result<PayloadView> view =
          PayloadView::Parse(h.request, std::span<zmq::message_t>(h.frames).subspan(2),
                             manifest_.server.max_request_bytes);
      st = view.ok() ? HandlePull(h.request, *view, &reply, &payload) : view.status();
    }
    if (!st.ok()) {
      ++counters_.errors;
      reply = ReplyTo(h.request, st.WithContext("shard " + std::to_string(rank_)));
      payload.clear();
    }
    SendReply(h.frames[0], reply, std::move(payload));
  }
}

void ShardServer::CheckWorkers() {
  const auto now = env_->Now();
  // A worker whose reply was dropped resends within its request time-out (plus the worker
  // time-out for a pull it expects to be held); past that, silence counts again.
  const auto resend_within =
      std::chrono::milliseconds(manifest_.cluster.request_timeout_ms *
                                    (1 + int64_t{manifest_.cluster.request_retries}) +
                                manifest_.training.worker_timeout_ms);
  for (uint32_t w = 0; w < reply_dropped_since_.size(); ++w) {
    if (reply_dropped_since_[w] && now - *reply_dropped_since_[w] > resend_within) {
      HeardAfterDrop(w);
    }
  }
  // A shard that serves nothing hears from no worker.
  if (!Entered()) return;
  // Nor does any shard while every worker is past a change's clock and the change is not over
  // (they wait for the shards that gain rows to commit, however long the tool's copy takes);
  // nor one that a change removes once every worker has passed it.
  const int64_t change = ChangeClock();
  if (change >= 0 && controller_.MinClock() >= change &&
      (migration_.dropped < change || rank_ >= PlacementAfter().count())) {
    return;
  }
  const std::vector<uint32_t> lost = controller_.DetectLost(now);
  if (lost.empty()) return;
  for (uint32_t w : lost) {
    ++counters_.lost_workers;
    const std::string what =
        "worker " + std::to_string(w) + " lost: nothing heard from it for " +
        std::to_string(static_cast<int64_t>(controller_.SilentSeconds(w, now))) +
        " s (training.worker_timeout = " +
        std::to_string(manifest_.training.worker_timeout_ms) + " ms)";
    if (manifest_.training.on_worker_loss == TrainingOptions::OnWorkerLoss::kFail) {
      spdlog::error("shard {}: {}; the job stops (training.on_worker_loss: fail)", rank_, what);
      if (job_failure_.ok()) {
        job_failure_ = FailedPrecondition(what + "; the job stops (training.on_worker_loss: fail)");
      }
    } else {
      spdlog::warn("shard {}: {}; the job goes on without it (training.on_worker_loss: continue)",
                   rank_, what);
    }
  }
  AfterClockChange();
}

int64_t ShardServer::MembershipReach() const {
  return std::max<int64_t>(0, controller_.MaxClock()) + 8 +
         2 * int64_t{manifest_.training.staleness} + int64_t{manifest_.training.prefetch_depth};
}

int64_t ShardServer::NextMembershipClock() const {
  // A worker learns a named clock from shard 0's reply to its next tick at the latest, and by
  // then it may have taken the batches of the step after that tick and of its prefetches. Shard
  // 0 sees every tick, so no worker is past its newest clock.
  const TrainingOptions& t = manifest_.training;
  const int64_t ahead =
      t.prefetch && t.consistency != TrainingOptions::Consistency::kBsp
          ? std::max<int64_t>(1, t.prefetch_depth)
          : 1;
  return std::max<int64_t>(0, controller_.MaxClock()) + 1 + ahead;
}

Status ShardServer::MergeMembership(const Header& req) {
  // Only from a rank that may speak for the job: one in it, or one asking to join with the
  // membership shard 0 answered it (which names that rank).
  const uint32_t w = req.worker_id;
  bool speaks = controller_.InJob(w);
  // So may any request of a rank whose copy names its own join, as a Hello asking to join does:
  // a replay (the shard restarted from a checkpoint older than the join, or from none, and the
  // replay may come before any other worker's request tells it of the join: parasol_sim
  // --elastic --seed 265), or a joiner's first request to a shard that began serving after it
  // joined (--elastic --reshard --seed 15). With worker keys, only entries shard 0 signed count.
  if (!speaks) {
    for (const MemberEntry& e : req.members) speaks = speaks || (e.worker == w && e.join >= 0);
  }
  // A shard that serves nothing is ticked by no worker, nor is one whose workers have all
  // finished (a change named after their last tick): the scale tool that moves their rows
  // brings it the membership, naming the change it migrates.
  const bool idle = !Entered();
  if (!speaks && (idle || EveryWorkerFinished()) && req.op == Op::Migrate) {
    speaks = std::any_of(req.members.begin(), req.members.end(), [&](const MemberEntry& e) {
      return (e.worker & kServerEntry) != 0 && e.join == req.clock;
    });
  }
  if (!speaks) return Status::Ok();
  // While this shard restarted and a worker's replay is still due, its clocks are only a lower
  // bound and its membership may lack what was named since its checkpoint: it takes the
  // entries the workers' copies hold without bounding their clocks. So does a shard that serves
  // nothing (its clocks are not the workers').
  const bool restarted = controller_.ReplayOwed() || idle || req.replay;
  // Shard 0 names the clocks: it takes none from requests, unless it restarted.
  if (rank_ == 0 && !restarted) return Status::Ok();
  for (const MemberEntry& e : req.members) {
    if (e.join > kMaxMemberClock || e.leave > kMaxMemberClock) {
      return FailedPrecondition("membership names clock " +
                                std::to_string(std::max(e.join, e.leave)) + " for worker " +
                                std::to_string(e.worker) + ", beyond any job");
    }
  }
  // A clock shard 0 could have named: not before the slowest worker here, not far past the
  // newest.
  if (!restarted) {
    const int64_t newest = std::max<int64_t>(0, controller_.MaxClock());
    const int64_t slowest = controller_.MinClock();
    const int64_t reach = MembershipReach();
    for (const MemberEntry& e : req.members) {
      for (int64_t c : {e.join, e.leave}) {
        bool known = c == membership_.join(e.worker) || c == membership_.leave(e.worker);
        // A clock before this shard served the job bounds nothing here.
        if (c >= 0 && c < ServingFrom()) continue;
        if (e.worker & kServerEntry) {
          known = c < 0 || std::any_of(membership_.server_changes().begin(),
                                       membership_.server_changes().end(),
                                       [&](const auto& change) { return change.clock == c; });
        }
        if (c < 0 || known) continue;
        const bool behind = slowest != std::numeric_limits<int64_t>::max() && c < slowest;
        if (c > reach || behind) {
          const std::string what =
              (e.worker & kServerEntry) ? std::string("a change of the shard count")
                                        : "worker " + std::to_string(e.worker);
          // Named behind every worker here: shard 0's clocks are behind this shard's, as it
          // lost updates (it restarted and the replay it needed could not come).
          return FailedPrecondition(
              "membership names clock " + std::to_string(c) + " for " + what +
              ", which shard 0 could not have named now (the workers here are at clocks " +
              std::to_string(slowest) + " to " + std::to_string(newest) + ")" +
              (behind ? "; shard 0 is behind this shard: it lost updates when two failures "
                        "overlapped, or the entry is not shard 0's"
                      : ""));
        }
      }
    }
  }
  // With worker keys, only what shard 0 named: an entry that would change this copy is taken
  // only with shard 0's MAC for this shard; others are left out and counted (the signed copy
  // comes with the next worker that has it).
  std::vector<MemberEntry> signed_entries;
  std::span<const MemberEntry> entries = req.members;
  if (membership_macs_.enabled()) {
    for (size_t i = 0; i < req.members.size(); ++i) {
      const MemberEntry& e = req.members[i];
      const bool known =
          (e.worker & kServerEntry)
              ? std::any_of(membership_.server_changes().begin(),
                            membership_.server_changes().end(),
                            [&](const auto& c) { return c.clock == e.join; })
              : membership_.join(e.worker) == e.join && membership_.leave(e.worker) == e.leave;
      if (known || membership_macs_.Verify(e, i, req.member_macs)) {
        signed_entries.push_back(e);
        continue;
      }
      ++counters_.unsigned_member_entries;
      uint64_t left_out = 0;
      if (failed_request_log_.Allow(env_->Now(), &left_out)) {
        spdlog::warn("shard {}: {} of worker {} carries a membership entry (worker {}, join {}, "
                     "leave {}) without shard 0's MAC; left out{}",
                     rank_, OpName(req.op), req.worker_id, e.worker & ~kServerEntry, e.join,
                     e.leave,
                     left_out ? " (and " + std::to_string(left_out) + " more lines left out)"
                              : "");
      }
    }
    entries = signed_entries;
  }
  return TakeMembership(entries);
}

Status ShardServer::TakeMembership(std::span<const MemberEntry> entries) {
  int64_t changed = 0;
  PARASOL_RETURN_IF_ERROR(membership_.Merge(entries, &changed));
  gains_rows_ = GainsRows();
  SettleUninvolved();
  const auto now = env_->Now();
  for (uint32_t r = 0; r < membership_.max_ranks(); ++r) {
    if (membership_.Joined(r) && !controller_.InJob(r)) {
      // From the clock this shard serves from at the earliest (it holds nothing before).
      // A restarted shard that learns of a join only now (it restored a checkpoint from before
      // it) knows the rank's clock only as a lower bound (parasol_sim --elastic --seed 3691: a
      // shard restarted before its first checkpoint took the joiner's clock as known, and
      // refused another worker's replay as too far ahead of it). The rank may also hold pushes
      // the process before acknowledged: until it replays, or says it holds none, no
      // checkpoint here claims them (CompleteThroughNow()).
      const bool restarted = restarted_process_ && Entered();
      controller_.Join(r, std::max(membership_.join(r), ServingFrom()), now, restarted);
      if (restarted) joined_since_restore_.insert(r);
      spdlog::info("shard {}: worker {} joins the job at clock {}", rank_, r, membership_.join(r));
    }
  }
  return Status::Ok();
}

Status ShardServer::HandleMembership(const Header& req, Header* reply) {
  const uint32_t w = req.worker_id;
  const bool tool = req.op == Op::Membership && !controller_.InJob(w);
  if (!req.join && !MembershipAsksToLeave(req) &&
      !(tool && (MembershipWorkers(req) > 0 || MembershipShards(req) > 0))) {
    return Status::Ok();  // the reply carries the membership
  }
  if (rank_ != 0) {
    return FailedPrecondition(std::string(OpName(req.op)) + ": only shard 0 names the clocks "
                              "at which workers join and leave; this is shard " +
                              std::to_string(rank_));
  }
  if (req.join && req.manifest_hash == fingerprint_ && membership_.Joined(w)) {
    // Joined already (a resend, or a restart of the worker): nothing to name, so nothing to
    // wait for; this Hello may be the one whose replay the shard waits for (parasol_sim
    // --elastic --seed 15: a restarted joiner was refused for ever).
    SetMembershipClock(*reply, membership_.join(w));
    return named_unkept_ ? KeepNamedClocks("worker " + std::to_string(w) + " joins at clock " +
                                           std::to_string(membership_.join(w)))
                         : Status::Ok();
  }
  // Nor while a rank it took in after a restart (from its named clocks, or a worker's copy) has
  // not replayed to it: its clock is only a lower bound, and under SSP or ASP it may be past the
  // clock shard 0 would name (an outside review).
  const bool unheard_joiner = std::any_of(
      joined_since_restore_.begin(), joined_since_restore_.end(),
      [&](uint32_t r) { return !controller_.IsLost(r) && !controller_.IsDone(r); });
  if (controller_.ReplayOwed() || unheard_joiner) {
    return Unavailable("shard 0 restarted and does not know every worker's clock yet; ask "
                       "again once the workers have replayed to it");
  }
  // The next clock shard 0 can name, or a later one the request asks for (a change planned
  // ahead, at the same clock in every run of the job).
  int64_t at = NextMembershipClock();
  if (req.op == Op::Membership && MembershipNotBefore(req) > at) {
    // No further ahead than the other shards take a clock from a worker's copy, with room for
    // their newest clocks to be behind this shard's (a joiner counts here first).
    const int64_t furthest = MembershipReach() - 2;
    if (MembershipNotBefore(req) > furthest) {
      return InvalidArgument("Membership: clock " + std::to_string(MembershipNotBefore(req)) +
                             " is further ahead than shard 0 names clocks (at most " +
                             std::to_string(furthest) + " now); ask closer to it");
    }
    at = MembershipNotBefore(req);
  }
  if (tool && MembershipShards(req) > 0) return NameServerChange(MembershipShards(req), at, reply);
  if (req.join) {
    if (req.manifest_hash != fingerprint_) {
      return FailedPrecondition("Membership: worker " + std::to_string(w) + " runs another "
                                "manifest (fingerprint " + Hex(req.manifest_hash) + ")");
    }
    if (w >= membership_.max_ranks()) {
      return FailedPrecondition("worker " + std::to_string(w) + " cannot join: cluster." +
                                "max_workers is " + std::to_string(membership_.max_ranks()));
    }
    if (membership_.Joined(w)) {
      SetMembershipClock(*reply, membership_.join(w));  // joined already (a resend, a restart)
      return Status::Ok();
    }
    if (membership_.leave(w) >= 0) {
      return FailedPrecondition("worker " + std::to_string(w) + " has left the job; a rank "
                                "joins once (give the new worker another rank)");
    }
    PARASOL_RETURN_IF_ERROR(membership_.SetJoin(w, at));
    controller_.Join(w, at, env_->Now());
    spdlog::info("shard 0: worker {} joins the job at clock {}", w, at);
    SetMembershipClock(*reply, at);
    return KeepNamedClocks("worker " + std::to_string(w) + " joins at clock " + std::to_string(at));
  }
  // Leaves: this worker, or (from a tool) the highest ranks beyond the workers wanted present
  // at `at`.
  std::vector<uint32_t> leaving;
  if (MembershipAsksToLeave(req)) {
    if (!controller_.InJob(w)) {
      return FailedPrecondition("worker " + std::to_string(w) + " is not in the job");
    }
    if (membership_.leave(w) < 0) leaving.push_back(w);
  } else {
    const uint64_t wanted = MembershipWorkers(req);
    uint64_t present = 0;
    for (uint32_t r = 0; r < membership_.max_ranks(); ++r) {
      if (membership_.Present(r, at) && !controller_.IsDone(r) && !controller_.IsLost(r)) {
        ++present;
      }
    }
    for (uint32_t r = membership_.max_ranks(); r-- > 0 && present > wanted;) {
      if (membership_.Present(r, at) && !controller_.IsDone(r) && !controller_.IsLost(r)) {
        leaving.push_back(r);
        --present;
      }
    }
    SetMembershipWorkers(*reply, present);
  }
  std::string named;
  for (uint32_t r : leaving) {
    if (controller_.IsDone(r)) continue;  // it has finished training: nothing to leave
    const int64_t clock = std::max(at, membership_.join(r) + 1);
    PARASOL_RETURN_IF_ERROR(membership_.SetLeave(r, clock));
    spdlog::info("shard 0: worker {} leaves the job at clock {}", r, clock);
    if (r == w) SetMembershipClock(*reply, clock);
    named += (named.empty() ? "worker " : ", ") + std::to_string(r);
  }
  if (named.empty()) return named_unkept_ ? KeepNamedClocks("the leave clocks named") : Status::Ok();
  return KeepNamedClocks(named + " leave" + (leaving.size() == 1 ? "s" : "") + " at clock " +
                         std::to_string(at));
}

Status ShardServer::KeepNamedClocks(const std::string& what) {
  // A named clock never changes: kept before it is answered, as a change of the shard count
  // is. Otherwise a restart of shard 0 before a checkpoint, with every process that had heard
  // the name dead too, names another clock (parasol_sim --elastic --seed 1266). Kept in a file
  // of its own (server/checkpoint.hpp, WriteNamedClocks), a few hundred bytes, not in a whole
  // checkpoint: at 10^8 rows one stopped the shard for a minute at every join and leave. A
  // restart takes them in as from a worker's copy (TakeNamedClocks()).
  if (manifest_.checkpoint.dir.empty()) return Status::Ok();
  named_unkept_ = true;
  if (Status st = WriteNamedClocks(manifest_.checkpoint.dir, rank_, fingerprint_,
                                   membership_.Entries(), env_->Files());
      !st.ok()) {
    // Not answered until it is kept: the asker asks again (a resend tries again).
    return Unavailable("shard 0 named " + what + " but could not keep it yet: " +
                       st.ToString());
  }
  named_unkept_ = false;
  return Status::Ok();
}

Status ShardServer::HandleHello(const Header& req, const zmq::message_t& identity,
                                Header* reply, bool* held) {
  reply->shard_rank = rank_;
  reply->shard_count = num_shards_;
  reply->manifest_hash = fingerprint_;
  if (req.manifest_hash != fingerprint_) {
    // The shard's own fingerprint is not told: a peer learns only that its manifest differs.
    return FailedPrecondition("manifest mismatch: worker " + std::to_string(req.worker_id) +
                              " runs manifest " + Hex(req.manifest_hash) + ", which is not this "
                              "shard's; start every role with the same manifest");
  }
  const uint32_t w = req.worker_id;
  if (req.join) {
    if (rank_ == 0) {
      PARASOL_RETURN_IF_ERROR(HandleMembership(req, reply));
    } else if (!controller_.InJob(w)) {
      return FailedPrecondition("Hello: worker " + std::to_string(w) + " asks to join, but " +
                                "this shard has not heard that shard 0 admitted it (ask shard 0 "
                                "first, and send what it answered)");
    }
  }
  if (!controller_.InJob(w)) return Status::Ok();
  // A process of the worker that never heard from any process of this shard holds nothing it
  // pushed here.
  if (req.known_epoch == 0) joined_since_restore_.erase(w);
  // Its connection is the worker's now: a member's share of the queued replies.
  if (!reply_sink_) MarkMember(identity, w);
  // A shard that serves nothing does not know where the worker is; it keeps which process
  // greeted it (a later Hello of the same one is no restart).
  if (!Entered()) {
    if (req.incarnation != 0) controller_.set_incarnation(w, req.incarnation);
    return Status::Ok();
  }
  // Where the worker is, for a restarted worker to continue from.
  SetHelloWorker(*reply, controller_.clocks()[w], controller_.IsDone(w));
  // The clocks before this one are applied here (BSP): a restarted worker that would redo one
  // of them learns that its values have moved on.
  const int64_t slowest = controller_.MinClock();
  reply->read_clock = slowest == std::numeric_limits<int64_t>::max() ? controller_.MaxClock() : slowest;
  reply->last_barrier = controller_.last_barrier();
  if (req.known_epoch == 0 && controller_.incarnation(w) == req.incarnation &&
      controller_.AbandonReplay(w)) {
    // This process of the worker never heard from this shard's previous process, so it holds
    // nothing to replay to it (it had pushed nothing that was acknowledged).
    spdlog::info("shard {}: worker {} has nothing to replay; its clock is {}", rank_, w,
                 HelloKnownClock(*reply));
    ReleaseAfterGivingUpAReplay(reply);
  }
  auto hold = [&](const std::string& why) -> Status {
    if (CheckpointWaitersFull()) {
      return Unavailable("shard " + std::to_string(rank_) + ": " +
                         std::to_string(kMaxCheckpointWaiters) +
                         " requests wait for a checkpoint already; say Hello again later");
    }
    if (req.membership_version < membership_.version()) {
      reply->members = membership_.Entries();
      reply->member_macs = membership_macs_.Sign(reply->members);
    }
    HeldReply waiter;
    waiter.identity.rebuild(identity.data(), identity.size());
    waiter.request = req;
    TellLostUpdates(w, reply);
    waiter.reply = *reply;
    checkpoint_waiters_.push_back(std::move(waiter));
    if (next_checkpoint_reason_.empty()) next_checkpoint_reason_ = why;
    *held = true;
    return Status::Ok();
  };
  // A Hello again from a restarted worker whose first one waits for its checkpoint (a resend):
  // it waits for the same checkpoint.
  auto awaiting = [&](const std::vector<HeldReply>& waiters) {
    return std::any_of(waiters.begin(), waiters.end(), [&](const HeldReply& h) {
      return h.reply && h.request.worker_id == w && h.request.incarnation == req.incarnation;
    });
  };
  if (req.incarnation != 0 && controller_.incarnation(w) == req.incarnation &&
      (awaiting(checkpoint_waiters_) || (background_ && awaiting(background_->waiting)))) {
    return hold("worker " + std::to_string(w) + " restarted");
  }
  if (req.incarnation != 0 && controller_.incarnation(w) != req.incarnation) {
    const bool restarted = controller_.incarnation(w) != 0;
    // Its Hello waits for a checkpoint: refused before anything is noted if no more can wait
    // (noted, the resend would find the restart taken and go unanswered by any checkpoint).
    if (restarted && !manifest_.checkpoint.dir.empty() && CheckpointWaitersFull()) {
      return Unavailable("shard " + std::to_string(rank_) + ": " +
                         std::to_string(kMaxCheckpointWaiters) +
                         " requests wait for a checkpoint already; say Hello again later");
    }
    if (!restarted && req.known_epoch == 0 && controller_.AbandonReplay(w)) {
      spdlog::info("shard {}: worker {} has nothing to replay; its clock is {}", rank_, w,
                   HelloKnownClock(*reply));
      ReleaseAfterGivingUpAReplay(reply);
    }
    controller_.set_incarnation(w, req.incarnation);
    if (restarted) {
      // The worker's push log died with it: the pushes it had acknowledged since this shard's
      // last checkpoint are only in memory here. Checkpoint them now, so that a later restart
      // of this shard does not need a replay that nobody can send.
      ++counters_.worker_restarts;
      uint64_t left_out = 0;
      if (restart_log_.Allow(env_->Now(), &left_out)) {
        spdlog::warn("shard {}: worker {} restarted at clock {}{}{}", rank_, w,
                     HelloKnownClock(*reply),
                     manifest_.checkpoint.dir.empty() ? "" : "; checkpointing what it had pushed",
                     left_out ? " (" + std::to_string(left_out) + " restarts not logged)" : "");
      }
      if (controller_.AbandonReplay(w)) {
        // Two failures overlapped: this shard restarted, and the worker died before its replay
        // reached it. The new process has no log; take its word for the clock.
        // Reported (an error line, lost_replays in stats and /metrics), not hidden. Under
        // training.on_overlapping_failure: rollback, every Hello says so from now on
        // (rollback_needed) until the job has rolled back; otherwise the job goes on. (A
        // worker whose replay is due exits with code 3, which launch does not restart, so
        // this takes a restart by hand or by a scheduler.)
        ++counters_.lost_replays;
        if (manifest_.RollsBack() && BarRollback().empty()) OweRollback();
        lost_updates_of_.insert(w);
        spdlog::error("shard {}: worker {} restarted before its replay to this shard ended: the "
                      "pushes it had acknowledged since this shard's checkpoint at clock {} are "
                      "lost unless there were none (two failures overlapped){}",
                      rank_, w, checkpoint_clock_,
                      rollback_owed_ ? "; the job rolls back to a checkpoint every shard holds"
                                     : "");
        ReleaseAfterGivingUpAReplay(reply);
      }
      // The rollback replaces this state: nothing to checkpoint for the worker.
      if (rollback_owed_) return Status::Ok();
      if (!manifest_.checkpoint.dir.empty()) {
        // The Hello is answered once a checkpoint holding those pushes is durable (nothing else
        // holds them). The reply waits for it: begun now (in the background where the shard
        // writes there, serving on meanwhile) or, within checkpoint.min_interval of the last
        // forced one, once that has passed.
        PARASOL_RETURN_IF_ERROR(hold("worker " + std::to_string(w) + " restarted"));
        StartRequestedCheckpoint();
        return Status::Ok();
      }
    }
  }
  return Status::Ok();
}

bool ShardServer::CheckpointWaitersFull() const {
  return checkpoint_waiters_.size() + (background_ ? background_->waiting.size() : 0) >=
         kMaxCheckpointWaiters;
}

void ShardServer::TellLostUpdates(uint32_t worker, Header* reply) const {
  // Under on_overlapping_failure: fail too, a worker's Hello hears of the loss (its restarted
  // process stops on it).
  if (manifest_.training.on_overlapping_failure ==
      TrainingOptions::OnOverlappingFailure::kFail) {
    reply->rollback_needed = reply->rollback_needed || lost_updates_of_.count(worker) > 0;
  }
}

void ShardServer::ReleaseAfterGivingUpAReplay(Header* reply) {
  // A barrier held only while the replay was owed: nothing else would look at it again
  // (parasol_sim --ssp --seed 1773: every worker waited at the first barrier for ever).
  ReleaseBarriers();
  reply->last_barrier = controller_.last_barrier();
}

bool ShardServer::EveryWorkerFinished() const {
  for (uint32_t w = 0; w < membership_.max_ranks(); ++w) {
    if (controller_.InJob(w) && !controller_.IsDone(w) && !controller_.IsLost(w)) return false;
  }
  return true;
}

void ShardServer::CheckpointWhenAllDone() {
  if (manifest_.checkpoint.dir.empty() || all_done_checkpointed_) return;
  if (!EveryWorkerFinished()) return;
  // Workers exit after this; their push logs go with them. Everything they pushed is here now.
  all_done_checkpointed_ = true;
  if (Status st = SaveCheckpoint("every worker has finished"); !st.ok()) {
    spdlog::error("shard {}: checkpoint failed: {}", rank_, st.ToString());
  }
}

void ShardServer::CheckpointWhenALeaverIsDone(uint32_t w) {
  if (manifest_.checkpoint.dir.empty() || all_done_checkpointed_) return;
  // A worker leaving the running job (at the clock shard 0 named) exits once a checkpoint here
  // holds what it pushed and that it left, or one at its leave clock or later does (a rank
  // restored at its leave clock is done: ShardState). Nobody could replay it after a restart
  // of this shard (parasol_sim --elastic --seed 90: a shard restarted from before the leave,
  // waited for the leaver's replay and lost it). At the job's end the last worker's Leave
  // makes the checkpoint instead.
  // Begun in the background after the done tick is answered (KeepLeaversDone()): the worker
  // waits, even with nothing in its push log, for a count past the one that reply carried
  // (Departure::SettleLog; parasol_sim --elastic --seed 6191: a leaver that had pushed nothing
  // since the last checkpoint exited at once, and a restart from a checkpoint before its done
  // waited for its ticks for ever).
  if (membership_.leave(w) < 0 || !controller_.IsDone(w) ||
      checkpoint_clock_ >= membership_.leave(w)) {
    return;
  }
  leaver_checkpoint_reason_ = "worker " + std::to_string(w) + " left the job at clock " +
                              std::to_string(membership_.leave(w));
  leaver_checkpoint_past_.reset();  // past every count a reply has carried so far
}

void ShardServer::KeepLeaversDone() {
  if (leaver_checkpoint_reason_.empty()) return;
  if (all_done_checkpointed_) {  // that checkpoint, after every done, holds them all
    leaver_checkpoint_reason_.clear();
    return;
  }
  // Called between requests: every done tick's reply has gone with a count at most this.
  const uint64_t begun = std::max(checkpoints_begun_, checkpoint_sequence_);
  if (!leaver_checkpoint_past_) leaver_checkpoint_past_ = begun;
  if (checkpoint_sequence_ > *leaver_checkpoint_past_) {  // durable: the leavers may go
    leaver_checkpoint_reason_.clear();
    leaver_checkpoint_past_.reset();
    return;
  }
  // One past it being written, or none for now (the one being written began before), or the
  // last try failed a moment ago (tried again a second later).
  if (background_) return;
  if (begun > *leaver_checkpoint_past_ &&
      env_->Now() - last_checkpoint_failure_ < std::chrono::seconds(1)) {
    return;
  }
  if (Status st = BeginCheckpoint(leaver_checkpoint_reason_); !st.ok()) {
    last_checkpoint_failure_ = env_->Now();
    spdlog::error("shard {}: checkpoint failed: {}", rank_, st.ToString());
  }
}

void ShardServer::CheckpointWhenRemoved() {
  const int64_t change = ChangeClock();
  if (manifest_.checkpoint.dir.empty() || change < 0 || removed_checkpointed_ == change ||
      rank_ < PlacementAfter().count() || migration_.installed >= change ||
      controller_.MinClock() < change || controller_.ReplayOwed()) {
    return;
  }
  // A change removes this shard and every worker has passed its clock: no worker sends it
  // anything more (nor tells it that it is done), and their push logs may go when the job
  // ends. Every push it took is kept now, before the tick that completed them is answered.
  removed_checkpointed_ = change;
  if (Status st = SaveCheckpoint("every push before clock " + std::to_string(change) +
                                 " (this shard leaves then)");
      !st.ok()) {
    spdlog::error("shard {}: checkpoint failed: {}", rank_, st.ToString());
  }
}

uint32_t ShardServer::ShardClock() const {
  // Never lower than before in this process (a lost worker's clock no longer counts): rows are
  // stamped with it, and a change of the shard count copies the rows stamped since a clock.
  shard_clock_high_ = std::max(
      shard_clock_high_,
      static_cast<uint32_t>(std::clamp<int64_t>(controller_.MaxClock(), 0, UINT32_MAX)));
  return shard_clock_high_;
}

Status ShardServer::HandleClock(const Header& req) {
  if (!controller_.InJob(req.worker_id)) {
    return InvalidArgument("Clock: worker " + std::to_string(req.worker_id) +
                           " is not in this job (it has not joined; cluster.workers = " +
                           std::to_string(manifest_.cluster.workers) + ")");
  }
  if (!Entered()) {
    // Serving nothing, this shard is ticked by no one, except by workers past the clock it
    // starts serving from before its commit (noted, see NoteAhead()). Its clocks count from
    // Enter() on.
    const int64_t change = ChangeClock();
    if (change >= 0 && rank_ < PlacementAfter().count()) {
      controller_.NoteAhead(req.worker_id, req.clock, req.done, change);
    }
    return Status::Ok();
  }
  if (Status pushes = CheckTickPushes(req); !pushes.ok()) {
    if (pushes.code() == StatusCode::kUnavailable) {
      controller_.NoteTickWaiting(req.worker_id, req.clock);
    }
    return pushes;
  }
  PARASOL_RETURN_IF_ERROR(
      controller_.Advance(req.worker_id, req.clock, req.done, req.caught_up, req.replay));
  // Its replay has ended: whatever it held for this process is here.
  if (req.replay && req.caught_up) joined_since_restore_.erase(req.worker_id);
  // A replay, or any tick, says which barriers its worker has passed: every shard had released
  // them (this one too, before it restarted from an older checkpoint).
  if (req.last_barrier > controller_.last_barrier() &&
      req.last_barrier <= controller_.last_barrier() + kMaxBarrierStride) {
    controller_.set_last_barrier(req.last_barrier);
    ReleaseBarriers();
  }
  return Status::Ok();
}

Status ShardServer::CheckTickPushes(const Header& req) {
  uint64_t checked = 0;
  PARASOL_RETURN_IF_ERROR(push_gate_.AdmitTick(req, SenderOf(req.worker_id), &checked));
  counters_.tick_pushes_checked += checked;
  return Status::Ok();
}

PushGate::Sender ShardServer::SenderOf(uint32_t worker) const {
  return PushGate::Sender{controller_.clocks()[worker], controller_.Restored(worker)};
}

Result<bool> ShardServer::HandleBarrier(const Header& req, const zmq::message_t& identity) {
  if (!controller_.InJob(req.worker_id)) {
    return InvalidArgument("Barrier: worker " + std::to_string(req.worker_id) +
                           " is not in this job (it has not joined; cluster.workers = " +
                           std::to_string(manifest_.cluster.workers) + ")");
  }
  const int64_t id = BarrierId(req);
  if (id < 0) {
    return InvalidArgument("Barrier: id " + std::to_string(req.offset) + " is out of range");
  }
  if (id == controller_.last_barrier()) return false;  // a resend: everyone has passed it
  if (id > controller_.last_barrier() + kMaxBarrierStride) {
    return FailedPrecondition("Barrier: id " + std::to_string(id) + " is more than " +
                              std::to_string(kMaxBarrierStride) + " past the last released "
                              "barrier (" + std::to_string(controller_.last_barrier()) + ")");
  }
  if (id < controller_.last_barrier()) {
    return FailedPrecondition("Barrier: id " + std::to_string(id) + " is behind barrier " +
                              std::to_string(controller_.last_barrier()) + ", released already (barrier " +
                              "ids only move forward)");
  }
  for (auto& [other, waiting] : barriers_) {
    for (HeldReply& h : waiting) {
      if (h.request.worker_id != req.worker_id) continue;
      if (other != id) {
        return FailedPrecondition("Barrier: worker " + std::to_string(req.worker_id) +
                                  " already waits at barrier " + std::to_string(other) +
                                  ", not " + std::to_string(id));
      }
      // A resend of the barrier it waits at: answer the newest copy only.
      h.identity.copy(const_cast<zmq::message_t&>(identity));
      h.request = req;
      return true;
    }
  }
  HeldReply held;
  held.identity.copy(const_cast<zmq::message_t&>(identity));
  held.request = req;
  barriers_[id].push_back(std::move(held));
  controller_.AddHeld(req.worker_id, +1);
  ReleaseBarriers();
  return true;
}

void ShardServer::ReleaseBarriers() {
  for (auto it = barriers_.begin(); it != barriers_.end();) {
    std::set<uint32_t> arrived;
    for (const HeldReply& h : it->second) arrived.insert(h.request.worker_id);
    bool all = true;
    for (uint32_t w = 0; w < membership_.max_ranks(); ++w) {
      if (!controller_.InJob(w)) continue;  // not joined (yet)
      // The first barrier (0: all meet before the first step) is not a joiner's: it starts at
      // the clock it joins at, and never enters it (parasol_sim --elastic: a rank admitted
      // before the others had met held them there for ever).
      if (it->first == 0 && membership_.join(w) > 0) continue;
      // A worker that has left holds no barrier back: it may have exited already (a barrier
      // it had entered before a restart of this shard cannot reach it again).
      if (!controller_.IsLost(w) && !controller_.IsDone(w) && !arrived.count(w)) all = false;
    }
    // A barrier some worker has passed (its replay says so) was released everywhere before
    // this shard restarted. A shard that serves nothing (a change removed it) holds no one: the
    // workers past the change meet on the shards that serve them.
    if (it->first <= controller_.last_barrier() || !Entered()) all = true;
    // A restarted shard releases no new barrier while a worker's replay is still owed to it:
    // behind the last barrier the workers exit, their push logs with them, and what a replay
    // still had to resend (a tick refused for now behind a lost push) would be lost.
    else if (controller_.ReplayOwed()) all = false;
    if (!all && job_failure_.ok()) {
      ++it;
      continue;
    }
    for (HeldReply& h : it->second) {
      controller_.AddHeld(h.request.worker_id, -1);
      controller_.Heard(h.request.worker_id, env_->Now());
      Status st = job_failure_;
      if (st.ok() && controller_.IsLost(h.request.worker_id)) {
        st = FailedPrecondition("worker " + std::to_string(h.request.worker_id) +
                                " was dropped from the job (training.on_worker_loss: continue)");
      }
      SendReply(h.identity, ReplyTo(h.request, st.WithContext("shard " + std::to_string(rank_))),
                {});
    }
    controller_.set_last_barrier(std::max(controller_.last_barrier(), it->first));
    it = barriers_.erase(it);
  }
}

void ShardServer::ObserveWait(double seconds) { pull_wait_.Observe(seconds); }

double ShardServer::CutTime(ServeKind kind) {
  const auto now = env_->Now();
  const double seconds = std::max(0.0, std::chrono::duration<double>(now - time_cut_).count());
  counters_.seconds[kind] += seconds;
  time_cut_ = now;
  return seconds;
}

ShardServer::ServeKind ShardServer::ServeKindOf(Op op) {
  switch (op) {
    case Op::PushSparse:
    case Op::PushDense:
      return kServePushes;
    case Op::Clock:
      return kServeTicks;
    case Op::PullSparse:
    case Op::PullDense:
      return kServePulls;
    default:
      return kServeOther;
  }
}

MetricTable ShardServer::Metrics() const {
  MetricTable m;
  m.JsonOnly("shard", rank_);
  m.JsonOnly("shards", num_shards_);
  m.Counter("requests", "parasol_requests_received_total",
            "Requests received, all ops together (by op: parasol_requests_total).",
            counters_.requests);
  m.JsonOnly("steps", op_counts_[static_cast<int>(Op::Step)]);
  m.Counter("bad_messages", "parasol_bad_messages_total", "Malformed messages refused.",
            counters_.bad_messages);
  m.Counter("errors", "parasol_errors_total", "Requests answered with an error.",
            counters_.errors);
  m.Counter("checkpoints", "parasol_checkpoints_total", "Checkpoints written by this shard.",
            counters_.checkpoints);
  m.Counter("checkpoints_begun", "parasol_checkpoints_begun_total",
            "Checkpoints begun (durable, or being written).",
            std::max(checkpoints_begun_, checkpoint_sequence_));
  m.Gauge("checkpoint_writing", "parasol_checkpoint_writing",
          "1 while a checkpoint is written in the background.", background_.has_value());
  m.Gauge("", "parasol_checkpoint_age_seconds",
          "Seconds since this shard's last checkpoint (-1: none yet).",
          counters_.checkpoints > 0 || !restored_from_.empty()
              ? std::chrono::duration<double>(env_->Now() - last_checkpoint_).count()
              : -1.0);
  m.Gauge("checkpoint_pause_ms_max", "parasol_checkpoint_pause_ms_max",
          "The longest a checkpoint stopped serving, in milliseconds.",
          counters_.checkpoint_pause_ms_max);
  m.Gauge("checkpoint_seconds_last", "parasol_checkpoint_seconds_last",
          "How long the newest checkpoint took to be durable.", counters_.checkpoint_seconds_last);
  m.Counter("checkpoint_log_waits", "parasol_checkpoint_log_waits_total",
            "Pushes answered only once a background checkpoint was durable "
            "(checkpoint.max_log_bytes).",
            counters_.checkpoint_log_waits);
  m.Counter("checkpoint_steps_skipped", "parasol_checkpoint_steps_skipped_total",
            "Multiples of checkpoint.every_steps reached while the checkpoint before was still "
            "being written: none was taken at them.",
            counters_.checkpoint_steps_skipped);
  m.Counter("delta_checkpoints", "parasol_delta_checkpoints_total",
            "Checkpoints written as deltas.", counters_.delta_checkpoints);
  m.Gauge("delta_checkpoint_bytes_last", "parasol_checkpoint_bytes_last",
          "Payload bytes of the newest checkpoint of each kind.", counters_.delta_bytes_last,
          "kind=\"delta\"");
  m.Gauge("full_checkpoint_bytes_last", "parasol_checkpoint_bytes_last", "",
          counters_.full_bytes_last, "kind=\"full\"");
  m.Counter("curve_refusals", "parasol_curve_refusals_total",
            "Connections refused by CURVE auth.", CurveRefusals());
  m.Gauge("connections", "parasol_connections", "Connections open now.",
          watch_ ? watch_->connections() : 0);
  m.Gauge("connection_cap", "parasol_connection_cap", "The most connections kept open.",
          watch_ ? watch_->cap() : 0);
  m.Counter("connections_refused_over_cap", "parasol_connections_over_cap_total",
            "Connections over the cap, refused or evicted.",
            watch_ ? watch_->refused_over_cap() : 0, "action=\"refused\"");
  m.Counter("connections_evicted_over_cap", "parasol_connections_over_cap_total", "",
            watch_ ? watch_->evicted_over_cap() : 0, "action=\"evicted\"");
  m.Counter("idle_connections_shut", "parasol_idle_connections_shut_total",
            "Connections shut for idleness.", watch_ ? watch_->idle_shut() : 0);
  m.Counter("duplicate_pushes", "parasol_duplicate_pushes_total",
            "Pushes answered as already applied (a resend or a replay).",
            counters_.duplicate_pushes);
  m.Counter("peer_refusals", "parasol_peer_refusals_total",
            "Requests of peers over their share of reply bytes, not served.",
            counters_.peer_refusals);
  m.Gauge("peers", "parasol_peers", "Peers with replies queued or counted.", peers_.size());
  m.Gauge("other_peers_queued_bytes", "parasol_other_peers_queued_bytes",
          "Reply bytes queued to peers outside the job.", other_peers_queued_->load());
  m.Gauge("members", "parasol_members", "Workers of the job this shard knows of.", members_);
  m.Counter("conflicting_resends", "parasol_conflicting_resends_total",
            "Pushes refused: applied before under the same name with another payload.",
            counters_.conflicting_resends);
  m.Counter("unsigned_member_entries", "parasol_unsigned_member_entries_total",
            "Relayed membership entries without shard 0's MAC.",
            counters_.unsigned_member_entries);
  m.Counter("nonfinite_pushes", "parasol_nonfinite_pushes_total",
            "Pushes refused whole for a NaN or infinite value.", counters_.nonfinite_pushes);
  m.Counter("nonfinite_updates_kept", "parasol_nonfinite_updates_kept_total",
            "Elements whose update (of finite gradients) would not have been finite, left as "
            "they were.",
            NonfiniteUpdatesKept());
  m.Gauge("pull_ahead_max", "parasol_pull_ahead_max",
          "The most clocks a pull was ahead of its sender's (prefetch).",
          counters_.pull_ahead_max);
  m.Counter("replayed_pushes", "parasol_replayed_total",
            "Requests of workers' replays after a restart, by kind (refused: the worker stops).",
            counters_.replayed_pushes, "kind=\"push\"");
  m.Counter("replayed_clocks", "parasol_replayed_total", "", counters_.replayed_clocks,
            "kind=\"clock\"");
  m.Counter("refused_replays", "parasol_replayed_total", "", counters_.refused_replays,
            "kind=\"refused\"");
  m.Counter("worker_restarts", "parasol_worker_restarts_total",
            "Workers that said Hello again with a new incarnation (they restarted).",
            counters_.worker_restarts);
  m.Counter("lost_replays", "parasol_lost_replays_total",
            "Workers that restarted before their replay to this restarted shard ended (two "
            "overlapping failures: their acknowledged pushes since the checkpoint are lost).",
            counters_.lost_replays);
  m.Counter("rollbacks", "parasol_rollbacks_total",
            "Rollbacks of the job to a checkpoint every shard holds (two failures overlapped).",
            counters_.rollbacks);
  m.Counter("rollbacks_barred", "parasol_rollbacks_barred_total",
            "Losses no rollback could undo, as it would go back past a change no rollback "
            "crosses (a change of the shard count, a leaver that has finished); they stay "
            "reported.",
            counters_.rollbacks_barred);
  m.Counter("rollbacks_refused", "parasol_rollbacks_refused_total",
            "Of rollbacks_barred, those barred by the shard that decides a rollback (shard 0, "
            "or any shard across a change of the shard count).",
            counters_.rollbacks_refused);
  m.Counter("rolled_back_requests", "parasol_rolled_back_requests_total",
            "Requests refused as of a generation the job rolled back.",
            counters_.rolled_back_requests);
  m.Gauge("rollback_generation", "parasol_rollback_generation",
          "How many times the job rolled back.", rollback_gen_);
  m.Gauge("rollback_owed", "parasol_rollback_owed",
          "1 once this shard found that two failures overlapped, until the job rolls back.",
          rollback_owed_);
  m.Counter("stale_replays", "parasol_stale_replays_total",
            "Replays meant for an earlier process of this shard, dropped.",
            counters_.stale_replays);
  m.Gauge("push_record_entries", "parasol_push_record_entries",
          "Entries of the applied-push record (bounded by workers x 64 clocks).",
          push_gate_.record().Entries());
  m.Counter("rows_pulled", "parasol_rows_total", "Sparse rows pulled and pushed.",
            counters_.rows_pulled, "op=\"pull\"");
  m.Counter("rows_pushed", "parasol_rows_total", "", counters_.rows_pushed, "op=\"push\"");
  m.Counter("dense_elements_pulled", "parasol_dense_elements_total",
            "Dense elements pulled and pushed.", counters_.dense_elements_pulled,
            "op=\"pull\"");
  m.Counter("dense_elements_pushed", "parasol_dense_elements_total", "",
            counters_.dense_elements_pushed, "op=\"push\"");
  static const char* kModes[] = {"bsp", "ssp", "asp"};
  m.JsonOnly("consistency", kModes[static_cast<int>(manifest_.training.consistency)]);
  m.Gauge("clock", "parasol_clock", "This shard's clock.", ShardClock());
  m.Gauge("min_clock", "parasol_clock_min", "Slowest live worker's clock (-1: none).",
          controller_.live_workers() ? controller_.MinClock() : int64_t{-1});
  m.Gauge("max_clock", "parasol_clock_max", "Fastest worker's clock.", controller_.MaxClock());
  m.Gauge("held_pulls", "parasol_held_pulls", "Pulls held now.", held_pulls_.size());
  m.Counter("pulls_held_total", "parasol_pulls_held_total", "Pulls held for the read bound.",
            counters_.pulls_held);
  m.Counter("pull_wait_ms_total", "parasol_pull_wait_ms_total",
            "Milliseconds pulls waited for the read bound, all together.",
            counters_.pull_wait_ms);
  m.Counter("bsp_clocks_applied", "parasol_bsp_clocks_applied_total", "BSP clocks applied.",
            counters_.bsp_clocks_applied);
  m.Counter("bsp_rows_before_reply", "parasol_bsp_rows_applied_total",
            "Rows of BSP clocks applied, before the tick's reply or after it (in the "
            "background).",
            counters_.bsp_rows_before_reply.load(), "pass=\"before_reply\"");
  m.Counter("bsp_rows_after_reply", "parasol_bsp_rows_applied_total", "",
            counters_.bsp_rows_after_reply.load(), "pass=\"after_reply\"");
  m.JsonOnly("apply_after_reply", apply_after_reply_);
  // The request thread's time: the shard's side of the worker's time split (a shard that
  // mostly waits is bounded by its workers or the network, one that never waits by its cores).
  static const char* kServed[] = {"pushes", "ticks", "pulls", "other"};
  m.Counter("seconds_waiting", "parasol_request_thread_seconds_total",
            "The request thread's time since the shard began serving: waiting for a message, "
            "and serving pushes, ticks (with the BSP clocks they complete, and the pulls behind "
            "them), pulls, and the rest (periodic work, control requests).",
            counters_.seconds[kServeWaiting], "phase=\"waiting\"");
  for (int k = 0; k < 4; ++k) {
    m.Counter(std::string("seconds_serving_") + kServed[k],
              "parasol_request_thread_seconds_total", "", counters_.seconds[k],
              std::string("phase=\"") + kServed[k] + "\"");
  }
  m.Counter("seconds_applying_clocks", "parasol_bsp_apply_seconds_total",
            "Of the request thread's time, applying BSP clocks (a tick's, or one a lost "
            "worker or a change of the shard count completes, and the rest of one applied "
            "after a reply when the request thread waits for it).",
            counters_.seconds_applying_clocks);
  m.Counter("bsp_sum_parts_reused", "parasol_bsp_sum_parts_reused_total",
            "Parts of BSP clocks' sums that took the buffers of a clock applied before.",
            spare_parts_.reused);
  m.Gauge("bsp_spare_sum_bytes", "parasol_bsp_spare_sum_bytes",
          "Bytes of applied clocks' sum buffers kept for the next clocks.", spare_parts_.bytes);
  m.Counter("tick_pushes_checked", "parasol_tick_pushes_checked_total",
            "Pushes ticks named, found applied before they passed.",
            counters_.tick_pushes_checked);
  m.Gauge("pending_clocks", "parasol_pending_clocks", "BSP clocks whose pushes are being summed.",
          aggregates_.size());
  m.Gauge("held_bytes", "parasol_held_bytes", "Request bytes of the pulls held now.",
          held_bytes_);
  m.Gauge("open_barriers", "parasol_open_barriers", "Barriers not yet released.",
          barriers_.size());
  m.Counter("replies_dropped", "parasol_replies_dropped_total",
            "Replies dropped because the peer's queue was full (server.socket_hwm).",
            replies_dropped_);
  m.Gauge("queued_reply_bytes", "parasol_queued_reply_bytes",
          "Reply bytes sent but not yet taken by their peers (server.max_queued_reply_bytes).",
          QueuedReplyBytes());
  m.JsonOnly("warnings_not_logged", bad_message_log_.left_out_total() +
                                        failed_request_log_.left_out_total() +
                                        undelivered_log_.left_out_total());
  m.Gauge("", "parasol_lost_workers", "Workers declared lost.", counters_.lost_workers);
  m.Counter("metrics_connections_refused", "parasol_metrics_connections_refused_total",
            "Metrics connections closed over the connection cap.",
            metrics_ ? metrics_->connections_refused() : 0);
  m.Counter("metrics_connections_timed_out", "parasol_metrics_connections_timed_out_total",
            "Metrics connections closed for not sending a request in time.",
            metrics_ ? metrics_->connections_timed_out() : 0);
  m.Gauge("servers_now", "parasol_servers", "Shards of the newest placement.",
          membership_.LastPlacement().count());
  m.Gauge("migration_installed", "parasol_migration_clock",
          "The clock of the newest change of the shard count whose rows this shard installed "
          "and dropped (-1: none).",
          migration_.installed, "step=\"installed\"");
  m.Gauge("migration_dropped", "parasol_migration_clock", "", migration_.dropped,
          "step=\"dropped\"");
  m.Gauge("key_share", "parasol_key_share", "This shard's share of the keys.",
          membership_.LastPlacement().Share(rank_));
  m.JsonOnly("job_failure", job_failure_.ok() ? std::string() : job_failure_.message());
  if (disk_) {
    m.Gauge("memory_budget", "parasol_memory_budget_bytes",
            "server.memory_budget of the tiered tables.", manifest_.server.memory_budget);
    m.JsonOnly("disk_dir", disk_->dir());
    m.Gauge("disk_bytes", "parasol_disk_tier_bytes", "Bytes of the disk tier on disk (SST files).",
            disk_->DiskBytes());
    m.Gauge("disk_memtable_bytes", "parasol_disk_tier_memory_bytes",
            "Memory of the disk tier, by part.", disk_->MemTableBytes(), "part=\"memtables\"");
    m.Gauge("disk_cache_bytes", "parasol_disk_tier_memory_bytes", "", disk_->CacheBytes(),
            "part=\"block_cache\"");
    m.Gauge("disk_cache_capacity", "parasol_disk_tier_cache_capacity_bytes",
            "The disk tier's block cache capacity.", disk_->CacheCapacity());
    m.Counter("disk_uncached_reads", "parasol_disk_tier_uncached_reads_total",
              "Reads of the disk tier that missed its block cache.", disk_->uncached_reads());
    m.Counter("disk_rows_read", "parasol_disk_tier_rows_total",
              "Rows read from and written to the disk tier.", disk_->rows_read(), "op=\"read\"");
    m.Counter("disk_rows_written", "parasol_disk_tier_rows_total", "", disk_->rows_written(),
              "op=\"write\"");
  }
  return m;
}

MetricTable ShardServer::TableMetrics(size_t t) const {
  MetricTable m;
  m.JsonOnly("name", manifest_.tables[t].name);
  if (!sparse_[t]) {
    m.JsonOnly("kind", "dense");
    m.JsonOnly("slice_begin", dense_[t]->slice().begin);
    m.JsonOnly("slice_end", dense_[t]->slice().end);
    m.Gauge("bytes", "parasol_table_bytes", "Bytes of each table held by this shard.",
            dense_[t]->MemoryBytes());
    m.Counter("copies_on_write", "parasol_dense_copies_on_write_total",
              "Dense slices copied because a checkpoint was reading them.",
              dense_[t]->copies_on_write());
    return m;
  }
  const SparseTable& st = *sparse_[t];
  const SparseTable::Counters c = st.TotalCounters();
  const uint64_t rows = st.TotalRows();
  m.JsonOnly("kind", "sparse");
  m.Gauge("rows", "parasol_table_rows", "Rows of each sparse table held by this shard.", rows);
  m.Gauge("bytes", "parasol_table_bytes", "Bytes of each table held by this shard.",
          st.MemoryBytes());
  m.JsonOnly("bytes_per_row", rows ? st.MemoryBytes() / static_cast<double>(rows) : 0.0);
  m.JsonOnly("row_floats", st.row_floats());
  m.JsonOnly("row_bytes", sizeof(float) * st.partition(0).stored_words());  // as stored
  m.Gauge("pending_keys", "parasol_admission_pending_keys",
          "Keys counted but not yet admitted.", st.PendingKeys());
  m.Counter("admitted", "parasol_admitted_keys_total", "Keys admitted after their count.",
            c.admitted);
  m.Counter("pushes_counted", "parasol_admission_counted_pushes_total",
            "Pushes of keys not yet admitted (counted, not applied).", c.pushes_counted);
  m.Counter("evicted_ttl", "parasol_evictions_total", "Rows evicted, by reason.", c.evicted_ttl,
            "reason=\"ttl\"");
  m.Counter("evicted_max_rows", "parasol_evictions_total", "", c.evicted_max_rows,
            "reason=\"max_rows\"");
  m.Counter("pending_expired", "parasol_evictions_total", "", c.pending_expired,
            "reason=\"admission_count\"");
  m.JsonOnly("storage", st.tiered() ? "tiered" : "memory");
  if (st.tiered()) {
    const uint64_t lookups = c.memory_hits + c.memory_misses;
    m.Gauge("memory_rows", "parasol_tier_rows", "Rows of each tiered table, by tier.",
            st.MemoryRows(), "tier=\"memory\"");
    m.Gauge("disk_rows", "parasol_tier_rows", "", st.DiskRows(), "tier=\"disk\"");
    m.JsonOnly("memory_hit_rate", lookups ? c.memory_hits / static_cast<double>(lookups) : 0.0);
    m.Counter("memory_hits", "parasol_tier_lookups_total",
              "Keys of tiered tables looked up, found in memory or not (then read from disk, "
              "or new).",
              c.memory_hits, "result=\"memory\"");
    m.Counter("memory_misses", "parasol_tier_lookups_total", "", c.memory_misses,
              "result=\"miss\"");
    m.Counter("promoted", "parasol_tier_moves_total", "Rows moved between the tiers.",
              c.promoted, "to=\"memory\"");
    m.Counter("demoted", "parasol_tier_moves_total", "", c.demoted, "to=\"disk\"");
    const Status disk = st.DiskStatus();
    m.JsonOnly("disk_error", disk.ok() ? std::string() : disk.ToString());
  }
  return m;
}

std::string ShardServer::MetricsText() const {
  PrometheusText t;
  const std::string shard = "shard=\"" + std::to_string(rank_) + "\"";
  t.Type("parasol_requests_total", "counter", "Requests received, by op.");
  for (int op = 0; op <= static_cast<int>(wire::Op::MAX); ++op) {
    t.Sample("parasol_requests_total", static_cast<double>(op_counts_[op]),
             shard + ",op=\"" + OpName(static_cast<Op>(op)) + "\"");
  }
  t.Type("parasol_request_bytes_total", "counter", "Request bytes received, by op.");
  for (int op = 0; op <= static_cast<int>(wire::Op::MAX); ++op) {
    t.Sample("parasol_request_bytes_total", static_cast<double>(op_bytes_[op]),
             shard + ",op=\"" + OpName(static_cast<Op>(op)) + "\"");
  }
  t.Type("parasol_warnings_total", "counter",
         "Warnings peers triggered (bad messages, failed requests, undelivered replies).");
  t.Type("parasol_warnings_not_logged_total", "counter",
         "Of those, how many the log rate limit left out.");
  const std::pair<const char*, const LogLimiter*> logs[] = {
      {"bad_message", &bad_message_log_},
      {"failed_request", &failed_request_log_},
      {"undelivered_reply", &undelivered_log_}};
  for (const auto& [kind, log] : logs) {
    const std::string labels = shard + ",kind=\"" + kind + "\"";
    t.Sample("parasol_warnings_total", static_cast<double>(log->total()), labels);
    t.Sample("parasol_warnings_not_logged_total", static_cast<double>(log->left_out_total()),
             labels);
  }
  Metrics().WritePrometheus(t, shard);
  pull_wait_.Write(t, "parasol_pull_wait_seconds", "Time a pull waited for the read bound.",
                   shard);
  WriteProcessMetrics(t, shard);
  std::vector<MetricTable> tables;
  std::vector<std::pair<const MetricTable*, std::string>> labelled;
  tables.reserve(manifest_.tables.size());
  for (size_t i = 0; i < manifest_.tables.size(); ++i) {
    tables.push_back(TableMetrics(i));
    labelled.emplace_back(&tables.back(), shard + ",table=\"" + manifest_.tables[i].name + "\"");
  }
  MetricTable::WritePrometheus(t, labelled);
  return t.str();
}

namespace {

// A reply frame that counts its bytes in `queued` until ZeroMQ has sent (or dropped) it.
// A reply frame counted while ZeroMQ holds it: in the shard's total, its peer's and (for a
// peer outside the job) all such peers' (null counters are not kept).
struct QueuedFrame {
  QueuedFrame(zmq::message_t m, std::shared_ptr<std::atomic<uint64_t>> q,
              std::shared_ptr<std::atomic<uint64_t>> p, std::shared_ptr<std::atomic<uint64_t>> g)
      : message(std::move(m)), queued(std::move(q)), peer(std::move(p)), group(std::move(g)) {
    for (auto* c : {&queued, &peer, &group}) {
      if (*c) (*c)->fetch_add(message.size());
    }
  }
  ~QueuedFrame() {
    for (auto* c : {&queued, &peer, &group}) {
      if (*c) (*c)->fetch_sub(message.size());
    }
  }
  zmq::message_t message;
  std::shared_ptr<std::atomic<uint64_t>> queued, peer, group;
};

}  // namespace

zmq::message_t ShardServer::QueuedReplyFrame(zmq::message_t m, PeerAccount* peer) {
  auto frame = std::make_shared<QueuedFrame>(
      std::move(m), queued_reply_bytes_, peer ? peer->queued : nullptr,
      peer && peer->member_of < 0 ? other_peers_queued_ : nullptr);
  const void* data = frame->message.data();
  const size_t size = frame->message.size();
  return SharedMessage(std::move(frame), data, size);
}

void ShardServer::NoteFailure(const std::string& what, uint32_t worker, const Status& st) {
  if (st.code() == StatusCode::kBadMessage || st.code() == StatusCode::kResourceExhausted) {
    ++counters_.bad_messages;
  }
  ++counters_.errors;
  uint64_t left_out = 0;
  if (failed_request_log_.Allow(env_->Now(), &left_out)) {
    spdlog::warn("shard {}: {} from worker {} failed: {}{}", rank_, what, worker, st.ToString(),
                 left_out ? " (and " + std::to_string(left_out) + " more since the last line)"
                          : std::string());
  }
}

Header ShardServer::Stamped(const Header& reply) const {
  Header stamped = reply;
  stamped.server_epoch = epoch_;
  stamped.checkpoint_clock = checkpoint_clock_;
  // Counts the workers trim their push logs by (the restored one: what that checkpoint holds
  // of earlier processes' acknowledgements), and what their loss check compares with.
  stamped.checkpoint_count = checkpoint_sequence_;
  stamped.checkpoints_begun = std::max(checkpoints_begun_, checkpoint_sequence_);
  stamped.restored_count = restored_complete_;
  stamped.restored_sequence = restored_sequence_;
  stamped.restored_writer = restored_writer_;
  stamped.membership_version = membership_.version();
  stamped.rollback_gen = rollback_gen_;
  stamped.rollback_needed = stamped.rollback_needed || rollback_owed_;
  stamped.rollback_clock = rollback_clock_;
  return stamped;
}

Result<std::vector<StepPart>> ShardServer::CheckStep(const Header& step,
                                                     std::span<const zmq::message_t> frames) const {
  if (step.is_reply) return BadMessage("Step: expected a request");
  if (step.status != StatusCode::kOk) return BadMessage("Step: a request must not carry a status");
  if (step.replay) return BadMessage("Step: replays travel one request per message");
  PARASOL_ASSIGN_OR_RETURN(std::vector<StepPart> parts, SplitStep(step, frames));
  // The Step rule (common/protocol.hpp), as the worker follows it.
  uint64_t bytes = 0;
  for (size_t i = 0; i < parts.size(); ++i) {
    const Header& h = parts[i].header;
    const std::string where = "Step, part " + std::to_string(i) + " (" + OpName(h.op) + ")";
    for (size_t f = 1; f <= parts[i].payload_frames; ++f) bytes += frames[parts[i].header_frame + f].size();
    if (h.incarnation != step.incarnation) {
      return BadMessage(where + ": another incarnation than the Step's");
    }
    if (h.replay) return BadMessage(where + ": replays travel on their own, not in a Step");
    if (!StepMayHold(parts[0].header.op, h.op, TickLeaves(h), i) ||
        (h.op == Op::Clock && !StepMayLeadWithTick(parts.size()))) {
      return BadMessage(where + ": a Step holds pushes, or pulls after at most one tick");
    }
    if (h.clock != step.clock) {
      return BadMessage(where + ": clock " + std::to_string(h.clock) + ", the Step's is " +
                        std::to_string(step.clock));
    }
  }
  if (bytes > manifest_.server.max_request_bytes) {
    return ResourceExhausted("Step: its parts carry " + std::to_string(bytes) +
                             " payload bytes, over the limit of " +
                             std::to_string(manifest_.server.max_request_bytes) +
                             " bytes (server.max_request_bytes)");
  }
  return parts;
}

void ShardServer::HandleStep(const Header& step, std::vector<zmq::message_t>& frames) {
  // Counted as a Step; its parts count by their own ops.
  op_counts_[static_cast<int>(Op::Step)]++;
  Result<std::vector<StepPart>> parts =
      CheckStep(step, std::span<const zmq::message_t>(frames).subspan(2));
  if (parts.ok() && !parts->empty()) serving_ = ServeKindOf((*parts)[0].header.op);
  Status st = parts.status();
  if (st.ok()) st = Admit(step);
  const bool pulls = st.ok() && ((*parts)[0].header.op == Op::PullSparse ||
                                 (*parts)[0].header.op == Op::PullDense);
  // The membership the parts carry first: a change of the shard count decides whether the
  // pulls must wait.
  if (st.ok()) {
    for (const StepPart& part : *parts) {
      if (!part.header.members.empty()) st = MergeMembership(part.header);
      if (!st.ok()) break;
    }
  }
  // The most membership its parts' sender knew (see ReadAllowed).
  uint64_t known = 0;
  if (st.ok()) {
    for (const StepPart& part : *parts) known = std::max(known, part.header.membership_version);
  }
  if (st.ok() && pulls && controller_.InJob(step.worker_id)) {
    // The pulls share the Step's clock: held together until the read bound allows it. Only a
    // Step of sparse pulls alone may be a prefetch.
    // (A shard that serves nothing yet has no clocks of the workers: see DispatchOp.)
    if (Entered()) {
      st = controller_.CheckRequestClock(step.worker_id, step.clock, OnlySparsePulls(*parts));
    }
    if (st.ok() && !ReadAllowed(step.worker_id, step.clock, known)) {
      st = HoldPull(step, frames, known, static_cast<uint32_t>(StepParts(step)));
      if (st.ok()) return;
    }
  }
  if (st.ok() && !pulls && !controller_.InJob(step.worker_id)) {
    st = InvalidArgument("Step of pushes or a tick: worker " + std::to_string(step.worker_id) +
                         " is not in this job");
  }
  if (!st.ok()) {
    NoteBehind();  // before the reply: it carries rollback_needed when this refusal owes one
    NoteFailure("Step", step.worker_id, st);
    SendReply(frames[0], ReplyTo(step, st.WithContext("shard " + std::to_string(rank_))), {});
    return;
  }
  if (pulls && controller_.InJob(step.worker_id)) ObserveWait(0);
  // A tick's pulls: the rows they read are applied first if the tick completes a BSP clock.
  if ((*parts)[0].header.op == Op::Clock &&
      manifest_.training.consistency == TrainingOptions::Consistency::kBsp && CanSplitApply()) {
    const std::span<zmq::message_t> rest = std::span<zmq::message_t>(frames).subspan(2);
    for (size_t i = 1; i < parts->size(); ++i) {
      const StepPart& part = (*parts)[i];
      NotePullKeys(part.header, rest.subspan(part.header_frame + 1, part.payload_frames));
    }
  }
  AnswerStep(step, frames, &*parts);
}

void ShardServer::AnswerStep(const Header& step, std::vector<zmq::message_t>& frames,
                             std::vector<StepPart>* checked) {
  // A held Step was checked when it arrived (its frames have not changed since): split again.
  Result<std::vector<StepPart>> split =
      checked ? Result<std::vector<StepPart>>(std::move(*checked))
              : SplitStep(step, std::span<const zmq::message_t>(frames).subspan(2));
  if (!split.ok()) {
    SendReply(frames[0], ReplyTo(step, split.status()), {});
    return;
  }
  std::vector<StepPart>* parts = &*split;
  struct PartReply {
    Header header;
    std::vector<zmq::message_t> payload;
  };
  std::vector<PartReply> replies;
  replies.reserve(parts->size());
  bool failed = false;                  // a tick of the Step was refused ...
  StatusCode tick_code = StatusCode::kOk;  // ... with this code
  uint64_t reply_bytes = 0;
  const bool in_job = controller_.InJob(step.worker_id);
  for (size_t i = 0; i < parts->size(); ++i) {
    StepPart& part = (*parts)[i];
    const bool pull = part.header.op == Op::PullSparse || part.header.op == Op::PullDense;
    if (pull && !failed && in_job && job_failure_.ok() && !controller_.IsLost(step.worker_id) &&
        !ReadAllowed(part.header.worker_id, part.header.clock, part.header.membership_version)) {
      // After the tick: the pulls left wait for the read bound together, as a Step of their
      // own with the same request id (answered in a second reply).
      Header rest = step;
      rest.clock = part.header.clock;
      SetStepParts(rest, parts->size() - i);
      std::vector<zmq::message_t> held;
      held.emplace_back(frames[0].data(), frames[0].size());
      held.push_back(EncodeHeader(rest));
      for (size_t f = 2 + part.header_frame; f < frames.size(); ++f) {
        held.push_back(std::move(frames[f]));
      }
      Status st = Entered() ? controller_.CheckRequestClock(
                                  step.worker_id, rest.clock,
                                  OnlySparsePulls(std::span<const StepPart>(*parts).subspan(i)))
                            : Status::Ok();
      if (st.ok()) {
        st = HoldPull(rest, held, part.header.membership_version,
                      static_cast<uint32_t>(parts->size() - i));
      }
      if (!st.ok()) {
        ++counters_.errors;
        for (; i < parts->size(); ++i) {
          replies.push_back({ReplyTo((*parts)[i].header,
                                     st.WithContext("shard " + std::to_string(rank_))), {}});
        }
      }
      break;
    }
    // The part as a message of its own: [identity, header, payload...].
    std::vector<zmq::message_t> own;
    own.reserve(2 + part.payload_frames);
    own.emplace_back(frames[0].data(), frames[0].size());
    for (size_t f = 0; f <= part.payload_frames; ++f) {
      own.push_back(std::move(frames[2 + part.header_frame + f]));
    }
    PartReply r{ReplyTo(part.header, Status::Ok()), {}};
    Status st;
    bool held = false;
    if (pull && failed) {
      // A tick refused for now (Unavailable) is sent again, and so are the pulls behind it.
      st = Status(tick_code == StatusCode::kUnavailable ? StatusCode::kUnavailable
                                                        : StatusCode::kFailedPrecondition,
                  std::string(OpName(part.header.op)) +
                      " not answered: the tick before it in this Step failed");
    } else if (reply_bytes > manifest_.server.max_request_bytes) {
      // The replies of one Step are bounded like one request's: a Step of many large pulls
      // is refused past the limit instead of copying them all.
      st = ResourceExhausted(std::string(OpName(part.header.op)) + " not answered: the Step's "
                             "replies before it take " + std::to_string(reply_bytes) +
                             " bytes, over server.max_request_bytes (" +
                             std::to_string(manifest_.server.max_request_bytes) + ")");
    } else {
      st = Dispatch(part.header, own, &r.header, &r.payload, &held);
      for (const zmq::message_t& m : r.payload) reply_bytes += m.size();
    }
    if (held) continue;  // answered on its own when the bound allows (its request id says which)
    if (!st.ok()) {
      if (part.header.op == Op::Clock && !failed) {
        failed = true;
        tick_code = st.code();
      }
      NoteFailure(std::string(OpName(part.header.op)) + " (in a Step)", part.header.worker_id, st);
      r.header = ReplyTo(part.header, st.WithContext("shard " + std::to_string(rank_)));
      r.payload.clear();
    }
    replies.push_back(std::move(r));
  }
  NoteBehind();  // before the parts are stamped: a refused part's reply says rollback_needed
  if (replies.empty()) return;  // every part is held
  if (env_->Hit("shard.reply") == Fault::kDrop) return;
  Header reply = ReplyTo(step, Status::Ok());
  SetStepParts(reply, replies.size());
  std::vector<zmq::message_t> payload;
  for (PartReply& r : replies) {
    // Stamped now: a checkpoint that a part's push started counts for all parts before it.
    payload.push_back(EncodeHeader(Stamped(r.header)));
    for (auto& m : r.payload) payload.push_back(std::move(m));
  }
  SendReply(frames[0], reply, std::move(payload));
}

void ShardServer::SendReply(const zmq::message_t& identity, const Header& reply,
                            std::vector<zmq::message_t> payload) {
  std::vector<zmq::message_t> frames;
  frames.reserve(2 + payload.size());
  frames.emplace_back(identity.data(), identity.size());
  zmq::message_t header = EncodeHeader(Stamped(reply));
  // Every reply counts at its size, header included.
  uint64_t bytes = header.size();
  for (const auto& m : payload) bytes += m.size();
  PeerAccount* peer = reply_sink_ ? nullptr : Peer(identity, /*create=*/false);
  // A reply to a peer outside the job is never larger than its share: one that does not read
  // could otherwise hold every byte its kind may have, and lock out every tool. It is told so
  // instead, in a few bytes.
  if (peer && peer->member_of < 0 && bytes > PeerShare(*peer)) {
    Header refused = reply;
    refused.op = Op::Error;
    refused.status = StatusCode::kResourceExhausted;
    SetStepParts(refused, 0);
    refused.value_frames = 0;
    refused.message = "shard " + std::to_string(rank_) + ": a reply of " +
                      std::to_string(bytes) + " bytes is more than a connection outside the " +
                      "job's workers may have queued (" + std::to_string(PeerShare(*peer)) +
                      ", a sixteenth of server.max_queued_reply_bytes): ask for less at a time";
    ++counters_.peer_refusals;
    payload.clear();
    header = EncodeHeader(Stamped(refused));
    bytes = header.size();
  }
  // Each limit holds only with others queued: a reply larger than a limit alone goes (it is
  // bounded by the request it answers), or a large pull could never be answered.
  const uint64_t max = max_queued_reply_bytes_;
  const uint64_t total = QueuedReplyBytes();
  const uint64_t others = other_peers_queued_->load();  // of peers outside the job
  const bool member = peer && peer->member_of >= 0;
  std::string over;
  if (peer == nullptr || member) {
    // The job's workers (and replies with no peer account): 11/16 of the bytes, which peers
    // outside the job cannot take.
    const uint64_t members = total - std::min(total, others);
    if (members > 0 && members + bytes > max / 16 * 11) {
      over = "replies waiting for the job's workers hold " + std::to_string(members) +
             " bytes (11/16 of server.max_queued_reply_bytes)";
    }
  } else {
    // Peers outside the job: a quarter together, and a sixteenth more for a small reply to a
    // peer with nothing queued (a tool's stats is not held up by peers that do not read).
    const bool small = peer->queued->load() == 0 && bytes <= kSmallReplyBytes;
    const uint64_t cap = max / 4 + (small ? max / 16 : 0);
    if (others > 0 && others + bytes > cap) {
      over = "replies waiting for peers outside the job hold " + std::to_string(others) +
             " bytes (a quarter of server.max_queued_reply_bytes)";
    }
  }
  if (over.empty() && peer) {
    const uint64_t mine = peer->queued->load();
    const uint64_t share = PeerShare(*peer);
    if (mine > 0 && mine + bytes > share) {
      over = "its peer has not read " + std::to_string(mine) + " bytes of replies (its share: " +
             std::to_string(share) + " bytes)";
    }
  }
  if (!over.empty()) {
    // A real worker resends its request.
    DroppedReply(reply, over, peer);
    return;
  }
  frames.push_back(QueuedReplyFrame(std::move(header), peer));
  for (auto& m : payload) frames.push_back(QueuedReplyFrame(std::move(m), peer));
  if (reply_sink_) {
    reply_sink_(frames);
    return;
  }
  // Never wait for a peer that does not read its replies: past its queue's high-water mark
  // (server.socket_hwm) the reply is dropped, and a real worker resends its request.
  Status st = SendFrames(router_, frames, /*dontwait=*/true);
  if (!st.ok()) DroppedReply(reply, st.ToString(), peer);
}

ShardServer::PeerAccount* ShardServer::Peer(const zmq::message_t& identity, bool create) {
  const std::string id(static_cast<const char*>(identity.data()), identity.size());
  auto it = peers_.find(id);
  if (it != peers_.end()) return &it->second;
  if (!create) return nullptr;
  if (peers_.size() >= kMaxPeers) ForgetIdlePeers();
  if (peers_.size() >= kMaxPeers) return &overflow_peer_;
  return &peers_[id];
}

uint64_t ShardServer::PeerShare(const PeerAccount& peer) const {
  if (peer.member_of >= 0) {
    return max_queued_reply_bytes_ / 16 * 11 / std::max<uint32_t>(1, members_);
  }
  return max_queued_reply_bytes_ / 16;
}

void ShardServer::MarkMember(const zmq::message_t& identity, uint32_t worker) {
  PeerAccount* peer = Peer(identity, /*create=*/true);
  if (peer == &overflow_peer_ || peer->member_of == static_cast<int64_t>(worker)) return;
  if (member_identity_.size() <= worker) member_identity_.resize(worker + 1);
  // One connection per worker is a member: a restarted worker's new one replaces the old.
  if (!member_identity_[worker].empty()) {
    auto old = peers_.find(member_identity_[worker]);
    if (old != peers_.end() && old->second.member_of == static_cast<int64_t>(worker)) {
      old->second.member_of = -1;
      --members_;
    }
  }
  if (peer->member_of >= 0) {
    member_identity_[peer->member_of].clear();
    --members_;
  }
  peer->member_of = worker;
  member_identity_[worker].assign(static_cast<const char*>(identity.data()), identity.size());
  ++members_;
}

void ShardServer::ForgetIdlePeers() {
  // Peers outside the job with nothing queued, unheard for a minute (or any such, when the
  // table is full): what is left of them is their next request.
  const auto now = env_->Now();
  const bool full = peers_.size() >= kMaxPeers;
  for (auto it = peers_.begin(); it != peers_.end();) {
    const PeerAccount& p = it->second;
    if (p.member_of < 0 && p.queued->load() == 0 &&
        (full || now - p.last_seen > std::chrono::minutes(1))) {
      it = peers_.erase(it);
    } else {
      ++it;
    }
  }
}

void ShardServer::DroppedReply(const Header& reply, const std::string& why, PeerAccount* peer) {
  ++replies_dropped_;
  uint64_t left_out = 0;
  const auto now = env_->Now();
  // Counted in the shard's total; the line is rate-limited per peer, so one peer that never
  // reads cannot silence what the others' drops say.
  const bool shard_allows = undelivered_log_.Allow(now, &left_out);
  if (peer ? peer->log.Allow(now, &left_out) : shard_allows) {
    spdlog::warn("shard {}: reply to worker {} dropped: {}{}", rank_, reply.worker_id, why,
                 left_out ? " (and " + std::to_string(left_out) + " more since the last line)"
                          : std::string());
  }
  // The worker is waiting for a reply that will not come: until it resends, it is not silent
  // (only when the reply was its own: another peer may claim any worker).
  const uint32_t w = reply.worker_id;
  const bool its_own =
      reply_sink_ ? true : peer != nullptr && peer->member_of == static_cast<int64_t>(w);
  if (its_own && controller_.InJob(w) && !reply_dropped_since_[w]) {
    reply_dropped_since_[w] = env_->Now();
    controller_.AddHeld(w, +1);
  }
}

void ShardServer::HeardAfterDrop(uint32_t worker) {
  if (!reply_dropped_since_[worker]) return;
  reply_dropped_since_[worker].reset();
  controller_.AddHeld(worker, -1);
}

std::string ShardServer::StatsJson() const {
  Json s;
  Metrics().WriteJson(s);
  Json& ops = s["ops"] = Json::object();
  for (int op = 0; op <= static_cast<int>(wire::Op::MAX); ++op) {
    ops[OpName(static_cast<Op>(op))] = op_counts_[op];
  }
  Json& lost = s["lost_workers"] = Json::array();
  for (uint32_t w = 0; w < membership_.max_ranks(); ++w) {
    if (controller_.IsLost(w)) lost.push_back(w);
  }
  Json& members = s["membership"] = Json::array();
  for (const MemberEntry& e : membership_.Entries()) {
    if (e.worker & kServerEntry) continue;
    members.push_back(Json{{"worker", e.worker}, {"join", e.join}, {"leave", e.leave}});
  }
  // The shard count's changes, and how far this shard is with the newest.
  Json& servers = s["server_changes"] = Json::array();
  for (const auto& c : membership_.server_changes()) {
    servers.push_back(Json{{"clock", c.clock}, {"servers", c.count}});
  }
  s["worker_clocks"] = controller_.clocks();
  Json& tables = s["tables"] = Json::array();
  for (size_t t = 0; t < manifest_.tables.size(); ++t) {
    Json table;
    TableMetrics(t).WriteJson(table);
    tables.push_back(std::move(table));
  }
  return CompactJson(s);
}

}  // namespace parasol
