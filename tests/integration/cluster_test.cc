// Real `parasol server` processes on loopback, driven through PsClient.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <thread>
#include <vector>

#include "common/hash.hpp"
#include "common/initializer.hpp"
#include "tests/support/test_cluster.hpp"

namespace parasol {
namespace {

using testing::TestCluster;

constexpr const char* kTables =
    "  - name: emb\n"
    "    kind: sparse\n"
    "    dim: 16\n"
    "    init: {kind: uniform, scale: 0.05}\n"
    "    optimizer: {kind: sgd, lr: 0.5}\n"
    "  - name: mlp\n"
    "    kind: dense\n"
    "    shape: [301, 37]\n"
    "    init: {kind: normal, stddev: 0.1}\n"
    "    optimizer: {kind: sgd, lr: 0.25}\n";

constexpr uint32_t kDim = 16;
constexpr size_t kKeys = 100000;

// The gradient worker `w` pushes for `key`, element d, in round `round`.
float Grad(uint32_t w, uint64_t key, uint32_t d, int round) {
  const uint64_t h = SplitMix64(key * 31 + d * 7 + w * 1000003 + round * 998244353);
  return static_cast<float>(static_cast<double>(h >> 40) / 16777216.0 - 0.5);
}

std::vector<uint64_t> MakeKeys(uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<uint64_t> keys(kKeys);
  for (auto& k : keys) k = rng();
  return keys;
}

class ClusterTest : public ::testing::TestWithParam<int> {};

TEST_P(ClusterTest, TwoWorkersPushAndPullEveryValueAsTheReferenceSays) {
  const int shards = GetParam();
  TestCluster cluster(shards, 2, kTables);
  ASSERT_TRUE(cluster.Start());
  const Manifest& m = cluster.manifest();
  const TableOptions& emb = m.tables[0];
  const TableOptions& mlp = m.tables[1];
  const uint64_t dense_n = mlp.NumElements();

  // Both workers use the same 10^5 keys; each list also repeats its first 1000 keys, so the
  // client must sum repeated keys' gradients.
  const std::vector<uint64_t> unique = MakeKeys(11);
  std::vector<uint64_t> keys = unique;
  keys.insert(keys.end(), unique.begin(), unique.begin() + 1000);
  constexpr int kRounds = 2;

  std::vector<std::string> errors(2);
  auto worker = [&](uint32_t w) {
    auto fail = [&](const std::string& what) { errors[w] += what + "\n"; };
    auto client = cluster.Connect(w);
    if (!client) return fail("no client");
    std::vector<float> rows(keys.size() * kDim);
    if (Status st = client->Barrier(1); !st.ok()) return fail(st.ToString());
    // Before any push: every row is its initial value.
    if (Status st = client->PullSparse(0, keys, rows.data()); !st.ok()) return fail(st.ToString());
    std::vector<float> init(kDim);
    for (size_t i = 0; i < keys.size(); ++i) {
      InitSparseRow(emb.init, emb.seed, keys[i], init);
      for (uint32_t d = 0; d < kDim; ++d) {
        if (rows[i * kDim + d] != init[d]) return fail("initial row differs at key index " +
                                                       std::to_string(i));
      }
    }
    if (Status st = client->Barrier(2); !st.ok()) return fail(st.ToString());
    std::vector<float> grads(keys.size() * kDim);
    std::vector<float> dense_grad(dense_n);
    for (int round = 0; round < kRounds; ++round) {
      for (size_t i = 0; i < keys.size(); ++i) {
        for (uint32_t d = 0; d < kDim; ++d) grads[i * kDim + d] = Grad(w, keys[i], d, round);
      }
      for (uint64_t e = 0; e < dense_n; ++e) dense_grad[e] = Grad(w, e, 0, round);
      // Both pushes in flight at once.
      auto t1 = client->PushSparseAsync(0, keys, grads);
      auto t2 = client->PushDenseAsync(1, dense_grad);
      if (!t1.ok() || !t2.ok()) return fail("async push refused");
      if (Status st = client->Wait(*t1); !st.ok()) return fail(st.ToString());
      if (Status st = client->Wait(*t2); !st.ok()) return fail(st.ToString());
    }
    if (Status st = client->Barrier(3); !st.ok()) return fail(st.ToString());
  };
  std::thread a(worker, 0), b(worker, 1);
  a.join();
  b.join();
  ASSERT_EQ(errors[0], "");
  ASSERT_EQ(errors[1], "");

  // Reference: initial value minus lr times every gradient pushed, in double precision.
  auto client = cluster.Connect(0);
  ASSERT_NE(client, nullptr);
  std::vector<float> rows(unique.size() * kDim);
  ASSERT_TRUE(client->PullSparse(0, unique, rows.data()).ok());
  std::vector<float> init(kDim);
  double worst = 0;
  for (size_t i = 0; i < unique.size(); ++i) {
    InitSparseRow(emb.init, emb.seed, unique[i], init);
    const int copies = i < 1000 ? 2 : 1;
    for (uint32_t d = 0; d < kDim; ++d) {
      double want = init[d];
      for (int round = 0; round < kRounds; ++round) {
        for (uint32_t w = 0; w < 2; ++w) want -= emb.optimizer.lr * copies * Grad(w, unique[i], d, round);
      }
      worst = std::max(worst, std::abs(want - rows[i * kDim + d]));
    }
  }
  EXPECT_LT(worst, 1e-5) << "sparse rows differ from the reference";

  std::vector<float> dense(dense_n);
  ASSERT_TRUE(client->PullDense(1, dense.data()).ok());
  std::vector<float> dense_init(dense_n);
  InitDenseRange(mlp.init, mlp.seed, 0, dense_init);
  worst = 0;
  for (uint64_t e = 0; e < dense_n; ++e) {
    double want = dense_init[e];
    for (int round = 0; round < kRounds; ++round) {
      for (uint32_t w = 0; w < 2; ++w) want -= mlp.optimizer.lr * Grad(w, e, 0, round);
    }
    worst = std::max(worst, std::abs(want - dense[e]));
  }
  EXPECT_LT(worst, 1e-5) << "dense tensor differs from the reference";

  // Every shard holds part of the rows, and together exactly the distinct keys.
  auto stats = client->Stats();
  ASSERT_TRUE(stats.ok()) << stats.status().ToString();
  ASSERT_EQ(stats->size(), static_cast<size_t>(shards));
  for (const std::string& s : *stats) EXPECT_NE(s.find("\"bad_messages\":0"), std::string::npos) << s;
}

INSTANTIATE_TEST_SUITE_P(Shards, ClusterTest, ::testing::Values(2, 3));

// Pulls `keys` and the dense table from a fresh cluster of `shards` shards.
void PullFresh(int shards, const std::vector<uint64_t>& keys, std::vector<float>* rows,
               std::vector<float>* dense) {
  TestCluster cluster(shards, 1, kTables);
  ASSERT_TRUE(cluster.Start());
  auto client = cluster.Connect(0);
  ASSERT_NE(client, nullptr);
  rows->resize(keys.size() * kDim);
  ASSERT_TRUE(client->PullSparse(0, keys, rows->data()).ok());
  dense->resize(cluster.manifest().tables[1].NumElements());
  ASSERT_TRUE(client->PullDense(1, dense->data()).ok());
}

TEST(ClusterInitTest, OneAndThreeShardsReturnIdenticalInitialRows) {
  std::vector<uint64_t> keys = MakeKeys(5);
  keys.resize(20000);
  std::vector<float> rows1, dense1, rows3, dense3;
  PullFresh(1, keys, &rows1, &dense1);
  PullFresh(3, keys, &rows3, &dense3);
  ASSERT_EQ(rows1.size(), rows3.size());
  EXPECT_TRUE(rows1 == rows3) << "sparse initial rows depend on the shard count";
  EXPECT_TRUE(dense1 == dense3) << "dense initial values depend on the shard count";
}

TEST(ClusterHandshakeTest, AWorkerWithADifferentManifestIsRefused) {
  TestCluster cluster(2, 1, kTables);
  ASSERT_TRUE(cluster.Start());
  Manifest other = cluster.manifest();
  other.tables[0].dim = 8;
  auto client = PsClient::Connect(other, 0);
  ASSERT_FALSE(client.ok());
  EXPECT_EQ(client.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(client.status().message().find("manifest mismatch"), std::string::npos)
      << client.status().message();
  // The shard says so too.
  std::string log;
  for (int i = 0; i < 100 && log.find("manifest mismatch") == std::string::npos; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    log = cluster.ServerLog(0);
  }
  EXPECT_NE(log.find("manifest mismatch"), std::string::npos) << log;
}

TEST(ClusterHandshakeTest, AMissingShardIsReportedAfterTheConnectTimeout) {
  TestCluster cluster(2, 1, kTables);
  // Start nothing: every shard is missing.
  Manifest m = cluster.manifest();
  m.cluster.connect_timeout_ms = 600;
  auto client = PsClient::Connect(m, 0);
  ASSERT_FALSE(client.ok());
  EXPECT_EQ(client.status().code(), StatusCode::kTimeout);
  EXPECT_NE(client.status().message().find(m.cluster.servers[0].ToString()), std::string::npos)
      << client.status().message();
}

TEST(ClusterClientTest, WrongGradientSizeIsRefusedByTheClient) {
  TestCluster cluster(1, 1, kTables);
  ASSERT_TRUE(cluster.Start());
  auto client = cluster.Connect(0);
  ASSERT_NE(client, nullptr);
  std::vector<uint64_t> keys = {1, 2, 3};
  std::vector<float> grads(3 * kDim - 1);
  Status st = client->PushSparse(0, keys, grads);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_FALSE(client->PullDense(0, grads.data()).ok());  // table 0 is sparse
  EXPECT_EQ(client->TableId("nope").status().code(), StatusCode::kNotFound);
}

}  // namespace
}  // namespace parasol

namespace parasol {
namespace {

// Keys the caller deduplicated already are only split by shard (AssumeUniqueKeys): the push
// lands on the same rows as the hashing path would (checked against SGD's rule, row by row, over
// three shards), and the pull returns what the hashing path returns.
TEST(ClusterUniqueKeysTest, TheNoHashingPathEqualsTheHashingOne) {
  TestCluster cluster(3, 2, kTables);
  ASSERT_TRUE(cluster.Start());
  auto a = cluster.Connect(0), b = cluster.Connect(1);
  ASSERT_TRUE(a && b);
  b->AssumeUniqueKeys(true);
  std::vector<uint64_t> keys;
  for (uint64_t k = 0; k < 500; ++k) keys.push_back(k * 2654435761u + 7);
  std::vector<float> grads(keys.size() * kDim);
  for (size_t i = 0; i < grads.size(); ++i) grads[i] = 0.001f * static_cast<float>(i % 97 + 1);
  std::vector<float> before(keys.size() * kDim);
  ASSERT_TRUE(a->PullSparse(0, keys, before.data()).ok());
  ASSERT_TRUE(b->PushSparse(0, keys, grads).ok());  // no hashing
  std::vector<float> via_a(keys.size() * kDim), via_b(keys.size() * kDim);
  ASSERT_TRUE(a->PullSparse(0, keys, via_a.data()).ok());
  ASSERT_TRUE(b->PullSparse(0, keys, via_b.data()).ok());  // no hashing
  EXPECT_EQ(via_a, via_b);
  for (size_t i = 0; i < via_a.size(); ++i) {
    ASSERT_FLOAT_EQ(via_a[i], static_cast<float>(before[i] - 0.5 * grads[i])) << "float " << i;
  }
}

}  // namespace
}  // namespace parasol

#include "common/half.hpp"
#include "server/optimizer.hpp"
#include "tests/support/json_figures.hpp"

namespace parasol {
namespace {

// A dense tensor stored in bf16 (adagrad state in f16) on 2 shards with 2 engine threads each,
// pushed in frames of 4 KiB (so engines split every push): every element pulled equals the
// reference, the f32 step on the stored values rounded to the dtypes (to nearest), and each
// shard holds its slice in 2 + 2 bytes an element.
TEST(ClusterDtypeTest, ASixteenBitDenseTableServesTheRoundedReference) {
  constexpr const char* kDense16 =
      "  - name: mlp\n"
      "    kind: dense\n"
      "    shape: [301, 37]\n"
      "    init: {kind: normal, stddev: 0.1}\n"
      "    optimizer: {kind: adagrad, lr: 0.05}\n"
      "    dtype: bf16\n"
      "    state_dtype: f16\n";
  TestCluster cluster(2, 1, kDense16, "server: {engine_threads: 2, frame_bytes: 4KiB}\n");
  ASSERT_TRUE(cluster.Start());
  const TableOptions& mlp = cluster.manifest().tables[0];
  const uint64_t n = mlp.NumElements();
  auto client = cluster.Connect(0);
  ASSERT_NE(client, nullptr);

  // The reference, element by element.
  const Optimizer opt(mlp.optimizer);
  std::vector<float> w(n), acc(n);
  InitDenseRange(mlp.init, mlp.seed, 0, w);
  float* arrays[1] = {acc.data()};
  opt.InitState(w.data(), opt.DenseState(arrays, 0), static_cast<uint32_t>(n));
  auto round = [&] {
    for (uint64_t e = 0; e < n; ++e) {
      w[e] = Bf16ToF32(F32ToBf16(w[e]));
      acc[e] = F16ToF32(F32ToF16(acc[e]));
    }
  };
  round();
  std::vector<float> got(n), grad(n);
  for (int step = 0; step < 4; ++step) {
    ASSERT_TRUE(client->PullDense(0, got.data()).ok());
    for (uint64_t e = 0; e < n; ++e) {
      ASSERT_EQ(got[e], w[e]) << "step " << step << " element " << e;
    }
    for (uint64_t e = 0; e < n; ++e) grad[e] = Grad(0, e, 0, step);
    ASSERT_TRUE(client->PushDense(0, grad).ok());
    opt.Apply(w.data(), opt.DenseState(arrays, 0), reinterpret_cast<const std::byte*>(grad.data()),
              n, 1.0);
    round();
  }
  ASSERT_TRUE(client->PullDense(0, got.data()).ok());
  for (uint64_t e = 0; e < n; ++e) ASSERT_EQ(got[e], w[e]) << "element " << e;

  auto stats = client->Stats();
  ASSERT_TRUE(stats.ok()) << stats.status().ToString();
  uint64_t elements = 0;
  for (const std::string& s : *stats) {
    const Json t = testing::ParseJson(s)["tables"][0];
    const uint64_t slice = t["slice_end"].get<uint64_t>() - t["slice_begin"].get<uint64_t>();
    EXPECT_EQ(t["bytes"].get<uint64_t>(), slice * 4) << s;
    elements += slice;
  }
  EXPECT_EQ(elements, n);
}

}  // namespace
}  // namespace parasol
