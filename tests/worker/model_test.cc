// The whole LR and DLRM models: every gradient against finite differences of the loss.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>
#include <random>

#include "common/key_index.hpp"
#include "worker/data_reader.hpp"
#include "tests/support/model_step.hpp"
#include "worker/model.hpp"

namespace parasol {
namespace {

Manifest ModelManifest(const std::string& model) {
  Result<Manifest> m =
      ParseManifest("cluster:\n  servers: [127.0.0.1:1]\nmodel:\n" + model, "model.yaml");
  EXPECT_TRUE(m.ok()) << m.status().ToString();
  return *m;
}

// A small Criteo batch with repeated categorical values (so rows are shared).
Batch MakeBatch(uint32_t n, uint64_t seed, uint32_t ids = 3) {
  std::mt19937_64 rng(seed);
  Batch b;
  b.Clear();
  for (uint32_t i = 0; i < n; ++i) {
    std::string line = std::to_string(rng() % 2);
    for (int d = 0; d < 13; ++d) {
      line += '\t';
      line += std::to_string(rng() % 20);
    }
    for (int c = 0; c < 26; ++c) {
      line += '\t';
      line += std::to_string(rng() % ids);
    }
    EXPECT_TRUE(ParseCriteoRow(line, true, &b).ok());
  }
  return b;
}

void CheckModelGradients(const std::string& model_yaml) {
  const Manifest m = ModelManifest(model_yaml);
  auto backend = MakeCpuBackend();
  const Batch batch = MakeBatch(6, 3);
  auto model = Model::Create(m, backend.get(), 6);
  ASSERT_TRUE(model.ok()) << model.status().ToString();
  Model& net = **model;
  const BatchKeys p = DeduplicateKeys(batch.keys);
  std::mt19937_64 rng(11);
  std::uniform_real_distribution<float> u(-0.3f, 0.3f);
  std::vector<float> rows(p.unique.size() * net.sparse_dim());
  for (auto& r : rows) r = u(rng);
  std::vector<std::vector<float>> params = DenseShapes(net);
  for (auto& t : params) {
    for (auto& v : t) v = u(rng);
  }
  auto loss = [&] {
    EXPECT_TRUE(RunModelStep(net, batch, p, rows, params, /*train=*/false).ok());
    return net.Loss();
  };
  ASSERT_TRUE(RunModelStep(net, batch, p, rows, params, /*train=*/true).ok());
  const std::vector<float> row_grads(net.RowGrads().begin(), net.RowGrads().end());
  std::vector<std::vector<float>> dense_grads;
  for (auto g : net.DenseGrads()) dense_grads.emplace_back(g.begin(), g.end());
  ASSERT_EQ(dense_grads.size(), params.size());
  const double base = loss();
  size_t kinks = 0, checked = 0;
  auto check = [&](std::vector<float>& x, const std::vector<float>& g, const std::string& what) {
    for (size_t i = 0; i < x.size(); ++i) {
      const float keep = x[i];
      const float h = 1e-2f;
      x[i] = keep + h;
      const double up = loss();
      x[i] = keep - h;
      const double down = loss();
      x[i] = keep;
      const double numeric = (up - down) / (2 * h);
      const double tol = 1e-3 + 3e-2 * std::abs(numeric);
      ++checked;
      // A ReLU switching inside [x - h, x + h] makes the one-sided slopes differ: no gradient
      // to compare there.
      if (std::abs((up - base) / h - (base - down) / h) > 2 * tol) {
        ++kinks;
        continue;
      }
      ASSERT_NEAR(g[i], numeric, tol) << what << " [" << i << "]";
    }
  };
  check(rows, row_grads, "rows");
  for (size_t t = 0; t < dense_grads.size(); ++t) {
    check(params[t], dense_grads[t], "dense table " + std::to_string(t));
  }
  EXPECT_LT(kinks * 20, checked) << kinks << " of " << checked << " elements sat on a kink";
}

TEST(ModelTest, DlrmGradientsMatchFiniteDifferences) {
  CheckModelGradients(
      "  kind: dlrm\n  embedding_dim: 4\n  bottom: [5, 4]\n  top: [6, 1]\n");
}

TEST(ModelTest, LrGradientsMatchFiniteDifferences) { CheckModelGradients("  kind: lr\n"); }

TEST(ModelTest, DlrmSmallHasTheDocumentedShapes) {
  const Manifest m = ModelManifest(
      "  kind: dlrm\n  embedding_dim: 16\n  bottom: [64, 16]\n  top: [64, 1]\n");
  auto backend = MakeCpuBackend();
  auto model = Model::Create(m, backend.get(), 8);
  ASSERT_TRUE(model.ok());
  const auto params = DenseShapes(**model);
  ASSERT_EQ(params.size(), 8u);
  EXPECT_EQ(params[0].size(), 64u * 13);   // bottom 13 -> 64
  EXPECT_EQ(params[2].size(), 16u * 64);   // bottom 64 -> 16
  EXPECT_EQ(params[4].size(), 64u * 367);  // top 367 -> 64
  EXPECT_EQ(params[6].size(), 64u);        // top 64 -> 1
  EXPECT_EQ((*model)->sparse_dim(), 16u);
  EXPECT_EQ(m.tables[m.FindTable("model.embeddings")].optimizer.kind,
            OptimizerOptions::Kind::kAdagrad);
  EXPECT_EQ(m.tables[m.FindTable("model.top.0.weight")].optimizer.kind,
            OptimizerOptions::Kind::kAdam);
  EXPECT_NEAR(m.tables[m.FindTable("model.top.0.weight")].init.scale, std::sqrt(6.0 / (367 + 64)),
              1e-12);
  EXPECT_EQ(m.tables[m.FindTable("model.top.0.bias")].init.kind, InitOptions::Kind::kZeros);
}

// What a step moves between host and device (the CPU backend counts its copies as a device
// backend makes them): one upload of the slot's used part, one download, one synchronisation.
// The upload holds the counts of rows, the dense weights, the padded features, the labels, the
// key indices and the rows (the row index is built where the gradients are summed); the rows
// are last, so it grows by exactly the rows of each extra key.
TEST(ModelTest, DlrmStepTransferPlan) {
  const Manifest m = ModelManifest(
      "  kind: dlrm\n  embedding_dim: 16\n  bottom: [64, 16]\n  top: [64, 1]\n");
  auto backend = MakeCpuBackend();
  const uint32_t max_batch = 256;
  auto model = Model::Create(m, backend.get(), max_batch);
  ASSERT_TRUE(model.ok());
  const std::vector<std::vector<float>> dense = DenseShapes(**model);
  size_t dense_bytes = 0;
  for (const auto& t : dense) dense_bytes += t.size() * sizeof(float);
  const size_t bags = max_batch * 26;
  // Fixed part: counts, weights, features (16 per sample), labels, indices; each of the 13
  // regions before the rows starts on a 256-byte boundary.
  const size_t fixed = 8 + dense_bytes + max_batch * 16 * 4 + max_batch * 4 + bags * 4;
  size_t last_upload = 0, last_unique = 0;
  for (uint32_t ids : {3u, 50u}) {
    const Batch batch = MakeBatch(max_batch, 5, ids);
    const BatchKeys keys = DeduplicateKeys(batch.keys);
    if (last_unique) { ASSERT_GT(keys.unique.size(), last_unique); }
    const std::vector<float> rows(keys.unique.size() * 16, 0.01f);
    const TransferCounts before = backend->transfers();
    ASSERT_TRUE(RunModelStep(**model, batch, keys, rows, dense, /*train=*/true).ok());
    const TransferCounts after = backend->transfers();
    EXPECT_EQ(after.uploads - before.uploads, 1u);
    EXPECT_EQ(after.downloads - before.downloads, 1u);
    EXPECT_EQ(after.syncs - before.syncs, 1u);
    const size_t up = after.upload_bytes - before.upload_bytes;
    const size_t rows_bytes = keys.unique.size() * 16 * 4;
    EXPECT_GE(up, fixed + rows_bytes);
    EXPECT_LE(up, fixed + rows_bytes + 13 * 256);
    // Down: probabilities, the loss, the dense gradients, the row gradients.
    const size_t down = after.download_bytes - before.download_bytes;
    const size_t want_down = max_batch * 4 + 8 + dense_bytes + rows_bytes;
    EXPECT_GE(down, want_down);
    EXPECT_LE(down, want_down + 12 * 256);
    if (last_upload) {
      EXPECT_EQ(up - last_upload, (keys.unique.size() - last_unique) * 16 * 4);
    }
    last_upload = up;
    last_unique = keys.unique.size();
  }
  // An evaluation step brings back only the probabilities and the loss.
  const Batch batch = MakeBatch(max_batch, 9);
  const BatchKeys keys = DeduplicateKeys(batch.keys);
  const TransferCounts before = backend->transfers();
  ASSERT_TRUE(RunModelStep(**model, batch, keys, std::vector<float>(keys.unique.size() * 16, 0.0f),
                           dense, /*train=*/false, 1)
                  .ok());
  const TransferCounts after = backend->transfers();
  EXPECT_EQ(after.downloads - before.downloads, 1u);
  EXPECT_LE(after.download_bytes - before.download_bytes, max_batch * 4 + 256 + 8);
}

TEST(ModelTest, DlrmRefusesLibsvmData) {
  Result<Manifest> m = ParseManifest(
      "cluster:\n  servers: [127.0.0.1:1]\nmodel: {kind: dlrm}\ndata: {format: libsvm}\n", "x.yaml");
  ASSERT_TRUE(m.ok());
  auto backend = MakeCpuBackend();
  auto model = Model::Create(*m, backend.get(), 8);
  ASSERT_FALSE(model.ok());
  EXPECT_NE(model.status().message().find("libsvm"), std::string::npos);
}

}  // namespace
}  // namespace parasol

namespace parasol {
namespace {

// dlrm-small's whole step with its kernels split over 2 and 3 compute threads (pinned or not):
// the loss and every gradient close to one thread's, and the same bits at every run with the
// same threads (a BSP run repeats itself bit for bit at a given worker.compute_threads).
TEST(ModelTest, DlrmStepOnComputeThreadsMatchesOneThread) {
  const Manifest m = ModelManifest(
      "  kind: dlrm\n  embedding_dim: 16\n  bottom: [64, 16]\n  top: [64, 1]\n");
  const uint32_t n = 1024;
  const Batch batch = MakeBatch(n, 7, 5000);
  const BatchKeys p = DeduplicateKeys(batch.keys);
  std::mt19937_64 rng(13);
  std::uniform_real_distribution<float> u(-0.1f, 0.1f);
  struct Outcome {
    double loss = 0;
    std::vector<float> rows;
    std::vector<std::vector<float>> dense;
  };
  auto run = [&](int threads, bool pin) {
    auto backend = MakeCpuBackend(1, threads, pin);
    auto model = Model::Create(m, backend.get(), n);
    EXPECT_TRUE(model.ok());
    Model& net = **model;
    std::mt19937_64 r(13);
    std::vector<float> rows(p.unique.size() * net.sparse_dim());
    for (auto& x : rows) x = u(r);
    std::vector<std::vector<float>> params = DenseShapes(net);
    for (auto& t : params) {
      for (auto& v : t) v = u(r);
    }
    EXPECT_TRUE(RunModelStep(net, batch, p, rows, params, /*train=*/true).ok());
    Outcome o;
    o.loss = net.Loss();
    o.rows.assign(net.RowGrads().begin(), net.RowGrads().end());
    for (const auto& g : net.DenseGrads()) o.dense.emplace_back(g.begin(), g.end());
    return o;
  };
  const Outcome one = run(1, false);
  ASSERT_TRUE(std::isfinite(one.loss));
  auto near = [](const std::vector<float>& a, const std::vector<float>& b) {
    if (a.size() != b.size()) return false;
    for (size_t i = 0; i < a.size(); ++i) {
      if (!(std::abs(a[i] - b[i]) <= 1e-6f + 1e-3f * std::abs(b[i]))) return false;
    }
    return true;
  };
  for (int threads : {2, 3}) {
    for (bool pin : {false, true}) {
      SCOPED_TRACE("threads " + std::to_string(threads) + (pin ? " pinned" : ""));
      const Outcome a = run(threads, pin), b = run(threads, pin);
      EXPECT_NEAR(a.loss, one.loss, 1e-9 * std::abs(one.loss) + 1e-9);
      EXPECT_TRUE(near(a.rows, one.rows));
      ASSERT_EQ(a.dense.size(), one.dense.size());
      for (size_t t = 0; t < a.dense.size(); ++t) EXPECT_TRUE(near(a.dense[t], one.dense[t])) << t;
      // Repeatable: the same bits.
      EXPECT_EQ(a.loss, b.loss);
      EXPECT_EQ(0, std::memcmp(a.rows.data(), b.rows.data(), a.rows.size() * sizeof(float)));
      for (size_t t = 0; t < a.dense.size(); ++t) {
        EXPECT_EQ(0, std::memcmp(a.dense[t].data(), b.dense[t].data(),
                                 a.dense[t].size() * sizeof(float)));
      }
    }
  }
}

}  // namespace
}  // namespace parasol
