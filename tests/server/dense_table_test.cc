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
