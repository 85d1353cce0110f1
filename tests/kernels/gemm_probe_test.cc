// The exhaustive cuBLASLt search that the compute benchmark's ceilings come from. Needs a CUDA
// device: skips without one; a build without CUDA refuses to probe.
#include <gtest/gtest.h>

#include "kernels/cuda_check.hpp"
#include "kernels/gemm_probe.hpp"

namespace parasol {
namespace {

TEST(GemmProbeTest, SearchesBeyondTheHeuristicsPicks) {
#ifndef PARASOL_HAVE_CUDA
  auto none = ProbeCublasGemm(false, true, 4096, 64, 367, 367, 367, 64, false,
                              GemmEpilogue::kBiasRelu, 3);
  ASSERT_FALSE(none.ok());
  EXPECT_NE(none.status().message().find("no CUDA"), std::string::npos) << none.status().message();
  GTEST_SKIP() << "this build has no CUDA support";
#else
  if (!CudaDeviceAvailable()) GTEST_SKIP() << CudaUnavailableReason();
  // The top MLP's first layer at batch 4096, with its bias and ReLU epilogue.
  auto probe = ProbeCublasGemm(false, true, 4096, 64, 367, 367, 367, 64, false,
                               GemmEpilogue::kBiasRelu, 3, /*budget_seconds=*/30);
  ASSERT_TRUE(probe.ok()) << probe.status().ToString();
  // The heuristic offers at most 16; the search checks every configuration of every algorithm.
  EXPECT_GT(probe->configurations_checked, 16);
  EXPECT_GE(probe->algorithms, 1);
  EXPECT_FALSE(probe->cut_short);
  EXPECT_GT(probe->best_seconds, 0);
  EXPECT_LT(probe->best_seconds, 0.1);
  // With no time at all the search stops at once and says so; the heuristic's picks are still
  // timed.
  auto cut = ProbeCublasGemm(false, true, 4096, 64, 367, 367, 367, 64, false,
                             GemmEpilogue::kBiasRelu, 3, /*budget_seconds=*/0);
  ASSERT_TRUE(cut.ok()) << cut.status().ToString();
  EXPECT_TRUE(cut->cut_short);
  EXPECT_GE(cut->algorithms, 1);
  EXPECT_LT(cut->configurations_checked, probe->configurations_checked);
#endif
}

}  // namespace
}  // namespace parasol
