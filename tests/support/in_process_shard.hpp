// InProcessShard: a real ShardServer driven in process through HandleMessage(), no socket: the
// requests a worker would send (pushes, pulls, ticks, a Step of a tick and pulls), from any
// worker rank, and the replies the shard sent, by request id. For tests that choose the exact
// order in which requests arrive.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <functional>
#include <map>
#include <span>
#include <string>
#include <vector>

#include "common/manifest.hpp"
#include "common/transport.hpp"
#include "common/wire.hpp"
#include "server/shard_server.hpp"
#include "tests/support/json_figures.hpp"

namespace parasol::testing {

class InProcessShard {
 public:
  // `manifest`: a whole manifest's text; the shard is its listed server `rank`.
  InProcessShard(const std::string& manifest, const std::string& name, uint32_t rank = 0)
      : manifest_(*ParseManifest(manifest, name)), shard_(manifest_, rank) {
    shard_.set_reply_sink([this](std::vector<zmq::message_t>& frames) {
      Result<Header> h = DecodeHeader(frames[1].data(), frames[1].size());
      ASSERT_TRUE(h.ok()) << h.status().ToString();
      if (expect_ok_) {
        EXPECT_EQ(h->status, StatusCode::kOk) << h->message;
      }
      headers_[h->request_id] = *h;
      const std::span<const zmq::message_t> rest =
          std::span<const zmq::message_t>(frames).subspan(2);
      if (h->op != Op::Step) {
        replies_[h->request_id] = Join(rest);
        return;
      }
      // A Step's reply: each part's payload under the part's request id.
      Result<std::vector<StepPart>> parts = SplitStep(*h, rest);
      ASSERT_TRUE(parts.ok()) << parts.status().ToString();
      for (const StepPart& part : *parts) {
        EXPECT_EQ(part.header.status, StatusCode::kOk) << part.header.message;
        replies_[part.header.request_id] =
            Join(rest.subspan(part.header_frame + 1, part.payload_frames));
      }
      replies_[h->request_id] = "";
    });
  }

  const Manifest& manifest() const { return manifest_; }

  Header Request(Op op, int64_t clock, uint32_t worker = 0) {
    Header h;
    h.op = op;
    h.request_id = ++next_id_;
    h.worker_id = worker;
    h.incarnation = 1;
    h.clock = clock;
    h.manifest_hash = manifest_.Fingerprint();
    if (edit_) edit_(h);
    return h;
  }
  // Changes every request made from now on (a replay's flags, say; empty: none).
  void set_request_edit(std::function<void(Header&)> edit) { edit_ = std::move(edit); }

  void Send(const Header& h, const std::vector<std::string>& payload = {}) {
    std::vector<zmq::message_t> frames;
    const std::string identity = "w" + std::to_string(h.worker_id);
    frames.emplace_back(identity.data(), identity.size());
    frames.push_back(EncodeHeader(h));
    for (const std::string& p : payload) frames.emplace_back(p.data(), p.size());
    shard_.HandleMessage(frames);
  }

  // Sums scale x g into the rows of `keys` (dim floats each), where g is the same for every
  // worker and differs per key and coordinate.
  uint64_t Push(uint32_t table, int64_t clock, const std::vector<uint64_t>& keys,
                uint32_t worker = 0, float scale = 1.0f) {
    const uint32_t dim = manifest_.tables[table].dim;
    Header h = Request(Op::PushSparse, clock, worker);
    h.table_id = table;
    h.seq = ++seq_;
    h.key_count = keys.size();
    h.value_dim = dim;
    const FramePlan plan = PlanValueFrames(keys.size(), dim, manifest_.server.frame_bytes);
    h.value_frames = plan.frames;
    h.rows_per_frame = plan.rows_per_frame;
    std::vector<std::string> payload{Bytes(keys)};
    for (uint32_t f = 0; f < plan.frames; ++f) {
      std::vector<float> g;
      for (uint64_t i = 0; i < plan.RowsInFrame(f, keys.size()); ++i) {
        const uint64_t key = keys[f * plan.rows_per_frame + i];
        for (uint32_t d = 0; d < dim; ++d) {
          g.push_back(scale * 0.01f * static_cast<float>(key % 13 + d));
        }
      }
      payload.emplace_back(reinterpret_cast<const char*>(g.data()), g.size() * sizeof(float));
    }
    Send(h, payload);
    return h.request_id;
  }

  // Pushes `grads` to dense table `table`'s elements from `offset` on.
  uint64_t PushDense(uint32_t table, int64_t clock, uint64_t offset,
                     const std::vector<float>& grads, uint32_t worker = 0) {
    Header h = Request(Op::PushDense, clock, worker);
    h.table_id = table;
    h.seq = ++seq_;
    h.key_count = grads.size();
    h.value_dim = 1;
    h.offset = offset;
    h.value_frames = 1;
    h.rows_per_frame = grads.size();
    Send(h, {std::string(reinterpret_cast<const char*>(grads.data()),
                         grads.size() * sizeof(float))});
    return h.request_id;
  }

  uint64_t Pull(uint32_t table, int64_t clock, const std::vector<uint64_t>& keys,
                uint32_t worker = 0) {
    Header h = Request(Op::PullSparse, clock, worker);
    h.table_id = table;
    h.key_count = keys.size();
    h.value_dim = manifest_.tables[table].dim;
    Send(h, {Bytes(keys)});
    return h.request_id;
  }

  uint64_t PullDense(uint32_t table, int64_t clock, uint64_t offset, uint64_t elements,
                     uint32_t worker = 0) {
    Header h = Request(Op::PullDense, clock, worker);
    h.table_id = table;
    h.key_count = elements;
    h.value_dim = 1;
    h.offset = offset;
    Send(h);
    return h.request_id;
  }

  // A Stats request: its reply's header carries the shard's epoch and checkpoint counts.
  uint64_t Stats(uint32_t worker = 0) {
    const Header h = Request(Op::Stats, 0, worker);
    Send(h);
    return h.request_id;
  }

  uint64_t Tick(int64_t clock, uint32_t worker = 0) {
    const Header h = Request(Op::Clock, clock, worker);
    Send(h);
    return h.request_id;
  }

  // A worker's Step of a tick to `clock` and a pull of `keys` of every table at that clock;
  // the pulls' request ids.
  std::vector<uint64_t> TickAndPull(int64_t clock, uint32_t tables,
                                    const std::vector<uint64_t>& keys) {
    Header step = Request(Op::Step, clock);
    const Header tick = Request(Op::Clock, clock);
    step.key_count = 1 + tables;
    std::vector<zmq::message_t> frames;
    frames.emplace_back("w0", 2);
    frames.push_back(EncodeHeader(step));
    frames.push_back(EncodeHeader(tick));
    std::vector<uint64_t> ids;
    const std::string k = Bytes(keys);
    for (uint32_t t = 0; t < tables; ++t) {
      Header pull = Request(Op::PullSparse, clock);
      pull.table_id = t;
      pull.key_count = keys.size();
      pull.value_dim = manifest_.tables[t].dim;
      frames.push_back(EncodeHeader(pull));
      frames.emplace_back(k.data(), k.size());
      ids.push_back(pull.request_id);
    }
    shard_.HandleMessage(frames);
    EXPECT_TRUE(Answered(tick.request_id));
    return ids;
  }

  // The reply's payload bytes ("" when none came).
  std::string Reply(uint64_t id) const {
    auto it = replies_.find(id);
    return it == replies_.end() ? "" : it->second;
  }
  bool Answered(uint64_t id) const { return replies_.count(id) != 0; }
  // The reply's header (a default one when none came).
  Header ReplyHeader(uint64_t id) const {
    auto it = headers_.find(id);
    return it == headers_.end() ? Header{} : it->second;
  }
  // Whether every reply must be OK (the default); off for tests of refusals.
  void set_expect_ok(bool on) { expect_ok_ = on; }
  // As a process of the shard does before it serves: its newest good checkpoint.
  Status Restore() { return shard_.Restore(); }
  Status Checkpoint(const std::string& reason) { return shard_.SaveCheckpoint(reason); }
  // The serve loop's timed work, as between two requests (a background checkpoint is begun
  // or reaped there).
  void Periodic() { shard_.RunPeriodic(); }
  std::string Metrics() const { return shard_.MetricsText(); }
  std::string StatsText() const { return shard_.StatsJson(); }
  const ShardServer& server() const { return shard_; }
  uint64_t Stat(const std::string& name) const {
    return static_cast<uint64_t>(JsonAt(shard_.StatsJson(), "/" + name, -1));
  }

 private:
  static std::string Join(std::span<const zmq::message_t> frames) {
    std::string s;
    for (const zmq::message_t& f : frames) s.append(static_cast<const char*>(f.data()), f.size());
    return s;
  }
  static std::string Bytes(const std::vector<uint64_t>& keys) {
    return std::string(reinterpret_cast<const char*>(keys.data()), keys.size() * sizeof(uint64_t));
  }

  Manifest manifest_;
  ShardServer shard_;
  std::map<uint64_t, std::string> replies_;
  std::map<uint64_t, Header> headers_;
  bool expect_ok_ = true;
  std::function<void(Header&)> edit_;
  uint64_t next_id_ = 1000;
  uint64_t seq_ = 0;
};

}  // namespace parasol::testing
