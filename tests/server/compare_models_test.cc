// parasol compare-models: a NaN differs from everything, a NaN included, and is never hidden by
// the L2 norm it would poison; the values and rows that differ are counted and the first few
// named.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>

#include "common/json_text.hpp"
#include "server/model_export.hpp"

namespace parasol {
namespace {

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

ExportedModel Model() {
  ExportedModel m;
  m.sparse["e"][1] = {1.0f, 2.0f, 3.0f};
  m.sparse["e"][2] = {4.0f, 5.0f, 6.0f};
  m.dense["w"] = {0.5f, -0.5f, 0.25f, 8.0f};
  return m;
}

TEST(CompareModelsTest, EqualModelsDifferNowhere) {
  const ModelDifference d = CompareModels(Model(), Model());
  EXPECT_EQ(d.max_relative, 0.0);
  EXPECT_EQ(d.differing_values, 0u);
  EXPECT_EQ(d.values_compared, 10u);
  EXPECT_TRUE(d.examples.empty());
}

TEST(CompareModelsTest, ANaNInARowWithAnotherDifferenceHidesNeither) {
  ExportedModel a = Model();
  a.sparse["e"][2][0] = kNaN;
  a.sparse["e"][2][2] = 6.5f;
  const ModelDifference d = CompareModels(a, Model());
  EXPECT_EQ(d.differing_values, 2u);
  EXPECT_EQ(d.nonfinite_values, 1u);
  EXPECT_TRUE(std::isinf(d.max_relative));
  EXPECT_EQ(d.where, "e[2]");
  ASSERT_EQ(d.examples.size(), 2u);
  EXPECT_EQ(d.examples[0].rfind("e[2][0]: nan against 4", 0), 0u) << d.examples[0];
  EXPECT_EQ(d.examples[1].rfind("e[2][2]: 6.5 against 6", 0), 0u) << d.examples[1];
  // JSON has no infinity: it says so in words, and the line parses.
  const Json j = Json::parse(d.ToJson(), nullptr, false);
  ASSERT_FALSE(j.is_discarded()) << d.ToJson();
  EXPECT_EQ(j["max_relative_difference"], "inf");
  EXPECT_EQ(j["nonfinite_values"], 1);
}

TEST(CompareModelsTest, NaNInBothModelsAndAnInfinityDiffer) {
  ExportedModel a = Model(), b = Model();
  a.dense["w"][1] = kNaN;
  b.dense["w"][1] = kNaN;
  b.dense["w"][3] = std::numeric_limits<float>::infinity();
  const ModelDifference d = CompareModels(a, b);
  EXPECT_EQ(d.differing_values, 2u);
  EXPECT_EQ(d.nonfinite_values, 2u);
  EXPECT_TRUE(std::isinf(d.max_relative));
  EXPECT_EQ(d.where, "w");
}

TEST(CompareModelsTest, RowsAndTensorsOnlyOneModelHasAreCountedAndNamed) {
  ExportedModel a = Model(), b = Model();
  a.sparse["e"][7] = {0, 0, 0};
  b.sparse["e"].erase(1);
  b.dense["v"] = {1.0f};
  const ModelDifference d = CompareModels(a, b);
  EXPECT_EQ(d.rows_in_one_only, 2u);
  EXPECT_EQ(d.max_relative, 1.0);
  ASSERT_EQ(d.examples.size(), 3u);
  EXPECT_EQ(d.examples[0], "e[1]: only in model A");
  EXPECT_EQ(d.examples[1], "e[7]: only in model A");
  EXPECT_EQ(d.examples[2], "v: only in model B");
}

TEST(CompareModelsTest, ANegativeZeroEqualsZeroAndOnlyTheFirstFewDifferencesAreNamed) {
  ExportedModel a = Model(), b = Model();
  a.dense["w"] = {0.0f, 1, 2, 3};
  b.dense["w"] = {-0.0f, 1, 2, 3};
  EXPECT_EQ(CompareModels(a, b).differing_values, 0u);
  for (uint64_t k = 10; k < 30; ++k) {
    a.sparse["e"][k] = {1, 1, 1};
    b.sparse["e"][k] = {2, 2, 2};
  }
  const ModelDifference d = CompareModels(a, b);
  EXPECT_EQ(d.differing_values, 60u);
  EXPECT_EQ(d.examples.size(), ModelDifference::kExamples);
  EXPECT_NEAR(d.max_relative, 0.5, 1e-12);
}

}  // namespace
}  // namespace parasol
