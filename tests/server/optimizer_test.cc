// Each update rule against its formula written out one element at a time (in double, stored as
// float, in the same order of operations): bit for bit, at lengths that leave every remainder
// of a vector loop, with unaligned gradients, weight decay and a gradient scale.
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include "server/optimizer.hpp"

namespace parasol {
namespace {

using Kind = OptimizerOptions::Kind;

struct Elements {
  std::vector<float> w, a, b;
  std::vector<uint32_t> step;
  float row_acc = 0.25f;
};

// The rule for element i (row_acc and the step handled by the caller).
void Reference(const OptimizerOptions& o, Elements& e, const std::vector<float>& grad,
               double scale, uint32_t row_step) {
  const size_t n = e.w.size();
  auto g_at = [&](size_t i) { return grad[i] * scale + o.weight_decay * e.w[i]; };
  switch (o.kind) {
    case Kind::kSgd:
      for (size_t i = 0; i < n; ++i) e.w[i] = static_cast<float>(e.w[i] - o.lr * g_at(i));
      break;
    case Kind::kAdagrad:
      for (size_t i = 0; i < n; ++i) {
        const double g = g_at(i);
        const double acc = e.a[i] + g * g;
        e.a[i] = static_cast<float>(acc);
        e.w[i] = static_cast<float>(e.w[i] - o.lr * g / (std::sqrt(acc) + o.eps));
      }
      break;
    case Kind::kAdagradRowwise: {
      double sum_sq = 0;
      for (size_t i = 0; i < n; ++i) sum_sq += g_at(i) * g_at(i);
      const double acc = e.row_acc + sum_sq / static_cast<double>(n);
      e.row_acc = static_cast<float>(acc);
      const double step = o.lr / (std::sqrt(acc) + o.eps);
      for (size_t i = 0; i < n; ++i) e.w[i] = static_cast<float>(e.w[i] - step * g_at(i));
      break;
    }
    case Kind::kAdam:
      for (size_t i = 0; i < n; ++i) {
        const uint32_t t = e.step.empty() ? row_step : ++e.step[i];
        const double g = g_at(i);
        const double m = o.beta1 * e.a[i] + (1 - o.beta1) * g;
        const double v = o.beta2 * e.b[i] + (1 - o.beta2) * g * g;
        e.a[i] = static_cast<float>(m);
        e.b[i] = static_cast<float>(v);
        double mhat = m, vhat = v;
        if (o.bias_correction) {
          mhat = m / (1 - std::pow(o.beta1, t));
          vhat = v / (1 - std::pow(o.beta2, t));
        }
        e.w[i] = static_cast<float>(e.w[i] - o.lr * mhat / (std::sqrt(vhat) + o.eps));
      }
      break;
    case Kind::kFtrl:
      for (size_t i = 0; i < n; ++i) {
        const double g = g_at(i);
        const double n_old = e.b[i];
        const double n_new = n_old + g * g;
        const double sigma = (std::sqrt(n_new) - std::sqrt(n_old)) / o.alpha;
        const double z = e.a[i] + g - sigma * e.w[i];
        e.a[i] = static_cast<float>(z);
        e.b[i] = static_cast<float>(n_new);
        e.w[i] = std::abs(z) <= o.l1
                     ? 0.0f
                     : static_cast<float>(-(z - std::copysign(o.l1, z)) /
                                          ((o.beta + std::sqrt(n_new)) / o.alpha + o.l2));
      }
      break;
  }
}

TEST(OptimizerTest, EveryRuleEqualsItsFormulaBitForBit) {
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_real_distribution<float> positive(0.0f, 2.0f);
  for (Kind kind : {Kind::kSgd, Kind::kAdagrad, Kind::kAdagradRowwise, Kind::kAdam, Kind::kFtrl}) {
    for (bool bias_correction : {true, false}) {
      if (!bias_correction && kind != Kind::kAdam) continue;
      for (bool per_element : {false, true}) {
        if (per_element && kind != Kind::kAdam) continue;
        for (uint32_t n : {1u, 2u, 3u, 4u, 5u, 7u, 8u, 9u, 16u, 17u, 31u, 33u}) {
          SCOPED_TRACE(testing::Message() << "kind " << static_cast<int>(kind) << " n " << n
                                          << " bias_correction " << bias_correction
                                          << " per_element " << per_element);
          OptimizerOptions o;
          o.kind = kind;
          o.lr = 0.03;
          o.weight_decay = 0.001;
          o.bias_correction = bias_correction;
          o.l1 = 0.01;
          Optimizer opt(o);
          Elements mine, ref;
          for (uint32_t i = 0; i < n; ++i) {
            mine.w.push_back(normal(rng));
            mine.a.push_back(kind == Kind::kFtrl ? normal(rng) : positive(rng));
            mine.b.push_back(positive(rng));
            // Steps that differ from element to element (a dense push arrives in chunks).
            if (per_element) mine.step.push_back(i % 3 == 0 ? 4 : 9);
          }
          ref = mine;
          uint32_t row_step = 2;
          OptimizerState s;
          s.a = mine.a.data();
          s.b = mine.b.data();
          s.row_acc = &mine.row_acc;
          s.step = per_element ? mine.step.data() : &row_step;
          s.step_per_element = per_element;
          for (int round = 0; round < 3; ++round) {
            std::vector<float> grad(n);
            for (float& g : grad) g = normal(rng);
            if (round == 1 && n > 2) grad[1] = 0.0f;
            // One byte past an aligned start: gradients come straight from received frames.
            std::vector<std::byte> raw(n * sizeof(float) + 1);
            std::memcpy(raw.data() + 1, grad.data(), n * sizeof(float));
            const double scale = round == 2 ? 0.5 : 1.0;
            opt.Apply(mine.w.data(), s, raw.data() + 1, n, scale);
            Reference(o, ref, grad, scale, per_element ? 0 : row_step);
            ASSERT_EQ(0, std::memcmp(mine.w.data(), ref.w.data(), n * sizeof(float)));
            ASSERT_EQ(0, std::memcmp(mine.a.data(), ref.a.data(), n * sizeof(float)));
            ASSERT_EQ(0, std::memcmp(mine.b.data(), ref.b.data(), n * sizeof(float)));
            ASSERT_EQ(mine.row_acc, ref.row_acc);
            ASSERT_EQ(mine.step, ref.step);
          }
        }
      }
    }
  }
}

TEST(OptimizerTest, AnUpdateThatWouldNotBeFiniteIsNotMadeAndIsCounted) {
  // Finite gradients whose update overflows float: every rule, as a sparse row (one run with
  // its row's state) and as a dense run of 600 elements in which one element overflows (its
  // run of kGuardRun keeps its values; the others are updated as ever).
  for (Kind kind : {Kind::kSgd, Kind::kAdagrad, Kind::kAdagradRowwise, Kind::kAdam, Kind::kFtrl}) {
    SCOPED_TRACE(testing::Message() << "kind " << static_cast<int>(kind));
    OptimizerOptions o;
    o.kind = kind;
    o.lr = 1e30;
    Optimizer opt(o);
    // The sparse row: w, its state, and its row state.
    const uint32_t dim = 8;
    Elements row;
    row.w.assign(dim, 0.5f);
    row.a.assign(dim, 0.25f);
    row.b.assign(dim, 0.25f);
    uint32_t row_step = 3;
    const Elements before = row;
    OptimizerState s;
    if (kind == Kind::kAdagrad || kind == Kind::kAdam || kind == Kind::kFtrl) s.a = row.a.data();
    if (kind == Kind::kAdam || kind == Kind::kFtrl) s.b = row.b.data();
    if (kind == Kind::kAdagradRowwise) s.row_acc = &row.row_acc;
    if (kind == Kind::kAdam) s.step = &row_step;
    std::vector<float> grad(dim, 3e37f);  // finite; its square and lr x it are not
    const auto* raw = reinterpret_cast<const std::byte*>(grad.data());
    EXPECT_EQ(opt.Apply(row.w.data(), s, raw, dim, 1.0), dim);
    EXPECT_EQ(row.w, before.w);
    EXPECT_EQ(row.a, before.a);
    EXPECT_EQ(row.b, before.b);
    EXPECT_EQ(row.row_acc, before.row_acc);
    EXPECT_EQ(row_step, 3u);
    EXPECT_EQ(opt.nonfinite_kept(), dim);
    // A usual gradient is applied as ever, and counts nothing.
    std::vector<float> small(dim, 0.0f);
    small[0] = 1e-36f;
    EXPECT_EQ(opt.Apply(row.w.data(), s, reinterpret_cast<const std::byte*>(small.data()), dim,
                        1.0),
              0u);
    EXPECT_EQ(opt.nonfinite_kept(), dim);
    if (kind == Kind::kAdagradRowwise) continue;  // rows only
    // The dense run: element 300 overflows; elements 256 to 511 keep their values.
    const uint64_t n = 600;
    Elements dense;
    dense.w.assign(n, 0.5f);
    dense.a.assign(n, 0.25f);
    dense.b.assign(n, 0.25f);
    dense.step.assign(n, 2);
    OptimizerState d;
    if (s.a) d.a = dense.a.data();
    if (s.b) d.b = dense.b.data();
    if (kind == Kind::kAdam) {
      d.step = dense.step.data();
      d.step_per_element = true;
    }
    std::vector<float> g(n, 1e-32f);
    g[300] = 3e37f;
    const Elements old = dense;
    EXPECT_EQ(opt.Apply(dense.w.data(), d, reinterpret_cast<const std::byte*>(g.data()), n, 1.0),
              Optimizer::kGuardRun);
    for (uint64_t i = 0; i < n; ++i) {
      const bool kept = i >= 256 && i < 512;
      ASSERT_EQ(dense.w[i] == old.w[i] && dense.a[i] == old.a[i] &&
                    dense.step[i] == old.step[i],
                kept)
          << "element " << i;
      ASSERT_TRUE(std::isfinite(dense.w[i]) && std::isfinite(dense.a[i]) &&
                  std::isfinite(dense.b[i]))
          << "element " << i;
    }
    EXPECT_EQ(opt.nonfinite_kept(), dim + Optimizer::kGuardRun);
  }
}

TEST(OptimizerTest, ASparseRowLongerThanARunIsKeptWhole) {
  // A sparse row of 300 values (SparseState) with one overflowing element: none of it moves.
  OptimizerOptions o;
  o.kind = Kind::kSgd;
  o.lr = 1e30;
  Optimizer opt(o);
  std::vector<float> row(300, 0.5f);
  std::vector<float> grad(300, 1e-32f);
  grad[290] = 3e37f;
  const std::vector<float> before = row;
  EXPECT_EQ(opt.Apply(row.data(), opt.SparseState(row.data(), 300),
                      reinterpret_cast<const std::byte*>(grad.data()), 300, 1.0),
            300u);
  EXPECT_EQ(row, before);
}

}  // namespace
}  // namespace parasol
