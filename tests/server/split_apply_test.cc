// A BSP tick that completes a clock: the shard applies first the rows the pulls it is about to
// answer read, answers them, and applies the clock's other rows after (docs/internals.md, "Answering a
// step's pulls first"). Driven in process through ShardServer::HandleMessage, next to a shard
// whose table evicts (so it never splits): every reply, held pulls' included, is the same byte
// for byte, and the counters say which rows went before the reply and which after.
#include <gtest/gtest.h>

#include <cstring>
#include <map>
#include <span>
#include <string>
#include <vector>

#include "common/cpu_affinity.hpp"
#include "tests/support/in_process_shard.hpp"

namespace parasol {
namespace {

constexpr uint32_t kDim = 4;

std::string Table(const std::string& name, const std::string& optimizer, bool evicting) {
  return "  - {name: " + name + ", kind: sparse, dim: 4, optimizer: {kind: " + optimizer +
         ", lr: 0.5}" + (evicting ? ", eviction: {ttl_clocks: 1000000}" : "") + "}\n";
}

// One in-process shard (1 worker, BSP, 2 engine threads). Tables 0 and 2 split unless
// `evicting` or `after` (server.apply_after_reply) is never; table 1 evicts, so never splits.
class SplitShard : public testing::InProcessShard {
 public:
  SplitShard(bool evicting, const std::string& after)
      : InProcessShard("cluster:\n  servers: [127.0.0.1:1]\n  workers: 1\n"
                       "server:\n  engine_threads: 2\n  apply_after_reply: " + after + "\n"
                       "training: {consistency: bsp}\n"
                       "tables:\n" +
                           Table("a", "adagrad_rowwise", evicting) +
                           Table("b", "adagrad", true) + Table("c", "adam", evicting),
                       "split-apply") {}
};

std::vector<uint64_t> Keys(uint64_t first, uint64_t count) {
  std::vector<uint64_t> k;
  for (uint64_t i = 0; i < count; ++i) k.push_back((first + i) * 0x9E3779B97F4A7C15ull);
  return k;
}

std::vector<uint64_t> Join(std::vector<uint64_t> a, const std::vector<uint64_t>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

TEST(SplitApplyTest, ATicksPullsAreAnsweredAfterTheirRowsAndTheOtherRowsAreAppliedAfter) {
  // `never` applies its whole clocks before the reply, as the evicting tables do.
  SplitShard split(/*evicting=*/false, "always"), whole(/*evicting=*/true, "always"),
      never(/*evicting=*/false, "never");
  SplitShard* const shards[] = {&split, &whole, &never};
  constexpr uint32_t kTables = 3;
  // A: pushed and read by the pulls the tick answers; B: pushed only; C: read only.
  const std::vector<uint64_t> a = Keys(0, 300), b = Keys(1000, 500), c = Keys(5000, 200);
  uint64_t before_reply = 0, after_reply = 0;
  for (int64_t clock = 0; clock < 4; ++clock) {
    // Each clock moves the sets: what was pushed only is read next, and so on.
    const std::vector<uint64_t>& read = clock % 2 ? b : a;
    const std::vector<uint64_t>& only = clock % 2 ? a : b;
    for (SplitShard* s : shards) {
      for (uint32_t t = 0; t < kTables; ++t) s->Push(t, clock, Join(read, only));
    }
    std::vector<std::vector<uint64_t>> pulls(3);  // [shard][table]
    for (size_t i = 0; i < 3; ++i) {
      SplitShard* s = shards[i];
      if (clock < 2) {
        // Pulls held for the tick, then the tick alone.
        for (uint32_t t = 0; t < kTables; ++t) {
          pulls[i].push_back(s->Pull(t, clock + 1, Join(read, c)));
          EXPECT_FALSE(s->Answered(pulls[i].back())) << "a pull of the next clock waits";
        }
        EXPECT_TRUE(s->Answered(s->Tick(clock + 1)));
      } else {
        // The tick and the pulls in one Step, as workers send them.
        pulls[i] = s->TickAndPull(clock + 1, kTables, Join(read, c));
      }
    }
    // The pulls: equal to the shards that applied everything first.
    for (uint32_t t = 0; t < kTables; ++t) {
      ASSERT_TRUE(split.Answered(pulls[0][t]) && whole.Answered(pulls[1][t]) &&
                  never.Answered(pulls[2][t]));
      EXPECT_EQ(split.Reply(pulls[0][t]), whole.Reply(pulls[1][t]))
          << "clock " << clock << ", table " << t;
      EXPECT_EQ(never.Reply(pulls[2][t]), whole.Reply(pulls[1][t]))
          << "clock " << clock << ", table " << t;
      EXPECT_EQ(split.Reply(pulls[0][t]).size(),
                (read.size() + c.size()) * kDim * sizeof(float));
    }
    // Tables 0 and 2 leave their pushed-only rows for after the reply; table 1 applies all.
    before_reply += 2 * read.size() + read.size() + only.size();
    after_reply += 2 * only.size();
    EXPECT_EQ(split.Stat("bsp_rows_before_reply"), before_reply) << "clock " << clock;
    EXPECT_EQ(split.Stat("bsp_rows_after_reply"), after_reply) << "clock " << clock;
    for (SplitShard* s : {&whole, &never}) {
      EXPECT_EQ(s->Stat("bsp_rows_after_reply"), 0u);
      EXPECT_EQ(s->Stat("bsp_rows_before_reply"), before_reply + after_reply);
    }
    // Every row, the ones applied after the reply included, as one pass leaves it.
    const std::vector<uint64_t> all = Join(Join(a, b), c);
    for (uint32_t t = 0; t < kTables; ++t) {
      const uint64_t p = split.Pull(t, clock + 1, all), q = whole.Pull(t, clock + 1, all),
                     r = never.Pull(t, clock + 1, all);
      EXPECT_EQ(split.Reply(p), whole.Reply(q)) << "clock " << clock << ", table " << t;
      EXPECT_EQ(never.Reply(r), whole.Reply(q)) << "clock " << clock << ", table " << t;
      EXPECT_EQ(split.Reply(p).size(), all.size() * kDim * sizeof(float));
    }
  }
  // /metrics says the same.
  const std::string metrics = split.Metrics();
  EXPECT_NE(metrics.find("pass=\"before_reply\"} " + std::to_string(before_reply) + "\n"),
            std::string::npos)
      << metrics;
  EXPECT_NE(metrics.find("pass=\"after_reply\"} " + std::to_string(after_reply) + "\n"),
            std::string::npos)
      << metrics;
  // The pushed rows moved (the comparisons above are not of untouched rows).
  SplitShard fresh(/*evicting=*/false, "always");
  for (uint32_t t = 0; t < kTables; ++t) {
    const uint64_t untouched = fresh.Pull(t, 0, a);
    const uint64_t trained = split.Pull(t, 4, a);
    EXPECT_NE(fresh.Reply(untouched), split.Reply(trained)) << "table " << t;
  }
}

// server.apply_after_reply: auto applies after the reply only where the shard's process may run
// on a core beyond its engine threads (docs/internals.md says why); the stats say which.
TEST(SplitApplyTest, AutoAppliesAfterTheReplyOnlyWithACoreBeyondTheEngineThreads) {
  ServerOptions o;
  ASSERT_EQ(o.apply_after_reply, ServerOptions::ApplyAfterReply::kAuto);
  o.engine_threads = 2;
  EXPECT_FALSE(ApplyAfterReply(o, 0));  // cores unknown
  EXPECT_FALSE(ApplyAfterReply(o, 1));
  EXPECT_FALSE(ApplyAfterReply(o, 2));
  EXPECT_TRUE(ApplyAfterReply(o, 3));
  EXPECT_TRUE(ApplyAfterReply(o, 16));
  o.engine_threads = 1;
  EXPECT_TRUE(ApplyAfterReply(o, 2));
  o.apply_after_reply = ServerOptions::ApplyAfterReply::kAlways;
  EXPECT_TRUE(ApplyAfterReply(o, 0));
  EXPECT_TRUE(ApplyAfterReply(o, 1));
  o.apply_after_reply = ServerOptions::ApplyAfterReply::kNever;
  EXPECT_FALSE(ApplyAfterReply(o, 64));
  // auto: as the rule gives for the cores this process may keep busy.
  o.apply_after_reply = ServerOptions::ApplyAfterReply::kAuto;
  o.engine_threads = 2;
  const bool here = ApplyAfterReply(o, UsableCores());
  for (const auto& [after, want] : std::map<std::string, bool>{
           {"always", true}, {"never", false}, {"auto", here}}) {
    SplitShard s(/*evicting=*/false, after);
    const Json stats = testing::ParseJson(s.StatsText());
    ASSERT_TRUE(stats.contains("apply_after_reply")) << stats.dump();
    EXPECT_EQ(stats["apply_after_reply"].get<bool>(), want) << after;
  }
}

}  // namespace
}  // namespace parasol
