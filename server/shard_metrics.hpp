// Shard metrics: one table of what a shard counts, which feeds both its JSON stats (the Stats
// request, `parasol stats`) and its Prometheus text (GET /metrics).
//
// Each row is one value, named once for each reader: its key in the JSON object and its
// Prometheus name, type, help and labels. A row without a Prometheus name is JSON only (a
// string, a setting); one without a JSON key is Prometheus only (a labelled sample of a family
// whose JSON holds its parts under other keys). Rows that share a Prometheus name are one
// family: its "# HELP" and "# TYPE" are written once, before all of its samples, which the
// text format requires, also when the rows come from several tables (one per model table).
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "common/json_text.hpp"
#include "common/metrics_server.hpp"

namespace parasol {

class MetricTable {
 public:
  enum class Type { kCounter, kGauge };
  struct Row {
    std::string json;    // key in the JSON object ("": Prometheus only)
    std::string prom;    // Prometheus name ("": JSON only)
    Type type = Type::kCounter;
    std::string help;    // Prometheus help, the family's from its first row
    std::string labels;  // the sample's own labels (`kind="push"`), after the shared ones
    Json value;          // a number or a boolean (Prometheus: 1 or 0); JSON only: anything
  };

  void Counter(std::string json, std::string prom, std::string help, Json value,
               std::string labels = "") {
    rows_.push_back(Row{std::move(json), std::move(prom), Type::kCounter, std::move(help),
                        std::move(labels), std::move(value)});
  }
  void Gauge(std::string json, std::string prom, std::string help, Json value,
             std::string labels = "") {
    rows_.push_back(Row{std::move(json), std::move(prom), Type::kGauge, std::move(help),
                        std::move(labels), std::move(value)});
  }
  // A value the JSON stats hold and Prometheus does not (a string, a setting).
  void JsonOnly(std::string json, Json value) {
    rows_.push_back(Row{std::move(json), "", Type::kGauge, "", "", std::move(value)});
  }

  const std::vector<Row>& rows() const { return rows_; }

  // Every row with a JSON key into `object`, in the table's order.
  void WriteJson(Json& object) const;
  // Every row with a Prometheus name, family by family in the order of their first rows;
  // `labels` (`shard="0"`) go before each row's own.
  void WritePrometheus(PrometheusText& t, const std::string& labels) const;
  // The same for several tables at once (one per model table, each with its labels): a family
  // whose rows several tables hold is written once, with the samples of all of them.
  static void WritePrometheus(PrometheusText& t,
                              std::span<const std::pair<const MetricTable*, std::string>> tables);

 private:
  std::vector<Row> rows_;
};

}  // namespace parasol
