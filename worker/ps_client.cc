#include "worker/ps_client.hpp"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstring>

#include "common/optimizer_layout.hpp"
#include "common/protocol.hpp"
#include "common/sharding.hpp"
#include "worker/key_split.hpp"
#include "worker/request_frames.hpp"

namespace parasol {

Result<std::unique_ptr<PsClient>> PsClient::Connect(const Manifest& manifest, uint32_t worker_id,
                                                    const std::string& key_path,
                                                    std::function<Status()> wait_interrupt,
                                                    bool join, Env* env) {
  PARASOL_ASSIGN_OR_RETURN(
      std::unique_ptr<ShardSession> session,
      ShardSession::Connect(manifest, worker_id, key_path, std::move(wait_interrupt), join, env));
  return std::unique_ptr<PsClient>(new PsClient(std::move(session)));
}

PsClient::PsClient(std::unique_ptr<ShardSession> session)
    : session_(std::move(session)),
      s_(*session_),
      manifest_(s_.manifest()),
      cache_(manifest_.worker.cache_rows) {
  s_.set_on_finished([this](TicketState& p) { CachePulled(p); });
}

void PsClient::Split(std::span<const uint64_t> keys, const Placement& placement,
                     KeySplit& split) {
  if (keys_unique_) {
    SplitUniqueKeys(keys, placement, num_shards(), split);
  } else {
    SplitKeys(keys, placement, num_shards(), dedup_, split);
  }
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

void PsClient::StartBorrowing(TicketState& p) {
  if (!p.borrows) p.borrows = std::make_unique<BorrowTracker>();
  p.borrowing = true;
}

Result<PsClient::Ticket> PsClient::PullSparseAsync(uint32_t table, std::span<const uint64_t> keys,
                                                   float* out, bool with_state, bool read_only) {
  PARASOL_ASSIGN_OR_RETURN(const TableOptions* t, CheckTable(table, TableKind::kSparse));
  const Ticket ticket = s_.NewTicket(Op::PullSparse, table);
  TicketState& p = s_.tracker().ticket(ticket);
  const uint32_t dim = with_state ? RowFloats(table) : t->dim;
  p.dim = dim;
  p.out = out;
  if (keys.empty()) return ticket;
  // The split's vectors go to the ticket at the end; a finished pull's come back to the
  // tracker (RequestTracker::Close), so the same few grow once and are reused.
  KeySplit& split = split_;
  s_.tracker().TakeSplit(split);
  // The keys' shards at the clock the rows are read for (ShardSession::ReadPlacement()).
  Split(keys, s_.ReadPlacement(), split);
  if (CacheActive() && !with_state) LookUpCached(table, dim, keys, split, p);
  std::vector<zmq::message_t>& key_bufs = key_bufs_;
  PullKeyFrames(keys, split, num_shards(), key_bufs);
  for (uint32_t s = 0; s < num_shards(); ++s) {
    if (split.counts[s] == 0) continue;
    Header h = s_.NewRequest(Op::PullSparse, table);
    h.key_count = split.counts[s];
    h.value_dim = dim;
    h.with_state = with_state;
    h.read_only = read_only;
    // The rows travel back in the wire dtype (state always in f32).
    if (!with_state) h.dtype = s_.WireDType();
    std::vector<zmq::message_t>& payload = payload_;
    payload.clear();
    payload.push_back(std::move(key_bufs[s]));
    const uint64_t id = h.request_id;
    pulled_key_bytes_ += split.counts[s] * sizeof(uint64_t);  // the rows: counted on arrival
    s_.Send(ticket, s, std::move(h), std::move(payload));
    if (TrackedRequest* r = s_.tracker().Find(id, std::nullopt)) {
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
  const Ticket ticket = s_.NewTicket(Op::PushSparse, table);
  if (keys.empty()) return ticket;
  if (CacheActive()) ApplyToCache(table, *t, keys, grads);
  KeySplit& split = push_split_;  // the pushes' own: its vectors stay here
  Split(keys, s_.WritePlacement(), split);
  PushFrames& frames = push_frames_;
  BuildPushFrames(keys, grads, dim, split, num_shards(), manifest_.server.frame_bytes, frames);
  for (uint32_t s = 0; s < num_shards(); ++s) {
    if (split.counts[s] == 0) continue;
    Header h = s_.NewRequest(Op::PushSparse, table);
    h.seq = s_.NextPushIndex(s);
    h.key_count = split.counts[s];
    h.value_dim = dim;
    h.value_frames = frames.plans[s].frames;
    h.rows_per_frame = frames.plans[s].rows_per_frame;
    std::vector<zmq::message_t>& payload = payload_;
    payload.clear();
    payload.push_back(std::move(frames.keys[s]));
    for (auto& b : frames.values[s]) payload.push_back(std::move(b));
    CompressValueFrames(s_.WireDType(), &h, &payload, 1);
    s_.Send(ticket, s, std::move(h), std::move(payload));
  }
  return ticket;
}

void PsClient::SendDensePull(Ticket ticket, uint32_t table, uint32_t shard, const SliceRange& c,
                             uint32_t dim, bool with_state) {
  Header h = s_.NewRequest(Op::PullDense, table);
  h.key_count = c.size();
  h.value_dim = dim;
  h.offset = c.begin;
  h.with_state = with_state;
  if (!with_state) h.dtype = s_.WireDType();
  const uint64_t id = h.request_id;
  s_.Send(ticket, shard, std::move(h), {});
  if (TrackedRequest* r = s_.tracker().Find(id, std::nullopt)) {
    r->expect_rows = c.size();
    r->expect_dim = dim;
    r->expect_offset = c.begin;
  }
}

void PsClient::SendDensePush(Ticket ticket, uint32_t table, uint32_t shard, const SliceRange& c,
                             std::span<const float> grads) {
  Header h = s_.NewRequest(Op::PushDense, table);
  h.seq = s_.NextPushIndex(shard);
  h.key_count = c.size();
  h.value_dim = 1;
  h.offset = c.begin;
  h.value_frames = 1;
  h.rows_per_frame = c.size();
  std::vector<zmq::message_t>& payload = payload_;
  payload.clear();
  if (s_.logs_pushes() && s_.WireDType() == wire::DType::F32) {
    // The log outlives the caller's buffer: copy. (Compressed, the 16-bit copy below is it.)
    OwnedBuffer copy = OwnedBuffer::Allocate(c.size() * sizeof(float));
    std::memcpy(copy.data(), grads.data() + c.begin, c.size() * sizeof(float));
    payload.push_back(std::move(copy).ToMessage());
  } else {
    payload.push_back(BorrowedMessage(grads.data() + c.begin, c.size() * sizeof(float),
                                      s_.tracker().ticket(ticket).borrows.get()));
  }
  CompressValueFrames(s_.WireDType(), &h, &payload, 0);  // a 16-bit copy replaces the borrowed frame, for good
  s_.Send(ticket, shard, std::move(h), std::move(payload));
}

Result<PsClient::Ticket> PsClient::PullDenseAsync(uint32_t table, float* out, bool with_state) {
  PARASOL_ASSIGN_OR_RETURN(const TableOptions* t, CheckTable(table, TableKind::kDense));
  const Ticket ticket = s_.NewTicket(Op::PullDense, table);
  const uint32_t dim = with_state ? RowFloats(table) : 1;
  s_.tracker().ticket(ticket).out = out;
  s_.tracker().ticket(ticket).dim = dim;
  ForEachDenseChunk(t->NumElements(), s_.ReadPlacement(), manifest_.server.frame_bytes,
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
  const Ticket ticket = s_.NewTicket(Op::PushDense, table);
  StartBorrowing(s_.tracker().ticket(ticket));
  ForEachDenseChunk(t->NumElements(), s_.WritePlacement(), manifest_.server.frame_bytes,
                    [&](uint32_t s, const SliceRange& c) { SendDensePush(ticket, table, s, c, grads); });
  return ticket;
}

Result<PsClient::Ticket> PsClient::PushPullDenseAsync(uint32_t table, std::span<const float> grads,
                                                      float* out) {
  PARASOL_ASSIGN_OR_RETURN(const TableOptions* t, CheckTable(table, TableKind::kDense));
  PARASOL_RETURN_IF_ERROR(CheckDenseGrads(*t, grads));
  const Ticket ticket = s_.NewTicket(Op::PushDense, table);
  TicketState& p = s_.tracker().ticket(ticket);
  StartBorrowing(p);
  p.out = out;
  p.dim = 1;
  // Chunk by chunk, each pull right behind its push on the same connection: the shard applies
  // the chunk, then reads it back, while the next chunk is still on its way up.
  ForEachDenseChunk(t->NumElements(), s_.WritePlacement(), manifest_.server.frame_bytes,
                    [&](uint32_t s, const SliceRange& c) {
                      SendDensePush(ticket, table, s, c, grads);
                      SendDensePull(ticket, table, s, c, 1, false);
                    });
  return ticket;
}

Status PsClient::PullSparse(uint32_t table, std::span<const uint64_t> keys, float* out) {
  PARASOL_ASSIGN_OR_RETURN(Ticket t, PullSparseAsync(table, keys, out));
  return Wait(t);
}

bool PsClient::CacheActive() const {
  return manifest_.worker.cache_rows > 0 && s_.JobRank() &&
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

void PsClient::LookUpCached(uint32_t table, uint32_t dim, std::span<const uint64_t> keys,
                            KeySplit& split, TicketState& p) {
  // Rows the cache holds for this clock are answered from it; only the others travel.
  const int64_t at = s_.request_clock();
  // From a change of the shard count on, every row is read from its new shard at least once:
  // a shard that gains rows answers their first pull only once it holds them.
  const auto& changes = s_.membership().server_changes();
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

void PsClient::CachePulled(TicketState& p) {
  // The rows pulled join the cache, valid while the read bound allows them.
  if (p.op != Op::PullSparse || p.cache_keys.empty()) return;
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

Result<PsClient::Ticket> PsClient::PrefetchSparseAsync(uint32_t table,
                                                       std::span<const uint64_t> keys,
                                                       float* out, uint32_t ahead) {
  s_.set_request_clock_offset(std::max<uint32_t>(1, ahead));
  Result<Ticket> t = PullSparseAsync(table, keys, out);
  s_.set_request_clock_offset(0);
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

Result<std::vector<std::string>> PsClient::Stats() {
  const std::vector<uint32_t> shards = s_.ServingShards();
  PARASOL_ASSIGN_OR_RETURN(Ticket t, s_.Broadcast(Op::Stats, 0, shards));
  PARASOL_RETURN_IF_ERROR(s_.Settle(t));
  const TicketState& p = s_.tracker().ticket(t);
  std::vector<std::string> out(p.messages.begin(), p.messages.begin() + shards.size());
  PARASOL_RETURN_IF_ERROR(Wait(t));
  return out;
}

Result<std::string> PsClient::StatsOf(uint32_t shard) {
  PARASOL_ASSIGN_OR_RETURN(Reply r, s_.Call(shard, s_.NewRequest(Op::Stats, 0), {}));
  return r.header.message;
}

Result<int64_t> PsClient::ScaleServers(uint32_t servers) {
  if (s_.JobRank()) return FailedPrecondition("ScaleServers is a tool's request, not a worker's");
  if (servers == 0 || servers > num_shards()) {
    return InvalidArgument("the job may have 1 to " + std::to_string(num_shards()) +
                           " shards (those cluster.servers lists), not " +
                           std::to_string(servers));
  }
  Header h = s_.NewRequest(Op::Membership, 0);
  h.shard_count = servers;
  PARASOL_ASSIGN_OR_RETURN(Reply r, s_.Call(0, std::move(h), {}));
  return MembershipClock(r.header);
}

Status PsClient::Checkpoint() {
  PARASOL_ASSIGN_OR_RETURN(Ticket t, s_.Broadcast(Op::Checkpoint, 0, s_.ServingShards()));
  return Wait(t);
}

Status PsClient::Shutdown() {
  const std::vector<uint32_t> serving = s_.ServingShards();
  PARASOL_ASSIGN_OR_RETURN(Ticket t, s_.Broadcast(Op::Shutdown, 0, serving));
  PARASOL_RETURN_IF_ERROR(Wait(t));
  // The listed shards outside the placement hold nothing and may not run: each that does
  // stops too, one try each.
  std::vector<uint32_t> idle;
  for (uint32_t s = static_cast<uint32_t>(serving.size()); s < num_shards(); ++s) idle.push_back(s);
  if (idle.empty()) return Status::Ok();
  PARASOL_ASSIGN_OR_RETURN(Ticket rest, s_.Broadcast(Op::Shutdown, 0, idle));
  for (auto& [id, r] : s_.tracker().requests()) {
    if (r->ticket == rest) r->max_attempts = 1;
  }
  if (Status st = Wait(rest); !st.ok()) {
    spdlog::info("shutdown: a shard outside the placement (holding nothing) did not answer: {}",
                 st.ToString());
  }
  return Status::Ok();
}

}  // namespace parasol
