#include "server/sparse_table.hpp"

#include <gtest/gtest.h>

#include <vector>

#include "common/initializer.hpp"
#include "common/sharding.hpp"

namespace parasol {
namespace {

TableOptions Table(uint32_t dim) {
  TableOptions t;
  t.name = "emb";
  t.dim = dim;
  t.seed = 99;
  t.init.kind = InitOptions::Kind::kUniform;
  t.init.scale = 0.5;
  return t;
}

TEST(SparseTableTest, ARowIsCreatedOnFirstTouchWithItsInitialValue) {
  SparseTable table(Table(8), 2);
  const uint64_t key = 777;
  SparseTable::Partition& p = table.partition(EngineOfKey(key, 2));
  EXPECT_EQ(p.Find(key), nullptr);
  float* row = p.FindOrCreate(key);
  std::vector<float> want(8);
  InitSparseRow(table.options().init, 99, key, want);
  EXPECT_EQ(std::vector<float>(row, row + 8), want);
  EXPECT_EQ(p.Find(key), row);
  EXPECT_EQ(table.TotalRows(), 1u);
}

TEST(SparseTableTest, RowsStayPutAsTheTableGrows) {
  SparseTable table(Table(4), 1);
  SparseTable::Partition& p = table.partition(0);
  float* first = p.FindOrCreate(1);
  first[0] = 42.0f;
  for (uint64_t k = 2; k < 100000; ++k) p.FindOrCreate(k);
  EXPECT_EQ(p.Find(1), first);
  EXPECT_EQ(first[0], 42.0f);
  EXPECT_EQ(table.TotalRows(), 99999u);
  EXPECT_GE(table.MemoryBytes(), 99999u * 4 * sizeof(float));
}

}  // namespace
}  // namespace parasol
