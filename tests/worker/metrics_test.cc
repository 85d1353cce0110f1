#include "worker/metrics.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

namespace parasol {
namespace {

TEST(MetricsTest, AucCountsTiesAsHalf) {
  // Positives score 0.8 and 0.4; negatives 0.4 and 0.1. Pairs (pos, neg): (0.8, 0.4) 1,
  // (0.8, 0.1) 1, (0.4, 0.4) 1/2, (0.4, 0.1) 1 -> 3.5 / 4.
  const std::vector<float> s = {0.8f, 0.4f, 0.4f, 0.1f}, y = {1, 1, 0, 0};
  EXPECT_DOUBLE_EQ(Auc(s, y), 3.5 / 4);
}

TEST(MetricsTest, AucOfPerfectReversedAndConstantScores) {
  const std::vector<float> y = {0, 0, 1, 1};
  EXPECT_DOUBLE_EQ(Auc(std::vector<float>{0.1f, 0.2f, 0.3f, 0.4f}, y), 1.0);
  EXPECT_DOUBLE_EQ(Auc(std::vector<float>{0.4f, 0.3f, 0.2f, 0.1f}, y), 0.0);
  EXPECT_DOUBLE_EQ(Auc(std::vector<float>{0.5f, 0.5f, 0.5f, 0.5f}, y), 0.5);
  EXPECT_DOUBLE_EQ(Auc(std::vector<float>{0.5f, 0.6f}, std::vector<float>{1, 1}), 0.5);
}

TEST(MetricsTest, LogLossByHand) {
  const std::vector<float> p = {0.9f, 0.2f, 0.6f}, y = {1, 0, 0};
  const double want = -(std::log(0.9) + std::log(0.8) + std::log(0.4)) / 3;
  EXPECT_NEAR(LogLoss(p, y), want, 1e-6);
  // Clipped, never infinite.
  EXPECT_TRUE(std::isfinite(LogLoss(std::vector<float>{0.0f}, std::vector<float>{1})));
}

}  // namespace
}  // namespace parasol
