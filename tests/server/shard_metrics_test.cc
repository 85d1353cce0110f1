// The shard's metrics table (server/shard_metrics.hpp): one row feeds the JSON stats and the
// Prometheus text, so the two agree, and each Prometheus family is written once.
#include "server/shard_metrics.hpp"

#include <gtest/gtest.h>

#include <map>
#include <span>
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

  // What readers of the stats (tests, `parasol stats`, the Python module) and of /metrics rely
  // on, as the shard wrote them before the table: every key with its kind of value, and every
  // family. i: integer, f: floating point, b: bool, s: string, a: array, o: object.
  const std::pair<const char*, char> kKeys[] = {
      {"shard", 'i'}, {"shards", 'i'}, {"requests", 'i'}, {"steps", 'i'},
      {"bad_messages", 'i'}, {"errors", 'i'}, {"checkpoints", 'i'}, {"checkpoints_begun", 'i'},
      {"checkpoint_writing", 'b'}, {"checkpoint_pause_ms_max", 'f'},
      {"checkpoint_seconds_last", 'f'}, {"checkpoint_log_waits", 'i'},
      {"checkpoint_steps_skipped", 'i'},
      {"delta_checkpoints", 'i'}, {"delta_checkpoint_bytes_last", 'i'},
      {"full_checkpoint_bytes_last", 'i'}, {"curve_refusals", 'i'}, {"connections", 'i'},
      {"connection_cap", 'i'}, {"connections_refused_over_cap", 'i'},
      {"connections_evicted_over_cap", 'i'}, {"idle_connections_shut", 'i'},
      {"duplicate_pushes", 'i'}, {"peer_refusals", 'i'}, {"peers", 'i'},
      {"other_peers_queued_bytes", 'i'}, {"members", 'i'}, {"conflicting_resends", 'i'},
      {"unsigned_member_entries", 'i'}, {"nonfinite_pushes", 'i'},
      {"nonfinite_updates_kept", 'i'}, {"pull_ahead_max", 'i'}, {"replayed_pushes", 'i'},
      {"replayed_clocks", 'i'}, {"refused_replays", 'i'}, {"worker_restarts", 'i'},
      {"lost_replays", 'i'}, {"rollbacks", 'i'}, {"rolled_back_requests", 'i'},
      {"rollback_generation", 'i'}, {"rollback_owed", 'b'}, {"stale_replays", 'i'},
      {"push_record_entries", 'i'}, {"rows_pulled", 'i'}, {"rows_pushed", 'i'},
      {"dense_elements_pulled", 'i'}, {"dense_elements_pushed", 'i'}, {"ops", 'o'},
      {"consistency", 's'}, {"clock", 'i'}, {"min_clock", 'i'}, {"max_clock", 'i'},
      {"held_pulls", 'i'}, {"pulls_held_total", 'i'}, {"pull_wait_ms_total", 'f'},
      {"bsp_clocks_applied", 'i'}, {"bsp_rows_before_reply", 'i'},
      {"bsp_rows_after_reply", 'i'}, {"apply_after_reply", 'b'}, {"seconds_waiting", 'f'},
      {"seconds_serving_pushes", 'f'}, {"seconds_serving_ticks", 'f'},
      {"seconds_serving_pulls", 'f'}, {"seconds_serving_other", 'f'},
      {"seconds_applying_clocks", 'f'}, {"tick_pushes_checked", 'i'}, {"pending_clocks", 'i'},
      {"held_bytes", 'i'}, {"open_barriers", 'i'}, {"replies_dropped", 'i'},
      {"queued_reply_bytes", 'i'}, {"warnings_not_logged", 'i'}, {"lost_workers", 'a'},
      {"membership", 'a'}, {"server_changes", 'a'}, {"servers_now", 'i'},
      {"migration_installed", 'i'}, {"migration_dropped", 'i'}, {"key_share", 'f'},
      {"job_failure", 's'}, {"worker_clocks", 'a'}, {"tables", 'a'}};
  const std::pair<const char*, char> kSparseKeys[] = {
      {"name", 's'}, {"kind", 's'}, {"rows", 'i'}, {"bytes", 'i'}, {"bytes_per_row", 'f'},
      {"row_floats", 'i'}, {"row_bytes", 'i'}, {"pending_keys", 'i'}, {"admitted", 'i'},
      {"pushes_counted", 'i'}, {"evicted_ttl", 'i'}, {"evicted_max_rows", 'i'},
      {"pending_expired", 'i'}, {"storage", 's'}};
  const std::pair<const char*, char> kDenseKeys[] = {
      {"name", 's'}, {"kind", 's'}, {"slice_begin", 'i'}, {"slice_end", 'i'}, {"bytes", 'i'},
      {"copies_on_write", 'i'}};
  auto kind = [](const Json& v) {
    return v.is_boolean()           ? 'b'
           : v.is_number_integer()  ? 'i'
           : v.is_number_float()    ? 'f'
           : v.is_string()          ? 's'
           : v.is_array()           ? 'a'
           : v.is_object()          ? 'o'
                                    : '?';
  };
  auto expect_keys = [&](const Json& object, std::span<const std::pair<const char*, char>> keys) {
    for (const auto& [key, want] : keys) {
      ASSERT_TRUE(object.contains(key)) << key;
      EXPECT_EQ(kind(object.at(key)), want) << key << ": " << object.at(key).dump();
    }
  };
  expect_keys(stats, kKeys);
  expect_keys(stats["tables"][0], kSparseKeys);
  expect_keys(stats["tables"][1], kDenseKeys);
  const char* kFamilies[] = {
      "parasol_requests_total", "parasol_request_bytes_total", "parasol_bad_messages_total",
      "parasol_warnings_total", "parasol_warnings_not_logged_total", "parasol_replayed_total",
      "parasol_duplicate_pushes_total", "parasol_conflicting_resends_total",
      "parasol_nonfinite_pushes_total", "parasol_nonfinite_updates_kept_total",
      "parasol_worker_restarts_total", "parasol_lost_replays_total", "parasol_rollbacks_total",
      "parasol_push_record_entries", "parasol_replies_dropped_total",
      "parasol_queued_reply_bytes", "parasol_held_bytes", "parasol_pending_clocks",
      "parasol_bsp_rows_applied_total", "parasol_metrics_connections_refused_total",
      "parasol_metrics_connections_timed_out_total", "parasol_curve_refusals_total",
      "parasol_pull_wait_seconds", "process_resident_memory_bytes", "process_cpu_seconds_total",
      "parasol_held_pulls", "parasol_clock_min", "parasol_clock_max",
      "parasol_checkpoint_age_seconds", "parasol_checkpoints_total", "parasol_lost_workers",
      "parasol_table_rows", "parasol_table_bytes", "parasol_evictions_total",
      "parasol_admission_counted_pushes_total", "parasol_request_thread_seconds_total",
      "parasol_bsp_apply_seconds_total"};
  for (const char* family : kFamilies) EXPECT_EQ(prom.types.count(family), 1u) << family;
}

// The request thread's time goes to the kind of message it served: a pull's to pulls, a push's
// to pushes, a Step that starts with a tick (the tick, then pulls) to ticks, with the BSP clock
// the tick completes counted, as well, in seconds_applying_clocks; a held pull's answer to the
// pulls, whatever released it. No serve loop runs here, so nothing is waited for.
TEST(ShardMetricsTest, TheRequestThreadsTimeGoesToTheKindOfMessageItServed) {
  testing::InProcessShard shard(
      "cluster:\n  servers: [127.0.0.1:1]\n  workers: 1\n"
      "training: {consistency: bsp}\n"
      "tables:\n"
      "  - {name: e, kind: sparse, dim: 16, optimizer: {kind: adagrad, lr: 0.1}}\n",
      "time split");
  std::vector<uint64_t> keys(20000);
  for (size_t i = 0; i < keys.size(); ++i) keys[i] = i * 7919 + 1;
  auto split = [&] {
    const Json s = testing::ParseJson(shard.StatsText());
    EXPECT_FALSE(s.is_discarded());
    std::map<std::string, double> v;
    for (const char* k : {"seconds_waiting", "seconds_serving_pushes", "seconds_serving_ticks",
                          "seconds_serving_pulls", "seconds_serving_other",
                          "seconds_applying_clocks"}) {
      v[k] = s.at(k).get<double>();
    }
    return v;
  };
  const auto start = split();
  for (const auto& [key, seconds] : start) EXPECT_EQ(seconds, 0.0) << key;

  ASSERT_TRUE(shard.Answered(shard.Pull(0, 0, keys)));
  const auto pulled = split();
  EXPECT_GT(pulled.at("seconds_serving_pulls"), 0.0);
  EXPECT_EQ(pulled.at("seconds_serving_pushes"), 0.0);
  EXPECT_EQ(pulled.at("seconds_serving_ticks"), 0.0);

  ASSERT_TRUE(shard.Answered(shard.Push(0, 0, keys)));
  const auto pushed = split();
  EXPECT_GT(pushed.at("seconds_serving_pushes"), 0.0);
  EXPECT_EQ(pushed.at("seconds_serving_pulls"), pulled.at("seconds_serving_pulls"));
  EXPECT_EQ(pushed.at("seconds_serving_ticks"), 0.0);
  EXPECT_EQ(pushed.at("seconds_applying_clocks"), 0.0);  // the clock is not complete yet

  // A pull of the next clock waits for this one: held, its time so far the pulls'.
  const uint64_t held = shard.Pull(0, 1, keys);
  EXPECT_FALSE(shard.Answered(held));
  const auto holding = split();
  EXPECT_GE(holding.at("seconds_serving_pulls"), pulled.at("seconds_serving_pulls"));

  // The tick completes clock 0: its 20,000 sums are applied, the held pull is answered (the
  // pulls' time, though the tick released it), then the pulls behind the tick (the tick's).
  const std::vector<uint64_t> ids = shard.TickAndPull(1, 1, keys);
  ASSERT_TRUE(shard.Answered(ids[0]));
  ASSERT_TRUE(shard.Answered(held));
  const auto ticked = split();
  EXPECT_GT(ticked.at("seconds_serving_ticks"), 0.0);
  EXPECT_GT(ticked.at("seconds_applying_clocks"), 0.0);
  EXPECT_LE(ticked.at("seconds_applying_clocks"), ticked.at("seconds_serving_ticks"));
  EXPECT_GT(ticked.at("seconds_serving_pulls"), holding.at("seconds_serving_pulls"));
  EXPECT_EQ(ticked.at("seconds_serving_pushes"), pushed.at("seconds_serving_pushes"));
  EXPECT_EQ(ticked.at("seconds_waiting"), 0.0);

  const Scraped prom = Scrape(shard.Metrics());
  for (const char* phase : {"waiting", "pushes", "ticks", "pulls", "other"}) {
    EXPECT_EQ(prom.samples.count(std::string("parasol_request_thread_seconds_total{shard=\"0\","
                                             "phase=\"") + phase + "\"}"),
              1u)
        << phase;
  }
}

}  // namespace
}  // namespace parasol
