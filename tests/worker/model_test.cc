// The whole LR and DLRM models: every gradient against finite differences of the loss.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "common/key_index.hpp"
#include "worker/data_reader.hpp"
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
Batch MakeBatch(uint32_t n, uint64_t seed) {
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
      line += std::to_string(rng() % 3);
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
  for (auto& t : net.DenseParams()) {
    for (auto& v : t) v = u(rng);
  }
  auto loss = [&] {
    return net.Forward(batch, rows.data(), static_cast<uint32_t>(p.unique.size()),
                       p.indices.data());
  };
  loss();
  std::vector<float> row_grads(rows.size());
  net.Backward(row_grads.data());
  const auto dense_grads = net.DenseGrads();
  ASSERT_EQ(dense_grads.size(), net.DenseParams().size());
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
    check(net.DenseParams()[t], dense_grads[t], "dense table " + std::to_string(t));
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
  const auto& params = (*model)->DenseParams();
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
