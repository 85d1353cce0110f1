// One message per shard per step (the Step op): a job trains to the same model, value for value,
// whether its requests travel fused or one by one; a Step's pushes are applied once each, and
// the pulls after its tick are answered once the tick is applied.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <chrono>
#include <functional>
#include <string>

#include "common/manifest.hpp"
#include "common/net.hpp"
#include "common/subprocess.hpp"
#include "common/transport.hpp"
#include "common/wire.hpp"
#include "server/model_export.hpp"
#include "tests/support/json_figures.hpp"
#include "tests/support/test_cluster.hpp"
#include "worker/data_generator.hpp"

namespace parasol {
namespace {

using testing::MakeTempDir;
using testing::ReadFile;
using testing::RemoveTree;
using testing::TestCluster;
using testing::WriteFile;

// The "steps" counts of every shard's last stats line in a job's log.
std::vector<uint64_t> StepCounts(const std::string& log) {
  std::vector<uint64_t> counts;
  for (const Json& stats : testing::StoppingStats(log)) {
    if (stats.is_discarded() || !stats.contains("steps")) break;
    counts.push_back(stats["steps"].get<uint64_t>());
  }
  return counts;
}

// The two exported models hold the same rows and values, value for value (over 10,000).
void ExpectSameModel(const ExportedModel& a, const ExportedModel& b) {
  const ModelDifference d = CompareModels(a, b);
  EXPECT_GT(d.values_compared, 10000u);
  EXPECT_EQ(d.rows_in_one_only, 0u) << d.ToJson();
  EXPECT_EQ(d.max_relative, 0.0) << d.ToJson();
}

class FusedStepTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = MakeTempDir();
    GeneratorOptions g;
    g.rows = 6000;
    ASSERT_TRUE(GenerateCriteo(dir_ + "/train.tsv", g).ok());
  }
  void TearDown() override { RemoveTree(dir_); }

  // Trains dlrm (2 servers, 2 workers, BSP); returns the exported model, *log the job's output
  // and `dir_/name.json` its summary. `model_extra`: more fields of the model's section
  // (", key: value"). `servers`: 1 or 2. `after`: server.apply_after_reply.
  Result<ExportedModel> Train(const std::string& name, bool fuse, std::string* log,
                              const std::string& model_extra = "", int servers = 2,
                              const std::string& after = "auto") {
    const std::vector<uint16_t> ports = *PickFreePorts(2);
    const std::string manifest = dir_ + "/" + name + ".yaml";
    const std::string second = servers == 2 ? ", 127.0.0.1:" + std::to_string(ports[1]) : "";
    WriteFile(manifest,
              "job: {name: fused, seed: 9}\n"
              "cluster:\n  servers: [127.0.0.1:" + std::to_string(ports[0]) + second +
              "]\n  workers: 2\n"
              "training: {consistency: bsp, batch_size: 128, epochs: 1}\n"
              "model: {kind: dlrm, embedding_dim: 8, bottom: [16, 8], top: [16, 1]" +
              model_extra + "}\n"
              "worker: {fuse_requests: " + std::string(fuse ? "true" : "false") + "}\n"
              "server: {apply_after_reply: " + after + "}\n"
              "data: {train: " + dir_ + "/train.tsv}\n"
              "checkpoint: {dir: " + dir_ + "/" + name + "-ckpt}\n");
    auto job = Subprocess::Spawn(
        {PARASOL_BINARY, "launch", manifest, "--summary", dir_ + "/" + name + ".json"},
        dir_ + "/" + name + ".log");
    if (!job.ok()) return job.status();
    auto status = job->Wait(std::chrono::seconds(120));
    *log = ReadFile(dir_ + "/" + name + ".log");
    if (!status) job->Signal(SIGKILL);
    if (!status || !WIFEXITED(*status) || WEXITSTATUS(*status) != 0) {
      return Internal("the job failed:\n" + *log);
    }
    PARASOL_ASSIGN_OR_RETURN(Manifest m, LoadManifest(manifest));
    PARASOL_RETURN_IF_ERROR(ExportModel(m, {}, dir_ + "/" + name + "-model"));
    return LoadExportedModel(m, dir_ + "/" + name + "-model");
  }

  std::string dir_;
};

TEST_F(FusedStepTest, FusedStepsTrainTheSameModelAsSeparateRequests) {
  std::string fused_log, separate_log;
  auto fused = Train("fused", true, &fused_log);
  ASSERT_TRUE(fused.ok()) << fused.status().ToString();
  auto separate = Train("separate", false, &separate_log);
  ASSERT_TRUE(separate.ok()) << separate.status().ToString();
  // Each run took the path it names: about 4 Steps per worker step on each shard, or none.
  const std::vector<uint64_t> steps_fused = StepCounts(fused_log);
  const std::vector<uint64_t> steps_separate = StepCounts(separate_log);
  ASSERT_EQ(steps_fused.size(), 2u) << fused_log;
  ASSERT_EQ(steps_separate.size(), 2u) << separate_log;
  for (uint64_t n : steps_fused) EXPECT_GT(n, 2u * 6000 / 128) << fused_log;
  for (uint64_t n : steps_separate) EXPECT_EQ(n, 0u) << separate_log;
  ExpectSameModel(*fused, *separate);
}

// A job of one shard sends each step's tick right behind its pushes, without waiting for their
// acknowledgements (there are no two shards whose ticks could part); a job of two waits. Both
// train the same model, value for value: a row's update does not depend on its shard.
TEST_F(FusedStepTest, OneShardsTickGoesBehindThePushesAndTrainsTheSameModel) {
  std::string one_log, two_log;
  auto one = Train("one", true, &one_log, "", 1);
  ASSERT_TRUE(one.ok()) << one.status().ToString();
  auto two = Train("two", true, &two_log, "", 2);
  ASSERT_TRUE(two.ok()) << two.status().ToString();
  const std::string one_summary = ReadFile(dir_ + "/one.json");
  const std::string two_summary = ReadFile(dir_ + "/two.json");
  for (int w = 0; w < 2; ++w) {
    const std::string at = "/workers/" + std::to_string(w);
    const double steps = testing::JsonAt(one_summary, at + "/steps", -1);
    EXPECT_GT(steps, 6000.0 / 128 / 2 - 2) << one_summary;
    // Every step of the one-shard job sent its tick behind its pushes.
    EXPECT_EQ(testing::JsonAt(one_summary, at + "/ticks_behind_pushes", -1), steps) << one_summary;
    EXPECT_EQ(testing::JsonAt(two_summary, at + "/ticks_behind_pushes", -1), 0.0) << two_summary;
  }
  // Each tick named the pushes it followed (the sparse push and the dense ones the shard got),
  // and the shards found them applied: more than one a tick.
  for (const std::string* log : {&one_log, &two_log}) {
    const std::vector<Json> stats = testing::StoppingStats(*log);
    ASSERT_FALSE(stats.empty()) << *log;
    for (const Json& s : stats) {
      ASSERT_TRUE(!s.is_discarded() && s.contains("tick_pushes_checked")) << *log;
      EXPECT_GT(s["tick_pushes_checked"].get<uint64_t>(), 6000u / 128) << s.dump();
    }
  }
  ExpectSameModel(*one, *two);
}

// A BSP shard answers a tick's pulls once their rows are applied and applies the clock's other
// rows after the reply, in the background (docs/internals.md, "Answering a step's pulls first"),
// where server.apply_after_reply is `always` (`auto` decides by the host's cores); a tiered
// table is applied whole before the reply. Both train the same model, value for value.
TEST_F(FusedStepTest, AnsweringPullsBeforeTheRestOfTheApplyTrainsTheModelOfWholeClocks) {
  std::string split_log, whole_log;
  auto split = Train("split", true, &split_log, "", 2, "always");
  ASSERT_TRUE(split.ok()) << split.status().ToString();
  auto whole = Train("whole", true, &whole_log, ", sparse_storage: tiered", 2, "always");
  ASSERT_TRUE(whole.ok()) << whole.status().ToString();
  // Each run took the path it names, on both shards.
  const std::vector<Json> split_stats = testing::StoppingStats(split_log);
  const std::vector<Json> whole_stats = testing::StoppingStats(whole_log);
  ASSERT_EQ(split_stats.size(), 2u) << split_log;
  ASSERT_EQ(whole_stats.size(), 2u) << whole_log;
  for (const Json& s : split_stats) {
    ASSERT_TRUE(!s.is_discarded() && s.contains("bsp_rows_after_reply")) << split_log;
    EXPECT_GT(s["bsp_rows_after_reply"].get<uint64_t>(), 1000u) << s.dump();
    EXPECT_GT(s["bsp_rows_before_reply"].get<uint64_t>(), 1000u) << s.dump();
  }
  for (const Json& s : whole_stats) {
    ASSERT_TRUE(!s.is_discarded() && s.contains("bsp_rows_after_reply")) << whole_log;
    EXPECT_EQ(s["bsp_rows_after_reply"].get<uint64_t>(), 0u) << s.dump();
    EXPECT_GT(s["bsp_rows_before_reply"].get<uint64_t>(), 1000u) << s.dump();
  }
  ExpectSameModel(*split, *whole);
}

// A raw DEALER socket speaking Steps to one shard.
class RawStepPeer {
 public:
  explicit RawStepPeer(const ServerAddress& a) : socket_(context_, zmq::socket_type::dealer) {
    socket_.set(zmq::sockopt::linger, 0);
    socket_.connect(TcpEndpoint(a.host, a.port));
  }
  bool Send(std::vector<zmq::message_t> frames) { return SendFrames(socket_, frames).ok(); }
  // The next message's frames, or none after 10 s.
  std::vector<zmq::message_t> Receive() {
    zmq::pollitem_t item{socket_.handle(), 0, ZMQ_POLLIN, 0};
    zmq::poll(&item, 1, std::chrono::milliseconds(10000));
    if (!(item.revents & ZMQ_POLLIN)) return {};
    auto frames = RecvFrames(socket_, true);
    if (!frames.ok() || !frames->has_value()) return {};
    return std::move(**frames);
  }

 private:
  zmq::context_t context_{1};
  zmq::socket_t socket_;
};

Header Request(Op op, uint64_t id, int64_t clock) {
  Header h;
  h.op = op;
  h.request_id = id;
  h.worker_id = 0;
  h.incarnation = 5;
  h.clock = clock;
  return h;
}

// A push of one row of 4 gradients `g` for `key`, named (worker 0, clock, seq); `edit` may
// change its header first.
void AddPush(std::vector<zmq::message_t>* frames, uint64_t id, int64_t clock, uint64_t seq,
             uint64_t key, float g, const std::function<void(Header&)>& edit = nullptr) {
  Header h = Request(Op::PushSparse, id, clock);
  h.seq = seq;
  h.key_count = 1;
  h.value_dim = 4;
  h.rows_per_frame = 1;
  h.value_frames = 1;
  if (edit) edit(h);
  frames->push_back(EncodeHeader(h));
  frames->emplace_back(&key, sizeof(key));
  const float row[4] = {g, g, g, g};
  frames->emplace_back(row, sizeof(row));
}

void AddPull(std::vector<zmq::message_t>* frames, uint64_t id, int64_t clock, uint64_t key) {
  Header h = Request(Op::PullSparse, id, clock);
  h.key_count = 1;
  h.value_dim = 4;
  frames->push_back(EncodeHeader(h));
  frames->emplace_back(&key, sizeof(key));
}

std::vector<zmq::message_t> StepOf(uint64_t id, int64_t clock, uint64_t parts,
                                   std::vector<zmq::message_t> body) {
  Header s = Request(Op::Step, id, clock);
  s.key_count = parts;
  std::vector<zmq::message_t> frames;
  frames.push_back(EncodeHeader(s));
  for (auto& f : body) frames.push_back(std::move(f));
  return frames;
}

// The part replies of a Step reply: headers, and the payload of each pull.
struct StepReply {
  Header step;
  std::vector<Header> parts;
  std::vector<std::vector<float>> rows;  // per part: the pulled floats (empty for others)
};

Result<StepReply> ParseStepReply(std::vector<zmq::message_t>& frames) {
  if (frames.empty()) return Timeout("no reply within 10 s");
  StepReply r;
  PARASOL_ASSIGN_OR_RETURN(r.step, DecodeHeader(frames[0].data(), frames[0].size()));
  if (r.step.status != StatusCode::kOk) return Status(r.step.status, r.step.message);
  PARASOL_ASSIGN_OR_RETURN(std::vector<StepPart> parts,
                           SplitStep(r.step, std::span<const zmq::message_t>(frames).subspan(1)));
  for (const StepPart& p : parts) {
    r.parts.push_back(p.header);
    std::vector<float> values;
    for (size_t f = 1; f <= p.payload_frames; ++f) {
      const zmq::message_t& m = frames[1 + p.header_frame + f];
      const size_t n = m.size() / sizeof(float);
      values.resize(values.size() + n);
      std::memcpy(values.data() + values.size() - n, m.data(), m.size());
    }
    r.rows.push_back(std::move(values));
  }
  return r;
}

constexpr const char* kTables =
    "  - name: emb\n    dim: 4\n    init: {kind: constant, value: 1.0}\n"
    "    optimizer: {kind: sgd, lr: 0.5}\n";

TEST(StepTest, AStepsPushesApplyOnceAndThePullsAfterItsTickSeeThem) {
  // Two workers under BSP: worker 0's pulls after its tick wait for worker 1's tick.
  TestCluster cluster(1, 2, kTables, "training: {consistency: bsp}\n");
  ASSERT_TRUE(cluster.Start());
  RawStepPeer peer(cluster.manifest().cluster.servers[0]);
  constexpr uint64_t kKey = 77;
  // Pushes of clock 0: gradients 1 and 2 for the same row, in one Step.
  std::vector<zmq::message_t> body;
  AddPush(&body, 2, 0, 0, kKey, 1.0f);
  AddPush(&body, 3, 0, 1, kKey, 2.0f);
  std::vector<zmq::message_t> resend;
  for (auto& f : body) resend.emplace_back(f.data(), f.size());
  ASSERT_TRUE(peer.Send(StepOf(1, 0, 2, std::move(body))));
  auto frames = peer.Receive();
  Result<StepReply> r = ParseStepReply(frames);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  ASSERT_EQ(r->parts.size(), 2u);
  EXPECT_EQ(r->parts[0].request_id, 2u);
  EXPECT_EQ(r->parts[1].request_id, 3u);
  EXPECT_FALSE(r->parts[0].duplicate);
  EXPECT_EQ(r->parts[1].status, StatusCode::kOk) << r->parts[1].message;
  // The same Step again (a resend): both parts are acknowledged as duplicates, not applied.
  ASSERT_TRUE(peer.Send(StepOf(1, 0, 2, std::move(resend))));
  frames = peer.Receive();
  r = ParseStepReply(frames);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  ASSERT_EQ(r->parts.size(), 2u);
  EXPECT_TRUE(r->parts[0].duplicate);
  EXPECT_TRUE(r->parts[1].duplicate);
  // The tick to clock 1 and a pull of clock 1: the pull waits for worker 1's tick.
  body.clear();
  Header tick = Request(Op::Clock, 5, 1);
  tick.caught_up = true;
  body.push_back(EncodeHeader(tick));
  AddPull(&body, 6, 1, kKey);
  ASSERT_TRUE(peer.Send(StepOf(4, 1, 2, std::move(body))));
  frames = peer.Receive();
  r = ParseStepReply(frames);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  ASSERT_EQ(r->parts.size(), 1u) << "the pull must wait for worker 1";
  EXPECT_EQ(r->parts[0].op, Op::Clock);
  EXPECT_EQ(r->parts[0].status, StatusCode::kOk) << r->parts[0].message;
  auto other = cluster.Connect(1);
  ASSERT_NE(other, nullptr);
  ASSERT_TRUE(other->Tick().ok());
  frames = peer.Receive();
  r = ParseStepReply(frames);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->step.request_id, 4u);
  ASSERT_EQ(r->parts.size(), 1u);
  EXPECT_EQ(r->parts[0].request_id, 6u);
  ASSERT_EQ(r->rows[0].size(), 4u);
  // BSP over 2 workers: 1 - 0.5 x (1 + 2) / 2 = 0.25, the pushes applied once.
  for (float v : r->rows[0]) EXPECT_FLOAT_EQ(v, 0.25f);
}

TEST(StepTest, MalformedStepsAreRefusedWholeNamingThePart) {
  TestCluster cluster(1, 1, kTables);
  ASSERT_TRUE(cluster.Start());
  RawStepPeer peer(cluster.manifest().cluster.servers[0]);
  constexpr uint64_t kKey = 9;
  auto expect_refused = [&](std::vector<zmq::message_t> frames, const std::string& needle) {
    ASSERT_TRUE(peer.Send(std::move(frames)));
    auto reply = peer.Receive();
    ASSERT_FALSE(reply.empty()) << needle << ": no reply";
    Result<Header> h = DecodeHeader(reply[0].data(), reply[0].size());
    ASSERT_TRUE(h.ok());
    EXPECT_NE(h->status, StatusCode::kOk) << needle;
    EXPECT_NE(h->message.find(needle), std::string::npos)
        << "'" << h->message << "' does not say '" << needle << "'";
  };
  auto good_push = [&](uint64_t seq) {
    std::vector<zmq::message_t> f;
    AddPush(&f, 100 + seq, 0, seq, kKey, 1.0f);
    return f;
  };
  auto join = [](std::vector<zmq::message_t> a, std::vector<zmq::message_t> b) {
    for (auto& f : b) a.push_back(std::move(f));
    return a;
  };
  expect_refused(StepOf(1, 0, 0, {}), "0 parts");
  expect_refused(StepOf(1, 0, kMaxStepParts + 1, good_push(0)), "parts (1 to 4096");
  expect_refused(StepOf(1, 0, 2, good_push(0)), "part 1: missing");
  expect_refused(StepOf(1, 0, 1, join(good_push(0), good_push(1))), "frames after its last part");
  {
    std::vector<zmq::message_t> f = good_push(0);
    f.pop_back();  // the values frame
    expect_refused(StepOf(1, 0, 1, std::move(f)), "payload frames");
  }
  {
    std::vector<zmq::message_t> f;
    AddPush(&f, 7, 0, 1, kKey, 1.0f, [](Header& h) { h.worker_id = 3; });
    expect_refused(StepOf(1, 0, 2, join(good_push(0), std::move(f))), "Step of worker 0");
  }
  {
    std::vector<zmq::message_t> pull;
    AddPull(&pull, 8, 0, kKey);
    expect_refused(StepOf(1, 0, 2, join(good_push(0), std::move(pull))), "part 1 (PullSparse)");
  }
  {
    std::vector<zmq::message_t> f;
    f.push_back(EncodeHeader(Request(Op::Clock, 9, 0)));
    expect_refused(StepOf(1, 0, 2, join(good_push(0), std::move(f))), "part 1 (Clock)");
  }
  {
    std::vector<zmq::message_t> f;
    AddPush(&f, 10, 3, 0, kKey, 1.0f);
    expect_refused(StepOf(1, 0, 2, join(good_push(0), std::move(f))), "the Step's is 0");
  }
  {
    std::vector<zmq::message_t> f;
    AddPush(&f, 11, 0, 1, kKey, 1.0f, [](Header& h) { h.replay = true; });
    expect_refused(StepOf(1, 0, 2, join(good_push(0), std::move(f))), "replays travel");
  }
  {
    std::vector<zmq::message_t> inner = StepOf(12, 0, 1, good_push(0));
    expect_refused(StepOf(1, 0, 1, std::move(inner)), "a Step inside a Step");
  }
  {
    std::vector<zmq::message_t> frames = StepOf(13, 0, 1, good_push(0));
    Header s = Request(Op::Step, 13, 0);
    s.key_count = 1;
    s.replay = true;
    frames[0] = EncodeHeader(s);
    expect_refused(std::move(frames), "replays travel one request per message");
  }
  // None of the refused Steps applied its good push: the row is still its initial value.
  auto c = PsClient::Connect(cluster.manifest(), PsClient::kObserver);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  std::vector<float> row(4);
  const uint64_t key = kKey;
  ASSERT_TRUE((*c)->PullSparse(0, std::span<const uint64_t>(&key, 1), row.data()).ok());
  for (float v : row) EXPECT_EQ(v, 1.0f);
}

// The parts' statuses of the next reply, which must be a Step reply of `parts` parts.
std::vector<Header> PartsOf(RawStepPeer& peer, size_t parts) {
  auto frames = peer.Receive();
  Result<StepReply> r = ParseStepReply(frames);
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  if (!r.ok()) return {};
  EXPECT_EQ(r->parts.size(), parts);
  return r->parts;
}

// A tick names the pushes its worker sent the shard at the clock it leaves (key_count): one
// that was refused, or has not arrived, keeps the worker's clock where it is, and the tick and
// the pulls behind it are refused for now (Unavailable: the worker sends them again); once
// every named push is applied the tick passes.
TEST(StepTest, ATickIsRefusedUntilEveryPushItNamesIsApplied) {
  TestCluster cluster(1, 1, kTables, "training: {consistency: bsp}\n");
  ASSERT_TRUE(cluster.Start());
  RawStepPeer peer(cluster.manifest().cluster.servers[0]);
  constexpr uint64_t kKey = 31;
  auto tick_and_pull = [&](uint64_t id, uint64_t named) {
    std::vector<zmq::message_t> body;
    Header tick = Request(Op::Clock, id + 1, 1);
    tick.caught_up = true;
    tick.key_count = named;
    body.push_back(EncodeHeader(tick));
    AddPull(&body, id + 2, 1, kKey);
    return StepOf(id, 1, 2, std::move(body));
  };
  // Push 0 of clock 0 arrives; push 1 does not (yet).
  std::vector<zmq::message_t> body;
  AddPush(&body, 2, 0, 0, kKey, 1.0f);
  ASSERT_TRUE(peer.Send(StepOf(1, 0, 1, std::move(body))));
  std::vector<Header> parts = PartsOf(peer, 1);
  ASSERT_EQ(parts.size(), 1u);
  EXPECT_EQ(parts[0].status, StatusCode::kOk) << parts[0].message;
  // A tick naming 2 pushes: refused for now (to be sent again), naming the missing one; the
  // pull behind it too.
  ASSERT_TRUE(peer.Send(tick_and_pull(10, 2)));
  parts = PartsOf(peer, 2);
  ASSERT_EQ(parts.size(), 2u);
  EXPECT_EQ(parts[0].status, StatusCode::kUnavailable);
  EXPECT_NE(parts[0].message.find("its push 1 has not been applied here"), std::string::npos)
      << parts[0].message;
  EXPECT_EQ(parts[1].status, StatusCode::kUnavailable) << parts[1].message;
  // Push 1 is refused (a row of the wrong width): still not applied, so the tick is refused.
  body.clear();
  AddPush(&body, 20, 0, 1, kKey, 2.0f, [](Header& h) { h.value_dim = 3; });
  ASSERT_TRUE(peer.Send(StepOf(19, 0, 1, std::move(body))));
  parts = PartsOf(peer, 1);
  ASSERT_EQ(parts.size(), 1u);
  EXPECT_NE(parts[0].status, StatusCode::kOk);
  ASSERT_TRUE(peer.Send(tick_and_pull(30, 2)));
  parts = PartsOf(peer, 2);
  ASSERT_EQ(parts.size(), 2u);
  EXPECT_EQ(parts[0].status, StatusCode::kUnavailable) << parts[0].message;
  // Push 1 applied: the tick passes, and the pull sees the clock with both pushes:
  // 1 - 0.5 x (1 + 2) = -0.5.
  body.clear();
  AddPush(&body, 40, 0, 1, kKey, 2.0f);
  ASSERT_TRUE(peer.Send(StepOf(39, 0, 1, std::move(body))));
  parts = PartsOf(peer, 1);
  ASSERT_EQ(parts.size(), 1u);
  EXPECT_EQ(parts[0].status, StatusCode::kOk) << parts[0].message;
  ASSERT_TRUE(peer.Send(tick_and_pull(50, 2)));
  auto frames = peer.Receive();
  Result<StepReply> r = ParseStepReply(frames);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  ASSERT_EQ(r->parts.size(), 2u);
  EXPECT_EQ(r->parts[0].status, StatusCode::kOk) << r->parts[0].message;
  EXPECT_EQ(r->parts[1].status, StatusCode::kOk) << r->parts[1].message;
  ASSERT_EQ(r->rows[1].size(), 4u);
  for (float v : r->rows[1]) EXPECT_FLOAT_EQ(v, -0.5f);
}

// A client whose push the shard refused cannot tick that step: its tick is refused for now
// each time it is sent, and fails naming the push once its attempts are spent (a new client
// redoes the step).
TEST(StepTest, ATickAfterARefusedPushFailsNamingThePush) {
  TestCluster cluster(1, 1, kTables,
                      "training: {consistency: bsp}\nserver: {max_pending_bytes: 1KiB}\n");
  ASSERT_TRUE(cluster.Start());
  Manifest m = cluster.manifest();
  m.cluster.request_timeout_ms = 100;  // not in the manifest's fingerprint
  m.cluster.request_retries = 2;
  auto client = PsClient::Connect(m, 0);
  ASSERT_TRUE(client.ok()) << client.status().ToString();
  // 256 rows of dim 4: more than the 1 KiB of sums the shard may hold for a clock.
  std::vector<uint64_t> keys(256);
  for (uint64_t i = 0; i < keys.size(); ++i) keys[i] = 1000 + i;
  const std::vector<float> grads(keys.size() * 4, 0.1f);
  const Status pushed = (*client)->PushSparse(0, keys, grads);
  EXPECT_EQ(pushed.code(), StatusCode::kResourceExhausted) << pushed.ToString();
  const Status ticked = (*client)->Tick();
  EXPECT_EQ(ticked.code(), StatusCode::kFailedPrecondition) << ticked.ToString();
  EXPECT_NE(ticked.message().find("its push 0 has not been applied here"), std::string::npos)
      << ticked.ToString();
  EXPECT_NE(ticked.message().find("(3 attempts)"), std::string::npos) << ticked.ToString();
}

TEST(StepTest, AStepsRepliesAndHeldPullsAreBoundedLikeSeparateRequests) {
  // 64 KiB requests; a dense tensor of 48K floats (192 KiB); two workers under BSP; at most 3
  // pulls held per worker.
  TestCluster cluster(1, 2,
                      "  - name: w\n    kind: dense\n    shape: [49152]\n"
                      "    init: {kind: constant, value: 1.0}\n",
                      "server: {max_request_bytes: 64KiB, max_held_pulls: 3}\n"
                      "training: {consistency: bsp}\n");
  ASSERT_TRUE(cluster.Start());
  RawStepPeer peer(cluster.manifest().cluster.servers[0]);
  auto dense_pull = [](std::vector<zmq::message_t>* f, uint64_t id, int64_t clock,
                       uint64_t offset) {
    Header h = Request(Op::PullDense, id, clock);
    h.key_count = 12288;  // 48 KiB each: two replies pass 64 KiB
    h.value_dim = 1;
    h.offset = offset;
    f->push_back(EncodeHeader(h));
  };
  // Three pulls of 48 KiB: the first two are answered (96 KiB, past the limit after the
  // second), the third is refused, naming the limit.
  std::vector<zmq::message_t> body;
  for (uint64_t i = 0; i < 3; ++i) dense_pull(&body, 2 + i, 0, i * 12288);
  ASSERT_TRUE(peer.Send(StepOf(1, 0, 3, std::move(body))));
  std::vector<Header> parts = PartsOf(peer, 3);
  ASSERT_EQ(parts.size(), 3u);
  EXPECT_EQ(parts[0].status, StatusCode::kOk) << parts[0].message;
  EXPECT_EQ(parts[1].status, StatusCode::kOk) << parts[1].message;
  EXPECT_EQ(parts[2].status, StatusCode::kResourceExhausted);
  EXPECT_NE(parts[2].message.find("server.max_request_bytes"), std::string::npos)
      << parts[2].message;
  // Four pulls that must wait (clock 1, worker 1 still at 0) count as four held pulls: past
  // server.max_held_pulls = 3 the Step is refused, not held.
  body.clear();
  for (uint64_t i = 0; i < 4; ++i) dense_pull(&body, 10 + i, 1, 0);
  Header tick = Request(Op::Clock, 9, 1);
  tick.caught_up = true;
  std::vector<zmq::message_t> ticked;
  ticked.push_back(EncodeHeader(tick));
  for (auto& f : body) ticked.push_back(std::move(f));
  ASSERT_TRUE(peer.Send(StepOf(8, 1, 5, std::move(ticked))));
  parts = PartsOf(peer, 5);
  ASSERT_EQ(parts.size(), 5u);
  EXPECT_EQ(parts[0].status, StatusCode::kOk) << parts[0].message;  // the tick
  for (size_t i = 1; i < 5; ++i) {
    EXPECT_EQ(parts[i].status, StatusCode::kResourceExhausted) << parts[i].message;
    EXPECT_NE(parts[i].message.find("max_held_pulls"), std::string::npos) << parts[i].message;
  }
  // A tick the shard refuses (a clock the job could never reach): the pulls after it are
  // refused with it, not held for a clock that will not come.
  body.clear();
  Header jump = Request(Op::Clock, 21, 9);
  jump.caught_up = true;
  body.push_back(EncodeHeader(jump));
  dense_pull(&body, 22, 9, 0);
  ASSERT_TRUE(peer.Send(StepOf(20, 9, 2, std::move(body))));
  parts = PartsOf(peer, 2);
  ASSERT_EQ(parts.size(), 2u);
  EXPECT_NE(parts[0].status, StatusCode::kOk);
  EXPECT_NE(parts[1].status, StatusCode::kOk);
  EXPECT_NE(parts[1].message.find("the tick before it in this Step failed"), std::string::npos)
      << parts[1].message;
}

TEST(StepTest, APushPullOfADenseTensorReadsBackEveryChunkAfterItsUpdate) {
  // Two shards, chunks of 1024 floats (server.frame_bytes 4096): 5000 elements make several
  // chunks per shard, each pulled right behind its push.
  TestCluster cluster(2, 1,
                      "  - name: w\n    kind: dense\n    shape: [5000]\n"
                      "    init: {kind: constant, value: 1.0}\n    optimizer: {kind: sgd, lr: 0.5}\n",
                      "server: {frame_bytes: 4096}\n");
  ASSERT_TRUE(cluster.Start());
  auto c = cluster.Connect(0);
  ASSERT_NE(c, nullptr);
  std::vector<float> grad(5000), out(5000, -7.0f), again(5000);
  for (size_t i = 0; i < grad.size(); ++i) grad[i] = static_cast<float>(i % 17) * 0.25f;
  for (int round = 1; round <= 2; ++round) {
    auto t = c->PushPullDenseAsync(0, grad, out.data());
    ASSERT_TRUE(t.ok()) << t.status().ToString();
    ASSERT_TRUE(c->Wait(*t).ok());
    for (size_t i = 0; i < out.size(); ++i) {
      ASSERT_EQ(out[i], 1.0f - round * 0.5f * grad[i]) << "element " << i << ", round " << round;
    }
  }
  ASSERT_TRUE(c->PullDense(0, again.data()).ok());
  EXPECT_EQ(again, out);
}

}  // namespace
}  // namespace parasol
