#include "server/worker_key_binding.hpp"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <filesystem>

#include "common/curve_keys.hpp"

namespace parasol {
namespace {

// Stand-ins for Z85 public keys: Check() compares them as text.
const std::string kWorker0 = "worker-zero-public-key";
const std::string kWorker1 = "worker-one-public-key";
const std::string kTool = "tool-public-key";
constexpr uint32_t kObserver = 0xffffffffu;

Header Request(Op op, uint32_t worker_id) {
  Header h;
  h.op = op;
  h.worker_id = worker_id;
  return h;
}

WorkerKeyBinding TwoWorkers() { return WorkerKeyBinding({kWorker0, kWorker1}); }

TEST(WorkerKeyBindingTest, OffPassesEveryRequest) {
  WorkerKeyBinding off;
  EXPECT_FALSE(off.enabled());
  EXPECT_TRUE(off.Check(Request(Op::PushSparse, 0), nullptr).ok());
  EXPECT_TRUE(off.Check(Request(Op::Clock, 1), kTool.c_str()).ok());
}

TEST(WorkerKeyBindingTest, AWorkerKeyActsAsItsOwnWorker) {
  const WorkerKeyBinding b = TwoWorkers();
  EXPECT_TRUE(b.Check(Request(Op::PushSparse, 0), kWorker0.c_str()).ok());
  EXPECT_TRUE(b.Check(Request(Op::Clock, 1), kWorker1.c_str()).ok());
}

TEST(WorkerKeyBindingTest, AWorkerKeyMayNotActAsAnotherWorker) {
  const Status st = TwoWorkers().Check(Request(Op::PushSparse, 0), kWorker1.c_str());
  ASSERT_EQ(st.code(), StatusCode::kFailedPrecondition) << st.ToString();
  EXPECT_EQ(st.message(),
            "PushSparse as worker 0 refused: this connection's CURVE key is not worker 0's key "
            "(security.worker_keys[0]); it is worker 1's key");
}

TEST(WorkerKeyBindingTest, AToolKeyMayNotActAsAWorker) {
  const Status st = TwoWorkers().Check(Request(Op::Barrier, 1), kTool.c_str());
  ASSERT_EQ(st.code(), StatusCode::kFailedPrecondition) << st.ToString();
  EXPECT_NE(st.message().find("Barrier as worker 1 refused: this connection's CURVE key is not "
                              "worker 1's key"),
            std::string::npos)
      << st.message();
  EXPECT_NE(st.message().find("a tool key (security.allowed_clients)"), std::string::npos)
      << st.message();
}

TEST(WorkerKeyBindingTest, AToolKeyActsAsAnObserver) {
  const WorkerKeyBinding b = TwoWorkers();
  EXPECT_TRUE(b.Check(Request(Op::Stats, kObserver), kTool.c_str()).ok());
  EXPECT_TRUE(b.Check(Request(Op::Shutdown, 2), kTool.c_str()).ok());  // first id past the job
}

TEST(WorkerKeyBindingTest, AWorkerKeyMayNotActAsAnObserver) {
  const Status st = TwoWorkers().Check(Request(Op::Shutdown, kObserver), kWorker1.c_str());
  ASSERT_EQ(st.code(), StatusCode::kFailedPrecondition) << st.ToString();
  EXPECT_EQ(st.message(),
            "Shutdown as worker 4294967295 refused: this connection's CURVE key is worker 1's "
            "key (security.worker_keys[1]), which may act only as worker 1");
}

TEST(WorkerKeyBindingTest, AMessageWithoutAKeyIsRefused) {
  const WorkerKeyBinding b = TwoWorkers();
  for (const char* none : {static_cast<const char*>(nullptr), ""}) {
    for (uint32_t id : {0u, kObserver}) {
      const Status st = b.Check(Request(Op::PullSparse, id), none);
      EXPECT_EQ(st.code(), StatusCode::kFailedPrecondition) << st.ToString();
      EXPECT_NE(st.message().find("carries no CURVE key"), std::string::npos) << st.message();
    }
  }
}

class WorkerKeyBindingLoadTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!CurveAvailable()) GTEST_SKIP() << "this libzmq has no CURVE support";
    std::string tmpl = (std::filesystem::temp_directory_path() / "parasol-keys-XXXXXX").string();
    ASSERT_NE(::mkdtemp(tmpl.data()), nullptr);
    dir_ = tmpl;
    for (const char* name : {"w0", "w1"}) {
      auto k = GenerateCurveKeyPair();
      ASSERT_TRUE(k.ok());
      ASSERT_TRUE(WriteCurveKeyPair(dir_, name, *k).ok());
      public_keys_.push_back(k->public_key);
    }
    security_.curve = true;
    security_.worker_keys = {dir_ + "/w0", dir_ + "/w1"};
  }
  void TearDown() override {
    if (!dir_.empty()) std::filesystem::remove_all(dir_);
  }

  std::string dir_;
  std::vector<std::string> public_keys_;
  SecurityOptions security_;
};

TEST_F(WorkerKeyBindingLoadTest, ReadsEachWorkersPublicKeyInRankOrder) {
  Result<WorkerKeyBinding> b = WorkerKeyBinding::Load(security_);
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  EXPECT_TRUE(b->enabled());
  EXPECT_EQ(b->keys(), public_keys_);
  EXPECT_TRUE(b->Check(Request(Op::PushDense, 1), public_keys_[1].c_str()).ok());
  EXPECT_FALSE(b->Check(Request(Op::PushDense, 0), public_keys_[1].c_str()).ok());
}

TEST_F(WorkerKeyBindingLoadTest, IsOffWithoutWorkerKeysOrWithoutCurve) {
  SecurityOptions none = security_;
  none.worker_keys.clear();
  Result<WorkerKeyBinding> b = WorkerKeyBinding::Load(none);
  ASSERT_TRUE(b.ok());
  EXPECT_FALSE(b->enabled());
  SecurityOptions plain = security_;
  plain.curve = false;
  b = WorkerKeyBinding::Load(plain);
  ASSERT_TRUE(b.ok());
  EXPECT_FALSE(b->enabled());
}

TEST_F(WorkerKeyBindingLoadTest, TwoWorkersSharingAKeyAreRefused) {
  security_.worker_keys = {dir_ + "/w0", dir_ + "/w1", dir_ + "/w0"};
  Result<WorkerKeyBinding> b = WorkerKeyBinding::Load(security_);
  ASSERT_FALSE(b.ok());
  EXPECT_EQ(b.status().message(),
            "security.worker_keys[0] and [2] hold the same public key; each worker needs its "
            "own key pair");
}

TEST_F(WorkerKeyBindingLoadTest, AMissingKeyFileIsNamed) {
  security_.worker_keys[1] = dir_ + "/missing";
  Result<WorkerKeyBinding> b = WorkerKeyBinding::Load(security_);
  ASSERT_FALSE(b.ok());
  EXPECT_EQ(b.status().code(), StatusCode::kNotFound);
  EXPECT_NE(b.status().message().find(dir_ + "/missing.pub"), std::string::npos)
      << b.status().message();
}

TEST(WorkerKeyBindingTest, AWorkerKeyMayNotStopOrCheckpointTheJobEvenAsItself) {
  const WorkerKeyBinding b = TwoWorkers();
  EXPECT_TRUE(b.Check(Request(Op::PushSparse, 1), kWorker1.c_str()).ok());
  for (Op op : {Op::Shutdown, Op::Checkpoint}) {
    const Status st = b.Check(Request(op, 1), kWorker1.c_str());
    EXPECT_FALSE(st.ok());
    EXPECT_NE(st.message().find("a worker's key may not ask for"), std::string::npos)
        << st.ToString();
  }
}

TEST(WorkerKeyBindingTest, OnlyAnOperatorKeySendsTheOperatorsRequests) {
  const std::string op = "operator-public-key";
  Header scale = Request(Op::Membership, kObserver);
  scale.shard_count = 1;
  const std::vector<Header> control = {Request(Op::Checkpoint, kObserver),
                                       Request(Op::Shutdown, kObserver),
                                       Request(Op::Migrate, kObserver), scale};
  for (const WorkerKeyBinding& b :
       {WorkerKeyBinding({kWorker0, kWorker1}, {op}), WorkerKeyBinding({}, {op})}) {
    EXPECT_TRUE(b.enabled());
    for (const Header& h : control) {
      EXPECT_TRUE(b.Check(h, op.c_str()).ok()) << OpName(h.op);
      const Status tool = b.Check(h, kTool.c_str());
      EXPECT_EQ(tool.code(), StatusCode::kFailedPrecondition) << OpName(h.op);
      EXPECT_NE(tool.message().find("is an operator's request, and this connection's CURVE key "
                                    "is not one of security.operator_keys"),
                std::string::npos)
          << tool.message();
      // A worker's own key, as itself, may not either.
      Header as_worker = h;
      as_worker.worker_id = 0;
      EXPECT_FALSE(b.Check(as_worker, kWorker0.c_str()).ok()) << OpName(h.op);
    }
    // Stats and reads from any admitted key; a worker's data requests from the workers' keys.
    EXPECT_TRUE(b.Check(Request(Op::Stats, kObserver), kTool.c_str()).ok());
    EXPECT_TRUE(b.Check(Request(Op::PullSparse, kObserver), op.c_str()).ok());
    EXPECT_TRUE(b.Check(Request(Op::PushSparse, 0), kWorker0.c_str()).ok());
  }
  // An operator key is no worker, with worker keys or without them.
  for (const WorkerKeyBinding& b : {WorkerKeyBinding({kWorker0, kWorker1}, {op}),
                                    WorkerKeyBinding({}, {op}, /*max_workers=*/2)}) {
    const Status st = b.Check(Request(Op::PushSparse, 1), op.c_str());
    EXPECT_EQ(st.code(), StatusCode::kFailedPrecondition);
    EXPECT_NE(st.message().find("an operator key acts only as a tool"), std::string::npos)
        << st.message();
  }
}

}  // namespace
}  // namespace parasol
