#include "server/dense_table.hpp"

#include <gtest/gtest.h>

#include <vector>

#include "common/initializer.hpp"

namespace parasol {
namespace {

TableOptions Tensor(uint64_t n) {
  TableOptions t;
  t.name = std::string("tensor");
  t.kind = TableKind::kDense;
  t.shape = {n};
  t.seed = 4;
  return t;
}

TEST(DenseTableTest, HoldsItsSliceInitialisedByGlobalIndex) {
  DenseTable table(Tensor(100), SliceRange{40, 70});
  std::vector<float> want(30);
  InitDenseRange(table.options().init, 4, 40, want);
  const auto values = table.Share();
  EXPECT_EQ(std::vector<float>(values.get(), values.get() + 30), want);
}

TEST(DenseTableTest, AWriteNeverChangesValuesAReplyStillShares) {
  DenseTable table(Tensor(10), SliceRange{0, 10});
  std::shared_ptr<const float[]> in_flight = table.Share();  // a pull reply being sent
  const std::vector<float> before(in_flight.get(), in_flight.get() + 10);
  float* w = table.PrepareWrite();
  EXPECT_NE(w, in_flight.get());
  for (int i = 0; i < 10; ++i) w[i] += 1.0f;
  EXPECT_EQ(std::vector<float>(in_flight.get(), in_flight.get() + 10), before);
  EXPECT_EQ(table.Share()[3], before[3] + 1.0f);
  EXPECT_EQ(table.copies_on_write(), 1u);
}

TEST(DenseTableTest, AWriteWithNoReplyInFlightUpdatesInPlace) {
  DenseTable table(Tensor(10), SliceRange{0, 10});
  const float* before = table.Share().get();
  EXPECT_EQ(table.PrepareWrite(), before);
  EXPECT_EQ(table.copies_on_write(), 0u);
}

}  // namespace
}  // namespace parasol

#include <cmath>
#include <cstring>

#include "common/half.hpp"
#include "server/row_codec.hpp"

namespace parasol {
namespace {

// A 16-bit dense slice: every optimizer step equals the f32 step on the stored (rounded)
// values and state, rounded to the dtype (to nearest even), whatever the chunking of the
// pushes; it stores 2 bytes a value (and a 16-bit state element), adam's step 4.
TEST(DenseTableDtypeTest, AnOptimizerStepEqualsTheF32StepRounded) {
  constexpr uint64_t kN = 700;  // more than one decoding chunk, not a whole number of them
  for (DType values : {DType::kF32, DType::kBf16, DType::kF16}) {
    for (DType state : {DType::kF32, DType::kBf16, DType::kF16}) {
      for (auto kind : {OptimizerOptions::Kind::kSgd, OptimizerOptions::Kind::kAdagrad,
                        OptimizerOptions::Kind::kAdam, OptimizerOptions::Kind::kFtrl}) {
        SCOPED_TRACE("values " + std::to_string(static_cast<int>(values)) + " state " +
                     std::to_string(static_cast<int>(state)) + " optimizer " +
                     std::to_string(static_cast<int>(kind)));
        TableOptions t = Tensor(1000);
        t.init.kind = InitOptions::Kind::kUniform;
        t.init.scale = 0.5;
        t.dtype = values;
        t.state_dtype = state;
        t.optimizer.kind = kind;
        t.optimizer.lr = 0.05;
        DenseTable table(t, SliceRange{300, 300 + kN});
        const Optimizer& opt = table.optimizer();
        const uint32_t k = table.state_array_count();
        // The reference: f32 arrays holding what the table stores, stepped in f32 and rounded.
        std::vector<float> init(kN), ref(kN);
        InitDenseRange(t.init, t.seed, 300, init);
        std::vector<std::vector<float>> ref_state(k, std::vector<float>(kN));
        std::vector<float*> ptrs;
        for (auto& a : ref_state) ptrs.push_back(a.data());
        opt.InitState(init.data(), opt.DenseState(ptrs.data(), 0), kN);
        const uint32_t raw = kind == OptimizerOptions::Kind::kAdam ? 1 : 0;
        auto round_all = [&] {
          for (uint64_t i = 0; i < kN; ++i) ref[i] = RoundedTo(values, ref[i]);
          for (uint32_t a = 0; a + raw < k; ++a) {
            for (float& v : ref_state[a]) v = RoundedTo(state, v);
          }
        };
        ref = init;
        round_all();
        auto expect_equal = [&](int step) {
          std::vector<float> got((1 + k) * kN);
          table.ReadWithState(0, kN, got.data());
          for (uint64_t i = 0; i < kN; ++i) {
            ASSERT_EQ(0, std::memcmp(&got[i * (1 + k)], &ref[i], sizeof(float)))
                << "step " << step << " element " << i;
            for (uint32_t a = 0; a < k; ++a) {
              ASSERT_EQ(0, std::memcmp(&got[i * (1 + k) + 1 + a], &ref_state[a][i], 4))
                  << "step " << step << " element " << i << " state " << a;
            }
          }
        };
        expect_equal(-1);
        for (int step = 0; step < 12; ++step) {
          std::vector<float> g(kN);
          for (uint64_t i = 0; i < kN; ++i) {
            g[i] = 0.37f * static_cast<float>((step * 7 + i) % 5) - 0.7f;
          }
          const auto* gb = reinterpret_cast<const std::byte*>(g.data());
          opt.Apply(ref.data(), opt.DenseState(ptrs.data(), 0), gb, kN, 0.5);
          round_all();
          // Pushed in two uneven parts, as engines take them.
          table.PrepareWrite();
          const uint64_t cut = 37 * (step + 1) % kN;
          table.Apply(0, gb, cut, 0.5);
          table.Apply(cut, gb + cut * sizeof(float), kN - cut, 0.5);
          expect_equal(step);
        }
        const uint64_t value_bytes = values == DType::kF32 ? 4 : 2;
        const uint64_t state_bytes = (k - raw) * (state == DType::kF32 ? 4 : 2) + raw * 4;
        EXPECT_EQ(table.MemoryBytes(), kN * (value_bytes + state_bytes));
        EXPECT_EQ(table.Share() != nullptr, values == DType::kF32);
      }
    }
  }
}

// A checkpoint's arrays (f32 words) restore a 16-bit slice bit for bit, and stochastic
// rounding depends on the write's name and the element only: the same writes round the same
// way however the slice is split between engines, and after a restore from a checkpoint.
TEST(DenseTableDtypeTest, ArraysRestoreExactlyAndStochasticRoundingRepeats) {
  TableOptions t = Tensor(5000);
  t.init.kind = InitOptions::Kind::kUniform;
  t.init.scale = 1.0;
  t.dtype = DType::kBf16;
  t.state_dtype = DType::kF16;
  t.rounding = TableOptions::Rounding::kStochastic;
  t.optimizer.kind = OptimizerOptions::Kind::kAdam;
  t.optimizer.lr = 1e-4;  // steps far below bf16's spacing: only stochastic rounding moves them
  std::vector<float> g(5000);
  for (size_t i = 0; i < g.size(); ++i) g[i] = std::sin(0.1f * static_cast<float>(i));
  const auto* gb = reinterpret_cast<const std::byte*>(g.data());
  // Writes named first .. first + steps - 1, each applied in the given pieces.
  auto run = [&](DenseTable& table, uint64_t first, int steps, std::vector<uint64_t> cuts) {
    for (int step = 0; step < steps; ++step) {
      table.PrepareWrite(first + step);
      for (size_t c = 0; c + 1 < cuts.size(); ++c) {
        table.Apply(cuts[c], gb + cuts[c] * sizeof(float), cuts[c + 1] - cuts[c], 1.0);
      }
    }
  };
  DenseTable a(t, SliceRange{0, 5000}), b(t, SliceRange{0, 5000});
  std::vector<char> initial, after_a, after_b;
  a.AppendArrays(&initial);
  run(a, 1, 5, {0, 2500, 5000});
  run(b, 1, 5, {0, 7, 1031, 4999, 5000});  // other engine ranges
  a.AppendArrays(&after_a);
  b.AppendArrays(&after_b);
  EXPECT_EQ(after_a, after_b);  // the same rounding however the slice was split
  ASSERT_EQ(after_a.size(), initial.size());
  // Stochastic rounding moved values that steps of 1e-4 could never move to nearest.
  size_t moved = 0;
  for (size_t i = 0; i < 5000; ++i) {
    moved += std::memcmp(&after_a[i * 4], &initial[i * 4], 4) != 0;
  }
  EXPECT_GT(moved, 100u);
  // Restored into a fresh slice, the arrays read back as they were written; the writes after
  // the checkpoint then round as they do without the restart.
  DenseTable c(t, SliceRange{0, 5000});
  c.RestoreArrays(after_a.data());
  std::vector<char> restored;
  c.AppendArrays(&restored);
  EXPECT_EQ(restored, after_a);
  run(a, 6, 3, {0, 5000});
  run(c, 6, 3, {0, 5000});
  std::vector<char> continued_a, continued_c;
  a.AppendArrays(&continued_a);
  c.AppendArrays(&continued_c);
  EXPECT_EQ(continued_a, continued_c);
  // Other names, other draws.
  run(b, 100, 3, {0, 5000});
  std::vector<char> other;
  b.AppendArrays(&other);
  EXPECT_NE(other, continued_a);
}

// Stochastic rounding is unbiased and each element draws on its own: 1 + 0.3 of bf16's spacing
// at 1.0 is stored as 1 + spacing in 30% of the elements (and as 1 in the rest).
TEST(DenseTableDtypeTest, StochasticRoundingRoundsUpInProportion) {
  constexpr uint64_t kN = 20000;
  TableOptions t = Tensor(kN);
  t.init.kind = InitOptions::Kind::kConstant;
  t.init.value = 1.0;
  t.dtype = DType::kBf16;
  t.rounding = TableOptions::Rounding::kStochastic;
  t.optimizer.kind = OptimizerOptions::Kind::kSgd;
  t.optimizer.lr = 1.0;
  const float spacing = 1.0f / 128;  // bf16 at 1.0
  std::vector<float> g(kN, -0.3f * spacing);
  for (uint64_t write : {7u, 8u}) {
    DenseTable table(t, SliceRange{0, kN});
    table.PrepareWrite(write);
    table.Apply(0, reinterpret_cast<const std::byte*>(g.data()), kN, 1.0);
    std::vector<float> v(kN);
    table.ReadValues(0, kN, v.data());
    size_t up = 0;
    for (float x : v) {
      ASSERT_TRUE(x == 1.0f || x == 1.0f + spacing) << x;
      up += x != 1.0f;
    }
    // 30% +- 5 standard deviations (0.32% each at 20000 draws).
    EXPECT_NEAR(static_cast<double>(up) / kN, 0.3, 0.016) << "write " << write;
  }
}

}  // namespace
}  // namespace parasol
