// IsLoopbackHost: by what a host resolves to, not by how it is spelled.
#include <gtest/gtest.h>

#include "common/net.hpp"

namespace parasol {
namespace {

TEST(NetTest, LoopbackIsWhatAHostResolvesTo) {
  EXPECT_TRUE(IsLoopbackHost("127.0.0.1"));
  EXPECT_TRUE(IsLoopbackHost("127.3.4.5"));
  EXPECT_TRUE(IsLoopbackHost("::1"));
  EXPECT_TRUE(IsLoopbackHost("localhost"));
  EXPECT_FALSE(IsLoopbackHost("10.1.2.3"));
  EXPECT_FALSE(IsLoopbackHost("128.0.0.1"));
  EXPECT_FALSE(IsLoopbackHost("0.0.0.0"));
  EXPECT_FALSE(IsLoopbackHost("*"));
  EXPECT_FALSE(IsLoopbackHost(""));
  // A name spelled like a loopback address that resolves to nothing here (or elsewhere).
  EXPECT_FALSE(IsLoopbackHost("127.0.0.1.invalid"));
}

}  // namespace
}  // namespace parasol
