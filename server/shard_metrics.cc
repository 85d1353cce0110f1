#include "server/shard_metrics.hpp"

#include <unordered_set>

namespace parasol {

namespace {

double SampleValue(const Json& value) {
  if (value.is_boolean()) return value.get<bool>() ? 1.0 : 0.0;
  if (value.is_number()) return value.get<double>();
  return 0.0;
}

std::string JoinLabels(const std::string& a, const std::string& b) {
  if (a.empty()) return b;
  if (b.empty()) return a;
  return a + "," + b;
}

}  // namespace

void MetricTable::WriteJson(Json& object) const {
  for (const Row& row : rows_) {
    if (!row.json.empty()) object[row.json] = row.value;
  }
}

void MetricTable::WritePrometheus(PrometheusText& t, const std::string& labels) const {
  const std::pair<const MetricTable*, std::string> one[] = {{this, labels}};
  WritePrometheus(t, one);
}

void MetricTable::WritePrometheus(
    PrometheusText& t, std::span<const std::pair<const MetricTable*, std::string>> tables) {
  std::unordered_set<std::string> written;
  for (const auto& [table, unused] : tables) {
    for (const Row& first : table->rows_) {
      if (first.prom.empty() || !written.insert(first.prom).second) continue;
      t.Type(first.prom, first.type == Type::kCounter ? "counter" : "gauge", first.help);
      for (const auto& [other, labels] : tables) {
        for (const Row& row : other->rows_) {
          if (row.prom != first.prom) continue;
          t.Sample(row.prom, SampleValue(row.value), JoinLabels(labels, row.labels));
        }
      }
    }
  }
}

}  // namespace parasol
