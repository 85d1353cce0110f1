#include "worker/shard_session.hpp"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <limits>
#include <optional>

#include "common/fault_points.hpp"
#include "common/protocol.hpp"
#include "worker/departure.hpp"
#include "worker/job_rollback.hpp"
#include "worker/replay_sender.hpp"
#include "worker/reply_assembly.hpp"
#include "worker/reply_outcome.hpp"
#include "worker/request_frames.hpp"
#include "worker/resume_point.hpp"
#include "worker/shard_greeting.hpp"

namespace parasol {

using Clock = std::chrono::steady_clock;


ShardSession::ShardSession(const Manifest& manifest, uint32_t worker_id, Env* env)
    : manifest_(manifest),
      fingerprint_(manifest_.Fingerprint()),
      worker_id_(worker_id),
      env_(env ? env : Env::Real()),
      num_shards_(static_cast<uint32_t>(manifest_.cluster.servers.size())),
      incarnation_(env_->Random64()),
      tracker_(num_shards_),
      relay_(JobMembership(manifest), num_shards_, worker_id),
      restoring_(num_shards_, std::chrono::milliseconds(manifest_.cluster.request_timeout_ms),
                 std::chrono::milliseconds(manifest_.cluster.restore_timeout_ms)) {
  recovery_ = ShardRecovery(num_shards_, manifest_.checkpoint.max_log_bytes,
                            !manifest_.checkpoint.dir.empty() && JobRank(), worker_id_);
  push_index_.assign(num_shards_, 0);
  last_push_count_.assign(num_shards_, 0);
}

ShardSession::~ShardSession() {
  // Frames may still borrow memory of callers that never waited; the connections drop them
  // while the trackers of those frames (in tracker_'s tickets) still live.
  links_.reset();
}

Result<std::unique_ptr<ShardSession>> ShardSession::Connect(const Manifest& manifest,
                                                    uint32_t worker_id,
                                                    const std::string& key_path,
                                                    std::function<Status()> wait_interrupt,
                                                    bool join, Env* env, uint32_t rounds) {
  std::unique_ptr<ShardSession> c(new ShardSession(manifest, worker_id, env));
  c->wait_interrupt_ = wait_interrupt;
  if (join && !c->JobRank()) {
    return InvalidArgument("worker " + std::to_string(worker_id) + " cannot join: cluster." +
                           "max_workers is " + std::to_string(c->relay_.membership().max_ranks()));
  }
  c->joining_ = join;
  if (manifest.security.curve) PARASOL_RETURN_IF_ERROR(c->LoadKeys(key_path));
  PARASOL_ASSIGN_OR_RETURN(
      c->links_, c->env_->LinkShards(c->manifest_, worker_id,
                                     manifest.security.curve ? &c->curve_keys_ : nullptr,
                                     c->server_public_keys_));
  for (uint32_t s = 0; s < c->num_shards_; ++s) PARASOL_RETURN_IF_ERROR(c->links_->Open(s));
  // A joining worker too works in the generation the job is at.
  if (c->JobRank() && manifest.RollsBack()) {
    PARASOL_RETURN_IF_ERROR(JobRollback(*c).Follow());
  }
  // A joiner rolls back like any rank; what no rollback crosses (a change of the shard count,
  // a leaver that has finished: ShardServer::RollbackBarrier()) the shards refuse, and the loss
  // is reported.
  const bool rolls_back = c->JobRank() && manifest.RollsBack();
  if (Status greeted = c->Handshake(); !greeted.ok()) {
    // A rollback made while this worker greeted the shards: it connects again, in it.
    if (!c->rolled_back_.ok() && rounds + 1 < kMaxRollbackRounds) {
      c.reset();
      return Connect(manifest, worker_id, key_path, wait_interrupt, join, env, rounds + 1);
    }
    return greeted;
  }
  // Two failures overlapped and updates are lost: a shard's Hello said so, or this worker died
  // between its ticks (lost_step()).
  if (c->JobRank() && (c->rollback_needed_ || !c->lost_step_.empty())) {
    std::string why = c->lost_step_;
    if (why.empty()) {
      why = "shard";
      for (size_t i = 0; i < c->rollback_needed_by_.size(); ++i) {
        why += (i ? ", " : " ") + std::to_string(c->rollback_needed_by_[i]);
      }
      why += " lost updates of worker " + std::to_string(worker_id) + " that no log holds (it "
             "and a shard died together)";
    }
    using O = TrainingOptions::OnOverlappingFailure;
    if (manifest.training.on_overlapping_failure == O::kFail) {
      return FailedPrecondition(why + kOverlapFailNote);
    }
    // A step to redo from before a change of the shard count that a shard has passed: the
    // rows it reads have moved (parasol_sim --reshard --seed 512), and no rollback crosses
    // the change.
    if (!c->lost_step_.empty()) {
      for (const Membership::ServerChange& change : c->relay_.membership().server_changes()) {
        if (c->clock_ < change.clock && change.clock <= c->furthest_known_clock_) {
          return FailedPrecondition(
              why + "; its redo at clock " + std::to_string(c->clock_) + " would read rows " +
              "that moved between shards at clock " + std::to_string(change.clock) +
              " (a change of the shard count, which no rollback crosses): the job cannot go on "
              "from this loss");
        }
      }
    }
    if (rolls_back && !c->ShardCountChanged()) {
      // Rolled back, this process is a new one to the shards: the next connects afresh and
      // continues where they all are. Bounded: each round is a rollback or follows one.
      if (rounds + 1 >= kMaxRollbackRounds) {
        return FailedPrecondition(why + "; the job rolled back " + std::to_string(rounds) +
                                  " times while this worker connected, and would again");
      }
      const Status made = JobRollback(*c).Make(why);
      if (made.ok()) {
        c.reset();
        return Connect(manifest, worker_id, key_path, wait_interrupt, join, env, rounds + 1);
      }
      // A change no rollback crosses, named or reached since the handshake (shard 0 refused
      // it, or the shards' answers told of a change of the shard count): the loss stays
      // reported and this worker goes on, as when it knew of the change at its greeting
      // (parasol_sim --reshard --seed 2168).
      if (!c->ShardCountChanged() && !RefusedAcrossChange(made)) return made;
      // For good: what bars a rollback stays (a leaver's end, a change of the shard count).
      // A shard that has not heard of it yet still says a rollback is owed; this client goes
      // on all the same (parasol_sim --elastic --seed 290: every worker connected again and
      // again until it gave up).
      c->rollback_barred_ = true;
      spdlog::error("{}", made.message());
    }
  }
  c->connected_ = true;
  return c;
}

bool ShardSession::ShardCountChanged() const {
  return !relay_.membership().server_changes().empty();
}

bool ShardSession::RefusedAcrossChange(const Status& st) {
  return st.code() == StatusCode::kFailedPrecondition &&
         st.message().find(kRollbackCannotCross) != std::string::npos;
}

Status ShardSession::LoadKeys(const std::string& key_path) {
  if (!CurveAvailable()) return FailedPrecondition("this libzmq has no CURVE support");
  std::string path = key_path.empty() ? manifest_.security.client_key : key_path;
  const std::vector<std::string>& worker_keys = manifest_.security.worker_keys;
  if (key_path.empty() && worker_id_ < worker_keys.size()) path = worker_keys[worker_id_];
  PARASOL_ASSIGN_OR_RETURN(curve_keys_, ReadCurveKeyPair(path));
  for (const std::string& server : manifest_.security.server_keys) {
    PARASOL_ASSIGN_OR_RETURN(std::string pub, ReadCurvePublicKey(server + ".pub"));
    server_public_keys_.push_back(pub);
  }
  return Status::Ok();
}

int ShardSession::Mechanism(uint32_t shard) const { return links_->Mechanism(shard); }

uint32_t ShardSession::ShardsFrom(int64_t clock) const {
  uint32_t n = relay_.membership().PlacementAt(clock).count();
  for (const auto& change : relay_.membership().server_changes()) {
    if (change.clock > clock) n = std::max(n, change.count);
  }
  return n;
}

std::vector<uint32_t> ShardSession::FirstShards(uint32_t n) const {
  std::vector<uint32_t> out(std::min<size_t>(n, num_shards_));
  for (uint32_t s = 0; s < out.size(); ++s) out[s] = s;
  return out;
}

Status ShardSession::Handshake() {
  PARASOL_ASSIGN_OR_RETURN(const std::vector<Header> hellos, ShardGreeting(*this).Greet());
  // A worker of the job continues where the shards know it to be: a restarted worker redoes
  // the step it died in (its pushes that arrived are answered as duplicates) and goes on.
  if (relay_.membership().Joined(worker_id_)) {
    const bool bsp = manifest_.training.consistency == TrainingOptions::Consistency::kBsp;
    // A joiner is known at its join clock (or where a shard starts serving) until it ticks: one
    // known further on somewhere is a restarted joiner, whose redone step is checked as any
    // worker's (parasol_sim --elastic --seed 79: it died with a shard, and redid its first
    // step from other values unreported).
    bool rejoin = false;
    for (const Header& h : hellos) {
      rejoin = rejoin || HelloKnownClock(h) > std::max(relay_.membership().join(worker_id_),
                                                       relay_.membership().ServingFrom(
                                                           h.shard_rank));
    }
    const ResumePoint r = ResumeFrom(hellos, worker_id_, bsp && (!joining_ || rejoin));
    if (r.known) last_barrier_seen_ = r.last_barrier;
    furthest_known_clock_ = r.known ? r.furthest_clock : -1;
    barrier_passed_ = std::max(barrier_passed_, last_barrier_seen_);
    if (!r.lost_step.empty()) {
      lost_step_ = r.lost_step;
      spdlog::error("{}", lost_step_);
    }
    const int64_t clock = r.clock;
    const bool done = r.done;
    if (clock > 0 || (clock == 0 && done) || joining_) {
      clock_ = clock;
      resumed_clock_ = clock;
      resumed_done_ = done;
      if (!joining_ || clock > relay_.membership().join(worker_id_)) {
        spdlog::warn("worker {}: the shards know this worker at clock {}{}: continuing from there",
                     worker_id_, clock, done ? " (it had finished)" : "");
      }
    }
  }
  joining_ = false;
  return Status::Ok();
}

wire::DType ShardSession::WireDType() const { return WireDTypeOf(manifest_.wire); }

Header ShardSession::NewRequest(Op op, uint32_t table) {
  Header h;
  h.op = op;
  h.request_id = next_request_id_++;
  h.worker_id = worker_id_;
  h.incarnation = incarnation_;
  h.table_id = table;
  h.clock = clock_ + request_clock_offset_;
  h.manifest_hash = fingerprint_;
  // A tick says where this worker really is (a replay's intermediate clocks do not).
  h.caught_up = op == Op::Clock;
  h.membership_version = relay_.membership().version();
  h.join = joining_ && (op == Op::Hello || op == Op::Membership);
  h.rollback_gen = rollback_gen_;
  return h;
}

void ShardSession::Send(Ticket ticket, uint32_t shard, Header header,
                    std::vector<zmq::message_t>&& payload) {
  auto timeout = std::chrono::milliseconds(manifest_.cluster.request_timeout_ms);
  const bool may_be_held = header.op == Op::PullSparse || header.op == Op::PullDense ||
                           header.op == Op::Barrier;
  if (may_be_held && JobRank()) {
    // A shard holds such a request until the other workers catch up, or until it gives up on
    // a silent one after training.worker_timeout.
    timeout += std::chrono::milliseconds(manifest_.training.worker_timeout_ms);
  }
  // A shard that knows fewer membership clocks learns them from the ticks (and Hellos).
  // Pulls too: a shard that gains rows at a change of the shard count must know of it before
  // it answers a pull of the change's clock.
  // And a tool's Migrate: a shard that serves nothing is ticked by no worker.
  const bool carries = JobRank() ? (header.op == Op::Clock || header.op == Op::Hello ||
                                    header.op == Op::PullSparse || header.op == Op::PullDense)
                                 : header.op == Op::Migrate;
  relay_.Stamp(shard, carries, JobRank(), header);
  TrackedRequest& r = tracker_.Track(ticket, header, shard, timeout,
                                     1 + manifest_.cluster.request_retries, env_->Now());
  const uint64_t id = header.request_id;
  const bool gather = batch_.gathering() && !header.replay &&
                      (header.op == Op::PullSparse || header.op == Op::PullDense ||
                       header.op == Op::PushSparse || header.op == Op::PushDense ||
                       header.op == Op::Clock);
  // The frames: into the next gathered entry of the shard (its buffers reused), or into the
  // send buffer.
  StepBatch::Entry* g = gather ? &batch_.Add(shard) : nullptr;
  std::vector<zmq::message_t>& frames = g ? g->frames : send_frames_;
  frames.clear();
  frames.push_back(EncodeHeader(header));
  for (auto& m : payload) frames.push_back(std::move(m));
  for (auto& f : frames) r.kept.push_back(CopyMessage(f));
  if (g) {
    g->request_id = id;
    g->op = header.op;
    g->done = header.done;
    g->clock = header.clock;
    g->payload_bytes = 0;
    for (size_t f = 1; f < frames.size(); ++f) g->payload_bytes += frames[f].size();
    return;
  }
  // drop: the message is lost on its way (the request is resent when it is overdue).
  const bool lost = env_->Hit("client.send") == Fault::kDrop;
  Status st = lost ? Status::Ok() : links_->Send(shard, frames);
  frames.clear();  // what a failed send left: borrowed frames must not outlive the request
  if (!st.ok()) FailRequest(r, st);
}

void ShardSession::BeginStep() { batch_.Begin(num_shards_); }

void ShardSession::SendStep() {
  // Steps whose every part was answered on its own (after resends) need no entry.
  batch_.ForgetAnswered([&](uint64_t id) { return tracker_.Outstanding(id); });
  batch_.End([&](uint32_t s, std::span<StepBatch::Entry> queue) {
    // A pull's reply counts against the Step's bytes too (the shard bounds both).
    for (StepBatch::Entry& g : queue) {
      if (g.op != Op::PullSparse && g.op != Op::PullDense) continue;
      if (const TrackedRequest* r = tracker_.Find(g.request_id, std::nullopt)) {
        g.payload_bytes += r->expect_rows * r->expect_dim * sizeof(float);
      }
    }
    StepBatch::Cut(queue, manifest_.server.max_request_bytes, &step_starts_);
    for (size_t i = 0; i < step_starts_.size(); ++i) {
      const size_t begin = step_starts_[i];
      const size_t end = i + 1 < step_starts_.size() ? step_starts_[i + 1] : queue.size();
      SendGathered(s, queue.subspan(begin, end - begin));
    }
  });
}

void ShardSession::SendGathered(uint32_t shard, std::span<StepBatch::Entry> group) {
  std::vector<zmq::message_t>* frames = &group.front().frames;
  std::vector<uint64_t>* ids = nullptr;  // the Step's parts (one part: no Step)
  if (group.size() > 1) {
    Header h = NewRequest(Op::Step, 0);
    h.clock = group.front().clock;
    SetStepParts(h, group.size());
    frames = &send_frames_;
    frames->clear();
    frames->push_back(EncodeHeader(h));
    ids = &batch_.Record(h.request_id);
    for (StepBatch::Entry& g : group) {
      ids->push_back(g.request_id);
      for (auto& f : g.frames) frames->push_back(std::move(f));
    }
  }
  const bool lost = env_->Hit("client.send") == Fault::kDrop;  // as in Send()
  Status st = lost ? Status::Ok() : links_->Send(shard, *frames);
  frames->clear();  // what a failed send left: borrowed frames must not outlive the request
  if (st.ok()) return;
  auto fail = [&](uint64_t id) {
    if (TrackedRequest* r = tracker_.Find(id, std::nullopt)) FailRequest(*r, st);
  };
  if (ids) {
    for (uint64_t id : *ids) fail(id);
  } else {
    fail(group.front().request_id);
  }
}

void ShardSession::OnStepReply(uint32_t shard, const Header& step,
                           std::vector<zmq::message_t>& frames) {
  const std::vector<uint64_t>* recorded = batch_.Parts(step.request_id);
  if (!recorded) return;  // its parts were answered on their own
  // Copied: the parts' replies below may erase the entry's requests, not the entry.
  std::vector<uint64_t>& ids = step_ids_;
  ids.assign(recorded->begin(), recorded->end());
  auto fail_all = [&](const Status& st) {
    for (uint64_t id : ids) {
      if (TrackedRequest* r = tracker_.Find(id, shard)) FailRequest(*r, st);
    }
  };
  if (step.status != StatusCode::kOk) {
    // As for a single request (worker/reply_outcome.hpp): a restarted shard's answer waits for
    // this worker's replay; a Step refused for now (behind a tick that waits for its pushes)
    // has each of its parts sent again on its own once overdue, within its attempts; a Step
    // refused otherwise fails its parts.
    switch (OutcomeOf(Op::Step, step.status, false, recovery_.replay_due(shard))) {
      case ReplyOutcome::kAwaitReplay:
        return;
      case ReplyOutcome::kRetryLater: {
        const auto later =
            env_->Now() + std::chrono::milliseconds(manifest_.cluster.request_timeout_ms);
        for (uint64_t id : ids) {
          if (TrackedRequest* r = tracker_.Find(id, shard)) {
            r->deadline = later;
            r->refused = Status(step.status, step.message);
          }
        }
        break;
      }
      default:
        fail_all(Status(step.status, step.message));
        break;
    }
    batch_.Forget(step.request_id);
    return;
  }
  std::vector<StepPart>& parts = step_split_;
  if (Status split = SplitStep(step, std::span<const zmq::message_t>(frames).subspan(1), &parts);
      !split.ok()) {
    fail_all(split.WithContext("shard " + std::to_string(shard) + " reply to Step"));
    return;
  }
  for (const StepPart& part : parts) {
    std::vector<zmq::message_t>& own = step_part_frames_;
    own.clear();
    for (size_t f = 0; f <= part.payload_frames; ++f) {
      own.push_back(std::move(frames[1 + part.header_frame + f]));
    }
    OnReply(shard, own);
  }
  // Held pulls of the Step come in a second reply; once every part is answered, forget it.
  if (std::none_of(ids.begin(), ids.end(), [&](uint64_t id) { return tracker_.Outstanding(id); })) {
    batch_.Forget(step.request_id);
  }
}

const Placement& ShardSession::WritePlacement() const {
  return relay_.membership().PlacementAt(clock_ + request_clock_offset_);
}

const Placement& ShardSession::ReadPlacement() const {
  // The keys' shards at the clock the rows are read for. A tool, and a worker done training
  // (evaluating), read the newest placement: a change named past the last clock still moves
  // the rows, and the shards that gain them answer once they hold them.
  return JobRank() && !left_ ? relay_.membership().PlacementAt(clock_ + request_clock_offset_)
                             : relay_.membership().LastPlacement();
}

Result<ShardSession::Ticket> ShardSession::Broadcast(Op op, uint64_t offset,
                                             const std::vector<uint32_t>& shards) {
  const Ticket ticket = NewTicket(op, 0);
  for (uint32_t s : shards) {
    Header h = NewRequest(op, 0);
    h.offset = offset;
    if (op == Op::Hello) h.known_epoch = recovery_.epoch(s);
    Send(ticket, s, std::move(h), {});
  }
  return ticket;
}

Status ShardSession::Pump(std::chrono::milliseconds timeout) {
  PARASOL_RETURN_IF_ERROR(links_->Wait(tracker_.UntilDue(env_->Now(), timeout)));
  for (uint32_t s = 0; s < num_shards_; ++s) {
    while (true) {
      Result<bool> got = links_->Receive(s, &received_);
      if (!got.ok()) return got.status();
      if (!*got) break;
      OnReply(s, received_);
    }
  }
  // A connection made again: ask whether the shard restarted, and send again what was on its
  // way to it, which the old connection may have lost (without spending an attempt: a pull
  // the shard would hold waits for up to training.worker_timeout, and the shard would count
  // this worker as silent meanwhile). A shard that has it already answers it as a duplicate.
  for (uint32_t s = 0; s < num_shards_; ++s) {
    if (!links_->TakeReconnect(s)) continue;
    SendDetached(s, Op::Hello, false);
    const auto now = env_->Now();
    for (auto& [id, r] : tracker_.requests()) {
      if (r->shard != s) continue;
      std::vector<zmq::message_t> frames;
      for (auto& k : r->kept) frames.push_back(CopyMessage(k));
      if (Status st = links_->Send(s, frames); !st.ok()) continue;  // its deadline still holds
      r->deadline = std::max(r->deadline, now + std::chrono::milliseconds(
                                                    manifest_.cluster.request_timeout_ms));
    }
  }
  ReplaySender replays(*this);
  for (uint32_t s = 0; s < num_shards_; ++s) {
    if (recovery_.replay_due(s)) replays.Start(s);
  }
  replays.Reap();
  // Resend or fail what is overdue.
  const auto later = env_->Now();
  for (uint64_t id : tracker_.Due(later)) {
    TrackedRequest* due = tracker_.Find(id, std::nullopt);
    if (!due) continue;
    TrackedRequest& r = *due;
    const std::string where = "shard " + std::to_string(r.shard) + " at " +
                              manifest_.cluster.servers[r.shard].ToString();
    // A shard loading its checkpoint that keeps moving is waited for: asked again (which also
    // tells whether it is done) without spending an attempt.
    const bool restoring = restoring_.Moving(r.shard, later);
    if (restoring) {
      r.deadline = later + restoring_.Poll();
      std::vector<zmq::message_t> frames;
      for (auto& k : r.kept) frames.push_back(CopyMessage(k));
      if (Status st = links_->Send(r.shard, frames); !st.ok()) {
        FailRequest(r, st.WithContext(where));
      }
      continue;
    }
    if (r.attempts >= r.max_attempts) {
      // Refused each time: it cannot pass (a tick whose push never reached the shard).
      FailRequest(r, r.refused.ok()
                         ? Timeout(where + " did not answer " + OpName(r.op) + " within " +
                                   std::to_string(r.timeout.count()) + " ms (" +
                                   std::to_string(r.attempts) + " attempts)")
                         : FailedPrecondition(r.refused.message() + " (" +
                                              std::to_string(r.attempts) + " attempts)"));
      continue;
    }
    ++r.attempts;
    r.deadline = later + r.timeout;
    spdlog::warn("worker {}: {} {} to {}; resending (attempt {} of {})", worker_id_,
                 r.refused.ok() ? "no reply from" : "refused for now by", where, OpName(r.op),
                 r.attempts, r.max_attempts);
    std::vector<zmq::message_t> frames;
    for (auto& k : r.kept) frames.push_back(CopyMessage(k));
    Status st = links_->Send(r.shard, frames);
    if (!st.ok()) {
      FailRequest(r, st.WithContext(where));
      continue;
    }
    // A Hello too: its reply tells whether the shard restarted, even if this request is held.
    SendDetached(r.shard, Op::Hello, false);
  }
  return Status::Ok();
}

void ShardSession::OnReply(uint32_t shard, std::vector<zmq::message_t>& frames) {
  if (frames.empty()) return;
  Result<Header> h = DecodeHeader(frames[0].data(), frames[0].size());
  if (!h.ok()) {
    spdlog::warn("worker {}: dropped an unreadable reply from shard {}: {}", worker_id_, shard,
                 h.status().ToString());
    return;
  }
  // What the reply means for its request: one table (worker/reply_outcome.hpp).
  if (OutcomeOf(h->op, h->status, h->restore_total > 0, false) == ReplyOutcome::kAwaitRestore) {
    // Loading its checkpoint: nothing of this reply is the shard's state yet. While it moves,
    // it is asked again soon (without spending attempts, see Pump()); else the request waits
    // out its time-out as for a silent shard.
    NoteRestoring(shard, *h);
    const auto now = env_->Now();
    const bool moving = restoring_.Moving(shard, now);
    if (TrackedRequest* r = tracker_.Find(h->request_id, shard)) {
      if (moving) r->deadline = now + restoring_.Poll();
      r->refused = Status(h->status, h->message);
    } else if (h->op == Op::Step && moving) {
      // A Step's parts are tracked by their own ids: each waits alike.
      for (auto& [id, r] : tracker_.requests()) {
        if (r->shard != shard) continue;
        r->deadline = std::min(r->deadline, now + restoring_.Poll());
      }
    }
    return;
  }
  if (h->restore_total > 0) NoteRestoring(shard, *h);  // its Stats: answered, and moving
  // Answering from its state: whatever it said while loading is over.
  if (h->restore_total == 0 && restoring_.progress(shard).heard != Clock::time_point{}) {
    restoring_.Loaded(shard);
  }
  NoteRollback(shard, *h);
  // A shard that rolled back has a new epoch too, but nothing is replayed to it.
  if (rolled_back_.ok()) NoteEpoch(shard, *h);
  relay_.Note(shard, *h);
  if (h->op == Op::Step) {
    OnStepReply(shard, *h, frames);
    return;
  }
  TrackedRequest* found = tracker_.Find(h->request_id, shard);
  if (!found) {
    if (h->op == Op::Error) {
      spdlog::warn("worker {}: shard {} rejected a message: {}", worker_id_, shard, h->message);
    }
    return;  // a late reply to a request that was resent and already answered
  }
  TrackedRequest& r = *found;
  switch (OutcomeOf(r.op, h->status, false, recovery_.replay_due(shard))) {
    case ReplyOutcome::kAwaitRestore:  // (not without restoring)
    case ReplyOutcome::kAwaitReplay:
      // A shard that restarted answers from its checkpoint's state until this worker's replay
      // has reached it (an error, or a pull's rows): the replay resends the request, in order.
      return;
    case ReplyOutcome::kRetryLater:
      // Refused for now: a tick whose pushes the shard has not all applied (one lost on its
      // way is resent when overdue, before the tick), and the pulls behind it. Sent again
      // after cluster.request_timeout, within the request's attempts.
      r.deadline = env_->Now() + std::chrono::milliseconds(manifest_.cluster.request_timeout_ms);
      r.refused = Status(h->status, h->message);
      // A greeting gets one attempt (a shard silent for cluster.connect_timeout is down), but
      // one refused for now (shard 0 restarted and waits for the workers' replays before it
      // names a join) is asked again within the request's retries.
      if (r.op == Op::Hello) {
        r.max_attempts = std::max(r.max_attempts, 1 + manifest_.cluster.request_retries);
      }
      return;
    case ReplyOutcome::kFail:
      FailRequest(r, Status(h->status, h->message));
      return;
    case ReplyOutcome::kDone:
      break;
  }
  if (r.op == Op::PullSparse) {  // the rows' bytes as they travelled (16-bit when compressed)
    for (size_t f = 1; f < frames.size(); ++f) pulled_reply_bytes_ += frames[f].size();
  }
  if (Status st = AcceptReply(*h, r, tracker_.ticket(r.ticket), shard, frames,
                              manifest_.server.max_request_bytes, tracker_);
      !st.ok()) {
    FailRequest(r, std::move(st));
    return;
  }
  if (r.op == Op::PushSparse || r.op == Op::PushDense) ++pushes_acknowledged_;
  if (r.op == Op::PushSparse || r.op == Op::PushDense) {
    recovery_.LogPush(shard, r.clock, *h, r.kept);
  }
  if (r.op == Op::Clock && r.done) recovery_.NoteDone(shard, *h);
  tracker_.Complete(r);
}

void ShardSession::NoteRollback(uint32_t shard, const Header& reply) {
  if (reply.op == Op::Hello && reply.rollback_needed) {
    rollback_needed_ = true;
    if (std::find(rollback_needed_by_.begin(), rollback_needed_by_.end(), shard) ==
        rollback_needed_by_.end()) {
      rollback_needed_by_.push_back(shard);
    }
  }
  if (rolling_back_ || !rolled_back_.ok() || !JobRank() || !manifest_.RollsBack()) return;
  // Across a change of the shard count no rollback is made (the shards refuse it): the loss
  // stays reported, and this worker goes on (Connect() above).
  if (connected_ && reply.rollback_needed && !ShardCountChanged() && !rollback_barred_) {
    // A leaver's end bars a rollback, and shard 0 judges it: another shard may say one is owed
    // while shard 0 would refuse it. Asked first, so that this client keeps its push log (the
    // replays it owes restarted shards) when the job goes on without one (parasol_sim
    // --elastic --reshard --seed 902).
    if (shard != 0 && relay_.membership().AnyLeave()) {
      if (!rollback_owed_at_) rollback_owed_at_ = shard;
      return;
    }
    RollBackAfter(shard);
  } else if (reply.rollback_gen > rollback_gen_ || reply.status == StatusCode::kAborted) {
    rolled_back_ = Aborted("worker " + std::to_string(worker_id_) + ": the job rolled back to "
                           "clock " + std::to_string(reply.rollback_clock) + " (rollback " +
                           std::to_string(reply.rollback_gen) + ", shard " +
                           std::to_string(shard) + " says); this worker connects again and "
                           "redoes its steps from there");
    spdlog::warn("{}", rolled_back_.message());
  }
}

void ShardSession::RollBackAfter(uint32_t shard) {
  rolled_back_ = Aborted("worker " + std::to_string(worker_id_) + ": shard " +
                         std::to_string(shard) + " says updates of the job were lost (two "
                         "failures overlapped); the job rolls back, and this worker connects "
                         "again and redoes its steps from where it goes back to");
  spdlog::warn("{}", rolled_back_.message());
}

void ShardSession::CheckOwedRollback() {
  if (!rollback_owed_at_ || rolling_back_ || !rolled_back_.ok()) return;
  const uint32_t shard = *rollback_owed_at_;
  rollback_owed_at_.reset();
  if (rollback_barred_ || ShardCountChanged()) return;
  Header q = NewRequest(Op::Rollback, 0);
  q.clock = std::numeric_limits<int64_t>::max();
  SetRollbackQuestion(q, /*about_to_make=*/false);
  Result<Reply> zero = Call(0, std::move(q), {});
  if (!rolled_back_.ok()) return;  // the job rolled back meanwhile (its replies said so)
  if (zero.ok() && RollbackBarred(zero->header)) {
    // Shard 0 would refuse: the loss stays reported (by the shard that lost it), and this
    // client goes on with its log, as one whose rollback shard 0 refused.
    rollback_barred_ = true;
    spdlog::error("worker {}: shard {} says updates of the job were lost, and shard 0 bars a "
                  "rollback (a leaver has finished): the loss stays reported, and the job goes "
                  "on", worker_id_, shard);
    return;
  }
  RollBackAfter(shard);
}

std::optional<Header> ShardSession::ReplyHeader(Ticket t, uint32_t shard) const {
  const TicketState* p = tracker_.Find(t);
  if (!p || shard >= p->replies.size() || p->replies[shard].empty()) return std::nullopt;
  const zmq::message_t& frame = p->replies[shard][0];
  Result<Header> h = DecodeHeader(frame.data(), frame.size());
  if (!h.ok()) return std::nullopt;
  return *h;
}

void ShardSession::NoteEpoch(uint32_t shard, const Header& reply) {
  // A rollback's replies come from shards that have just gone back: this client replays
  // nothing to them (it connects afresh, or greets them next).
  if (reply.server_epoch == 0 || rolling_back_) return;
  ShardRecovery::Noted noted = recovery_.NoteReply(shard, reply);
  if (noted.restarted && joining_ && !relay_.membership().Joined(worker_id_)) {
    // A joiner the job has not taken in yet pushed nothing and has no clock on any shard: a
    // restart owes it no replay (one would be refused, as of a rank not in the job:
    // parasol_sim --elastic --seed 975). It greets the new process as it did the old.
    recovery_.NothingOwed(shard);
    return;
  }
  if (noted.restarted) {
    spdlog::warn("worker {}: shard {} restarted (its checkpoint is at clock {}); replaying the "
                 "pushes it had not checkpointed",
                 worker_id_, shard, reply.checkpoint_clock);
  }
  if (!noted.lost.ok() && replay_failure_.ok()) {
    replay_failure_ = std::move(noted.lost);
    spdlog::error("{}", replay_failure_.ToString());
  }
}

void ShardSession::NoteRestoring(uint32_t shard, const Header& reply) {
  if (!restoring_.Note(shard, reply, env_->Now())) return;
  const RestoreWatch::Progress& r = restoring_.progress(shard);
  spdlog::info("worker {}: shard {} is loading its checkpoint: {:.0f}% ({} of {} rows); "
               "waiting for it",
               worker_id_, shard, 100.0 * r.done / std::max<uint64_t>(1, r.total), r.rows,
               r.rows_total ? std::to_string(r.rows_total) : std::string("?"));
}

void ShardSession::SendDetached(uint32_t shard, Op op, bool done) {
  Header h = NewRequest(op, 0);
  h.done = done;
  // A probe, never a request to join (that one carries the membership naming the joiner).
  h.join = false;
  if (op == Op::Hello) h.known_epoch = recovery_.epoch(shard);
  std::vector<zmq::message_t> frames;
  frames.push_back(EncodeHeader(h));
  (void)links_->Send(shard, frames, /*dontwait=*/true);  // best effort
}

void ShardSession::FailRequest(TrackedRequest& r, Status status) {
  const uint32_t shard = r.shard;
  if (tracker_.Fail(r, std::move(status)).borrowing) {  // `r` is gone from here on
    // Frames of a failed request may sit in the socket's queue with a dead peer. Reopen the
    // socket so that they are dropped and the caller's memory is released.
    (void)links_->Open(shard);  // a failure here shows as a time-out of the next request
  }
}

Status ShardSession::Idle(std::chrono::milliseconds wait) {
  const auto until = env_->Now() + wait;
  for (auto now = env_->Now(); now < until; now = env_->Now()) {
    PARASOL_RETURN_IF_ERROR(
        Pump(std::chrono::ceil<std::chrono::milliseconds>(until - now)));
  }
  return Status::Ok();
}

Status ShardSession::Wait(Ticket ticket) {
  TicketState* found = tracker_.Find(ticket);
  if (!found) return InvalidArgument("unknown ticket " + std::to_string(ticket));
  while (found->outstanding > 0) {
    Status st = Pump(std::chrono::milliseconds(wait_interrupt_ ? 100 : 1000));
    if (!st.ok()) return st;
    CheckOwedRollback();
    if (!rolled_back_.ok()) return rolled_back_;
    if (!replay_failure_.ok()) return replay_failure_;
    if (!relay_.failure().ok()) return relay_.failure();
    if (wait_interrupt_ && found->outstanding > 0) PARASOL_RETURN_IF_ERROR(wait_interrupt_());
  }
  CheckOwedRollback();
  if (!rolled_back_.ok()) return rolled_back_;
  if (!replay_failure_.ok()) return replay_failure_;
  if (!relay_.failure().ok()) return relay_.failure();
  PARASOL_RETURN_IF_ERROR(recovery_.CheckLog());
  TicketState& p = *found;
  if (p.status.ok() && p.op == Op::PullSparse) AssembleSparsePull(p);
  if (p.status.ok() && on_finished_) on_finished_(p);
  Status result = p.status;
  for (auto& r : p.replies) r.clear();  // the frames released, the buffers kept for reuse
  if (p.borrowing) {
    // The reply proves the shard has the bytes; wait until ZeroMQ has let go of them too.
    p.borrows->WaitReleased();
  }
  tracker_.Close(ticket);
  return result;
}

Status ShardSession::Tick() {
  PARASOL_ASSIGN_OR_RETURN(Ticket t, TickAsync());
  return Wait(t);
}

Result<ShardSession::Ticket> ShardSession::TickAsync() {
  ++clock_;
  // Each shard's tick names the pushes it follows (indexes 0 to n - 1 of the clock left): the shard moves this worker's clock only once it has applied them all.
  last_push_count_ = push_index_;
  std::fill(push_index_.begin(), push_index_.end(), 0);
  // The shards that served the clock just finished (one that serves from the next clock on
  // takes the workers' clocks when it commits the change).
  const uint32_t n = relay_.membership().PlacementAt(clock_ - 1).count();
  if (tick_shards_.size() != n) tick_shards_ = FirstShards(n);
  const Ticket ticket = NewTicket(Op::Clock, 0);
  for (uint32_t s : tick_shards_) {
    Header h = NewRequest(Op::Clock, 0);
    SetTickNamedPushes(h, s < last_push_count_.size() ? last_push_count_[s] : 0);
    // The barriers this worker has passed: a shard that restarted after releasing one (from a
    // checkpoint older than the release) learns it here, so that a restarted worker that
    // enters it again is not held for workers that have gone on.
    h.last_barrier = barrier_passed_;
    Send(ticket, s, std::move(h), {});
  }
  return ticket;
}

Status ShardSession::Leave() { return Departure(*this).Leave(); }

Result<int64_t> ShardSession::RequestLeave(int64_t not_before) {
  return Departure(*this).RequestLeave(not_before);
}

Result<uint64_t> ShardSession::Scale(uint64_t workers, int64_t not_before) {
  return Departure(*this).Scale(workers, not_before);
}

Status ShardSession::SyncMembership() { return Departure(*this).AskShardZero(false, 0, -1); }

Status ShardSession::Barrier(int64_t id) {
  // Every shard that serves this worker's clock holds the barrier, so every one knows this
  // worker is waiting, not lost. (One that serves only later clocks learns at its commit who
  // left before it.)
  const std::vector<uint32_t> all = FirstShards(relay_.membership().PlacementAt(clock_).count());
  PARASOL_ASSIGN_OR_RETURN(Ticket t, Broadcast(Op::Barrier, static_cast<uint64_t>(id), all));
  PARASOL_RETURN_IF_ERROR(Wait(t));
  barrier_passed_ = std::max(barrier_passed_, id);
  return Status::Ok();
}


Result<ShardSession::Reply> ShardSession::Call(uint32_t shard, Header request,
                                       std::vector<zmq::message_t> payload) {
  if (shard >= num_shards_) return InvalidArgument("no shard " + std::to_string(shard));
  return Collect(CallAsync(shard, std::move(request), std::move(payload)), shard);
}

ShardSession::Ticket ShardSession::CallAsync(uint32_t shard, Header request,
                                     std::vector<zmq::message_t> payload) {
  const Ticket t = NewTicket(request.op, request.table_id);
  Send(t, shard, std::move(request), std::move(payload));
  return t;
}

Status ShardSession::Settle(Ticket t) {
  TicketState* found = tracker_.Find(t);
  if (!found) return InvalidArgument("unknown ticket " + std::to_string(t));
  while (found->outstanding > 0) {
    PARASOL_RETURN_IF_ERROR(Pump(std::chrono::milliseconds(wait_interrupt_ ? 100 : 1000)));
    if (wait_interrupt_ && found->outstanding > 0) PARASOL_RETURN_IF_ERROR(wait_interrupt_());
  }
  return Status::Ok();
}

Result<ShardSession::Reply> ShardSession::Collect(Ticket t, uint32_t shard) {
  PARASOL_RETURN_IF_ERROR(Settle(t));
  TicketState* found = tracker_.Find(t);
  Reply reply;
  std::vector<zmq::message_t>& stored = found->replies[shard];
  if (found->status.ok() && !stored.empty()) {
    PARASOL_ASSIGN_OR_RETURN(reply.header, DecodeHeader(stored[0].data(), stored[0].size()));
    for (size_t f = 1; f < stored.size(); ++f) reply.frames.push_back(std::move(stored[f]));
  }
  PARASOL_RETURN_IF_ERROR(Wait(t));
  return reply;
}

std::vector<uint32_t> ShardSession::ServingShards() const {
  return FirstShards(relay_.membership().LastPlacement().count());
}

}  // namespace parasol
