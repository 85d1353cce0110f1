#include "server/sparse_table.hpp"

#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <map>
#include <vector>

#include "common/half.hpp"
#include "server/disk_tier.hpp"
#include "common/initializer.hpp"
#include "common/sharding.hpp"

namespace parasol {
namespace {

TableOptions Table(uint32_t dim) {
  TableOptions t;
  t.name = std::string("emb");
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
  float* row = p.FindOrCreate(key, 3);
  std::vector<float> want(8);
  InitSparseRow(table.options().init, 99, key, want);
  EXPECT_EQ(std::vector<float>(row, row + 8), want);
  EXPECT_EQ(p.Find(key), row);
  EXPECT_EQ(SparseTable::Partition::LastClock(row), 3u);
  EXPECT_EQ(table.TotalRows(), 1u);
}

TEST(SparseTableTest, RowsStayPutAsTheTableGrows) {
  SparseTable table(Table(4), 1);
  SparseTable::Partition& p = table.partition(0);
  float* first = p.FindOrCreate(1, 0);
  first[0] = 42.0f;
  for (uint64_t k = 2; k < 100000; ++k) p.FindOrCreate(k, 0);
  EXPECT_EQ(p.Find(1), first);
  EXPECT_EQ(first[0], 42.0f);
  EXPECT_EQ(table.TotalRows(), 99999u);
  EXPECT_GE(table.MemoryBytes(), 99999u * 4 * sizeof(float));
}

TEST(SparseTableTest, AdmissionCreatesTheRowAtTheNthPush) {
  TableOptions t = Table(4);
  t.admission.min_count = 3;
  SparseTable table(t, 1);
  SparseTable::Partition& p = table.partition(0);
  EXPECT_EQ(p.CountPush(5, 0), nullptr);
  EXPECT_EQ(p.CountPush(5, 0), nullptr);
  EXPECT_EQ(p.Find(5), nullptr);
  EXPECT_EQ(p.pending_keys(), 1u);
  float* row = p.CountPush(5, 0);
  ASSERT_NE(row, nullptr);
  EXPECT_EQ(p.Find(5), row);
  EXPECT_EQ(p.pending_keys(), 0u);
  EXPECT_EQ(p.counters().pushes_counted, 2u);
  EXPECT_EQ(p.counters().admitted, 1u);
}

TEST(SparseTableTest, TtlSweepEvictsOnlyIdleRowsAndReusesTheirSlots) {
  TableOptions t = Table(4);
  t.eviction.ttl_clocks = 2;
  SparseTable table(t, 1);
  SparseTable::Partition& p = table.partition(0);
  for (uint64_t k = 0; k < 1000; ++k) p.FindOrCreate(k, /*clock=*/k < 500 ? 1 : 3);
  p.Sweep(1 << 20, /*now=*/4);  // rows of clock 1 are 3 clocks old; rows of clock 3 only 1
  EXPECT_EQ(p.rows(), 500u);
  EXPECT_EQ(p.counters().evicted_ttl, 500u);
  for (uint64_t k = 0; k < 1000; ++k) EXPECT_EQ(p.Find(k) != nullptr, k >= 500) << k;
  const uint64_t bytes = p.MemoryBytes();
  for (uint64_t k = 2000; k < 2500; ++k) p.FindOrCreate(k, 4);  // reuses the freed slots
  EXPECT_EQ(p.MemoryBytes(), bytes);
}

TEST(SparseTableTest, AnEvictedRowComesBackWithItsInitialValue) {
  TableOptions t = Table(4);
  t.eviction.ttl_clocks = 1;
  SparseTable table(t, 1);
  SparseTable::Partition& p = table.partition(0);
  float* row = p.FindOrCreate(9, 0);
  std::vector<float> init(row, row + 4);
  row[0] += 1.0f;
  p.Sweep(1 << 20, 5);
  ASSERT_EQ(p.Find(9), nullptr);
  row = p.FindOrCreate(9, 5);
  EXPECT_EQ(std::vector<float>(row, row + 4), init);
}

TEST(SparseTableTest, MaxRowsEvictsTheLeastRecentlyUpdatedFirst) {
  TableOptions t = Table(4);
  t.eviction.max_rows = 300;
  SparseTable table(t, 1);
  SparseTable::Partition& p = table.partition(0);
  for (uint64_t k = 0; k < 900; ++k) p.FindOrCreate(k, static_cast<uint32_t>(k / 300));
  // One pass measures the clocks, the next evicts the oldest.
  for (int i = 0; i < 4; ++i) p.Sweep(1 << 20, 3);
  EXPECT_LE(p.rows(), 300u + 1);
  EXPECT_GE(p.rows(), 300u);
  for (uint64_t k = 600; k < 900; ++k) EXPECT_NE(p.Find(k), nullptr) << k;
  EXPECT_EQ(p.counters().evicted_max_rows, 900u - p.rows());
}

TEST(SparseTableTest, AdmissionCountsExpireLikeRows) {
  TableOptions t = Table(4);
  t.admission.min_count = 3;
  t.eviction.ttl_clocks = 5;
  SparseTable table(t, 1);
  SparseTable::Partition& p = table.partition(0);
  for (uint64_t key = 0; key < 1000; ++key) EXPECT_EQ(p.CountPush(key, key < 500 ? 1 : 8), nullptr);
  EXPECT_EQ(table.PendingKeys(), 1000u);
  p.Sweep(1 << 20, 10);  // counts last touched at clock 1 are 9 clocks old; those at 8, 2
  EXPECT_EQ(table.PendingKeys(), 500u);
  EXPECT_EQ(table.TotalCounters().pending_expired, 500u);
  // An expired count starts again: key 0 needs three more pushes.
  EXPECT_EQ(p.CountPush(0, 10), nullptr);
  EXPECT_EQ(p.CountPush(0, 10), nullptr);
  EXPECT_NE(p.CountPush(0, 10), nullptr);
  // A count kept through the sweep goes on: key 999 had one push, two more admit it.
  EXPECT_EQ(p.CountPush(999, 10), nullptr);
  EXPECT_NE(p.CountPush(999, 10), nullptr);
}

TEST(SparseTableTest, AdmissionCountsCountTowardsMaxRowsAndGoFirst) {
  TableOptions t = Table(4);
  t.admission.min_count = 2;
  t.eviction.max_rows = 100;
  SparseTable table(t, 1);
  SparseTable::Partition& p = table.partition(0);
  for (uint64_t key = 0; key < 60; ++key) p.FindOrCreate(key, 1);
  for (uint64_t key = 1000; key < 11000; ++key) p.CountPush(key, 2);
  EXPECT_EQ(table.PendingKeys(), 10000u);
  for (int i = 0; i < 4; ++i) p.Sweep(1 << 20, 3);
  EXPECT_LE(table.TotalRows() + table.PendingKeys(), 100u);
  EXPECT_EQ(table.TotalRows(), 60u);  // the rows stay: the counts went first
  EXPECT_EQ(table.PendingKeys(), 40u);
}

}  // namespace
}  // namespace parasol

namespace parasol {
namespace {

// A 16-bit row: every optimizer step equals the f32 step on the stored (rounded) values and
// state, rounded to the dtype (to nearest even); the row takes the bytes the dtype says.
TEST(SparseTableDtypeTest, AnOptimizerStepEqualsTheF32StepRounded) {
  for (DType values : {DType::kBf16, DType::kF16}) {
    for (DType state : {DType::kF32, DType::kBf16}) {
      for (auto kind : {OptimizerOptions::Kind::kSgd, OptimizerOptions::Kind::kAdagrad,
                        OptimizerOptions::Kind::kAdagradRowwise, OptimizerOptions::Kind::kAdam}) {
        TableOptions t = Table(6);
        t.dtype = values;
        t.state_dtype = state;
        t.optimizer.kind = kind;
        t.optimizer.lr = 0.05;
        SparseTable table(t, 1);
        SparseTable::Partition& p = table.partition(0);
        const Optimizer& opt = table.optimizer();
        const uint32_t floats = 1 + 6 + opt.SparseStateFloats(6);
        // The reference: the row as stored, in f32, stepped in f32 and rounded as stored.
        std::vector<float> ref(floats);
        float* row = p.FindOrCreate(42, 0);
        std::copy(row - 1, row - 1 + floats, ref.begin());
        std::vector<float> init(6);
        InitSparseRow(t.init, t.seed, 42, init);
        for (int i = 0; i < 6; ++i) ASSERT_EQ(ref[1 + i], RoundedTo(values, init[i]));
        for (int step = 0; step < 20; ++step) {
          std::vector<float> g(6);
          for (int i = 0; i < 6; ++i) g[i] = 0.37f * static_cast<float>((step * 7 + i) % 5) - 0.7f;
          const auto* gb = reinterpret_cast<const std::byte*>(g.data());
          float* r = ref.data() + 1;
          opt.Apply(r, opt.SparseState(r, 6), gb, 6, 1.0);
          for (int i = 0; i < 6; ++i) r[i] = RoundedTo(values, r[i]);
          const uint32_t raw = kind == OptimizerOptions::Kind::kAdam ? 1 : 0;
          for (uint32_t i = 6; i + raw < floats - 1; ++i) r[i] = RoundedTo(state, r[i]);
          float* got = p.Find(42);
          opt.Apply(got, opt.SparseState(got, 6), gb, 6, 1.0);
          p.Store(got);
          got = p.Find(42);
          ASSERT_EQ(0, std::memcmp(got - 1, ref.data(), sizeof(float) * floats))
              << "step " << step << " optimizer " << static_cast<int>(kind);
        }
        // No clock word: the table evicts nothing.
        const uint32_t want_words =
            3 + (state == DType::kF32 ? opt.SparseStateFloats(6)
                     : kind == OptimizerOptions::Kind::kAdam ? (12 + 1) / 2 + 1
                                                           : (opt.SparseStateFloats(6) + 1) / 2);
        EXPECT_EQ(p.stored_words(), want_words) << static_cast<int>(kind);
      }
    }
  }
}

// Stochastic rounding of a row depends on the table's seed, the write's name and the key
// only: the same writes round alike whatever the partitioning (engine_threads), the order of
// the keys and the rows written before (a restarted shard replays them in its own order); they
// are unbiased; other names draw otherwise.
TEST(SparseTableDtypeTest, StochasticRoundingDependsOnTheWriteAndTheKeyOnly) {
  TableOptions t = Table(4);
  t.dtype = DType::kBf16;
  t.rounding = TableOptions::Rounding::kStochastic;
  t.init.kind = InitOptions::Kind::kConstant;
  t.init.value = 1.0;
  t.optimizer.kind = OptimizerOptions::Kind::kSgd;
  t.optimizer.lr = 1.0;
  const float spacing = 1.0f / 128;  // bf16 at 1.0
  const std::vector<float> g(4, -0.3f * spacing);
  const auto* gb = reinterpret_cast<const std::byte*>(g.data());
  constexpr uint64_t kKeys = 5000;
  // Writes `names` to every key, in key order or reversed; returns each key's values.
  auto run = [&](uint32_t engines, bool reversed, std::vector<uint64_t> names) {
    SparseTable table(t, engines);
    for (uint64_t name : names) {
      for (uint32_t e = 0; e < engines; ++e) table.partition(e).SetWrite(name);
      for (uint64_t i = 0; i < kKeys; ++i) {
        const uint64_t key = reversed ? kKeys - 1 - i : i;
        SparseTable::Partition& p = table.partition(EngineOfKey(key, engines));
        float* row = p.FindOrCreate(key, 0);
        table.optimizer().Apply(row, table.optimizer().SparseState(row, 4), gb, 4, 1.0);
        p.Store(row);
      }
    }
    std::vector<float> out;
    for (uint64_t key = 0; key < kKeys; ++key) {
      const float* row = table.partition(EngineOfKey(key, engines)).Find(key);
      out.insert(out.end(), row, row + 4);
    }
    return out;
  };
  const std::vector<float> a = run(1, false, {11});
  EXPECT_EQ(a, run(3, true, {11}));
  size_t up = 0;
  for (float x : a) {
    ASSERT_TRUE(x == 1.0f || x == 1.0f + spacing) << x;
    up += x != 1.0f;
  }
  EXPECT_NEAR(static_cast<double>(up) / a.size(), 0.3, 0.016);  // 5 standard deviations
  EXPECT_NE(a, run(1, false, {12}));
  EXPECT_EQ(run(1, false, {11, 12}), run(2, true, {11, 12}));
}

// A 16-bit table stores its rows' clock word only when it evicts (ttl_clocks or max_rows):
// with it, the TTL sweep and max_rows evict bf16 rows as they do f32 rows; without it, the
// row is a word shorter and its view's clock reads 0.
TEST(SparseTableDtypeTest, TheClockWordIsStoredOnlyWhenTheTableEvicts) {
  TableOptions plain = Table(4);
  plain.dtype = DType::kBf16;
  SparseTable a(plain, 1);
  EXPECT_EQ(a.partition(0).stored_words(), 2u);  // 4 bf16 values, sgd: no state, no clock
  float* row = a.partition(0).FindOrCreate(5, 7);
  EXPECT_EQ(SparseTable::Partition::LastClock(row), 0u);  // the row as stored
  row[0] = 2.0f;
  SparseTable::Partition::LastClock(row) = 9;
  a.partition(0).Store(row);
  row = a.partition(0).Find(5);
  EXPECT_EQ(row[0], 2.0f);
  EXPECT_EQ(SparseTable::Partition::LastClock(row), 0u);
  a.partition(0).Sweep(1 << 20, 1000);  // evicts nothing, reads no clock
  EXPECT_EQ(a.partition(0).rows(), 1u);

  for (bool by_ttl : {true, false}) {
    TableOptions t = plain;
    if (by_ttl) {
      t.eviction.ttl_clocks = 2;
    } else {
      t.eviction.max_rows = 500;
    }
    SparseTable table(t, 1);
    SparseTable::Partition& p = table.partition(0);
    EXPECT_EQ(p.stored_words(), 1u + 2u);
    for (uint64_t k = 0; k < 1000; ++k) {
      float* r = p.FindOrCreate(k, /*clock=*/k < 500 ? 1 : 3);
      p.Store(r);
    }
    EXPECT_EQ(SparseTable::Partition::LastClock(p.Find(700)), 3u);
    // max_rows measures the clocks in one pass and evicts the oldest in the next.
    for (int i = 0; i < 4; ++i) p.Sweep(1 << 20, /*now=*/4);
    EXPECT_EQ(p.rows(), 500u) << (by_ttl ? "ttl" : "max_rows");
    for (uint64_t k = 0; k < 1000; k += 37) EXPECT_EQ(p.Find(k) != nullptr, k >= 500) << k;
  }
}

// Restored and checkpointed rows of a 16-bit table come back bit for bit (f32 views of 16-bit
// values are exact).
TEST(SparseTableDtypeTest, RowsRoundTripThroughTheirF32View) {
  TableOptions t = Table(5);
  t.dtype = DType::kBf16;
  t.optimizer.kind = OptimizerOptions::Kind::kAdagrad;
  SparseTable a(t, 1), b(t, 1);
  for (uint64_t k = 0; k < 100; ++k) {
    float* r = a.partition(0).FindOrCreate(k, 1);
    r[0] += 0.001f * k;  // changed but not stored: the stored row keeps its value
    a.partition(0).Store(r);
  }
  std::vector<std::pair<uint64_t, std::vector<float>>> rows;
  ASSERT_TRUE(a.partition(0).ForEachRow([&](uint64_t key, const float* row) {
    rows.emplace_back(key, std::vector<float>(row, row + a.partition(0).stored_floats()));
  }).ok());
  ASSERT_EQ(rows.size(), 100u);
  for (const auto& [key, row] : rows) b.partition(0).RestoreRow(key, row.data());
  for (const auto& [key, row] : rows) {
    const float* got = b.partition(0).Find(key);
    ASSERT_EQ(0, std::memcmp(got - 1, row.data(), sizeof(float) * row.size())) << key;
  }
}

}  // namespace
}  // namespace parasol

namespace parasol {
namespace {

// A tiered partition (100 rows in memory, the rest in a DiskTier) next to a memory one: the
// same rows, the same eviction by TTL and by max_rows across both tiers, and a key restored
// twice is one row.
class TieredPartitionTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/parasol-tiered-unit-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    auto d = DiskTier::Open(dir_ + "/disk", {"emb#0"}, 1 << 20);
    ASSERT_TRUE(d.ok()) << d.status().ToString();
    disk_ = std::move(*d);
  }
  void TearDown() override {
    disk_.reset();
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }
  // Rows by key, values and clock (the f32 view), of every tier.
  static std::map<uint64_t, std::vector<float>> Rows(const SparseTable& t) {
    std::map<uint64_t, std::vector<float>> out;
    EXPECT_TRUE(t.partition(0).ForEachRow([&](uint64_t key, const float* row) {
      EXPECT_TRUE(out.emplace(key, std::vector<float>(row, row + t.partition(0).stored_floats())).second)
          << "key " << key << " twice";
    }).ok());
    return out;
  }
  std::string dir_;
  std::unique_ptr<DiskTier> disk_;
};

TEST_F(TieredPartitionTest, EvictionByTtlAndMaxRowsActsOnBothTiers) {
  for (const char* what : {"max_rows", "ttl"}) {
    TableOptions o = Table(4);
    if (std::string(what) == "max_rows") o.eviction.max_rows = 1000;
    if (std::string(what) == "ttl") o.eviction.ttl_clocks = 3;
    SparseTable memory(o, 1), tiered(o, 1);
    tiered.SetDiskTier(disk_.get(), 0, 100);
    for (SparseTable* t : {&memory, &tiered}) {
      SparseTable::Partition& p = t->partition(0);
      std::vector<uint64_t> keys;
      for (uint64_t k = 0; k < 1010; ++k) keys.push_back(k * 7919);
      ASSERT_TRUE(p.Prefault(keys).ok());
      for (uint64_t i = 0; i < keys.size(); ++i) p.FindOrCreate(keys[i], i < 1000 ? 1 : 5);
      p.Settle();
    }
    EXPECT_EQ(tiered.MemoryRows(), 100u);
    EXPECT_EQ(tiered.DiskRows(), 910u);
    EXPECT_EQ(Rows(memory), Rows(tiered));
    for (int sweep = 0; sweep < 20; ++sweep) {
      for (SparseTable* t : {&memory, &tiered}) t->partition(0).Sweep(1 << 15, 5);
    }
    const auto m = Rows(memory), t = Rows(tiered);
    if (std::string(what) == "max_rows") {
      // Down to the limit, not past it, oldest first: the ten newest rows stay.
      EXPECT_EQ(m.size(), 1000u);
      EXPECT_EQ(t.size(), 1000u) << "tiered";
      for (uint64_t k = 1000; k < 1010; ++k) EXPECT_TRUE(t.count(k * 7919)) << k;
    } else {
      EXPECT_EQ(m.size(), 10u);
      EXPECT_EQ(t, m);
    }
    EXPECT_EQ(tiered.TotalRows(), t.size());
    EXPECT_EQ(tiered.TotalRows(), tiered.MemoryRows() + tiered.DiskRows());
    // An evicted row comes back with its initial value, from neither tier.
    std::vector<float> init(4);
    InitSparseRow(o.init, o.seed, 0, init);
    const uint64_t zero[1] = {0};
    ASSERT_TRUE(tiered.partition(0).Prefault(zero).ok());
    if (!t.count(0)) {
      EXPECT_EQ(tiered.partition(0).Find(0), nullptr);
    }
  }
}

TEST_F(TieredPartitionTest, AKeyRestoredTwiceIsOneRow) {
  TableOptions o = Table(4);
  SparseTable t(o, 1);
  t.SetDiskTier(disk_.get(), 0, 100);
  std::vector<float> row(t.partition(0).stored_floats(), 0.0f);
  for (uint64_t k = 0; k < 5000; ++k) {
    row[1] = static_cast<float>(k);
    t.partition(0).RestoreRow(k, row.data());
  }
  row[1] = -1.0f;
  t.partition(0).RestoreRow(0, row.data());  // on disk by now
  t.partition(0).Settle();
  EXPECT_EQ(t.TotalRows(), 5000u);
  const auto rows = Rows(t);
  EXPECT_EQ(rows.size(), 5000u);
  EXPECT_EQ(rows.at(0)[1], -1.0f);
  EXPECT_EQ(rows.at(4999)[1], 4999.0f);
}

}  // namespace
}  // namespace parasol
