// TestSeed: the seed a randomised test draws its moments (kill points, keys, schedules) from.
//
// Under ctest the seed is fixed: tests/CMakeLists.txt gives every test PARASOL_TEST_SEED
// (the cache variable of the same name, 1 unless set), so a CI run repeats the last one. Run by
// hand without it, each run draws a new seed. Either way the seed is printed with the line that
// repeats the run; a test mixes it with its own name, so that tests sharing one value still
// draw different moments.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <string_view>

namespace parasol::testing {

inline uint64_t TestSeed() {
  const char* given = std::getenv("PARASOL_TEST_SEED");
  uint64_t base = 0;
  char* end = nullptr;
  if (given && *given) {
    base = std::strtoull(given, &end, 10);
    if (*end != '\0') {
      ADD_FAILURE() << "PARASOL_TEST_SEED is not a number: \"" << given << "\"";
      base = 0;
    }
  } else {
    base = std::random_device{}() % 1000000;
  }
  const ::testing::TestInfo* info = ::testing::UnitTest::GetInstance()->current_test_info();
  const std::string name =
      info ? std::string(info->test_suite_name()) + "." + info->name() : std::string("?");
  std::printf("[ seed     ] %llu for %s (PARASOL_TEST_SEED=%llu --gtest_filter=%s repeats it)\n",
              static_cast<unsigned long long>(base), name.c_str(),
              static_cast<unsigned long long>(base), name.c_str());
  std::fflush(stdout);
  // FNV-1a of the name, then splitmix64 of the sum: one value gives each test its own seed.
  uint64_t h = 1469598103934665603ull;
  for (const char c : name) h = (h ^ static_cast<unsigned char>(c)) * 1099511628211ull;
  uint64_t z = base + h + 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return (z ^ (z >> 31)) % 1000000007ull;
}

}  // namespace parasol::testing
