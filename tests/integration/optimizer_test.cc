// Every optimizer through a real server, against a double-precision reference written here;
// admission, eviction and the memory figure of sparse tables.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstring>
#include <fstream>
#include <map>
#include <random>
#include <thread>

#include "common/initializer.hpp"
#include "tests/support/test_cluster.hpp"

namespace parasol {
namespace {

using testing::ResidentBytes;
using testing::TestCluster;

struct OptCase {
  const char* name;
  const char* sparse_yaml;  // the optimizer of the sparse table
  const char* dense_yaml;   // the optimizer of the dense table
};

// Reference state of one row (sparse) or one element run (dense), in double.
struct RefRow {
  std::vector<double> w, a, b;
  double row_acc = 0;
  std::vector<uint32_t> step;  // one per row (sparse) or per element (dense)
};

void RefInit(const OptimizerOptions& o, const std::vector<float>& w0, size_t steps, RefRow* r) {
  const size_t n = w0.size();
  r->w.assign(w0.begin(), w0.end());
  r->a.assign(n, 0.0);
  r->b.assign(n, 0.0);
  r->step.assign(steps, 0);
  using K = OptimizerOptions::Kind;
  if (o.kind == K::kAdagrad) r->a.assign(n, o.initial_accumulator);
  if (o.kind == K::kAdagradRowwise) r->row_acc = o.initial_accumulator;
  if (o.kind == K::kFtrl) {
    const double d = o.beta / o.alpha + o.l2;
    for (size_t i = 0; i < n; ++i) {
      const double w = w0[i];
      r->a[i] = w == 0 ? 0 : -(w * d + std::copysign(o.l1, w));
    }
  }
}

void RefApply(const OptimizerOptions& o, const std::vector<double>& grad, RefRow* r) {
  const size_t n = r->w.size();
  std::vector<double> g(n);
  for (size_t i = 0; i < n; ++i) g[i] = grad[i] + o.weight_decay * r->w[i];
  using K = OptimizerOptions::Kind;
  switch (o.kind) {
    case K::kSgd:
      for (size_t i = 0; i < n; ++i) r->w[i] -= o.lr * g[i];
      break;
    case K::kAdagrad:
      for (size_t i = 0; i < n; ++i) {
        r->a[i] += g[i] * g[i];
        r->w[i] -= o.lr * g[i] / (std::sqrt(r->a[i]) + o.eps);
      }
      break;
    case K::kAdagradRowwise: {
      double s = 0;
      for (double x : g) s += x * x;
      r->row_acc += s / n;
      for (size_t i = 0; i < n; ++i) r->w[i] -= o.lr * g[i] / (std::sqrt(r->row_acc) + o.eps);
      break;
    }
    case K::kAdam:
      for (size_t i = 0; i < n; ++i) {
        const uint32_t t = r->step.size() == 1 ? (i == 0 ? ++r->step[0] : r->step[0]) : ++r->step[i];
        r->a[i] = o.beta1 * r->a[i] + (1 - o.beta1) * g[i];
        r->b[i] = o.beta2 * r->b[i] + (1 - o.beta2) * g[i] * g[i];
        const double mh = r->a[i] / (1 - std::pow(o.beta1, t));
        const double vh = r->b[i] / (1 - std::pow(o.beta2, t));
        r->w[i] -= o.lr * mh / (std::sqrt(vh) + o.eps);
      }
      break;
    case K::kFtrl:
      for (size_t i = 0; i < n; ++i) {
        const double n_new = r->b[i] + g[i] * g[i];
        const double sigma = (std::sqrt(n_new) - std::sqrt(r->b[i])) / o.alpha;
        r->a[i] += g[i] - sigma * r->w[i];
        r->b[i] = n_new;
        const double z = r->a[i];
        r->w[i] = std::abs(z) <= o.l1
                      ? 0.0
                      : -(z - std::copysign(o.l1, z)) / ((o.beta + std::sqrt(n_new)) / o.alpha + o.l2);
      }
      break;
  }
}

// The server's layout of a sparse row: values, then state (see server/optimizer.hpp).
std::vector<double> SparseLayout(const OptimizerOptions& o, const RefRow& r) {
  std::vector<double> out = r.w;
  using K = OptimizerOptions::Kind;
  if (o.kind == K::kAdagrad) out.insert(out.end(), r.a.begin(), r.a.end());
  if (o.kind == K::kAdagradRowwise) out.push_back(r.row_acc);
  if (o.kind == K::kAdam || o.kind == K::kFtrl) {
    out.insert(out.end(), r.a.begin(), r.a.end());
    out.insert(out.end(), r.b.begin(), r.b.end());
  }
  return out;
}

void ExpectClose(double got, double want, const std::string& what) {
  EXPECT_LE(std::abs(got - want), 1e-5 * std::abs(want) + 1e-7)
      << what << ": got " << got << ", reference " << want;
}

class OptimizerTest : public ::testing::TestWithParam<OptCase> {};

TEST_P(OptimizerTest, FiftyPushesMatchTheDoublePrecisionReference) {
  const OptCase& c = GetParam();
  const std::string tables = std::string("  - name: emb\n    dim: 4\n    init: {kind: uniform, scale: 0.3}\n") +
                             "    optimizer: " + c.sparse_yaml + "\n" +
                             "  - name: w\n    kind: dense\n    shape: [3, 5]\n" +
                             "    init: {kind: normal, stddev: 0.2}\n    optimizer: " + c.dense_yaml + "\n";
  TestCluster cluster(2, 1, tables);
  ASSERT_TRUE(cluster.Start());
  auto client = cluster.Connect(0);
  ASSERT_NE(client, nullptr);
  const TableOptions& emb = cluster.manifest().tables[0];
  const TableOptions& dense = cluster.manifest().tables[1];
  const uint32_t dim = 4;
  const uint64_t dn = dense.NumElements();

  std::map<uint64_t, RefRow> rows;
  RefRow dref;
  std::vector<float> d0(dn);
  InitDenseRange(dense.init, dense.seed, 0, d0);
  RefInit(dense.optimizer, d0, dn, &dref);

  std::mt19937_64 rng(42);
  std::normal_distribution<float> gauss(0.0f, 1.0f);
  for (int step = 0; step < 50; ++step) {
    std::vector<uint64_t> keys(8);
    for (auto& k : keys) k = 1000 + rng() % 20;
    keys[7] = keys[0];  // a repeated key within one push: summed first
    std::vector<float> grads(keys.size() * dim);
    for (auto& g : grads) g = gauss(rng);
    ASSERT_TRUE(client->PushSparse(0, keys, grads).ok());
    std::map<uint64_t, std::vector<double>> summed;
    for (size_t i = 0; i < keys.size(); ++i) {
      auto& s = summed[keys[i]];
      s.resize(dim, 0.0);
      for (uint32_t d = 0; d < dim; ++d) s[d] += grads[i * dim + d];
    }
    for (auto& [k, g] : summed) {
      if (!rows.count(k)) {
        std::vector<float> w0(dim);
        InitSparseRow(emb.init, emb.seed, k, w0);
        RefInit(emb.optimizer, w0, 1, &rows[k]);
      }
      RefApply(emb.optimizer, g, &rows[k]);
    }
    std::vector<float> dg(dn);
    for (auto& g : dg) g = gauss(rng);
    ASSERT_TRUE(client->PushDense(1, dg).ok());
    RefApply(dense.optimizer, std::vector<double>(dg.begin(), dg.end()), &dref);
  }

  const uint32_t rf = client->RowFloats(0);
  std::vector<uint64_t> keys;
  for (const auto& [k, r] : rows) keys.push_back(k);
  std::vector<float> got(keys.size() * rf);
  ASSERT_TRUE(client->PullSparseWithState(0, keys, got.data()).ok());
  for (size_t i = 0; i < keys.size(); ++i) {
    const RefRow& r = rows[keys[i]];
    const std::vector<double> want = SparseLayout(emb.optimizer, r);
    for (size_t j = 0; j < want.size(); ++j) {
      ExpectClose(got[i * rf + j], want[j], "key " + std::to_string(keys[i]) + " float " + std::to_string(j));
    }
    if (emb.optimizer.kind == OptimizerOptions::Kind::kAdam) {
      uint32_t step;
      std::memcpy(&step, &got[i * rf + rf - 1], sizeof(step));
      EXPECT_EQ(step, r.step[0]) << "adam step of key " << keys[i];
    }
  }
  const uint32_t drf = client->RowFloats(1);
  std::vector<float> dgot(dn * drf);
  ASSERT_TRUE(client->PullDenseWithState(1, dgot.data()).ok());
  for (uint64_t e = 0; e < dn; ++e) {
    ExpectClose(dgot[e * drf], dref.w[e], "dense value " + std::to_string(e));
    if (drf >= 2 && dense.optimizer.kind != OptimizerOptions::Kind::kSgd) {
      ExpectClose(dgot[e * drf + 1], dref.a[e], "dense state 0 of " + std::to_string(e));
    }
    if (dense.optimizer.kind == OptimizerOptions::Kind::kAdam) {
      ExpectClose(dgot[e * drf + 2], dref.b[e], "dense state 1 of " + std::to_string(e));
      uint32_t step;
      std::memcpy(&step, &dgot[e * drf + 3], sizeof(step));
      EXPECT_EQ(step, 50u);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    All, OptimizerTest,
    ::testing::Values(
        OptCase{"sgd", "{kind: sgd, lr: 0.05, weight_decay: 0.01}", "{kind: sgd, lr: 0.05}"},
        OptCase{"adagrad", "{kind: adagrad, lr: 0.1, eps: 1e-8, initial_accumulator: 0.1}",
                "{kind: adagrad, lr: 0.1}"},
        OptCase{"adagrad_rowwise", "{kind: adagrad_rowwise, lr: 0.1, initial_accumulator: 0.01}",
                "{kind: adagrad, lr: 0.05, weight_decay: 0.001}"},
        OptCase{"adam", "{kind: adam, lr: 0.01, beta1: 0.8, beta2: 0.99}",
                "{kind: adam, lr: 0.02}"},
        OptCase{"ftrl", "{kind: ftrl, alpha: 0.1, beta: 1.0, l1: 0.05, l2: 0.01}",
                "{kind: ftrl, alpha: 0.2, beta: 0.5, l1: 0.01, l2: 0.1}"}),
    [](const ::testing::TestParamInfo<OptCase>& info) { return std::string(info.param.name); });

// Polls the shard's stats until `pred` holds (at most 10 s).
bool WaitForStats(PsClient& client, const std::function<bool(const std::string&)>& pred,
                  std::string* last) {
  for (int i = 0; i < 200; ++i) {
    auto s = client.Stats();
    if (s.ok()) {
      *last = (*s)[0];
      if (pred(*last)) return true;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return false;
}

TEST(AdmissionTest, ARowIsCreatedAtTheNthPushAndPullsSeeTheInitialValueUntilThen) {
  TestCluster cluster(1, 1,
                      "  - name: emb\n    dim: 2\n    init: {kind: constant, value: 1.0}\n"
                      "    optimizer: {kind: sgd, lr: 1.0}\n    admission: {min_count: 3}\n");
  ASSERT_TRUE(cluster.Start());
  auto client = cluster.Connect(0);
  ASSERT_NE(client, nullptr);
  const std::vector<uint64_t> key = {77};
  std::vector<float> row(2);
  for (int push = 1; push <= 2; ++push) {
    ASSERT_TRUE(client->PushSparse(0, key, std::vector<float>{0.25f, 0.5f}).ok());
    ASSERT_TRUE(client->PullSparse(0, key, row.data()).ok());
    EXPECT_EQ(row, (std::vector<float>{1.0f, 1.0f})) << "after push " << push;
  }
  auto stats = client->Stats();
  ASSERT_TRUE(stats.ok());
  EXPECT_NE((*stats)[0].find("\"rows\":0,"), std::string::npos) << (*stats)[0];
  EXPECT_NE((*stats)[0].find("\"pending_keys\":1,"), std::string::npos) << (*stats)[0];
  ASSERT_TRUE(client->PushSparse(0, key, std::vector<float>{0.25f, 0.5f}).ok());
  ASSERT_TRUE(client->PullSparse(0, key, row.data()).ok());
  EXPECT_EQ(row, (std::vector<float>{0.75f, 0.5f}));  // created at the 3rd push, which applies
  stats = client->Stats();
  EXPECT_NE((*stats)[0].find("\"rows\":1,"), std::string::npos) << (*stats)[0];
  EXPECT_NE((*stats)[0].find("\"admitted\":1,\"pushes_counted\":2"), std::string::npos)
      << (*stats)[0];
}

TEST(EvictionTest, RowsIdleForTtlClocksAreEvictedAndComeBackFresh) {
  TestCluster cluster(1, 1,
                      "  - name: emb\n    dim: 2\n    init: {kind: constant, value: 1.0}\n"
                      "    optimizer: {kind: sgd, lr: 1.0}\n    eviction: {ttl_clocks: 2}\n");
  ASSERT_TRUE(cluster.Start());
  auto client = cluster.Connect(0);
  ASSERT_NE(client, nullptr);
  std::vector<uint64_t> old_keys, new_keys;
  for (uint64_t k = 0; k < 100; ++k) old_keys.push_back(k);
  for (uint64_t k = 100; k < 150; ++k) new_keys.push_back(k);
  std::vector<float> g(100 * 2, 0.5f);
  ASSERT_TRUE(client->PushSparse(0, old_keys, g).ok());  // at clock 0
  ASSERT_TRUE(client->Tick().ok());  // clock 1
  g.resize(50 * 2);
  ASSERT_TRUE(client->PushSparse(0, new_keys, g).ok());  // at clock 1
  ASSERT_TRUE(client->Tick().ok());  // clock 2: old rows 2 clocks idle, new rows 1
  std::string last;
  EXPECT_TRUE(WaitForStats(*client, [](const std::string& s) {
    return s.find("\"evicted_ttl\":100") != std::string::npos;
  }, &last)) << last;
  EXPECT_NE(last.find("\"rows\":50,"), std::string::npos) << last;
  std::vector<float> row(2);
  ASSERT_TRUE(client->PullSparse(0, std::vector<uint64_t>{120}, row.data()).ok());
  EXPECT_EQ(row, (std::vector<float>{0.5f, 0.5f}));  // kept: updated at clock 1
  ASSERT_TRUE(client->PullSparse(0, std::vector<uint64_t>{7}, row.data()).ok());
  EXPECT_EQ(row, (std::vector<float>{1.0f, 1.0f}));  // evicted: back at its initial value
}

TEST(MemoryTest, StatsBytesAgreeWithResidentMemoryGrowth) {
  TestCluster cluster(1, 1,
                      "  - name: emb\n    dim: 16\n    optimizer: {kind: adagrad_rowwise}\n");
  ASSERT_TRUE(cluster.Start());
  auto client = cluster.Connect(0);
  ASSERT_NE(client, nullptr);
  std::vector<uint64_t> keys(20000);
  std::vector<float> out(keys.size() * 16);
  // Warm up the request path so its buffers are part of the baseline.
  for (size_t i = 0; i < keys.size(); ++i) keys[i] = (uint64_t{1} << 62) + i;
  ASSERT_TRUE(client->PullSparse(0, keys, out.data()).ok());
  const uint64_t before = ResidentBytes(cluster.server(0).pid());
  auto s0 = client->Stats();
  ASSERT_TRUE(s0.ok());
  for (uint64_t base = 0; base < 1000000; base += keys.size()) {
    for (size_t i = 0; i < keys.size(); ++i) keys[i] = base + i;
    ASSERT_TRUE(client->PullSparse(0, keys, out.data()).ok());
  }
  const uint64_t after = ResidentBytes(cluster.server(0).pid());
  auto s1 = client->Stats();
  ASSERT_TRUE(s1.ok());
  auto bytes_of = [](const std::string& s) {
    const size_t p = s.find("\"bytes\":");
    return std::stoull(s.substr(p + 8));
  };
  const double stats_growth = static_cast<double>(bytes_of((*s1)[0])) - bytes_of((*s0)[0]);
  const double rss_growth = static_cast<double>(after) - before;
  EXPECT_NE((*s1)[0].find("\"rows\":1020000,"), std::string::npos) << (*s1)[0];
  EXPECT_LT(std::abs(rss_growth - stats_growth) / stats_growth, 0.2)
      << "stats say " << stats_growth << " bytes, resident memory grew " << rss_growth;
}

}  // namespace
}  // namespace parasol
