#include "worker/ps_client.hpp"

#include <spdlog/spdlog.h>

#include <zmq_addon.hpp>

#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>
#include <random>

#include "common/fault_points.hpp"
#include "common/protocol.hpp"
#include "common/net.hpp"
#include "common/optimizer_layout.hpp"
#include "common/sharding.hpp"
#include "worker/departure.hpp"
#include "worker/job_rollback.hpp"
#include "worker/key_split.hpp"
#include "worker/replay_sender.hpp"
#include "worker/shard_greeting.hpp"
#include "worker/reply_assembly.hpp"
#include "worker/resume_point.hpp"
#include "worker/reply_outcome.hpp"
#include "worker/request_frames.hpp"
#include "worker/request_tracker.hpp"

namespace parasol {

using Clock = std::chrono::steady_clock;


PsClient::PsClient(const Manifest& manifest, uint32_t worker_id, Env* env)
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
  cache_ = RowCache(manifest_.worker.cache_rows);
}

PsClient::~PsClient() {
  // Frames may still borrow memory of callers that never waited; the connections drop them
  // while the trackers of those frames (in tracker_'s tickets) still live.
  links_.reset();
}

Result<std::unique_ptr<PsClient>> PsClient::Connect(const Manifest& manifest,
                                                    uint32_t worker_id,
                                                    const std::string& key_path,
                                                    std::function<Status()> wait_interrupt,
                                                    bool join, Env* env, uint32_t rounds) {
  std::unique_ptr<PsClient> c(new PsClient(manifest, worker_id, env));
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

bool PsClient::ShardCountChanged() const {
  return !relay_.membership().server_changes().empty();
}

bool PsClient::RefusedAcrossChange(const Status& st) {
  return st.code() == StatusCode::kFailedPrecondition &&
         st.message().find(kRollbackCannotCross) != std::string::npos;
}

Status PsClient::LoadKeys(const std::string& key_path) {
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

int PsClient::Mechanism(uint32_t shard) const { return links_->Mechanism(shard); }

uint32_t PsClient::ShardsFrom(int64_t clock) const {
  uint32_t n = relay_.membership().PlacementAt(clock).count();
  for (const auto& change : relay_.membership().server_changes()) {
    if (change.clock > clock) n = std::max(n, change.count);
  }
  return n;
}

std::vector<uint32_t> PsClient::FirstShards(uint32_t n) {
  std::vector<uint32_t> out(std::min<size_t>(n, num_shards_));
  for (uint32_t s = 0; s < out.size(); ++s) out[s] = s;
  return out;
}

Status PsClient::Handshake() {
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

Result<uint32_t> PsClient::TableId(const std::string& name) const {
  const int id = manifest_.FindTable(name);
  if (id < 0) return NotFound("no table named '" + name + "' in " + manifest_.source);
  return static_cast<uint32_t>(id);
}

Result<const TableOptions*> PsClient::CheckTable(uint32_t table, TableKind kind) const {
  if (table >= manifest_.tables.size()) {
    return NotFound("no table with id " + std::to_string(table));
  }
  const TableOptions& t = manifest_.tables[table];
  if (t.kind != kind) {
    return InvalidArgument("table '" + t.name + "' is " +
                           (t.kind == TableKind::kSparse ? "sparse" : "dense"));
  }
  return &t;
}

PsClient::Ticket PsClient::NewTicket(Op op, uint32_t table) { return tracker_.Open(op, table); }

void PsClient::StartBorrowing(TicketState& p) {
  if (!p.borrows) p.borrows = std::make_unique<BorrowTracker>();
  p.borrowing = true;
}

uint64_t PsClient::NextPushIndex(uint32_t shard) {
  // A push is named by (worker, clock, its index among this clock's pushes to the shard): a
  // restarted worker that recomputes the step sends the same names (server/push_record.hpp),
  // and each shard sees its indexes without gaps.
  return push_index_[shard]++;
}

wire::DType PsClient::WireDType() const { return WireDTypeOf(manifest_.wire); }

Header PsClient::NewRequest(Op op, uint32_t table) {
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

void PsClient::Send(Ticket ticket, uint32_t shard, Header header,
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

void PsClient::BeginStep() { batch_.Begin(num_shards_); }

void PsClient::SendStep() {
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

void PsClient::SendGathered(uint32_t shard, std::span<StepBatch::Entry> group) {
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

void PsClient::OnStepReply(uint32_t shard, const Header& step,
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

Result<PsClient::Ticket> PsClient::PullSparseAsync(uint32_t table, std::span<const uint64_t> keys,
                                                   float* out, bool with_state, bool read_only) {
  PARASOL_ASSIGN_OR_RETURN(const TableOptions* t, CheckTable(table, TableKind::kSparse));
  const Ticket ticket = NewTicket(Op::PullSparse, table);
  TicketState& p = tracker_.ticket(ticket);
  const uint32_t dim = with_state ? RowFloats(table) : t->dim;
  p.dim = dim;
  p.out = out;
  if (keys.empty()) return ticket;
  // The split's vectors go to the ticket at the end; a finished pull's come back to the
  // tracker (RequestTracker::Close), so the same few grow once and are reused.
  KeySplit& split = split_;
  tracker_.TakeSplit(split);
  // The keys' shards at the clock the rows are read for. A tool, and a worker done training
  // (evaluating), read the newest placement: a change named past the last clock still moves
  // the rows, and the shards that gain them answer once they hold them.
  const Placement& placement = ReadPlacement();
  if (keys_unique_) {
    SplitUniqueKeys(keys, placement, num_shards(), split);
  } else {
    SplitKeys(keys, placement, num_shards(), dedup_, split);
  }
  if (CacheActive() && !with_state) {
    // Rows the cache holds for this clock are answered from it; only the others travel.
    const int64_t at = clock_ + request_clock_offset_;
    // From a change of the shard count on, every row is read from its new shard at least once:
    // a shard that gains rows answers their first pull only once it holds them.
    const auto& changes = relay_.membership().server_changes();
    if (!changes.empty() && at >= changes.back().clock && cache_cleared_for_ < changes.back().clock) {
      cache_.Clear();
      cache_cleared_for_ = changes.back().clock;
    }
    std::vector<uint8_t>& first = first_seen_;
    first.assign(split.unique_shard.size(), 1);
    std::fill(split.counts.begin(), split.counts.end(), 0);
    p.cache_keys.assign(num_shards(), {});
    for (size_t i = 0; i < keys.size(); ++i) {
      const uint32_t u = split.inverse[i];
      if (!first[u]) continue;
      first[u] = 0;
      const size_t at_row = p.hit_rows.size();
      p.hit_rows.resize(at_row + dim);
      if (cache_.Lookup(table, keys[i], at, p.hit_rows.data() + at_row, dim)) {
        split.unique_shard[u] = kNoShard;
        split.unique_local[u] = static_cast<uint32_t>(at_row / dim);
        ++cache_hits_;
      } else {
        p.hit_rows.resize(at_row);
        const uint32_t s = split.unique_shard[u];
        split.unique_local[u] = static_cast<uint32_t>(split.counts[s]++);
        p.cache_keys[s].push_back(keys[i]);
        ++cache_misses_;
      }
    }
    p.cache_table = table;
    p.read_clocks.assign(num_shards(), -1);
  }
  std::vector<zmq::message_t>& key_bufs = key_bufs_;
  PullKeyFrames(keys, split, num_shards(), key_bufs);
  for (uint32_t s = 0; s < num_shards(); ++s) {
    if (split.counts[s] == 0) continue;
    Header h = NewRequest(Op::PullSparse, table);
    h.key_count = split.counts[s];
    h.value_dim = dim;
    h.with_state = with_state;
    h.read_only = read_only;
    // The rows travel back in the wire dtype (state always in f32).
    if (!with_state) h.dtype = WireDType();
    std::vector<zmq::message_t>& payload = payload_;
    payload.clear();
    payload.push_back(std::move(key_bufs[s]));
    const uint64_t id = h.request_id;
    pulled_row_bytes_ += split.counts[s] * sizeof(uint64_t);  // the rows: counted on arrival
    Send(ticket, s, std::move(h), std::move(payload));
    if (TrackedRequest* r = tracker_.Find(id, std::nullopt)) {
      r->expect_rows = split.counts[s];
      r->expect_dim = dim;
    }
  }
  p.inverse = std::move(split.inverse);
  p.unique_shard = std::move(split.unique_shard);
  p.unique_local = std::move(split.unique_local);
  return ticket;
}

Result<PsClient::Ticket> PsClient::PushSparseAsync(uint32_t table, std::span<const uint64_t> keys,
                                                   std::span<const float> grads) {
  PARASOL_ASSIGN_OR_RETURN(const TableOptions* t, CheckTable(table, TableKind::kSparse));
  const uint32_t dim = t->dim;
  if (grads.size() != keys.size() * dim) {
    return InvalidArgument("PushSparse on '" + t->name + "': " + std::to_string(keys.size()) +
                           " keys of dim " + std::to_string(dim) + " need " +
                           std::to_string(keys.size() * dim) + " gradient floats, got " +
                           std::to_string(grads.size()));
  }
  const Ticket ticket = NewTicket(Op::PushSparse, table);
  if (keys.empty()) return ticket;
  if (CacheActive()) ApplyToCache(table, *t, keys, grads);
  KeySplit& split = push_split_;  // the pushes' own: its vectors stay here
  const Placement& placement = WritePlacement();
  if (keys_unique_) {
    SplitUniqueKeys(keys, placement, num_shards(), split);
  } else {
    SplitKeys(keys, placement, num_shards(), dedup_, split);
  }
  PushFrames& frames = push_frames_;
  BuildPushFrames(keys, grads, dim, split, num_shards(), manifest_.server.frame_bytes, frames);
  for (uint32_t s = 0; s < num_shards(); ++s) {
    if (split.counts[s] == 0) continue;
    Header h = NewRequest(Op::PushSparse, table);
    h.seq = NextPushIndex(s);
    h.key_count = split.counts[s];
    h.value_dim = dim;
    h.value_frames = frames.plans[s].frames;
    h.rows_per_frame = frames.plans[s].rows_per_frame;
    std::vector<zmq::message_t>& payload = payload_;
    payload.clear();
    payload.push_back(std::move(frames.keys[s]));
    for (auto& b : frames.values[s]) payload.push_back(std::move(b));
    CompressValueFrames(WireDType(), &h, &payload, 1);
    Send(ticket, s, std::move(h), std::move(payload));
  }
  return ticket;
}

const Placement& PsClient::WritePlacement() const {
  return relay_.membership().PlacementAt(clock_ + request_clock_offset_);
}

const Placement& PsClient::ReadPlacement() const {
  // The keys' shards at the clock the rows are read for. A tool, and a worker done training
  // (evaluating), read the newest placement: a change named past the last clock still moves
  // the rows, and the shards that gain them answer once they hold them.
  return JobRank() && !left_ ? relay_.membership().PlacementAt(clock_ + request_clock_offset_)
                             : relay_.membership().LastPlacement();
}

void PsClient::SendDensePull(Ticket ticket, uint32_t table, uint32_t shard, const SliceRange& c,
                             uint32_t dim, bool with_state) {
  Header h = NewRequest(Op::PullDense, table);
  h.key_count = c.size();
  h.value_dim = dim;
  h.offset = c.begin;
  h.with_state = with_state;
  if (!with_state) h.dtype = WireDType();
  const uint64_t id = h.request_id;
  Send(ticket, shard, std::move(h), {});
  if (TrackedRequest* r = tracker_.Find(id, std::nullopt)) {
    r->expect_rows = c.size();
    r->expect_dim = dim;
    r->expect_offset = c.begin;
  }
}

void PsClient::SendDensePush(Ticket ticket, uint32_t table, uint32_t shard, const SliceRange& c,
                             std::span<const float> grads) {
  Header h = NewRequest(Op::PushDense, table);
  h.seq = NextPushIndex(shard);
  h.key_count = c.size();
  h.value_dim = 1;
  h.offset = c.begin;
  h.value_frames = 1;
  h.rows_per_frame = c.size();
  std::vector<zmq::message_t>& payload = payload_;
  payload.clear();
  if (recovery_.logs_pushes() && WireDType() == wire::DType::F32) {
    // The log outlives the caller's buffer: copy. (Compressed, the 16-bit copy below is it.)
    OwnedBuffer copy = OwnedBuffer::Allocate(c.size() * sizeof(float));
    std::memcpy(copy.data(), grads.data() + c.begin, c.size() * sizeof(float));
    payload.push_back(std::move(copy).ToMessage());
  } else {
    payload.push_back(BorrowedMessage(grads.data() + c.begin, c.size() * sizeof(float),
                                      tracker_.ticket(ticket).borrows.get()));
  }
  CompressValueFrames(WireDType(), &h, &payload, 0);  // a 16-bit copy replaces the borrowed frame, for good
  Send(ticket, shard, std::move(h), std::move(payload));
}

Result<PsClient::Ticket> PsClient::PullDenseAsync(uint32_t table, float* out, bool with_state) {
  PARASOL_ASSIGN_OR_RETURN(const TableOptions* t, CheckTable(table, TableKind::kDense));
  const Ticket ticket = NewTicket(Op::PullDense, table);
  const uint32_t dim = with_state ? RowFloats(table) : 1;
  tracker_.ticket(ticket).out = out;
  tracker_.ticket(ticket).dim = dim;
  ForEachDenseChunk(t->NumElements(), ReadPlacement(), manifest_.server.frame_bytes,
                    [&](uint32_t s, const SliceRange& c) {
                      SendDensePull(ticket, table, s, c, dim, with_state);
                    });
  return ticket;
}

Status PsClient::CheckDenseGrads(const TableOptions& t, std::span<const float> grads) const {
  if (grads.size() != t.NumElements()) {
    return InvalidArgument("PushDense on '" + t.name + "': the tensor has " +
                           std::to_string(t.NumElements()) + " elements, got " +
                           std::to_string(grads.size()));
  }
  return Status::Ok();
}

Result<PsClient::Ticket> PsClient::PushDenseAsync(uint32_t table, std::span<const float> grads) {
  PARASOL_ASSIGN_OR_RETURN(const TableOptions* t, CheckTable(table, TableKind::kDense));
  PARASOL_RETURN_IF_ERROR(CheckDenseGrads(*t, grads));
  const Ticket ticket = NewTicket(Op::PushDense, table);
  StartBorrowing(tracker_.ticket(ticket));
  ForEachDenseChunk(t->NumElements(), WritePlacement(), manifest_.server.frame_bytes,
                    [&](uint32_t s, const SliceRange& c) { SendDensePush(ticket, table, s, c, grads); });
  return ticket;
}

Result<PsClient::Ticket> PsClient::PushPullDenseAsync(uint32_t table, std::span<const float> grads,
                                                      float* out) {
  PARASOL_ASSIGN_OR_RETURN(const TableOptions* t, CheckTable(table, TableKind::kDense));
  PARASOL_RETURN_IF_ERROR(CheckDenseGrads(*t, grads));
  const Ticket ticket = NewTicket(Op::PushDense, table);
  TicketState& p = tracker_.ticket(ticket);
  StartBorrowing(p);
  p.out = out;
  p.dim = 1;
  // Chunk by chunk, each pull right behind its push on the same connection: the shard applies
  // the chunk, then reads it back, while the next chunk is still on its way up.
  ForEachDenseChunk(t->NumElements(), WritePlacement(), manifest_.server.frame_bytes,
                    [&](uint32_t s, const SliceRange& c) {
                      SendDensePush(ticket, table, s, c, grads);
                      SendDensePull(ticket, table, s, c, 1, false);
                    });
  return ticket;
}

Result<PsClient::Ticket> PsClient::Broadcast(Op op, uint64_t offset,
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

Status PsClient::Pump(std::chrono::milliseconds timeout) {
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

void PsClient::OnReply(uint32_t shard, std::vector<zmq::message_t>& frames) {
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
    for (size_t f = 1; f < frames.size(); ++f) pulled_row_bytes_ += frames[f].size();
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

void PsClient::NoteRollback(uint32_t shard, const Header& reply) {
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

void PsClient::RollBackAfter(uint32_t shard) {
  rolled_back_ = Aborted("worker " + std::to_string(worker_id_) + ": shard " +
                         std::to_string(shard) + " says updates of the job were lost (two "
                         "failures overlapped); the job rolls back, and this worker connects "
                         "again and redoes its steps from where it goes back to");
  spdlog::warn("{}", rolled_back_.message());
}

void PsClient::CheckOwedRollback() {
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

std::optional<Header> PsClient::ReplyHeader(Ticket t, uint32_t shard) const {
  const TicketState* p = tracker_.Find(t);
  if (!p || shard >= p->replies.size() || p->replies[shard].empty()) return std::nullopt;
  const zmq::message_t& frame = p->replies[shard][0];
  Result<Header> h = DecodeHeader(frame.data(), frame.size());
  if (!h.ok()) return std::nullopt;
  return *h;
}

void PsClient::NoteEpoch(uint32_t shard, const Header& reply) {
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

void PsClient::NoteRestoring(uint32_t shard, const Header& reply) {
  if (!restoring_.Note(shard, reply, env_->Now())) return;
  const RestoreWatch::Progress& r = restoring_.progress(shard);
  spdlog::info("worker {}: shard {} is loading its checkpoint: {:.0f}% ({} of {} rows); "
               "waiting for it",
               worker_id_, shard, 100.0 * r.done / std::max<uint64_t>(1, r.total), r.rows,
               r.rows_total ? std::to_string(r.rows_total) : std::string("?"));
}

void PsClient::SendDetached(uint32_t shard, Op op, bool done) {
  Header h = NewRequest(op, 0);
  h.done = done;
  // A probe, never a request to join (that one carries the membership naming the joiner).
  h.join = false;
  if (op == Op::Hello) h.known_epoch = recovery_.epoch(shard);
  std::vector<zmq::message_t> frames;
  frames.push_back(EncodeHeader(h));
  (void)links_->Send(shard, frames, /*dontwait=*/true);  // best effort
}

void PsClient::FailRequest(TrackedRequest& r, Status status) {
  const uint32_t shard = r.shard;
  if (tracker_.Fail(r, std::move(status)).borrowing) {  // `r` is gone from here on
    // Frames of a failed request may sit in the socket's queue with a dead peer. Reopen the
    // socket so that they are dropped and the caller's memory is released.
    (void)links_->Open(shard);  // a failure here shows as a time-out of the next request
  }
}

void PsClient::Finish(TicketState& p) {
  if (!p.status.ok() || p.op != Op::PullSparse) return;
  AssembleSparsePull(p);
  // The rows pulled join the cache, valid while the read bound allows them.
  if (!p.cache_keys.empty()) {
    const int64_t staleness = manifest_.training.staleness;
    std::vector<float> row(p.dim);
    for (uint32_t s = 0; s < p.cache_keys.size(); ++s) {
      if (!p.views[s]) continue;
      for (size_t l = 0; l < p.cache_keys[s].size(); ++l) {
        std::memcpy(row.data(), p.views[s]->Row(l), row.size() * sizeof(float));
        cache_.Insert(p.cache_table, p.cache_keys[s][l], row.data(), p.dim,
                      p.read_clocks[s] + staleness);
      }
    }
  }
}

Status PsClient::Idle(std::chrono::milliseconds wait) {
  const auto until = env_->Now() + wait;
  for (auto now = env_->Now(); now < until; now = env_->Now()) {
    PARASOL_RETURN_IF_ERROR(
        Pump(std::chrono::ceil<std::chrono::milliseconds>(until - now)));
  }
  return Status::Ok();
}

Status PsClient::Wait(Ticket ticket) {
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
  Finish(p);
  Status result = p.status;
  for (auto& r : p.replies) r.clear();  // the frames released, the buffers kept for reuse
  if (p.borrowing) {
    // The reply proves the shard has the bytes; wait until ZeroMQ has let go of them too.
    p.borrows->WaitReleased();
  }
  tracker_.Close(ticket);
  return result;
}

Status PsClient::PullSparse(uint32_t table, std::span<const uint64_t> keys, float* out) {
  PARASOL_ASSIGN_OR_RETURN(Ticket t, PullSparseAsync(table, keys, out));
  return Wait(t);
}

bool PsClient::CacheActive() const {
  return manifest_.worker.cache_rows > 0 && JobRank() &&
         manifest_.training.consistency == TrainingOptions::Consistency::kSsp &&
         manifest_.training.staleness > 0;
}

void PsClient::ApplyToCache(uint32_t table, const TableOptions& t, std::span<const uint64_t> keys,
                            std::span<const float> grads) {
  // The worker reads its own writes: SGD's update, as the shard applies it (SSP: scale 1);
  // with another optimizer (whose state the worker does not hold) the row is dropped.
  const bool sgd = t.optimizer.kind == OptimizerOptions::Kind::kSgd;
  const double lr = t.optimizer.lr, wd = t.optimizer.weight_decay;
  const uint32_t dim = t.dim;
  for (size_t i = 0; i < keys.size(); ++i) {
    float* w = cache_.Find(table, keys[i]);
    if (w == nullptr) continue;
    if (!sgd || !keys_unique_) {
      cache_.Erase(table, keys[i]);
      continue;
    }
    for (uint32_t d = 0; d < dim; ++d) {
      const double g = static_cast<double>(grads[i * dim + d]) + wd * w[d];
      w[d] = static_cast<float>(w[d] - lr * g);
    }
  }
}

Result<PsClient::Ticket> PsClient::PrefetchSparseAsync(uint32_t table,
                                                       std::span<const uint64_t> keys,
                                                       float* out, uint32_t ahead) {
  request_clock_offset_ = std::max<uint32_t>(1, ahead);
  Result<Ticket> t = PullSparseAsync(table, keys, out);
  request_clock_offset_ = 0;
  return t;
}

Status PsClient::PullSparseReadOnly(uint32_t table, std::span<const uint64_t> keys,
                                    float* out) {
  PARASOL_ASSIGN_OR_RETURN(Ticket t, PullSparseAsync(table, keys, out, false, true));
  return Wait(t);
}

Status PsClient::PullSparseWithState(uint32_t table, std::span<const uint64_t> keys,
                                     float* out) {
  PARASOL_ASSIGN_OR_RETURN(Ticket t, PullSparseAsync(table, keys, out, /*with_state=*/true));
  return Wait(t);
}

Status PsClient::PullDenseWithState(uint32_t table, float* out) {
  PARASOL_ASSIGN_OR_RETURN(Ticket t, PullDenseAsync(table, out, /*with_state=*/true));
  return Wait(t);
}

uint32_t PsClient::RowFloats(uint32_t table) const {
  if (table >= manifest_.tables.size()) return 0;
  const TableOptions& t = manifest_.tables[table];
  if (t.kind == TableKind::kSparse) return t.dim + SparseStateFloats(t.optimizer, t.dim);
  return 1 + DenseStateArrays(t.optimizer);
}

Status PsClient::PushSparse(uint32_t table, std::span<const uint64_t> keys,
                            std::span<const float> grads) {
  PARASOL_ASSIGN_OR_RETURN(Ticket t, PushSparseAsync(table, keys, grads));
  return Wait(t);
}

Status PsClient::PullDense(uint32_t table, float* out) {
  PARASOL_ASSIGN_OR_RETURN(Ticket t, PullDenseAsync(table, out));
  return Wait(t);
}

Status PsClient::PushDense(uint32_t table, std::span<const float> grads) {
  PARASOL_ASSIGN_OR_RETURN(Ticket t, PushDenseAsync(table, grads));
  return Wait(t);
}

Status PsClient::Tick() {
  PARASOL_ASSIGN_OR_RETURN(Ticket t, TickAsync());
  return Wait(t);
}

Result<PsClient::Ticket> PsClient::TickAsync() {
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

Status PsClient::Leave() { return Departure(*this).Leave(); }

Result<int64_t> PsClient::RequestLeave(int64_t not_before) {
  return Departure(*this).RequestLeave(not_before);
}

Result<uint64_t> PsClient::Scale(uint64_t workers, int64_t not_before) {
  return Departure(*this).Scale(workers, not_before);
}

Status PsClient::SyncMembership() { return Departure(*this).AskShardZero(false, 0, -1); }

Status PsClient::Barrier(int64_t id) {
  // Every shard that serves this worker's clock holds the barrier, so every one knows this
  // worker is waiting, not lost. (One that serves only later clocks learns at its commit who
  // left before it.)
  const std::vector<uint32_t> all = FirstShards(relay_.membership().PlacementAt(clock_).count());
  PARASOL_ASSIGN_OR_RETURN(Ticket t, Broadcast(Op::Barrier, static_cast<uint64_t>(id), all));
  PARASOL_RETURN_IF_ERROR(Wait(t));
  barrier_passed_ = std::max(barrier_passed_, id);
  return Status::Ok();
}

void PsClient::NoteBarrierPassed(int64_t id) { barrier_passed_ = std::max(barrier_passed_, id); }

Result<std::vector<std::string>> PsClient::Stats() {
  const std::vector<uint32_t> shards = ServingShards();
  PARASOL_ASSIGN_OR_RETURN(Ticket t, Broadcast(Op::Stats, 0, shards));
  std::vector<std::string> out;
  TicketState& p = tracker_.ticket(t);
  while (p.outstanding > 0) {
    PARASOL_RETURN_IF_ERROR(Pump(std::chrono::milliseconds(wait_interrupt_ ? 100 : 1000)));
    if (wait_interrupt_ && p.outstanding > 0) PARASOL_RETURN_IF_ERROR(wait_interrupt_());
  }
  out.assign(p.messages.begin(), p.messages.begin() + shards.size());
  PARASOL_RETURN_IF_ERROR(Wait(t));
  return out;
}

Result<std::string> PsClient::StatsOf(uint32_t shard) {
  PARASOL_ASSIGN_OR_RETURN(Reply r, Call(shard, NewRequest(Op::Stats, 0), {}));
  return r.header.message;
}

Result<PsClient::Reply> PsClient::Call(uint32_t shard, Header request,
                                       std::vector<zmq::message_t> payload) {
  if (shard >= num_shards_) return InvalidArgument("no shard " + std::to_string(shard));
  return Collect(CallAsync(shard, std::move(request), std::move(payload)), shard);
}

PsClient::Ticket PsClient::CallAsync(uint32_t shard, Header request,
                                     std::vector<zmq::message_t> payload) {
  const Ticket t = NewTicket(request.op, request.table_id);
  Send(t, shard, std::move(request), std::move(payload));
  return t;
}

Result<PsClient::Reply> PsClient::Collect(Ticket t, uint32_t shard) {
  TicketState* found = tracker_.Find(t);
  if (!found) return InvalidArgument("unknown ticket " + std::to_string(t));
  while (found->outstanding > 0) {
    PARASOL_RETURN_IF_ERROR(Pump(std::chrono::milliseconds(wait_interrupt_ ? 100 : 1000)));
    if (wait_interrupt_ && found->outstanding > 0) PARASOL_RETURN_IF_ERROR(wait_interrupt_());
  }
  Reply reply;
  std::vector<zmq::message_t>& stored = found->replies[shard];
  if (found->status.ok() && !stored.empty()) {
    PARASOL_ASSIGN_OR_RETURN(reply.header, DecodeHeader(stored[0].data(), stored[0].size()));
    for (size_t f = 1; f < stored.size(); ++f) reply.frames.push_back(std::move(stored[f]));
  }
  PARASOL_RETURN_IF_ERROR(Wait(t));
  return reply;
}

Result<int64_t> PsClient::ScaleServers(uint32_t servers) {
  if (JobRank()) return FailedPrecondition("ScaleServers is a tool's request, not a worker's");
  if (servers == 0 || servers > num_shards_) {
    return InvalidArgument("the job may have 1 to " + std::to_string(num_shards_) +
                           " shards (those cluster.servers lists), not " +
                           std::to_string(servers));
  }
  Header h = NewRequest(Op::Membership, 0);
  h.shard_count = servers;
  PARASOL_ASSIGN_OR_RETURN(Reply r, Call(0, std::move(h), {}));
  return MembershipClock(r.header);
}

Status PsClient::Checkpoint() {
  PARASOL_ASSIGN_OR_RETURN(Ticket t, Broadcast(Op::Checkpoint, 0, ServingShards()));
  return Wait(t);
}

Status PsClient::Shutdown() {
  const std::vector<uint32_t> serving = ServingShards();
  PARASOL_ASSIGN_OR_RETURN(Ticket t, Broadcast(Op::Shutdown, 0, serving));
  PARASOL_RETURN_IF_ERROR(Wait(t));
  // The listed shards outside the placement hold nothing and may not run: each that does
  // stops too, one try each.
  std::vector<uint32_t> idle;
  for (uint32_t s = static_cast<uint32_t>(serving.size()); s < num_shards_; ++s) idle.push_back(s);
  if (idle.empty()) return Status::Ok();
  PARASOL_ASSIGN_OR_RETURN(Ticket rest, Broadcast(Op::Shutdown, 0, idle));
  for (auto& [id, r] : tracker_.requests()) {
    if (r->ticket == rest) r->max_attempts = 1;
  }
  if (Status st = Wait(rest); !st.ok()) {
    spdlog::info("shutdown: a shard outside the placement (holding nothing) did not answer: {}",
                 st.ToString());
  }
  return Status::Ok();
}

std::vector<uint32_t> PsClient::ServingShards() {
  return FirstShards(relay_.membership().LastPlacement().count());
}

}  // namespace parasol
