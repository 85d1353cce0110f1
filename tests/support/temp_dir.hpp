// TempDirTest: a test fixture with a fresh temporary folder (dir_), removed after the test.
#pragma once

#include <gtest/gtest.h>
#include <stdlib.h>

#include <filesystem>
#include <string>

namespace parasol::testing {

class TempDirTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string name = "/tmp/parasol-test-XXXXXX";
    ASSERT_NE(::mkdtemp(name.data()), nullptr);
    dir_ = name;
  }
  void TearDown() override {
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }

  std::string dir_;
};

}  // namespace parasol::testing
