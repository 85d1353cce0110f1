// Tiered tables (storage: tiered): a table whose rows cross between memory and disk many times
// answers every pull exactly as the same table kept in memory; its checkpoint covers both tiers;
// a shard's resident memory stays within server.memory_budget plus the documented slack.
#include <gtest/gtest.h>
#include <signal.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "common/net.hpp"
#include "tests/support/json_figures.hpp"
#include "server/shard_server.hpp"
#include "tests/support/test_cluster.hpp"
#include "tests/support/test_seed.hpp"
#include "worker/ps_client.hpp"

namespace parasol {
namespace {

using testing::ResidentBytes;
using testing::TestCluster;

std::string Tables(const std::string& storage, const std::string& optimizer, uint32_t dim,
                   const std::string& extra = "") {
  return "  - name: emb\n    dim: " + std::to_string(dim) + "\n    storage: " + storage +
         "\n    init: {kind: uniform, scale: 0.1}\n    optimizer: " + optimizer + "\n" + extra;
}

// Zipf-like keys over [0, space): a few hot keys and a long tail, so rows move both ways.
std::vector<uint64_t> DrawKeys(std::mt19937_64& rng, uint64_t space, size_t n) {
  std::vector<uint64_t> keys;
  std::uniform_real_distribution<double> u(0.0, 1.0);
  while (keys.size() < n) {
    const uint64_t k = static_cast<uint64_t>(std::pow(static_cast<double>(space), u(rng))) - 1;
    keys.push_back(k * 0x9E3779B97F4A7C15ull);  // spread over the 64-bit space
  }
  std::sort(keys.begin(), keys.end());
  keys.erase(std::unique(keys.begin(), keys.end()), keys.end());
  return keys;
}

Json TableStats(PsClient& c, uint32_t shard) {
  auto stats = c.Stats();
  EXPECT_TRUE(stats.ok()) << stats.status().ToString();
  if (!stats.ok()) return Json();
  return Json::parse((*stats)[shard])["tables"][0];
}

class TieredTest : public ::testing::TestWithParam<const char*> {};

std::string OptimizerName(const ::testing::TestParamInfo<const char*>& info) {
  const std::string o = info.param;
  const size_t b = o.find("kind: ") + 6;
  return o.substr(b, o.find(',', b) - b);
}

// The same seeded workload against a memory table and a tiered one with a budget of a few
// hundred rows per shard: every pull (values and optimizer state) equal bit for bit, with rows
// crossing between the tiers thousands of times.
TEST_P(TieredTest, EveryPullEqualsTheMemoryTableBitForBit) {
  const std::string optimizer = GetParam();
  const std::string extra = "server: {memory_budget: 48KiB, engine_threads: 2}\n";
  TestCluster memory(2, 1, Tables("memory", optimizer, 8), extra);
  TestCluster tiered(2, 1, Tables("tiered", optimizer, 8), extra);
  ASSERT_TRUE(memory.Start());
  ASSERT_TRUE(tiered.Start());
  auto a = memory.Connect(0);
  auto b = tiered.Connect(0);
  ASSERT_TRUE(a && b);
  const uint32_t floats = a->RowFloats(0);
  ASSERT_EQ(floats, b->RowFloats(0));
  const uint64_t seed = testing::TestSeed();
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> g(0.0f, 1.0f);
  uint64_t compared = 0;
  for (int step = 0; step < 120; ++step) {
    const std::vector<uint64_t> keys = DrawKeys(rng, 5000, 400);
    std::vector<float> ra(keys.size() * floats), rb(keys.size() * floats);
    ASSERT_TRUE(a->PullSparseWithState(0, keys, ra.data()).ok());
    ASSERT_TRUE(b->PullSparseWithState(0, keys, rb.data()).ok());
    ASSERT_EQ(std::memcmp(ra.data(), rb.data(), ra.size() * sizeof(float)), 0)
        << "step " << step << " (seed " << seed << ")";
    compared += keys.size();
    // Pull the way training does (creating rows), then push.
    std::vector<float> va(keys.size() * 8), vb(keys.size() * 8), grads(keys.size() * 8);
    ASSERT_TRUE(a->PullSparse(0, keys, va.data()).ok());
    ASSERT_TRUE(b->PullSparse(0, keys, vb.data()).ok());
    ASSERT_EQ(std::memcmp(va.data(), vb.data(), va.size() * sizeof(float)), 0) << "step " << step;
    for (float& x : grads) x = g(rng);
    ASSERT_TRUE(a->PushSparse(0, keys, grads).ok());
    ASSERT_TRUE(b->PushSparse(0, keys, grads).ok());
  }
  // Every key ever touched, at the end.
  std::vector<uint64_t> all;
  for (uint64_t k = 0; k < 5000; ++k) all.push_back(k * 0x9E3779B97F4A7C15ull);
  std::vector<float> ra(all.size() * floats), rb(all.size() * floats);
  ASSERT_TRUE(a->PullSparseWithState(0, all, ra.data()).ok());
  ASSERT_TRUE(b->PullSparseWithState(0, all, rb.data()).ok());
  EXPECT_EQ(std::memcmp(ra.data(), rb.data(), ra.size() * sizeof(float)), 0);
  uint64_t demoted = 0, promoted = 0, rows_a = 0, rows_b = 0;
  for (uint32_t s = 0; s < 2; ++s) {
    const Json t = TableStats(*b, s);
    const Json m = TableStats(*a, s);
    ASSERT_EQ(t["storage"], "tiered") << t.dump();
    demoted += t["demoted"].get<uint64_t>();
    promoted += t["promoted"].get<uint64_t>();
    rows_b += t["rows"].get<uint64_t>();
    rows_a += m["rows"].get<uint64_t>();
    EXPECT_EQ(t["rows"].get<uint64_t>(),
              t["memory_rows"].get<uint64_t>() + t["disk_rows"].get<uint64_t>());
    // The rows' share of the 48 KiB budget (SplitMemoryBudget: what RocksDB, queued replies
    // and checkpoint blocks take goes first; at this size their least leaves the rows a
    // quarter) over rows of their values and state, the clock word, an index entry (4-byte
    // buckets at a load of 0.35 or more: 12 bytes), a key (8) and a referenced flag.
    ServerOptions server;
    server.memory_budget = 48u * 1024;
    const uint64_t share = SplitMemoryBudget(server).rows;
    const uint64_t row_bytes = t["row_bytes"].get<uint64_t>() + 21;
    EXPECT_LE(t["memory_rows"].get<uint64_t>(), share / row_bytes + 2) << t.dump();
    EXPECT_GE(t["memory_rows"].get<uint64_t>(), share / row_bytes - 2) << t.dump();
    EXPECT_EQ(t["disk_error"], "") << t.dump();
  }
  std::printf("%llu rows compared; %llu demotions, %llu promotions; %llu rows\n",
              static_cast<unsigned long long>(compared), static_cast<unsigned long long>(demoted),
              static_cast<unsigned long long>(promoted), static_cast<unsigned long long>(rows_b));
  EXPECT_EQ(rows_a, rows_b);
  EXPECT_GT(demoted, 5000u);
  EXPECT_GT(promoted, 5000u);
}

INSTANTIATE_TEST_SUITE_P(Optimizers, TieredTest,
                         ::testing::Values("{kind: sgd, lr: 0.1}",
                                           "{kind: adagrad, lr: 0.05}",
                                           "{kind: adagrad_rowwise, lr: 0.05}",
                                           "{kind: adam, lr: 0.01}"),
                         OptimizerName);

// A checkpoint of a tiered table holds the rows of both tiers: a shard killed (SIGKILL) and
// restarted from it answers with the same rows and state, bit for bit.
TEST(TieredCheckpointTest, AKilledShardRestoresBothTiers) {
  const std::string dir = testing::MakeTempDir();
  TestCluster job(1, 1, Tables("tiered", "{kind: adagrad, lr: 0.05}", 4),
                  "server: {memory_budget: 32KiB}\ncheckpoint: {dir: " + dir + "}\n");
  ASSERT_TRUE(job.Start());
  auto c = job.Connect(0);
  ASSERT_TRUE(c);
  std::mt19937_64 rng(5);
  std::vector<uint64_t> all;
  for (uint64_t k = 0; k < 20000; ++k) all.push_back(k * 7919 + 3);
  for (int step = 0; step < 20; ++step) {
    std::vector<uint64_t> keys(all.begin() + step * 1000, all.begin() + (step + 1) * 1000);
    std::vector<float> grads(keys.size() * 4, 0.5f + step);
    ASSERT_TRUE(c->PushSparse(0, keys, grads).ok());
  }
  const uint32_t floats = c->RowFloats(0);
  std::vector<float> before(all.size() * floats), after(all.size() * floats);
  ASSERT_TRUE(c->PullSparseWithState(0, all, before.data()).ok());
  const Json t = TableStats(*c, 0);
  EXPECT_GT(t["disk_rows"].get<uint64_t>(), 15000u) << t.dump();
  ASSERT_TRUE(c->Checkpoint().ok());
  job.server(0).Signal(SIGKILL);
  job.server(0).Wait(std::chrono::seconds(10));
  ASSERT_TRUE(job.Respawn(0));
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  auto d = job.Connect(0);
  ASSERT_TRUE(d);
  ASSERT_TRUE(d->PullSparseWithState(0, all, after.data()).ok());
  EXPECT_EQ(std::memcmp(before.data(), after.data(), before.size() * sizeof(float)), 0);
  const Json r = TableStats(*d, 0);
  EXPECT_EQ(r["rows"].get<uint64_t>(), 20000u) << r.dump();
  EXPECT_GT(r["disk_rows"].get<uint64_t>(), 15000u) << r.dump();
  EXPECT_NE(job.ServerLog(0).find("restored"), std::string::npos) << job.ServerLog(0);
  testing::RemoveTree(dir);
}

// A tiered shard's checkpoint is written in the background: a forked child writes the memory
// tier as it was, fed the disk tier's rows from a snapshot of the same moment. Worker 1 keeps
// pushing to the same rows while the (slowed) write runs, which moves rows between the tiers;
// the shard, killed and restarted from that checkpoint, answers with the rows and state of the
// checkpoint's moment, bit for bit, and its log says the write went on in the background. (The
// feed reads the disk rows half a second after the snapshot, once worker 1's pushes landed:
// read from the live store instead, they would be the later rows.)
TEST(TieredCheckpointTest, ABackgroundCheckpointHoldsBothTiersAsTheyWereAtItsMoment) {
  const std::string dir = testing::MakeTempDir();
  TestCluster job(1, 2, Tables("tiered", "{kind: adagrad, lr: 0.05}", 4),
                  "server: {memory_budget: 32KiB}\ncheckpoint: {dir: " + dir + "}\n");
  // The disk rows are read from the snapshot 500 ms after it was taken, while worker 1 pushes.
  job.set_faults("checkpoint.feed=slow");
  ASSERT_TRUE(job.Start());
  auto a = job.Connect(0);
  auto b = job.Connect(1);
  auto observer = job.Connect(PsClient::kObserver);
  ASSERT_TRUE(a && b && observer);
  const uint64_t seed = testing::TestSeed();
  std::mt19937_64 rng(seed);
  std::vector<uint64_t> all;
  for (uint64_t k = 0; k < 20000; ++k) all.push_back(k * 7919 + 3);
  std::uniform_real_distribution<float> g(-1.0f, 1.0f);
  auto push = [&](PsClient& c, size_t from, size_t n) {
    std::vector<uint64_t> keys(all.begin() + from, all.begin() + from + n);
    std::vector<float> grads(keys.size() * 4);
    for (float& x : grads) x = g(rng);
    return c.PushSparse(0, keys, grads);
  };
  for (int step = 0; step < 20; ++step) ASSERT_TRUE(push(*a, step * 1000, 1000).ok());
  const uint32_t floats = a->RowFloats(0);
  std::vector<float> moment(all.size() * floats), after(all.size() * floats);
  ASSERT_TRUE(a->PullSparseWithState(0, all, moment.data()).ok());
  EXPECT_GT(TableStats(*observer, 0)["disk_rows"].get<uint64_t>(), 15000u);

  Status written;
  std::thread writer([&] { written = a->Checkpoint(); });  // answered once it is durable
  bool began = false;
  Status observed;
  for (int i = 0; i < 400 && !began; ++i) {
    auto s = observer->StatsOf(0);
    if (!s.ok()) {
      observed = s.status();
      break;
    }
    began = s->find("\"checkpoint_writing\":true") != std::string::npos;
    if (!began) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  // While it is written: rows on disk and in memory change, and cross between the tiers.
  Status during;
  for (int i = 0; began && during.ok() && i < 3; ++i) {
    during = push(*b, (rng() % 19) * 1000, 1000);
  }
  auto s = observer->StatsOf(0);
  const bool still = s.ok() && s->find("\"checkpoint_writing\":true") != std::string::npos;
  writer.join();
  ASSERT_TRUE(observed.ok()) << observed.ToString();
  ASSERT_TRUE(began) << "the checkpoint was never seen being written";
  ASSERT_TRUE(during.ok()) << during.ToString();
  ASSERT_TRUE(written.ok()) << written.ToString();
  ASSERT_TRUE(still) << "worker 1's pushes did not all land while the checkpoint was written";
  const std::string log = job.ServerLog(0);
  EXPECT_NE(log.find("(requested, in the background)"), std::string::npos) << log;

  job.server(0).Signal(SIGKILL);
  job.server(0).Wait(std::chrono::seconds(10));
  ASSERT_TRUE(job.Respawn(0));
  auto d = job.Connect(PsClient::kObserver);
  ASSERT_TRUE(d);
  // (In pieces: a client outside the job's workers may have little queued at a shard.)
  for (size_t from = 0; from < all.size(); from += 1000) {
    const std::vector<uint64_t> keys(all.begin() + from, all.begin() + from + 1000);
    const Status pulled = d->PullSparseWithState(0, keys, &after[from * floats]);
    ASSERT_TRUE(pulled.ok()) << pulled.ToString();
  }
  for (size_t i = 0; i < all.size(); ++i) {
    ASSERT_EQ(std::memcmp(&moment[i * floats], &after[i * floats], floats * sizeof(float)), 0)
        << "key " << all[i] << " (seed " << seed << ")";
  }
  const Json r = TableStats(*d, 0);
  EXPECT_EQ(r["rows"].get<uint64_t>(), 20000u) << r.dump();
  testing::RemoveTree(dir);
}

// A shard whose tiered table grows to 2 million rows (about 190 MB in memory) grows by no more
// than its 16 MiB budget plus the documented slack (docs/concepts.md, "Tables bigger than memory"), and
// not with the rows: the second million adds little.
TEST(TieredMemoryTest, ResidentMemoryStaysWithinTheBudget) {
  TestCluster job(1, 1, Tables("tiered", "{kind: adagrad, lr: 0.05}", 16),
                  "server: {memory_budget: 16MiB, engine_threads: 2}\n");
  ASSERT_TRUE(job.Start());
  auto c = job.Connect(0);
  ASSERT_TRUE(c);
  // The program's own size (its libraries) before any row.
  const uint64_t base = ResidentBytes(job.server(0).pid());
  uint64_t peak = 0, at_half = 0;
  std::vector<uint64_t> keys(50000);
  std::vector<float> grads(keys.size() * 16, 0.25f);
  for (uint64_t batch = 0; batch < 40; ++batch) {
    for (uint64_t i = 0; i < keys.size(); ++i) keys[i] = batch * keys.size() + i;
    ASSERT_TRUE(c->PushSparse(0, keys, grads).ok());
    peak = std::max(peak, ResidentBytes(job.server(0).pid()));
    if (batch == 19) at_half = peak;
  }
  const Json t = TableStats(*c, 0);
  EXPECT_EQ(t["rows"].get<uint64_t>(), 2000000u) << t.dump();
  EXPECT_GT(t["disk_rows"].get<uint64_t>(), 1800000u) << t.dump();
  const uint64_t slack = 112ull << 20;  // measured: about 90 MiB (docs/concepts.md)
  std::printf("resident: %.1f MiB before any row, %.1f MiB at 1M rows, %.1f MiB at most (2M "
              "rows); allowed growth: budget 16 MiB + slack %llu MiB\n",
              base / 1048576.0, at_half / 1048576.0, peak / 1048576.0,
              static_cast<unsigned long long>(slack >> 20));
  EXPECT_LT(peak - base, (16ull << 20) + slack);
  EXPECT_LT(peak - at_half, 24ull << 20);
}

}  // namespace
}  // namespace parasol
