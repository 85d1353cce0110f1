#include "common/cpu_affinity.hpp"

#include <gtest/gtest.h>

#include <thread>

namespace parasol {
namespace {

// A container's CPU limit is a quota over a period (cgroup v2 cpu.max, v1 cfs_quota_us and
// cfs_period_us): the cores it allows, rounded up.
TEST(CpuAffinityTest, ACpuQuotaAllowsItsCoresRoundedUp) {
  EXPECT_EQ(CoresOfQuota(200000, 100000), 2u);
  EXPECT_EQ(CoresOfQuota(150000, 100000), 2u);
  EXPECT_EQ(CoresOfQuota(50000, 100000), 1u);
  EXPECT_EQ(CoresOfQuota(0, 100000), 1u);
  EXPECT_EQ(CoresOfQuota(-1, 100000), std::nullopt);  // v1: no quota
  EXPECT_EQ(CoresOfQuota(100000, 0), std::nullopt);
  EXPECT_EQ(CoresOfCpuMax("200000 100000\n"), 2u);
  EXPECT_EQ(CoresOfCpuMax("350000 100000"), 4u);
  EXPECT_EQ(CoresOfCpuMax("max 100000\n"), std::nullopt);
  for (const char* bad : {"", "\n", "200000", "2e5 100000", "200000 100000 1", "-5 x", " 1 2"}) {
    EXPECT_EQ(CoresOfCpuMax(bad), std::nullopt) << "'" << bad << "'";
  }
}

// What this process may keep busy: never more than its affinity allows, and known here.
TEST(CpuAffinityTest, UsableCoresAreAtMostTheProcessesCores) {
  const uint32_t usable = UsableCores();
  EXPECT_GE(usable, 1u);
  const size_t affinity =
      ProcessCores().empty() ? std::thread::hardware_concurrency() : ProcessCores().size();
  EXPECT_LE(usable, affinity);
}

}  // namespace
}  // namespace parasol
