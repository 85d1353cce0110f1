// Every layer's backward pass against finite differences of its forward pass (CPU backend).
#include <gtest/gtest.h>
#include <pthread.h>
#include <sched.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "kernels/embedding_pool.hpp"
#include "worker/backend.hpp"
#include "worker/interaction.hpp"
#include "worker/linear_layer.hpp"

namespace parasol {
namespace {

std::vector<float> Random(size_t n, uint64_t seed, float scale = 1.0f) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> u(-scale, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = u(rng);
  return v;
}

// Checks d(loss)/d(x[i]) == analytic[i] by central differences, for every i.
void ExpectGradient(std::vector<float>& x, const std::vector<float>& analytic,
                    const std::function<double()>& loss, const std::string& what) {
  ASSERT_EQ(x.size(), analytic.size());
  for (size_t i = 0; i < x.size(); ++i) {
    const float keep = x[i];
    const float h = 1e-2f * std::max(1.0f, std::abs(keep));
    x[i] = keep + h;
    const double up = loss();
    x[i] = keep - h;
    const double down = loss();
    x[i] = keep;
    const double numeric = (up - down) / (2 * h);
    EXPECT_NEAR(analytic[i], numeric, 2e-3 + 2e-2 * std::abs(numeric)) << what << " [" << i << "]";
  }
}

// sum_i r_i * y_i: a scalar loss whose gradient with respect to y is r.
double Dot(const float* y, const std::vector<float>& r) {
  double s = 0;
  for (size_t i = 0; i < r.size(); ++i) s += double{y[i]} * r[i];
  return s;
}

TEST(CpuBackendTest, LinearWithReluMatchesFiniteDifferences) {
  auto backend = MakeCpuBackend();
  const uint32_t batch = 5, in = 7, out = 4;
  LinearLayer layer(backend.get(), in, out, /*relu=*/true, batch);
  std::vector<float> w = Random(in * out, 1), b = Random(out, 2), x = Random(batch * in, 3);
  const std::vector<float> r = Random(batch * out, 4);
  std::vector<float> dx(batch * in), dw(in * out), db(out);
  layer.Bind(w.data(), b.data(), dw.data(), db.data());
  auto loss = [&] { return Dot(layer.Forward(x.data(), in, batch), r); };
  loss();
  layer.Backward(x.data(), in, r.data(), dx.data(), in, batch);
  ExpectGradient(w, dw, loss, "dW");
  ExpectGradient(b, db, loss, "db");
  ExpectGradient(x, dx, loss, "dx");
}

TEST(CpuBackendTest, InteractionMatchesFiniteDifferences) {
  auto backend = MakeCpuBackend();
  const int batch = 3, fields = 4, dim = 5;
  const int width = dim + (fields + 1) * fields / 2;
  std::vector<float> z = Random(batch * dim, 5), e = Random(batch * fields * dim, 6);
  const std::vector<float> r = Random(batch * width, 7);
  std::vector<float> out(batch * width);
  auto loss = [&] {
    backend->Interaction(out.data(), width, z.data(), e.data(), batch, fields, dim);
    return Dot(out.data(), r);
  };
  std::vector<float> dz(batch * dim), de(batch * fields * dim);
  backend->InteractionBackward(dz.data(), de.data(), r.data(), width, z.data(), e.data(), batch,
                               fields, dim);
  ExpectGradient(z, dz, loss, "dz");
  ExpectGradient(e, de, loss, "de");
  // Forward layout: z first, then dot(v1, v0), dot(v2, v0), dot(v2, v1), ...
  loss();
  double d10 = 0;
  for (int d = 0; d < dim; ++d) d10 += e[d] * z[d];
  EXPECT_NEAR(out[dim], d10, 1e-5);
}

TEST(CpuBackendTest, WeightedEmbeddingPoolMatchesFiniteDifferences) {
  auto backend = MakeCpuBackend();
  const int dim = 3, unique = 4, batch = 3;
  std::vector<float> rows = Random(unique * dim, 8);
  const std::vector<uint32_t> indices = {0, 2, 2, 1, 3, 0};
  const std::vector<uint32_t> offsets = {0, 2, 3, 6};
  const std::vector<float> values = {1.0f, 0.5f, 2.0f, -1.0f, 1.5f, 0.25f};
  const std::vector<float> r = Random(batch * dim, 9);
  std::vector<float> out(batch * dim);
  auto loss = [&] {
    backend->EmbeddingPool(out.data(), rows.data(), dim, indices.data(), values.data(),
                           offsets.data(), batch, unique);
    return Dot(out.data(), r);
  };
  std::vector<float> drows(unique * dim, 0.0f);
  backend->EmbeddingPoolBackward(drows.data(), r.data(), dim, indices.data(), values.data(),
                                 offsets.data(), batch);
  ExpectGradient(rows, drows, loss, "drows");
  // The same gradient from the batch's row index, deterministic, bit for bit in this order.
  std::vector<uint32_t> row_start(unique + 1), occ(indices.size()), hot(1), key_bags;
  for (int b = 0; b < batch; ++b) {
    for (uint32_t j = offsets[b]; j < offsets[b + 1]; ++j) key_bags.push_back(b);
  }
  EXPECT_EQ(BuildRowIndex(indices.data(), indices.size(), unique, row_start.data(), occ.data(),
                          hot.data()),
            0u);
  EXPECT_EQ(row_start, (std::vector<uint32_t>{0, 2, 3, 5, 6}));
  EXPECT_EQ(occ, (std::vector<uint32_t>{0, 5, 3, 1, 2, 4}));
  std::vector<float> by_row(unique * dim, std::nanf(""));
  backend->EmbeddingRowGrad(by_row.data(), r.data(), dim, row_start.data(), occ.data(),
                            hot.data(), 0, key_bags.data(), values.data(), unique);
  EXPECT_EQ(by_row, drows);
}

TEST(CpuBackendTest, SigmoidBceMatchesFiniteDifferencesAndIsStable) {
  auto backend = MakeCpuBackend();
  std::vector<float> logits = {-3.0f, 0.1f, 2.5f, 0.0f};
  const std::vector<float> labels = {0, 1, 0, 1};
  std::vector<float> probs(4), dlogits(4);
  auto mean_bce = [&](float* p, float* d, const float* x, const float* y, int n) {
    double sum = 0;
    backend->SigmoidBce(p, d, &sum, x, y, n);
    return sum / n;
  };
  auto loss = [&] {
    std::vector<float> p(4), d(4);
    return mean_bce(p.data(), d.data(), logits.data(), labels.data(), 4);
  };
  const double l = mean_bce(probs.data(), dlogits.data(), logits.data(), labels.data(), 4);
  // By hand: mean of -log(1 - s(-3)), -log(s(0.1)), -log(1 - s(2.5)), -log(s(0)).
  auto s = [](double x) { return 1 / (1 + std::exp(-x)); };
  const double want = (-std::log(1 - s(-3)) - std::log(s(0.1)) - std::log(1 - s(2.5)) -
                       std::log(s(0))) / 4;
  EXPECT_NEAR(l, want, 1e-6);
  EXPECT_NEAR(probs[2], s(2.5), 1e-6);
  ExpectGradient(logits, dlogits, loss, "dlogits");
  std::vector<float> huge = {200.0f, -200.0f};
  const std::vector<float> y = {0, 1};
  const double big = mean_bce(probs.data(), dlogits.data(), huge.data(), y.data(), 2);
  EXPECT_NEAR(big, 200.0, 1e-3);  // no overflow, no NaN
}

TEST(CpuBackendTest, GemmHonoursTransposes) {
  auto backend = MakeCpuBackend();
  // a = [[1, 2], [3, 4]], b = [[5, 6], [7, 8]]
  const std::vector<float> a = {1, 2, 3, 4}, b = {5, 6, 7, 8};
  std::vector<float> c(4);
  backend->Gemm(false, false, 2, 2, 2, 1.0f, a.data(), b.data(), 0.0f, c.data());
  EXPECT_EQ(c, (std::vector<float>{19, 22, 43, 50}));
  backend->Gemm(true, false, 2, 2, 2, 1.0f, a.data(), b.data(), 0.0f, c.data());
  EXPECT_EQ(c, (std::vector<float>{26, 30, 38, 44}));
  backend->Gemm(false, true, 2, 2, 2, 1.0f, a.data(), b.data(), 0.0f, c.data());
  EXPECT_EQ(c, (std::vector<float>{17, 23, 39, 53}));
}

}  // namespace
}  // namespace parasol

namespace parasol {
namespace {

// The CPU backend's interaction, forward and backward, equals the plain pairwise loops bit for
// bit: in the lanes of its fast paths (up to 32 vectors; dims that are a multiple of 4 up to
// 16 backward) and in the shapes that fall back to the loops.
TEST(CpuBackendTest, InteractionEqualsThePlainLoopsBitForBit) {
  auto backend = MakeCpuBackend();
  for (const auto& [fields, dim] :
       {std::pair{26, 16}, std::pair{3, 7}, std::pair{1, 1}, std::pair{9, 48}, std::pair{40, 5},
        std::pair{2, 4}, std::pair{5, 8}, std::pair{31, 12}, std::pair{7, 16}, std::pair{32, 3}}) {
    SCOPED_TRACE("fields " + std::to_string(fields) + " dim " + std::to_string(dim));
    const int batch = 37;
    const int width = dim + (fields + 1) * fields / 2;
    const int ld = width + 3;  // padded rows, as the model's are
    std::vector<float> z = Random(size_t(batch) * dim, 11, 3.0f);
    std::vector<float> e = Random(size_t(batch) * fields * dim, 12, 3.0f);
    std::vector<float> dout = Random(size_t(batch) * ld, 13, 2.0f);
    // Signed zeros, whose sign a lane's fill or broadcast could lose: in the first samples,
    // every vector and gradient is -0.0 (a sum of -0.0 terms stays -0.0), elsewhere some.
    for (size_t i = 0; i < z.size(); ++i) {
      if (i < size_t(4) * dim || i % 7 == 0) z[i] = -0.0f;
    }
    for (size_t i = 0; i < e.size(); ++i) {
      if (i < size_t(4) * fields * dim || i % 5 == 0) e[i] = -0.0f;
    }
    for (size_t i = 0; i < dout.size(); ++i) {
      if (i < size_t(4) * ld || i % 3 == 0) dout[i] = -0.0f;
    }
    // Sample 4: every gradient -0.0 and every vector 1.0, so z's gradient is its pass-through
    // -0.0 plus -0.0 terms, which stays -0.0 only if the sum starts from the pass-through (a
    // sum started from +0.0 ends at +0.0).
    if (batch > 4) {
      std::fill(z.begin() + 4 * dim, z.begin() + 5 * dim, 1.0f);
      std::fill(e.begin() + size_t(4) * fields * dim, e.begin() + size_t(5) * fields * dim, 1.0f);
      std::fill(dout.begin() + size_t(4) * ld, dout.begin() + size_t(5) * ld, -0.0f);
    }
    std::vector<float> got(size_t(batch) * ld, std::nanf("")), want(got.size(), 1.0f);
    backend->Interaction(got.data(), ld, z.data(), e.data(), batch, fields, dim);
    InteractionReference(want.data(), ld, z.data(), e.data(), batch, fields, dim);
    ASSERT_EQ(0, std::memcmp(got.data(), want.data(), got.size() * sizeof(float)));
    std::vector<float> dz(z.size(), std::nanf("")), de(e.size(), std::nanf(""));
    std::vector<float> want_dz(z.size()), want_de(e.size());
    backend->InteractionBackward(dz.data(), de.data(), dout.data(), ld, z.data(), e.data(),
                                 batch, fields, dim);
    InteractionBackwardReference(want_dz.data(), want_de.data(), dout.data(), ld, z.data(),
                             e.data(), batch, fields, dim);
    ASSERT_EQ(0, std::memcmp(dz.data(), want_dz.data(), dz.size() * sizeof(float)));
    ASSERT_EQ(0, std::memcmp(de.data(), want_de.data(), de.size() * sizeof(float)));
    ASSERT_TRUE(std::signbit(want_dz[4 * dim]) && want_dz[4 * dim] == 0.0f);  // exercised
  }
}

}  // namespace
}  // namespace parasol

namespace parasol {
namespace {

// The row gradients from the batch's row index equal the pooled backward's scatter bit for bit
// at the dims the backend sums in lanes (4, 8, 16) and beside them (3, 20), with weights and
// with rows many keys share.
TEST(CpuBackendTest, RowGradEqualsThePooledBackwardAtEveryDim) {
  auto backend = MakeCpuBackend();
  std::mt19937_64 rng(21);
  for (int dim : {3, 4, 8, 16, 20}) {
    SCOPED_TRACE("dim " + std::to_string(dim));
    const int batch = 300, unique = 97;
    std::vector<uint32_t> offsets = {0}, indices;
    for (int b = 0; b < batch; ++b) {
      const int n = 1 + static_cast<int>(rng() % 4);
      // A third of the keys go to row 0: a hot row.
      for (int j = 0; j < n; ++j) indices.push_back(rng() % 3 == 0 ? 0 : rng() % unique);
      offsets.push_back(static_cast<uint32_t>(indices.size()));
    }
    std::vector<float> values = Random(indices.size(), 22);
    const std::vector<float> dout = Random(size_t(batch) * dim, 23);
    std::vector<float> scattered(size_t(unique) * dim, 0.0f);
    backend->EmbeddingPoolBackward(scattered.data(), dout.data(), dim, indices.data(),
                                   values.data(), offsets.data(), batch);
    std::vector<uint32_t> row_start(unique + 1), occ(indices.size()), hot(unique), key_bags;
    for (int b = 0; b < batch; ++b) {
      for (uint32_t j = offsets[b]; j < offsets[b + 1]; ++j) key_bags.push_back(b);
    }
    const uint32_t hot_count = BuildRowIndex(indices.data(), indices.size(), unique,
                                             row_start.data(), occ.data(), hot.data());
    std::vector<float> by_row(size_t(unique) * dim, std::nanf(""));
    backend->EmbeddingRowGrad(by_row.data(), dout.data(), dim, row_start.data(), occ.data(),
                              hot.data(), hot_count, key_bags.data(), values.data(), unique);
    ASSERT_EQ(0, std::memcmp(by_row.data(), scattered.data(), by_row.size() * sizeof(float)));

    // DLRM's call: every key its own bag (no key_bags), weight 1 (no values), and the numbers
    // of rows and hot rows in `counts`, with upper bounds in their places.
    const std::vector<float> dkeys = Random(indices.size() * dim, 24);
    std::vector<uint32_t> single(indices.size() + 1);
    for (size_t j = 0; j < single.size(); ++j) single[j] = static_cast<uint32_t>(j);
    const std::vector<float> ones(indices.size(), 1.0f);
    std::vector<float> scattered_keys(size_t(unique) * dim, 0.0f);
    backend->EmbeddingPoolBackward(scattered_keys.data(), dkeys.data(), dim, indices.data(),
                                   ones.data(), single.data(), static_cast<int>(indices.size()));
    const uint32_t counts[2] = {static_cast<uint32_t>(unique), hot_count};
    std::vector<float> by_key(size_t(unique) * dim, std::nanf(""));
    backend->EmbeddingRowGrad(by_key.data(), dkeys.data(), dim, row_start.data(), occ.data(),
                              hot.data(), hot_count + 5, nullptr, nullptr, unique + 7, counts);
    ASSERT_EQ(0, std::memcmp(by_key.data(), scattered_keys.data(), by_key.size() * sizeof(float)));
  }
}

}  // namespace
}  // namespace parasol

namespace parasol {
namespace {

// Every kernel split over compute threads (worker.compute_threads) against the same kernel on
// one thread: the kernels whose parts write disjoint rows (the interaction both ways, pooling,
// row gradients, the bias and activation forward, the activation's backward) have the same
// bits; the products and the bias gradient (a sum over rows, added part by part) are close,
// and the same bits at every call with the same threads. With and without pinning, and with
// more threads than a product has rows. A pinned backend gives the calling thread its cores
// back when it is destroyed.
TEST(CpuBackendTest, SplitKernelsMatchOneThread) {
  auto one = MakeCpuBackend(1, 1);
  cpu_set_t before;
  CPU_ZERO(&before);
  ASSERT_EQ(pthread_getaffinity_np(pthread_self(), sizeof before, &before), 0);
  for (int threads : {2, 3, 5}) {
    for (bool pin : {false, true}) {
      SCOPED_TRACE("threads " + std::to_string(threads) + (pin ? " pinned" : ""));
      {
        auto split = MakeCpuBackend(1, threads, pin);
        auto same_bits = [](const std::vector<float>& a, const std::vector<float>& b) {
          return a.size() == b.size() &&
                 std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
        };
        auto close = [](const std::vector<float>& a, const std::vector<float>& b) {
          if (a.size() != b.size()) return false;
          for (size_t i = 0; i < a.size(); ++i) {
            if (!(std::abs(a[i] - b[i]) <= 1e-4f * (1.0f + std::abs(b[i])))) return false;
          }
          return true;
        };

        // Products, split by rows (m >= n) and by columns (n > m), every transpose.
        // The last: 3 rows, split 3 ways at most, among up to 5 threads.
        for (auto [m, n, k] : {std::tuple{700, 70, 90}, std::tuple{20, 900, 64},
                               std::tuple{3, 2, 200000}}) {
          for (int t = 0; t < 4; ++t) {
            const bool ta = t & 1, tb = t & 2;
            SCOPED_TRACE("gemm " + std::to_string(m) + "x" + std::to_string(n) + "x" +
                         std::to_string(k) + (ta ? " T" : " N") + (tb ? "T" : "N"));
            const int lda = (ta ? m : k) + 3, ldb = (tb ? k : n) + 1, ldc = n + 2;
            const std::vector<float> a = Random(size_t(ta ? k : m) * lda, 31);
            const std::vector<float> b = Random(size_t(tb ? n : k) * ldb, 32);
            const std::vector<float> c0 = Random(size_t(m) * ldc, 33);
            std::vector<float> want = c0, got = c0, again = c0;
            one->GemmStrided(ta, tb, m, n, k, 0.5f, a.data(), lda, b.data(), ldb, 0.25f,
                             want.data(), ldc);
            split->GemmStrided(ta, tb, m, n, k, 0.5f, a.data(), lda, b.data(), ldb, 0.25f,
                               got.data(), ldc);
            split->GemmStrided(ta, tb, m, n, k, 0.5f, a.data(), lda, b.data(), ldb, 0.25f,
                               again.data(), ldc);
            ASSERT_TRUE(close(got, want));
            ASSERT_TRUE(same_bits(got, again));
            // The padding between rows is left as it was.
            for (int r = 0; r < m; ++r) {
              ASSERT_EQ(got[size_t(r) * ldc + n], c0[size_t(r) * ldc + n]);
            }
          }
        }

        // The interaction, both ways.
        const int batch = 1500, fields = 26, dim = 16, ld = dim + 27 * 13 + 1;
        const std::vector<float> z = Random(size_t(batch) * dim, 41);
        const std::vector<float> e = Random(size_t(batch) * fields * dim, 42);
        const std::vector<float> dout = Random(size_t(batch) * ld, 43);
        std::vector<float> want(size_t(batch) * ld), got(want.size(), std::nanf(""));
        one->Interaction(want.data(), ld, z.data(), e.data(), batch, fields, dim);
        split->Interaction(got.data(), ld, z.data(), e.data(), batch, fields, dim);
        ASSERT_TRUE(same_bits(got, want));
        std::vector<float> dz(z.size()), de(e.size()), want_dz(z.size()), want_de(e.size());
        one->InteractionBackward(want_dz.data(), want_de.data(), dout.data(), ld, z.data(),
                                 e.data(), batch, fields, dim);
        split->InteractionBackward(dz.data(), de.data(), dout.data(), ld, z.data(), e.data(),
                                   batch, fields, dim);
        ASSERT_TRUE(same_bits(dz, want_dz));
        ASSERT_TRUE(same_bits(de, want_de));

        // Pooling, weighted, bags of 1 to 4 keys over 200 rows, enough bags to split.
        std::mt19937_64 rng(44);
        std::vector<uint32_t> offsets = {0}, indices;
        const int bags = 8192;
        for (int b = 0; b < bags; ++b) {
          const int keys = 1 + static_cast<int>(rng() % 4);
          for (int j = 0; j < keys; ++j) indices.push_back(static_cast<uint32_t>(rng() % 200));
          offsets.push_back(static_cast<uint32_t>(indices.size()));
        }
        const std::vector<float> rows = Random(size_t(200) * dim, 45);
        const std::vector<float> values = Random(indices.size(), 46);
        std::vector<float> pooled(size_t(bags) * dim), want_pooled(pooled.size());
        one->EmbeddingPool(want_pooled.data(), rows.data(), dim, indices.data(), values.data(),
                           offsets.data(), bags, 200);
        split->EmbeddingPool(pooled.data(), rows.data(), dim, indices.data(), values.data(),
                             offsets.data(), bags, 200);
        ASSERT_TRUE(same_bits(pooled, want_pooled));

        // Row gradients from the row index of those keys.
        std::vector<uint32_t> row_start(201), occ(indices.size()), hot(201), key_bags;
        for (int b = 0; b < bags; ++b) {
          for (uint32_t j = offsets[b]; j < offsets[b + 1]; ++j) key_bags.push_back(b);
        }
        const uint32_t hot_count = BuildRowIndex(indices.data(), indices.size(), 200,
                                                 row_start.data(), occ.data(), hot.data());
        const std::vector<float> dpooled = Random(size_t(bags) * dim, 47);
        std::vector<float> grads(size_t(200) * dim), want_grads(grads.size());
        one->EmbeddingRowGrad(want_grads.data(), dpooled.data(), dim, row_start.data(), occ.data(),
                              hot.data(), hot_count, key_bags.data(), values.data(), 200);
        split->EmbeddingRowGrad(grads.data(), dpooled.data(), dim, row_start.data(), occ.data(),
                                hot.data(), hot_count, key_bags.data(), values.data(), 200);
        ASSERT_TRUE(same_bits(grads, want_grads));

        // Bias and activation, forward and backward, with and without the ReLU.
        for (bool relu : {true, false}) {
          const int cols = 64;
          const std::vector<float> y0 = Random(size_t(batch) * cols, 48);
          const std::vector<float> bias = Random(cols, 49);
          std::vector<float> y = y0, want_y = y0;
          one->BiasActivation(want_y.data(), bias.data(), batch, cols, relu);
          split->BiasActivation(y.data(), bias.data(), batch, cols, relu);
          ASSERT_TRUE(same_bits(y, want_y));
          const std::vector<float> dy = Random(y.size(), 50);
          std::vector<float> dpre(y.size()), want_dpre(y.size()), db(cols), want_db(cols),
              again_db(cols);
          one->BiasActivationBackward(want_dpre.data(), want_db.data(), dy.data(), y.data(), batch,
                                      cols, relu);
          split->BiasActivationBackward(dpre.data(), db.data(), dy.data(), y.data(), batch, cols,
                                        relu);
          split->BiasActivationBackward(dpre.data(), again_db.data(), dy.data(), y.data(), batch,
                                        cols, relu);
          if (relu) {
            ASSERT_TRUE(same_bits(dpre, want_dpre));
          }
          ASSERT_TRUE(close(db, want_db));
          ASSERT_TRUE(same_bits(db, again_db));
        }
        split->Mark(0);  // the step's end: the helpers sleep
      }
      cpu_set_t after;
      CPU_ZERO(&after);
      ASSERT_EQ(pthread_getaffinity_np(pthread_self(), sizeof after, &after), 0);
      ASSERT_TRUE(CPU_EQUAL(&before, &after)) << "the caller's cores were not given back";
    }
  }
}

}  // namespace
}  // namespace parasol
