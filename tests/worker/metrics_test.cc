#include "worker/metrics.hpp"

#include <cstdlib>
#include <string>

#include "worker/trainer.hpp"

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

namespace parasol {
namespace {

// The value of `sample` (name and labels) in Prometheus text, or -1.
double Value(const std::string& text, const std::string& sample) {
  const size_t p = text.find(sample + " ");
  return p == std::string::npos ? -1 : std::atof(text.c_str() + p + sample.size() + 1);
}

TEST(WorkerMetricsTest, TheTimeSplitWaitsAndProcessAreExported) {
  ProgressPoint p;
  p.worker = 1;
  p.steps = 3;
  p.compute_seconds = 2.5;
  p.wait_seconds = 0.25;
  p.pull_latency.Observe(0.002);
  p.pull_latency.Observe(0.2);
  p.push_latency.Observe(20);  // past the last bucket: only +Inf counts it
  const std::string t = p.ToPrometheus();
  EXPECT_EQ(Value(t, "parasol_worker_steps_total{worker=\"1\"}"), 3);
  EXPECT_EQ(Value(t, "parasol_worker_seconds_total{worker=\"1\",phase=\"compute\"}"), 2.5);
  EXPECT_EQ(Value(t, "parasol_worker_seconds_total{worker=\"1\",phase=\"wait\"}"), 0.25);
  EXPECT_EQ(Value(t, "parasol_worker_seconds_total{worker=\"1\",phase=\"data\"}"), 0);
  // Cumulative buckets: 0.002 is in le=0.005 and above, 0.2 in le=0.5 and above.
  EXPECT_EQ(Value(t, "parasol_worker_pull_seconds_bucket{worker=\"1\",le=\"0.001\"}"), 0);
  EXPECT_EQ(Value(t, "parasol_worker_pull_seconds_bucket{worker=\"1\",le=\"0.005\"}"), 1);
  EXPECT_EQ(Value(t, "parasol_worker_pull_seconds_bucket{worker=\"1\",le=\"0.1\"}"), 1);
  EXPECT_EQ(Value(t, "parasol_worker_pull_seconds_bucket{worker=\"1\",le=\"0.5\"}"), 2);
  EXPECT_EQ(Value(t, "parasol_worker_pull_seconds_bucket{worker=\"1\",le=\"+Inf\"}"), 2);
  EXPECT_NEAR(Value(t, "parasol_worker_pull_seconds_sum{worker=\"1\"}"), 0.202, 1e-9);
  EXPECT_EQ(Value(t, "parasol_worker_pull_seconds_count{worker=\"1\"}"), 2);
  EXPECT_EQ(Value(t, "parasol_worker_push_seconds_bucket{worker=\"1\",le=\"10\"}"), 0);
  EXPECT_EQ(Value(t, "parasol_worker_push_seconds_bucket{worker=\"1\",le=\"+Inf\"}"), 1);
  EXPECT_EQ(Value(t, "parasol_worker_tick_seconds_count{worker=\"1\"}"), 0);
  // This test process: some resident memory and some CPU time.
  EXPECT_GT(Value(t, "process_resident_memory_bytes{worker=\"1\"}"), 1e6);
  EXPECT_GT(Value(t, "process_cpu_seconds_total{worker=\"1\"}"), 0);
  // Every family declared once, before its samples.
  EXPECT_NE(t.find("# TYPE parasol_worker_pull_seconds histogram"), std::string::npos);
  EXPECT_LT(t.find("# TYPE parasol_worker_pull_seconds histogram"),
            t.find("parasol_worker_pull_seconds_bucket"));
}

}  // namespace
}  // namespace parasol
