// The shard's metrics table (server/shard_metrics.hpp): one row feeds the JSON stats and the
// Prometheus text, so the two agree, and each Prometheus family is written once.
#include "server/shard_metrics.hpp"

#include <gtest/gtest.h>

#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "tests/support/in_process_shard.hpp"

namespace parasol {
namespace {

// "name{labels} value" lines by "name{labels}", and how often each "# TYPE name" appears.
struct Scraped {
  std::map<std::string, double> samples;
  std::map<std::string, int> types;
  std::vector<std::string> order;  // sample names as written
};

Scraped Scrape(const std::string& text) {
  Scraped s;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("# TYPE ", 0) == 0) {
      ++s.types[line.substr(7, line.find(' ', 7) - 7)];
      continue;
    }
    if (line.empty() || line[0] == '#') continue;
    const size_t space = line.rfind(' ');
    s.samples[line.substr(0, space)] = std::stod(line.substr(space + 1));
    s.order.push_back(line.substr(0, line.find_first_of("{ ")));
  }
  return s;
}

TEST(MetricTableTest, FamiliesAreWrittenOnceWithEverySampleAndTheJsonKeepsItsTypes) {
  MetricTable a, b;
  a.Counter("pushes", "x_total", "Things, by kind.", uint64_t{3}, "kind=\"push\"");
  a.Gauge("busy", "x_busy", "1 while busy.", true);
  a.Counter("pulls", "x_total", "", uint64_t{5}, "kind=\"pull\"");
  a.JsonOnly("mode", "bsp");
  a.Gauge("", "x_age_seconds", "Age.", 1.5);
  b.Counter("pushes", "x_total", "Things, by kind.", uint64_t{7}, "kind=\"push\"");

  Json j;
  a.WriteJson(j);
  EXPECT_EQ(j.dump(), R"({"pushes":3,"busy":true,"pulls":5,"mode":"bsp"})");

  PrometheusText one;
  a.WritePrometheus(one, "shard=\"0\"");
  const Scraped s = Scrape(one.str());
  EXPECT_EQ(s.types.at("x_total"), 1);
  EXPECT_EQ(s.samples.at("x_total{shard=\"0\",kind=\"push\"}"), 3);
  EXPECT_EQ(s.samples.at("x_total{shard=\"0\",kind=\"pull\"}"), 5);
  EXPECT_EQ(s.samples.at("x_busy{shard=\"0\"}"), 1);
  EXPECT_EQ(s.samples.at("x_age_seconds{shard=\"0\"}"), 1.5);
  EXPECT_EQ(s.samples.size(), 4u);  // "mode" is JSON only
  // A family's samples follow its TYPE line together.
  EXPECT_EQ(s.order, (std::vector<std::string>{"x_total", "x_total", "x_busy", "x_age_seconds"}));

  PrometheusText both;
  const std::pair<const MetricTable*, std::string> tables[] = {{&a, "t=\"a\""}, {&b, "t=\"b\""}};
  MetricTable::WritePrometheus(both, tables);
  const Scraped t = Scrape(both.str());
  EXPECT_EQ(t.types.at("x_total"), 1);
  EXPECT_EQ(t.samples.at("x_total{t=\"b\",kind=\"push\"}"), 7);
  EXPECT_EQ(t.order[0], "x_total");
  EXPECT_EQ(t.order[2], "x_total");  // b's sample joins a's family, before x_busy
}

// A real shard after pushes, pulls and a tick: every row that has both names has the same value
// in the JSON stats as in the Prometheus text, and no family's TYPE line appears twice.
TEST(ShardMetricsTest, TheStatsAndThePrometheusTextOfARealShardAgreeRowByRow) {
  testing::InProcessShard shard(
      "cluster:\n  servers: [127.0.0.1:1]\n  workers: 1\n"
      "training: {consistency: bsp}\n"
      "tables:\n"
      "  - {name: e, kind: sparse, dim: 4, optimizer: {kind: sgd, lr: 1.0}}\n"
      "  - name: w\n    kind: dense\n    shape: [8]\n    optimizer: {kind: sgd, lr: 1.0}\n",
      "metrics");
  const std::vector<uint64_t> keys = {1, 2, 3, 1ull << 50};
  ASSERT_TRUE(shard.Answered(shard.Pull(0, 0, keys)));
  ASSERT_TRUE(shard.Answered(shard.Push(0, 0, keys)));
  ASSERT_TRUE(shard.Answered(shard.Tick(1)));
  ASSERT_TRUE(shard.Answered(shard.Pull(0, 1, keys)));

  const Json stats = testing::ParseJson(shard.StatsText());
  ASSERT_FALSE(stats.is_discarded());
  const Scraped prom = Scrape(shard.Metrics());
  for (const auto& [name, count] : prom.types) EXPECT_EQ(count, 1) << name;

  // The rows the shard has, with the labels they are written under.
  const std::string label = "shard=\"0\"";
  int compared = 0;
  auto check = [&](const MetricTable& table, const Json& object, const std::string& labels) {
    for (const MetricTable::Row& row : table.rows()) {
      if (row.json.empty() || row.prom.empty()) continue;
      const std::string key =
          row.prom + "{" + labels + (row.labels.empty() ? "" : "," + row.labels) + "}";
      ASSERT_TRUE(prom.samples.count(key)) << key;
      ASSERT_TRUE(object.contains(row.json)) << row.json;
      const Json& v = object.at(row.json);
      const double want = v.is_boolean() ? (v.get<bool>() ? 1.0 : 0.0) : v.get<double>();
      EXPECT_EQ(prom.samples.at(key), want) << key;
      ++compared;
    }
  };
  check(shard.server().Metrics(), stats, label);
  check(shard.server().TableMetrics(0), stats["tables"][0], label + ",table=\"e\"");
  check(shard.server().TableMetrics(1), stats["tables"][1], label + ",table=\"w\"");
  EXPECT_GT(compared, 50);
  // Values that moved: this is the shard's state, not a table of zeros.
  EXPECT_EQ(stats["rows_pushed"], 4);
  EXPECT_EQ(prom.samples.at("parasol_rows_total{shard=\"0\",op=\"push\"}"), 4);
  EXPECT_EQ(prom.samples.at("parasol_table_rows{shard=\"0\",table=\"e\"}"), 4);
  EXPECT_EQ(stats["clock"], 1);
}

}  // namespace
}  // namespace parasol
