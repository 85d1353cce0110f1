#include "common/initializer.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

namespace parasol {
namespace {

TEST(InitializerTest, SparseRowDependsOnlyOnSeedAndKey) {
  InitOptions init;
  init.kind = InitOptions::Kind::kUniform;
  init.scale = 0.5;
  std::vector<float> a(16), b(16), c(16), d(16);
  InitSparseRow(init, 7, 12345, a);
  InitSparseRow(init, 7, 12345, b);
  InitSparseRow(init, 7, 12346, c);
  InitSparseRow(init, 8, 12345, d);
  EXPECT_EQ(a, b);
  EXPECT_NE(a, c);
  EXPECT_NE(a, d);
}

TEST(InitializerTest, UniformStaysInRangeWithTheRightMoments) {
  InitOptions init;
  init.kind = InitOptions::Kind::kUniform;
  init.scale = 0.1;
  double sum = 0, sq = 0;
  const int n = 200000;
  std::vector<float> row(8);
  for (int k = 0; k < n / 8; ++k) {
    InitSparseRow(init, 1, k, row);
    for (float v : row) {
      ASSERT_GE(v, -0.1f);
      ASSERT_LT(v, 0.1f);
      sum += v;
      sq += double{v} * v;
    }
  }
  EXPECT_NEAR(sum / n, 0.0, 0.001);
  EXPECT_NEAR(sq / n, 0.01 / 3, 0.0002);  // variance of U(-a, a) is a^2 / 3
}

TEST(InitializerTest, NormalHasTheRequestedMeanAndStddev) {
  InitOptions init;
  init.kind = InitOptions::Kind::kNormal;
  init.mean = 0.5;
  init.stddev = 0.2;
  std::vector<float> v(100000);
  InitDenseRange(init, 3, 0, v);
  double sum = 0, sq = 0;
  for (float x : v) {
    ASSERT_TRUE(std::isfinite(x));
    sum += x;
  }
  const double mean = sum / v.size();
  for (float x : v) sq += (x - mean) * (x - mean);
  EXPECT_NEAR(mean, 0.5, 0.005);
  EXPECT_NEAR(std::sqrt(sq / v.size()), 0.2, 0.005);
}

TEST(InitializerTest, DenseRangeIsIndependentOfHowTheTensorIsSliced) {
  InitOptions init;
  std::vector<float> whole(1000);
  InitDenseRange(init, 5, 0, whole);
  std::vector<float> part(300);
  InitDenseRange(init, 5, 400, part);
  for (size_t i = 0; i < part.size(); ++i) EXPECT_EQ(part[i], whole[400 + i]);
}

TEST(InitializerTest, ZerosAndConstant) {
  InitOptions init;
  init.kind = InitOptions::Kind::kConstant;
  init.value = 0.25;
  std::vector<float> row(4, -1.0f);
  InitSparseRow(init, 1, 2, row);
  EXPECT_EQ(row, std::vector<float>(4, 0.25f));
  init.kind = InitOptions::Kind::kZeros;
  InitSparseRow(init, 1, 2, row);
  EXPECT_EQ(row, std::vector<float>(4, 0.0f));
}

}  // namespace
}  // namespace parasol
