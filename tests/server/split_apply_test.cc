// A BSP tick that completes a clock: the shard applies first the rows the pulls it is about to
// answer read, answers them, and applies the clock's other rows after (README "Answering a
// step's pulls first"). Driven in process through ShardServer::HandleMessage, next to a shard
// whose table evicts (so it never splits): every reply, held pulls' included, is the same byte
// for byte, and the counters say which rows went before the reply and which after.
#include <gtest/gtest.h>

#include <cstring>
#include <map>
#include <span>
#include <string>
#include <vector>

#include "common/manifest.hpp"
#include "common/transport.hpp"
#include "common/wire.hpp"
#include "server/shard_server.hpp"
#include "tests/support/json_figures.hpp"

namespace parasol {
namespace {

constexpr uint32_t kDim = 4;

// One in-process shard (1 worker, BSP, 2 engine threads) and the replies it sent, by request.
class InProcessShard {
 public:
  explicit InProcessShard(bool evicting)
      : manifest_(*ParseManifest(
            std::string("cluster:\n  servers: [127.0.0.1:1]\n  workers: 1\n"
                        "server:\n  engine_threads: 2\n"
                        "training: {consistency: bsp}\n"
                        "tables:\n") +
                // Tables 0 and 2 split unless `evicting`; table 1 evicts, so never splits.
                Table("a", "adagrad_rowwise", evicting) + Table("b", "adagrad", true) +
                Table("c", "adam", evicting),
            "split-apply")),
        shard_(manifest_, 0) {
    shard_.set_reply_sink([this](std::vector<zmq::message_t>& frames) {
      Result<Header> h = DecodeHeader(frames[1].data(), frames[1].size());
      ASSERT_TRUE(h.ok()) << h.status().ToString();
      EXPECT_EQ(h->status, StatusCode::kOk) << h->message;
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

  static std::string Table(const std::string& name, const std::string& optimizer,
                           bool evicting) {
    return "  - {name: " + name + ", kind: sparse, dim: 4, optimizer: {kind: " + optimizer +
           ", lr: 0.5}" + (evicting ? ", eviction: {ttl_clocks: 1000000}" : "") + "}\n";
  }

  Header Request(Op op, int64_t clock) {
    Header h;
    h.op = op;
    h.request_id = ++next_id_;
    h.worker_id = 0;
    h.incarnation = 1;
    h.clock = clock;
    h.manifest_hash = manifest_.Fingerprint();
    return h;
  }

  void Send(const Header& h, const std::vector<std::string>& payload = {}) {
    std::vector<zmq::message_t> frames;
    frames.emplace_back("w0", 2);
    frames.push_back(EncodeHeader(h));
    for (const std::string& p : payload) frames.emplace_back(p.data(), p.size());
    shard_.HandleMessage(frames);
  }

  // Sums `g` (the same for every coordinate, different per key) into the rows of `keys`.
  uint64_t Push(uint32_t table, int64_t clock, const std::vector<uint64_t>& keys) {
    Header h = Request(Op::PushSparse, clock);
    h.table_id = table;
    h.seq = ++seq_;
    h.key_count = keys.size();
    h.value_dim = kDim;
    const FramePlan plan = PlanValueFrames(keys.size(), kDim, manifest_.server.frame_bytes);
    h.value_frames = plan.frames;
    h.rows_per_frame = plan.rows_per_frame;
    std::vector<std::string> payload{Bytes(keys)};
    for (uint32_t f = 0; f < plan.frames; ++f) {
      std::vector<float> g;
      for (uint64_t i = 0; i < plan.RowsInFrame(f, keys.size()); ++i) {
        const uint64_t key = keys[f * plan.rows_per_frame + i];
        for (uint32_t d = 0; d < kDim; ++d) g.push_back(0.01f * static_cast<float>(key % 13 + d));
      }
      payload.emplace_back(reinterpret_cast<const char*>(g.data()), g.size() * sizeof(float));
    }
    Send(h, payload);
    return h.request_id;
  }

  uint64_t Pull(uint32_t table, int64_t clock, const std::vector<uint64_t>& keys) {
    Header h = Request(Op::PullSparse, clock);
    h.table_id = table;
    h.key_count = keys.size();
    h.value_dim = kDim;
    Send(h, {Bytes(keys)});
    return h.request_id;
  }

  uint64_t Tick(int64_t clock) {
    const Header h = Request(Op::Clock, clock);
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
      pull.value_dim = kDim;
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
  std::string Metrics() const { return shard_.MetricsText(); }
  uint64_t Stat(const std::string& name) const {
    return static_cast<uint64_t>(testing::JsonAt(shard_.StatsJson(), "/" + name, -1));
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
  uint64_t next_id_ = 1000;
  uint64_t seq_ = 0;
};

std::vector<uint64_t> Keys(uint64_t first, uint64_t count) {
  std::vector<uint64_t> k;
  for (uint64_t i = 0; i < count; ++i) k.push_back((first + i) * 0x9E3779B97F4A7C15ull);
  return k;
}

std::vector<uint64_t> Join(std::vector<uint64_t> a, const std::vector<uint64_t>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

TEST(SplitApplyTest, ATicksPullsAreAnsweredAfterTheirRowsAndTheOtherRowsAreAppliedAfter) {
  InProcessShard split(/*evicting=*/false), whole(/*evicting=*/true);
  constexpr uint32_t kTables = 3;
  // A: pushed and read by the pulls the tick answers; B: pushed only; C: read only.
  const std::vector<uint64_t> a = Keys(0, 300), b = Keys(1000, 500), c = Keys(5000, 200);
  uint64_t before_reply = 0, after_reply = 0;
  for (int64_t clock = 0; clock < 4; ++clock) {
    // Each clock moves the sets: what was pushed only is read next, and so on.
    const std::vector<uint64_t>& read = clock % 2 ? b : a;
    const std::vector<uint64_t>& only = clock % 2 ? a : b;
    for (InProcessShard* s : {&split, &whole}) {
      for (uint32_t t = 0; t < kTables; ++t) s->Push(t, clock, Join(read, only));
    }
    std::vector<std::vector<uint64_t>> pulls(2);  // [shard][table]
    if (clock < 2) {
      // Pulls held for the tick, then the tick alone.
      for (size_t i = 0; i < 2; ++i) {
        InProcessShard* s = i == 0 ? &split : &whole;
        for (uint32_t t = 0; t < kTables; ++t) {
          pulls[i].push_back(s->Pull(t, clock + 1, Join(read, c)));
          EXPECT_FALSE(s->Answered(pulls[i].back())) << "a pull of the next clock waits";
        }
        EXPECT_TRUE(s->Answered(s->Tick(clock + 1)));
      }
    } else {
      // The tick and the pulls in one Step, as workers send them.
      pulls[0] = split.TickAndPull(clock + 1, kTables, Join(read, c));
      pulls[1] = whole.TickAndPull(clock + 1, kTables, Join(read, c));
    }
    // The pulls: equal to the shard that applied everything first.
    for (uint32_t t = 0; t < kTables; ++t) {
      ASSERT_TRUE(split.Answered(pulls[0][t]) && whole.Answered(pulls[1][t]));
      EXPECT_EQ(split.Reply(pulls[0][t]), whole.Reply(pulls[1][t]))
          << "clock " << clock << ", table " << t;
      EXPECT_EQ(split.Reply(pulls[0][t]).size(),
                (read.size() + c.size()) * kDim * sizeof(float));
    }
    // Tables 0 and 2 leave their pushed-only rows for after the reply; table 1 applies all.
    before_reply += 2 * read.size() + read.size() + only.size();
    after_reply += 2 * only.size();
    EXPECT_EQ(split.Stat("bsp_rows_before_reply"), before_reply) << "clock " << clock;
    EXPECT_EQ(split.Stat("bsp_rows_after_reply"), after_reply) << "clock " << clock;
    EXPECT_EQ(whole.Stat("bsp_rows_after_reply"), 0u);
    EXPECT_EQ(whole.Stat("bsp_rows_before_reply"), before_reply + after_reply);
    // Every row, the ones applied after the reply included, as one pass leaves it.
    const std::vector<uint64_t> all = Join(Join(a, b), c);
    for (uint32_t t = 0; t < kTables; ++t) {
      const uint64_t p = split.Pull(t, clock + 1, all), q = whole.Pull(t, clock + 1, all);
      EXPECT_EQ(split.Reply(p), whole.Reply(q)) << "clock " << clock << ", table " << t;
      EXPECT_EQ(split.Reply(p).size(), all.size() * kDim * sizeof(float));
    }
  }
  // /metrics says the same.
  const std::string metrics = split.Metrics();
  EXPECT_NE(metrics.find("pass=\"before_reply\"} " + std::to_string(before_reply) + "\n"),
            std::string::npos)
      << metrics;
  EXPECT_NE(metrics.find("pass=\"after_reply\"} " + std::to_string(after_reply) + "\n"),
            std::string::npos)
      << metrics;
  // The pushed rows moved (the comparisons above are not of untouched rows).
  InProcessShard fresh(/*evicting=*/false);
  for (uint32_t t = 0; t < kTables; ++t) {
    const uint64_t untouched = fresh.Pull(t, 0, a);
    const uint64_t trained = split.Pull(t, 4, a);
    EXPECT_NE(fresh.Reply(untouched), split.Reply(trained)) << "table " << t;
  }
}

}  // namespace
}  // namespace parasol
