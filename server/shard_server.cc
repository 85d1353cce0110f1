#include "server/shard_server.hpp"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cinttypes>
#include <set>
#include <sstream>

#include "common/sharding.hpp"
#include "common/transport.hpp"
#include "common/initializer.hpp"
#include "server/optimizer.hpp"

namespace parasol {
namespace {

// Below this many floats a request is handled on the request thread: waking the engines
// would cost more than the work.
constexpr uint64_t kInlineFloats = 32 * 1024;

std::string Hex(uint64_t v) {
  char buf[24];
  std::snprintf(buf, sizeof(buf), "%016" PRIx64, v);
  return buf;
}

}  // namespace

ShardServer::ShardServer(const Manifest& manifest, uint32_t rank)
    : manifest_(manifest),
      rank_(rank),
      num_shards_(static_cast<uint32_t>(manifest.cluster.servers.size())),
      fingerprint_(manifest.Fingerprint()),
      context_(1),
      router_(context_, zmq::socket_type::router),
      engines_(manifest.server.engine_threads),
      worker_clocks_(manifest.cluster.workers, 0) {
  for (const TableOptions& t : manifest_.tables) {
    if (t.kind == TableKind::kSparse) {
      sparse_.push_back(std::make_unique<SparseTable>(t, engines_.size()));
      dense_.push_back(nullptr);
    } else {
      sparse_.push_back(nullptr);
      dense_.push_back(
          std::make_unique<DenseTable>(t, DenseSlice(t.NumElements(), rank_, num_shards_)));
    }
  }
}

ShardServer::~ShardServer() = default;

Status ShardServer::Bind() {
  const ServerAddress& me = manifest_.cluster.servers[rank_];
  const std::string host = manifest_.cluster.bind.empty() ? me.host : manifest_.cluster.bind;
  endpoint_ = TcpEndpoint(host, me.port);
  try {
    ConfigureDataSocket(router_);
    router_.set(zmq::sockopt::router_mandatory, true);
    router_.set(zmq::sockopt::maxmsgsize,
                static_cast<int64_t>(manifest_.server.max_request_bytes + kMaxHeaderBytes));
    router_.bind(endpoint_);
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
  zmq::pollitem_t items[] = {{router_.handle(), 0, ZMQ_POLLIN, 0}};
  while (!stop.load() && !shutdown_requested_) {
    try {
      zmq::poll(items, 1, std::chrono::milliseconds(100));
    } catch (const zmq::error_t& e) {
      if (e.num() == EINTR) continue;
      return Unavailable(std::string("poll failed: ") + e.what());
    }
    MaybeSweep();
    if (!(items[0].revents & ZMQ_POLLIN)) continue;
    // Drain what is queued before polling again.
    for (int i = 0; i < 256; ++i) {
      auto frames = RecvFrames(router_, /*dontwait=*/true);
      if (!frames.ok()) return frames.status();
      if (!frames->has_value()) break;
      HandleMessage(**frames);
      if (shutdown_requested_) break;
    }
  }
  spdlog::info("shard {} stopping: {}", rank_, StatsJson());
  return Status::Ok();
}

void ShardServer::HandleMessage(std::vector<zmq::message_t>& frames) {
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
  Result<Header> decoded = DecodeHeader(frames[1].data(), frames[1].size());
  if (!decoded.ok()) {
    ++counters_.bad_messages;
    spdlog::warn("shard {}: rejected a message: {}", rank_, decoded.status().ToString());
    Header err;
    err.op = Op::Error;
    err.is_reply = true;
    err.status = decoded.status().code();
    err.message = "shard " + std::to_string(rank_) + ": " + decoded.status().message();
    SendReply(identity, err, {});
    return;
  }
  const Header& req = *decoded;
  Header reply = ReplyTo(req, Status::Ok());
  std::vector<zmq::message_t> payload;
  bool held = false;
  Status st = Dispatch(req, std::span<zmq::message_t>(frames).subspan(2), identity, &reply,
                       &payload, &held);
  if (held) return;
  if (!st.ok()) {
    if (st.code() == StatusCode::kBadMessage || st.code() == StatusCode::kResourceExhausted) {
      ++counters_.bad_messages;
    }
    ++counters_.errors;
    spdlog::warn("shard {}: {} from worker {} failed: {}", rank_, OpName(req.op), req.worker_id,
                 st.ToString());
    reply = ReplyTo(req, st.WithContext("shard " + std::to_string(rank_)));
    payload.clear();
  }
  SendReply(identity, reply, std::move(payload));
}

Status ShardServer::Dispatch(const Header& req, std::span<zmq::message_t> payload_frames,
                             const zmq::message_t& identity, Header* reply,
                             std::vector<zmq::message_t>* payload, bool* held) {
  if (req.is_reply) return BadMessage(std::string(OpName(req.op)) + ": expected a request");
  if (req.status != StatusCode::kOk) {
    return BadMessage(std::string(OpName(req.op)) + ": a request must not carry a status");
  }
  Result<PayloadView> view =
      PayloadView::Parse(req, payload_frames, manifest_.server.max_request_bytes);
  if (!view.ok()) return view.status();
  op_counts_[static_cast<int>(req.op) & 15]++;
  switch (req.op) {
    case Op::Hello:
      return HandleHello(req, reply);
    case Op::PullSparse:
      return HandlePullSparse(req, *view, reply, payload);
    case Op::PushSparse:
      if (dedup_.Seen(req.worker_id, req.incarnation, req.seq)) {
        ++counters_.duplicate_pushes;
        reply->duplicate = true;
        return Status::Ok();
      }
      PARASOL_RETURN_IF_ERROR(HandlePushSparse(req, *view));
      dedup_.Mark(req.worker_id, req.incarnation, req.seq);
      return Status::Ok();
    case Op::PullDense:
      return HandlePullDense(req, reply, payload);
    case Op::PushDense:
      if (dedup_.Seen(req.worker_id, req.incarnation, req.seq)) {
        ++counters_.duplicate_pushes;
        reply->duplicate = true;
        return Status::Ok();
      }
      PARASOL_RETURN_IF_ERROR(HandlePushDense(req, *view));
      dedup_.Mark(req.worker_id, req.incarnation, req.seq);
      return Status::Ok();
    case Op::Clock:
      return HandleClock(req);
    case Op::Barrier: {
      PARASOL_RETURN_IF_ERROR(HandleBarrier(req, identity));
      *held = true;
      return Status::Ok();
    }
    case Op::Stats:
      reply->message = StatsJson();
      return Status::Ok();
    case Op::Shutdown:
      spdlog::info("shard {}: shutdown requested by worker {}", rank_, req.worker_id);
      shutdown_requested_ = true;
      return Status::Ok();
    case Op::Error:
      return BadMessage("Error is a reply op, not a request");
  }
  return BadMessage("unknown op " + std::to_string(static_cast<int>(req.op)));
}

Status ShardServer::HandleHello(const Header& req, Header* reply) {
  reply->shard_rank = rank_;
  reply->shard_count = num_shards_;
  reply->manifest_hash = fingerprint_;
  if (req.manifest_hash != fingerprint_) {
    return FailedPrecondition("manifest mismatch: worker " + std::to_string(req.worker_id) +
                              " runs manifest " + Hex(req.manifest_hash) + ", this shard runs " +
                              Hex(fingerprint_) + "; start every role with the same manifest");
  }
  return Status::Ok();
}

uint32_t ShardServer::ShardClock() const {
  int64_t c = 0;
  for (int64_t w : worker_clocks_) c = std::max(c, w);
  return static_cast<uint32_t>(std::clamp<int64_t>(c, 0, UINT32_MAX));
}

void ShardServer::MaybeSweep() {
  const auto now = std::chrono::steady_clock::now();
  if (now - last_sweep_ < std::chrono::milliseconds(10)) return;
  last_sweep_ = now;
  bool any = false;
  for (const auto& t : sparse_) any |= t && t->evicts();
  if (!any) return;
  // A bounded slice of every evicting table per call, on the engines that own the rows, so
  // eviction never races an update and never holds requests up for long.
  constexpr size_t kBucketsPerSweep = 1 << 15;
  const uint32_t clock = ShardClock();
  engines_.RunOnAll([&](uint32_t e) {
    for (const auto& t : sparse_) {
      if (t && t->evicts()) t->partition(e).Sweep(kBucketsPerSweep, clock);
    }
  });
}

void ShardServer::SplitByEngine(const PayloadView& p) {
  engine_positions_.resize(engines_.size());
  for (auto& v : engine_positions_) v.clear();
  const uint32_t engines = engines_.size();
  for (uint64_t i = 0; i < p.rows(); ++i) {
    engine_positions_[EngineOfKey(p.Key(i), engines)].push_back(static_cast<uint32_t>(i));
  }
}

Result<SparseTable*> ShardServer::SparseTableFor(const Header& req) {
  if (req.table_id >= sparse_.size()) {
    return NotFound(std::string(OpName(req.op)) + ": no table with id " +
                    std::to_string(req.table_id) + " (the manifest has " +
                    std::to_string(sparse_.size()) + ")");
  }
  SparseTable* t = sparse_[req.table_id].get();
  if (!t) {
    return InvalidArgument(std::string(OpName(req.op)) + ": table '" +
                           manifest_.tables[req.table_id].name + "' is dense, not sparse");
  }
  if (req.with_state && req.op != Op::PullSparse) {
    return InvalidArgument(std::string(OpName(req.op)) + ": with_state applies to pulls only");
  }
  const uint32_t want = req.with_state ? t->row_floats() : t->dim();
  if (req.value_dim != want) {
    return InvalidArgument(std::string(OpName(req.op)) + ": table '" + t->options().name +
                           "' has dim " + std::to_string(t->dim()) +
                           (req.with_state ? " (" + std::to_string(want) + " with state)" : "") +
                           ", request says " + std::to_string(req.value_dim));
  }
  return t;
}

Result<DenseTable*> ShardServer::DenseTableFor(const Header& req, uint64_t count) {
  if (req.table_id >= dense_.size()) {
    return NotFound(std::string(OpName(req.op)) + ": no table with id " +
                    std::to_string(req.table_id));
  }
  DenseTable* t = dense_[req.table_id].get();
  if (!t) {
    return InvalidArgument(std::string(OpName(req.op)) + ": table '" +
                           manifest_.tables[req.table_id].name + "' is sparse, not dense");
  }
  const SliceRange s = t->slice();
  if (req.offset > s.end || count > s.end - req.offset || req.offset < s.begin) {
    return InvalidArgument(std::string(OpName(req.op)) + ": elements [" +
                           std::to_string(req.offset) + ", +" + std::to_string(count) +
                           ") of table '" + t->options().name + "' are outside this shard's " +
                           "slice [" + std::to_string(s.begin) + ", " + std::to_string(s.end) +
                           ")");
  }
  return t;
}

Status ShardServer::HandlePullSparse(const Header& req, const PayloadView& p, Header* reply,
                                     std::vector<zmq::message_t>* payload) {
  PARASOL_ASSIGN_OR_RETURN(SparseTable * table, SparseTableFor(req));
  const uint64_t n = p.rows();
  const uint32_t dim = table->dim();
  const uint32_t out_floats = req.value_dim;  // dim, or dim + state with_state
  const size_t out_bytes = size_t{out_floats} * sizeof(float);
  const FramePlan plan = PlanValueFrames(n, out_floats, manifest_.server.frame_bytes);
  std::vector<OwnedBuffer> buffers;
  buffers.reserve(plan.frames);
  for (uint32_t f = 0; f < plan.frames; ++f) {
    buffers.push_back(OwnedBuffer::Allocate(plan.RowsInFrame(f, n) * out_bytes));
  }
  const uint32_t clock = ShardClock();
  const bool create = table->admits_on_pull();
  const TableOptions& options = table->options();
  const Optimizer& opt = table->optimizer();
  SplitByEngine(p);
  engines_.RunOnAll(
      [&](uint32_t e) {
        SparseTable::Partition& part = table->partition(e);
        part.ForEachKey(engine_positions_[e], [&](uint32_t i) { return p.Key(i); },
                        [&](uint32_t i, uint64_t key) {
                          const uint64_t f = i / plan.rows_per_frame;
                          float* dst = reinterpret_cast<float*>(
                              buffers[f].data() + (i - f * plan.rows_per_frame) * out_bytes);
                          const float* row = create ? part.FindOrCreate(key, clock) : part.Find(key);
                          if (row) {
                            std::memcpy(dst, row, out_bytes);
                            return;
                          }
                          // Not admitted yet: the initial value, and no row is created.
                          InitSparseRow(options.init, options.seed, key, std::span<float>(dst, dim));
                          if (req.with_state) opt.InitState(dst, opt.SparseState(dst, dim), dim);
                        });
      },
      n * out_floats < kInlineFloats);
  reply->key_count = n;
  reply->value_dim = out_floats;
  reply->value_frames = plan.frames;
  reply->rows_per_frame = plan.rows_per_frame;
  for (auto& b : buffers) payload->push_back(std::move(b).ToMessage());
  counters_.rows_pulled += n;
  return Status::Ok();
}

Status ShardServer::HandlePushSparse(const Header& req, const PayloadView& p) {
  PARASOL_ASSIGN_OR_RETURN(SparseTable * table, SparseTableFor(req));
  const uint64_t n = p.rows();
  const uint32_t dim = table->dim();
  const uint32_t clock = ShardClock();
  const Optimizer& opt = table->optimizer();
  SplitByEngine(p);
  engines_.RunOnAll(
      [&](uint32_t e) {
        SparseTable::Partition& part = table->partition(e);
        part.ForEachKey(engine_positions_[e], [&](uint32_t i) { return p.Key(i); },
                        [&](uint32_t i, uint64_t key) {
                          float* row = part.Find(key);
                          if (!row) row = part.CountPush(key, clock);
                          if (!row) return;  // counted towards admission only
                          opt.Apply(row, opt.SparseState(row, dim), p.Row(i), dim, 1.0);
                          SparseTable::Partition::LastClock(row) = clock;
                        });
      },
      n * dim < kInlineFloats);
  counters_.rows_pushed += n;
  return Status::Ok();
}

Status ShardServer::HandlePullDense(const Header& req, Header* reply,
                                    std::vector<zmq::message_t>* payload) {
  PARASOL_ASSIGN_OR_RETURN(DenseTable * table, DenseTableFor(req, req.key_count));
  const uint64_t n = req.key_count;
  const uint64_t local = req.offset - table->slice().begin;
  reply->key_count = n;
  reply->offset = req.offset;
  counters_.dense_elements_pulled += n;
  if (req.with_state) {
    // Rows of [value, state 0, state 1, ...] per element: a copy, for checks and exports.
    const uint32_t k = table->state_array_count();
    const uint32_t row = 1 + k;
    const FramePlan plan = PlanValueFrames(n, row, manifest_.server.frame_bytes);
    std::shared_ptr<const float[]> values = table->Share();
    float* const* state = table->state_arrays();
    for (uint32_t f = 0; f < plan.frames; ++f) {
      const uint64_t rows = plan.RowsInFrame(f, n);
      OwnedBuffer b = OwnedBuffer::Allocate(rows * row * sizeof(float));
      float* out = b.floats();
      for (uint64_t r = 0; r < rows; ++r) {
        const uint64_t i = local + uint64_t{f} * plan.rows_per_frame + r;
        out[r * row] = values[i];
        for (uint32_t a = 0; a < k; ++a) out[r * row + 1 + a] = state[a][i];
      }
      payload->push_back(std::move(b).ToMessage());
    }
    reply->value_dim = row;
    reply->value_frames = plan.frames;
    reply->rows_per_frame = plan.rows_per_frame;
    return Status::Ok();
  }
  const FramePlan plan = PlanValueFrames(n, 1, manifest_.server.frame_bytes);
  // Zero-copy: every frame shares the table's current buffer until it has been sent.
  std::shared_ptr<const float[]> values = table->Share();
  const float* first = values.get() + local;
  for (uint32_t f = 0; f < plan.frames; ++f) {
    payload->push_back(SharedMessage(values, first + uint64_t{f} * plan.rows_per_frame,
                                     plan.RowsInFrame(f, n) * sizeof(float)));
  }
  reply->value_dim = 1;
  reply->value_frames = plan.frames;
  reply->rows_per_frame = plan.rows_per_frame;
  return Status::Ok();
}

Status ShardServer::HandlePushDense(const Header& req, const PayloadView& p) {
  if (req.value_dim != 1) {
    return InvalidArgument("PushDense: value_dim must be 1, got " + std::to_string(req.value_dim));
  }
  if (req.with_state) return InvalidArgument("PushDense: with_state applies to pulls only");
  PARASOL_ASSIGN_OR_RETURN(DenseTable * table, DenseTableFor(req, p.rows()));
  const Optimizer& opt = table->optimizer();
  const uint32_t engines = engines_.size();
  const uint64_t local = req.offset - table->slice().begin;
  float* values = table->PrepareWrite();
  float* const* state = table->state_arrays();
  struct FrameRef {
    uint64_t first;
    const std::byte* data;
    uint64_t rows;
  };
  std::vector<FrameRef> frames;
  p.ForEachValueFrame([&](uint64_t first, const std::byte* data, uint64_t rows) {
    frames.push_back({first, data, rows});
  });
  // Engines take frames round-robin: disjoint element ranges, no locks.
  engines_.RunOnAll(
      [&](uint32_t e) {
        for (size_t f = e; f < frames.size(); f += engines) {
          const uint64_t i = local + frames[f].first;
          opt.Apply(values + i, opt.DenseState(state, i), frames[f].data, frames[f].rows, 1.0);
        }
      },
      p.rows() < kInlineFloats || frames.size() < 2);
  counters_.dense_elements_pushed += p.rows();
  return Status::Ok();
}

Status ShardServer::HandleClock(const Header& req) {
  if (req.worker_id >= worker_clocks_.size()) {
    return InvalidArgument("Clock: worker " + std::to_string(req.worker_id) +
                           " is not in this job (cluster.workers = " +
                           std::to_string(worker_clocks_.size()) + ")");
  }
  worker_clocks_[req.worker_id] = std::max(worker_clocks_[req.worker_id], req.clock);
  return Status::Ok();
}

Status ShardServer::HandleBarrier(const Header& req, const zmq::message_t& identity) {
  if (req.worker_id >= manifest_.cluster.workers) {
    return InvalidArgument("Barrier: worker " + std::to_string(req.worker_id) +
                           " is not in this job (cluster.workers = " +
                           std::to_string(manifest_.cluster.workers) + ")");
  }
  std::vector<HeldReply>& waiting = barriers_[req.clock];
  HeldReply held;
  held.identity.copy(const_cast<zmq::message_t&>(identity));
  held.request = req;
  waiting.push_back(std::move(held));
  std::set<uint32_t> arrived;
  for (const HeldReply& h : waiting) arrived.insert(h.request.worker_id);
  if (arrived.size() < manifest_.cluster.workers) return Status::Ok();
  for (HeldReply& h : waiting) SendReply(h.identity, ReplyTo(h.request, Status::Ok()), {});
  barriers_.erase(req.clock);
  return Status::Ok();
}

void ShardServer::SendReply(const zmq::message_t& identity, const Header& reply,
                            std::vector<zmq::message_t> payload) {
  std::vector<zmq::message_t> frames;
  frames.reserve(2 + payload.size());
  frames.emplace_back(identity.data(), identity.size());
  frames.push_back(EncodeHeader(reply));
  for (auto& m : payload) frames.push_back(std::move(m));
  Status st = SendFrames(router_, frames);
  if (!st.ok()) {
    spdlog::warn("shard {}: reply to worker {} not delivered: {}", rank_, reply.worker_id,
                 st.ToString());
  }
}

std::string ShardServer::StatsJson() const {
  std::ostringstream s;
  s << "{\"shard\":" << rank_ << ",\"shards\":" << num_shards_
    << ",\"requests\":" << counters_.requests << ",\"bad_messages\":" << counters_.bad_messages
    << ",\"errors\":" << counters_.errors
    << ",\"duplicate_pushes\":" << counters_.duplicate_pushes
    << ",\"rows_pulled\":" << counters_.rows_pulled << ",\"rows_pushed\":" << counters_.rows_pushed
    << ",\"dense_elements_pulled\":" << counters_.dense_elements_pulled
    << ",\"dense_elements_pushed\":" << counters_.dense_elements_pushed << ",\"ops\":{";
  bool first = true;
  for (int op = 0; op <= static_cast<int>(wire::Op::MAX); ++op) {
    if (!first) s << ",";
    first = false;
    s << "\"" << OpName(static_cast<Op>(op)) << "\":" << op_counts_[op];
  }
  s << "},\"clock\":" << ShardClock() << ",\"worker_clocks\":[";
  for (size_t w = 0; w < worker_clocks_.size(); ++w) s << (w ? "," : "") << worker_clocks_[w];
  s << "],\"tables\":[";
  for (size_t t = 0; t < manifest_.tables.size(); ++t) {
    if (t) s << ",";
    s << "{\"name\":\"" << manifest_.tables[t].name << "\"";
    if (sparse_[t]) {
      const SparseTable& st = *sparse_[t];
      const SparseTable::Counters c = st.TotalCounters();
      const uint64_t rows = st.TotalRows();
      s << ",\"kind\":\"sparse\",\"rows\":" << rows << ",\"bytes\":" << st.MemoryBytes()
        << ",\"bytes_per_row\":" << (rows ? st.MemoryBytes() / static_cast<double>(rows) : 0.0)
        << ",\"row_floats\":" << st.row_floats() << ",\"pending_keys\":" << st.PendingKeys()
        << ",\"admitted\":" << c.admitted << ",\"pushes_counted\":" << c.pushes_counted
        << ",\"evicted_ttl\":" << c.evicted_ttl << ",\"evicted_max_rows\":" << c.evicted_max_rows;
    } else {
      s << ",\"kind\":\"dense\",\"slice_begin\":" << dense_[t]->slice().begin
        << ",\"slice_end\":" << dense_[t]->slice().end << ",\"bytes\":" << dense_[t]->MemoryBytes()
        << ",\"copies_on_write\":" << dense_[t]->copies_on_write();
    }
    s << "}";
  }
  s << "]}";
  return s.str();
}

}  // namespace parasol
