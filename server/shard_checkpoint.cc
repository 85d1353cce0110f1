// The checkpoint side of ShardServer: writing its tables, clocks, push record and pending BSP
// sums, and loading them back.
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <exception>
#include <filesystem>
#include <fstream>
#include <limits>
#include <new>

#include "common/huge_page_arena.hpp"
#include "common/protocol.hpp"
#include "common/fault_points.hpp"
#include "server/checkpoint.hpp"
#include "server/shard_server.hpp"
#include "server/shard_state.hpp"

namespace parasol {

// The header of the checkpoint that would be taken now.
CheckpointHeader ShardServer::NextCheckpointHeader(bool final) const {
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
  // Never a number used before: pushes acknowledged after a failed attempt said its number.
  h.sequence = std::max(checkpoints_begun_, checkpoint_sequence_) + 1;
  h.final = final;
  return h;
}

std::optional<uint64_t> ShardServer::CompleteThroughNow() const {
  // While a worker's replay to this restarted process is owed, the pushes the process before
  // acknowledged after the checkpoint this one restored are only in that worker's log: a
  // checkpoint taken now lacks them. A worker trims its entries of earlier processes by a
  // restored checkpoint's count, so that count must not claim them (parasol_sim --elastic
  // --seed 7053: a checkpoint taken for a restarted worker while another's replay was owed;
  // the shard died again, restored it, and that other worker dropped its unreplayed pushes).
  // Counted as owed too: a worker that timed out (lost) with its replay due may still come
  // back with its log, and a rank taken into the job from a membership copy since the restore
  // may have pushed to the process before (this process does not wait for it).
  if (controller_.ReplayUnheard() || !joined_since_restore_.empty()) return restored_complete_;
  return std::nullopt;
}

Status ShardServer::SaveState(const std::function<Status(const CheckpointBlock&)>& sink,
                              const DeltaSpec* delta, std::optional<uint64_t> complete_through) {
  std::function<bool(uint64_t)> keeps;
  if (!membership_.server_changes().empty() || staged_rows_) {
    keeps = [this](uint64_t key) { return KeepsKey(key); };
  }
  ShardState state(manifest_, rank_, sparse_, dense_, controller_, push_gate_.record(),
                   aggregates_, engines_.size(), membership_, &migration_, std::move(keeps));
  state.set_complete_through(complete_through, epoch_);
  return state.Save(sink, checkpoint_block_bytes_, delta);
}

Status ShardServer::WriteState(const std::string& path, const CheckpointHeader& h,
                               const DeltaSpec* delta, std::optional<uint64_t> complete_through,
                               uint64_t* bytes) {
  // Streamed: each block is written as the state produces it (a tiered table's rows need not
  // fit in memory).
  return WriteCheckpointFile(path, h, [&](const CheckpointBlockSink& sink) {
    return SaveState(
        [&](const CheckpointBlock& b) {
          *bytes += b.bytes.size();
          return sink(b);
        },
        delta, complete_through);
  }, env_);
}

bool ShardServer::StagedCheckpointFits() const {
  if (manifest_.checkpoint.copy_below == 0) return false;
  uint64_t bytes = 0;
  for (const auto& t : sparse_) {
    if (t) bytes += t->MemoryBytes();
  }
  for (const auto& t : dense_) {
    if (t) bytes += t->MemoryBytes();
  }
  for (const auto& [c, agg] : aggregates_) bytes += agg->SumBytes();
  return bytes <= manifest_.checkpoint.copy_below;
}

Status ShardServer::BeginStagedCheckpoint(BackgroundCheckpoint& bg, const DeltaSpec* delta) {
  auto staged = std::make_shared<StagedCheckpoint>();
  // The memory of the last one's blocks, reused: no page of it is new.
  staged->blocks = std::move(staged_spare_);
  staged_spare_.clear();
  size_t n = 0;
  const Status saved = SaveState(
      [&](const CheckpointBlock& b) {
        if (n == staged->blocks.size()) staged->blocks.emplace_back();
        CheckpointBlock& copy = staged->blocks[n++];
        copy.kind = b.kind;
        copy.table = b.table;
        copy.count = b.count;
        // A new block's memory faults in huge pages (4 KiB faults cost more than the copy).
        if (copy.bytes.capacity() < b.bytes.size()) ReserveInHugePages(copy.bytes, b.bytes.size());
        copy.bytes.assign(b.bytes.begin(), b.bytes.end());
        staged->bytes += b.bytes.size();
        return Status::Ok();
      },
      delta, bg.complete_through);
  if (!saved.ok()) {
    checkpoint_owed_ = true;  // retried by MaybeCheckpoint() in a second
    force_full_ = true;       // the rows it removed are recorded nowhere else
    last_checkpoint_failure_ = env_->Now();
    return saved;
  }
  staged->blocks.resize(n);
  // Only the copy, the path and the header go to the writer: it reads nothing of the shard's.
  StagedCheckpoint* work = staged.get();
  Env* env = env_;
  staged->task = env_->RunAside([work, env, path = bg.path, header = bg.header] {
    Status st;
    try {
      st = WriteCheckpointFile(path, header, work->blocks, env);
    } catch (const std::exception& e) {
      st = IoError("cannot write '" + path + "': " + e.what());
    } catch (...) {
      st = IoError("cannot write '" + path + "': an exception");
    }
    work->status = st;
    work->written = true;
  });
  bg.staged = std::move(staged);
  bg.pause_ms = std::chrono::duration<double, std::milli>(env_->Now() - bg.start).count();
  checkpoints_begun_ = std::max(checkpoints_begun_, bg.header.sequence);
  background_ = std::move(bg);
  return Status::Ok();
}

Status ShardServer::VisitModel(const std::function<void(const CheckpointBlock&)>& visit) {
  FinishDeferredApply();
  const ShardState state(manifest_, rank_, sparse_, dense_, controller_, push_gate_.record(),
                         aggregates_, engines_.size(), membership_, &migration_);
  return state.Save([&](const CheckpointBlock& b) {
    const auto kind = static_cast<CheckpointBlockKind>(b.kind);
    if (IsSparseRows(kind) || kind == CheckpointBlockKind::kDenseSlice ||
        kind == CheckpointBlockKind::kDenseRange) {
      visit(b);
    }
    return Status::Ok();
  });
}

void ShardServer::CheckpointWritten(const CheckpointHeader& h, const std::string& path,
                                    const std::string& reason, uint64_t stamp,
                                    const std::vector<uint64_t>& pushed_at_start, double seconds,
                                    double pause_ms, uint64_t bytes, uint32_t begun_clock) {
  const CheckpointOptions& c = manifest_.checkpoint;
  checkpoint_sequence_ = h.sequence;
  // The next delta holds the rows updated since this one's state was taken.
  if (!h.delta) chain_base_ = h.sequence;
  chain_since_clock_ = begun_clock;
  force_full_ = false;
  if (h.delta) {
    ++counters_.delta_checkpoints;
    counters_.delta_bytes_last = bytes;
  } else {
    counters_.full_bytes_last = bytes;
  }
  checkpoints_begun_ = std::max(checkpoints_begun_, h.sequence);
  checkpoint_owed_ = false;
  // Not while a rollback is owed or asked about: the checkpoint it goes back to stays.
  if (!rollback_owed_ && !rollback_pending_) PruneCheckpoints(c.dir, rank_, c.keep, env_->Files());
  ++counters_.checkpoints;
  counters_.checkpoint_pause_ms_max = std::max(counters_.checkpoint_pause_ms_max, pause_ms);
  counters_.checkpoint_seconds_last = seconds;
  last_checkpoint_ = env_->Now();
  saved_stamp_ = stamp;
  // A request for a checkpoint of this state is answered at once from now on.
  requested_checkpoint_stamp_ = stamp;
  // What a worker pushed after the state was taken is not in this checkpoint.
  push_gate_.CheckpointTaken(pushed_at_start);
  checkpoint_clock_ = h.clock;
  spdlog::info("shard {}: {} {} ({}) at clock {}: {:.1f} MB in {:.3f} s, serving "
               "stopped for {:.1f} ms",
               rank_, h.delta ? "delta checkpoint" : "checkpoint", path, reason, h.clock,
               bytes / 1e6, seconds, pause_ms);
}

std::optional<DeltaSpec> ShardServer::NextDelta(uint64_t sequence) {
  const CheckpointOptions& c = manifest_.checkpoint;
  // What was removed since the last checkpoint began: taken whatever this one is (a full one
  // holds no removed rows; the record starts again at its moment).
  std::vector<std::vector<uint64_t>> removed(sparse_.size());
  uint64_t removed_total = 0, rows = 0;
  bool overflowed = false;
  for (uint32_t t = 0; t < sparse_.size(); ++t) {
    if (!sparse_[t]) continue;
    rows += sparse_[t]->TotalRows();
    for (uint32_t e = 0; e < sparse_[t]->engines(); ++e) {
      std::vector<uint64_t> keys = sparse_[t]->partition(e).TakeRemoved(&overflowed);
      removed_total += keys.size();
      removed[t].insert(removed[t].end(), keys.begin(), keys.end());
    }
  }
  // Rows that move between shards keep the clocks of the shard they came from: while a change
  // of the shard count is under way (rows staged, or the change's moved rows not yet dropped)
  // every checkpoint is full, and the one after its rows are dropped starts a new chain, on
  // which deltas go on.
  const int64_t change = ChangeClock();
  const bool moving = (staged_rows_ && (change < 0 || migration_.installed < change)) ||
                      (change >= 0 && migration_.dropped < change);
  if (c.full_every <= 1 || force_full_ || overflowed || chain_base_ == 0 ||
      checkpoint_sequence_ == 0 ||
      sequence - chain_base_ >= c.full_every || moving || removed_total > rows / 2 + (1 << 20)) {
    return std::nullopt;
  }
  return DeltaSpec{chain_base_, checkpoint_sequence_, chain_since_clock_, std::move(removed)};
}

Status ShardServer::SaveCheckpoint(const std::string& reason, bool final) {
  const CheckpointOptions& c = manifest_.checkpoint;
  if (c.dir.empty()) return FailedPrecondition("no checkpoint.dir in the manifest");
  // One checkpoint at a time, in sequence order: a background one is finished first.
  WaitForBackgroundCheckpoint();
  FinishDeferredApply();  // a checkpoint holds whole clocks
  const auto start = env_->Now();
  CheckpointHeader h = NextCheckpointHeader(final);
  const std::optional<DeltaSpec> delta = NextDelta(h.sequence);
  h.delta = delta.has_value();
  const uint32_t begun_clock = ShardClock();
  checkpoints_begun_ = std::max(checkpoints_begun_, h.sequence);
  const std::string path = CheckpointPath(c.dir, rank_, h.sequence);
  const std::optional<uint64_t> complete_through = CompleteThroughNow();
  uint64_t bytes = 0;
  const Status st = WriteState(path, h, delta ? &*delta : nullptr, complete_through, &bytes);
  if (!st.ok()) {
    checkpoint_owed_ = true;  // retried by MaybeCheckpoint() in a second
    force_full_ = true;       // the rows it removed are recorded nowhere else
    last_checkpoint_failure_ = env_->Now();
    return st;
  }
  const double seconds =
      std::chrono::duration<double>(env_->Now() - start).count();
  CheckpointWritten(h, path, reason, StateStamp(), push_gate_.pushed_since_checkpoint(), seconds,
                    seconds * 1e3, bytes, begun_clock);
  return Status::Ok();
}

bool ShardServer::CanCheckpointInBackground() const {
  // A tiered table's disk rows are read through RocksDB, whose threads a child process does
  // not have, and which a copy would read whole: a forked child writes the memory tier as it
  // was, and a thread of this process feeds it the disk tier's rows from a snapshot of the
  // same moment (DiskTier::FeedRows). Without a fork (the simulation, in-process drivers) those
  // shards write in the foreground.
  if (disk_ && (env_->Files() != FileSystem::Real() || reply_sink_)) return false;
  // An in-process driver on the OS's environment (a reply sink: the request fuzzer, tests'
  // in-process shards) takes every answer at once and polls for nothing. The simulation's
  // environment writes aside as an event of its schedule, and polls as the serve loop does.
  if (reply_sink_ && env_ == Env::Real()) return false;
  return manifest_.checkpoint.background;
}

Status ShardServer::BeginCheckpoint(const std::string& reason) {
  const CheckpointOptions& c = manifest_.checkpoint;
  if (c.dir.empty()) return FailedPrecondition("no checkpoint.dir in the manifest");
  if (background_) {
    // One at a time: the next is begun once this one is written, unless it holds everything.
    if (background_->stamp != StateStamp()) next_checkpoint_reason_ = reason;
    return Status::Ok();
  }
  next_checkpoint_reason_.clear();
  if (!CanCheckpointInBackground()) return SaveCheckpoint(reason);
  // A child process writes the OS's files only (a simulated shard's are in its parent), and an
  // in-process driver (a reply sink: the request fuzzer, the simulation) is no process to copy.
  const bool may_fork = env_->Files() == FileSystem::Real() && !reply_sink_;
  // (A tiered shard's copy would read its disk tier whole into memory.)
  const bool fits = !disk_ && StagedCheckpointFits();
  if (!fits) staged_spare_ = {};  // grown past copy_below: the copies' memory goes back
  if (!fits && !may_fork) return SaveCheckpoint(reason);
  FinishDeferredApply();  // a checkpoint holds whole clocks: the engines are idle from here
  const auto start = env_->Now();
  BackgroundCheckpoint bg;
  bg.header = NextCheckpointHeader(/*final=*/false);
  const std::optional<DeltaSpec> delta = NextDelta(bg.header.sequence);
  bg.header.delta = delta.has_value();
  bg.begun_clock = ShardClock();
  bg.complete_through = CompleteThroughNow();
  bg.path = CheckpointPath(c.dir, rank_, bg.header.sequence);
  bg.reason = reason;
  bg.stamp = StateStamp();
  bg.pushed_at_start = push_gate_.pushed_since_checkpoint();
  bg.start = start;
  if (fits) {
    try {
      return BeginStagedCheckpoint(bg, delta ? &*delta : nullptr);
    } catch (const std::exception& e) {
      // No memory for the copy, or no thread: a forked child writes it instead.
      staged_spare_ = {};
      spdlog::warn("shard {}: cannot copy the state for a background checkpoint ({}); {}",
                   rank_, e.what(), may_fork ? "forking" : "writing it in the foreground");
    }
    if (!may_fork) {
      force_full_ = true;  // the rows removed since the last one were taken for it
      return SaveCheckpoint(reason);
    }
  }
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) {
    force_full_ = true;
    spdlog::warn("shard {}: cannot make a pipe for a background checkpoint ({}); writing it "
                 "in the foreground",
                 rank_, std::strerror(errno));
    return SaveCheckpoint(reason);
  }
  // A tiered shard: the disk tier's rows at this moment (every engine is idle) are fed to the
  // child from a snapshot, table by table in the order its ShardState::Save asks for them.
  int rows[2] = {-1, -1};
  const rocksdb::Snapshot* snapshot = nullptr;
  std::vector<uint32_t> fed;
  if (disk_) {
    if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, rows) != 0) {
      const int err = errno;
      ::close(fds[0]);
      ::close(fds[1]);
      force_full_ = true;
      spdlog::warn("shard {}: cannot make a socket for a background checkpoint ({}); writing "
                   "it in the foreground",
                   rank_, std::strerror(err));
      return SaveCheckpoint(reason);
    }
    for (const auto& table : sparse_) {
      if (!table) continue;
      for (uint32_t e = 0; e < table->engines(); ++e) {
        const SparseTable::Partition& part = table->partition(e);
        if (part.tiered() && part.disk_rows() > 0) fed.push_back(part.family());
      }
    }
    snapshot = disk_->TakeSnapshot();
  }
  const pid_t parent = ::getpid();
  // The child is a copy of this process as it is now (its pages are shared copy-on-write):
  // the state at this moment, written while this process goes on serving. Only this thread
  // runs in it, with every engine idle and no lock held by this thread; it writes the file
  // with plain system calls and leaves with _exit().
  const pid_t pid = ::fork();
  if (pid < 0) {
    const int err = errno;
    ::close(fds[0]);
    ::close(fds[1]);
    if (disk_) {
      ::close(rows[0]);
      ::close(rows[1]);
      disk_->ReleaseSnapshot(snapshot);
    }
    force_full_ = true;  // the rows removed since the last one were taken for it
    spdlog::warn("shard {}: cannot fork a background checkpoint ({}); writing it in the "
                 "foreground",
                 rank_, std::strerror(err));
    return SaveCheckpoint(reason);
  }
  if (pid == 0) {
    ::close(fds[0]);
    if (disk_) ::close(rows[0]);
    // Dies with this shard: a checkpoint renamed into place after a new process of the shard
    // has started would be taken for one of its own.
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != parent) ::_exit(3);
    // Nothing of the shard's but the pipe (and a tiered shard's feed): its sockets stay with
    // it (a shard restarted after its death binds them at once).
    const int keep_a = std::min(fds[1], disk_ ? rows[1] : fds[1]);
    const int keep_b = std::max(fds[1], disk_ ? rows[1] : fds[1]);
    if (::close_range(3, static_cast<unsigned>(keep_a) - 1, 0) != 0 ||
        (keep_b > keep_a + 1 &&
         ::close_range(static_cast<unsigned>(keep_a) + 1, static_cast<unsigned>(keep_b) - 1,
                       0) != 0) ||
        ::close_range(static_cast<unsigned>(keep_b) + 1, ~0u, 0) != 0) {
      for (int fd = 3, n = ::getdtablesize(); fd < n; ++fd) {
        if (fd != keep_a && fd != keep_b) ::close(fd);
      }
    }
    // The disk tier's rows come from the parent's feed: this process has none of RocksDB's
    // threads, and touches the store no more.
    if (disk_) disk_->ReadRowsFrom(rows[1]);
    // Should memory run short (pages copied as the shard writes them), this copy goes first.
    if (const int adj = ::open("/proc/self/oom_score_adj", O_WRONLY | O_CLOEXEC); adj >= 0) {
      (void)!::write(adj, "1000", 4);
      ::close(adj);
    }
    FaultPoints::Get().set_kill_also(parent);
    std::string said;
    bool ok = false;
    try {
      uint64_t bytes = 0;
      const Status st =
          WriteState(bg.path, bg.header, delta ? &*delta : nullptr, bg.complete_through, &bytes);
      ok = st.ok();
      said = ok ? std::to_string(bytes) : "!" + st.ToString();
    } catch (const std::exception& e) {
      said = std::string("!") + e.what();
    } catch (...) {
      said = "!an exception";
    }
    (void)!::write(fds[1], said.data(), said.size());
    ::_exit(ok ? 0 : 1);
  }
  ::close(fds[1]);
  if (disk_) {
    ::close(rows[1]);
    try {
      bg.feed = std::make_unique<DiskTier::Feed>(*disk_, snapshot, std::move(fed), rows[0]);
    } catch (const std::exception& e) {
      // No thread to feed it: the child reads the end of the feed and fails (reaped as any),
      // and the next checkpoint is a full one (this one took the rows removed since the last).
      spdlog::warn("shard {}: cannot start feeding a background checkpoint its disk rows ({})",
                   rank_, e.what());
      ::close(rows[0]);
      disk_->ReleaseSnapshot(snapshot);
      force_full_ = true;
    }
  }
  bg.pid = pid;
  bg.result_fd = fds[0];
  bg.pause_ms =
      std::chrono::duration<double, std::milli>(env_->Now() - start).count();
  checkpoints_begun_ = std::max(checkpoints_begun_, bg.header.sequence);
  background_ = std::move(bg);
  return Status::Ok();
}

void ShardServer::PollBackgroundCheckpoint(bool wait) {
  if (!background_) return;
  if (background_->staged) {
    StagedCheckpoint& staged = *background_->staged;
    if (!wait && !staged.task->Done()) return;  // still writing
    staged.task->Wait();
    BackgroundCheckpoint bg = std::move(*background_);
    background_.reset();
    Status st = staged.written ? staged.status : Unavailable("its write never ran");
    if (!st.ok()) st = IoError("the background checkpoint " + bg.path + " failed: " + st.ToString());
    staged_spare_ = std::move(staged.blocks);
    FinishBackgroundCheckpoint(bg, st, staged.bytes);
    return;
  }
  int status = 0;
  pid_t done;
  do {
    done = ::waitpid(background_->pid, &status, wait ? 0 : WNOHANG);
  } while (done < 0 && errno == EINTR);
  if (done == 0) return;  // still writing
  if (done < 0 && !wait) {
    // Not waitable (SIGCHLD ignored): done once its end of the pipe is closed.
    pollfd p{background_->result_fd, POLLIN, 0};
    if (::poll(&p, 1, 0) == 0) return;
  }
  BackgroundCheckpoint bg = std::move(*background_);
  background_.reset();
  std::string said;
  char buf[512];
  for (ssize_t n; (n = ::read(bg.result_fd, buf, sizeof(buf))) > 0;) said.append(buf, n);
  ::close(bg.result_fd);
  Status st;
  if (done < 0) {
    // Not waitable (SIGCHLD ignored): the child's own word says how it went.
    if (said.empty() || said[0] == '!') {
      st = IoError("the background checkpoint " + bg.path + " failed: " +
                   (said.size() > 1 ? said.substr(1) : "its process left no word"));
    }
  } else if (!WIFEXITED(status) || WEXITSTATUS(status) != 0 || said.empty() || said[0] == '!') {
    st = IoError(
        "the background checkpoint " + bg.path + " failed: " +
        (said.size() > 1 && said[0] == '!'
             ? said.substr(1)
             : WIFSIGNALED(status) ? "its process died of signal " + std::to_string(WTERMSIG(status))
                                   : "its process exited with code " +
                                         std::to_string(WIFEXITED(status) ? WEXITSTATUS(status) : -1)));
  }
  FinishBackgroundCheckpoint(bg, st, st.ok() ? std::strtoull(said.c_str(), nullptr, 10) : 0);
}

void ShardServer::FinishBackgroundCheckpoint(BackgroundCheckpoint& bg, const Status& st,
                                             uint64_t bytes) {
  const double seconds = std::chrono::duration<double>(env_->Now() - bg.start).count();
  if (st.ok()) {
    CheckpointWritten(bg.header, bg.path,
                      bg.reason + (bg.staged ? ", copied, in the background" : ", in the background"),
                      bg.stamp,
                      bg.pushed_at_start, seconds, bg.pause_ms, bytes, bg.begun_clock);
  } else {
    (void)env_->Files()->Remove(bg.path + ".tmp");
    requested_checkpoint_stamp_ = ~uint64_t{0};  // a request asked again writes again
    checkpoint_owed_ = true;  // retried by MaybeCheckpoint() in a second
    force_full_ = true;       // the rows it removed are recorded nowhere else
    last_checkpoint_failure_ = env_->Now();
    spdlog::error("shard {}: {}", rank_, st.ToString());
  }
  // The requests that asked for it, answered now that it is durable (or failed).
  for (HeldReply& w : bg.waiting) AnswerHeld(w, st);
}

void ShardServer::AnswerHeld(HeldReply& held, const Status& st) {
  if (held.reply) {
    // A restarted worker's Hello: answered as when its checkpoint is written at once (a
    // failed checkpoint is logged, and retried; the worker goes on). With the membership of
    // now: the reply's version is stamped as it goes, and a worker that took entries of the
    // moment it was held under a newer version would never learn what was named meanwhile
    // (parasol_sim --reshard --seed 875: a change of the shard count named while a restarted
    // worker's Hello waited; the worker, not knowing of it, asked for a rollback across it).
    Header reply = *held.reply;
    if (held.request.membership_version < membership_.version()) {
      reply.members = membership_.Entries();
      reply.member_macs = membership_macs_.Sign(reply.members);
    }
    SendReply(held.identity, reply, {});
    return;
  }
  SendReply(held.identity,
            ReplyTo(held.request, st.ok() ? st : st.WithContext("shard " + std::to_string(rank_))),
            {});
}

bool ShardServer::ForcedCheckpointDue() const {
  // An in-process driver (reply_sink_) answers every request at once.
  if (reply_sink_ || last_forced_checkpoint_ == std::chrono::steady_clock::time_point{}) {
    return true;
  }
  return env_->Now() - last_forced_checkpoint_ >=
         std::chrono::milliseconds(manifest_.checkpoint.min_interval_ms);
}

void ShardServer::WaitForBackgroundCheckpoint() { PollBackgroundCheckpoint(/*wait=*/true); }

void ShardServer::StartRequestedCheckpoint() {
  if ((checkpoint_waiters_.empty() && next_checkpoint_reason_.empty()) || background_) return;
  // Requested or for a restarted worker: at most one per checkpoint.min_interval (RunPeriodic
  // calls again). One due after a background checkpoint that ran long begins at once.
  if (!checkpoint_waiters_.empty() && !ForcedCheckpointDue()) return;
  if (!checkpoint_waiters_.empty()) NoteForcedCheckpoint();
  std::vector<HeldReply> waiters = std::move(checkpoint_waiters_);
  checkpoint_waiters_.clear();
  const std::string reason =
      next_checkpoint_reason_.empty() ? std::string("requested") : next_checkpoint_reason_;
  const Status st = BeginCheckpoint(reason);
  if (!st.ok()) spdlog::error("shard {}: checkpoint failed: {}", rank_, st.ToString());
  if (st.ok() && background_) {
    for (HeldReply& w : waiters) background_->waiting.push_back(std::move(w));
    return;
  }
  // Written in the foreground, or failed: answered now.
  for (HeldReply& w : waiters) AnswerHeld(w, st);
}

// Never throws: Restore() tries the next file on any error.
Status ShardServer::LoadCheckpoint(const std::string& path, uint64_t onto, uint64_t base) {
  try {
    Result<std::unique_ptr<std::istream>> opened = env_->Files()->Open(path);
    if (!opened.ok()) return CheckpointNotReadable(opened.status());
    std::istream& in = **opened;
    ShardState state(manifest_, rank_, sparse_, dense_, controller_, push_gate_.record(), aggregates_,
                     engines_.size(), membership_, &migration_);
    state.set_engine_runner(
        [this](const std::function<void(uint32_t)>& fn) { engines_.RunOnAll(fn); });
    restore_progress_.bytes_done = 0;
    restore_progress_.rows_total = 0;
    restore_progress_.rows_done = 0;
    // A test's fault point: each block of the file read slowly (a load of a huge table).
    if (env_->Hit("shard.restore") == Fault::kSlow) {
      state.set_block_delay(std::chrono::milliseconds(500));
    }
    state.set_now(env_->Now());
    state.set_progress(&restore_progress_);
    state.set_expected_base(base);
    CheckpointHeader h;
    // Read once, each block applied as soon as it is checked (Restore() resets the tables
    // when a file is refused part way).
    PARASOL_RETURN_IF_ERROR(state.Load(in, path, &h, /*check_first=*/false, onto));
    gains_rows_ = GainsRows();
    SettleUninvolved();
    if (!Entered()) {
      // Serving nothing, this shard is owed no replay: every push it took is in this
      // checkpoint, or (rows it held before a change) on the shards that hold them now.
      for (uint32_t w = 0; w < membership_.max_ranks(); ++w) (void)controller_.AbandonReplay(w);
    }
    checkpoint_sequence_ = h.sequence;
    restored_sequence_ = h.sequence;
    // Of a chain, the newest file's (the state is as that one's process took it).
    restored_complete_ = state.complete_through().value_or(h.sequence);
    restored_writer_ = state.complete_writer();
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

Status ShardServer::LoadChain(const std::string& path) {
  // A delta is its full checkpoint and every delta up to it, loaded in order.
  const CheckpointOptions& c = manifest_.checkpoint;
  FileSystem* fs = env_->Files();
  PARASOL_ASSIGN_OR_RETURN(CheckpointHeader header, ReadCheckpointHeader(path, fs));
  PARASOL_ASSIGN_OR_RETURN(std::vector<std::string> chain,
                           CheckpointChain(c.dir, rank_, header.sequence, fs));
  uint64_t onto = 0;
  Result<CheckpointHeader> first = ReadCheckpointHeader(chain.front(), fs);
  const uint64_t base = first.ok() ? first->sequence : 0;
  for (const std::string& file : chain) {
    PARASOL_RETURN_IF_ERROR(LoadCheckpoint(file, onto, base));
    Result<CheckpointHeader> loaded = ReadCheckpointHeader(file, fs);
    onto = loaded.ok() ? loaded->sequence : 0;
  }
  if (chain.size() > 1) {
    spdlog::info("shard {}: {} is a delta: loaded {} files from {}", rank_, path, chain.size(),
                 chain.front());
  }
  return Status::Ok();
}

Result<std::pair<std::string, CheckpointHeader>> ShardServer::CheckpointAtOrBefore(
    int64_t clock, bool exact) const {
  const CheckpointOptions& c = manifest_.checkpoint;
  if (c.dir.empty()) return NotFound("shard " + std::to_string(rank_) + " takes no checkpoints");
  FileSystem* fs = env_->Files();
  for (const std::string& path : ListCheckpoints(c.dir, rank_, fs)) {  // newest first
    Result<uint64_t> sequence = CheckpointSequenceOfName(path);
    if (!sequence.ok() || (rollback_mark_ && rollback_mark_->Undone(*sequence))) continue;
    Result<CheckpointHeader> h = ReadCheckpointHeader(path, fs);
    if (!h.ok() || h->clock < 0 || h->clock > clock || (exact && h->clock != clock)) continue;
    // Only one whose chain is whole (a delta's full checkpoint may have been pruned).
    if (!CheckpointChain(c.dir, rank_, h->sequence, fs).ok()) continue;
    return std::make_pair(path, *h);
  }
  return NotFound("shard " + std::to_string(rank_) + " holds no checkpoint " +
                  (exact ? "at clock " : "at or before clock ") + std::to_string(clock));
}

std::string ShardServer::RollbackBarrier() const {
  if (!membership_.server_changes().empty()) {
    return "a change of the shard count (the rows moved between shards)";
  }
  return rank_ == 0 ? LeaverBarrier() : std::string();
}

std::chrono::milliseconds ShardServer::WorkerPatience() const {
  return std::chrono::milliseconds(manifest_.cluster.request_timeout_ms) *
         (manifest_.cluster.request_retries + 1);
}

void ShardServer::OweRollback() {
  rollback_owed_ = true;
  rollback_owed_since_ = env_->Now();
}

std::string ShardServer::LeaverBarrier() const {
  for (uint32_t w = 0; w < membership_.max_ranks(); ++w) {
    if (membership_.leave(w) >= 0 && controller_.IsDone(w)) {
      return "worker " + std::to_string(w) + "'s leave at clock " +
             std::to_string(membership_.leave(w)) + " (it has finished, and may have exited)";
    }
  }
  return "";
}

std::string ShardServer::BarRollback() {
  std::string barrier = RollbackBarrier();
  if (barrier.empty()) return barrier;
  ++counters_.rollbacks_barred;
  // The shard that decides a rollback (shard 0; every shard across a change of the shard
  // count) bars it for the job; another one only for what it knows.
  if (rank_ == 0 || !membership_.server_changes().empty()) ++counters_.rollbacks_refused;
  return barrier;
}

Status ShardServer::HandleRollback(const Header& req, Header* reply) {
  const std::string who = "worker " + std::to_string(req.worker_id);
  reply->shard_rank = rank_;
  reply->shard_count = num_shards_;
  if (!manifest_.RollsBack()) {
    return FailedPrecondition("Rollback: this job does not roll back "
                              "(training.on_overlapping_failure)");
  }
  if (RollbackIsQuestion(req)) {
    // The question: where this shard could go back to, and where it is. Asked by a worker of
    // the job about to roll back (`done`), it also keeps that checkpoint: no periodic
    // checkpoint is taken and none is pruned until the rollback is made.
    // (Not across a change of the shard count, which every shard refuses to go back past. A
    // leaver's end is shard 0's to judge (RollbackBarrier()): another shard that knows of it
    // keeps the checkpoint all the same, as shard 0 may not know yet and make the rollback.
    // Shard 0 keeps nothing for a rollback it would refuse: the worker's rollback then ends
    // in a refusal, and periodic checkpoints go on meanwhile.)
    if (RollbackAboutToMake(req) && controller_.InJob(req.worker_id) &&
        RollbackBarrier().empty()) {
      if (!rollback_pending_) {
        spdlog::warn("shard {}: {} is about to roll the job back; no checkpoint is taken or "
                     "pruned until it has", rank_, who);
      }
      rollback_pending_ = true;
      rollback_pending_since_ = env_->Now();
    }
    // Every shard can go back to the start of the job (clock 0, the tables' initial values).
    Result<std::pair<std::string, CheckpointHeader>> at = CheckpointAtOrBefore(req.clock, false);
    SetRollbackRestorableClock(*reply, at.ok() ? at->second.clock : 0);
    // (Counted: a worker that hears so goes on without the rollback, ShardSession::CheckOwedRollback.)
    // (Asked by a peer outside the job, nothing is counted.)
    SetRollbackBarred(*reply, controller_.InJob(req.worker_id) ? !BarRollback().empty()
                                                                : !RollbackBarrier().empty());
    return Status::Ok();
  }
  // Shard 0 decides: the others follow its decision, which a worker completes. A follower
  // takes a rank the membership may hold even before it has heard of its join (a rank that
  // joined since this shard last learned the membership, or a shard that serves no keys yet
  // and hears of joins only once it does: parasol_sim --elastic --reshard --seed 393).
  const bool decides = rank_ == 0 || !membership_.server_changes().empty();
  if (decides ? !controller_.InJob(req.worker_id)
              : req.worker_id >= membership_.max_ranks()) {
    return FailedPrecondition("Rollback: " + who + " is not a worker of this job");
  }
  if (req.rollback_gen < rollback_gen_ ||
      (req.rollback_gen == rollback_gen_ && req.clock != rollback_clock_)) {
    return Aborted("Rollback to clock " + std::to_string(req.clock) + " as rollback " +
                   std::to_string(req.rollback_gen) + ": this shard is at rollback " +
                   std::to_string(rollback_gen_) + " (to clock " +
                   std::to_string(rollback_clock_) + ")");
  }
  if (req.rollback_gen == rollback_gen_) return Status::Ok();  // done already (a resend)
  if (req.rollback_gen != rollback_gen_ + 1) {
    return FailedPrecondition("Rollback: rollback " + std::to_string(req.rollback_gen) +
                              " is not the next one (this shard is at rollback " +
                              std::to_string(rollback_gen_) + ")");
  }
  // (A leaver exits only once shard 0 has its done, so a leaver done only elsewhere is still
  // there to redo its steps.) First: a question asked while the barrier stood set nothing
  // pending here.
  if (const std::string barrier = decides ? BarRollback() : std::string(); !barrier.empty()) {
    return FailedPrecondition(kRollbackCannotCross + barrier + "; the updates lost stay lost "
                              "(reported), and the job goes on");
  }
  // Shard 0 decides a rollback: only once a loss was found here or a worker asked where to go
  // back to (the others follow shard 0's decision, which a worker completes).
  if (rank_ == 0 && !rollback_owed_ && !rollback_pending_) {
    // (Unavailable: this process may have restarted since the question; the worker asks again.)
    return Unavailable("Rollback: " + who + " asks for a rollback, but no loss was found here "
                       "and no worker asked where to go back to");
  }
  // What is being written or applied finishes first (it may prune, or be the newest file).
  FinishDeferredApply();
  if (background_) WaitForBackgroundCheckpoint();
  Result<std::pair<std::string, CheckpointHeader>> at =
      CheckpointAtOrBefore(req.clock, /*exact=*/true);
  if (!at.ok() && req.clock == 0) {
    // The start: no file, the tables as a new process makes them.
    CheckpointHeader start;
    start.clock = 0;
    start.sequence = 0;
    at = std::make_pair(std::string(), start);
  }
  if (!at.ok()) return at.status();
  spdlog::warn("shard {}: {} asks the job to roll back to clock {} (rollback {})", rank_,
               who, req.clock, req.rollback_gen);
  return RollBackTo(at->first, at->second, req.rollback_gen);
}

namespace {

// Files of an undone history are kept aside (renamed, never loaded) until the next rollback:
// a rollback asked for by mistake, or by a stolen worker key, destroys nothing.
// (The renames need not be durable: the rollback's mark, written first, says which files they
// are, and a restart sets them aside again.)
void SetAsideUndone(FileSystem* fs, const std::string& dir, uint32_t shard,
                    const RollbackMark& mark) {
  for (const std::string& file : ListCheckpoints(dir, shard, fs)) {
    Result<uint64_t> sequence = CheckpointSequenceOfName(file);
    if (sequence.ok() && mark.Undone(*sequence)) {
      (void)fs->Rename(file, file + ".undone-" + std::to_string(mark.generation));
    }
  }
}

// Removes the files an earlier rollback set aside.
void RemoveSetAside(FileSystem* fs, const std::string& dir, uint32_t shard) {
  const std::string folder = dir + "/shard-" + std::to_string(shard);
  for (const std::string& name : fs->List(folder)) {
    if (name.find(".bin.undone-") != std::string::npos) (void)fs->Remove(folder + "/" + name);
  }
}

}  // namespace

Status ShardServer::RollBackTo(const std::string& path, const CheckpointHeader& h,
                               uint64_t generation) {
  const CheckpointOptions& c = manifest_.checkpoint;
  // Recorded first: a restart from here on loads nothing of the history being undone.
  RollbackMark mark;
  mark.generation = generation;
  mark.clock = h.clock;
  mark.sequence = h.sequence;
  mark.first_new = std::max(checkpoints_begun_, checkpoint_sequence_) + 1;
  RemoveSetAside(env_->Files(), c.dir, rank_);
  PARASOL_RETURN_IF_ERROR(WriteRollbackMark(c.dir, rank_, mark, env_->Files()));
  rollback_mark_ = mark;
  checkpoints_begun_ = std::max(checkpoints_begun_, mark.first_new - 1);
  SetAsideUndone(env_->Files(), c.dir, rank_, mark);
  // Whatever waits is answered as of the undone history (the replies say the new generation).
  rollback_gen_ = generation;
  rollback_clock_ = h.clock;
  const Status undone = Aborted("the job rolls back to clock " + std::to_string(h.clock) +
                                " (rollback " + std::to_string(generation) + ")");
  job_failure_ = undone;
  ReleaseHeldPulls();
  ReleaseBarriers();
  for (HeldReply& w : checkpoint_waiters_) {
    SendReply(w.identity, ReplyTo(w.request, undone), {});
  }
  checkpoint_waiters_.clear();
  // The state of a process started afresh, then the checkpoint.
  push_gate_ = PushGate(std::max(manifest_.cluster.workers, manifest_.cluster.max_workers));
  aggregates_.clear();
  controller_ = ConsistencyController(manifest_.training, manifest_.cluster.workers, env_->Now(),
                                      manifest_.cluster.max_workers);
  Status st;
  try {
    st = ResetTables();
  } catch (const std::exception& e) {
    st = ResourceExhausted(std::string("cannot allocate the tables again: ") + e.what());
  }
  if (st.ok() && !path.empty()) st = LoadChain(path);
  if (!st.ok()) {
    // The tables are partly loaded: this process cannot serve the job any more (a restart
    // loads the checkpoint the mark names).
    spdlog::critical("shard {}: the rollback could not load {}: {}", rank_,
                     path.empty() ? std::string("the start") : path, st.ToString());
    job_failure_ = st.WithContext("shard " + std::to_string(rank_) + ": rolling back");
    return job_failure_;
  }
  job_failure_ = Status::Ok();
  restored_from_ = path;
  // The ranks that joined keep the clocks they were named (a checkpoint's load took in the
  // joins it knew and those this shard knows now; the start, none): a join named past the
  // clock gone back to is still ahead, and the joiner waits for it as when it was named.
  for (uint32_t r = 0; r < membership_.max_ranks(); ++r) {
    if (membership_.Joined(r) && !controller_.InJob(r)) {
      controller_.Join(r, membership_.join(r), env_->Now());
    }
  }
  SettleRollback(h.clock, /*restarted=*/false);
  if (path.empty()) {
    // None taken since the start: the workers' logs are trimmed by none yet (a count of the
    // undone history would let them drop what a restart from no checkpoint needs replayed).
    checkpoint_clock_ = -1;
    checkpoint_sequence_ = 0;
    restored_sequence_ = 0;
    restored_complete_ = 0;
    restored_writer_ = 0;
  }
  shard_clock_high_ = static_cast<uint32_t>(std::clamp<int64_t>(h.clock, 0, UINT32_MAX));
  rollback_owed_ = false;
  rollback_pending_ = false;
  all_done_checkpointed_ = false;
  joined_since_restore_.clear();  // every worker redoes its steps from the checkpoint
  epoch_ = env_->Random64() | 1;
  force_full_ = true;  // the deltas after it are set aside
  ++counters_.rollbacks;
  spdlog::warn("shard {}: rolled back to {} (clock {}), rollback {}", rank_,
               path.empty() ? std::string("the start") : path, h.clock, generation);
  return Status::Ok();
}

void ShardServer::SettleRollback(int64_t clock, bool restarted) {
  step_waiting_clock_ = -1;  // the clocks from `clock` on come again
  // Rows copied here ahead of a change of the shard count (a job rolls back only before any
  // change is named) are of the history undone. The tables were loaded afresh from a checkpoint,
  // which keeps no such rows (KeepsKey()), so none is held now; an install of rows read before
  // the rollback is refused (CheckInstallGeneration()), and the scale tool, seeing the new
  // generation in its replies, copies everything again (parasol_sim --seed 3047 --reshard).
  staged_rows_ = false;
  // The pushes of the clocks from `clock` on are redone: their sums and their names go.
  aggregates_.clear();
  push_gate_ = PushGate(std::max(manifest_.cluster.workers, manifest_.cluster.max_workers));
  if (restarted) {
    // This process restarted from the rollback's checkpoint: what the workers did since the
    // rollback is in their logs, and comes as their replays.
    controller_.RestoreAt(clock, env_->Now());
  } else {
    controller_.RollBack(clock, env_->Now());
  }
  checkpoint_clock_ = clock;
}

Status ShardServer::Restore() {
  restore_attempted_ = true;
  const CheckpointOptions& c = manifest_.checkpoint;
  if (c.dir.empty()) return Status::Ok();
  FileSystem* fs = env_->Files();
  const std::vector<std::string> files = ListCheckpoints(c.dir, rank_, fs);
  // New checkpoints are numbered past every file in the folder (ones not loaded, or refused,
  // included): a delta never meets a file of another history under the number it names.
  for (const std::string& path : files) {
    if (Result<CheckpointHeader> h = ReadCheckpointHeader(path, fs); h.ok()) {
      checkpoints_begun_ = std::max(checkpoints_begun_, h->sequence);
    }
    // A name beyond the largest sequence would make every later number wrap: refused.
    Result<uint64_t> named = CheckpointSequenceOfName(path);
    if (!named.ok()) return named.status();
    checkpoints_begun_ = std::max(checkpoints_begun_, *named);
  }
  // A rollback (Op.Rollback) left its mark: the files of the history it undid are never
  // loaded, and a restart from its checkpoint settles as the rollback did.
  Result<std::optional<RollbackMark>> marked = ReadRollbackMark(c.dir, rank_, fs);
  if (!marked.ok()) return marked.status().WithContext("shard " + std::to_string(rank_));
  rollback_mark_ = *marked;
  std::vector<std::string> loadable;
  for (const std::string& path : files) {
    Result<uint64_t> sequence = CheckpointSequenceOfName(path);
    if (rollback_mark_ && sequence.ok() && rollback_mark_->Undone(*sequence)) {
      spdlog::warn("shard {}: {} belongs to the history rollback {} undid; set aside", rank_,
                   path, rollback_mark_->generation);
      continue;
    }
    loadable.push_back(path);
  }
  if (rollback_mark_) {
    rollback_gen_ = rollback_mark_->generation;
    rollback_clock_ = rollback_mark_->clock;
    // Numbers of the undone history are never used again.
    checkpoints_begun_ = std::max(checkpoints_begun_, rollback_mark_->first_new - 1);
    SetAsideUndone(fs, c.dir, rank_, *rollback_mark_);
  }
  if (!c.restore) return Status::Ok();
  for (const std::string& path : loadable) {
    Status st;
    Result<uint64_t> sequence = CheckpointSequenceOfName(path);
    st = LoadChain(path);
    // Stopped while it loaded: nothing more is tried (the tables are partly loaded, and the
    // shard stops without writing).
    if (!st.ok() && restore_progress_.cancel.load()) return st;
    if (st.ok()) {
      spdlog::info("shard {}: restored {} (worker clocks from it): {} rows, checked in {:.2f} s, "
                   "applied in {:.2f} s",
                   rank_, path, restore_progress_.rows_done.load(),
                   restore_progress_.seconds_checking, restore_progress_.seconds_applying);
      restored_from_ = path;
      restarted_process_ = true;
      if (rollback_mark_ && sequence.ok() && *sequence == rollback_mark_->sequence) {
        SettleRollback(rollback_mark_->clock, /*restarted=*/true);
      }
      return TakeNamedClocks();
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
  if (!loadable.empty()) {
    return FailedPrecondition("shard " + std::to_string(rank_) + ": none of the " +
                              std::to_string(loadable.size()) + " checkpoints in " + c.dir +
                              " could be loaded");
  }
  // No checkpoint yet. If this shard ran before (its mark is there), it died before its first
  // checkpoint: every worker's clock counts as restored at 0, so that only its replay (which
  // holds everything it pushed) moves it, not a tick that was on its way to the old process.
  const std::string mark = c.dir + "/shard-" + std::to_string(rank_) + "/started";
  if (fs->Exists(mark)) {
    for (uint32_t w = 0; w < membership_.max_ranks(); ++w) controller_.SetClock(w, 0);
    restarted_process_ = true;
    spdlog::warn("shard {}: restarted before its first checkpoint; the workers replay everything",
                 rank_);
    return TakeNamedClocks();
  }
  // Durable before the shard answers anyone: after a crash of its host the shard must still
  // know it ran (a mark lost with the page cache would make it a first start).
  const Status marked_start = WriteFileDurably(fs, mark, "started\n");
  if (!marked_start.ok()) {
    return marked_start.WithContext("shard " + std::to_string(rank_) + ": its start mark");
  }
  return Status::Ok();
}

Status ShardServer::TakeNamedClocks() {
  Result<std::optional<std::vector<MemberEntry>>> named =
      ReadNamedClocks(manifest_.checkpoint.dir, rank_, fingerprint_, env_->Files());
  if (!named.ok()) return named.status().WithContext("shard " + std::to_string(rank_));
  if (!named->has_value()) return Status::Ok();
  // Named by an earlier process of this shard after the checkpoint restored (or with none):
  // taken in as a worker's copy would bring them, every joiner's clock a lower bound.
  const uint64_t version = membership_.version();
  if (Status st = TakeMembership(**named); !st.ok()) {
    return st.WithContext("shard " + std::to_string(rank_) + ": the named clocks in " +
                          manifest_.checkpoint.dir + " contradict the checkpoint restored");
  }
  if (membership_.version() != version) {
    spdlog::info("shard {}: took in clocks named after the checkpoint it restored ({} entries)",
                 rank_, (*named)->size());
  }
  return Status::Ok();
}

void ShardServer::MaybeCheckpoint() {
  const CheckpointOptions& c = manifest_.checkpoint;
  // A rollback asked about and not made within a worker's patience for one request (its
  // maker died): the job goes on as before.
  if (rollback_pending_ && env_->Now() - rollback_pending_since_ > WorkerPatience()) {
    rollback_pending_ = false;
    spdlog::warn("shard {}: the rollback asked about was not made; checkpoints go on", rank_);
  }
  // A rollback is owed or asked about: the state is about to be replaced, and its checkpoint
  // must stay.
  if (c.dir.empty() || rollback_owed_ || rollback_pending_) return;
  bool due = false;
  std::string reason;
  if (c.every_steps > 0 && controller_.live_workers() > 0) {
    const int64_t clock = controller_.MinClock();
    // At a clock boundary: every push of earlier clocks is applied (under BSP, too).
    // clock - checkpoint_clock_ cannot overflow: clock >= 0 and checkpoint_clock_ >= -1.
    // Seen at the tick that completes the clock (DispatchOp), not only at the next poll, which
    // may come clocks later: a multiple is passed over only while the checkpoint before it is
    // still being written, and counted once the clock has moved on without one begun at it
    // (the shards' checkpoints then agree at fewer clocks).
    if (step_waiting_clock_ >= 0 && clock != step_waiting_clock_) {
      ++counters_.checkpoint_steps_skipped;
      step_waiting_clock_ = -1;
    }
    if (clock < std::numeric_limits<int64_t>::max() &&
        clock - checkpoint_clock_ >= int64_t(c.every_steps) &&
        clock % int64_t(c.every_steps) == 0 && aggregates_.empty()) {
      // Not while the one being written is this clock's (begun, not yet durable).
      if (background_ && background_->header.clock != clock) step_waiting_clock_ = clock;
      due = true;
      reason = "every " + std::to_string(c.every_steps) + " steps";
    }
  }
  if (c.every_seconds > 0 &&
      env_->Now() - last_checkpoint_ > std::chrono::seconds(c.every_seconds)) {
    if (StateStamp() == saved_stamp_) {
      last_checkpoint_ = env_->Now();  // nothing new to save
    } else {
      due = true;
      reason = "every " + std::to_string(c.every_seconds) + " s";
    }
  }
  // A checkpoint that had to be written (a worker restarted, every worker left, the push log
  // bound) and failed is tried again every second.
  if (checkpoint_owed_ &&
      env_->Now() - last_checkpoint_failure_ > std::chrono::seconds(1)) {
    due = true;
    reason = "retrying the one that failed";
  }
  // Bounds each worker's push log (checkpoint.max_log_bytes): what it pushed here since the
  // last checkpoint is what it would have to replay.
  // Such a checkpoint is forced as a requested one is: at most one per
  // checkpoint.min_interval, unless the worker's share is nearly used up (room for one more
  // push left), where the bound itself would break: then at once.
  const uint64_t log_share = c.max_log_bytes / (2 * uint64_t{num_shards_});
  const uint64_t share = c.max_log_bytes / num_shards_;
  const uint64_t full = share - std::min(share / 2, manifest_.server.max_request_bytes);
  bool forced = false;
  const std::vector<uint64_t>& pushed_since = push_gate_.pushed_since_checkpoint();
  for (uint32_t w = 0; w < pushed_since.size() && !due && !checkpoint_owed_; ++w) {
    const uint64_t pushed = pushed_since[w];
    if (pushed >= log_share && (pushed >= full || ForcedCheckpointDue())) {
      due = true;
      forced = true;
      reason = "worker " + std::to_string(w) + " pushed " + std::to_string(pushed) +
               " bytes since the last one (checkpoint.max_log_bytes)";
    }
  }
  if (!due || background_) return;
  // One begun at the clock a multiple waited at: it is not passed over.
  if (step_waiting_clock_ == controller_.MinClock()) step_waiting_clock_ = -1;
  if (forced) NoteForcedCheckpoint();
  if (Status st = BeginCheckpoint(reason); !st.ok()) {
    spdlog::error("shard {}: checkpoint failed: {}", rank_, st.ToString());
    last_checkpoint_ = env_->Now();  // retry at the next period, not now
  }
}

}  // namespace parasol
